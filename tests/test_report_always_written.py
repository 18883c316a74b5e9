"""The report is always written: a derived section or plot that fails costs that part
only, said in its place with the reason, never report.md, summary.json or the other
cases; ``python -m strata_plugin report DIR`` prints no traceback and keeps its exit
statuses (1 is "the run is incomplete", nothing else).

The run folders are fabricated (tests/bundle_factory.py), one short case each, then
given what a server or a model file can hand the run: a model fact of the wrong type in
the manifest, engine clocks far longer than the request. Where no real input is left
that breaks a part (the fixes made them draw), a part is made to raise, to show the
isolation holds whatever the next unforeseen input is.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from bundle_factory import CaseSpec, RunSpec, make_run

from strata_plugin.report import ledger_plots, plots, sections
from strata_plugin.report.cli import report_main
from strata_plugin.report.writer import write_report


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A one-case run folder (no derived file yet)."""
    return make_run(tmp_path_factory.mktemp("fresh"),
                    RunSpec(cases=[CaseSpec("one", n_requests=4, duration_s=2.0, osl=8)]))


@pytest.fixture
def run(fresh, tmp_path) -> Path:
    """A copy of it for one test to change."""
    return Path(shutil.copytree(fresh, tmp_path / fresh.name))


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _roofline_entry(**facts) -> dict:
    """A CPU run's recorded roofline entry: a llama-like model's facts as a config.json
    gives them, and a probe's peaks."""
    vals = {"architecture": "llama", "params_matmul_active": 1_000_000,
            "params_lm_head": 100_000, "stored_bytes": 1_100_000,
            "stored_bytes_embedding": 100_000, "stored_bytes_experts": 0, "layers": 4,
            "heads": 4, "head_dim": 16, "kv_bytes_per_token": 1000, "experts": 1,
            "experts_per_token": 1, "tied_embeddings": False, **facts}
    return {"model": {"path": "/models/m", "format": "hf", "located_by": "test", "facts": {
        k: {"value": v, "source": f"config.json {k}"} for k, v in vals.items()}},
        "cpu": {"cpus": [0, 1], "dram": [{"kernel": "triad", "bytes_s": 1e10,
                                          "array_bytes": 1 << 24, "reps": 3}],
                "matmul": {"flops_s": 1e11, "n": 512, "reps": 3}}}


def _with_roofline(run: Path, **facts) -> None:
    m = _manifest(run)
    m["roofline"] = {"default": _roofline_entry(**facts)}
    (run / "manifest.json").write_text(json.dumps(m))


def _roofline_case_line(report: str) -> str:
    sec = report[report.index("\n## Roofline\n"):]
    sec = sec[:sec.index("<details>")]
    (line,) = [x for x in sec.splitlines() if x.startswith(("| `one`", "- `one`"))]
    return line


def test_a_fact_of_the_wrong_type_costs_the_roofline_row_and_says_which(run, capsys):
    """A head count given as a string ("32", as some exported config.json files do),
    recorded in the manifest: report.md and summary.json are written, the case's roofline
    row names the fact, and ``report DIR`` exits 0 (a complete run) with no traceback.
    The same entry with the count as a number has its row (the boundary: the type)."""
    _with_roofline(run, heads=32)
    assert report_main(["-q", "--no-plots", str(run)]) == 0
    line = _roofline_case_line((run / "report.md").read_text())
    assert line.startswith("| `one` | ") and "%" in line  # achieved, limit, share
    _with_roofline(run, heads="32")
    assert report_main(["-q", "--no-plots", str(run)]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and out.err == ""
    line = _roofline_case_line((run / "report.md").read_text())
    assert line.startswith("- `one`: ") and "heads" in line and " str" in line
    (case,) = json.loads((run / "summary.json").read_text())["cases"]
    assert case["roofline"]["share"] is None and "heads" in case["roofline"]["unavailable"]
    assert case["verdict"]["classes"]  # the case's verdict stands
    assert not any(n.startswith("roofline") for n in case["verdict"]["notes"])


@pytest.mark.parametrize("facts, words", [
    ({"stored_bytes": float("nan")}, "stored_bytes"),
    ({"stored_bytes_embedding": -10_000_000}, "stored_bytes_embedding"),
])
def test_nan_or_negative_facts_say_unavailable_never_a_nan_or_negative_share(run, facts, words):
    _with_roofline(run, **facts)
    text = Path(write_report(run, plots=False)).read_text()
    line = _roofline_case_line(text)
    assert line.startswith("- `one`: ") and words in line
    assert "nan%" not in text and "-" not in line.split("`one`: ")[1].split(words)[0]
    assert " of its memory roof" not in text and " of its compute roof" not in text


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def _with_engine_prefill(run: Path, prefill_ms: float) -> None:
    lines = []
    for raw in (run / "requests.jsonl").read_text().splitlines():
        d = json.loads(raw)
        d["engine"] = {"source": "test engine", "prefill_ms": prefill_ms, "queue_ms": 1.0}
        lines.append(json.dumps(d))
    (run / "requests.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("prefill_ms", [5e6, 1e300], ids=["seconds-as-ms", "1e300"])
def test_engine_clocks_far_longer_than_the_request_draw_a_bounded_ledger_plot(run,
                                                                           prefill_ms):
    """The engine's prefill clock says 5,000 s (seconds sent where milliseconds are
    expected; the request took 0.1 s) or 1e300 ms: the ledger's parts pass 100% of TTFT.
    The bars are cut at the axis's end and say so; the picture keeps the size of any
    other case's (the figure is 7.5 x 1.75 inches at 110 dpi: about 840 x 210 pixels)."""
    _with_engine_prefill(run, prefill_ms)
    text = Path(write_report(run)).read_text()
    w, h = _png_size(run / "plots" / "ledger-one.png")
    assert 600 < w <= 1000 and 150 < h <= 300
    assert "\n![ledger](plots/ledger-one.png)\n" in text and "unavailable (" not in text
    assert json.loads((run / "summary.json").read_text())["cases"][0]["case_id"] == "one"


def _broken(d):
    raise ZeroDivisionError("a section's own bug")


def test_a_section_that_raises_is_one_line_in_its_place(run, monkeypatch):
    """In render or in prepare: its heading and the reason (the exception, where it was
    raised); every other section as it was, and summary.json written."""
    whole = Path(write_report(run, plots=False)).read_text()
    at = [s.name for s in sections.SECTIONS].index("run timeline")
    for broken in (sections.Section("broken", _broken),
                   sections.Section("broken", lambda d: "never shown",
                                    lambda d, plot_dir: _broken(d))):
        monkeypatch.setattr(sections, "SECTIONS", (*sections.SECTIONS[:at], broken,
                                                   *sections.SECTIONS[at:]))
        (run / "summary.json").unlink()
        text = Path(write_report(run, plots=False)).read_text()
        monkeypatch.undo()
        line = ("\n## broken\n\nbroken: unavailable (ZeroDivisionError in "
                "test_report_always_written.py _broken (from strata_plugin/report/sections.py "
                f"{'_rendered' if broken.prepare is None else '_prepared'}): a section's own "
                "bug)\n")
        assert text.count(line) == 1
        assert text.replace(line, "") == whole
        assert (run / "summary.json").exists()


def _image_too_large(*a, **k):
    raise ValueError("Image size of 40094824x206 pixels is too large. It must be less "
                     "than 2^23 in each direction.")


def test_a_plot_that_fails_costs_its_picture_only(run, monkeypatch):
    """The case timeline and the ledger's bars each fail as matplotlib refuses a picture:
    each says so where it would be; the ledger's table and its stall timeline, the
    other sections and the other files stand."""
    whole = Path(write_report(run)).read_text()
    monkeypatch.setattr(plots, "render", _image_too_large)
    monkeypatch.setattr(ledger_plots, "bars", _image_too_large)
    text = Path(write_report(run)).read_text()
    monkeypatch.undo()
    why = ("ValueError in test_report_always_written.py _image_too_large (from "
           "strata_plugin/report/{}): Image size of 40094824x206 pixels is too large. "
           "It must be less than 2^23 in each direction.")
    case_line = f"Timeline plot: unavailable ({why.format('writer.py _case_plot')}).\n"
    bars_line = (f"\nNot drawn: the ledger's bars: unavailable "
                 f"({why.format('ledger_md.py prepare')}).\n")
    assert text.count(case_line) == 1 and text.count(bars_line) == 1
    assert "![ledger](plots/ledger-one.png)" not in text
    assert "![stalls by server state](plots/ledger-one-timeline.png)" in text
    assert "![one timeline](plots/case-one.png)" in whole
    assert "![one timeline]" not in text
    assert text.index("\n## Time ledger\n") < text.index(bars_line)
    for f in ("summary.json", "case_summary.csv", "benchmark.json", "ledger.jsonl"):
        assert (run / f).exists()


def test_report_exits_3_with_one_line_when_strata_itself_fails(run, monkeypatch, capsys):
    """A failure outside every isolated part: no traceback, one line naming it, exit 3
    (not 1, which says the run is incomplete); the earlier report.md is left whole."""
    assert report_main(["-q", "--no-plots", str(run)]) == 0
    before = (run / "report.md").read_text()
    capsys.readouterr()
    from strata_plugin.report import writer

    def analysis_bug(run_dir):
        raise RuntimeError("a bug in the analysis")

    monkeypatch.setattr(writer, "analyze_run", analysis_bug)
    assert report_main(["--no-plots", str(run)]) == 3
    out = capsys.readouterr()
    assert out.out == "" and "Traceback" not in out.err
    assert out.err == (f"error: no report written for {run}: RuntimeError in "
                       "test_report_always_written.py analysis_bug (from "
                       "strata_plugin/report/writer.py _analysed): a bug in the analysis\n")
    assert (run / "report.md").read_text() == before


def test_an_output_that_fails_costs_its_files_and_makes_the_run_incomplete(run, monkeypatch,
                                                                           capsys):
    """benchmark.json cannot be made: every other file is written; the run's outcome,
    report.md's first lines and summary.json name it, and ``report DIR`` exits 1 (the
    report is written, the run is incomplete), with the reason on stderr."""
    from strata_plugin.report import writer

    def bench_bug(*a, **k):
        raise RuntimeError("a bug in benchmark.json")

    monkeypatch.setattr(writer, "benchmark_json", bench_bug)
    assert report_main(["-q", "--no-plots", str(run)]) == 1
    words = ("report failed: benchmark.json not written (RuntimeError in "
             "test_report_always_written.py bench_bug (from strata_plugin/report/writer.py "
             "_benchmark): a bug in benchmark.json)")
    assert capsys.readouterr().err == f"run incomplete: {words}\n"
    assert not (run / "benchmark.json").exists()
    assert f"\n**Run incomplete:** {words}\n" in (run / "report.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert words in json.dumps(summary["outcome"])
    for f in ("case_summary.csv", "ledger.jsonl", "bencher.json", "thresholds.md"):
        assert (run / f).exists()
