"""Output checks: is the answer usable, not only fast?

A validator looks at one request's output text and says pass or fail with a
reason. The seed's checks: a complete finish (a ``length`` cut where a stop was
expected is a failure, kept and reported), required JSON fields, and code
extracted from the output that must pass a frozen test file ("10/10 tests
passed").
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


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


_RUNNER = """
import sys, traceback
sys.path.insert(0, sys.argv[1])
import importlib.util
spec = importlib.util.spec_from_file_location("frozen_tests", sys.argv[2])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
tests = [getattr(mod, n) for n in sorted(dir(mod)) if n.startswith("test_")]
passed = 0
for t in tests:
    try:
        t(); passed += 1
    except Exception:
        traceback.print_exc()
print(f"RESULT {passed} {len(tests)}")
"""


def code_passes(test_file: Path, module: str = "solution", timeout_s: float = 30.0) -> Validator:
    """Code from the output, saved as ``module.py``, must pass the frozen ``test_file``.

    Runs in a separate Python process with a timeout, so generated code can
    neither hang nor crash the harness.
    """
    test_file = Path(test_file).resolve()

    def check(text: str) -> Verdict:
        with tempfile.TemporaryDirectory(prefix="strata-code-") as tmp:
            Path(tmp, f"{module}.py").write_text(extract_code(text))
            try:
                out = subprocess.run([sys.executable, "-I", "-c", _RUNNER, tmp, str(test_file)],
                                     capture_output=True, text=True, timeout=timeout_s,
                                     cwd=tmp, check=False)
            except subprocess.TimeoutExpired:
                return Verdict(0, 1, f"timed out after {timeout_s} s")
        m = re.search(r"^RESULT (\d+) (\d+)$", out.stdout, re.M)
        if not m:
            return Verdict(0, 1, f"test run failed: {out.stderr.strip()[-300:]}")
        passed, total = int(m.group(1)), int(m.group(2))
        return Verdict(passed, total, "" if passed == total else out.stderr.strip()[-300:])
    check.__name__ = f"code_passes({test_file.name})"
    return check
