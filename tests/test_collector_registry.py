"""The collector registry (agent/collectors/registry.py) is the one list of collector names:
the agent's ``--collectors``, a profile's ``telemetry.collectors`` and the docs read it or
are checked against it here, and every entry builds its collector lazily."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from strata_plugin.agent import cli
from strata_plugin.agent.collectors import registry
from strata_plugin.agent.collectors.base import Collector, Missing
from strata_plugin.agent.targets import ProcessTargets
from strata_plugin.configure import profile as P
from strata_plugin.configure.profile import ProfileError, load_profile

ROOT = Path(__file__).resolve().parents[1]
#: The names as the if/elif chain the registry replaced listed them (main at e99a03e);
#: a new collector goes after them.
NAMES = ("proc", "cpu", "mem", "disk", "net", "rdma", "nvml", "dcgm", "prom", "log", "perf",
         "numa", "runstate")


def _args(*argv: str):
    return cli.build_parser().parse_args(list(argv))


def test_the_agent_and_the_profile_take_the_registry_names_in_its_order():
    assert registry.names() == tuple(registry.COLLECTORS) == cli.ALL_COLLECTORS == P.COLLECTORS
    assert _args().collectors == ",".join(registry.names())
    assert registry.names()[:len(NAMES)] == NAMES  # what the chain knew, in its order
    assert set(registry.CPU_SIDE) < set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_each_entry_builds_its_own_collector(name):
    (c,) = cli.make_collectors(_args("--collectors", name, "--prom-url", "http://127.0.0.1:9/m",
                                     "--log-file", "/nonexistent.log"), ProcessTargets())
    try:
        assert isinstance(c, Collector) and not isinstance(c, Missing)
        assert c.source == name
    finally:
        c.close()


def test_an_option_it_needs_missing_is_reported_with_the_reason():
    prom, log = cli.make_collectors(_args("--collectors", "prom,log"), ProcessTargets())
    assert isinstance(prom, Missing) and isinstance(log, Missing)
    assert (prom.source, prom.reason) == ("prom", "no --prom-url given")
    assert (log.source, log.reason) == ("log", "no --log-file given")


def test_the_collectors_that_follow_the_server_are_the_ones_that_did():
    """``pids`` lines reach these (the chain's TARGET_COLLECTORS), and no other."""
    made = cli.make_collectors(_args("--collectors", ",".join(NAMES), "--prom-url",
                                     "http://127.0.0.1:9/m", "--log-file", "/x.log"),
                               ProcessTargets())
    try:
        assert {c.source for c in made if c.follows_targets} == {"proc", "perf", "numa",
                                                                  "runstate"}
    finally:
        for c in made:
            c.close()


def test_an_unknown_name_is_refused_as_before():
    with pytest.raises(ValueError) as e:
        cli.make_collectors(_args("--collectors", "proc,gpu"), ProcessTargets())
    # the chain's message, word for word, with the registry's names
    assert str(e.value) == f"unknown collector 'gpu'; known: {', '.join(registry.names())}"
    assert str(e.value).startswith("unknown collector 'gpu'; known: proc, cpu, mem, disk, "
                                   "net, rdma, nvml, dcgm, prom, log, perf, numa, runstate")
    out = subprocess.run([sys.executable, "-m", "strata_plugin.agent", "--collectors", "gpu",
                          "--no-stdin", "--duration", "1"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == f"agent: {e.value}"


def test_a_collector_module_is_imported_only_when_asked_for():
    code = (
        "import json, sys\n"
        "from strata_plugin.agent.cli import build_parser, make_collectors\n"
        "from strata_plugin.agent.targets import ProcessTargets\n"
        "make_collectors(build_parser().parse_args(['--collectors', 'proc,cpu']), "
        "ProcessTargets())\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith("
        "'strata_plugin.agent.collectors.') or m == 'pynvml')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    pkg = "strata_plugin.agent.collectors."
    assert json.loads(out.stdout) == [pkg + m for m in ("base", "cpu", "proc", "registry")]


def test_a_profile_takes_the_registry_names(tmp_path, monkeypatch):
    path = tmp_path / "p.toml"
    path.write_text('name = "p"\n[server]\nengine = "llamacpp"\nargv = ["x"]\n'
                    '[telemetry]\ncollectors = ["proc", "registry_test_only"]\n')
    with pytest.raises(ProfileError, match=r"telemetry.collectors.*names from \['proc'"):
        load_profile(path)
    monkeypatch.setitem(registry.COLLECTORS, "registry_test_only", ".registry_test_only")
    assert load_profile(path).telemetry.collectors == ("proc", "registry_test_only")


def test_the_agent_docs_table_names_exactly_the_registry():
    """The one table of collectors a user reads (docs/profile.md and docs/formats.md point
    to it): a collector without its row, or a row for none, fails here."""
    agent_md = (ROOT / "docs" / "agent.md").read_text()
    table = agent_md.split("## Collectors", 1)[1].split("\n\n| source |", 1)[1].split("\n\n")[0]
    assert tuple(re.findall(r"^\| `(\w+)` \|", table, flags=re.M)) == registry.names()
