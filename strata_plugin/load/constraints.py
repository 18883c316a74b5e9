"""Constrained output (a JSON schema, a GBNF grammar) in the request keys each engine reads.

Why: a quality case asks for "a JSON object with these fields" or "text this grammar
accepts"; each engine spells that request differently, and an engine that does not know a
key ignores it silently (vLLM) and answers unconstrained. One table here, so a case names
what it wants and runs unchanged on every engine:

* llama.cpp (`/completion` and its OpenAI endpoints): ``json_schema``, ``grammar`` (GBNF);
* vLLM: ``structured_outputs`` with ``json`` or ``grammar`` (xgrammar reads GBNF), vLLM
  docs "Structured Outputs" (whitespace inside JSON is a server option in vLLM 0.32:
  ``--structured-outputs-config``, see the vllm-cpu profile);
* SGLang: ``json_schema`` (a JSON string) or ``ebnf``, SGLang docs "Structured Outputs".
"""

from __future__ import annotations

import json
from typing import Any


def constraint_body(engine: str, *, json_schema: dict | None = None,
                    grammar: str | None = None) -> dict[str, Any]:
    """The request-body keys asking ``engine`` for output matching one constraint."""
    if (json_schema is None) == (grammar is None):
        raise ValueError("give exactly one of json_schema, grammar")
    if engine == "llamacpp":
        return {"json_schema": json_schema} if json_schema is not None else {"grammar": grammar}
    if engine == "vllm":
        return {"structured_outputs": ({"json": json_schema} if json_schema is not None
                                       else {"grammar": grammar})}
    if engine == "sglang":
        return ({"json_schema": json.dumps(json_schema)} if json_schema is not None
                else {"ebnf": grammar})
    raise ValueError(f"no known way to constrain the output of a {engine or 'unnamed'} "
                     "engine (profile server.engine: llamacpp, vllm or sglang)")
