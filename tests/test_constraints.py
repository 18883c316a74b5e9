"""One constraint, each engine's request keys (an unknown key is ignored silently by vLLM)."""

from __future__ import annotations

import pytest

from strata_plugin.load.constraints import constraint_body

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_each_engine_gets_its_own_keys():
    assert constraint_body("llamacpp", json_schema=SCHEMA) == {"json_schema": SCHEMA}
    assert constraint_body("llamacpp", grammar='root ::= "x"') == {"grammar": 'root ::= "x"'}
    assert constraint_body("vllm", json_schema=SCHEMA) == {"structured_outputs": {"json": SCHEMA}}
    assert constraint_body("vllm", grammar='root ::= "x"') == {
        "structured_outputs": {"grammar": 'root ::= "x"'}}
    assert constraint_body("sglang", json_schema=SCHEMA) == {
        "json_schema": '{"type": "object", "properties": {"a": {"type": "integer"}}, '
                       '"required": ["a"]}'}
    assert constraint_body("sglang", grammar='root ::= "x"') == {"ebnf": 'root ::= "x"'}


def test_sglang_native_generate_gets_them_inside_sampling_params():
    """/generate reads json_schema/ebnf only inside sampling_params (at the top level the
    real server answered unconstrained); its OpenAI routes read them at the top level."""
    assert constraint_body("sglang", grammar='root ::= "x"', api="sglang") == {
        "sampling_params": {"ebnf": 'root ::= "x"'}}
    assert constraint_body("sglang", grammar='root ::= "x"', api="completions") == {
        "ebnf": 'root ::= "x"'}


def test_an_unknown_engine_or_no_single_constraint_is_a_clear_error():
    with pytest.raises(ValueError, match="no known way to constrain the output of a other"):
        constraint_body("other", json_schema=SCHEMA)
    with pytest.raises(ValueError, match="exactly one of json_schema, grammar"):
        constraint_body("vllm", json_schema=SCHEMA, grammar="root ::= x")
    with pytest.raises(ValueError, match="exactly one"):
        constraint_body("vllm")
