"""Why a job's claim lost to an operator: the fleet's pause or the job's
disable, read after the claim predicate refused it (dblockrun/store/queries.py
``claimable`` knew first, in the same statement as the claim; it says no more
than no). One reader for each caller that must tell them apart from a lock
held by a run: an every-host slot refused at its claim (firing.py) and a
chain's trigger (chains.py)."""

from __future__ import annotations

from dataclasses import dataclass

from dblockrun.store.runstore import FiringStore


@dataclass(frozen=True)
class Halt:
    """The fleet paused (``job`` None) or ``job`` disabled, since when
    (database time; None: not known, or not asked for)."""

    job: str | None
    since: float | None


def halted(store: FiringStore, name: str, now: float, *, since: bool = False) -> Halt | None:
    """The pause in effect now, else the disable of job ``name``, else
    None: one statement while paused, else two (the job's lock row), three
    for a disabled job with ``since`` (when its disable began; a pause's
    start comes with the pause)."""
    pause = store.control.paused()
    if pause is not None:
        return Halt(None, pause.since)
    lock = store.lock_state(name)
    if lock is None or not lock.disabled_at(now):
        return None
    return Halt(name, store.disabled_since(name, now) if since else None)
