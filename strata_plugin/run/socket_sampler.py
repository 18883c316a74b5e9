"""``ss -ti`` of the server's port, sampled through one measured window.

Why: interface byte counters say how busy a link was, not whether the connections that
carry the benchmark saw a long round trip, retransmissions or full send queues. The
kernel's per-socket TCP info (``ss -ti``: RTT, retransmits, unacked segments, queues,
pacing and delivery rates) does, per connection. Sampled every ``period_s`` into
``ss.txt``, one ``# t_ns=<monotonic ns>`` line before each sample; read by
``analysis/traces/sockets.py``. Needs ``ss`` (iproute2); no root.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path


def ss_argv(port: int) -> list[str]:
    """Established TCP sockets with the port on either end, one line each, with info."""
    return ["ss", "-tinHO", "state", "established",
            "(", "sport", "=", f":{port}", "or", "dport", "=", f":{port}", ")"]


def unavailable() -> str:
    return "" if shutil.which("ss") else "ss (iproute2) is not installed"


class SocketSampler:
    """A thread writing ``ss -ti`` samples of ``port`` to ``out`` until stopped."""

    def __init__(self, port: int, out: Path, period_s: float = 0.25) -> None:
        self.port, self.out, self.period_s = port, Path(out), period_s
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0
        self.errors: list[str] = []

    def _loop(self) -> None:
        with self.out.open("w") as fh:
            while True:
                t = time.monotonic_ns()
                try:
                    res = subprocess.run(ss_argv(self.port), capture_output=True, text=True,
                                         timeout=5, check=False)
                    fh.write(f"# t_ns={t}\n{res.stdout}")
                    self.samples += 1
                    if res.returncode != 0 and len(self.errors) < 3:
                        self.errors.append(res.stderr.strip())
                except (OSError, subprocess.TimeoutExpired) as exc:
                    if len(self.errors) < 3:
                        self.errors.append(str(exc))
                if self._halt.wait(self.period_s):
                    break

    def start(self) -> SocketSampler:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, name="strata-ss", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(10)
