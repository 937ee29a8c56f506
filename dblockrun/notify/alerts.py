"""A job's ``expect:`` alerts: ``late`` (a slot not started within
``start-within``, or its run not finished by ``finish-by``), ``slow`` (a
run still going past ``max``), ``fast`` (a run that ended ok under
``min``), each with its recovery when the condition clears.

Every daemon that has such a job looks, on its bookkeeping thread
(dblockrun/daemon/fleet.py), once a round: one statement reads the lock
rows, running runs and open alerts of the jobs whose ``expect:`` has
``max``, ``start-within`` or ``finish-by`` (none without such jobs: a
file without ``expect:`` costs nothing), and :func:`decide`, a pure
function, says which alerts hold and which open ones cleared. Each is
claimed in the alerts ledger (dblockrun/store/alerts.py): the host whose
insert made the row, or whose update cleared it, emits the
:class:`~dblockrun.events.Alert` event (notifications and metrics
subscribe), so each is sent once across the fleet. Nothing is added to the
path of a start: ``fast`` is heard from the run's end and claimed in the
next round. An alert is seen within a bookkeeping round (1.2 heartbeats,
12 s by default) of its condition, on the database clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from dblockrun.durations import format_duration
from dblockrun.events import Alert, Event, Events, RunEnded
from dblockrun.jobs import Job, JobsFile
from dblockrun.scheduling.cron import next_slot_at
from dblockrun.store import models as m
from dblockrun.timetext import took, utc

if TYPE_CHECKING:
    from dblockrun.store.alerts import Watch
    from dblockrun.store.roles import Alerting

log = logging.getLogger("dblockrun")

LATE, SLOW, FAST = "late", "slow", "fast"


@dataclass(frozen=True)
class Found:
    """An alert whose condition holds (or, from :func:`decide`'s second
    list, an open one whose condition cleared)."""

    job: Job
    kind: str
    ref: str
    detail: str
    slot: float | None = None
    run_id: int | None = None


def finish_deadline(job: Job, slot: float) -> float:
    """The first ``finish-by`` time of day after ``slot``, in the job's zone."""
    assert job.expect is not None and job.expect.finish_by is not None
    hour, minute, *second = (int(p) for p in job.expect.finish_by.split(":"))
    zone = ZoneInfo(job.timezone)
    day = datetime.fromtimestamp(slot, zone).date()
    for add in range(3):  # a day has the time once (twice or never on a DST day)
        moment = datetime.combine(day + timedelta(days=add),
                                  time(hour, minute, second[0] if second else 0), zone)
        if moment.timestamp() > slot:
            return moment.timestamp()
    raise AssertionError("a time of day comes within two days")


def _finish_text(job: Job) -> str:
    assert job.expect is not None
    return f"{job.expect.finish_by} {job.timezone}"


def decide(jobs: Sequence[Job], seen: Watch) -> tuple[list[Found], list[Found]]:
    """(the alerts that hold and are not open yet, the open ones that cleared)."""
    from dblockrun.store.alerts import slot_ref

    now, fired, cleared = seen.now, [], []
    opened = set(seen.open)
    by_name = {job.name: job for job in jobs}
    for job in jobs:
        expect = job.expect
        assert expect is not None
        lock = seen.locks.get(job.name)
        running = seen.running.get(job.name, [])
        disabled = (not job.enabled or lock is None
                    or (lock.disabled_until is not None and lock.disabled_until > now))
        found: list[Found] = []
        if expect.max is not None:
            found += [Found(job, SLOW, f"run:{run.id}",
                            f"run {run.id} has been running for {took(now - run.started)}, "
                            f"longer than max {format_duration(expect.max)}",
                            run.slot, run.id)
                      for run in running if now - run.started >= expect.max]
        if (expect.start_within is not None and not disabled and not running
                and lock is not None and lock.last_start is not None):
            slot = next_slot_at(job.schedule, lock.last_start)
            if now - slot >= expect.start_within:
                found.append(Found(job, LATE, f"start:{slot_ref(slot)}",
                                   f"the slot {utc(slot)} has not started within "
                                   f"{format_duration(expect.start_within)}", slot))
        if expect.finish_by is not None:
            for run in running:
                if run.slot is not None and now >= finish_deadline(job, run.slot):
                    found.append(Found(job, LATE, f"finish:{slot_ref(run.slot)}",
                                       f"run {run.id} of the slot {utc(run.slot)} has not "
                                       f"finished by {_finish_text(job)}", run.slot, run.id))
            if not disabled and lock is not None and lock.last_slot is not None:
                slot = next_slot_at(job.schedule, lock.last_slot)
                if (slot <= now and now >= finish_deadline(job, slot)
                        and not any(run.slot == slot for run in running)):
                    found.append(Found(job, LATE, f"finish:{slot_ref(slot)}",
                                       f"the slot {utc(slot)} has not started, and was to "
                                       f"finish by {_finish_text(job)}", slot))
        fired += [f for f in found if (job.name, f.kind, f.ref) not in opened]
    for name, kind, ref in seen.open:
        known = by_name.get(name)
        if known is None:
            continue
        job = known
        lock = seen.locks.get(name)
        running = seen.running.get(name, [])
        what, _, value = ref.partition(":")
        if kind == SLOW and what == "run":
            if all(str(run.id) != value for run in running):
                cleared.append(Found(job, kind, ref, f"run {value} has ended",
                                     run_id=int(value)))
        elif kind == LATE and what == "start":
            slot = float(value)
            if lock is not None and lock.last_start is not None and lock.last_start > slot:
                cleared.append(Found(job, kind, ref, f"the job started at "
                                     f"{utc(lock.last_start)}", slot))
        elif kind == LATE and what == "finish":
            slot = float(value)
            if (not any(run.slot == slot for run in running) and lock is not None
                    and lock.last_slot is not None and lock.last_slot >= slot):
                cleared.append(Found(job, kind, ref, f"the slot {utc(slot)} is no longer "
                                     "running", slot))
    return fired, cleared


class Alerts:
    """One daemon's watch of its jobs' ``expect:`` (see the module)."""

    def __init__(self, store: Alerting, holder: str, jobs: Callable[[], JobsFile],
                 events: Events) -> None:
        self.store = store
        self.holder = holder
        self._jobs = jobs
        self.events = events
        self._lock = threading.Lock()
        #: Runs that ended under their ``min``, claimed in the next round.
        self._fast: list[RunEnded] = []

    def hear(self, event: Event) -> None:
        """A subscriber of the run events: a run that ended ok under its
        job's ``min`` (its last attempt) is noted for the next round."""
        if (isinstance(event, RunEnded) and event.final and event.result == m.OK
                and event.job.expect is not None and event.job.expect.min is not None
                and event.duration < event.job.expect.min):
            with self._lock:
                self._fast.append(event)

    def check(self) -> None:
        """One round: the fast runs heard, then the watched jobs' state.
        Raises :class:`~dblockrun.errors.DatabaseError` (the round is
        tried again; a fast run heard stays noted)."""
        with self._lock:
            fast = list(self._fast)
        for end in fast:
            self._fast_run(end)
            with self._lock:
                self._fast.remove(end)
        jobs = [j for j in self._jobs().jobs if j.expect is not None and j.expect.watched]
        if not jobs:
            return
        fired, cleared = decide(jobs, self.store.alerts.watch([j.name for j in jobs]))
        for found in fired:
            if self.store.alerts.claim(found.job.name, found.kind, found.ref, self.holder,
                                       detail=found.detail):
                log.warning("job %s: %s: %s", found.job.name, found.kind, found.detail,
                            extra={"job": found.job.name})
                self._emit(found, cleared=False)
        for found in cleared:
            if self.store.alerts.clear(found.job.name, found.kind, found.ref):
                detail = found.detail
                if found.kind == SLOW and found.run_id is not None:
                    run = self.store.run(found.run_id)
                    if run is not None and run.result not in m.UNFINISHED:
                        detail = (f"run {run.id} ended {run.result} after "
                                  f"{took(run.duration)}")
                log.info("job %s: %s cleared: %s", found.job.name, found.kind, detail,
                         extra={"job": found.job.name})
                self._emit(Found(found.job, found.kind, found.ref, detail, found.slot,
                                 found.run_id), cleared=True)

    def _fast_run(self, end: RunEnded) -> None:
        expect = end.job.expect
        assert expect is not None and expect.min is not None
        detail = (f"run {end.run_id} ended ok after {took(end.duration)}, sooner than min "
                  f"{format_duration(expect.min)}")
        if self.store.alerts.claim(end.job.name, FAST, f"run:{end.first_run_id}", self.holder,
                                   detail=detail, cleared=True):
            log.warning("job %s: fast: %s", end.job.name, detail, extra={"job": end.job.name})
            self._emit(Found(end.job, FAST, f"run:{end.first_run_id}", detail, end.slot,
                             end.run_id), cleared=False)

    def _emit(self, found: Found, *, cleared: bool) -> None:
        self.events.emit(Alert(job=found.job, kind=found.kind, host=self.holder,
                               detail=found.detail, cleared=cleared, slot=found.slot,
                               run_id=found.run_id))
