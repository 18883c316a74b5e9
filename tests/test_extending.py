"""docs/extending.md, "The plugin package" and "An engine", with the page's own code: if
the page and the code drift apart, this fails.

The page's package is installed in this process the way pip would leave it (its
``.dist-info`` with the entry points on ``sys.path``: ``tests/plugin_package.py``), so
Strata's discovery is the real one. The engine, ``scripted``, is checked against a
scripted OpenAI-compatible server (``tests/sse_script_server.py``); the broken plugins
against the run's first second (a usage error naming the distribution and the entry
point, from a real pytest run of the plugin).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from plugin_package import DIST, doc_block, entry_points, forget, install_here, write_package
from sse_script_server import Reply, ScriptServer, Seen

from strata_plugin import entry_points as ep
from strata_plugin.configure import engines
from strata_plugin.configure.engines import ENGINE_TABLE, EngineSpec
from strata_plugin.configure.profile import ProfileError, load_profile
from strata_plugin.entry_points import PluginError
from strata_plugin.extend import check_plugins
from strata_plugin.load.cache_flush import flush_prefix_cache
from strata_plugin.load.client import RequestSpec, send_streaming
from strata_plugin.load.constraints import constraint_body

ROOT = Path(__file__).resolve().parents[1]
COMPLETIONS = [
    '{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":" a",'
    '"finish_reason":null}],"usage":null}',
    '{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":" b",'
    '"finish_reason":"length"}],"usage":null}',
    '{"id":"c","object":"text_completion","model":"m","choices":[],'
    '"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}',
    "[DONE]",
]


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    yield install_here(tmp_path / "pkg", monkeypatch)
    forget()


def _answer(seen: Seen) -> Reply:
    if seen.path == "/flush":
        return Reply(items=[(0.0, b"flushed")], framing="length", content_type="text/plain")
    if seen.path == "/v1/completions":
        return Reply(items=[(0.0, f"data: {x}\n\n".encode()) for x in COMPLETIONS])
    return Reply(items=[(0.0, b"no")], status=404, framing="length", content_type="text/plain")


def test_the_pyproject_declares_one_plugin_of_each_kind():
    groups = entry_points()
    assert set(groups) == set(ep.GROUPS)
    assert groups == {
        "strata.engines": {"scripted": "strata_example.engine:SCRIPTED"},
        "strata.collectors": {"fds": "strata_example.fds"},
        "strata.rules": {"fd_exhaustion": "strata_example.rules:FD_EXHAUSTION"},
        "strata.report_sections": {"fds": "strata_example.section:FDS"},
    }


def test_the_plugins_command_lists_what_the_page_shows(plugin):
    shown = doc_block("$ python -m strata_plugin plugins", "text")
    out = subprocess.run([sys.executable, "-m", "strata_plugin", "plugins"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout == shown


def test_adding_an_engine_as_the_page_says(plugin, tmp_path):
    assert engines.engine_names() == (*engines.ENGINES, "scripted")
    assert engines.ENGINES == tuple(e.name for e in ENGINE_TABLE)  # the built-ins alone
    (entry,) = engines.plugin_engines()
    assert type(entry) is EngineSpec and entry.name == "scripted"
    assert type(entry).__module__ == "strata_plugin.configure.engines"  # Strata's own type

    # its profile (the page's TOML), api from the entry's default
    profile = tmp_path / "scripted.toml"
    profile.write_text(doc_block("# profiles/scripted.toml", "toml"))
    p = load_profile(profile)
    assert p.server.engine == "scripted" and p.server.api == "completions"

    # its flush and constraint, against a server that answers as the engine does
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
    with pytest.raises(ValueError, match="takes a JSON schema, not a grammar"):
        constraint_body("scripted", grammar="root ::= x")


def test_without_the_plugin_the_profile_is_refused(tmp_path):
    """The entry point is what makes the name known (so installing it is really needed)."""
    forget()
    profile = tmp_path / "scripted.toml"
    profile.write_text(doc_block("# profiles/scripted.toml", "toml"))
    with pytest.raises(ProfileError, match=r"server\.engine"):
        load_profile(profile)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_a_plugin_named_as_a_built_in_is_the_error_the_page_shows(tmp_path, monkeypatch):
    install_here(tmp_path / "pkg", monkeypatch,
                 extra_groups={"strata.engines": {"vllm": "strata_example.engine:SCRIPTED"}})
    try:
        with pytest.raises(PluginError) as err:
            check_plugins()
        shown = doc_block("ERROR: Strata plugin entry point 'vllm' = "
                          "'strata_example.engine:SCRIPTED' in group", "text")
        assert _one_line("ERROR: " + str(err.value)) == _one_line(
            "ERROR: Strata plugin entry point 'vllm' = 'strata_example.engine:SCRIPTED' in "
            "group " + shown)
        assert f"of {DIST} 0.1.0" in str(err.value)
    finally:
        forget()


@pytest.mark.parametrize(("value", "says"), [
    ("strata_example.nowhere:X", "failed to import: ModuleNotFoundError: No module named "
                                 "'strata_example.nowhere'. Fix or uninstall strata-example"),
    ("strata_example.engine:guided_json", "names an EngineSpec, not a function"),
    ("strata_example.rules:FD_EXHAUSTION", "names an EngineSpec, not a RulePlugin"),
])
def test_a_broken_engine_plugin_names_itself(tmp_path, monkeypatch, value, says):
    install_here(tmp_path / "pkg", monkeypatch,
                 extra_groups={"strata.engines": {"other_one": value}})
    try:
        with pytest.raises(PluginError, match=re.escape(says)) as err:
            engines.engine_names()
        assert str(err.value).startswith(
            f"Strata plugin entry point 'other_one' = {value!r} in group 'strata.engines' "
            f"of {DIST} 0.1.0: ")
    finally:
        forget()


def test_an_engine_named_apart_from_its_entry_point_is_refused(tmp_path, monkeypatch):
    install_here(tmp_path / "pkg", monkeypatch,
                 extra_groups={"strata.engines": {"tgi": "strata_example.engine:SCRIPTED"}})
    try:
        with pytest.raises(PluginError, match="the EngineSpec is named 'scripted': name the "
                                              "entry point as the engine"):
            engines.engine("tgi")
    finally:
        forget()


def test_plugins_are_read_once(plugin, monkeypatch):
    """Loaded on first use, then never again in the process (the metadata scan and the
    imports are paid once): a later change on disk is not seen until ``reset``."""
    first = ep.load(ep.ENGINES)
    (plugin / "strata_example-0.1.0.dist-info" / "entry_points.txt").write_text("")
    assert ep.load(ep.ENGINES) is first and engines.engine("scripted").flush
    ep.reset()
    assert ep.load(ep.ENGINES) == () and engines.engine_names() == engines.ENGINES


@pytest.mark.integration
def test_a_broken_plugin_stops_the_run_in_its_first_second(tmp_path, monkeypatch):
    """A real pytest run of the plugin, with the package's rule pointing at a module that
    does not exist: a usage error (exit 4) naming the distribution and entry point,
    before any server, agent or run folder."""
    pkg = install_here(tmp_path / "pkg", monkeypatch, extra_groups={
        "strata.rules": {"fd_exhaustion": "strata_example.gone:FD_EXHAUSTION"}})
    forget()
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "test_case.py").write_text(
        "from strata_plugin import Workload\n"
        "def test_one(strata):\n"
        "    strata.run(Workload('w', isl=8, osl=2, requests=1), scale=False)\n")
    (repo / "p.toml").write_text(doc_block("# profiles/scripted.toml", "toml"))
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--strata-profile",
         str(repo / "p.toml"), "--strata-reports-dir", str(repo / "reports"), "-q"],
        cwd=repo, capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(pkg)})
    took = time.monotonic() - t0
    assert out.returncode == 4, out.stdout + out.stderr
    text = _one_line(out.stdout + out.stderr)
    assert ("Strata plugin entry point 'fd_exhaustion' = 'strata_example.gone:FD_EXHAUSTION' "
            f"in group 'strata.rules' of {DIST} 0.1.0: failed to import: ModuleNotFoundError"
            in text), text
    assert not (repo / "reports").exists()
    assert took < 30, took  # the interpreter and pytest start; nothing is waited for


def test_the_package_is_written_as_the_page_lays_it_out(tmp_path):
    listed = doc_block("strata-example/", "text").split()
    files = sorted(str(p.relative_to(tmp_path)) for p in write_package(tmp_path).rglob("*")
                   if p.is_file())
    assert files == sorted(w for w in listed if ("." in w and "/" in w) or w == "pyproject.toml")


def test_the_commands_name_a_broken_plugin(tmp_path, monkeypatch):
    """``plugins`` exits 1 and ``report DIR`` exits 2, each with the one error, as the page
    says; the run folder's raw files are left as they were."""
    from bundle_factory import cpu_run

    install_here(tmp_path / "pkg", monkeypatch, extra_groups={
        "strata.report_sections": {"fds": "strata_example.gone:FDS"}})
    forget()  # the subprocesses below load it, this process does not
    run = cpu_run(tmp_path / "runs")
    before = sorted(p.name for p in run.iterdir())
    error = ("error: Strata plugin entry point 'fds' = 'strata_example.gone:FDS' in group "
             f"'strata.report_sections' of {DIST} 0.1.0: failed to import: "
             "ModuleNotFoundError: No module named 'strata_example.gone'")
    for argv, rc in ((["plugins"], 1), (["report", str(run)], 2)):
        out = subprocess.run([sys.executable, "-m", "strata_plugin", *argv],
                             capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == rc, out.stderr
        assert out.stderr.startswith(error), out.stderr
    assert sorted(p.name for p in run.iterdir()) == before
