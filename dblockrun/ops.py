"""Operator actions that take more than one store call."""

from __future__ import annotations

import time

from dblockrun.errors import DblockrunError, UsageError
from dblockrun.store import Store
from dblockrun.store.models import RunRecord


def request_run(store: Store, job: str, wait: float | None) -> RunRecord | None:
    """File a run-now request for ``job``; with ``wait``, return the run a
    daemon started for it, or raise if none did in time."""
    before = store.lock_state(job)
    if before is None:
        raise UsageError(f"no such job in the database: {job} (has a daemon loaded it?)")
    if before.disabled_until is not None and before.disabled_until > store.db_now():
        raise UsageError(f"{job} is disabled; `dblockrun enable {job}` first")
    store.request_run(job)
    if wait is None:
        return None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        state = store.lock_state(job)
        if state is not None and state.token > before.token:
            for run in store.history(job, 5):
                if run.token == state.token:
                    return run
        time.sleep(0.1)
    raise DblockrunError(
        f"no daemon started {job} within {wait:g}s; the request stays filed "
        "(is a daemon with this job running?)"
    )
