#!/usr/bin/env python3
"""A stand-in for the ``docker`` CLI, for the reaper tests (tests/test_container_reaper.py).

No container runtime can run on the machine these tests were written on (a docker 28 CLI
without a daemon, no podman), so the tests drive Strata's container code against this
script at the CLI boundary: the subcommands and output shapes Strata uses, as docker
prints them (``run`` in the foreground, ``container inspect`` JSON and ``--format``
templates, ``stop -t``, ``rm -f``, ``ps -a --filter label=K --format {{.Names}}``,
``image inspect``), and "Error: No such container: NAME" with exit 1 for a missing one.

A "container" is a process started in a session of its own, detached from the client:
as with a real runtime, killing the client leaves it running. State lives in
``$FAKE_RUNTIME_DIR/<name>.json``; every call is appended to ``calls.jsonl`` there.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

STATE = Path(os.environ["FAKE_RUNTIME_DIR"])
VALUED = {"--name", "--label", "--network", "-p", "-e", "-v", "--gpus", "--device",
          "--ulimit", "-t", "--format", "--filter"}


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def load(name: str) -> dict | None:
    try:
        return json.loads((STATE / f"{name}.json").read_text())
    except FileNotFoundError:
        return None


def missing(name: str) -> int:
    print(f"Error: No such container: {name}", file=sys.stderr)
    return 1


def parse(args: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    opts: dict[str, list[str]] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in VALUED:
            opts.setdefault(a, []).append(args[i + 1])
            i += 2
        elif a.startswith("-") and not rest:
            opts.setdefault(a, []).append("")
            i += 1
        else:
            rest = args[i:]
            break
    return opts, rest


def run(args: list[str]) -> int:
    opts, rest = parse(args)
    name, image, command = opts["--name"][0], rest[0], rest[1:]
    labels = dict(lb.split("=", 1) for lb in opts.get("--label", []))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the runtime's daemon side: the container is no child of the client
        os.setsid()
        if os.fork() == 0:
            os.close(r)
            os.write(w, str(os.getpid()).encode())
            os.close(w)
            os.execvp(command[0], command)
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    cpid = int(os.read(r, 32))
    state = {"Id": f"{abs(hash((name, cpid))):064x}"[:64], "Name": f"/{name}",
             "State": {"Pid": cpid, "Status": "running"},
             "Config": {"Image": image, "Labels": labels, "Env": opts.get("-e", [])},
             "Image": "sha256:" + "0" * 64}
    (STATE / f"{name}.json").write_text(json.dumps(state))
    while alive(cpid):  # docker run in the foreground: until the container ends
        time.sleep(0.05)
    if "--rm" in opts:
        (STATE / f"{name}.json").unlink(missing_ok=True)
    return 0


def inspect(args: list[str]) -> int:
    opts, rest = parse(args)
    state = load(rest[0])
    if state is None:
        return missing(rest[0])
    fmt = opts.get("--format", [""])[0]
    if fmt == "{{.Id}}":
        print(state["Id"])
    elif fmt.startswith("{{index .Config.Labels "):
        key = fmt.split('"')[1]
        print(state["Config"]["Labels"].get(key, "<no value>"))
    elif fmt:
        print(f"unsupported format {fmt}", file=sys.stderr)
        return 2
    else:
        print(json.dumps([state]))
    return 0


def kill(name: str, grace: float) -> int:
    state = load(name)
    if state is None:
        return missing(name)
    pid = state["State"]["Pid"]
    if grace > 0 and alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
    return 0


def main(argv: list[str]) -> int:
    with open(STATE / "calls.jsonl", "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "argv": argv}) + "\n")
    cmd, args = argv[0], argv[1:]
    if cmd == "run":
        return run(args)
    if cmd == "container" and args[0] == "inspect":
        return inspect(args[1:])
    if cmd == "image" and args[0] == "inspect":
        print(json.dumps([{"Id": "sha256:" + "0" * 64, "RepoTags": [args[-1]]}]))
        return 0
    if cmd == "stop":
        opts, rest = parse(args)
        return kill(rest[0], float(opts.get("-t", ["10"])[0]))
    if cmd == "rm":
        opts, rest = parse(args)
        code = kill(rest[0], 0)
        if code == 0:
            (STATE / f"{rest[0]}.json").unlink(missing_ok=True)
        return code
    if cmd == "ps":
        opts, _ = parse(args)
        want = [f.split("=", 1)[1] for f in opts.get("--filter", []) if f.startswith("label=")]
        for p in sorted(STATE.glob("*.json")):
            labels = json.loads(p.read_text())["Config"]["Labels"]
            if all(k in labels for k in want):
                print(p.stem)
        return 0
    print(f"fake runtime: unsupported {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
