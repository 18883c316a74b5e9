"""The CPU's measured limits (run/cpu_probe.py) and what the run records before its
cases (run/roofline_facts.py)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from strata_plugin.run import cpu_probe, roofline_facts
from strata_plugin.run.server import LaunchSpec


@pytest.mark.integration  # waits out real seconds (>= 2 s on a quiet host)
def test_a_real_probe_on_one_cpu_measures_memory_cache_and_flops():
    r = cpu_probe.measure([0])
    (dram_triad, dram_read), (llc_triad, llc_read) = r["dram"], r["llc"]
    assert r["cpus"] == [0] and r["matmul"]["n"] == cpu_probe.MATMUL_N
    # STREAM's rule: memory arrays at least 4x the cache (or 16 MiB where it is small)
    if r["llc_bytes"]:
        assert dram_read["array_bytes"] >= min(4 * r["llc_bytes"], 512 << 20)
        assert 3 * llc_read["array_bytes"] <= r["llc_bytes"] // 2
    # a physical ordering: reading within the cache is faster than from memory. Not
    # asserted for the triad: its stores share this VM's last-level cache with the
    # neighbours' traffic, and a clean CI-style run here measured the cache's triad at
    # 9.65 GB/s against memory's 9.73 (the reads kept their order)
    assert llc_read["bytes_s"] > dram_read["bytes_s"] > 0
    assert llc_triad["bytes_s"] > 0 and dram_triad["bytes_s"] > 0
    assert r["matmul"]["flops_s"] == pytest.approx(
        2 * cpu_probe.MATMUL_N**3 / r["matmul"]["best_s"])
    assert isinstance(r["contended"], bool) and r["fingerprint"]["cpus"] == [0]


def _fake(flops: float, contended: bool):
    """A measurement of CPU 0 shaped as measure() makes it (every key the cache's check
    reads), its rates from ``flops``."""
    def run(kernel: str, bytes_s: float) -> dict:
        return {"kernel": kernel, "bytes_s": bytes_s, "array_bytes": 1 << 20, "reps": 4,
                "bytes_per_element": 16, "arrays_per_cpu": 3, "best_s": 0.1, "median_s": 0.1}

    return {"cpus": [0], "dram": [run("read", flops / 10)], "llc": [run("read", flops)],
            "matmul": {"kernel": "matmul", "flops_s": flops, "n": 2048, "reps": 4},
            "contended": contended, "other_busy_cores": 0.5 if contended else 0.0,
            "llc_bytes": 32 << 20, "measured_utc": "2026-12-07T00:00:00Z",
            "fingerprint": cpu_probe.fingerprint([0])}


def test_the_cache_is_used_when_quiet_and_a_busy_measurement_is_improved(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("STRATA_CACHE", str(tmp_path))
    runs = [_fake(100.0, True), _fake(300.0, False), _fake(900.0, False)]
    calls = []
    monkeypatch.setattr(cpu_probe, "measure", lambda cpus, python=None, engine_python=None:
                        calls.append(1) or runs.pop(0))
    first = cpu_probe.cpu_limits([0])
    assert first["contended"] and len(calls) == 1
    second = cpu_probe.cpu_limits([0])  # the cached one was contended: measured again
    assert len(calls) == 2 and not second["contended"]
    assert second["matmul"]["flops_s"] == 300.0 and second["measurements"] == 2
    third = cpu_probe.cpu_limits([0])  # quiet now: the cache answers
    assert len(calls) == 2 and third["matmul"]["flops_s"] == 300.0
    assert Path(third["cached_from"]).parent == tmp_path / "device-limits"


def test_merging_keeps_the_faster_figure_of_each():
    a, b = _fake(500.0, True), _fake(200.0, True)
    b["dram"] = [{"kernel": "read", "bytes_s": 99.0}]
    m = cpu_probe._best(a, b)
    assert m["matmul"]["flops_s"] == 500.0 and m["dram"][0]["bytes_s"] == 99.0
    assert m["llc"][0]["bytes_s"] == 500.0 and m["contended"]


def _measuring(monkeypatch, tmp_path, runs: list[dict]) -> list[int]:
    """cpu_limits over a cache in ``tmp_path``, each measurement the next of ``runs``
    (the probe itself is tested above; here what is kept and what is trusted)."""
    monkeypatch.setenv("STRATA_CACHE", str(tmp_path))
    calls: list[int] = []
    monkeypatch.setattr(cpu_probe, "measure", lambda cpus, python=None, engine_python=None:
                        calls.append(1) or runs.pop(0))
    return calls


def _cache_file(tmp_path) -> Path:
    (path,) = (tmp_path / "device-limits").glob("cpu-*.json")
    return path


def _poison(tmp_path, monkeypatch, entry) -> Path:
    """The cache as a first quiet measurement wrote it, then edited to ``entry``."""
    _measuring(monkeypatch, tmp_path, [_fake(300.0, False)])
    cpu_probe.cpu_limits([0])
    path = _cache_file(tmp_path)
    path.write_text(entry if isinstance(entry, str) else json.dumps(entry))
    return path


def _set(entry: dict, dotted: str, value) -> dict:
    """``entry`` with one key set (``value`` None: removed); ``dram.0.bytes_s`` indexes."""
    entry = json.loads(json.dumps(entry))
    *parents, last = dotted.split(".")
    d = entry
    for p in parents:
        d = d[int(p)] if isinstance(d, list) else d[p]
    if value is None:
        del d[last]
    else:
        d[last] = value
    return entry


@pytest.mark.parametrize("edit, words", [
    (("matmul.flops_s", None), "matmul: flops_s None is not a finite number"),
    (("matmul.flops_s", "300"), "matmul: flops_s 300 is not a finite number"),
    (("matmul.flops_s", -10.0), "matmul: flops_s -10.0 is not"),
    (("matmul.flops_s", float("nan")), "matmul: flops_s nan is not"),
    (("matmul.flops_s", 1e30), "within CPU_FLOPS_PER_CPU_MAX a CPU"),
    (("dram.0.bytes_s", 1e30), "dram read: bytes_s 1e+30 is not"),
    (("llc", None), "llc is not a list of measurements"),
    (("contended", "no"), "contended is not true or false"),
    (("matmul_bf16", {"flops_s": True, "n": 256, "reps": 4}), "matmul_bf16: flops_s True"),
])
def test_a_wrong_cached_entry_is_discarded_measured_again_and_rewritten(
        tmp_path, monkeypatch, edit, words):
    path = _poison(tmp_path, monkeypatch, _set(_fake(300.0, False), *edit))
    calls = _measuring(monkeypatch, tmp_path, [_fake(200.0, False)])
    got = cpu_probe.cpu_limits([0])
    assert len(calls) == 1 and got["matmul"]["flops_s"] == 200.0
    assert words in got["cache_discarded"]
    written = json.loads(path.read_text())
    assert written["matmul"]["flops_s"] == 200.0 and "cache_discarded" not in written
    again = cpu_probe.cpu_limits([0])  # the rewritten file answers now
    assert len(calls) == 1 and again["matmul"]["flops_s"] == 200.0


def test_the_plausible_ceiling_is_per_cpu_and_held_at_its_value(tmp_path, monkeypatch):
    from strata_plugin.limits import CPU_FLOPS_PER_CPU_MAX

    _poison(tmp_path, monkeypatch, _set(_fake(300.0, False), "matmul.flops_s",
                                        float(CPU_FLOPS_PER_CPU_MAX)))
    calls = _measuring(monkeypatch, tmp_path, [_fake(200.0, False)])
    assert cpu_probe.cpu_limits([0])["matmul"]["flops_s"] == CPU_FLOPS_PER_CPU_MAX
    assert not calls  # at the ceiling: used
    _poison(tmp_path, monkeypatch, _set(_fake(300.0, False), "matmul.flops_s",
                                        CPU_FLOPS_PER_CPU_MAX * 1.001))
    calls = _measuring(monkeypatch, tmp_path, [_fake(200.0, False)])
    assert cpu_probe.cpu_limits([0])["matmul"]["flops_s"] == 200.0 and calls


def test_a_fresh_quiet_measurement_wins_over_a_faster_contended_cache(tmp_path, monkeypatch):
    """A contended entry is measured again; a quiet measurement is the machine's own and
    replaces it whole, never kept below a faster cached figure (which would then be
    trusted as quiet for ever)."""
    path = _poison(tmp_path, monkeypatch, _fake(900.0, True))
    calls = _measuring(monkeypatch, tmp_path, [_fake(200.0, False)])
    got = cpu_probe.cpu_limits([0])
    assert len(calls) == 1 and got["matmul"]["flops_s"] == 200.0 and not got["contended"]
    assert got["llc"][0]["bytes_s"] == 200.0 and got["measurements"] == 2
    assert json.loads(path.read_text())["matmul"]["flops_s"] == 200.0


def test_a_poisoned_contended_entry_is_rewritten(tmp_path, monkeypatch):
    path = _poison(tmp_path, monkeypatch, _set(_fake(300.0, True), "matmul.flops_s", 1e30))
    calls = _measuring(monkeypatch, tmp_path, [_fake(200.0, True)])
    got = cpu_probe.cpu_limits([0])
    assert len(calls) == 1 and got["matmul"]["flops_s"] == 200.0
    assert json.loads(path.read_text())["matmul"]["flops_s"] == 200.0


def test_a_cache_file_past_its_limit_or_a_fifo_is_not_read(tmp_path, monkeypatch):
    from strata_plugin.limits import CPU_CACHE_BYTES_MAX

    good = json.dumps(_fake(300.0, False))
    path = _poison(tmp_path, monkeypatch, good + " " * (CPU_CACHE_BYTES_MAX - len(good)))
    calls = _measuring(monkeypatch, tmp_path, [_fake(200.0, False)])
    assert cpu_probe.cpu_limits([0])["matmul"]["flops_s"] == 300.0 and not calls  # at it
    path.write_text(good + " " * (CPU_CACHE_BYTES_MAX + 1 - len(good)))
    got = cpu_probe.cpu_limits([0])
    assert got["matmul"]["flops_s"] == 200.0 and "CPU_CACHE_BYTES_MAX" in got["cache_discarded"]
    with open(path, "r+b") as fh:  # 3 GB, sparse: never read
        fh.truncate(3 << 30)
    calls = _measuring(monkeypatch, tmp_path, [_fake(100.0, False)])
    got = cpu_probe.cpu_limits([0])
    assert got["cache_discarded"] == (f"{path}: {3 << 30} bytes, past CPU_CACHE_BYTES_MAX "
                                      f"({CPU_CACHE_BYTES_MAX} bytes): not read")
    assert path.stat().st_size < 10_000  # rewritten
    path.unlink()
    os.mkfifo(path)
    calls = _measuring(monkeypatch, tmp_path, [_fake(50.0, False)])
    done: list = []
    t = threading.Thread(target=lambda: done.append(cpu_probe.cpu_limits([0])), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # let the waiting read go before failing
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert done and "a FIFO, not a regular file" in done[0]["cache_discarded"]
    assert path.is_file()  # the FIFO replaced by the measurement


class _Recorder:
    def __init__(self) -> None:
        self.manifest: dict = {}

    def update_manifest(self, **kw) -> None:
        self.manifest.update(json.loads(json.dumps(kw)))


def _server(argv, container=None, pid=None):
    spec = LaunchSpec("default", tuple(argv), (), "http://127.0.0.1:1", "/health", 1, 1,
                      Path("/dev/null"), container)
    return SimpleNamespace(spec=spec, pid=pid, base_url=spec.base_url, config_id="default")


def test_the_run_records_the_facts_once_per_configuration(tmp_path, monkeypatch):
    gguf = pytest.importorskip("gguf")  # noqa: F841  (the generator needs it)
    from strata_plugin.embedded import make_model

    model = tmp_path / "m.gguf"
    assert make_model.main(["--out", str(model), "--dim", "64", "--layers", "2", "--heads",
                            "4", "--ff", "96", "--vocab", "512"]) == 0
    probes = []
    monkeypatch.setattr(cpu_probe, "cpu_limits", lambda cpus, **kw: probes.append(cpus)
                        or {"cpus": list(cpus)})
    rec = _Recorder()
    srv = _server(["llama-server", "-m", str(model)], pid=0)  # pid 0: this process's CPUs
    roofline_facts.record(rec, "llamacpp", srv, "default", gpu_expected=False)
    roofline_facts.record(rec, "llamacpp", srv, "default", gpu_expected=False)
    # another configuration on the same CPUs: this run's probe again, not a second one
    roofline_facts.record(rec, "llamacpp", srv, "ub128", gpu_expected=False)
    entry = rec.manifest["roofline"]["default"]
    assert len(probes) == 1 and entry["cpu"]["cpus"] == probes[0]
    assert rec.manifest["roofline"]["ub128"]["cpu"] == entry["cpu"]
    assert entry["model"]["facts"]["layers"] == {"value": 2, "source": "GGUF llama.block_count"}
    gpu = roofline_facts.block_facts("llamacpp", srv, gpu_expected=True)
    assert "a GPU server" in gpu["cpu"]["unavailable"]
    boxed = _server(["docker", "run", "img"], container=object())
    got = roofline_facts.block_facts("llamacpp", boxed, gpu_expected=False)
    assert "runs in a container" in got["model"]["facts"]["layers"]["unavailable"]
    assert "no process of this machine" in got["cpu"]["unavailable"]


@pytest.mark.vllm
@pytest.mark.integration  # imports torch in vLLM's interpreter: ~6 s
def test_the_bf16_multiply_runs_in_the_engines_own_interpreter():
    """vLLM's interpreter (its virtualenv's torch), found from a process of it as the
    probe finds the server's."""
    import os
    import subprocess
    import sys

    from strata_plugin.embedded.llama_setup import cache_root
    from strata_plugin.embedded.vllm_setup import venv_python

    python = venv_python(cache_root())
    if not python.is_file():
        msg = "the vLLM CPU target is not set up (`bash scripts/setup.sh --vllm`)"
        if os.environ.get("STRATA_REQUIRE_VLLM") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    proc = subprocess.Popen([str(python), "-c", "import time; time.sleep(60)"])
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        found = cpu_probe.engine_python(proc.pid)
        assert found == str(python)  # the venv's path, not the interpreter it links to
        assert cpu_probe.engine_python(mine.pid) is None  # Strata's own venv has no torch
    finally:
        proc.kill()
        mine.kill()
        proc.wait()
        mine.wait()
    got, own = cpu_probe._bf16([0], found)
    assert got["dtype"] == "bfloat16" and got["flops_s"] > 0 and own > 0
    assert 256 <= got["n"] <= cpu_probe.MATMUL_N
    assert got["flops_s"] == pytest.approx(2 * got["n"]**3 / got["best_s"])


def test_a_model_read_that_blocks_costs_the_limit_then_the_run_goes_on(tmp_path,
                                                                        monkeypatch):
    """A stat or read on a hung network mount blocks in the kernel; here the reader blocks
    on an event instead (no FUSE mount needed). ``record`` returns after the limit with the
    facts UNAVAILABLE saying why, the blocked thread left behind, and what that thread
    reads once it is let go never reaches the manifest."""
    import time

    release, entered = threading.Event(), threading.Event()
    real = roofline_facts.read_model_facts

    def hung(path, kv=None, located_by=""):
        entered.set()
        release.wait(60)
        return real(path, kv, located_by)

    monkeypatch.setattr(roofline_facts, "read_model_facts", hung)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    rec = _Recorder()
    srv = _server(["llama-server", "-m", str(model)], pid=0)
    limit_s = 0.5
    t0 = time.monotonic()
    try:
        roofline_facts.record(rec, "llamacpp", srv, "default", gpu_expected=True,
                              read_limit_s=limit_s)
        took = time.monotonic() - t0
        left = [t for t in threading.enumerate() if t.name == "strata-model-facts"]
        assert entered.is_set() and left and all(t.daemon and t.is_alive() for t in left)
    finally:
        release.set()
    # it waited the limit, and not the minute the read would have taken: 10 s of slack
    # for a loaded host, far under the hang it catches
    assert limit_s <= took < limit_s + 10, took
    layers = rec.manifest["roofline"]["default"]["model"]["facts"]["layers"]
    assert layers["unavailable"].startswith(
        f"reading the model files ({model}) took longer than 0.5 s: a hung mount?")
    for t in left:
        t.join(10)
    roofline_facts.record(rec, "llamacpp", srv, "default", gpu_expected=True)
    assert rec.manifest["roofline"]["default"]["model"]["facts"]["layers"] == layers


def test_a_model_read_within_the_limit_keeps_its_facts_and_its_errors(tmp_path,
                                                                      monkeypatch):
    """The other side of the limit: a read that ends in time is used as it is, whatever it
    found (here a file that is no GGUF: the reader's own reason, not the limit's), and an
    exception in the reading thread reaches ``record``, which says why."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"not a gguf at all")
    srv = _server(["llama-server", "-m", str(model)], pid=0)
    facts, pid = roofline_facts.model_entry("llamacpp", srv, limit_s=30)
    assert pid == 0
    why = dict(facts.facts)["layers"].unavailable
    assert why and "took longer than" not in why and str(model) in why

    def boom(*a, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(roofline_facts, "read_model_facts", boom)
    rec = _Recorder()
    roofline_facts.record(rec, "llamacpp", srv, "default", gpu_expected=True)
    got = rec.manifest["roofline"]["default"]["model"]["facts"]["layers"]["unavailable"]
    assert got == "the roofline's facts could not be read: RuntimeError: boom"
