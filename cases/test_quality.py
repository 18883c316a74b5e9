"""Output quality: complete answers that pass their checks, not only fast ones.

The local model is random, so its free text is noise; these cases constrain it
(a JSON schema, a GBNF grammar, in the keys the profile's engine reads:
``strata.constrain``) to produce a JSON object and a small function, and then
validate them exactly as a real model's output would be: required JSON fields
(the name in letters and the score bounded: an unbounded integer lets a random model
emit digits up to OSL, and xgrammar lets control characters into a plain string, which
JSON forbids),
and code that must pass a frozen test file. Both expect a natural stop: a
``length`` cut is a failure, kept and reported.
"""

from pathlib import Path

import pytest

from strata_plugin import Workload, code_passes, json_fields

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                                           "score": {"type": "integer", "minimum": 0,
                                                     "maximum": 100}},
          "required": ["name", "score"], "additionalProperties": False}
CODE = 'root ::= "```python\\ndef add(a, b):\\n    return a + b\\n```"'


@pytest.mark.quality
@pytest.mark.smoke
def test_json_answer_has_required_fields(strata):
    w = Workload("quality_json", isl=32, osl=128, requests=4, expect_stop=True, seed=21)
    result = strata.run(w, scale=False, extra_body=strata.constrain(json_schema=SCHEMA),
                        validators=(json_fields("name", "score"),))
    assert not result.problems, "\n".join(result.problems)
    assert all(r.finish_reason == "stop" for r in result.records)


@pytest.mark.quality
@pytest.mark.smoke
def test_code_answer_passes_frozen_tests(strata):
    w = Workload("quality_code", isl=32, osl=64, requests=2, expect_stop=True, seed=22)
    check = code_passes(ROOT / "fixtures" / "quality" / "test_add.py")
    result = strata.run(w, scale=False, extra_body=strata.constrain(grammar=CODE),
                        validators=(check,))
    assert not result.problems, "\n".join(result.problems)
    (_name, passed, total), = result.validation
    assert (passed, total) == (20, 20)  # 10/10 tests for each of the 2 answers
