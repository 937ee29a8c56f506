"""Catch-up after downtime: what a starting daemon does with the slots of a
job that came while no daemon ran it (the jobs file's ``catch-up`` and
``catch-up-limit``).

Defined by the database, not by this host: the slots after the job's last
slot in its lock row (the newest slot any host claimed or recorded) up to
the database clock, read for all jobs in one statement
(:meth:`Store.lock_states <dblockrun.store.store.Store.lock_states>`). So it
holds when the whole fleet was down, not only this host.

- ``latest`` (the default): the newest of them runs; the older ones are
  recorded ``missed``.
- ``none``: none runs; all are recorded ``missed``. A slot under
  :data:`FRESH` old is not missed yet (live daemons may be claiming it
  right now): it is tried like any slot.
- ``all``: the newest ``catch-up-limit`` of them run (default
  :data:`DEFAULT_LIMIT`), one at a time, oldest first, each with the normal
  slot claim (so two daemons never both run one); the older ones are
  recorded ``missed``. A cron + ``rate`` job runs one at most.

Each missed slot is recorded once fleet-wide: by the host whose conditional
``skip_slot`` advanced the job's last slot past it. Per job, the newest
:data:`RECORDED` missed slots get a record each; the older ones share one
record (its slot the newest of them, its output their count and range),
written by the host whose ``skip_range`` moved the last slot from exactly
the value read. Rate-only jobs (no slots) and fan-out jobs (their items
have their own slots) keep their behaviour: due when the last start is a
rate old, or the items of the newest slot.

The pure part (:func:`plan`) takes the times; :class:`CatchUp` reads,
records and keeps the slots still to run for the daemon.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from dblockrun.jobs import Job
from dblockrun.metrics import Metrics
from dblockrun.schedule import next_slot_at
from dblockrun.store import Store
from dblockrun.store import models as m

log = logging.getLogger("dblockrun")

#: ``catch-up: all`` without ``catch-up-limit``: at most this many missed slots run.
DEFAULT_LIMIT = 100
#: Per job and start, at most this many missed slots get a record each (the
#: newest); the older ones share one record.
RECORDED = 10
#: The shared record counts its slots up to this many (``more than ...``).
COUNTED = 100
#: Seconds: a slot younger than this at start is not missed yet, whatever the policy.
FRESH = 2.0


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


@dataclass(frozen=True)
class Older:
    """The missed slots older than those recorded one by one: one record."""

    first: float
    last: float
    count: int  # at most COUNTED
    more: bool  # there are more than COUNTED


@dataclass(frozen=True)
class Plan:
    """A job's slots that came since its last slot: those to run (oldest
    first), those recorded missed one by one (oldest first), and the older
    ones recorded together."""

    run: tuple[float, ...]
    missed: tuple[float, ...]
    older: Older | None

    @property
    def resume(self) -> float | None:
        """The newest slot this plan decides (the regular schedule goes on
        after it), None if it decides none."""
        decided = self.run or self.missed
        if decided:
            return decided[-1]
        return self.older.last if self.older is not None else None


def runs_allowed(job: Job) -> int:
    """How many missed slots the job's policy runs."""
    if job.catch_up == "none":
        return 0
    if job.catch_up == "latest" or job.rate is not None:
        return 1
    return job.catch_up_limit or DEFAULT_LIMIT


def why(job: Job, slots: str = "the slot") -> str:
    """Why ``slots`` were recorded missed at start, for their record."""
    runs = runs_allowed(job)
    if job.catch_up == "none":
        rule = "catch-up: none runs no missed slot"
    elif runs == 1:
        rule = (f"catch-up: {job.catch_up} runs only the newest missed slot"
                + (" (the job has a rate)" if job.catch_up == "all" else ""))
    else:
        rule = f"catch-up: all runs the newest {runs} missed slots"
    return f"no daemon ran the job when {slots} came; {rule}\n"


def newest_slots(job: Job, after: float, now: float, keep: int) -> list[float]:
    """The newest ``keep`` (at most) slots after ``after`` up to ``now``,
    oldest first. Looks back from ``now`` in widening windows, so the cost
    follows ``keep``, not the length of the downtime (a job every second,
    down for a week, is 600,000 slots)."""
    assert job.cron is not None
    cron, zone = job.cron, job.timezone
    if next_slot_at(cron, zone, after) > now:
        return []
    first = next_slot_at(cron, zone, now)
    span = max(next_slot_at(cron, zone, first) - first, 0.001) * (keep + 1)
    while True:
        start = max(after, now - span)
        found: deque[float] = deque(maxlen=keep)
        slot = next_slot_at(cron, zone, start)
        while slot <= now:
            found.append(slot)
            slot = next_slot_at(cron, zone, slot)
        if len(found) == keep or start == after:
            return list(found)
        span *= 4


def plan(job: Job, last_slot: float | None, now: float) -> Plan | None:
    """What to do with the job's slots after ``last_slot`` up to ``now``
    (database clock); None when there are none, or the job has no slots to
    catch up (rate-only, fan-out, or never run: nothing was missed), or
    its last slot is not in the past (a row edited by hand; `dblockrun
    unlock` repairs it)."""
    if job.cron is None or job.fan_out or last_slot is None or last_slot >= now:
        return None
    runs = runs_allowed(job)
    keep = runs + RECORDED + 1
    slots = newest_slots(job, last_slot, now, keep)
    full = len(slots) == keep
    if runs == 0 and slots and now - slots[-1] < FRESH:
        slots.pop()  # not missed yet: the regular schedule tries it
    if not slots:
        return None
    older = None
    if full:
        boundary = slots.pop(0)
        first = slot = next_slot_at(job.cron, job.timezone, last_slot)
        count = 1
        while slot < boundary and count <= COUNTED:
            count += 1
            slot = next_slot_at(job.cron, job.timezone, slot)
        older = Older(first, boundary, min(count, COUNTED), count > COUNTED)
    split = max(0, len(slots) - runs)
    return Plan(tuple(slots[split:]), tuple(slots[:split]), older)


class CatchUp:
    """A daemon's catch-up: the missed slots recorded at start, and per job
    the slots still to run (oldest first), which the daemon claims one at a
    time instead of the job's regular schedule until none is left."""

    def __init__(self, store: Store, holder: str, metrics: Metrics) -> None:
        self.store = store
        self.holder = holder
        self.metrics = metrics
        #: Per job, the missed slots still to run, oldest first.
        self.backlog: dict[str, deque[float]] = {}
        #: Per job, the slot after which its regular schedule resumes (the
        #: newest slot catch-up decided); read by the daemon's first plan.
        self.resume: dict[str, float] = {}
        #: The database time the lock rows were read at (None: not yet).
        self.checked_at: float | None = None

    def begin(self, jobs: Iterable[Job]) -> None:
        """Read every job's lock row (one statement), record the slots each
        job's policy does not run, keep the ones it runs. Raises
        :class:`~dblockrun.errors.DatabaseError`; again after a failure
        does no harm (a slot already recorded is not recorded twice)."""
        locks, now = self.store.lock_states()
        self.backlog, self.resume = {}, {}
        for job in jobs:
            lock = locks.get(job.name)
            if not job.enabled or lock is None or lock.token < 0:
                continue
            if lock.disabled_until is not None and lock.disabled_until > now:
                continue  # a disabled job's slots are not due: nothing missed
            planned = plan(job, lock.last_slot, now)
            if planned is None:
                if job.cron is not None and not job.fan_out and lock.last_slot is not None \
                        and lock.last_slot <= now:
                    self.resume[job.name] = lock.last_slot  # a slot too fresh to be missed
                continue
            assert lock.last_slot is not None
            self._record(job, lock.last_slot, planned)
            if planned.run:
                self.backlog[job.name] = deque(planned.run)
            resume = planned.resume
            if resume is not None:
                self.resume[job.name] = resume
        self.checked_at = now

    def _record(self, job: Job, last_slot: float, planned: Plan) -> None:
        text = f"missed: {why(job)}"
        older = planned.older
        total = len(planned.missed)
        if older is not None:
            total += older.count
            if self.store.skip_range(job.name, last_slot, older.last):
                count = f"{'more than ' if older.more else ''}{older.count}"
                self.store.start_run(
                    job.name, self.holder, token=None, slot=older.last, result=m.MISSED,
                    output=f"missed: {count} slots from {_utc(older.first)} to "
                           f"{_utc(older.last)}: {why(job, 'they')}")
                self.metrics.missed.labels(job.name, "missed").inc(older.count)
        for slot in planned.missed:
            if self.store.skip_slot(job.name, slot):
                self.store.start_run(job.name, self.holder, token=None, slot=slot,
                                     result=m.MISSED, output=text)
                self.metrics.missed.labels(job.name, "missed").inc()
        more = "more than " if older is not None and older.more else ""
        runs = ""
        if planned.run:
            runs = (f"running the newest {len(planned.run)}, oldest first"
                    if len(planned.run) > 1 else "running the newest")
        log.warning("job %s: %s%d %s since %s, when no daemon ran it (catch-up: %s)%s",
                    job.name, more, total + len(planned.run),
                    "slot came" if total + len(planned.run) == 1 else "slots came",
                    _utc(last_slot), job.catch_up,
                    f": {runs}" + (", the older recorded missed" if total else "")
                    if runs else ": recorded missed")

    # -- the slots still to run ----------------------------------------------

    def head(self, name: str) -> float | None:
        """The next missed slot of ``name`` to run, None: none left."""
        queue = self.backlog.get(name)
        return queue[0] if queue else None

    def done(self, name: str, upto: float) -> None:
        """The slots of ``name`` up to ``upto`` are run or taken elsewhere."""
        queue = self.backlog.get(name)
        while queue and queue[0] <= upto:
            queue.popleft()
        if not queue:
            self.backlog.pop(name, None)

    def drop(self, name: str) -> None:
        """Give up the job's catch-up (disabled, or a claim that cannot win)."""
        self.backlog.pop(name, None)

    def keep(self, names: Iterable[str]) -> None:
        """Forget the jobs not among ``names`` (a reload removed or disabled them)."""
        wanted = set(names)
        for name in [n for n in self.backlog if n not in wanted]:
            del self.backlog[name]
