"""docs/extending.md, "Adding a collector", step by step with the page's own code: if the
page and the agent drift apart, this fails.

The page's module is written where the agent's collector package finds it and its
registry line is added (in this process, or in a real agent process the harness starts);
the product's registry has no ``files`` collector.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from strata_plugin.agent import cli
from strata_plugin.agent import collectors as collector_pkg
from strata_plugin.agent.collectors import registry
from strata_plugin.agent.handle import AgentHandle
from strata_plugin.agent.protocol import CSV_HEADER, parse_sample_line
from strata_plugin.agent.targets import ProcessTargets
from strata_plugin.analysis.signals import HwView
from strata_plugin.analysis.timeline import Window, load_samples, summarize_window

DOC = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
SECTION = DOC.split("## Adding a collector", 1)[1].split("\n## ", 1)[0]
RULE_SECTION = DOC.split("## Adding a rule", 1)[1].split("\n## ", 1)[0]
MODULE = "strata_plugin.agent.collectors.files"


def block(first_line: str, text: str = SECTION, lang: str = "python") -> str:
    """The page's code block whose first line (a comment naming where it goes) is
    ``first_line``: the lines after it, dedented."""
    for b in re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S):
        head, _, body = textwrap.dedent(b).partition("\n")
        if head.strip() == first_line:
            return textwrap.dedent(body)
    raise AssertionError(f"docs/extending.md has no {lang} block starting {first_line!r}")


def registry_line() -> dict[str, str]:
    return ast.literal_eval(
        "{" + block("# strata_plugin/agent/collectors/registry.py, in COLLECTORS") + "}")


def doc_rows() -> list[list[str]]:
    """The page's example rows of samples/files.csv (found by their header: the agent's)."""
    return [r.split(",") for r in block(CSV_HEADER, lang="csv").splitlines()]


def file_max() -> int:
    return int(Path("/proc/sys/fs/file-max").read_text())


@pytest.fixture
def module_dir(tmp_path):
    """Step 1: the page's module, where the collector package looks for its modules."""
    code = block("# strata_plugin/agent/collectors/files.py")
    d = tmp_path / "collectors"
    d.mkdir()
    (d / "files.py").write_text(code)
    yield d
    sys.modules.pop(MODULE, None)


def test_the_module_keeps_to_python_3_8(module_dir):
    """The agent's promise (tests/test_agent_old_python.py) holds for the page's module."""
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from vermin.main import main; sys.exit(main())",
         "-t=3.8-", "--violations", "--no-tips", "--no-parse-comments",
         str(module_dir / "files.py")], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_registry_line_is_what_makes_the_name_known(module_dir, monkeypatch):
    args = cli.build_parser().parse_args(["--collectors", "files"])
    monkeypatch.setattr(collector_pkg, "__path__", [*collector_pkg.__path__, str(module_dir)])
    with pytest.raises(ValueError, match=r"unknown collector 'files'; known: proc, cpu, "):
        cli.make_collectors(args, ProcessTargets())
    assert MODULE not in sys.modules  # nothing imported for a name the registry lacks

    line = registry_line()
    assert line == {"files": ".files"}
    for name, module in line.items():  # step 2
        monkeypatch.setitem(registry.COLLECTORS, name, module)
    (c,) = cli.make_collectors(args, ProcessTargets())
    assert type(c).__module__ == MODULE and c.source == "files"
    c.probe()
    wall = time.time_ns()
    emits = c.sample(wall)
    # the tuples the page describes, in the order of its CSV rows
    assert [(d, m, k) for _, d, m, _, k in emits] == [
        (r[3], r[4], r[6]) for r in doc_rows()]
    (_, _, _, allocated, _), (_, _, _, maximum, _) = emits
    assert all(e[0] == wall for e in emits)
    assert type(allocated) is int and type(maximum) is int
    assert maximum == file_max() and 0 < allocated <= maximum


def test_a_real_agent_runs_it_and_the_analysis_reads_it(module_dir, tmp_path):
    """The harness's AgentHandle starts an agent process whose registry has the page's
    line; its rows land in samples/files.csv as the page shows them, and the analysis
    summarizes them per window and turns them into the rule section's signal."""
    ((name, module),) = registry_line().items()
    launch = (
        "import sys\n"
        "import strata_plugin.agent.collectors as pkg\n"
        "from strata_plugin.agent.collectors import registry\n"
        "pkg.__path__.append(sys.argv.pop(1))\n"
        "name, module = sys.argv.pop(1), sys.argv.pop(1)\n"
        "registry.COLLECTORS[name] = module\n"
        "from strata_plugin.agent.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    argv = [sys.executable, "-c", launch, str(module_dir), name, module, "--node", "node0",
            "--interval", "0.1", "--collectors", name]
    node_dir = tmp_path / "run" / "nodes" / "node0"
    t0 = time.time_ns()
    h = AgentHandle.start("node0", node_dir, argv)
    try:
        assert h.hello["collectors"] == {"files": {"status": "ok"}}
        deadline = time.monotonic() + 20
        while h.samples_written.get("files", 0) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        info = h.stop()
    t1 = time.time_ns()
    assert info.expected, info

    lines = (node_dir / "samples" / "files.csv").read_text().splitlines()
    assert lines[0] == CSV_HEADER
    rows = [parse_sample_line(x) for x in lines[1:]]
    assert len(rows) >= 10
    shape = {(r[1], r[2], r[3], r[4], r[6]) for r in doc_rows()}
    assert {(s.node, s.source, s.device, s.metric, s.kind) for s in rows} == shape

    store = load_samples(tmp_path / "run")
    stats = summarize_window(store, Window("case", "c", "c", t0, t1))
    got = {(s.source, s.device, s.metric): s for s in stats if s.source == "files"}
    assert set(got) == {("files", "", "files_open"), ("files", "", "files_max")}
    assert got["files", "", "files_max"].mean == file_max()
    assert got["files", "", "files_open"].kind == "gauge"
    assert 0 < got["files", "", "files_open"].max <= file_max()

    # the rule section's signal, its page's lines run on these summaries
    scope = {"view": HwView(stats), "node": "node0"}
    exec(block("# strata_plugin/analysis/signals.py, in _host_signals", RULE_SECTION), scope)
    frac = scope["file_handles_frac"]
    assert frac == got["files", "", "files_open"].max / file_max()
    assert 0 < frac < 1
    scope = {"view": HwView([s for s in stats if s.metric != "files_max"]), "node": "node0"}
    exec(block("# strata_plugin/analysis/signals.py, in _host_signals", RULE_SECTION), scope)
    assert scope["file_handles_frac"] is None  # not measured: the rule is unassessable
