"""``python -m strata_plugin report DIR`` and ``... compare RUN_A RUN_B``.

Both work offline on run folders alone: no server, no GPU, no network.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from strata_plugin.report.fmt import md_num


def report_main(argv: list[str]) -> int:
    """Exit 0: the report of a complete run; 1: the report is written, the run is
    incomplete (the reason is its first line, and on stderr); 2: no report, a raw file
    does not hold its format (named by file, line and key) or no run folder."""
    p = argparse.ArgumentParser(
        prog="python -m strata_plugin report",
        description="Regenerate every derived file of a run folder from its raw files. "
        "Exit status: 0 complete, 1 the run is incomplete (the report says why), 2 a raw "
        "file is damaged (the error names its line).",
    )
    p.add_argument("run_dir", type=Path, help="reports/<RUN_ID>")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
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
        path = write_report(args.run_dir, outcome=outcome)
    except (FormatError, PluginError) as exc:  # a hand-edited or damaged file: which
        # file, line, key; or an installed plugin that cannot load: which one, and why
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(path)
    if not outcome.complete:  # the report is written, and says so in its first lines
        print(f"run incomplete: {outcome.words}", file=sys.stderr)
        return 1
    return 0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


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
                _pct(r.delta_rel),
                "-" if r.lo is None else f"{_pct(r.lo)}..{_pct(r.hi)}",
                md_num(r.p_value),
                r.call,
            )
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    print(f"A = {args.run_a}\nB = {args.run_b}")
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0
