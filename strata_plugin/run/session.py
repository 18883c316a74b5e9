"""The live run: its folder, its blocks and cases, its outcome, and its end.

One ``StrataSession`` per pytest session, created the first time a test asks
for a Strata fixture (so ``pytest tests/`` of the harness itself creates no run
folder). Its servers and workers are its ``Deployment`` (run/deployment.py); every
process that starts is registered for teardown, which runs on a normal end, on
errors, on Ctrl-C and on SIGTERM (turned into KeyboardInterrupt). Why the run is
incomplete is one ``RunOutcome`` (formats/outcome.py), appended to wherever it is found.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from strata_plugin.analysis.failures import RunFailures
from strata_plugin.configure.credentials import redact_json
from strata_plugin.configure.profile import StrataConfig
from strata_plugin.errors import StrataError
from strata_plugin.formats.cases import CaseLine
from strata_plugin.formats.outcome import RunOutcome
from strata_plugin.formats.records import ClockAnchor
from strata_plugin.load.case_runner import CaseRunner, CaseSetup
from strata_plugin.load.workload import TokenSpace
from strata_plugin.run import reaper
from strata_plugin.run.agents import AgentFleet
from strata_plugin.run.deployment import Deployment
from strata_plugin.run.dry_plan import DryPlan
from strata_plugin.run.run_folder import RunRecorder, base_manifest, create_run_dir, private_umask
from strata_plugin.run.server import Server, process_counters


def case_id_from(nodeid: str) -> str:
    """A test's default case id: its pytest node id (``cases/x.py::test_a[default@1]``),
    the name JUnit, pytest's output and every file of the run share. (File names made
    from it are sanitized where they are made.)"""
    return nodeid


class RunFolderError(StrataError, OSError):
    """The run folder could not be written (a full or vanished results disk). The run
    itself no longer raises it: it records the reason (``run_folder_failed``) and fails
    with one line; kept for callers that catch it."""


@dataclass
class Block:
    """One server configuration's lifetime; its agents are the fleet's, under its key."""

    server: Server


def public_profile(cfg: StrataConfig) -> dict:
    """The profile as recorded in the manifest (and summary.json): every env table cut to
    its variable names (``Profile.recorded``), so a literal value is never written, and
    no URL's credentials (configure/credentials.py)."""
    return redact_json(dict(cfg.profile.recorded(), _path=str(cfg.profile.path)))


class StrataSession:
    dry_plan: DryPlan | None  # the dry run's checklist (set in __init__)

    def __init__(self, cfg: StrataConfig, argv: list[str]) -> None:
        self.cfg = cfg
        # A profile with env values (a token, perhaps): everything this run writes (and its
        # agents, which inherit the umask) stays readable by the owner alone.
        self._umask = private_umask() if cfg.profile.has_env_values else None
        try:
            self.run_dir = create_run_dir(cfg.reports_dir, cfg.run_id,
                                          private=self._umask is not None)
        except BaseException:
            self.restore_umask()
            raise
        self.anchor = ClockAnchor.now()
        self.recorder = RunRecorder(self.run_dir, self.anchor, base_manifest(
            run_id=cfg.run_id, profile=public_profile(cfg), argv=argv, root=cfg.rootdir))
        self.started_ns = time.monotonic_ns()
        # What analysis needs from the profile, resolved once (formats/telemetry.py): the
        # interval, link caps, and whether GPUs and RDMA rails are expected (missing GPU
        # telemetry is then a gap, not just a CPU server).
        self.recorder.update_manifest(telemetry=cfg.profile.telemetry_facts().to_json())
        self.history: dict[str, list] = {}  # A/B results by group, across blocks
        self.repetitions: dict = {}  # runs of each workload (per A/B arm): prompt salts
        #: why the run is incomplete, appended to wherever it is found (formats/outcome.py)
        self.outcome = RunOutcome()
        #: the telemetry agents of every block (whose agents follow which server), and
        #: those lost (the manifest's "agents_lost")
        self.fleet = AgentFleet(cfg.profile.nodes, cfg.profile.telemetry, self.run_dir,
                                self.recorder, attached=bool(cfg.server_url),
                                health_path=cfg.profile.server.health_path)
        #: the servers and workers, their start, restart and stop (run/deployment.py)
        self.deployment = Deployment(cfg, self.run_dir, self.recorder, self.fleet,
                                     self.add_reason)
        self.dry_plan = None  # the dry run's checklist (run/dry_run.DryRunPlan)
        #: each case's requests counted as they are recorded (analysis/failures.py): a case
        #: whose requests mostly failed makes the run incomplete, with its counts
        self.failures = RunFailures()

    @property
    def incomplete_reason(self) -> str:
        """The outcome's words (the manifest's ``incomplete_reason``); "" when complete."""
        return self.outcome.words

    def run_folder_failed(self, what: str, exc: OSError) -> None:
        """A raw file could not be written (a full or vanished disk): one reason per run,
        the first, naming the file(s); the run then fails (plugin/hooks.py)."""
        if not self.outcome.has("run_folder_failed"):
            self.add_reason("run_folder_failed", f"{self.run_dir} ({what}): {exc}")

    def add_reason(self, kind: str, detail: str = "") -> None:
        """The run is incomplete for one more reason: kept, and in the manifest at once
        (a full disk keeps it in memory, for the terminal and the next rewrite)."""
        if self.outcome.add(kind, detail):
            self.recorder.update_manifest(**self.outcome.manifest_fields())

    # --- blocks: one server configuration's lifetime ------------------------------------

    def begin_block(self, server: Server) -> Block:
        """Start the telemetry agents on this server, then hold the idle baseline."""
        self.fleet.start(server)
        try:
            block = Block(server=server)
            self.fleet.snapshot(server, "before")
            t0 = time.monotonic_ns()
            time.sleep(self.cfg.profile.telemetry.baseline_s)
            self.recorder.mark("baseline", f"baseline:{server.config_id}", "", t0,
                               time.monotonic_ns())
        except BaseException:  # Ctrl-C in the baseline: the fixture's teardown never runs
            self.fleet.stop(server.block_key)
            raise
        return block

    def end_block(self, block: Block) -> None:
        """Hold the cooldown window, stop the agents, stop the server. Always runs."""
        try:
            if block.server.alive() and not reaper.INTERRUPTED.is_set():
                t0 = time.monotonic_ns()
                time.sleep(self.cfg.profile.telemetry.cooldown_s)
                self.recorder.mark("cooldown", f"cooldown:{block.server.config_id}", "", t0,
                                   time.monotonic_ns())
        finally:
            try:
                if not reaper.INTERRUPTED.is_set():
                    self.fleet.snapshot(block.server, "after")
            finally:
                self._stop_block(block)

    def _stop_block(self, block: Block) -> None:
        """The server first (its agents then check every node's GPUs were released), the
        agents last, whatever either does: a dead agent never keeps the server running."""
        key = block.server.block_key
        try:
            self.deployment.stop_server(block.server, self.fleet.handles(key))
        finally:
            self.fleet.stop(key)

    def recover_agents(self, server: Server, cases: tuple[str, ...] = ()) -> list[str]:
        """Agents of this server's block that ended without being asked are recorded and
        started again (``AgentFleet.recover``); the run is then incomplete, and says why.
        Returns one line per lost agent, for the terminal."""
        lines = self.fleet.recover(server, cases)
        for line in lines:
            self.add_reason("agent_lost", line)
        return lines

    def case_runner(self, server: Server, nodeid: str, progress) -> CaseRunner:
        from strata_plugin.load.case_runner import PlanningRunner
        from strata_plugin.load.client import Timeouts

        p = self.cfg.profile
        lo, hi = p.server.token_id_range
        setup = CaseSetup(
            base_url=server.base_url, api=p.server.api, config_id=server.config_id,
            block_id=server.block_id, startup_s=server.startup_s,
            token_space=TokenSpace(lo, hi), timeouts=Timeouts(read_s=p.server.request_timeout_s),
            headers=self.deployment.request_headers(server),
            salt=self.cfg.run_id, model=p.server.model_name or None, scale=p.scale,
            engine=p.server.engine, load=p.load)
        if self.dry_plan is not None:
            return PlanningRunner(setup, plan=self.dry_plan.add_case,
                                  default_case_id=case_id_from(nodeid), history=self.history)
        kw = dict(record=self.record, mark=self.recorder.mark, add_case=self.add_case,
                  counters=process_counters(server), progress_line=progress,
                  default_case_id=case_id_from(nodeid), history=self.history,
                  repetitions=self.repetitions)
        if self.cfg.escalate or self.cfg.engine_profile:
            from strata_plugin.run.diagnostic_round import DiagnosticRunner
            return DiagnosticRunner(setup, escalate=self.cfg.escalate, run_dir=self.run_dir,
                                    engine_profile=self.cfg.engine_profile,
                                    server_pid=server.pid if server.spec else None,
                                    settle_s=p.telemetry.interval_s + 0.3, **kw)
        return CaseRunner(setup, **kw)

    def record(self, rec) -> None:
        """A request record to requests.jsonl, counted for its case's failures."""
        try:
            self.recorder.record(rec)
        except OSError as exc:  # a full disk: the reason first, then the load stops
            self.run_folder_failed("requests.jsonl", exc)
            raise
        self.failures.add(rec)

    def add_case(self, line: CaseLine) -> None:
        """A case line to cases.jsonl; the failures it allows are kept for the end."""
        try:
            self.recorder.add_case(line)
        except OSError as exc:
            self.run_folder_failed("cases.jsonl", exc)
            raise
        if line.allow_errors and line.case_id:
            self.failures.allow(line.case_id, line.allow_errors)

    def server_failed(self, why: str) -> None:
        """A server that could not be started or reached: the run is incomplete, and the
        manifest says why at once (the report repeats it in its first lines)."""
        self.add_reason("server_failed", why)

    # --- end -----------------------------------------------------------------------------

    def finish(self, *, interrupted: bool) -> Path | None:
        """Stop what runs, then write the report; an interrupted run says so in both."""
        self.deployment.stop_all()  # a container left is recorded; the report is written
        try:
            self.recorder.mark("run", "run", "", self.started_ns, time.monotonic_ns())
            if not interrupted:
                from strata_plugin.run.prometheus import pull_run_windows

                pull_run_windows(self.cfg, self.recorder, self.run_dir)
            if interrupted and not self.outcome.has("preflight_failed"):  # (a preflight
                self.outcome.add("interrupted")  # ends the run this way, for its reason)
            for line in self.failures.lines():
                self.outcome.add("requests_failed", line)
            self.recorder.flush_markers()
            lost = sorted(n for n in self.recorder.unwritten if n != "manifest.json")
            if lost:  # (the manifest is written next, or fails below)
                self.run_folder_failed(", ".join(lost), self.recorder.unwritten[lost[0]])
            self.recorder.update_manifest(  # the end marker: every raw file is whole
                **self.outcome.manifest_fields(),
                finished_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            # Complete only once the report is on disk: a run cut short while writing it
            # is not.
            self.recorder.write_manifest(complete=False)
        except OSError as exc:
            # A full or vanished results disk: the manifest on disk keeps complete=false
            # (written first, replaced atomically), and no report is attempted. The run
            # fails with this one reason (plugin/hooks.py), not a traceback.
            self.run_folder_failed("manifest.json", exc)
            with contextlib.suppress(OSError):
                self.recorder.close()
            self.restore_umask()
            return None
        try:
            return self._write_report()
        finally:
            with contextlib.suppress(OSError):
                self.recorder.close()
            self.restore_umask()

    def restore_umask(self) -> None:
        """The process's own umask again, once the run folder is written (pytest and the
        user's tests go on in this process)."""
        if self._umask is not None:
            os.umask(self._umask)
            self._umask = None

    def _write_report(self) -> Path | None:
        """The report, then ``complete`` from the outcome (the report adds a torn raw
        line it finds); a report that fails adds its reason to the others."""
        from strata_plugin.analysis.run_folder import drop_derived
        from strata_plugin.report import write_report

        modules = set(sys.modules)
        started = time.time()
        try:
            report = write_report(self.run_dir, outcome=self.outcome)
        except KeyboardInterrupt:
            # Ctrl-C / SIGTERM while the report was being written: say so, write it once
            # more (a second signal stops that too), and let pytest see the interrupt.
            # Modules whose import was cut short are dropped so the retry imports them whole.
            for name in set(sys.modules) - modules:
                sys.modules.pop(name, None)
            self.add_reason("interrupted_in_report")
            try:
                write_report(self.run_dir, outcome=self.outcome)
            except Exception as exc:  # the raw data is safe; say why there is no report
                self.add_reason("report_failed", f"{type(exc).__name__}: {exc}")
            raise
        except Exception as exc:  # the raw data is safe on disk; say why there is no report
            drop_derived(self.run_dir, since=started)  # no half-written report stays
            self.add_reason("report_failed", f"{type(exc).__name__}: {exc}")
            return None  # complete=false is on disk already
        # The report's own finds (a torn raw line) are in the outcome by now.
        self.recorder.update_manifest(**self.outcome.manifest_fields())
        self.recorder.write_manifest(complete=self.outcome.complete)
        return report
