"""``dblockrun status --check``: what a monitoring check should page about,
read from one status report (dblockrun/store/status.py).

A problem is: no live daemon (nothing starts on schedule); a job whose last
run failed (``failed``, ``timeout`` or ``lost``); a job that has not started
for twice its period (the time from its last start to the next one its
daemons planned), while the fleet is not paused. Disabled jobs are left out:
an operator chose that.
"""

from __future__ import annotations

from dblockrun.config.durations import format_duration
from dblockrun.ops.output import live_text
from dblockrun.store.models import FAILED, LOST, TIMEOUT, JobStatus
from dblockrun.store.status import StatusReport

#: Last-run results a check reports.
BAD_RESULTS = (FAILED, TIMEOUT, LOST)


def problems(got: StatusReport) -> list[str]:
    """One line per problem, the fleet's first, then by job name."""
    out: list[str] = []
    if not got.hosts:
        out.append(f"no live daemon: none sent {live_text(got.live_within)}, so no job "
                   "starts on schedule")
    for s in got.jobs:
        if s.state == "disabled":
            continue
        last = s.last_run
        if last is not None and last.result in BAD_RESULTS:
            code = "" if last.exit_code is None else f" (exit {last.exit_code})"
            out.append(f"job {s.lock.name}: last run {last.id} {last.result}{code} on "
                       f"{last.host}, {_ago(s.db_now - last.started)} ago")
        if got.paused is None and (late := overdue(s)) is not None:
            out.append(f"job {s.lock.name}: {late}")
    return out


def overdue(s: JobStatus) -> str | None:
    """Why the job is overdue: no start for more than twice its period."""
    lock = s.lock
    if lock.next_due is None or lock.last_start is None:
        return None
    period = lock.next_due - lock.last_start
    since = s.db_now - lock.last_start
    if period <= 0 or since <= 2 * period:
        return None
    return (f"has not started for {_ago(since)}, more than twice its period "
            f"({_ago(period)})")


def _ago(seconds: float) -> str:
    return format_duration(max(0, round(seconds)))
