"""Record the trace text the trace readers' tests read (tests/data/traces/).

Run as root on a machine with tracefs, after ``python -m strata_plugin setup``:

    .venv/bin/python scripts/record_trace_fixtures.py tests/data/traces

It starts the embedded llama-server on a private copy of the model, sends decode
requests from two threads, and captures through ``run/tracing.py`` one window each:
``sched-clean`` (the load alone), ``sched-hogs`` (CpuHogs on the server's cores) and
``block-pageout`` (PageOut on the model copy). Each is cut to its first
``--seconds`` of window, and ``meta.json`` gets the window it was cut to.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from strata_plugin.run import trace_targets, tracing
from strata_plugin.testing import faults


def _server(model: Path, port: int) -> subprocess.Popen:
    info = json.loads(subprocess.run(
        [os.environ.get("PYTHON", "python3"), "-m", "strata_plugin", "setup"],
        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    argv = [info["llama_server"], "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-t", "2", "-c", "2048", "-np", "2", "--no-webui"]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return p
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise RuntimeError("llama-server did not come up")


def _load(port: int, stop: threading.Event) -> None:
    body = json.dumps({"prompt": [5, 6, 7, 8] * 16, "n_predict": 32,
                       "ignore_eos": True, "temperature": 0}).encode()
    while not stop.is_set():
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=60).read()


def _record(out: Path, name: str, events: tuple[str, ...], server: subprocess.Popen,
            seconds: float) -> None:
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    meta = trace_targets.snapshot(server.pid)
    cap = tracing.TraceCapture(events, d / "trace.full")
    with cap:
        w0 = time.monotonic_ns()
        time.sleep(seconds)
        w1 = time.monotonic_ns()
    res = cap.result
    assert res is not None
    meta.update(start_mono_ns=res.start_mono_ns, end_mono_ns=res.end_mono_ns,
                window_ns=[w0, w1], overruns=res.overruns, events=list(events))
    for f in meta["files"]:
        f.pop("maps", None) if not f["path"].endswith(".gguf") else None
    (d / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    (d / "trace.full").rename(d / "trace.txt")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--port", type=int, default=47311)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="strata-trace-"))
    src = Path.home() / ".cache/strata/models/tiny-llama.gguf"
    model = tmp / "model.gguf"
    shutil.copyfile(src.resolve(), model)
    server = _server(model, a.port)
    stop = threading.Event()
    load = [threading.Thread(target=_load, args=(a.port, stop), daemon=True) for _ in range(2)]
    try:
        for t in load:
            t.start()
        time.sleep(1.0)
        _record(a.out, "sched-clean", tracing.TRACE_SETS["sched"], server, a.seconds)
        cores = tuple(sorted(os.sched_getaffinity(server.pid)))
        with faults.CpuHogs(cores, per_core=1, shield=False):
            time.sleep(0.5)
            _record(a.out, "sched-hogs", tracing.TRACE_SETS["sched"], server, a.seconds)
        with faults.PageOut(server.pid, str(model), period_s=0.25):
            time.sleep(0.3)
            _record(a.out, "block-pageout", tracing.TRACE_SETS["block"], server, a.seconds)
    finally:
        stop.set()
        server.terminate()
        server.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
