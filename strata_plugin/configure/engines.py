"""The engine table: everything Strata knows about one serving engine, in one entry.

Why one table: an engine used to be spread over the profile's engine list, the client's
flavour list, the prefix-cache flush and the constrained-output keys. Strata's own
engines are one :class:`EngineSpec` each in :data:`ENGINE_TABLE`; another package adds
one through the ``strata.engines`` entry-point group (docs/extending.md, "An engine"),
without editing Strata. Every reader takes its facts from :func:`engines` (the table and
the plugins' entries):

* ``configure/profile.py``: the names a profile's ``server.engine`` may take
  (:data:`ENGINES`) and the API a profile gets when it names none;
* ``load/client/spec.py``: :data:`API_FLAVOURS`, the wire formats the client speaks;
* ``load/cache_flush.py``: how a cold-prefix case empties the engine's prefix cache;
* ``load/constraints.py``: the request keys asking for JSON-schema or grammar output.

The sampling agent runs on the standard library alone on other nodes and cannot import
this module, so the engines' Prometheus names stay in ``agent/collectors/prom.ALIASES``;
``tests/test_engines.py`` checks that both name the same engines (``metrics_prefix``).

This module imports nothing of Strata but the plugin discovery (``entry_points.py``,
itself below every layer) and, to check a plugin's entry, the agent's Prometheus and log
vocabularies (standard library only): every layer may read it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from strata_plugin import entry_points

#: The client's wire formats: OpenAI /v1/chat/completions, OpenAI /v1/completions,
#: llama.cpp /completion, SGLang /generate (``load/client/flavours.py`` has one each).
API_FLAVOURS = ("chat", "completions", "llamacpp", "sglang")

#: (json_schema, grammar) -> request-body keys; exactly one of the two is given.
Constrain = Callable[[Any, Any], dict[str, Any]]


@dataclass(frozen=True)
class EngineSpec:
    """One engine, as a profile's ``server.engine`` names it."""

    name: str
    #: the API a profile gets when it sets no ``server.api`` ("" = it must set one)
    default_api: str = ""
    #: (method, path) that empties the prefix cache; None = no such call
    flush: tuple[str, str] | None = None
    #: what a flush failure with HTTP 404 usually means (the server option it needs)
    flush_404_hint: str = ""
    #: how requests themselves keep the prefix cold ("" = they do not)
    cold_per_request: str = ""
    #: the request keys for constrained output; None = the engine has none Strata knows
    constrain: Constrain | None = None
    #: the prefix of its Prometheus names (``vllm:``), the key of the agent's alias map
    #: (``agent/collectors/prom.ALIASES``); "" = no known metrics
    metrics_prefix: str = ""
    #: the agent's built-in log probes for this engine's server log
    #: (``agent/collectors/log.py``); () = none
    log_probes: tuple[str, ...] = ()
    #: (HTTP path, JSON key) that reports its version; None = not known
    version: tuple[str, str] | None = None

    def constraint_body(self, json_schema: Any = None, grammar: Any = None) -> dict[str, Any]:
        """The request-body keys asking this engine for output matching one constraint."""
        if (json_schema is None) == (grammar is None):
            raise ValueError("give exactly one of json_schema, grammar")
        if self.constrain is None:
            known = ", ".join(e.name for e in engines() if e.constrain is not None)
            raise ValueError(f"no known way to constrain the output of a {self.name or 'unnamed'}"
                             f" engine (profile server.engine: {known})")
        return self.constrain(json_schema, grammar)


def _llamacpp_constraint(json_schema: Any, grammar: Any) -> dict[str, Any]:
    return {"json_schema": json_schema} if json_schema is not None else {"grammar": grammar}


def _vllm_constraint(json_schema: Any, grammar: Any) -> dict[str, Any]:
    return {"structured_outputs": ({"json": json_schema} if json_schema is not None
                                   else {"grammar": grammar})}


def _sglang_constraint(json_schema: Any, grammar: Any) -> dict[str, Any]:
    return ({"json_schema": json.dumps(json_schema)} if json_schema is not None
            else {"ebnf": grammar})


#: Every engine a profile may name, in the order the docs list them. Sources:
#: llama.cpp tools/server/README.md (``/completion``: ``cache_prompt``, ``json_schema``,
#: ``grammar``; ``/props``: ``build_info``); vLLM docs "OpenAI-Compatible Server"
#: (``/version``, ``/reset_prefix_cache`` with ``VLLM_SERVER_DEV_MODE=1``) and "Structured
#: Outputs"; SGLang docs "Native APIs" (``/generate``, ``/flush_cache``,
#: ``/get_server_info``) and "Structured Outputs".
ENGINE_TABLE: tuple[EngineSpec, ...] = (
    EngineSpec("llamacpp", default_api="llamacpp",
               cold_per_request="cache_prompt=false on every request",
               constrain=_llamacpp_constraint, metrics_prefix="llamacpp",
               log_probes=("llama_prompt", "llama_eval", "llama_total", "llama_draft"),
               version=("/props", "build_info")),
    EngineSpec("vllm", default_api="completions", flush=("POST", "/reset_prefix_cache"),
               flush_404_hint="vLLM serves it only with VLLM_SERVER_DEV_MODE=1",
               constrain=_vllm_constraint, metrics_prefix="vllm",
               version=("/version", "version")),
    EngineSpec("sglang", default_api="sglang", flush=("POST", "/flush_cache"),
               constrain=_sglang_constraint, metrics_prefix="sglang",
               version=("/get_server_info", "version")),
    #: any other server that speaks one of the APIs: timed, never flushed or constrained
    EngineSpec("other"),
)

#: Strata's own engines' names (docs/profile.md lists these; plugins add to
#: :func:`engine_names` where they are installed).
ENGINES: tuple[str, ...] = tuple(e.name for e in ENGINE_TABLE)


def plugin_engines() -> tuple[EngineSpec, ...]:
    """The ``strata.engines`` plugins' entries, checked (entry_points.PluginError
    naming the distribution and entry point otherwise); loaded once, on first use."""
    return _checked(entry_points.load(entry_points.ENGINES))


@functools.cache
def _checked(plugins: tuple[entry_points.Plugin, ...]) -> tuple[EngineSpec, ...]:
    from strata_plugin.agent.collectors.log import LLAMACPP_PATTERNS
    from strata_plugin.agent.collectors.prom import ALIASES

    entry_points.check_names(plugins, (e.name for e in ENGINE_TABLE), "engine")
    for p in plugins:
        e = p.obj
        if not isinstance(e, EngineSpec):
            raise p.error(f"an engine's entry point names an EngineSpec, not a "
                          f"{type(e).__name__}")
        if e.name != p.name:
            raise p.error(f"the EngineSpec is named {e.name!r}: name the entry point as "
                          "the engine (profiles write it in server.engine)")
        if e.default_api not in ("", *API_FLAVOURS):
            raise p.error(f"default_api {e.default_api!r} is not an API the client speaks "
                          f"({', '.join(API_FLAVOURS)})")
        # The agent's maps travel to other nodes without the plugin: an engine may name
        # one of them (a server that exports vLLM's metrics) but cannot add its own.
        if e.metrics_prefix and e.metrics_prefix not in ALIASES:
            raise p.error(f"metrics_prefix {e.metrics_prefix!r} is not one the agent maps "
                          f"({', '.join(ALIASES)}); leave it empty")
        unknown = sorted(set(e.log_probes) - set(LLAMACPP_PATTERNS))
        if unknown:
            raise p.error(f"log_probes {unknown} are not the agent's "
                          f"({', '.join(LLAMACPP_PATTERNS)})")
    return tuple(p.obj for p in plugins)


def engines() -> tuple[EngineSpec, ...]:
    """Every engine a profile may name: the table's, then the plugins' (by name)."""
    return (*ENGINE_TABLE, *plugin_engines())


def engine_names() -> tuple[str, ...]:
    """The names a profile's ``server.engine`` may take (the table and the plugins)."""
    return tuple(e.name for e in engines())


def engine(name: str) -> EngineSpec:
    """The entry for ``name``; an unknown name gets an entry that knows nothing (as
    ``other``), so a caller handed a free-form name degrades instead of failing."""
    return next((e for e in engines() if e.name == name), None) or EngineSpec(name)
