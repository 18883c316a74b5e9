"""``python -m strata_plugin COMMAND``: report, compare, timeline, scorecard, bench,
profile-doc, plugins, agent, setup: offline tools, an ad-hoc benchmark, the profile
reference, the installed plugins, the agent, setup."""

from __future__ import annotations

import sys

USAGE = """usage: python -m strata_plugin COMMAND [ARGS]

commands:
  report RUN_DIR        regenerate every derived file of a run from its raw files
  compare RUN_A RUN_B   per-case deltas with confidence intervals
  timeline RUN_DIR [--case ID] [--request N] [-o FILE]
                        the run's, one case's or one request's timeline as a trace file
                        for Perfetto UI / chrome://tracing (docs/timeline.md)
  scorecard RUN...      how the verdicts of fault-suite runs named the injected faults
                        (-o FILE.md, --json FILE)
  bench URL --workload isl=256,osl=64,concurrency=4,requests=40 [--api API]
                        measure one workload against a running server; writes a run
                        folder and its report (--help for more)
  profile-doc [-o FILE] every profile key with its type, default and meaning
                        (docs/profile.md)
  plugins               the installed plugins' engines, collectors, rules and report
                        sections, each loaded and checked (docs/extending.md)
  agent [ARGS]          the per-node sampling agent (see docs/agent.md)
  setup [ARGS]          build llama-server and generate the embedded target's models
                        (cached in ~/.cache/strata; --print-paths, --clean, --help);
                        with --vllm: the opt-in vLLM CPU server's virtualenv and model;
                        with --sglang: the opt-in SGLang CPU server's virtualenv
                        and the same model
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "report":
        from strata_plugin.report.cli import report_main

        return report_main(rest)
    if command == "compare":
        from strata_plugin.report.cli import compare_main

        return compare_main(rest)
    if command == "timeline":
        from strata_plugin.report.cli import timeline_main

        return timeline_main(rest)
    if command == "scorecard":
        from strata_plugin.report.scorecard import scorecard_main

        return scorecard_main(rest)
    if command == "bench":
        from strata_plugin.plugin.bench_cli import bench_main

        return bench_main(rest)
    if command == "profile-doc":
        from strata_plugin.configure.profile_doc import main as profile_doc_main

        return profile_doc_main(rest)
    if command == "plugins":
        return plugins_main(rest)
    if command == "setup" and "--vllm" in rest:
        from strata_plugin.embedded.vllm_setup import main as vllm_setup_main

        return vllm_setup_main(rest)
    if command == "setup" and "--sglang" in rest:
        from strata_plugin.embedded.sglang_setup import main as sglang_setup_main

        return sglang_setup_main(rest)
    if command == "setup":
        from strata_plugin.embedded.llama_setup import main as setup_main

        return setup_main(rest)
    if command == "agent":
        from strata_plugin.agent import main as agent_main

        return agent_main(rest)
    print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


def plugins_main(argv: list[str]) -> int:
    """Each entry-point group and what is installed in it; exit 1 naming a broken one."""
    from strata_plugin.entry_points import PluginError, load
    from strata_plugin.extend import check_plugins
    from strata_plugin.formats.printable import printable

    if argv:
        print("usage: python -m strata_plugin plugins", file=sys.stderr)
        return 2
    try:
        groups = check_plugins()
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for group, names in groups.items():
        print(f"{group}:")
        for p in load(group) if names else ():
            # the distribution's own words: shown, not obeyed (formats/printable.py)
            print(printable(f"  {p.name} = {p.value}" + (f"  ({p.dist})" if p.dist else "")))
        if not names:
            print("  (none installed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
