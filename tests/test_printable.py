"""Text from outside is shown, never obeyed: a server's error body, a model file's
architecture name, an engine's log, a plugin's section reach the terminal and report.md
with their control and bidirectional characters escaped (formats/printable.py), and one
line stays one line (a table row stays one row)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from strata_plugin.analysis.case_summary import RunContext
from strata_plugin.analysis.device_limits import DeviceLimits, Peak
from strata_plugin.analysis.failures import failed_verdict, failures_of
from strata_plugin.analysis.roofline import RooflineInputs
from strata_plugin.configure.model_facts import FACT_NAMES, Fact, ModelFacts
from strata_plugin.formats.printable import printable
from strata_plugin.formats.records import RequestError, RequestRecord
from strata_plugin.plugin.progress import ProgressLine
from strata_plugin.plugin.summary import skipped_lines
from strata_plugin.report import roofline_md, sections
from strata_plugin.report.sections import Section
from strata_plugin.report.tables import md_table
from strata_plugin.report.terminal import results_table
from strata_plugin.run.server import log_tail

#: What a hostile server sends: set the window title, clear the screen, move the cursor
#: home (7-bit and the 8-bit CSI), reverse the text's direction, and fake a line of
#: Strata's own output after a CR LF.
HOSTILE = ("boom\x1b]0;pwned\x07\x1b[2J\x1b[H\x9b31m\u202eevil\u202c\u2066x\u2069"
           "\r\nPASSED fake line\x7f\x00")
#: Every character that must never reach the terminal or report.md raw.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f"
                 "\u061c\u2028\u2029]")


def _shown(text: str) -> None:
    """No raw control or bidi character, no CR, and the fake line never starts a line."""
    assert not RAW.search(text), repr(text)
    assert not any(line.startswith("PASSED fake line") for line in text.split("\n")), text


@pytest.mark.parametrize(("raw", "shown"), [
    ("\x1b[2J", "\\x1b[2J"),
    ("a\r\nb", "a\\r\\nb"),
    ("tab\there", "tab\\there"),
    ("\x00\x07\x7f", "\\x00\\x07\\x7f"),
    ("\x9b31m\x85", "\\x9b31m\\x85"),  # C1: the 8-bit CSI, NEL
    ("\u202eabc\u202c", "\\u202eabc\\u202c"),
    ("\u2066\u2067\u2068\u2069\u200e\u200f\u061c", "\\u2066\\u2067\\u2068\\u2069\\u200e"
     "\\u200f\\u061c"),
    ("\u2028\u2029", "\\u2028\\u2029"),
])
def test_each_control_and_bidi_character_is_shown_as_its_escape(raw, shown):
    assert printable(raw) == shown


def test_everything_else_is_kept_as_it_is():
    text = "llama · Qwen2 – 模型 ünïcode 🙂 ~ \\x1b already escaped | pipes \x20\x7e"
    assert printable(text) == text
    assert printable(printable(HOSTILE)) == printable(HOSTILE)  # escaping twice: no change
    assert printable(12.5) == "12.5" and printable(None) == "None"


def test_a_block_of_lines_keeps_its_line_feeds_only():
    assert printable("one\ntwo\r\n\x1b[2J\tthree\x0b", keep_lines=True) == (
        "one\ntwo\\r\n\\x1b[2J\tthree\\x0b")


def test_the_failed_cases_line_is_one_line_whatever_the_server_sent():
    err = RequestError("http_status", f"HTTP 500: {HOSTILE}", 500)
    recs = [RequestRecord(request_id=f"r{i}", case_id="c", phase="measured",
                          api="completions", scheduled_ns=i, dispatched_ns=i, error=err)
            for i in range(2)]
    f = failures_of(recs)
    assert f is not None
    line = f.line()
    _shown(line)
    assert "\n" not in line
    assert "boom\\x1b]0;pwned\\x07\\x1b[2J" in line and "\\u202eevil" in line
    _shown(failed_verdict(f).notes[0])


def test_a_table_cell_from_outside_stays_in_its_cell():
    table = md_table(("fact", "value"), [("architecture", f"llama|{HOSTILE}|x"), ("n", 1)])
    _shown(table)
    rows = table.splitlines()
    assert len(rows) == 4  # header, rule, two rows: the CR LF made no row of its own
    # two cells a row: three pipes that are not escaped
    assert all(len(re.findall(r"(?<!\\)\|", r)) == 3 for r in rows), rows


def test_the_roofline_facts_show_a_hostile_architecture_name_escaped():
    vals = {"architecture": f"llama{HOSTILE}", "parameters": 1000}
    m = ModelFacts(f"/models/m{HOSTILE}.gguf", "gguf", tuple(
        (n, Fact(vals[n], "GGUF general.architecture") if n in vals
         else Fact(None, unavailable=f"not in the file: {HOSTILE}")) for n in FACT_NAMES))
    lim = DeviceLimits("cpu", f"CPU {HOSTILE}",
                       Peak("memory bandwidth (DRAM)", 1e9, "B/s", "measured", "t"),
                       Peak("FLOPs", 1e9, "FLOP/s", "measured", "t"), n_cpus=2,
                       notes=(f"note {HOSTILE}",))
    ctx = RunContext(False, False, False, (), roofline={
        "a": RooflineInputs(m, lim), "b": RooflineInputs(m, None, f"no probe: {HOSTILE}")})
    text = roofline_md.facts_table(ctx)
    _shown(text)
    assert "llamaboom\\x1b]0;pwned" in text and "CPU boom\\x1b" in text


def test_report_md_keeps_its_lines_and_shows_every_other_control():
    # The last guard: a section (a plugin's, or a place that missed its escape) writing
    # raw controls; its own line feeds are the report's lines.
    raw = Section("raw", lambda d: f"\n## Raw\n\nfirst {HOSTILE}\nsecond\n")
    text = sections.render(SimpleNamespace(prepared={}), [raw])  # type: ignore[arg-type]
    assert not RAW.search(text), repr(text)
    assert text.split("\n")[3:6] == [
        "first boom\\x1b]0;pwned\\x07\\x1b[2J\\x1b[H\\x9b31m\\u202eevil\\u202c\\u2066x\\u2069"
        "\\r", "PASSED fake line\\x7f\\x00", "second"]


def test_the_terminal_table_shows_a_hostile_verdict_and_case_id_escaped():
    summary = {"cases": [{"case_id": f"cases/t.py::test_a[{HOSTILE}]",
                          "verdict": {"summary": f"requests_failed {HOSTILE}"},
                          "metrics": {"n_ok": 0, "n_requests": 4}}],
               "ab": [{"group": f"g{HOSTILE}", "effects": [{
                   "treatment_arm": f"t{HOSTILE}", "control_arm": "c", "effects": [
                       {"metric": "output_tok_s", "change_pct": 1.0, "ci_lo_pct": None,
                        "ci_hi_pct": None, "n_control": 3, "n_treatment": 3,
                        "unit": "run"}]}]}]}
    text = results_table(summary, "/r/report.md")
    _shown(text)
    lines = text.splitlines()
    assert lines[2].startswith("test_a[boom\\x1b]") and "requests_failed boom\\x1..." in lines[2]


class _Reporter:
    def __init__(self) -> None:
        self.out: list[str] = []

    def write_line(self, text: str) -> None:
        self.out.append(text + "\n")

    def flush(self) -> None:
        pass


def test_the_progress_line_and_the_skipped_lines_show_outside_text_escaped():
    tr = _Reporter()
    ProgressLine(tr, None, "lines", f"test_a[{HOSTILE}]")("1/4 requests", final=True)
    _shown("".join(tr.out))
    assert len(tr.out) == 1 and tr.out[0].count("\n") == 1
    (line,) = skipped_lines([(f"c::t[{HOSTILE}]", f"server said {HOSTILE}")])
    _shown(line)
    assert "\n" not in line


def test_an_engine_log_tail_keeps_its_lines_and_shows_its_escapes(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"loading\n" + HOSTILE.encode() + b"\nready\n")
    tail = log_tail(log)
    # the log's own lines (its CR LF is a line end there), each with its escapes shown
    assert not RAW.search(tail), repr(tail)
    assert tail.split("\n") == [
        "loading", "boom\\x1b]0;pwned\\x07\\x1b[2J\\x1b[H\\x9b31m\\u202eevil\\u202c"
        "\\u2066x\\u2069", "PASSED fake line\\x7f\\x00", "ready"]
