"""Limits: ``daemon --max-running N`` (commands at once on one host) and
groups (``groups: {backups: 1}`` at the top, ``group: backups`` on a job: at
most that many of the group's jobs at once across the fleet).

A group of limit N has N *seat* rows in the locks table, ``group:NAME:1``
... ``group:NAME:N`` (no job can be called that: a job name has no ``:``).
A grouped job's run takes one seat once its own claim has won, with the same
conditional write (:meth:`Queries.claimable
<dblockrun.store.queries.Queries.claimable>`), lease and fencing token as a
job's lock; the heartbeat renews the seat in the statement that renews the
job's lease, and the run's end releases it. A holder that dies loses it when
its lease runs out, like any lock.

The same rows bound ``overlap: allow N`` (at most N runs of one job at
once across the fleet): the job has N *lane* rows, ``lane:JOB:1`` ...
``lane:JOB:N``. The job's own claim still decides each slot (it advances
the job's last slot: one start per slot); the run then takes a free lane
with the same seat claim, but with the token of the job's claim (a run's
fencing token stays the job's, strictly increasing; a lane taken again
fences the run that held it before), and frees the job's row at once, so
the next slot's claim does not wait for it. From then on the lane is the
run's lock: renewed by the heartbeat, read for kill requests, released at
the run's end, and found by the bookkeeping when its holder dies
(``Queries.holding``). A claim that finds every lane held is released and
its slot recorded skipped: N runs already going.

This module decides (pure: no statement); the seats and queues' I/O is
:mod:`dblockrun.running.seats`. The daemon (:mod:`dblockrun.daemon.loop`)
applies both: a host at its ``--max-running`` does not claim, and records
a slot nobody took skipped; a grouped claim that finds no free seat is
released and its slot recorded skipped, with the holders named.

Either limit can queue instead (``when-full: queue`` on a group, ``daemon
--when-full queue`` for ``--max-running``; :class:`~dblockrun.running.seats.Queues`): the slot is
claimed as usual (one start per slot) and its run *waits*: it holds the
job's lock (renewed by the heartbeat like a run's), its record says
``waiting`` and for what, and every :data:`QUEUE_POLL` it tries again. A
seat goes to the oldest waiting slot of the group across the fleet (the
waiting records, read before each try: a slot takes a seat only while
fewer slots older than it wait than seats are free); room on a host to its
oldest waiting slot. A queue is bounded: a slot that finds as many older
ones waiting is recorded skipped. A slot that waits past its job's
``starting-deadline`` is recorded missed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dblockrun.jobs import LANE_PREFIX, SEAT_PREFIX, Job, JobsFile
from dblockrun.scheduling.calendars import excluded
from dblockrun.scheduling.cron import next_slot_at
from dblockrun.scheduling.planner import SKIPPING, Cause
from dblockrun.timetext import utc

#: A seat held: (its row's name, its fencing token).
Seat = tuple[str, int]


def seat_names(group: str, limit: int) -> list[str]:
    """The seat rows of ``group``, whose limit is ``limit``."""
    return [f"{SEAT_PREFIX}{group}:{i}" for i in range(1, limit + 1)]


def lane_names(job: Job) -> list[str]:
    """The lane rows of an ``overlap: allow N`` job (none for the others)."""
    return [f"{LANE_PREFIX}{job.name}:{i}" for i in range(1, (job.allow or 0) + 1)]


def all_seats(jobs: JobsFile) -> list[str]:
    """Every seat row of the jobs file's groups and lane row of its jobs
    (made with the jobs' rows)."""
    return ([seat for group, limit in jobs.groups for seat in seat_names(group, limit)]
            + [lane for job in jobs.jobs for lane in lane_names(job)])


def full_reason(holder: str, limit: int, waited: float) -> str:
    """Why a slot was skipped by a host at its ``--max-running`` limit."""
    return (f"{holder} was at its --max-running limit ({limit}) and no other host "
            f"took the slot within {waited:g}s")


def group_reason(group: str, limit: int, holders: Sequence[tuple[str, str]]) -> str:
    """Why a grouped job's slot was skipped: every seat of its group held."""
    held = ", ".join(f"{job} on {host}" for job, host in holders)
    return f"group {group} at its limit ({limit})" + (f": held by {held}" if held else "")


def lanes_reason(job: Job, holders: Sequence[tuple[str, str]]) -> str:
    """Why an ``overlap: allow N`` job's slot was skipped: every lane held."""
    held = ", ".join(sorted(host for _job, host in holders))
    return (f"overlap: {job.overlap}: {job.allow} runs already going"
            + (f" (on {held})" if held else ""))


# -- queues (when-full: queue) ---------------------------------------------------------

#: Seconds between a waiting slot's tries for its seat or room.
QUEUE_POLL = 0.25


class Waiter(Protocol):
    """A claimed run whose slot may have to wait (dblockrun/running/runjob.py)."""

    job: Job
    slot: float | None
    #: (slot, or when claimed for a rate job's turn; arrival): older first.
    order: tuple[float, int]
    queued: bool
    wants_room: bool

    @property
    def run_id(self) -> int | None:
        """Its record (made by the claim)."""
        ...


class Room(Protocol):
    """The host's runs (dblockrun/daemon/registry.py): room for a waiting
    run, oldest slot first."""

    cap: int | None

    def admit(self, run: Waiter) -> bool: ...

    def unadmit(self, run: Waiter) -> None: ...

    def ahead(self, run: Waiter) -> int: ...


@dataclass(frozen=True)
class Go:
    """The run may start: with this seat of its group (None: no group)."""

    seat: Seat | None


@dataclass(frozen=True)
class Wait:
    """Not yet: ``reason`` (its record says it), ``ahead`` older slots
    waiting for the same; ``host``: for room on this host, else a seat."""

    reason: str
    ahead: int
    host: bool


@dataclass(frozen=True)
class Refused:
    """The slot does not run: recorded with ``cause`` and ``reason``."""

    cause: Cause
    reason: str

    @property
    def result(self) -> str:
        return "skipped" if self.cause in SKIPPING else "missed"


#: ``validate`` looks this far ahead (seconds) for jobs due together ...
CROWD_HORIZON = 7 * 86400.0
#: ... and at most this many slots of each job.
CROWD_SLOTS = 2000


def crowded(jobs: list[Job], limit: int, now: float) -> tuple[int, float, list[str]] | None:
    """How often more than ``limit`` of ``jobs`` (cron jobs; the others are
    left out) come due at one instant in the next :data:`CROWD_HORIZON`:
    (instants, the first, the jobs due together then); None: never."""
    due: dict[float, list[str]] = {}
    for job in jobs:
        if job.cron is None or not job.enabled:
            continue
        slot = now
        for _ in range(CROWD_SLOTS):
            slot = next_slot_at(job.schedule, slot)
            if slot > now + CROWD_HORIZON:
                break
            if job.calendared and excluded(job, slot) is not None:
                continue  # no run then
            due.setdefault(slot, []).append(job.name)
    over = sorted(at for at, names in due.items() if len(names) > limit)
    if not over:
        return None
    return len(over), over[0], sorted(due[over[0]])


def _named(names: list[str], shown: int = 10) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def starving(jobs: JobsFile, now: float, max_running: int | None = None) -> list[str]:
    """What ``validate`` warns of: jobs of a group (or, with
    ``max_running``, of one host) that come due together beyond its limit,
    so that all but the limit's are skipped each time (a full group skips;
    a host alone at ``--max-running`` skips what no other host takes). A
    group that queues (``when-full: queue``) starves none: not warned of."""
    out: list[str] = []
    queued = dict(jobs.group_queues)
    for group, limit in jobs.groups:
        if group in queued:
            continue
        members = [job for job in jobs.jobs if job.group == group]
        if (found := crowded(members, limit, now)) is not None:
            count, first, names = found
            out.append(f"group {group} (limit {limit}): {_named(names)} come due together "
                       f"(first at {utc(first)}; {count} time(s) within 7 days): all but "
                       f"{limit} are skipped each time; stagger their schedules or raise "
                       "the limit")
    if max_running is not None and (found := crowded(
            [job for job in jobs.jobs if not job.fan_out], max_running, now)) is not None:
        count, first, names = found
        out.append(f"--max-running {max_running}: {_named(names)} come due together (first "
                   f"at {utc(first)}; {count} time(s) within 7 days): a host alone runs "
                   f"{max_running} and skips the rest each time")
    return out
