"""Every ``# type: ignore`` in strata_plugin/ names its error code and says why beside it:
``# type: ignore[attr-defined]  # numpy stubs lack ...``. The type checker itself runs in
scripts/test.sh (``python -m mypy``, [tool.mypy] in pyproject.toml); this holds the comments
it cannot judge. Modules the checker skips for now (``ignore_errors`` in pyproject.toml's
overrides, each with its reason there) are left out: nothing holds their ignores.
"""

from __future__ import annotations

import io
import re
import tokenize
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "strata_plugin"

#: ``type: ignore``, its ``[code, ...]``, then a comment of its own with words in it.
_IGNORE = re.compile(r"type:\s*ignore\b")
_WITH_REASON = re.compile(r"type:\s*ignore\[[a-z][a-z-]*(?:\s*,\s*[a-z][a-z-]*)*\]\s+#\s*[^\s#]")


def ignore_problem(comment: str) -> str:
    """Why a comment's ``type: ignore`` falls short ("" when it has a code and a reason,
    or is no type: ignore at all)."""
    if not _IGNORE.search(comment):
        return ""
    if _WITH_REASON.search(comment):
        return ""
    if not re.search(r"type:\s*ignore\[", comment):
        return "no error code"
    return "no reason beside it"


def _unchecked_files() -> set[Path]:
    """The modules [tool.mypy]'s overrides switch off entirely (ignore_errors)."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    out = set()
    for o in conf.get("overrides", []):
        if o.get("ignore_errors"):
            mods = o["module"] if isinstance(o["module"], list) else [o["module"]]
            out |= {ROOT / (m.replace(".", "/") + ".py") for m in mods}
    return out


def _comments(path: Path) -> list[tuple[int, str]]:
    src = path.read_text(encoding="utf-8")
    return [(tok.start[0], tok.string)
            for tok in tokenize.generate_tokens(io.StringIO(src).readline)
            if tok.type == tokenize.COMMENT]


@pytest.mark.parametrize(("comment", "problem"), [
    ("# type: ignore", "no error code"),
    ("# type: ignore  # numpy stubs lack it", "no error code"),
    ("# type: ignore[misc]", "no reason beside it"),
    ("# type: ignore[misc]  #", "no reason beside it"),
    ("# type: ignore[misc]  # ", "no reason beside it"),
    ("# type: ignore[misc]  # why", ""),
    ("# type: ignore[misc]  # (as above)", ""),
    ("# type: ignore[misc]  # #", "no reason beside it"),
    ("# type: ignore[arg-type, misc]  # the fields are optional", ""),
    ("# the checker: type annotations here", ""),
])
def test_a_type_ignore_needs_a_code_and_a_reason(comment: str, problem: str) -> None:
    assert ignore_problem(comment) == problem


def test_every_type_ignore_in_the_package_has_a_code_and_a_reason() -> None:
    skipped = _unchecked_files()
    assert all(p.is_file() for p in skipped), skipped  # the override names real modules
    found, bad = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in skipped:
            continue
        for line, comment in _comments(path):
            if _IGNORE.search(comment):
                found += 1
            if why := ignore_problem(comment):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {why}: {comment}")
    assert not bad, "\n".join(bad)
    assert found >= 1  # the scan sees the package's comments (it has a few ignores)
