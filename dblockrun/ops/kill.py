"""``dblockrun kill``: stop a running run from any host.

The request is written on the row holding the run (store/control.py); the
daemon or ``exec`` holding it reads it with its next lease renewal (within
a heartbeat), stops the command's process group as it stops one at
lock-at-most, records the run ``killed`` (its stored output ends with
``killed by user@host: reason``) and releases the lock as usual.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dblockrun.errors import DblockrunError, UsageError
from dblockrun.ops.actions import require_job, wait_for_ends
from dblockrun.store.dburl import describe
from dblockrun.store.models import RunRecord

if TYPE_CHECKING:
    from dblockrun.store.roles import Control, StatusReading

#: How often the command looks whether the runs it asked to stop have ended.
POLL = 0.1


class NotRunning(DblockrunError):
    """Nothing to kill: the job (or run) is not running."""


def targets(store: StatusReading, *, job: str | None, item: str | None,
            run_id: int | None) -> list[RunRecord]:
    """The runs a kill of ``job`` (its ``item``) or of ``run_id`` stops:
    those still running under a live lease."""
    where = describe(store.url, store.prefix)
    if run_id is not None:
        run = store.run(run_id)
        if run is None:
            raise UsageError(f"no run {run_id} in {where}")
        found = store.control.running(run_id=run_id)
        if not found:
            raise NotRunning(f"run {run_id} of {run.job} is not running ({run.result}) "
                             f"in {where}")
        return found
    assert job is not None
    require_job(store, job)
    found = store.control.running(job, item)
    if not found:
        what = job if item is None else f"{job} item {item}"
        raise NotRunning(f"{what} is not running in {where}")
    return found


def kill(store: Control, who: str, *, job: str | None = None, item: str | None = None,
         run_id: int | None = None, reason: str | None = None,
         wait: float | None = None) -> list[RunRecord]:
    """Ask the holders of the runs to stop them; with ``wait``, wait that
    long for them to end and return them as they ended, else as they were."""
    runs = targets(store, job=job, item=item, run_id=run_id)
    asked = store.control.kill(runs, who, reason)
    if not asked:  # they ended between the read and the request
        raise NotRunning(f"{runs[0].job} is not running (it ended just now) in "
                         f"{describe(store.url, store.prefix)}")
    if wait is None:
        return asked
    ended = wait_for_ends(store, asked, time.monotonic() + wait, POLL)
    late = [str(run.id) for run in asked if run.id not in ended]
    if late:
        raise DblockrunError(
            f"kill requested, but run {', '.join(late)} still running after {wait:g}s; "
            "the request stays filed: its holder reads it with its next lease renewal "
            "(is it renewing? see `dblockrun status`)")
    return [ended[run.id] for run in asked]
