"""The seats and queues of :mod:`dblockrun.scheduling.limits` taken in the
database: a group's seat or an ``overlap: allow N`` job's lane for a run
(one statement; one more read only when none is free), and the queues of
``when-full: queue`` groups and ``--when-full queue`` hosts, which read the
waiting records across the fleet. The decisions and the reasons' words are
the limits module's; this one does the I/O."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dblockrun.jobs import Job, JobsFile
from dblockrun.scheduling.limits import (
    Go,
    Refused,
    Room,
    Seat,
    Wait,
    Waiter,
    group_reason,
    lane_names,
    lanes_reason,
    seat_names,
)
from dblockrun.scheduling.planner import Cause, deadline_reason, too_late

if TYPE_CHECKING:
    from dblockrun.store.runstore import FiringStore


def take_seat(store: FiringStore, jobs: JobsFile, job: Job, holder: str,
              lease: float) -> Seat | str:
    """A seat of ``job``'s group for its run (one statement), or the reason
    none is free (one more read, only then)."""
    assert job.group is not None
    limit = dict(jobs.groups)[job.group]
    got = _take(store, seat_names(job.group, limit), job, holder, lease)
    return got if not isinstance(got, list) else group_reason(job.group, limit, got)


def take_lane(store: FiringStore, job: Job, holder: str, lease: float, token: int) -> Seat | str:
    """A lane of an ``overlap: allow N`` job for the run its claim with
    ``token`` won (one statement), or the reason none is free."""
    got = _take(store, lane_names(job), job, holder, lease, token)
    return got if not isinstance(got, list) else lanes_reason(job, got)


def _take(store: FiringStore, rows: list[str], job: Job, holder: str, lease: float,
          token: int | None = None) -> Seat | list[tuple[str, str]]:
    """One of ``rows`` (seats or lanes) taken, or the (job, host) holding them."""
    got = store.claim_seat(rows, holder, lease, job.name, token)
    if got is not None:
        return got
    holders = store.seat_holders(rows)
    if not holders:
        # None held, none taken: the rows are missing (a reload that could
        # not make them, rows deleted by hand). Make them and try once more.
        store.ensure_jobs(rows)
        got = store.claim_seat(rows, holder, lease, job.name, token)
        if got is not None:
            return got
        holders = store.seat_holders(rows)
    return holders


class Queues:
    """A daemon's limits that queue: its groups with ``when-full: queue``
    (from the jobs file) and, with ``host_queue``, its ``--max-running``."""

    def __init__(self, store: FiringStore, jobs: Callable[[], JobsFile], room: Room, holder: str,
                 lease: float, now: Callable[[], float], host_queue: int | None,
                 file: Callable[[], JobsFile] | None = None) -> None:
        self.store = store
        #: The jobs this host runs, and the whole file (a group's members
        #: include the jobs other hosts run: run-on).
        self._jobs = jobs
        self._file = file or jobs
        self.room = room
        self.holder = holder
        self.lease = lease
        self._now = now
        #: ``--when-full queue``: at most this many slots wait here (None: skip).
        self.host_queue = host_queue

    def bound(self, job: Job) -> int | None:
        """The bound of the queue of ``job``'s group (None: it skips)."""
        if job.group is None:
            return None
        return dict(self._jobs().group_queues).get(job.group)

    def applies(self, job: Job) -> bool:
        """Whether a claimed run of ``job`` may wait (else: as before, a full
        group skips it and a full host does not claim). A fan-out's items and
        an ``overlap: allow N`` job's runs do not wait: they skip when full."""
        if job.fan_out or job.allow is not None:
            return False
        return self.bound(job) is not None or (
            self.host_queue is not None and self.room.cap is not None)

    def enter(self, run: Waiter) -> Go | Wait | Refused:
        """Room on this host (oldest first), then a seat of the run's group
        (oldest slot of the group first, across the fleet). Raises
        :class:`~dblockrun.errors.DatabaseError`."""
        job = run.job
        if run.slot is not None and too_late(job, run.slot, self._now()):
            return Refused(Cause.DEADLINE, "waited: " + deadline_reason(
                job, run.slot, self._now()))
        if not self.room.admit(run):
            return Wait(f"room on {self.holder} (--max-running {self.room.cap})",
                        self.room.ahead(run), host=True)
        if job.group is None:
            return Go(None)
        try:
            got = self._seat(run)
        except BaseException:
            self.room.unadmit(run)
            raise
        if not isinstance(got, Go):
            self.room.unadmit(run)
        return got

    def _seat(self, run: Waiter) -> Go | Wait | Refused:
        job = run.job
        assert job.group is not None
        if self.bound(job) is None:  # the group skips (only the host queues)
            got = take_seat(self.store, self._jobs(), job, self.holder, self.lease)
            return Refused(Cause.GROUP_FULL, got) if isinstance(got, str) else Go(got)
        limit = dict(self._jobs().groups)[job.group]
        seats = seat_names(job.group, limit)
        ahead = self.ahead(run)
        holders = self.store.seat_holders(seats)
        if ahead < limit - len(holders):
            got = take_seat(self.store, self._jobs(), job, self.holder, self.lease)
            if not isinstance(got, str):
                return Go(got)
            holders = self.store.seat_holders(seats)
        return Wait(f"a seat of {group_reason(job.group, limit, holders)}", ahead, host=False)

    def ahead(self, run: Waiter, *, older: bool = True) -> int:
        """How many slots of the run's group, older than its own (``older``
        False: any other), wait across the fleet (one statement)."""
        job = run.job
        members = sorted({j.name for j in (*self._file().jobs, *self._jobs().jobs)
                          if j.group == job.group})
        mine = (run.order[0], run.run_id or 0)
        return sum(1 for w in self.store.control.waiting(members) if w.id != run.run_id and (
            not older or (w.slot if w.slot is not None else w.started, w.id) < mine))

    def over(self, run: Waiter, wait: Wait) -> Refused | None:
        """Whether the run, waiting now (its record says so), finds its
        queue full: as many other slots waiting as it holds. The group's are
        counted again, now that its own record waits: of two slots that
        come at once, each sees the other, so the bound is never passed."""
        job = run.job
        if wait.host and self.host_queue is not None:
            if wait.ahead >= self.host_queue:
                return Refused(Cause.HOST_FULL, (
                    f"{self.holder} at its --max-running limit ({self.room.cap}) and "
                    f"{wait.ahead} slot(s) already waiting there (--queue {self.host_queue})"))
            return None
        bound = self.bound(job)
        if bound is None or job.group is None:
            return None
        ahead = self.ahead(run, older=False)
        if ahead >= bound:
            return Refused(Cause.GROUP_FULL, (
                f"group {job.group} full and {ahead} slot(s) already waiting for a seat "
                f"(queue: {bound})"))
        return None
