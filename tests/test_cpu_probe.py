"""The CPU's measured limits (run/cpu_probe.py) and what the run records before its
cases (run/roofline_facts.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from strata_plugin.run import cpu_probe, roofline_facts
from strata_plugin.run.server import LaunchSpec


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
    return {"cpus": [0], "dram": [{"kernel": "read", "bytes_s": flops / 10}],
            "llc": [{"kernel": "read", "bytes_s": flops}], "matmul": {"flops_s": flops},
            "contended": contended, "fingerprint": cpu_probe.fingerprint([0])}


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
