"""The run's outcome as one typed thing (formats/outcome.py): reasons appended, never
replaced; ``complete`` and the manifest's words derived; read back offline, where a run
killed before its end marker, or a raw file torn mid-line, is incomplete too.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from bundle_factory import cpu_run
from package_source import package_files, parsed

from strata_plugin.formats.outcome import FAILS_RUN, KINDS, Reason, RunOutcome

ROOT = Path(__file__).resolve().parents[1]


def test_reasons_are_appended_once_and_derive_complete_and_the_words() -> None:
    o = RunOutcome()
    assert o.complete and o.words == "" and not o.fails_run
    assert o.manifest_fields() == {"incomplete_reason": None, "incomplete_reasons": []}
    assert o.add("agent_lost", "agent on n1 lost during c (exit 9); restarted")
    assert not o.add("agent_lost", "agent on n1 lost during c (exit 9); restarted")  # once
    assert o.add("interrupted")
    assert o.add("report_failed", "OSError: [Errno 28] No space left on device")
    assert not o.complete and o.fails_run
    assert o.words == ("agent on n1 lost during c (exit 9); restarted; interrupted; report "
                       "failed: OSError: [Errno 28] No space left on device")
    assert [r["kind"] for r in o.manifest_fields()["incomplete_reasons"]] == [
        "agent_lost", "interrupted", "report_failed"]
    with pytest.raises(ValueError, match="unknown reason kind"):
        o.add("cosmic_ray")
    # fails_run: exactly the kinds no test can see
    for kind in KINDS:
        assert RunOutcome([Reason(kind, "x")]).fails_run is (kind in FAILS_RUN)


@pytest.mark.parametrize(("manifest", "words"), [
    ({"complete": True, "finished_utc": "t"}, ""),
    ({"complete": False, "finished_utc": "t", "incomplete_reason": "interrupted",
      "incomplete_reasons": [{"kind": "interrupted", "detail": ""}]}, "interrupted"),
    # an older Strata's words, without kinds
    ({"complete": False, "finished_utc": "t", "incomplete_reason": "server a: refused"},
     "server a: refused"),
    # killed: the first manifest, never rewritten at the end
    ({"complete": False}, "the run did not finish: no end marker"),
    ({}, "the run did not finish: manifest.json has no 'complete'"),
    # ended, but the report was never written and nothing said why
    ({"complete": False, "finished_utc": "t"},
     "the run did not finish: it ended while its report was being written"),
])
def test_the_outcome_read_back_from_a_manifest(manifest: dict, words: str) -> None:
    o = RunOutcome.from_manifest(manifest)
    assert o.words.startswith(words) and o.complete is (words == "")


def _fake_session(tmp_path: Path):
    """A session with a real run folder and recorder, nothing started."""
    from strata_plugin.formats.records import ClockAnchor
    from strata_plugin.run.run_folder import RunRecorder
    from strata_plugin.run.session import StrataSession

    sess = object.__new__(StrataSession)
    sess.run_dir = tmp_path
    sess.outcome = RunOutcome()
    sess.recorder = RunRecorder(tmp_path, ClockAnchor.now(), {"run_id": "r"})
    return sess


def test_a_failed_report_adds_to_the_earlier_reasons(tmp_path, monkeypatch) -> None:
    """It used to replace them: an agent lost, then the report failed, read only
    "report failed"."""
    import strata_plugin.report as report

    sess = _fake_session(tmp_path)
    sess.add_reason("agent_lost", "agent on n1 lost during c (exit 9); restarted")

    def full(run_dir, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "write_report", full)
    assert sess._write_report() is None
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["complete"] is False
    assert m["incomplete_reason"] == ("agent on n1 lost during c (exit 9); restarted; report "
                                      "failed: OSError: [Errno 28] No space left on device")
    assert [r["kind"] for r in m["incomplete_reasons"]] == ["agent_lost", "report_failed"]
    assert sess.incomplete_reason == m["incomplete_reason"] and sess.outcome.fails_run
    sess.recorder.close()


def test_a_written_report_makes_the_run_complete_only_without_a_reason(tmp_path,
                                                                      monkeypatch) -> None:
    import strata_plugin.report as report

    written = tmp_path / "report.md"
    monkeypatch.setattr(report, "write_report", lambda run_dir, **kw: written)
    sess = _fake_session(tmp_path)
    assert sess._write_report() == written
    assert json.loads((tmp_path / "manifest.json").read_text())["complete"] is True
    sess.add_reason("interrupted")
    sess._write_report()
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["complete"] is False and m["incomplete_reason"] == "interrupted"
    sess.recorder.close()
    assert not (tmp_path / ".strata-reserve").exists()


def test_no_module_writes_the_reason_as_a_string() -> None:
    """``incomplete_reason`` is derived from the outcome: nothing assigns or concatenates
    it (it was rewritten at eight sites)."""
    offenders = []
    for path in package_files():
        for node in ast.walk(parsed(path)):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                       else [])
            for t in targets:
                for n in ast.walk(t):
                    name = n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "")
                    if name == "incomplete_reason":
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders


# --- a torn raw line, offline ------------------------------------------------------------


def test_a_torn_line_is_named_first_and_fails_the_offline_report(tmp_path, capsys) -> None:
    """The run ended mid-write: the last requests.jsonl line is cut. The report is
    written from the whole lines, and says which line was torn in its first lines, in
    summary.json and its exit status; it used to say nothing and exit 0."""
    from strata_plugin.report.cli import report_main

    run = cpu_run(tmp_path)
    path = run / "requests.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines) + lines[-1][: len(lines[-1]) // 2])
    n = len(lines) + 1
    assert report_main([str(run), "-q", "--no-plots"]) == 1
    torn = f"requests.jsonl:{n}: torn line (the run ended mid-write)"
    assert capsys.readouterr().err == f"run incomplete: {torn}\n"
    head = (run / "report.md").read_text().splitlines()[:3]
    assert f"**Run incomplete:** {torn}" in head, head
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"]["incomplete_reasons"] == [
        {"kind": "torn_line", "detail": torn, "words": torn}]
    # a whole last line that lost only its newline is read, not torn
    path.write_bytes(b"".join(lines).rstrip(b"\n"))
    assert report_main([str(run), "-q", "--no-plots"]) == 0


def test_a_complete_run_reports_exit_0_and_says_complete(tmp_path) -> None:
    from strata_plugin.report.cli import report_main

    run = cpu_run(tmp_path)
    assert report_main([str(run), "-q", "--no-plots"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == {"complete": True, "incomplete_reason": None,
                                  "incomplete_reasons": []}
    assert "incomplete" not in (run / "report.md").read_text().splitlines()[1]


# --- lines that do not fit are cut back whole -------------------------------------------

_FILL = """
import json, resource, signal, sys
sys.path.insert(0, {root!r})
from pathlib import Path
from strata_plugin.run.run_folder import JsonlWriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
w = JsonlWriter(Path({path!r}))
n = 0
try:
    while True:
        w.write(json.dumps({{"n": n, "pad": "x" * 700}}))
        n += 1
except OSError as exc:
    print(n, exc.strerror)
"""


def test_a_line_that_does_not_fit_is_cut_back_to_the_last_whole_line(tmp_path) -> None:
    """A full disk lets part of a line in, then fails (here the file-size limit, EFBIG,
    as ENOSPC would): the file ends on its last whole line, never half a line."""
    path = tmp_path / "cases.jsonl"
    limit = 10_000  # lines of 720 bytes: the 14th line is the one that half fits
    out = subprocess.run([sys.executable, "-c", _FILL.format(root=str(ROOT), limit=limit,
                                                              path=str(path))],
                         capture_output=True, text=True, timeout=60, check=True)
    written, why = out.stdout.split(" ", 1)
    assert why.strip() == "File too large" and int(written) == 13
    data = path.read_bytes()
    assert data.endswith(b"\n") and len(data) == 10 * 720 + 3 * 721 < limit < len(data) + 721
    assert [json.loads(x)["n"] for x in data.splitlines()] == list(range(13))
