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

Marked ``integration``: rebuilding the whole matrix's files takes about 35 s of CPU.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from strata_plugin.analysis.run_folder import DERIVED, DERIVED_DIRS
from strata_plugin.report import write_report

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
