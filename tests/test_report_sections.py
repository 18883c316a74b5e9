"""What a user sees, pinned on a recorded run, offline: report.md and the JUnit properties.

``tests/data/runs/smoke.tar.xz`` holds the raw files (manifest, markers, cases, requests,
samples, static snapshots, server log; no derived file) of one real run of the smoke
matrix, ``pytest cases/ -m smoke`` with the local profile (llama-server on the 2-core
development VM). The test rebuilds every derived file from them (``write_report``, as
``python -m strata_plugin report DIR`` does) and compares, byte for byte:

* ``report.md`` with ``tests/golden/report_smoke.md``;
* each case's JUnit properties, as the plugin computes them at a case's teardown
  (``plugin/case_teardown.py``, ``case_properties``), and the suite's, with
  ``tests/golden/junit_smoke.txt``.

After a deliberate change to the report or the metrics, regenerate them with
``STRATA_REGEN_GOLDEN=1 pytest tests/test_report_sections.py`` and review the diff like
code.

The golden files were written by main's code before report sections became one list
(``report/sections.py``), and the list keeps them byte for byte. Marked ``integration``:
rebuilding the whole matrix's files takes about 35 s of CPU.

The rest, on a fabricated run (``tests/bundle_factory.py``, seconds): rendering is pure
(it opens no file: every read is the writer's), and docs/extending.md's "A report
section" with the page's own plugin package installed (``tests/plugin_package.py``).
"""

from __future__ import annotations

import builtins
import dataclasses
import difflib
import gzip
import io
import json
import os
import pathlib
import re
import shutil
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from bundle_factory import cpu_run
from plugin_package import forget, install_here

from strata_plugin.analysis.run_folder import DERIVED, DERIVED_DIRS
from strata_plugin.entry_points import PluginError
from strata_plugin.report import diagnostic, sections, write_report

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "data" / "runs" / "smoke.tar.xz"
GOLDEN_REPORT = HERE / "golden" / "report_smoke.md"
GOLDEN_JUNIT = HERE / "golden" / "junit_smoke.txt"


def unpack(dest: Path) -> Path:
    """The recorded raw files in ``dest/<run id>``; no derived file among them."""
    with tarfile.open(RECORDED) as t:
        t.extractall(dest, filter="data")
    (run,) = [p for p in dest.iterdir() if p.is_dir()]
    assert not [n for n in DERIVED if (run / n).exists()]
    assert not [n for n in DERIVED_DIRS if (run / n).exists()]
    return run


def junit_properties(run: Path) -> str:
    """The JUnit properties of every test of the run, one ``key = value`` line each:
    the suite's (``plugin/fixtures.py``) and each test's cases' (``case_properties``,
    the function the plugin calls), grouped by the test's node id as cases.jsonl
    records it. The two path-valued ones (run folder, report) are left out."""
    from strata_plugin.plugin.case_teardown import case_properties

    manifest = json.loads((run / "manifest.json").read_text())
    profile = manifest.get("profile") or {}
    name = profile.get("name") if isinstance(profile, dict) else profile
    out = [f"suite: strata_run_id = {manifest.get('run_id')}",
           f"suite: strata_profile = {name}"]
    by_node: dict[str, list[tuple[str, str]]] = {}
    for line in (run / "cases.jsonl").read_text().splitlines():
        case = json.loads(line)
        if not case.get("nodeid"):  # the line written while the case ran; its test's follows
            continue
        ids = [c for c, _ in by_node.setdefault(case["nodeid"], [])]
        if case["case_id"] not in ids:
            by_node[case["nodeid"]].append((case["case_id"], case.get("config_id", "")))
    for nodeid, cases in by_node.items():
        sess = SimpleNamespace(run_dir=run)
        runner = SimpleNamespace(results=[SimpleNamespace(case_id=c, headline={})
                                          for c, _ in cases])
        props, _ = case_properties(sess, runner)
        props.append(("strata_config", cases[-1][1]))
        out += [f"{nodeid}: {k} = {v!r}" for k, v in props]
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    """The recorded run with its derived files rebuilt."""
    run = unpack(tmp_path_factory.mktemp("recorded"))
    write_report(run)
    return run


def _compare(got: str, golden: Path, what: str) -> None:
    if os.environ.get("STRATA_REGEN_GOLDEN") == "1":
        golden.write_text(got)
    want = golden.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                        "golden", "now", n=1))
    assert got == want, f"{what} changed (review, then regenerate: module docstring):\n" \
        + diff[:6000]


@pytest.mark.integration
def test_report_md_is_the_golden_one(regenerated):
    run = regenerated
    _compare((run / "report.md").read_text(), GOLDEN_REPORT, "report.md")


@pytest.mark.integration
def test_junit_properties_are_the_golden_ones(regenerated):
    run = regenerated
    _compare(junit_properties(run), GOLDEN_JUNIT, "JUnit properties")


def test_the_recording_is_the_whole_smoke_matrix():
    """The golden file covers what the smoke matrix shows: every smoke test's cases, an
    A/B group, a server-configuration sweep, several server configs."""
    text = GOLDEN_JUNIT.read_text()
    nodes = {line.split(": ", 1)[0] for line in text.splitlines()
             if not line.startswith("suite:")}
    assert any(n.startswith("cases/test_matrix.py::test_prefill") for n in nodes)
    assert any(n.startswith("cases/test_matrix.py::test_decode") for n in nodes)
    assert any(n.startswith("cases/test_mixed.py") for n in nodes)
    assert any(n.startswith("cases/test_sweeps.py") for n in nodes)
    report = GOLDEN_REPORT.read_text()
    assert "\n## A/B comparisons\n\n### " in report
    assert len(set(re.findall(r"strata_config = '([^']+)'", text))) >= 2


# Rendering is pure; a section is one list entry (on a fabricated run: seconds)

#: The last line the fabricated run's server wrote (the example section shows it).
LOG_LAST = "srv  log_server_r: request: POST /completion 127.0.0.1 200"


def add_diagnostic_round(run: Path, timed: str, traced: str) -> None:
    """Make ``traced`` the kernel-traced repetition of ``timed``, its trace the real
    capture ``tests/data/traces/sched-clean`` (what ``--strata-escalate`` leaves)."""
    src = HERE / "data" / "traces" / "sched-clean"
    dest = run / "traces" / traced
    dest.mkdir(parents=True)
    meta = json.loads((src / "meta.json").read_text())
    meta["captured"] = ["sched"]  # which tracers ran: the round records it beside the capture
    (dest / "meta.json").write_text(json.dumps(meta))
    with gzip.open(src / "trace.txt.gz", "rt") as fh:
        (dest / "trace.txt").write_text(fh.read())
    lines = [json.loads(x) for x in (run / "cases.jsonl").read_text().splitlines()]
    line = [x for x in lines if x["case_id"] == traced][-1]
    line = {**line, "diagnostic_of": timed, "window_mono_ns": meta["window_ns"]}
    with (run / "cases.jsonl").open("a") as fh:
        fh.write(json.dumps(line) + "\n")


@pytest.fixture(scope="module")
def fabricated(tmp_path_factory) -> tuple[Path, object]:
    """A fabricated run with its report written; and the ReportData it was rendered from."""
    run = cpu_run(tmp_path_factory.mktemp("fabricated"))
    (run / "service" / "default").mkdir(parents=True)
    (run / "service" / "default" / "server.log").write_text(f"main: server is listening\n"
                                                             f"{LOG_LAST}\n")
    add_diagnostic_round(run, timed="light", traced="cpu_bound")
    seen = []
    original = sections.render
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sections, "render", lambda d, *a: seen.append(d) or original(d, *a))
        write_report(run, plots=False)
    (data,) = seen
    return run, data


#: What rendering must not call: every way this code base opens, lists or stats a file.
FILE_CALLS = [
    (builtins, "open"), (io, "open"), (os, "open"), (os, "stat"), (os, "listdir"),
    (os, "scandir"), (pathlib.Path, "open"), (pathlib.Path, "read_text"),
    (pathlib.Path, "read_bytes"), (pathlib.Path, "exists"), (pathlib.Path, "stat"),
    (pathlib.Path, "glob"), (pathlib.Path, "iterdir"),
]


def _refuse_files(monkeypatch) -> list:
    calls: list = []

    def refuse(*a, **k):
        calls.append(a[:1])
        raise AssertionError(f"touched a file: {a[:1]}")

    for owner, name in FILE_CALLS:
        monkeypatch.setattr(owner, name, refuse)
    return calls


def test_render_reads_no_file(fabricated, monkeypatch):
    run, data = fabricated
    calls = _refuse_files(monkeypatch)
    text = sections.render(data)
    monkeypatch.undo()
    assert not calls
    assert text == (run / "report.md").read_text()  # the report the writer wrote, again


def test_a_section_that_reads_a_file_fails_under_the_guard(fabricated, monkeypatch):
    """The guard above is live: the example section's reading, done in render instead of
    in prepare, is caught (and, as any section's failure, costs that section only)."""
    _, data = fabricated
    log = data.bundle.run_dir / "service" / "default" / "server.log"
    reading = sections.Section("reads", lambda d: log.read_text())
    calls = _refuse_files(monkeypatch)
    text = sections.render(data, (*sections.SECTIONS, reading))
    monkeypatch.undo()
    assert calls == [(log,)]
    assert "\n## reads\n\nreads: unavailable (AssertionError in test_report_sections.py " \
           "refuse (from strata_plugin/report/sections.py _rendered): touched a file: " in text


def test_section_names_are_unique():
    names = [s.name for s in sections.SECTIONS]
    assert len(names) == len(set(names))
    twice = (*sections.SECTIONS, sections.Section(names[3], lambda d: ""))
    with pytest.raises(ValueError, match=f"named twice: {names[3]}"):
        sections.prepare(None, Path("."), twice)  # type: ignore[arg-type]


def _with_fds_samples(run: Path, dest: Path) -> Path:
    """A copy of ``run`` whose first node also sampled the page's collector: a server
    process holding 128 of its 256 file descriptors, at every time the cpu collector
    sampled (the node's own clock, as the agent writes it)."""
    copy = dest / run.name
    shutil.copytree(run, copy)
    samples = sorted((copy / "nodes").iterdir())[0] / "samples"
    first = (samples / "cpu.csv").read_text().splitlines()
    node = first[1].split(",")[1]
    walls = sorted({int(r.split(",")[0]) for r in first[1:]})
    (samples / "fds.csv").write_text(first[0] + "\n" + "".join(
        f"{w},{node},fds,pid4242,{m},{v},gauge\n" for w in walls
        for m, v in (("fds_open", 128), ("fds_max", 256))))
    return copy


def _headings(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, flags=re.M)


def test_a_plugin_section_as_the_page_says(fabricated, tmp_path, monkeypatch):
    """docs/extending.md, "A report section": the page's package installed (its
    entry points found by Strata's discovery), the writer as it is renders the page's
    section, after Strata's own and before the closing thresholds table."""
    run, _ = fabricated
    copy = _with_fds_samples(run, tmp_path)
    install_here(tmp_path / "pkg", monkeypatch)
    try:
        write_report(copy, plots=False)
    finally:
        forget()
    text = (copy / "report.md").read_text()
    own = _headings((run / "report.md").read_text())
    assert _headings(text) == [*own[:-1], "File descriptors", own[-1]]
    assert own[-1] == "Thresholds"
    part = text[text.index("\n## File descriptors\n"):text.index("\n## Thresholds\n")]
    cases = [a for a in json.loads((copy / "summary.json").read_text())["cases"]]
    rows = [line for line in part.splitlines() if line.startswith("| ") and "pid4242" in line]
    assert rows and len(rows) == len(cases)
    assert all(r.endswith("| pid4242 | 128 | 256 | 50% |") for r in rows)
    # the rule took part too: its threshold is cited in thresholds.md
    assert "| fd_used_frac | 0.9 | ratio | [inferred] getrlimit(2)" in (
        copy / "thresholds.md").read_text()


BROKEN_SECTIONS = """
from strata_plugin.extend import Section


def boom(d, *rest):
    raise ZeroDivisionError("the plugin's own bug")


RENDER = Section("File descriptors", boom)
PREPARE = Section("File descriptors", lambda d: "never", boom)
BUILT_IN = Section("summary", lambda d: "")
"""


@pytest.mark.parametrize("value", ["RENDER", "PREPARE"])
def test_a_plugin_section_that_raises_is_one_line_of_the_report(fabricated, tmp_path,
                                                                 monkeypatch, value):
    run, _ = fabricated
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    pkg = install_here(tmp_path / "pkg", monkeypatch, drop=("strata.rules",), extra_groups={
        "strata.report_sections": {"fds": f"strata_example.broken_sections:{value}"}})
    (pkg / "strata_example" / "broken_sections.py").write_text(BROKEN_SECTIONS)
    try:
        write_report(copy, plots=False)
    finally:
        forget()
    text = (copy / "report.md").read_text()
    line = ("\n## File descriptors\n\nnot rendered: plugin 'fds' (strata-example 0.1.0) "
            "raised ZeroDivisionError: the plugin's own bug\n")
    assert text.count(line) == 1
    assert text.replace(line, "") == (run / "report.md").read_text()  # the rest as before


def test_a_plugin_section_named_as_a_built_in_one_is_refused(tmp_path, monkeypatch):
    pkg = install_here(tmp_path / "pkg", monkeypatch, extra_groups={
        "strata.report_sections": {"fds": "strata_example.broken_sections:BUILT_IN"}})
    (pkg / "strata_example" / "broken_sections.py").write_text(BROKEN_SECTIONS)
    try:
        with pytest.raises(PluginError, match="the section name 'summary' is a built-in "
                                              "section of Strata's report"):
            sections.all_sections()
    finally:
        forget()


def test_the_diagnostic_round_is_read_by_prepare(fabricated, monkeypatch, tmp_path):
    """Its traces are read in ``prepare`` (the writer's step); a failure to read them is
    the section's one line, and the rest of the report stands."""
    run, data = fabricated
    (diag,) = data.prepared[diagnostic.TITLE]
    assert (diag.case_id, diag.traced_case_id) == ("light", "cpu_bound")
    assert diag.sched is not None  # the trace was read, before rendering
    assert "\n## Diagnostic round\n" in (run / "report.md").read_text()
    assert "\n### light (traced repetition: cpu_bound)\n" in diagnostic.report_section(data)

    def unreadable(run_dir, analyses):
        assert run_dir == data.bundle.run_dir
        raise OSError("trace folder gone")

    monkeypatch.setattr(diagnostic, "diagnose", unreadable)
    again = sections.prepare(dataclasses.replace(data, prepared={}), tmp_path)
    assert again.prepared[diagnostic.TITLE] == "OSError: trace folder gone"
    text = sections.render(again)
    assert "\n## Diagnostic round\n\nnot rendered: OSError: trace folder gone\n" in text
    assert text.index("\n## Cases\n") < text.index("\n## Diagnostic round") \
        < text.index("\n## Run timeline")
