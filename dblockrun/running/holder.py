"""Holder ids and who holds a lock, and why (no heavy imports: ``exec``
uses it)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from dblockrun.store.models import OK
from dblockrun.timetext import iso

if TYPE_CHECKING:
    from dblockrun.store.roles import StatusReading


def new_holder_id(host: str | None = None) -> str:
    """hostname:pid:random — unique per process, readable in ``status``.
    ``host``: a daemon's ``hostname`` label (``--label hostname=NAME``),
    the name ``dblockrun drain`` matches its claims by (store/drain.py)."""
    # os.uname().nodename is what socket.gethostname() returns, without
    # importing socket (a few ms of exec's start).
    return f"{host or os.uname().nodename}:{os.getpid()}:{os.urandom(3).hex()}"


def held_why(store: StatusReading, row: str) -> str | None:
    """What holds the lock of ``row`` now, to follow ``ROW is`` (``run``,
    ``exec -v``): a run still going; its holder's run that has ended, its
    lock kept by ``lock-at-least`` (or a failed attempt's retry delay) until
    when; a holder with no run. None when the lock is free."""
    running = store.control.running(row)
    if running:
        run = running[-1]
        return f"busy: run {run.id} on {run.host} has run since {iso(run.started)}"
    state = store.lock_state(row)
    if state is None or state.holder is None or state.lock_until is None or (
            state.lock_until <= store.db_now()):
        return None
    ended = next((r for r in store.history(row, 1, output=False)
                  if r.token == state.token and r.finished is not None), None)
    if ended is None:
        return f"busy (its lock is held by {state.holder} until {iso(state.lock_until)})"
    by = "lock-at-least" if ended.result == OK else "lock-at-least or its retry's delay"
    return (f"held until {iso(state.lock_until)} by {by}: run {ended.id} on {ended.host} "
            f"ended {ended.result} at {iso(ended.finished)}")
