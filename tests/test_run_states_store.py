"""The run states read from a run's sample files: the run-queue wait while it lasts.

A run folder's ``runstate.csv`` is written and read back (``load_samples``), then
``run_states.from_store`` splits it. The server's two threads run 1 core until
QUEUED_FROM, sit in R without a CPU until QUEUED_TO, then run again. The kernel's
``wait_s`` books the whole queued stretch in one lump when the threads next run;
``queued_s`` (runstate, formats/telemetry.SAMPLE_METRICS) counts it while it lasts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from strata_plugin.agent.protocol import CSV_HEADER, sample_line
from strata_plugin.analysis import run_states
from strata_plugin.analysis.timeline import load_samples

STEP_MS = 20
END_MS = 2_000
QUEUED_FROM_MS, QUEUED_TO_MS = 800, 1_600
MS = 1_000_000


def _write_run(run: Path, *, with_queued: bool) -> None:
    """One node's runstate samples on a 20 ms grid (threads in R, none asleep)."""
    lines = [CSV_HEADER + "\n"]
    run_s = 0.0
    prev = 0
    for t_ms in range(0, END_MS + 1, STEP_MS):
        step_s = (t_ms - prev) / 1e3
        if not QUEUED_FROM_MS < t_ms <= QUEUED_TO_MS:
            run_s += step_s  # 1 core on a CPU
        prev = t_ms
        queued = min(max(t_ms - QUEUED_FROM_MS, 0), QUEUED_TO_MS - QUEUED_FROM_MS) / 1e3
        # the kernel books the wait once the threads reach a CPU again
        booked = queued if t_ms > QUEUED_TO_MS else 0.0
        rows = [("run_s", run_s, "counter"), ("wait_s", booked, "counter"),
                ("throttled_s", 0.0, "counter"), ("threads", 2, "gauge"),
                ("state_S", 0, "gauge"), ("state_D", 0, "gauge"), ("state_T", 0, "gauge"),
                ("frozen", 0, "gauge")]
        if with_queued:
            rows.append(("queued_s", queued, "counter"))
        lines += [sample_line(t_ms * MS, "n1", "runstate", "", m, v, k) or ""
                  for m, v, k in rows]
    samples = run / "nodes" / "n1" / "samples"
    samples.mkdir(parents=True)
    (samples / "runstate.csv").write_text("".join(lines))


def _states(tmp_path: Path, with_queued: bool) -> run_states.RunStates:
    _write_run(tmp_path, with_queued=with_queued)
    rs = run_states.from_store(load_samples(tmp_path), 0, QUEUED_TO_MS * MS, "n1")
    assert rs is not None
    return rs


def test_a_wait_still_under_way_reads_as_waiting_where_it_lasted(tmp_path: Path) -> None:
    """queued_s grows through the queued stretch: every interval of it is waiting, from
    its first to its last, though wait_s books it only after the window's end."""
    rs = _states(tmp_path, with_queued=True)
    assert rs.share(QUEUED_FROM_MS * MS, QUEUED_TO_MS * MS, "waiting") == pytest.approx(1.0)
    # the edges: the interval just before the stretch ran, the first and last in it waited
    assert rs.share((QUEUED_FROM_MS - STEP_MS) * MS, QUEUED_FROM_MS * MS,
                    "running") == pytest.approx(1.0)
    for a_ms in (QUEUED_FROM_MS, QUEUED_TO_MS - STEP_MS):
        assert rs.share(a_ms * MS, (a_ms + STEP_MS) * MS, "waiting") == pytest.approx(1.0)
    assert rs.share(0, QUEUED_FROM_MS * MS, "waiting") == 0.0
    assert rs.wait_cores == pytest.approx(0.5)  # 0.8 s of wait over the 1.6 s window


def test_a_run_without_queued_s_reads_its_wait_as_the_kernel_booked_it(tmp_path: Path
                                                                        ) -> None:
    """An older run: the lump after the window is spread back LAZY_SPAN_S at most, so
    the stretch before that reads as stalled (neither running nor waiting, awake), the
    same split classify_intervals gives from wait_s."""
    rs = _states(tmp_path, with_queued=False)
    # booked at the end of the first interval after the stretch, spread back from there
    back_ms = QUEUED_TO_MS + STEP_MS - round(run_states.LAZY_SPAN_S * 1e3)
    assert rs.share(QUEUED_FROM_MS * MS, back_ms * MS, "stalled") == pytest.approx(1.0)
    assert rs.share(QUEUED_FROM_MS * MS, back_ms * MS, "waiting") == 0.0
    assert rs.share(back_ms * MS, QUEUED_TO_MS * MS, "waiting") == pytest.approx(1.0)
    t = rs.t
    steps = (t - t[0]) / MS
    run_s = np.array([_run_s_at(x + t[0] / MS) for x in steps])
    booked = np.where(t > QUEUED_TO_MS * MS, (QUEUED_TO_MS - QUEUED_FROM_MS) / 1e3, 0.0)
    zeros = np.zeros(len(t))
    ref = run_states.classify_intervals(t, run_s, booked, zeros, zeros, zeros,
                                        np.full(len(t), 2.0), zeros, 0, QUEUED_TO_MS * MS,
                                        throttled_s=zeros)
    np.testing.assert_allclose(rs.cum, ref.cum, atol=1e-9)


def _run_s_at(t_ms: float) -> float:
    queued = min(max(t_ms - QUEUED_FROM_MS, 0.0), QUEUED_TO_MS - QUEUED_FROM_MS)
    return (t_ms - queued) / 1e3
