"""docs/extending.md's worked examples, step by step: if the page and the code drift
apart, this fails.

The example engine is a scripted OpenAI-compatible server (``tests/sse_script_server.py``)
registered under a new name, ``scripted``, by one table entry, as the page says.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import requests
from sse_script_server import Reply, ScriptServer, Seen

from strata_plugin.configure import engines
from strata_plugin.configure.engines import ENGINE_TABLE, EngineSpec
from strata_plugin.configure.profile import load_profile
from strata_plugin.load.cache_flush import flush_prefix_cache
from strata_plugin.load.client import RequestSpec, send_streaming
from strata_plugin.load.constraints import constraint_body

DOC = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()

COMPLETIONS = [
    '{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":" a",'
    '"finish_reason":null}],"usage":null}',
    '{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":" b",'
    '"finish_reason":"length"}],"usage":null}',
    '{"id":"c","object":"text_completion","model":"m","choices":[],'
    '"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}',
    "[DONE]",
]


def _code_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S)


@pytest.fixture
def scripted_engine(monkeypatch):
    """Step 1: the table entry, exactly as the page writes it."""
    entry = eval(_code_blocks("python")[0].strip().rstrip(","),  # the page's own text
                 {"EngineSpec": EngineSpec})
    assert isinstance(entry, EngineSpec) and entry.name == "scripted"
    monkeypatch.setattr(engines, "ENGINE_TABLE", (*ENGINE_TABLE, entry))
    return entry


def _answer(seen: Seen) -> Reply:
    if seen.path == "/flush":
        return Reply(items=[(0.0, b"flushed")], framing="length", content_type="text/plain")
    if seen.path == "/v1/completions":
        return Reply(items=[(0.0, f"data: {x}\n\n".encode()) for x in COMPLETIONS])
    return Reply(items=[(0.0, b"no")], status=404, framing="length", content_type="text/plain")


def test_adding_an_engine_as_the_page_says(scripted_engine, tmp_path):
    # step 2: its profile (the page's TOML), api from the entry's default
    profile = tmp_path / "scripted.toml"
    profile.write_text(_code_blocks("toml")[0])
    p = load_profile(profile)
    assert p.server.engine == "scripted" and p.server.api == "completions"

    # step 3: its flush and constraint, against a server that answers as the engine does
    with ScriptServer(_answer) as srv:
        flush = flush_prefix_cache("scripted", srv.url)
        assert flush.ok and flush.how == "POST /flush" and "flushed" in flush.detail
        body = constraint_body("scripted", json_schema={"type": "object"})
        assert body == {"guided_json": {"type": "object"}}
        spec = RequestSpec(request_id="r", case_id="c", phase="measured", max_tokens=2,
                           prompt_token_ids=(5, 6, 7), extra_body=tuple(body.items()))
        with requests.Session() as s:
            rec = send_streaming(s, srv.url, p.server.api, spec, scheduled_ns=time.monotonic_ns())
        assert rec.ok, rec.error
        assert rec.output_text == " a b" and rec.usage.completion_tokens == 2
        assert [x.path for x in srv.seen] == ["/flush", "/v1/completions"]
        assert srv.seen[1].json["guided_json"] == {"type": "object"}


def test_without_the_entry_the_profile_is_refused(tmp_path):
    """The entry is what makes the name known (so step 1 is really needed)."""
    from strata_plugin.configure.profile import ProfileError

    profile = tmp_path / "scripted.toml"
    profile.write_text(_code_blocks("toml")[0])
    with pytest.raises(ProfileError, match=r"server\.engine"):
        load_profile(profile)
