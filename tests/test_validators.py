"""Output validators: JSON fields and frozen tests on extracted code."""

from pathlib import Path

from strata_plugin.load.validators import code_passes, extract_code, json_fields

FROZEN = Path(__file__).resolve().parents[1] / "fixtures" / "quality" / "test_add.py"


def test_json_fields():
    check = json_fields("name", "score")
    assert check('{"name": "a", "score": 3}').ok
    v = check('{"name": "a"}')
    assert (v.passed, v.total, v.ok) == (1, 2, False) and "score" in v.detail
    assert not check("not json").ok and not check("[1, 2]").ok


def test_code_extraction_and_frozen_tests(confinable):
    good = "Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert extract_code(good).startswith("def add")
    v = code_passes(FROZEN)(good)
    assert (v.passed, v.total) == (10, 10)
    bad = code_passes(FROZEN)("```python\ndef add(a, b):\n    return a - b\n```")
    assert bad.total == 10 and bad.passed < 10 and not bad.ok


def test_generated_code_cannot_hang_the_harness(confinable):
    v = code_passes(FROZEN, timeout_s=1.0)("import time\ntime.sleep(30)\n")
    assert not v.ok and "timed out" in v.detail
