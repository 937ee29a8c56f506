"""``dblockrun status --check``: what a monitoring check should page about,
read from one status report (dblockrun/store/status.py).

A problem is: no live daemon (nothing starts on schedule); another session
holding the lock rows (every renewal, claim and bookkeeping round waits on
it: which session, whose, since when); the fleet paused (no job starts: who
paused it, why and since when); a job whose last run
failed (``failed``, ``timeout`` or ``lost``); a job whose slots are being
recorded ``missed`` or ``skipped`` (since when, which host recorded the
last and why); a job that has not started for twice its period (the time
from its last start to the next one its daemons planned), while the fleet
is not paused and counted from the pause's end when one dropped its slot.
Disabled jobs are left out: an operator chose that; so are slots a
calendar, a blackout window or the active range excluded: the file chose
that. ``--allow paused``
(``missed``, ``skipped``) accepts what an operator chose or expects.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from dblockrun.durations import FOREVER, format_duration
from dblockrun.ops.output import live_text
from dblockrun.store.models import FAILED, LOST, MISSED, SKIPPED, TIMEOUT, JobStatus
from dblockrun.store.status import PassedSince, StatusReport
from dblockrun.timetext import iso

#: Last-run results a check reports.
BAD_RESULTS = (FAILED, TIMEOUT, LOST)
#: What ``--allow`` may accept: the fleet's pause, a job's passed slots.
ALLOWABLE = ("paused", MISSED, SKIPPED)
#: The longest reason quoted from a passed slot's record.
WHY_SHOWN = 200


def problems(got: StatusReport, allow: Collection[str] = (),
             passed: Mapping[str, PassedSince] | None = None,
             held: str | None = None) -> list[str]:
    """One line per problem, the fleet's first, then by job name; those
    ``allow`` names (:data:`ALLOWABLE`) left out. ``passed``: the jobs whose
    slots are being recorded passed (:func:`~dblockrun.store.status.passed_since`);
    ``held``: why the lock rows are held by another session
    (:func:`~dblockrun.store.status.held_rows`)."""
    out: list[str] = []
    if not got.hosts:
        out.append(f"no live daemon: none sent {live_text(got.live_within)}, so no job "
                   "starts on schedule")
    if held is not None:
        out.append(f"{held}; every daemon's renewals, claims and bookkeeping wait on it "
                   "(end that session's transaction; docs: security.md)")
    pause = got.paused
    if pause is not None and "paused" not in allow:
        until = "until resumed" if pause.ends >= FOREVER else f"until {iso(pause.ends)}"
        why = f": {pause.reason}" if pause.reason else ""
        out.append(f"fleet paused by {pause.who} since {iso(pause.since)} "
                   f"({_ago(got.db_now - pause.since)} ago), {until}{why}; no job starts "
                   "(`dblockrun resume` ends it; --allow paused accepts it)")
    for s in got.jobs:
        if s.state == "disabled":
            continue
        last = s.last_run
        if last is not None and last.result in BAD_RESULTS:
            code = "" if last.exit_code is None else f" (exit {last.exit_code})"
            out.append(f"job {s.lock.name}: last run {last.id} {last.result}{code} on "
                       f"{last.host}, {_ago(s.db_now - last.started)} ago")
        streak = (passed or {}).get(s.lock.name)
        if streak is not None and streak.newest.result not in allow:
            # Here: croniter (with the calendars) only when slots were recorded passed.
            from dblockrun.scheduling.calendars import excluded_record

            if not excluded_record(streak.newest.output):
                out.append(f"job {s.lock.name}: {_passed(streak, s.db_now)}")
        if got.paused is None and (late := overdue(s)) is not None:
            out.append(f"job {s.lock.name}: {late}")
    return out


def _passed(streak: PassedSince, now: float) -> str:
    """Since when a job's slots are recorded passed, by whom and why."""
    newest = streak.newest
    why = (newest.output or "").strip().splitlines()
    said = why[0] if why else "no reason recorded"
    if len(said) > WHY_SHOWN:
        said = said[:WHY_SHOWN - 3] + "..."
    records = f"{streak.records} records" if streak.records > 1 else "1 record"
    return (f"its slots are recorded {newest.result} since {iso(streak.since)} "
            f"({_ago(now - streak.since)} ago, {records}), the last by {newest.host}: {said} "
            f"(--allow {newest.result} accepts it)")


def overdue(s: JobStatus) -> str | None:
    """Why the job is overdue: no start for more than twice its period
    (from the end of the pause that dropped its slot, if one did)."""
    lock = s.lock
    if lock.next_due is None or lock.last_start is None:
        return None
    period = lock.next_due - lock.last_start
    since = s.db_now - max(lock.last_start, s.resumed or lock.last_start)
    if period <= 0 or since <= 2 * period:
        return None
    return (f"has not started for {_ago(s.db_now - lock.last_start)}, more than twice its "
            f"period ({_ago(period)})")


def _ago(seconds: float) -> str:
    return format_duration(max(0, round(seconds)))
