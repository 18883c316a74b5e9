"""Which container an engine's cgroup names (run/netns.py), as each runtime writes its
cgroup paths: podman's ``libpod-<id>.scope`` (systemd) and ``/libpod_parent/libpod-<id>``
(cgroupfs), docker's ``docker-<id>.scope`` and ``/docker/<id>``, containerd's (Kubernetes)
``cri-containerd-<id>.scope``, CRI-O's ``crio-<id>.scope``; a path with no 64-hex id is
no container, and an id one digit short is not an id."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from strata_plugin.run.netns import cgroup_of, container_in

ID = "9b070e05637072fcff6fb00589fa485f197c6eb0f4c0e9a268784a9a27128185"


@pytest.mark.parametrize("path, runtime", [
    (f"/machine.slice/libpod-{ID}.scope", "podman"),
    (f"/libpod_parent/libpod-{ID}", "podman"),
    (f"/system.slice/docker-{ID}.scope", "docker"),
    (f"/docker/{ID}", "docker"),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/"
     f"cri-containerd-{ID}.scope", "containerd"),
    (f"/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope", "cri-o"),
    (f"/something/{ID}", "container"),
])
def test_each_runtimes_cgroup_path_names_its_container(path, runtime):
    assert container_in(path) == (runtime, ID)


@pytest.mark.parametrize("path", ["/", "/user.slice/user-0.slice/session-1.scope",
                                  f"/docker/{ID[:-1]}", f"/docker/{ID}0"])
def test_a_path_without_a_whole_id_is_no_container(path):
    assert container_in(path) is None


def test_this_process_cgroup_is_read_from_proc():
    """The path as /proc/<pid>/cgroup gives it: a line of that file, never empty."""
    got = cgroup_of(os.getpid(), Path("/proc"))
    lines = Path(f"/proc/{os.getpid()}/cgroup").read_text().splitlines()
    assert got and any(line.split(":", 2)[2] == got for line in lines)
    assert cgroup_of(2 ** 22 + 1, Path("/proc")) == ""
