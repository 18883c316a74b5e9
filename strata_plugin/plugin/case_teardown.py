"""What happens when a case's test ends: the gates, then analysis and JUnit properties.

The gates (server alive, requests failed, baseline) are judged when the test's call
ends (``judge_call``, from ``plugin/hooks.py``), so a failing case is one failure. The
analysis runs in the ``strata`` fixture's teardown (``finish_case``), so the properties
land in the teardown report, which is the one JUnit XML reads them from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from strata_plugin.load.case_runner import CaseRunner
    from strata_plugin.run.server import Server
    from strata_plugin.run.session import StrataSession


def _outcome(item: pytest.Item) -> str:
    from strata_plugin.plugin.state import phase_reports_key

    reports = item.stash.get(phase_reports_key, {})
    for when in ("setup", "call"):
        rep = reports.get(when)
        if rep is not None and getattr(rep, NOT_ESTABLISHED_ATTR, False):
            return "not established"
        if rep is not None and not rep.passed:
            return rep.outcome
    return "passed" if "call" in reports else "not run"


def case_properties(
    sess: StrataSession, runner: CaseRunner
) -> tuple[list[tuple[str, object]], dict[str, Any]]:
    """Headline metrics plus the verdict of every case the test ran, as plain scalars,
    and each case's verdict as recorded for the report (``cases.jsonl`` ``verdict``)."""
    import dataclasses

    from strata_plugin.report import summarize_case

    props: list[tuple[str, object]] = []
    verdicts: dict[str, dict] = {}
    many = len(runner.results) > 1
    for result in runner.results:
        prefix = f"{result.case_id}." if many else ""
        try:
            analysis = summarize_case(sess.run_dir, result.case_id)
            values = dict(analysis.user_properties())
            verdicts[result.case_id] = dataclasses.asdict(analysis.verdict)
        except Exception as exc:  # the metrics stand without the hardware analysis
            values = dict(result.headline, analysis_error=f"{type(exc).__name__}: {exc}")
        values["case_id"] = result.case_id
        props += [(prefix + k, v) for k, v in sorted(values.items())]
    return props, verdicts


def regressions(sess: StrataSession, runner: CaseRunner) -> list[str]:
    """Metrics worse than the baseline run by more than the margin, with statistical support."""
    if sess.cfg.baseline_dir is None or not runner.results:
        return []
    from strata_plugin.report import regression_check

    by_case = {r.case_id: r.records for r in runner.results}
    out = []
    for metric in sess.cfg.regression_metrics:
        found = regression_check(by_case, sess.cfg.baseline_dir, metric=metric,
                                 max_worse_pct=sess.cfg.max_regression_pct)
        out += [r.message() for r in found]
    return out


def unexpected_errors(runner: CaseRunner) -> list[str]:
    """One line per case whose requests failed in ways the case did not allow."""
    out = []
    for r in runner.results:
        by_class = r.unexpected_errors()
        if by_class:
            total = len(r.warmup_records) + len(r.records) + len(r.injected)
            counts = ", ".join(f"{cls}: {n}" for cls, n in by_class.items())
            out.append(f"case {r.case_id}: {sum(by_class.values())} of {total} requests "
                       f"failed ({counts})")
    return out


def case_problems(sess: StrataSession, server: Server, runner: CaseRunner) -> list[str]:
    """What fails a case once its body has run: the server or a worker died during it,
    requests failed in ways it does not allow, a metric regressed against the baseline.

    Judged at the end of the test's call (``plugin/hooks.py``), so the test fails once,
    as a failure, with these reasons; never a second time as a teardown error."""
    from strata_plugin.run.server import log_tail

    out = []
    if not server.alive():
        out.append(f"server {server.config_id} died during the case (exit "
                   f"{server.exit_code()})\n--- log tail ---\n{log_tail(server.log_path)}")
    out += [f"worker {w.node} of server {server.config_id} died during the case (exit "
            f"{w.exit_code()})\n--- log tail ---\n{log_tail(w.log_path)}"
            for w in sess.deployment.dead_workers(server)]
    failed = unexpected_errors(runner)
    if failed:
        out.append("server errors the case does not allow (strata.run(..., allow_errors=...) "
                   "allows them):\n" + "\n".join(failed))
    worse = regressions(sess, runner)
    if worse:
        out.append("regression against the baseline run:\n" + "\n".join(worse))
    contradicted = [e.line() for e in runner.expectations if e.outcome == "contradicted"]
    if contradicted:
        out.append("A/B expectation contradicted by the data (its whole interval on the "
                   "other side of zero):\n" + "\n".join(contradicted))
    return out


def judge_call(item: pytest.Item, sess: StrataSession, server: Server, runner: CaseRunner,
               failure: BaseException | None) -> None:
    """The test's call ends: fail it with :func:`case_problems`, once.

    A test whose own body already failed keeps its traceback; the reasons go beside it as
    a ``strata`` section of its report (often they are why its own check failed)."""
    problems = case_problems(sess, server, runner)
    for e in runner.expectations:
        item.user_properties.append((f"strata_expectation.{e.group}.{e.metric}", e.outcome))
        item.user_properties.append((f"strata_expectation.{e.group}.{e.metric}.detail",
                                     e.line()))
    if failure is not None:
        if problems:
            item.stash[call_problems_key] = "\n".join(problems)
        raise failure
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    undecided = [e.line() for e in runner.expectations if e.outcome == "not established"]
    if undecided:
        item.stash[not_established_key] = "\n".join(undecided)


#: The reasons :func:`judge_call` found for a test whose body failed as well.
call_problems_key = pytest.StashKey[str]()
#: A test that passed but for an A/B expectation its data could not decide: its call
#: report becomes the outcome "not established" (:func:`mark_not_established`).
not_established_key = pytest.StashKey[str]()
#: Set on such a report (``pytest_report_teststatus`` names its category).
NOT_ESTABLISHED_ATTR = "strata_not_established"


def mark_not_established(item: pytest.Item, report: pytest.TestReport) -> None:
    """A passed call whose A/B expectation was not established: its own outcome. In the
    terminal a category of its own ("N", "1 not established"); in JUnit XML a
    ``<skipped>`` whose message starts "not established:" (JUnit has no other outcome
    that neither passes nor fails); in ``cases.jsonl`` ``outcome: "not established"``."""
    lines = item.stash.get(not_established_key, "")
    if report.when != "call" or not report.passed or not lines:
        return
    path, lineno, _ = item.location
    report.outcome = "skipped"
    report.longrepr = (str(path), (lineno or 0) + 1, f"not established: {lines}")
    setattr(report, NOT_ESTABLISHED_ATTR, True)


def finish_case(item: pytest.Item, sess: StrataSession, server: Server,
                runner: CaseRunner) -> None:
    """The case's analysis (after its telemetry is flushed), the verdict in cases.jsonl,
    the JUnit properties. The pass/fail judgement was made at the end of the call."""
    outcome = _outcome(item)
    # The verdict is computed once, here, after the agents have written the samples that
    # cover the case's end; cases.jsonl keeps it, and every derived file reports it.
    flushed = sess.fleet.flush(server.block_key) if runner.results else True
    # Before the analysis: a verdict of a case that lost an agent says so.
    lost = sess.recover_agents(server, tuple(r.case_id for r in runner.results))
    if lost:
        tr = item.config.pluginmanager.get_plugin("terminalreporter")
        for said in lost:
            if tr is not None:
                tr.write_line(f"  [strata] {said}")
            item.user_properties.append(("strata_agent_lost", said))
    props, verdicts = case_properties(sess, runner)
    for cid, line in runner.case_lines.items():
        extra = {"verdict": verdicts[cid]} if cid in verdicts else {}
        expected = [e.to_json() for e in runner.expectations if e.group == line.ab_group]
        if expected:
            extra["ab_expectations"] = expected
        if not flushed:
            extra["telemetry_flushed"] = False
        try:
            sess.recorder.add_case(line.updated(outcome=outcome, nodeid=item.nodeid, **extra))
        except OSError as exc:  # a full disk: the run fails with this reason, not a traceback
            sess.run_folder_failed("cases.jsonl", exc)
    item.user_properties.extend(props)
    item.user_properties.append(("strata_run_dir", str(sess.run_dir)))
    item.user_properties.append(("strata_report", str(sess.run_dir / "report.md")))
    item.user_properties.append(("strata_config", server.config_id))
