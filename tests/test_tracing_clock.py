"""The capture's end is read after the trace buffer stopped recording (run/tracing.py).

Cause of the flaky ``test_normal_end_saves_the_trace_and_removes_the_instance`` (an event
190 ms after the capture's end): ``stop()`` read the clock, then switched tracing off; a
writer preempted between the two on a busy host let the kernel stamp events after the
recorded end. Here a stand-in instance folder records what ``tracing_on`` said at each
clock read, with no root and no tracefs: the end must be read when it says 0.
"""

from __future__ import annotations

from pathlib import Path

from strata_plugin.run import tracing


def _fake_instance(tmp_path: Path) -> Path:
    d = tmp_path / "instances" / "strata-1-1"
    (d / "per_cpu" / "cpu0").mkdir(parents=True)
    (d / "per_cpu" / "cpu0" / "stats").write_text("entries: 7\noverrun: 0\n")
    (d / "tracing_on").write_text("1")
    (d / "trace").write_text("# tracer: nop\n")
    return d


def test_the_end_is_read_once_tracing_is_off(tmp_path, monkeypatch):
    d = _fake_instance(tmp_path)
    seen: list[str] = []

    def clock() -> int:
        seen.append((d / "tracing_on").read_text())
        return 1000 + len(seen)

    monkeypatch.setattr(tracing, "_mono_ns", clock)
    monkeypatch.setattr(tracing, "_remove_instance", lambda d: None)
    cap = tracing.TraceCapture(("sched/sched_switch",), tmp_path / "out" / "t.txt")
    cap.dir, cap._t0 = d, 1000
    monkeypatch.setitem(tracing._LIVE, cap.name, cap)
    res = cap.stop()
    assert seen == ["0"], "the end was read while the buffer still recorded"
    assert res is not None and (res.start_mono_ns, res.end_mono_ns) == (1000, 1001)
    assert res.entries == 7 and res.path.read_text() == "# tracer: nop\n"
    assert [p.name for p in res.path.parent.iterdir()] == ["t.txt"]  # no temporary left


def test_a_failed_copy_leaves_no_partial_trace(tmp_path, monkeypatch):
    d = _fake_instance(tmp_path)

    def full_disk(src, dst, length=0):
        dst.write(b"half a tra")
        dst.flush()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tracing.shutil, "copyfileobj", full_disk)
    monkeypatch.setattr(tracing, "_remove_instance", lambda d: None)
    out = tmp_path / "out" / "t.txt"
    out.parent.mkdir()
    out.write_text("previous\n")
    cap = tracing.TraceCapture(("sched/sched_switch",), out)
    cap.dir = d
    monkeypatch.setitem(tracing._LIVE, cap.name, cap)
    try:
        cap.stop()
    except OSError:
        pass
    else:
        raise AssertionError("the copy should have failed")
    assert out.read_text() == "previous\n" and sorted(p.name for p in out.parent.iterdir()) \
        == ["t.txt"]
