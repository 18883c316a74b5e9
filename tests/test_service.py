"""Server lifetimes with real processes: health, fast failure, group teardown."""

import os
import sys
import textwrap
import time

import pytest

from strata_plugin.run.server import LaunchSpec, Server, ServerStartError, free_port

HEALTHY = textwrap.dedent("""
    import http.server, os, subprocess, sys, time
    delay, port = float(sys.argv[1]), int(sys.argv[2])
    # A child in the same group, as engines spawn workers: teardown must reach it.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[3], "w").write(str(child.pid))
    time.sleep(delay)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    print("listening", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def _spec(tmp_path, argv, timeout=20.0, grace=2.0):
    port = free_port()
    return LaunchSpec("t", tuple(a.replace("PORT", str(port)) for a in argv), (),
                      f"http://127.0.0.1:{port}", "/health", timeout, grace,
                      tmp_path / "server.log"), port


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_start_health_and_group_teardown(tmp_path):
    child_file = tmp_path / "child.pid"
    spec, _ = _spec(tmp_path, [sys.executable, "-c", HEALTHY, "0.3", "PORT", str(child_file)])
    server = Server(spec, spec.base_url)
    server.start()
    try:
        assert server.alive() and server.startup_s >= 0.3
        child = int(child_file.read_text())
        assert _alive(child)
    finally:
        server.stop()
    assert not server.alive()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "a child of the server outlived teardown"
    assert "listening" in (tmp_path / "server.log").read_text()


def test_server_that_dies_fails_fast_with_log_tail(tmp_path):
    code = "import sys; print('fatal: model file not found', flush=True); sys.exit(3)"
    spec, _ = _spec(tmp_path, [sys.executable, "-c", code], timeout=60)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        Server(spec, spec.base_url).start()
    assert time.monotonic() - t0 < 5, "waited out the timeout instead of failing fast"
    assert "code 3" in str(info.value) and "model file not found" in str(info.value)


def test_server_never_healthy_times_out_clearly(tmp_path):
    code = "import time; print('loading...', flush=True); time.sleep(600)"
    spec, _ = _spec(tmp_path, [sys.executable, "-c", code], timeout=1.5)
    server = Server(spec, spec.base_url)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match=r"not healthy .* after 2 s"):
        server.start()
    assert time.monotonic() - t0 < 6
    assert not server.alive(), "a server that never became healthy was left running"


def test_sigterm_ignored_then_sigkill(tmp_path):
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('stubborn', flush=True); time.sleep(600)")
    spec, _ = _spec(tmp_path, [sys.executable, "-c", code], grace=0.5)
    server = Server(spec, spec.base_url)
    import subprocess
    server.proc = subprocess.Popen(list(spec.argv), start_new_session=True,
                                   stdout=subprocess.PIPE, text=True)
    assert server.proc.stdout is not None
    assert server.proc.stdout.readline() == "stubborn\n"  # SIGTERM is ignored from here
    t0 = time.monotonic()
    server.stop()
    assert not server.alive()
    assert 0.5 <= time.monotonic() - t0 < 6.5  # waited the 0.5 s grace, then killed
