"""A scripted engine in a process of its own, on a port given: ``python
tests/engine_process.py PORT [GAP_S]``. It answers GET with ``ok`` (the health check) and
every POST with an OpenAI completions stream of 10 tokens, one per ``GAP_S`` (default
0.1 s), and prints ``listening PID`` once it listens. A test kills it (SIGKILL) and its
supervisor starts another on the same port: an engine that dies and is replaced, with a
PID of its own each time, as a real one under systemd or a container runtime."""

from __future__ import annotations

import os
import socket
import sys
import threading

from sse_script_server import Reply, ScriptServer, Seen, sse

N_TOKENS = 10


def main(port: int, gap_s: float) -> None:
    def reply(seen: Seen) -> Reply:
        if seen.method == "GET":
            return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
        items = [(gap_s, sse({"choices": [{"index": 0, "text": " x"}]}))
                 for _ in range(N_TOKENS)]
        items.append((0.0, sse({"choices": [{"index": 0, "text": "",
                                             "finish_reason": "length"}],
                                "usage": {"prompt_tokens": 8,
                                          "completion_tokens": N_TOKENS}})))
        items.append((0.0, sse("[DONE]")))
        return Reply(items)

    srv = ScriptServer(reply)
    srv._listener.close()  # the port given, not one of the kernel's choosing
    srv._listener = socket.create_server(("127.0.0.1", port))  # SO_REUSEADDR: a restart
    srv._listener.settimeout(0.1)                              # binds at once
    with srv:
        print(f"listening {os.getpid()}", flush=True)
        threading.Event().wait()  # until killed


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.1)
