"""Names that become paths or ssh hosts, checked where they enter (profile, options).

Run ids, node names and configuration ids become file and folder names inside the run
folder (``reports/<run id>/nodes/<node>/``, ``service/<config id>/``) and arguments of
commands (``--node NAME``); an ssh host becomes an argument of ``ssh``. A name such as
``../../x`` would write outside the run folder, and a host such as
``-oProxyCommand=...`` would be read by ssh as an option that runs a command. Standard
library only: ``run/remote.py`` uses it too.
"""

from __future__ import annotations

import ipaddress
import re

#: The characters of a run id, node name or configuration id.
NAME_CHARS = "[A-Za-z0-9_.-]"
_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*")
NAME_RULE = f"a name of {NAME_CHARS} characters, not '.' or '..', not starting with '-'"

#: ``user@`` of an ssh host: a POSIX user name (never an option: no leading ``-``).
_USER_RX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
#: A host name or an ssh config alias: letters, digits, ``_ . -``, not starting with ``-``.
_HOSTNAME_RX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
#: An IPv6 address, with an optional zone (``fe80::1%eth0``); ``ipaddress`` then checks it.
_IPV6_RX = re.compile(r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(%[A-Za-z0-9_.-]+)?")
SSH_HOST_RULE = ("an ssh host: a host name or ssh config alias ([A-Za-z0-9_.-]), an IPv4 or "
                 "IPv6 address, or user@host; never starting with '-', no spaces or "
                 "control characters")


def is_name(value: object) -> bool:
    """A run id, node name or configuration id that is safe as one path component."""
    return (isinstance(value, str) and bool(_NAME.fullmatch(value))
            and value not in (".", ".."))


def valid_ssh_host(value: object) -> bool:
    """A host name (or ssh config alias), an IPv4 or IPv6 address, or ``user@`` one of
    those; never an ssh option (a leading ``-``), whitespace or a control character.

    The profile loader refuses other values (``nodes[i].ssh_host``) and every ssh argv
    (``run/remote.ssh_argv``) checks again, so no path reaches ssh with a host it could
    read as an option."""
    if not isinstance(value, str):
        return False
    user, at, host = value.rpartition("@")
    if at and not _USER_RX.fullmatch(user):
        return False
    if _HOSTNAME_RX.fullmatch(host):
        return True
    if not _IPV6_RX.fullmatch(host):
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
