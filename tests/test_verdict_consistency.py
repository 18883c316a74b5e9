"""One verdict, one name, everywhere: on a real run of the repository's smoke cases.

The cases run against the embedded llama-server (the packaged ``local`` profile), and
for every case the verdict JUnit reported equals the verdict of ``case_summary.csv``,
``summary.json`` and ``report.md`` for the same case id, and the case id is the pytest
node id where the test ran one case. Two of the smoke matrix's tests (parametrized
ids, one prefill and one decode) keep it to a few minutes on two idle cores (15 on a
machine shared with five other test runs); the mixed A/B (six cases in one test) takes
the same path through teardown, with the case id as the properties' prefix.
"""

from __future__ import annotations

import csv
import html
import json
import xml.etree.ElementTree as ET

import pytest

from tests.test_robustness_support import PytestRun, llama_paths

pytestmark = [pytest.mark.integration]  # the real smoke matrix on llama-server


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    llama_paths()  # fails with the setup command when llama-server is not built
    tmp = tmp_path_factory.mktemp("smoke")
    xml = tmp / "junit.xml"
    run = PytestRun.start(
        ["cases/test_matrix.py", "-m", "smoke", "-k", "prefill_128k or decode_1k_1k", "-rA",
         f"--junitxml={xml}",
         f"--strata-reports-dir={tmp / 'reports'}", "--strata-run-id=smoke"],
        tmp / "out.txt", tmp / "reports" / "smoke")
    rc = run.wait(1500)
    assert rc in (0, 1), run.text()[-3000:]  # a failed case still reports its verdict
    return xml, run.run_dir, run.text()


def _junit_verdicts(xml) -> dict[str, str]:
    out = {}
    for tc in ET.parse(xml).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        ids = {k[: -len("case_id")]: v for k, v in props.items() if k.endswith("case_id")}
        for prefix, cid in ids.items():
            out[cid] = props[f"{prefix}verdict"]
    return out


def test_junit_verdict_is_the_report_verdict_for_every_case(smoke_run):
    xml, run_dir, text = smoke_run
    junit = _junit_verdicts(xml)
    assert len(junit) == 2, text[-3000:]
    # single-case tests: the case id is the node id pytest printed
    for cid in junit:
        assert cid.startswith("cases/test_matrix.py::test_"), cid
        assert f"PASSED {cid}" in text or f"FAILED {cid}" in text  # pytest's own -rA line
    with (run_dir / "case_summary.csv").open() as fh:
        csv_v = {r["case_id"]: r["verdict"] or "none" for r in csv.DictReader(fh)}
    summary = json.loads((run_dir / "summary.json").read_text())
    json_v = {c["case_id"]: c["verdict"]["summary"] or "none" for c in summary["cases"]}
    report = (run_dir / "report.md").read_text()
    recorded = {}
    for line in (run_dir / "cases.jsonl").read_text().splitlines():
        c = json.loads(line)
        if "verdict" in c:
            recorded[c["case_id"]] = c
    assert csv_v == junit and json_v == junit
    for cid, verdict in junit.items():
        assert recorded[cid]["nodeid"] == cid
        assert f"| [`{cid}`](#" in report and f"| {verdict} |" in report  # the summary line
        # the case's own section: collapsed under "<case id>: <verdict>"
        section = report.split(f"<details><summary>{html.escape(cid)}: ", 1)[1]
        section = section.split("</details>", 1)[0]
        assert section.startswith(f"{html.escape(verdict)}</summary>"), (cid, section[:200])
        head = verdict.replace("inconclusive: ", "").split(" (+")[0]
        assert f"**{'inconclusive: ' if 'inconclusive' in verdict else ''}{head}**" in section \
            or verdict == "none", (cid, verdict)
