"""report/writer.py writes its outputs from one list (OUTPUTS), and that list is the
run folder's derived files (analysis/run_folder.py DERIVED): a file the writer adds is
one the offline tools treat as derived (dropped after a failed report, rebuilt by
``python -m strata_plugin report``), and ``ledger.jsonl``, which the writer wrote by
hand and DERIVED did not list, is one of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bundle_factory import cpu_run

from strata_plugin.analysis.run_folder import DERIVED, DERIVED_DIRS
from strata_plugin.report import writer


def test_the_outputs_written_are_the_derived_files(tmp_path: Path) -> None:
    run = cpu_run(tmp_path)
    raw = {p.relative_to(run) for p in run.rglob("*") if p.is_file()}
    assert not {Path(n) for n in DERIVED} & raw
    report = writer.write_report(run, plots=False)
    assert report == run / "report.md"
    written = {str(p.relative_to(run)) for p in run.rglob("*")
               if p.is_file() and p.relative_to(run) not in raw
               and p.relative_to(run).parts[0] not in DERIVED_DIRS}
    assert written == set(DERIVED)
    analysed_names = [o.name for o in writer.OUTPUTS]
    assert analysed_names[-1] == "report.md"  # last: once it is there, the rest is


def test_an_output_that_fails_costs_its_files_only(tmp_path: Path, monkeypatch) -> None:
    """The outputs are written in order, report.md last: one that raises costs its own
    files; the rest are written, and the run's outcome, summary.json and report.md's
    first lines say which failed and why."""
    run = cpu_run(tmp_path)

    def broken(_a: writer.Analysed) -> dict[str, str]:
        raise RuntimeError("broken output")

    outputs = list(writer.OUTPUTS)
    outputs[-2] = writer.Output("thresholds.md", broken)
    monkeypatch.setattr(writer, "OUTPUTS", tuple(outputs))
    writer.write_report(run, plots=False)
    assert (run / "summary.json").exists() and not (run / "thresholds.md").exists()
    assert "\n**Run incomplete:** report failed: thresholds.md not written (RuntimeError in " \
        "test_report_outputs.py broken" in (run / "report.md").read_text()
    outcome = json.loads((run / "summary.json").read_text())["outcome"]
    assert "thresholds.md not written" in json.dumps(outcome)


def test_a_report_without_plots_draws_none_and_says_so_in_each_place(
        cpu_report: Path, tmp_path: Path) -> None:
    """``report --no-plots`` over a copy of a report with plots: no PNG, the earlier
    report's plots gone with the links to them, and each place a plot stood (a case's
    timeline, the run's, an A/B group's, a ledger's) says it was not drawn; the numbers
    are the same as with plots."""
    from strata_plugin.report.cli import report_main

    run = Path(shutil.copytree(cpu_report, tmp_path / "run"))
    drawn = sorted(p.name for p in (run / "plots").glob("*.png"))
    with_plots = (run / "report.md").read_text()
    summary = (run / "summary.json").read_bytes()
    assert report_main([str(run), "-q", "--no-plots"]) == 0
    assert not list((run / "plots").glob("*.png"))
    text = (run / "report.md").read_text()
    assert "](plots/" not in text and with_plots.count("](plots/") == len(drawn) > 0
    cases = json.loads(summary)["cases"]
    assert text.count("Timeline plot: not drawn (the report was written with --no-plots)") \
        == sum(1 for c in cases if c.get("window")) == 4
    assert "Run timeline plot: not drawn" in text and "A/B plot: not drawn" in text
    assert "Not drawn: the report was written with --no-plots." in text
    assert (run / "summary.json").read_bytes() == summary
