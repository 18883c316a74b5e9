"""The sandbox's parts without a sandbox: its seccomp program and its memory cgroup's paths.

The seccomp program (load/sandbox_child.unix_socket_filter) is run by a small
classic-BPF interpreter over generated system calls, with a fixed seed: its verdict is
the stated rule for every (ABI, call, domain, type) the generator reaches, and the
boundaries (AF_UNIX = 1 against 0 and 2, a type's flag bits, the x32 bit, io_uring's three
calls and their neighbours) are listed explicitly. The kernel's side, real sockets and
real listeners, is tests/test_sandbox.py::test_no_pathname_unix_socket_is_reachable."""

from __future__ import annotations

import errno
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_plugin.load import sandbox_child as c  # its source is what the sandbox runs

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=400)
DENY = c.RET_ERRNO | errno.EACCES
SOCK_CLOEXEC, SOCK_NONBLOCK = 0o2000000, 0o4000


def run_bpf(prog: list[tuple[int, int, int, int]], data: bytes) -> int:
    """Classic BPF, the instructions this program uses, over ``struct seccomp_data``."""
    acc, pc = 0, 0
    for _ in range(len(prog) + 1):
        code, jt, jf, k = prog[pc]
        if code == c.LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == c.AND_K:
            acc &= k
        elif code in (c.JEQ_K, c.JGE_K):
            hit = acc == k if code == c.JEQ_K else acc >= k
            pc += (jt if hit else jf)
        elif code == c.RET_K:
            return k
        else:
            raise AssertionError(f"unknown instruction {code:#x}")
        pc += 1
    raise AssertionError("the program did not return")


def seccomp_data(arch: int, nr: int, *args: int) -> bytes:
    a = (list(args) + [0] * 6)[:6]
    return struct.pack("<IIQ6Q", nr, arch, 0, *a)  # nr: an int, read unsigned


def rule(machine: str, arch: int, nr: int, a0: int, a1: int) -> int:
    """The stated rule, written independently of the program."""
    native, sock, pair = c.SECCOMP_ARCH[machine]
    if arch != native:
        return c.RET_KILL_PROCESS
    if nr >= 0x40000000 or nr in (425, 426, 427):
        return DENY
    if nr == sock and a0 & 0xFFFFFFFF == 1:
        return DENY
    if nr == pair and a0 & 0xFFFFFFFF == 1 and (a1 & 0xF) not in (1, 5):
        return DENY
    return c.RET_ALLOW


MACHINES = sorted(c.SECCOMP_ARCH)
ARCHES = [a for a, _, _ in c.SECCOMP_ARCH.values()] + [0x40000003, 0x40000028, 0]


@SETTINGS
@given(machine=st.sampled_from(MACHINES), arch=st.sampled_from(ARCHES),
       nr=st.one_of(st.sampled_from([41, 53, 198, 199, 424, 425, 426, 427, 428,
                                     0x40000029, 0x3FFFFFFF]),
                    st.integers(0, 0xFFFFFFFF)),
       a0=st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 1)),
       a1=st.one_of(st.integers(0, 15).map(lambda t: t | SOCK_CLOEXEC),
                    st.integers(0, 2**64 - 1)))
def test_the_filter_is_the_stated_rule(machine, arch, nr, a0, a1):
    prog = c.unix_socket_filter(machine)
    assert run_bpf(prog, seccomp_data(arch, nr, a0, a1)) == rule(machine, arch, nr, a0, a1)


@pytest.mark.parametrize("machine", MACHINES)
def test_the_boundaries(machine):
    arch, sock, pair = c.SECCOMP_ARCH[machine]
    prog = c.unix_socket_filter(machine)

    def verdict(nr, a0=0, a1=0, a=arch):
        return run_bpf(prog, seccomp_data(a, nr, a0, a1))

    assert [verdict(sock, d, 1) for d in (0, 1, 2, 10)] == [c.RET_ALLOW, DENY, c.RET_ALLOW,
                                                             c.RET_ALLOW]
    assert verdict(sock, 1 | (1 << 32)) == DENY  # the kernel reads an int: the low half
    assert [verdict(pair, 1, t) for t in (1, 2, 3, 5)] == [c.RET_ALLOW, DENY, DENY,
                                                           c.RET_ALLOW]
    assert verdict(pair, 1, 1 | SOCK_CLOEXEC | SOCK_NONBLOCK) == c.RET_ALLOW
    assert verdict(pair, 1, 2 | SOCK_CLOEXEC) == DENY
    assert verdict(pair, 2, 2) == c.RET_ALLOW  # an AF_INET pair: not a unix socket
    assert [verdict(n) for n in (424, 425, 426, 427, 428)] == [c.RET_ALLOW, DENY, DENY, DENY,
                                                                c.RET_ALLOW]
    assert (verdict(0x3FFFFFFF), verdict(0x40000000)) == (c.RET_ALLOW, DENY)
    assert verdict(sock, 1, a=arch ^ 1) == c.RET_KILL_PROCESS


def test_an_unknown_machine_is_a_setup_error():
    with pytest.raises(c.SetupError, match="no seccomp table for riscv64"):
        c.unix_socket_filter("riscv64")


# --- the memory cgroup's paths, on a stand-in tree (no cgroup v2 memory controller here) --

def test_v2_enables_memory_below_its_own_cgroup_and_sets_the_limit(tmp_path, monkeypatch):
    """cgroup v2 (the development VM is v1): the group is made below this process's own
    cgroup, memory is enabled in the parent's ``subtree_control``, ``memory.max`` is the
    limit, and swap and group-kill are set where the kernel offers them."""
    from strata_plugin.load import sandbox

    own = tmp_path / "user.slice" / "job"
    own.mkdir(parents=True)
    (own / "cgroup.subtree_control").write_text("cpu\n")
    monkeypatch.setattr(sandbox, "_cgroup_mounts", lambda: (None, tmp_path))
    monkeypatch.setattr(sandbox, "_own_cgroup",
                        lambda ctrl: "/user.slice/job" if ctrl == "" else None)
    real_mkdir = Path.mkdir

    def mkdir(self, *a, **kw):  # the kernel makes a group's files with the folder
        real_mkdir(self, *a, **kw)
        for f in ("memory.swap.max", "memory.oom.group", "cgroup.procs"):
            (self / f).write_text("")

    monkeypatch.setattr(Path, "mkdir", mkdir)
    group, why = sandbox.make_memory_cgroup(256 << 20)
    assert why == "" and group is not None and group.version == 2
    assert group.path.parent == own and group.path.name.startswith("strata-sandbox-")
    assert (own / "cgroup.subtree_control").read_text() == "+memory"
    assert [(group.path / f).read_text() for f in
            ("memory.max", "memory.swap.max", "memory.oom.group")] == [str(256 << 20), "0", "1"]


def test_v1_without_permission_names_the_step_and_the_remedy(tmp_path, monkeypatch):
    from strata_plugin.load import sandbox

    (tmp_path / "job").mkdir()  # mkdir below it fails, as for a user with no delegation
    monkeypatch.setattr(sandbox, "_cgroup_mounts", lambda: (tmp_path, None))
    monkeypatch.setattr(sandbox, "_own_cgroup", lambda ctrl: "/job" if ctrl else None)
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **k: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied")))
    group, why = sandbox.make_memory_cgroup(1 << 30)
    assert group is None
    assert why.startswith(f"cgroup v1: mkdir {tmp_path}/job/strata-sandbox-"), why
    assert why.split(": ", 2)[2].startswith("Permission denied"), why
