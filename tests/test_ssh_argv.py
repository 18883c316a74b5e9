"""Every ssh command Strata builds ends ssh's options with ``--`` right before the host.

A profile's ``ssh_host`` is checked when the profile loads (tests/test_robustness_profile.py);
this is the second wall: whatever reaches an ssh argv builder, ssh never reads the host
(or anything after it) as an option. OpenSSH re-parses options after the host unless
``--`` came first (``ssh host -p 99`` sets the port; ``ssh -- host -p 99`` runs ``-p 99``),
so the ``--`` goes before the host, not after it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from strata_plugin.agent.handle import agent_argv
from strata_plugin.run import remote

ROOT = Path(__file__).resolve().parents[1]
HOSTS = ["gpu-b", "ops@gpu-b", "10.0.0.2", "fe80::1"]
BAD = ["-oProxyCommand=touch /tmp/strata-x", "", "a b", "host;rm", "gpu-b\n", "-l", "@x"]


def _ssh_part(argv: list[str], ssh: str = "ssh") -> list[str]:
    """The ssh invocation inside a (possibly helper-prefixed) command."""
    return argv[argv.index(ssh):]


def _builders(host: str) -> dict[str, list[str]]:
    local = agent_argv("w", 0.5, collectors=["cpu"])
    return {
        "ssh_argv": remote.ssh_argv(host, ["true"], ("-F", "/tmp/cfg")),
        "agent shipped": remote.remote_agent_argv(host, local, ssh_options=()),
        "agent installed": remote.remote_agent_argv(host, local, ssh_options=(), ship=False),
        "remote command": remote.remote_command_argv(host, ["sleep", "1"], ssh_options=(),
                                                     env_names=["HF_TOKEN"]),
        "preflight probe": remote.probe_argv(host, ssh_options=("-F", "/tmp/cfg")),
    }


@pytest.mark.parametrize("host", HOSTS)
def test_every_ssh_command_has_double_dash_right_before_the_host(host):
    for name, argv in _builders(host).items():
        ssh = _ssh_part(argv)
        assert ssh.count(host) == 1, (name, ssh)
        i = ssh.index(host)
        assert ssh[i - 1] == "--", (name, ssh)
        assert ssh.index("--") == i - 1, (name, ssh)  # the first "--" ends the options
        assert "BatchMode=yes" in ssh[:i], (name, ssh)
        assert len(ssh) == i + 2, (name, ssh)  # then exactly one remote command line


@pytest.mark.parametrize("host", BAD)
def test_every_builder_refuses_a_host_that_is_not_one(host):
    local = agent_argv("w", 0.5, collectors=["cpu"])
    calls = [lambda: remote.ssh_argv(host, ["true"]),
             lambda: remote.remote_agent_argv(host, local, ssh_options=()),
             lambda: remote.remote_agent_argv(host, local, ssh_options=(), ship=False),
             lambda: remote.remote_command_argv(host, ["true"], ssh_options=()),
             lambda: remote.probe_argv(host, ssh_options=())]
    for call in calls:
        with pytest.raises(ValueError, match="not an ssh host"):
            call()


def test_no_other_module_builds_an_ssh_argv():
    """The builders above are all there are: an ssh argv elsewhere would skip the checks."""
    rx = re.compile(r"""\[\s*["']ssh["']\s*,|\bssh(\s*:\s*str)?\s*=\s*["']ssh["']""")
    found = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "strata_plugin").rglob("*.py")
                   if rx.search(p.read_text()))
    assert found == ["strata_plugin/run/remote.py"], found


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client on this machine")
def test_the_preflight_probe_never_hands_a_crafted_host_to_ssh(tmp_path, monkeypatch):
    """The probe used to run ``ssh ... <host> true`` unchecked: a host of
    ``-oProxyCommand=touch FILE`` created FILE, before any profile check, even when
    attaching. The real ssh client is run here."""
    from strata_plugin.run.deployment import _ssh_probe

    monkeypatch.delenv(remote.SSH_CONFIG_ENV, raising=False)
    canary = tmp_path / "pwned"
    res = _ssh_probe(f"-oProxyCommand=touch {canary}")()
    assert not canary.exists()
    assert isinstance(res, str) and "not an ssh host" in res, res

