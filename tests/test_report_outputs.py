"""report/writer.py writes its outputs from one list (OUTPUTS), and that list is the
run folder's derived files (analysis/run_folder.py DERIVED): a file the writer adds is
one the offline tools treat as derived (dropped after a failed report, rebuilt by
``python -m strata_plugin report``), and ``ledger.jsonl``, which the writer wrote by
hand and DERIVED did not list, is one of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from bundle_factory import cpu_run

from strata_plugin.analysis.run_folder import DERIVED, DERIVED_DIRS
from strata_plugin.report import writer


def test_the_outputs_written_are_the_derived_files(tmp_path: Path) -> None:
    run = cpu_run(tmp_path)
    raw = {p.relative_to(run) for p in run.rglob("*") if p.is_file()}
    assert not {Path(n) for n in DERIVED} & raw
    report = writer.write_report(run)
    assert report == run / "report.md"
    written = {str(p.relative_to(run)) for p in run.rglob("*")
               if p.is_file() and p.relative_to(run) not in raw
               and p.relative_to(run).parts[0] not in DERIVED_DIRS}
    assert written == set(DERIVED)
    analysed_names = [o.name for o in writer.OUTPUTS]
    assert analysed_names[-1] == "report.md"  # last: once it is there, the rest is


def test_an_output_that_fails_leaves_report_md_unwritten(tmp_path: Path, monkeypatch) -> None:
    """The outputs are written in order, report.md last: one that raises stops the
    report before report.md (the session then drops what was written)."""
    run = cpu_run(tmp_path)

    def broken(_a: writer.Analysed) -> dict[str, str]:
        raise RuntimeError("broken output")

    outputs = list(writer.OUTPUTS)
    outputs[-2] = writer.Output("thresholds.md", broken)
    monkeypatch.setattr(writer, "OUTPUTS", tuple(outputs))
    with pytest.raises(RuntimeError, match="broken output"):
        writer.write_report(run)
    assert (run / "summary.json").exists() and not (run / "report.md").exists()
