"""docs/extending.md, "A collector", with the page's own code: if the page and the agent
drift apart, this fails.

The page's package is installed in this process as pip would leave it
(``tests/plugin_package.py``). Its collector runs in a real agent process the way the
harness starts one (``run/agents.local_argv``), on a process that holds most of its
file descriptors, and its rows are read back through the analysis into the rule's
signal. On another node (a fake ``ssh`` running the remote line in an empty
environment, with Python 3.8 where there is one: a node where neither Strata nor the
plugin is installed) the module travels in the agent's zip; one that cannot travel is
UNAVAILABLE there with the reason, and still runs on the head node.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from plugin_package import doc_block, forget, install_here, uninstall

from strata_plugin.agent import cli
from strata_plugin.agent.handle import AgentHandle, agent_argv
from strata_plugin.agent.protocol import CSV_HEADER, parse_sample_line
from strata_plugin.agent.targets import ProcessTargets
from strata_plugin.analysis.signals import HwView
from strata_plugin.analysis.timeline import Window, load_samples, summarize_window
from strata_plugin.configure.profile import ProfileError, TelemetrySpec, load_profile
from strata_plugin.entry_points import PluginError, collector_modules, collector_names
from strata_plugin.run import remote
from strata_plugin.run.agent_plugins import ship_problem, zip_files
from strata_plugin.run.agents import local_argv
from tests.test_agent_old_python import _fake_ssh, _old_pythons

MODULE = "strata_example.fds"
LIMIT = 256  # the soft RLIMIT_NOFILE of the process the tests sample
HELD = 240  # descriptors it holds open: 94% of its limit, past the rule's 0.9


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    yield install_here(tmp_path / "pkg", monkeypatch)
    forget()


@pytest.fixture
def near_its_limit():
    """A process holding most of its file descriptors, as the page's server did."""
    code = (
        "import os, resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({LIMIT}, "
        "resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "held = []\n"
        f"while len(os.listdir('/proc/self/fd')) < {HELD} + 1:\n"
        "    held.append(open(os.devnull))\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        assert len(os.listdir(f"/proc/{p.pid}/fd")) == HELD
        yield p.pid
    finally:
        p.stdin.close()
        p.wait(10)


def doc_rows() -> list[list[str]]:
    """The page's example rows of samples/fds.csv (found by their header: the agent's)."""
    return [r.split(",") for r in doc_block(CSV_HEADER, "csv").splitlines()]


def test_the_module_keeps_to_python_3_8(plugin):
    """The agent's promise (tests/test_agent_old_python.py) holds for the page's module."""
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from vermin.main import main; sys.exit(main())",
         "-t=3.8-", "--violations", "--no-tips", "--no-parse-comments",
         str(plugin / "strata_example" / "fds.py")], capture_output=True, text=True,
        check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_entry_point_is_what_makes_the_name_known(plugin, tmp_path, near_its_limit):
    assert collector_modules() == {"fds": MODULE}
    assert collector_names()[-1] == "fds" and "proc" in collector_names()
    profile = tmp_path / "p.toml"
    collectors = doc_block("# in the profile", "toml")
    profile.write_text('name = "t"\n[server]\nengine = "other"\napi = "completions"\n'
                       + collectors)
    assert load_profile(profile).telemetry.collectors == ("proc", "cpu", "mem", "fds")

    # the harness hands the agent the module, as the page says
    argv = local_argv(TelemetrySpec(collectors=("fds",)), "local", near_its_limit, None, None)
    assert argv[argv.index("--collector-module") + 1] == f"fds={MODULE}"
    args = cli.build_parser().parse_args(argv[3:])
    (c,) = [c for c in cli.make_collectors(args, ProcessTargets(pids=[near_its_limit]))
            if c.source == "fds"]
    assert type(c).__module__ == MODULE and c.follows_targets
    c.probe()
    wall = time.time_ns()
    emits = c.sample(wall)
    # the tuples the page describes, in the order of its CSV rows
    assert [(m, k) for _, _, m, _, k in emits] == [(r[4], r[6]) for r in doc_rows()]
    assert emits == [(wall, f"pid{near_its_limit}", "fds_open", HELD, "gauge"),
                     (wall, f"pid{near_its_limit}", "fds_max", LIMIT, "gauge")]

    # the agent alone, without the module, does not know the name
    bare = cli.build_parser().parse_args(["--collectors", "fds"])
    with pytest.raises(ValueError, match=r"unknown collector 'fds'; known: proc, cpu, "):
        cli.make_collectors(bare, ProcessTargets())
    uninstall(plugin)
    with pytest.raises(ProfileError, match=r"telemetry\.collectors"):
        load_profile(profile)


def test_a_module_that_cannot_be_imported_on_a_node_is_unavailable_there():
    args = cli.build_parser().parse_args(
        ["--collectors", "cpu,fds", "--collector-module", "fds=strata_example_gone.fds"])
    cpu, fds = cli.make_collectors(args, ProcessTargets())
    assert fds.source == "fds" and fds.reason == (
        "plugin module strata_example_gone.fds could not be imported on this node: "
        "ModuleNotFoundError: No module named 'strata_example_gone'")
    assert cpu.source == "cpu"


def test_a_collector_entry_point_must_name_a_module(tmp_path, monkeypatch):
    install_here(tmp_path / "pkg", monkeypatch, extra_groups={
        "strata.collectors": {"fds2": "strata_example.fds:FdsCollector"}})
    try:
        with pytest.raises(PluginError, match="a collector's entry point names its module"):
            collector_names()
    finally:
        forget()
    install_here(tmp_path / "pkg2", monkeypatch, extra_groups={
        "strata.collectors": {"cpu": "strata_example.fds"}})
    try:
        with pytest.raises(PluginError, match="'cpu' is already a built-in collector"):
            collector_names()
    finally:
        forget()


def _run_agent(argv: list[str], node_dir: Path, want: int = 8) -> tuple[dict, int, int]:
    t0 = time.time_ns()
    h = AgentHandle.start("node0", node_dir, argv)
    try:
        hello = h.hello
        deadline = time.monotonic() + 30
        while h.samples_written.get("fds", 0) < want and time.monotonic() < deadline:
            if not h.alive:
                break
            time.sleep(0.05)
    finally:
        info = h.stop()
    assert info.expected, info
    return hello, t0, time.time_ns()


def test_a_real_agent_runs_it_and_the_analysis_reads_it(plugin, tmp_path, near_its_limit):
    """The agent the harness starts (its argv from the profile's telemetry) samples the
    page's collector; its rows land in samples/fds.csv as the page shows them, and the
    rule's signal function (the page's rules.py) turns their summary into the fraction."""
    argv = local_argv(TelemetrySpec(interval_s=0.1, collectors=("fds",)), "node0",
                      near_its_limit, None, None)
    node_dir = tmp_path / "run" / "nodes" / "node0"
    hello, t0, t1 = _run_agent(argv, node_dir)
    assert hello["collectors"]["fds"] == {"status": "ok"}

    lines = (node_dir / "samples" / "fds.csv").read_text().splitlines()
    assert lines[0] == CSV_HEADER
    rows = [parse_sample_line(x) for x in lines[1:]]
    assert len(rows) >= 8
    assert {(s.source, s.device, s.metric, s.value, s.kind) for s in rows} == {
        ("fds", f"pid{near_its_limit}", "fds_open", HELD, "gauge"),
        ("fds", f"pid{near_its_limit}", "fds_max", LIMIT, "gauge")}

    store = load_samples(tmp_path / "run")
    stats = summarize_window(store, Window("case", "c", "c", t0, t1))
    from strata_example.rules import fd_signals

    assert fd_signals(HwView(stats), "node0") == {"fd_used_frac": HELD / LIMIT}
    assert fd_signals(HwView([s for s in stats if s.metric != "fds_max"]), "node0") == {
        "fd_used_frac": None}  # not measured: the rule is unassessable


def _remote(local: list[str], tmp_path: Path, python: str) -> list[str]:
    return remote.remote_agent_argv("fake", local, ssh_options=(), ssh=_fake_ssh(tmp_path),
                                    remote_python=python)


@pytest.mark.parametrize("python", _old_pythons()[:1] or ["/usr/bin/python3"])
def test_on_another_node_it_travels_in_the_agent_zip(plugin, tmp_path, near_its_limit,
                                                     python):
    """A node with neither Strata nor the plugin (an empty environment, its own Python):
    the module comes in the zip, imports the agent under its home name, and samples."""
    local = local_argv(TelemetrySpec(interval_s=0.1, collectors=("fds",)), "node0",
                       near_its_limit, None, None)
    argv = _remote(local, tmp_path, python)
    assert argv[argv.index("--ship") + 1] == MODULE
    bare = subprocess.run([python, "-c", "import strata_example"], capture_output=True,
                          env={"PATH": "/usr/bin:/bin"}, check=False)
    assert bare.returncode != 0  # it is not installed for that Python
    hello, _, _ = _run_agent(argv, tmp_path / "nodes" / "node0")
    assert hello["python"].split(".")[:2] == subprocess.run(
        [python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
        check=True).stdout.split(".")[:2]
    assert hello["collectors"]["fds"] == {"status": "ok"}
    rows = (tmp_path / "nodes" / "node0" / "samples" / "fds.csv").read_text().splitlines()
    assert f",fds,pid{near_its_limit},fds_open,{HELD},gauge" in rows[1]


def test_a_module_that_cannot_travel_runs_on_the_head_node_only(plugin, tmp_path,
                                                               near_its_limit):
    """A collector module that imports beyond the standard library and the agent: on the
    remote node it is UNAVAILABLE, saying why and where it runs; the head node's agent
    (this machine, the package installed) runs it."""
    heavy = plugin / "strata_example" / "fds_heavy.py"
    heavy.write_text((plugin / "strata_example" / "fds.py").read_text() + "\nimport numpy\n")
    local = agent_argv("node0", 0.1, pids=[near_its_limit], collectors=["fds"],
                       collector_modules={"fds": "strata_example.fds_heavy"})
    argv = _remote(local, tmp_path, "/usr/bin/python3")
    assert "--ship" not in argv
    hello, _, _ = _run_agent(argv, tmp_path / "remote" / "node0", want=0)
    assert hello["collectors"]["fds"] == {
        "status": "UNAVAILABLE",
        "reason": "not shipped to this node, it runs on the head node only: "
                  "strata_example.fds_heavy imports numpy, which is neither the standard "
                  "library nor the agent (strata_plugin.agent) "
                  "(docs/extending.md, \"A collector\")"}
    hello, _, _ = _run_agent(local, tmp_path / "head" / "node0")
    assert hello["collectors"]["fds"] == {"status": "ok"}


def test_what_travels_is_one_stdlib_file(plugin):
    pkg = plugin / "strata_example"
    assert ship_problem(MODULE) is None
    assert zip_files([MODULE]) == {"strata_example/__init__.py": b"",
                                   "strata_example/fds.py": (pkg / "fds.py").read_bytes()}
    (pkg / "sibling.py").write_text("from . import fds\n")
    (pkg / "extended.py").write_text("from strata_plugin.extend import Section\n")
    (pkg / "sub").mkdir()
    (pkg / "sub" / "__init__.py").write_text("")
    assert ship_problem("strata_example.sibling") == (
        "strata_example.sibling imports from its own package (.): only its own file travels")
    assert ship_problem("strata_example.extended") == (
        "strata_example.extended imports strata_plugin.extend, which is neither the "
        "standard library nor the agent (strata_plugin.agent)")
    assert ship_problem("strata_example.sub").startswith(
        "strata_example.sub is not a single Python file")
    assert ship_problem("strata_example.nowhere") == "strata_example.nowhere cannot be found here"
    with pytest.raises(ValueError, match="imports from its own package"):
        zip_files(["strata_example.sibling"])


def test_the_agent_takes_plugin_options_as_pairs():
    with pytest.raises(ValueError, match="--collector-module takes NAME=VALUE, not 'fds'"):
        cli.make_collectors(argparse.Namespace(collectors="fds", collector_module=["fds"],
                                               collector_unavailable=[]), ProcessTargets())
