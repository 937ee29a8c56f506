"""Holder ids: who holds a lock (no heavy imports: ``exec`` uses it)."""

from __future__ import annotations

import os


def new_holder_id(host: str | None = None) -> str:
    """hostname:pid:random — unique per process, readable in ``status``.
    ``host``: a daemon's ``hostname`` label (``--label hostname=NAME``),
    the name ``dblockrun drain`` matches its claims by (store/drain.py)."""
    # os.uname().nodename is what socket.gethostname() returns, without
    # importing socket (a few ms of exec's start).
    return f"{host or os.uname().nodename}:{os.getpid()}:{os.urandom(3).hex()}"
