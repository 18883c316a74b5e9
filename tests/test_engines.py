"""The engine table (configure/engines.py) is the one place an engine's facts live.

Every reader takes them from it: the profile's engine names and default API, the client's
API flavours, the prefix-cache flush and the constrained-output keys. The agent cannot
import the table (standard library only, shipped alone to other nodes), so its Prometheus
and log vocabularies are checked against it here.
"""

from __future__ import annotations

import http.server
import threading

import pytest

from strata_plugin.agent.collectors.log import LLAMACPP_PATTERNS
from strata_plugin.agent.collectors.prom import ALIASES
from strata_plugin.configure import engines, profile
from strata_plugin.configure.engines import API_FLAVOURS, ENGINE_TABLE, ENGINES, EngineSpec
from strata_plugin.load import cache_flush, constraints
from strata_plugin.load.client import flavours, spec


def test_one_list_of_engines_and_of_api_flavours():
    assert engines.engine_names() == ENGINES and profile.API_FLAVOURS is API_FLAVOURS
    assert spec.API_FLAVOURS is API_FLAVOURS and tuple(flavours.FLAVOURS) == API_FLAVOURS
    assert ENGINES[-1] == "other" and {"llamacpp", "vllm", "sglang"} <= set(ENGINES)
    assert len(set(ENGINES)) == len(ENGINES)
    for e in ENGINE_TABLE:
        assert e.default_api in ("", *API_FLAVOURS), e.name


def test_the_agent_knows_the_metrics_of_exactly_the_engines_the_table_names():
    assert set(ALIASES) == {e.metrics_prefix for e in ENGINE_TABLE if e.metrics_prefix}
    assert set(ALIASES) <= set(ENGINES)


def test_the_agent_log_probes_are_the_table_s():
    assert {p for e in ENGINE_TABLE for p in e.log_probes} == set(LLAMACPP_PATTERNS)


def _profile(tmp_path, body: str):
    p = tmp_path / "p.toml"
    p.write_text('name = "t"\n[server]\n' + body)
    return profile.load_profile(p)


@pytest.mark.parametrize("name", [e.name for e in ENGINE_TABLE if e.default_api])
def test_a_profile_without_api_gets_the_engine_s_default(tmp_path, name):
    got = _profile(tmp_path, f'engine = "{name}"\n')
    assert got.server.api == engines.engine(name).default_api


def test_an_engine_without_a_default_api_needs_one(tmp_path):
    with pytest.raises(profile.ProfileError, match=r"server\.api.*missing"):
        _profile(tmp_path, 'engine = "other"\n')
    assert _profile(tmp_path, 'engine = "other"\napi = "chat"\n').server.api == "chat"


def test_constraints_read_the_table(monkeypatch):
    new = EngineSpec("llamacpp", constrain=lambda js, g: {"mine": js or g})
    monkeypatch.setattr(engines, "ENGINE_TABLE", (new, *ENGINE_TABLE[1:]))
    assert constraints.constraint_body("llamacpp", grammar="g") == {"mine": "g"}
    with pytest.raises(ValueError, match="exactly one"):
        constraints.constraint_body("llamacpp")


class _Flushable(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_POST(self):
        self.seen.append(self.path)
        code = 200 if self.path == "/flush_me" else 404
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *a):
        pass


def test_the_flush_is_the_table_s_call_on_a_real_http_server(monkeypatch):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flushable)
    threading.Thread(target=srv.serve_forever, args=(0.01,), daemon=True).start()  # quick shutdown
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        new = EngineSpec("myengine", flush=("POST", "/flush_me"))
        monkeypatch.setattr(engines, "ENGINE_TABLE", (*ENGINE_TABLE, new))
        got = cache_flush.flush_prefix_cache("myengine", url)
        assert got.ok and got.how == "POST /flush_me" and _Flushable.seen[-1] == "/flush_me"
        # vLLM's 404 names the option it needs, from its entry
        got = cache_flush.flush_prefix_cache("vllm", url)
        assert not got.ok and "VLLM_SERVER_DEV_MODE=1" in got.detail
        assert _Flushable.seen[-1] == "/reset_prefix_cache"
        assert cache_flush.flush_prefix_cache("llamacpp", url).ok  # per request, no call
        assert not cache_flush.flush_prefix_cache("other", url).ok
    finally:
        srv.shutdown()
        srv.server_close()
