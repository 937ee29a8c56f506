"""Who an operator is, as the audit trail, kill requests, pauses and
disables record it: ``user@host``."""

from __future__ import annotations

import getpass
import os
import socket


def operator_id() -> str:
    """``user@host`` of the operator running this command; under sudo, the
    user who ran sudo (``SUDO_USER``), not root. Taken from the environment
    and the host name: it says who asked, it does not authenticate them."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = str(os.getuid())
    sudo = os.environ.get("SUDO_USER")
    if user == "root" and sudo:
        user = sudo
    return f"{user}@{socket.gethostname()}"
