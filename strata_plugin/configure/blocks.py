"""Server-configuration parameters and counterbalanced A/B blocks.

A/B comparisons on a live server drift (thermal state, page cache, background
load). The seed ran its configurations in blocks, forward then reverse
(A B B A ...), each block one server process with its own warm-ups; the same
order cancels a linear drift. A block is a distinct parameter of the
session-scoped server fixture, written ``<config>@<n>``, so pytest boots the
server once per block and runs the blocks in this order.
"""

from __future__ import annotations

from strata_plugin.errors import StrataError

BLOCK_SEP = "@"


def counterbalanced(config_ids: list[str], repeats: int) -> list[str]:
    """Blocks in forward-then-reverse order: [A, B] x 2 -> A@1 B@1 B@2 A@2."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    out: list[str] = []
    for r in range(repeats):
        order = config_ids if r % 2 == 0 else list(reversed(config_ids))
        out.extend(f"{cid}{BLOCK_SEP}{r + 1}" for cid in order)
    return out


def split_param(param: str) -> tuple[str, str]:
    """``'A@2'`` -> (config id ``'A'``, block ``'A@2'``); a plain id is its own block."""
    config_id = param.split(BLOCK_SEP, 1)[0]
    return config_id, param


class MissingConfigs(StrataError, ValueError):
    """A test names server configurations its profile does not have, and marks them
    ``optional=True``: it is skipped, not failed (a sweep written for one engine's flags
    cannot run on another engine's profile)."""

    def __init__(self, missing: list[str], profile_ids: list[str]) -> None:
        self.missing = missing
        super().__init__(f"no configuration {', '.join(missing)} (it has {', '.join(profile_ids)})")


class UnknownConfigs(StrataError, ValueError):
    """A test names server configurations its profile does not have, without marking them
    optional: a typo in a config id must not pass as a skip with exit 0 in CI."""

    def __init__(self, marker: str, missing: list[str], profile_ids: list[str]) -> None:
        self.missing = missing
        super().__init__(
            f"{marker}(...) names {', '.join(repr(m) for m in missing)}, which the profile has "
            f"no configuration of (it has {', '.join(profile_ids)}); fix the id, or mark the "
            f"test {marker}(..., optional=True) if it is meant for profiles that have it "
            "(it is then skipped here)")


def server_params(profile_ids: list[str], configs_marker, blocks_marker, *,
                  attached: bool) -> list[str]:
    """The server parameters one test runs against, from its markers.

    No marker: the profile's first (primary) configuration. ``"*"``: all of them. An id
    the profile lacks raises :class:`MissingConfigs` when the marker says
    ``optional=True`` (the test is skipped), else :class:`UnknownConfigs` (an error).
    """
    ids = list(profile_ids[:1])
    marker = blocks_marker or configs_marker
    if marker is not None:
        wanted = list(profile_ids) if marker.args == ("*",) else list(marker.args)
        unknown = [a for a in wanted if a not in profile_ids]
        if unknown and marker.kwargs.get("optional", False) is True:
            raise MissingConfigs(unknown, list(profile_ids))
        if unknown:
            raise UnknownConfigs(marker.name, unknown, list(profile_ids))
        ids = wanted or ids
    if attached:
        return ids[:1]  # one server we did not start: its configuration is what it is
    if blocks_marker is not None:
        return counterbalanced(ids, int(blocks_marker.kwargs.get("repeats", 2)))
    return ids


def group_by_server(items: list) -> None:
    """Reorder test items in place so each server parameter's tests run together.

    pytest groups session-scoped parameters by their index within each test's
    own parametrization, so "default" at index 0 of one test and index 1 of
    another would boot the server twice. Grouping by the parameter *value*, in
    order of first appearance, boots each configuration (and each A/B block)
    once, and keeps blocks in their counterbalanced order.
    """
    first: dict[str, int] = {}
    keyed = []
    for pos, item in enumerate(items):
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get("strata_server") if callspec else None
        key = -1 if param is None else first.setdefault(str(param), pos)
        keyed.append((key, pos, item))
    keyed.sort(key=lambda t: (t[0], t[1]))
    items[:] = [item for _, _, item in keyed]
