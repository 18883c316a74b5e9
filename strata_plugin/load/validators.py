"""Output checks: is the answer usable, not only fast?

A validator looks at one request's output text and says pass or fail with a
reason. The seed's checks: a complete finish (a ``length`` cut where a stop was
expected is a failure, kept and reported), required JSON fields, and code
extracted from the output that must pass a frozen test file ("10/10 tests
passed"), run confined by ``load/sandbox.py`` and scored by a judge it cannot reach.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from strata_plugin.load import sandbox
from strata_plugin.load.sandbox import Limits


@dataclass(frozen=True)
class Verdict:
    passed: int
    total: int
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total


Validator = Callable[[str], Verdict]


def json_fields(*required: str) -> Validator:
    """The output parses as a JSON object holding every required field."""
    def check(text: str) -> Verdict:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            return Verdict(0, len(required), f"not JSON: {exc}")
        if not isinstance(obj, dict):
            return Verdict(0, len(required), f"JSON {type(obj).__name__}, not an object")
        missing = [f for f in required if f not in obj]
        return Verdict(len(required) - len(missing), len(required),
                       f"missing {missing}" if missing else "")
    check.__name__ = f"json_fields{required}"
    return check


_FENCE = re.compile(r"```(?:python|py)?\n(.*?)```", re.S)


def extract_code(text: str) -> str:
    """The first fenced code block, or the whole text when there is none."""
    m = _FENCE.search(text)
    return m.group(1) if m else text


def code_passes(test_file: Path, module: str = "solution", timeout_s: float = 30.0, *,
                allow_unsandboxed: bool = False, limits: Limits | None = None) -> Validator:
    """Code from the output, saved as ``module.py``, must pass the frozen ``test_file``.

    The code runs confined (``load/sandbox.py``: no environment, no network, no
    writable path but its scratch folder, an unprivileged user, resource limits, killed
    with everything it started at the timeout), and the count comes from a trusted judge
    over its own channel, so nothing the code prints or returns can score it. Where this
    machine cannot confine it, building the validator raises ``SandboxUnavailable`` naming
    the failing step, unless the case opts in with ``allow_unsandboxed=True`` or the profile
    with ``allow_unsandboxed_code = true``.
    """
    test_file = Path(test_file).resolve()
    tests = test_file.read_text(encoding="utf-8")
    name = f"code_passes({test_file.name})"
    reason = sandbox.probe()
    by = ("allow_unsandboxed=True" if allow_unsandboxed else sandbox.unconfined_allowed_by())
    if reason and not by:
        raise sandbox.SandboxUnavailable(
            f"{name}: model-written code is not run unconfined, and this machine cannot "
            f"confine it: {reason}. To accept running it with "
            + ("every confinement but one memory limit for its whole process tree (each "
               "process's own address-space limit stays)" if sandbox.NO_CGROUP in reason
               else "only an empty environment, resource limits and the judge's channel")
            + ", pass allow_unsandboxed=True to code_passes or set allow_unsandboxed_code = "
              "true in the profile.")
    # Only the memory cgroup is missing: the opt-in keeps every other confinement and
    # accepts the per-process memory bound, and each verdict says so.
    per_process = bool(reason) and sandbox.NO_CGROUP in reason
    confine = reason is None or per_process

    def check(text: str) -> Verdict:
        out = sandbox.run_frozen_tests(extract_code(text), tests, tests_name=test_file.name,
                                       module=module, timeout_s=timeout_s, limits=limits,
                                       confine=confine, tree_memory=not per_process)
        note = (f"MEMORY BOUNDED PER PROCESS ONLY ({by}): " if per_process
                else "" if confine else f"UNSANDBOXED ({by}): ")
        if out.error:
            return Verdict(0, 1, note + (out.error if not out.log.strip() else
                                         f"{out.error}; log: {out.log.strip()[-300:]}"))
        detail = "; ".join(out.failures)
        return Verdict(out.passed, out.total, note + detail[:600])
    check.__name__ = name
    return check
