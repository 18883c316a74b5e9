"""``python -m strata_plugin report DIR`` and ``... compare RUN_A RUN_B``.

Both work offline on run folders alone: no server, no GPU, no network.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from strata_plugin.report.fmt import md_num, signed_pct_of_fraction


def report_main(argv: list[str]) -> int:
    """Exit 0: the report of a complete run; 1: the report is written, the run is
    incomplete (the reason is its first line, and on stderr); 2: no report, a raw file
    does not hold its format (named by file, line and key) or no run folder; 3: no report,
    Strata itself failed on this run (one line naming the exception and where, no
    traceback; a part of the report that fails costs only that part, so this is a bug
    outside them). Without a report, the previous report.md is left as it was."""
    p = argparse.ArgumentParser(
        prog="python -m strata_plugin report",
        description="Regenerate every derived file of a run folder from its raw files. "
        "Exit status: 0 complete, 1 the run is incomplete (the report says why), 2 a raw "
        "file is damaged (the error names its line), 3 Strata failed (a bug: the error "
        "names where).",
    )
    p.add_argument("run_dir", type=Path, help="reports/<RUN_ID>")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    p.add_argument("--no-plots", action="store_true",
                   help="every derived file but the PNGs (most of a report's time), each "
                   "place a plot would be saying so")
    args = p.parse_args(argv)
    if not (args.run_dir / "manifest.json").exists():
        print(f"error: {args.run_dir} is not a run folder (no manifest.json)", file=sys.stderr)
        return 2
    from strata_plugin.entry_points import PluginError
    from strata_plugin.extend import check_plugins
    from strata_plugin.formats.manifest import read_manifest
    from strata_plugin.formats.outcome import RunOutcome
    from strata_plugin.formats.typed import FormatError
    from strata_plugin.report.writer import write_report

    try:  # the run's outcome as recorded; the report adds a torn raw line to it
        check_plugins()  # a broken plugin: said before any derived file is rewritten
        outcome = RunOutcome.from_manifest(read_manifest(args.run_dir / "manifest.json"))
        path = write_report(args.run_dir, outcome=outcome, plots=not args.no_plots)
    except (FormatError, PluginError) as exc:  # a hand-edited or damaged file: which
        # file, line, key; or an installed plugin that cannot load: which one, and why
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # not "incomplete" (1), which the report would say itself
        from strata_plugin.errors import failure_words
        from strata_plugin.formats.printable import printable

        print(f"error: no report written for {args.run_dir}: "
              f"{printable(failure_words(exc))}", file=sys.stderr)
        return 3
    if not args.quiet:
        print(path)
    if not outcome.complete:  # the report is written, and says so in its first lines
        print(f"run incomplete: {outcome.words}", file=sys.stderr)
        return 1
    return 0


def compare_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m strata_plugin compare",
        description="Per-case deltas of request metrics between two runs (A = baseline), "
        "with bootstrap intervals and a one-sided Mann-Whitney test.",
    )
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    p.add_argument(
        "--metric",
        action="append",
        default=None,
        help="request metric (repeatable); default ttft_ms, tpot_ms, e2e_ms",
    )
    p.add_argument(
        "--threshold-pct",
        type=float,
        default=5.0,
        help="a change smaller than this is 'same' (default 5)",
    )
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    args = p.parse_args(argv)
    for d in (args.run_a, args.run_b):
        if not (d / "requests.jsonl").exists():
            print(f"error: {d} has no requests.jsonl", file=sys.stderr)
            return 2
    from strata_plugin.analysis.run_compare import DEFAULT_METRICS, compare_runs

    try:
        rows = compare_runs(
            args.run_a,
            args.run_b,
            tuple(args.metric or DEFAULT_METRICS),
            args.threshold_pct,
            args.alpha,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        from dataclasses import asdict

        from strata_plugin.report.fmt import json_clean

        for r in rows:
            print(json.dumps(json_clean(asdict(r)), sort_keys=True))
        return 0
    from strata_plugin.analysis.effects import LEVEL

    level = f"{LEVEL * 100:g}% interval (requests resampled)"
    header = (
        "case",
        "metric",
        "n A/B",
        "median A",
        "median B",
        "change",
        level,
        "p",
        "call",
    )
    table = [header]
    for r in rows:
        table.append(
            (
                r.case_id,
                f"{r.metric}",
                f"{r.n_a}/{r.n_b}",
                md_num(r.median_a),
                md_num(r.median_b),
                signed_pct_of_fraction(r.delta_rel),
                "-" if r.lo is None
                else f"{signed_pct_of_fraction(r.lo)}..{signed_pct_of_fraction(r.hi)}",
                md_num(r.p_value),
                r.call,
            )
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    print(f"A = {args.run_a}\nB = {args.run_b}")
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def timeline_main(argv: list[str]) -> int:
    """``python -m strata_plugin timeline RUN [--case ID] [--request N] [-o FILE]``: one
    case's or one request's timeline (or the whole run's) as a trace-event file.
    Exit 0: written (its path printed); 2: no run folder, no such case or request, or a
    raw file that does not hold its format. The case and request are checked against
    the run's markers and cases before anything is analysed, so a wrong name is said at
    once."""
    p = argparse.ArgumentParser(
        prog="python -m strata_plugin timeline",
        description="Write a run's timeline (requests, the time ledger, the server's run "
        "state, every sampled series, markers, verdicts) in the trace event format that "
        "Perfetto UI (ui.perfetto.dev) and chrome://tracing open: the whole run, one "
        "case's (--case) or one request's (--request). docs/timeline.md says how to read it.",
    )
    p.add_argument("run_dir", type=Path, help="reports/<RUN_ID>")
    p.add_argument("--case", default=None,
                   help="a case id, or a part of one that names a single case")
    p.add_argument("--request", default=None,
                   help="a request id, or with --case its number (<case>/measured/N)")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="the file to write (default: RUN_DIR/timeline/<case or request>.json)")
    args = p.parse_args(argv)
    run = args.run_dir
    if not (run / "manifest.json").is_file():
        print(f"error: {run} is not a run folder (no manifest.json)", file=sys.stderr)
        return 2
    from strata_plugin.formats.typed import FormatError
    from strata_plugin.report import trace_events as te

    try:
        case_id = _pick_case(run, args.case) if args.case is not None else None
        path = _write_timeline(run, case_id, args.request, args.output)
    except (te.TimelineError, FormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the output cannot be written: where, and why
        where = args.output or run / te.FOLDER
        print(f"error: cannot write the timeline to {where}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    print(path)
    return 0


def _pick_case(run: Path, wanted: str) -> str:
    """The case ``wanted`` names: its id, else the one case whose id contains it. Read
    from markers.csv and cases.jsonl only (no request, no sample): fast."""
    from strata_plugin.analysis.run_folder import read_cases
    from strata_plugin.analysis.timeline import load_markers
    from strata_plugin.report.trace_events import TimelineError

    ids = {m.case_id for m in load_markers(run) if m.case_id}
    if (run / "cases.jsonl").exists():
        ids |= set(read_cases(run / "cases.jsonl"))
    if wanted in ids:
        return wanted
    hits = sorted(c for c in ids if wanted in c)
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise TimelineError(f"--case {wanted!r} names {len(hits)} cases of {run.name}: "
                            + ", ".join(hits[:8]) + (", ..." if len(hits) > 8 else "")
                            + "; give more of the id")
    known = sorted(ids)
    raise TimelineError(f"no case {wanted!r} in {run.name}; "
                        + (f"its cases: {', '.join(known[:8])}"
                           + (f" and {len(known) - 8} more" if len(known) > 8 else "")
                           if known else "it has no cases"))


def _write_timeline(run: Path, case_id: str | None, request: str | None,
                    output: Path | None) -> Path:
    from strata_plugin.analysis.case_summary import analyze_run
    from strata_plugin.analysis.run_folder import load_bundle
    from strata_plugin.formats.atomic import atomic_write_text
    from strata_plugin.report import trace_events as te

    request_id = None
    if request is not None:
        # The request's id is checked before the run is analysed: a typo fails at once.
        bundle = load_bundle(run, case_id)
        ids = {r.request_id for recs in bundle.records.values() for r in recs}
        if request in ids:
            request_id = request
        elif case_id is not None and f"{case_id}/measured/{request}" in ids:
            request_id = f"{case_id}/measured/{request}"
        else:
            where = f"case {case_id!r}" if case_id is not None else run.name
            hint = "" if case_id is not None else " (a number needs --case)"
            raise te.TimelineError(f"no request {request!r} in {where}{hint}; request ids "
                                   f"look like <case id>/measured/N")
    ra = analyze_run(run)
    if request_id is not None:
        scope = te.request_scope(ra.bundle, request_id)
        default = f"request-{te.case_file_names([request_id])[request_id][5:]}"
    elif case_id is not None:
        scope = te.case_scope(ra.bundle, case_id)
        default = te.case_file_names([case_id])[case_id]
    else:
        scope, default = None, te.RUN_FILE
    if output is None:
        (run / te.FOLDER).mkdir(exist_ok=True)
        output = run / te.FOLDER / default
    pre = te.prepare(ra)
    engines = te.engine_traces(run, pre.origin)
    eng = [t for ts in engines.values() for t in ts] if case_id is None else list(
        engines.get(case_id, ()))
    atomic_write_text(output, te.dumps(te.build(ra, scope, eng, prepared=pre)))
    return output
