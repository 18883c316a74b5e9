"""Run the sandbox as a non-root user, for real: ``python tests/sandbox_as_user.py JOB``.

Used by tests/test_sandbox.py (run as root). The script puts itself in a new user
namespace that maps uids and gids 0-65535 onto the same host ids (the parent writes the
maps: only root outside may map a range), hides ``/root`` behind a tmpfs that shows only
the Python installation (``nobody`` cannot traverse the real ``/root`` where this Python
may live), optionally caps that namespace's ``user.max_user_namespaces`` at 0 (so no
further user namespace can be made below it: a machine without user namespaces, as its
kernel sees it), drops to uid/gid 65534 and runs JOB (JSON on stdin: the answer's text,
the frozen test file, allow_unsandboxed, profile_opt_in, delegate: whether it gets a
memory cgroup of its own, as systemd's ``Delegate=yes`` gives, default true), printing one
JSON line: the probe's answer, and either the verdict or the refusal.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
REPO = Path(__file__).resolve().parents[1]
libc = ctypes.CDLL(None, use_errno=True)


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise OSError(ctypes.get_errno(), what)


def mount(src, target, fstype, flags, data=None) -> None:
    def enc(s):
        return (None if s is None else os.fsencode(s))
    check(libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
          f"mount {target}")


def child(job: dict, go: int) -> None:
    check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare")
    os.write(job["ready_fd"], b"x")
    os.read(go, 1)  # the parent has written the maps
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    pyenv = [p for p in {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
             if p.startswith("/root/")]
    fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in pyenv}
    mount("tmp", "/root", "tmpfs", 0, "mode=0755,size=1m")
    for p, fd in fds.items():
        os.makedirs(p, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
    if job["no_userns"]:
        Path("/proc/sys/user/max_user_namespaces").write_text("0\n")
    os.setgroups([])
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)
    sys.path.insert(0, str(REPO))
    from strata_plugin.load import sandbox, validators

    if job.get("profile_opt_in"):
        sandbox.allow_unconfined(job["profile_opt_in"])  # what plugin/options.py does
    out: dict = {"uid": os.getuid(), "mode": sandbox.mode(), "probe": sandbox.probe()}
    test_file = Path(job["test_file"])
    try:
        v = validators.code_passes(test_file, allow_unsandboxed=job["allow_unsandboxed"])
    except sandbox.SandboxUnavailable as exc:
        out["refused"] = str(exc)
    else:
        verdict = v(job["text"])
        out["verdict"] = [verdict.passed, verdict.total, verdict.detail]
    print(json.dumps(out), flush=True)


def main() -> None:
    job = json.loads(sys.stdin.read())
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    job["ready_fd"] = ready_w
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            child(job, go_r)
        except BaseException as exc:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
            code = 1
        os._exit(code)
    os.read(ready_r, 1)
    Path(f"/proc/{pid}/uid_map").write_text("0 0 65536\n")
    Path(f"/proc/{pid}/gid_map").write_text("0 0 65536\n")
    group = delegate(pid) if job.get("delegate", True) else None
    os.write(go_w, b"x")
    _, status = os.waitpid(pid, 0)
    if group is not None:
        for sub in group.iterdir():
            if sub.is_dir():
                sub.rmdir()
        group.rmdir()
    sys.exit(os.waitstatus_to_exitcode(status))


def delegate(pid: int) -> Path | None:
    """What systemd's ``Delegate=yes`` does for a user's service: a memory cgroup of the
    user's own (uid 65534 owns the folder and ``cgroup.procs``), the child moved into it,
    so the sandbox can make its own below it. None where there is no v1 memory hierarchy
    (the sandbox then says so)."""
    mount = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        tail = right.split()
        if tail[0] == "cgroup" and "memory" in tail[2].split(","):
            mount = Path(left.split()[4])
    own = next((ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text()
                .splitlines() if "memory" in ln.split(":")[1].split(",")), None)
    if mount is None or own is None:
        return None
    group = mount / own.lstrip("/") / f"strata-test-user-{pid}"
    group.mkdir()
    for p in (group, group / "cgroup.procs", group / "tasks"):
        os.chown(p, 65534, 65534)
    (group / "cgroup.procs").write_text(str(pid))
    return group


if __name__ == "__main__":
    main()
