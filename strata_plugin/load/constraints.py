"""Constrained output (a JSON schema, a GBNF grammar) in the request keys each engine reads.

Why: a quality case asks for "a JSON object with these fields" or "text this grammar
accepts"; each engine spells that request differently, and an engine that does not know a
key ignores it silently (vLLM) and answers unconstrained. One table (the engine table,
``configure/engines.py``, each entry's ``constrain``), so a case names
what it wants and runs unchanged on every engine:

* llama.cpp (`/completion` and its OpenAI endpoints): ``json_schema``, ``grammar`` (GBNF);
* vLLM: ``structured_outputs`` with ``json`` or ``grammar`` (xgrammar reads GBNF), vLLM
  docs "Structured Outputs" (whitespace inside JSON is a server option in vLLM 0.32:
  ``--structured-outputs-config``, see the vllm-cpu profile);
* SGLang: ``json_schema`` (a JSON string) or ``ebnf``, SGLang docs "Structured Outputs":
  top-level keys on its OpenAI routes, but inside ``sampling_params`` on its native
  ``/generate`` (``SamplingParams.json_schema``/``ebnf``), which ignores them at the top
  level and answers unconstrained.
"""

from __future__ import annotations

from typing import Any

from strata_plugin.configure.engines import engine as engine_spec

#: API flavours (configure/engines.API_FLAVOURS) whose sampling keys live in one object
#: of the body, not at its top level: SGLang's native /generate.
NESTED_SAMPLING = {"sglang": "sampling_params"}


def constraint_body(engine: str, *, json_schema: dict | None = None,
                    grammar: str | None = None, api: str = "") -> dict[str, Any]:
    """The request-body keys asking ``engine`` for output matching one constraint: the
    engine table's (``configure/engines.py``) ``constrain`` entry, inside the object the
    ``api`` flavour reads sampling keys from where it has one."""
    body = engine_spec(engine).constraint_body(json_schema, grammar)
    return {NESTED_SAMPLING[api]: body} if api in NESTED_SAMPLING else body
