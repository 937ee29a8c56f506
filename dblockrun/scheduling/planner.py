"""The slot planner: the one place that decides when a job's next attempt
is and what becomes of the slots a daemon passes. Pure: no database, no
clock; every time is database-clock epoch seconds, passed in.

Slots are passed for one of the reasons in :class:`Cause`. Whatever the
cause, they go through one policy, configured by the job's ``catch-up`` and
``starting-deadline`` (:func:`passed`):

- a slot older than ``starting-deadline`` never starts;
- of the others, ``latest`` (the default) runs the newest, ``all`` the
  newest ``catch-up-limit`` one at a time, oldest first (one with a
  ``rate``), ``none`` only one not yet :data:`FRESH` old (live daemons may be
  claiming it right now); a slot passed because the job was busy, the host
  or group full or the lock held by a dead host runs none;
- a slot due while the job runs here waits for the run's end instead with
  ``overlap: queue`` or ``replace`` (one at most: a newer one takes its
  place, and the one displaced is recorded ``skipped``, cause
  ``queue-full``);
- every slot not run ends in exactly one record: ``missed`` (``skipped``
  for the causes that run none), a row each for the newest
  :data:`RECORDED`, one summary row counting the older ones with their
  range (:class:`Summary`).

The daemon reads a job's last slot from the database whenever its plan is
in doubt (at start, after a database error, after a late wake-up) and asks
:meth:`Planner.resynced`; it records the plan through the slot book
(dblockrun/running/slotbook.py), whose conditional write makes one host the
recorder, then claims the slots to run with the normal slot claim.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, StrEnum

from dblockrun.jobs import Job
from dblockrun.scheduling.calendars import excluded, next_real_slot
from dblockrun.scheduling.cron import next_slot_at
from dblockrun.timetext import utc

log = logging.getLogger("dblockrun")

#: ``catch-up: all`` without ``catch-up-limit``: at most this many passed slots run.
DEFAULT_LIMIT = 100
#: Per plan, at most this many passed slots get a record each (the newest).
RECORDED = 10
#: A summary record counts its slots up to this many (``more than ...``).
COUNTED = 100
#: Seconds: a slot younger than this is not passed yet (``catch-up: none``).
FRESH = 2.0
#: A host at ``--max-running`` leaves a slot to the others this long, then
#: looks at it once more (dblockrun/scheduling/limits.py).
SHARE_WAIT = 0.25
#: A slot whose job's run here is winding up (its command over, its record
#: still being written, e.g. through an outage) is looked at again this
#: often instead of being skipped.
WIND_UP_WAIT = 0.2


class Cause(StrEnum):
    """Why slots were passed (a metric label and the record's reason)."""

    DOWN = "down"  # no daemon ran the job (found at start)
    OUTAGE = "outage"  # the database could not be reached
    LATE = "late"  # this daemon woke late: stopped, suspended, overloaded
    DEADLINE = "deadline"  # later than the job's starting-deadline
    BUSY = "busy"  # the job's previous run was still going
    HOST_FULL = "host-full"  # every host with room left it (--max-running)
    GROUP_FULL = "group-full"  # no free seat in the job's group
    DEAD_HOLDER = "dead-holder"  # the lock was held by a host that died
    LOCK_AT_LEAST = "lock-at-least"  # within lock-at-least of the job's last start
    LOCK_HELD = "lock-held"  # the lock held with no run (a dead host's retry or window)
    UNCLAIMABLE = "unclaimable"  # a catch-up's slots refused: the fleet paused, the job disabled
    QUEUE_FULL = "queue-full"  # overlap: queue/replace: a newer slot took its place
    STOPPED = "stopped"  # the daemon stopped while the claimed slot waited for a seat or room
    LANES_FULL = "lanes-full"  # overlap: allow N: N runs of the job already going
    DRAINED = "drained"  # an every-host job's slot on a drained host (dblockrun drain)
    EXCLUDED = "excluded"  # a calendar's day, a blackout window, outside the active range


#: Causes whose slots run none and are recorded ``skipped``.
SKIPPING = frozenset({Cause.BUSY, Cause.HOST_FULL, Cause.GROUP_FULL, Cause.DEAD_HOLDER,
                      Cause.LOCK_AT_LEAST, Cause.LOCK_HELD, Cause.UNCLAIMABLE,
                      Cause.QUEUE_FULL, Cause.STOPPED, Cause.LANES_FULL, Cause.EXCLUDED,
                      Cause.DRAINED})
#: The reason stored with catch-up slots whose claim was refused.
UNCLAIMABLE_REASON = ("catch-up stopped: the slot could not be claimed (the fleet paused, the "
                      "job disabled, its rate, or a lock row edited by hand)")


@dataclass(frozen=True)
class Summary:
    """The passed slots older than those recorded one by one: one record."""

    first: float
    last: float
    count: int  # at most COUNTED
    more: bool  # there are more than COUNTED


@dataclass(frozen=True)
class Plan:
    """What becomes of a job's passed slots: those to run (oldest first),
    those recorded one by one (oldest first), and the older ones recorded
    together; ``reason`` is stored with each record, but those of
    ``excluded``: slots of ``records`` a calendar, a blackout window or the
    active range excludes (dblockrun/scheduling/calendars.py), each
    recorded ``skipped`` with its own reason."""

    cause: Cause
    run: tuple[float, ...]
    records: tuple[float, ...]
    summary: Summary | None
    reason: str
    excluded: tuple[tuple[float, str], ...] = ()

    @property
    def result(self) -> str:
        return "skipped" if self.cause in SKIPPING else "missed"

    def of(self, slot: float) -> tuple[str, str, Cause]:
        """(result, reason, cause) of the record of ``slot``."""
        for excluded_slot, reason in self.excluded:
            if excluded_slot == slot:
                return "skipped", reason, Cause.EXCLUDED
        return self.result, self.reason, self.cause

    @property
    def first(self) -> float | None:
        """The oldest slot recorded (None: nothing to record)."""
        if self.summary is not None:
            return self.summary.first
        return self.records[0] if self.records else None

    @property
    def last(self) -> float | None:
        """The newest slot recorded (None: nothing to record)."""
        if self.records:
            return self.records[-1]
        return self.summary.last if self.summary is not None else None

    @property
    def count(self) -> int:
        """How many slots are recorded."""
        return len(self.records) + (self.summary.count if self.summary else 0)

    @property
    def resume(self) -> float | None:
        """The newest slot decided: the regular schedule goes on after it."""
        if self.run:
            return self.run[-1]
        return self.last


def single(slot: float, cause: Cause, reason: str) -> Plan:
    """One slot recorded, none run (busy, a full host or group, too late)."""
    return Plan(cause, (), (slot,), None, reason)


# -- the policy ----------------------------------------------------------------


def runs_allowed(job: Job, cause: Cause) -> int:
    """How many passed slots the job's policy runs."""
    if cause in SKIPPING or job.catch_up == "none":
        return 0
    if job.catch_up == "latest" or job.rate is not None:
        return 1
    return job.catch_up_limit or DEFAULT_LIMIT


def policy_text(job: Job) -> str:
    runs = runs_allowed(job, Cause.DOWN)
    if job.catch_up == "none":
        return "catch-up: none runs no missed slot"
    if runs == 1:
        return (f"catch-up: {job.catch_up} runs only the newest missed slot"
                + (" (the job has a rate)" if job.catch_up == "all" else ""))
    return f"catch-up: all runs the newest {runs} missed slots"


def why(job: Job, cause: Cause) -> str:
    """The reason stored with slots passed for ``cause`` (the causes that
    record a single slot give their own)."""
    what = {
        Cause.DOWN: "no daemon was running the job",
        Cause.OUTAGE: ("the database could not be reached, or another session held its lock "
                       "rows"),
        Cause.LATE: "this daemon woke late (stopped, suspended or overloaded)",
    }.get(cause, cause.value)
    deadline = (f", starting-deadline {job.starting_deadline:g}s"
                if job.starting_deadline is not None else "")
    return f"{what}; {policy_text(job)}{deadline}"


def deadline_reason(job: Job, slot: float, now: float) -> str:
    return f"{now - slot:.1f}s late, starting-deadline {job.starting_deadline:g}s"


def too_late(job: Job, slot: float, now: float) -> bool:
    """Past the job's starting-deadline: the slot never starts."""
    return job.starting_deadline is not None and now - slot > job.starting_deadline


def newest_slots(job: Job, after: float, upto: float, keep: int) -> list[float]:
    """The newest ``keep`` (at most) slots after ``after`` up to ``upto``,
    oldest first. Looks back from ``upto`` in widening windows, so the cost
    follows ``keep``, not the length of the gap (a job every second, down
    for a week, is 600,000 slots)."""
    assert job.cron is not None
    schedule = job.schedule
    if next_slot_at(schedule, after) > upto:
        return []
    first = next_slot_at(schedule, upto)
    span = max(next_slot_at(schedule, first) - first, 0.001) * (keep + 1)
    while True:
        start = max(after, upto - span)
        found: deque[float] = deque(maxlen=keep)
        slot = next_slot_at(schedule, start)
        while slot <= upto:
            found.append(slot)
            slot = next_slot_at(schedule, slot)
        if len(found) == keep or start == after:
            return list(found)
        span *= 4


def passed(job: Job, last_slot: float | None, now: float, cause: Cause, *,
           upto: float | None = None, reason: str | None = None) -> Plan | None:
    """The plan for the job's slots after ``last_slot`` up to ``upto``
    (default ``now``): None when there are none, or the job has no slots
    (rate-only, fan-out: its items have their own), or never ran
    (``last_slot`` None: nothing was passed)."""
    upto = now if upto is None else upto
    if job.cron is None or job.fan_out or last_slot is None or last_slot >= upto:
        return None
    runs = runs_allowed(job, cause)
    keep = runs + RECORDED + 1
    slots = newest_slots(job, last_slot, upto, keep)
    if not slots:
        return None
    summary = None
    if len(slots) == keep:
        boundary = slots.pop(0)
        first = slot = next_slot_at(job.schedule, last_slot)
        count = 1
        while slot < boundary and count <= COUNTED:
            count += 1
            slot = next_slot_at(job.schedule, slot)
        summary = Summary(first, boundary, min(count, COUNTED), count > COUNTED)
    marks: dict[float, str] = {}
    real = slots
    if job.calendared:  # an excluded slot never runs: recorded with its own reason
        marks = {s: exclusion.reason for s in slots
                 if (exclusion := excluded(job, s)) is not None}
        real = [s for s in slots if s not in marks]
    if cause in SKIPPING or not real:
        run: list[float] = []
    elif runs == 0:
        run = real[-1:] if now - real[-1] < FRESH else []
    else:
        run = [s for s in real[-runs:] if not too_late(job, s, now)]
    records = tuple(s for s in slots if s not in run)
    if summary is None and not records and not run:
        return None
    return Plan(cause, tuple(run), records, summary, reason or why(job, cause),
                tuple(marks.items()) if marks else ())


def record_texts(plan: Plan) -> list[tuple[float, str, int]]:
    """The records of ``plan``: (slot, stored output, slots it stands for),
    the summary first, at the newest of its slots."""
    prefix = f"{plan.result}: "
    out: list[tuple[float, str, int]] = []
    if plan.summary is not None:
        s = plan.summary
        count = f"{'more than ' if s.more else ''}{s.count}"
        out.append((s.last, f"{prefix}{count} slots from {utc(s.first)} to {utc(s.last)}: "
                            f"{plan.reason}\n", s.count))
    if not plan.excluded:
        out.extend((slot, f"{prefix}{plan.reason}\n", 1) for slot in plan.records)
        return out
    for slot in plan.records:
        result, reason, _cause = plan.of(slot)
        out.append((slot, f"{result}: {reason}\n", 1))
    return out


# -- when next -----------------------------------------------------------------


def next_attempt(job: Job, after: float, margin: float,
                 jitter: float) -> tuple[float, float | None]:
    """(when to try, slot): a cron job's next slot strictly after ``after``,
    or for a rate-only job an attempt at ``after``; ``margin`` (the clock's
    uncertainty) and ``jitter`` later."""
    if job.cron is not None:
        slot = next_slot_at(job.schedule, after)
        return slot + margin + jitter, slot
    return after + margin + jitter, None


def next_due(job: Job, slot: float, tolerance: float) -> float | None:
    """The next slot a run claimed for ``slot`` leaves due (what `status`
    shows): the next one, or for a cron + rate job the first one at least
    ``rate`` later (less the claim's ``tolerance``); of a job with
    calendars, the next one not excluded (None: none)."""
    assert job.cron is not None
    after = slot if job.rate is None else slot + job.rate - tolerance - 0.001
    if job.calendared:
        return next_real_slot(job, after)
    return next_slot_at(job.schedule, after)


def newest_due(job: Job, slot: float, now: float) -> float:
    """The newest slot not after ``now``, from ``slot`` on."""
    assert job.cron is not None
    while (later := next_slot_at(job.schedule, slot)) <= now:
        slot = later
    return slot


def rate_due(job: Job, now: float, last_start: float | None, lock_until: float | None,
             refused: bool, heartbeat: float) -> float:
    """When a rate-only job is due again: its last start a ``rate`` old (a
    last start in the future, a row edited by hand, silences it for at most
    a rate), not before a lease still held; ``refused``: its claim was just
    lost though it looked due (the fleet paused, the job disabled): not
    again before a heartbeat (or its rate)."""
    assert job.rate is not None
    due = now + job.rate
    if last_start is not None:
        due = min(last_start, now) + job.rate
        if lock_until is not None and lock_until > due:
            due = lock_until
    if refused:
        due = max(due, now + min(job.rate, heartbeat))
    return max(due, now + 0.05)


# -- the agenda ----------------------------------------------------------------


@dataclass(slots=True)
class Due:
    """One planned attempt: at ``fire_at``, of ``name``, for ``slot`` (None:
    a job without slots, due by its rate); ``resync``: first read the job's
    last slot and plan what was passed since ``since`` (the slot this
    daemon was about to try)."""

    fire_at: float
    seq: int
    name: str
    slot: float | None
    resync: Cause | None = None


class Agenda:
    """The attempts planned, soonest first. A job has one pending plan at a
    time: a newer one replaces the older (it is skipped when popped)."""

    def __init__(self) -> None:
        #: (fire_at, seq, Due): ordered by plain tuple compares (10,000 jobs
        #: due at once are 130,000 compares).
        self._heap: list[tuple[float, int, Due]] = []
        self._seq = 0
        self._current: dict[str, Due] = {}
        #: The jobs whose pending plan is a resync.
        self._resyncs: set[str] = set()

    def clear(self) -> None:
        self._heap = []
        self._current = {}
        self._resyncs = set()

    def push(self, fire_at: float, name: str, slot: float | None,
             resync: Cause | None = None) -> None:
        self._seq += 1
        due = Due(fire_at, self._seq, name, slot, resync)
        self._current[name] = due
        if resync is not None:
            self._resyncs.add(name)
        else:
            self._resyncs.discard(name)
        heapq.heappush(self._heap, (fire_at, self._seq, due))

    def next_at(self) -> float | None:
        """When the soonest attempt is due (None: nothing planned)."""
        while self._heap and self._replaced(self._heap[0][2]):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> Due | None:
        """The soonest attempt due at ``now``, taken off the agenda."""
        while self._heap and self._heap[0][0] <= now:
            due = heapq.heappop(self._heap)[2]
            if not self._replaced(due):
                del self._current[due.name]
                self._resyncs.discard(due.name)
                return due
        return None

    def planned(self, name: str) -> bool:
        return name in self._current

    def pending_slot(self, name: str) -> float | None:
        """The slot of the job's pending attempt (None: none planned, or a
        rate job's turn)."""
        due = self._current.get(name)
        return None if due is None else due.slot

    def resyncs_now(self, now: float) -> None:
        """Every pending resync planned after ``now`` (waiting for an
        outage's backoff) is due at ``now``, its slot and cause kept."""
        for name in list(self._resyncs):
            due = self._current[name]
            if due.fire_at > now:
                self.push(now, name, due.slot, due.resync)

    def resyncing(self, name: str) -> bool:
        """Whether the job's pending plan is a resync (it reads the job's
        last slot first: after an outage, a late wake-up, the start)."""
        return name in self._resyncs

    def _replaced(self, due: Due) -> bool:
        current = self._current.get(due.name)
        return current is None or current.seq != due.seq

    def __len__(self) -> int:
        return len(self._current)


# -- the decisions ---------------------------------------------------------------


class Act(Enum):
    """What to do with a due attempt."""

    CLAIM = "claim"  # claim it (a plain slot claim may go in a batch)
    RESYNC = "resync"  # read the last slot and plan the passed ones first
    RECORD = "record"  # record the plan's slot, claim nothing
    DEFER = "defer"  # at --max-running: leave it to the others, look once more
    WAIT = "wait"  # nothing now (a rate job at --max-running, a catch-up in progress)
    QUEUE = "queue"  # overlap: queue/replace: the slot waits for the run's end (the
    #                  plan: the slot it took the place of, recorded skipped)


@dataclass(frozen=True)
class Decision:
    act: Act
    slot: float | None = None
    #: CLAIM: the next slot the claim leaves due (None: rate-only);
    #: ``batch``: a plain claim of the newest slot, fit for a batch claim.
    due_next: float | None = None
    batch: bool = False
    plan: Plan | None = None
    cause: Cause | None = None


class Outcome(Enum):
    """What became of an attempt (dblockrun/daemon/firing.py makes them; the
    planner consumes them in :meth:`Planner.after`)."""

    STARTED = "started"  # won and started
    LOST = "lost"  # another host has it, or the claim was refused
    RECORDED = "recorded"  # recorded without a run: busy, too late, a full host
    AT_LIMIT = "at limit"  # --max-running: left to the other hosts for a moment
    GROUP_FULL = "group full"  # won, but no seat of its group (or lane of the job,
    #                            overlap: allow N): recorded skipped
    QUEUED = "queued"  # waits for the end of the job's run here (overlap: queue/replace)
    DB_ERROR = "database error"
    ENDED = "ended"  # its run on this host is over


@dataclass(frozen=True)
class Row:
    """A job's lock row as the planner needs it (``Planner.after`` asks for
    it): None fields for a missing row."""

    last_slot: float | None = None
    last_start: float | None = None
    lock_until: float | None = None


def held_before(job: Job, row: Row | None, now: float, cause: Cause,
                since: float | None) -> Plan | None:
    """The plan for the slots a resync after an outage or a late wake-up
    would otherwise move the job on over: those after its last slot and
    before ``since`` (the slot this daemon was about to try) that the job's
    lock kept. This daemon's claims of them lost to the lock, so it left
    them to the holder, which records each ``skipped`` as it comes (busy,
    its lock-at-least) unless it is late too: starved, stopped, cut off.
    The resync's record moves the job's last slot past them, which would
    refuse the holder's own record (conditional on the last slot being
    before the slot); so they are recorded here as the holder would,
    whichever of the two writes first."""
    if (cause not in (Cause.OUTAGE, Cause.LATE) or since is None or row is None
            or row.last_slot is None or row.lock_until is None):
        return None
    return passed(job, row.last_slot, now, Cause.BUSY,
                  upto=min(row.lock_until, since - 0.001, now),
                  reason=f"the job's lock was held (its lease until {utc(row.lock_until)}) "
                         "and its holder had not recorded the slot")


class Planner:
    """A daemon's plans: the agenda, the catch-up backlog (passed slots
    still to run, oldest first) and the slots left to other hosts at
    ``--max-running``. Every "when next" of the daemon is decided here, from
    the outcomes of its attempts (:meth:`after`)."""

    def __init__(self, heartbeat: float, tolerance: float, *, host_queue: bool = False) -> None:
        self.heartbeat = heartbeat
        #: ``--when-full queue``: a slot left to the others at ``--max-running``
        #: and taken by none is claimed here, to wait for room (else: skipped).
        self.host_queue = host_queue
        #: The claim's clock tolerance (dblockrun/store/engine.py).
        self.tolerance = tolerance
        self.agenda = Agenda()
        self.backlog: dict[str, deque[float]] = {}
        self._deferred: dict[str, float] = {}
        #: Per job with lock-at-least, its last start here and until when
        #: that holds the job (database time; at least the lock's own end).
        self._held: dict[str, tuple[float, float]] = {}
        #: Catch-up slots whose claim was refused, to record (next attempt).
        self._given_up: dict[str, Plan] = {}
        #: Per job, the catch-up slot whose claim was refused though its row,
        #: read after, showed it free: claimed once more before it is given up.
        self._refused: dict[str, float] = {}
        #: Per job with ``overlap: queue`` or ``replace``, the slot waiting
        #: for the end of its run here (at most one).
        self.queued: dict[str, float] = {}
        #: The waiting slot each job's run's end made due now.
        self._was_queued: dict[str, float] = {}

    # -- planning ------------------------------------------------------------

    def start(self, jobs: list[Job], now: float) -> None:
        """At start: every job's plan begins with its last slot in the
        database (what passed while no daemon ran it is recorded)."""
        self.clear()
        for job in jobs:
            self.resync(job, now, Cause.DOWN)

    def reload(self, jobs: list[Job], before: Callable[[str], Job | None], now: float,
               margin: float) -> None:
        """After a reload: new jobs are planned from now; a job whose
        definition changed is planned again from the slot it was about to
        try (a slot that came due while the file was read is still tried, by
        the new definition, not passed over with no record); the others keep
        their plan, and so does a changed job waiting to resync (after an
        outage or a late wake-up: the slots that passed meanwhile are still
        read and recorded, by its new definition)."""
        self.keep({job.name for job in jobs})
        for job in jobs:
            if not self.agenda.planned(job.name):
                self.regular(job, now, margin)
            elif before(job.name) != job and not self.agenda.resyncing(job.name):
                pending = self.agenda.pending_slot(job.name)
                after = now if pending is None else min(now, pending - 0.001)
                self.regular(job, after, margin)

    def clear(self) -> None:
        self.agenda.clear()
        self.backlog.clear()
        self._deferred.clear()
        self._held.clear()
        self._given_up.clear()
        self._refused.clear()
        self.queued.clear()
        self._was_queued.clear()

    def resync(self, job: Job, at: float, cause: Cause, since: float | None = None) -> None:
        """Read the job's last slot at ``at`` and plan from there."""
        self.agenda.push(at, job.name, since, cause)

    def database_back(self, now: float) -> None:
        """The database answers again (an outage is over): the jobs waiting
        to resync after a database error do it now, not when the backoff
        of their failed attempt is over. The backoff spaces the attempts
        while the database fails; once a statement gets through, the slots
        passed meanwhile are read and recorded, and the schedule goes on,
        at once (one read of the lock rows for all of them)."""
        self.agenda.resyncs_now(now)

    def regular(self, job: Job, after: float, margin: float) -> None:
        """The job's next attempt after database time ``after`` (for a job
        with a catch-up backlog: its oldest slot, now)."""
        head = self.head(job.name)
        if head is not None:
            self.agenda.push(head, job.name, head)  # passed already: due now
            return
        jitter = random.uniform(0, job.jitter) if job.jitter else 0.0
        fire_at, slot = next_attempt(job, after, margin, jitter)
        self.agenda.push(fire_at, job.name, slot)

    def resynced(self, job: Job, row: Row | None, now: float, cause: Cause,
                 since: float | None, margin: float, *, disabled: bool = False,
                 disabled_since: float | None = None) -> Plan | None:
        """The job's lock row is ``row`` (``since``: the slot this daemon was
        about to try, for an outage or a late wake-up; slots before it it was
        not trying). Returns the passed slots' plan, to record; plans the
        slots it runs, then the schedule. A disabled job's slots are not
        due: its schedule goes on from now; the slots that passed before the
        disable began (``disabled_since``, when known) are recorded, none
        run. Slots before ``since`` that the job's lock kept come first
        (:func:`held_before`): their plan is returned, and the row read again."""
        self.backlog.pop(job.name, None)
        self.queued.pop(job.name, None)  # planned again from the database
        held = held_before(job, row, now, cause, since)
        if held is not None:
            self.resync(job, now, cause, since)
            return held
        last_slot = None if row is None else row.last_slot
        floor = last_slot
        if since is not None and cause in (Cause.OUTAGE, Cause.LATE):
            floor = since - 0.001 if last_slot is None else max(last_slot, since - 0.001)
        if row is None or disabled:
            self.regular(job, max(now, since or now), margin)
            if row is None or disabled_since is None:
                return None
            before = passed(job, floor, now, cause, upto=disabled_since - 0.001,
                            reason=f"{why(job, cause).split(';')[0]}; then the job was "
                                   f"disabled ({utc(disabled_since)})")
            if before is None:
                return None
            return Plan(before.cause, (), tuple(sorted(before.records + before.run)),
                        before.summary, before.reason)
        plan = passed(job, floor, now, cause)
        if plan is not None and plan.run:
            self.backlog[job.name] = deque(plan.run)
        after = now
        if plan is not None and plan.resume is not None:
            after = plan.resume
        elif floor is not None:
            after = min(floor, now)
        self.regular(job, after, margin)
        return plan

    def not_recorded(self, job: Job, now: float, cause: Cause, since: float | None,
                     delay: float) -> None:
        """A plan's records were not written: another host handled one of
        its slots first (``delay`` 0: read again at once), or the database
        failed (after its backoff)."""
        self.backlog.pop(job.name, None)
        self.queued.pop(job.name, None)
        self.resync(job, now + max(delay, 0.05), cause, since)

    def after(self, job: Job, slot: float | None, outcome: Outcome, now: float,
              margin: float, *, delay: float = 0.0, row: Row | None = None) -> bool:
        """Plan what follows an attempt at ``slot`` (None: a rate job's
        turn) that ended in ``outcome`` at database time ``now`` (``delay``:
        the backoff of a database error, or how long a host at its limit
        leaves a slot to the others). True: the job's lock row is needed
        first; read it and call again with ``row``."""
        if outcome is Outcome.DB_ERROR:
            self.resync(job, now + delay, Cause.OUTAGE, slot)
            return False
        if outcome is Outcome.STARTED and job.lock_at_least > 0 and not job.fan_out:
            self._held[job.name] = (now, now + job.lock_at_least)
        if job.fan_out:
            if outcome is not Outcome.ENDED:
                self._fan_out(job, slot, now, margin)
            return False
        if job.cron is None:
            return self._rate(job, outcome, now, margin, row)
        if outcome is Outcome.QUEUED:
            assert slot is not None
            self.regular(job, slot, margin)  # newer slots come while it waits
            return False
        if outcome is Outcome.ENDED:
            waiting = self.queued.pop(job.name, None)
            if waiting is not None and not self.agenda.resyncing(job.name):
                self._was_queued[job.name] = waiting
                self.agenda.push(now, job.name, waiting)  # the slot that waited: now
            elif self.head(job.name) is not None:
                self.regular(job, now, margin)  # the backlog's next slot
            return False
        assert slot is not None
        if outcome is Outcome.AT_LIMIT:
            self._deferred[job.name] = slot
            self.agenda.push(now + delay, job.name, slot)
            return False
        if self.head(job.name) == slot:
            return self._backlog(job, slot, outcome, now, margin, row)
        self.regular(job, slot, margin)
        return False

    def _rate(self, job: Job, outcome: Outcome, now: float, margin: float,
              row: Row | None) -> bool:
        """A rate-only job: due when its last start is ``rate`` old (its lease
        over); the end of a run here plans it (ENDED)."""
        if outcome is Outcome.AT_LIMIT:
            self.agenda.push(now + 1.0, job.name, None)  # here or on a host with room
            return False
        if outcome is Outcome.STARTED:
            return False  # its end plans the next
        if row is None:
            return True
        due = rate_due(job, now, row.last_start, row.lock_until,
                       outcome is Outcome.LOST, self.heartbeat)
        self.agenda.push(due + margin, job.name, None)
        return False

    def _backlog(self, job: Job, slot: float, outcome: Outcome, now: float, margin: float,
                 row: Row | None) -> bool:
        """A catch-up backlog's slot: run (the next when this run ends),
        taken elsewhere (on to the next), held (try again), or unclaimable
        (the backlog is given up): refused twice with its row free each
        time. Once is no proof: the row is read after the claim, and the
        host that held the lock for the backlog's previous slot may have
        released it in between, before claiming this one (under load, two
        daemons after downtime gave up 3 of 4 slots so)."""
        if outcome is Outcome.STARTED:
            self.done(job.name, slot)
            if self.head(job.name) is None:
                self.regular(job, slot, margin)
            return False  # else: its end (ENDED) tries the next
        if outcome is not Outcome.LOST:
            self.done(job.name, slot)
            self.regular(job, slot, margin)
            return False
        if row is None:
            return True
        refused_before = self._refused.pop(job.name, None) == slot
        if row.last_slot is None and row.lock_until is None and row.last_start is None:
            self.done(job.name, slot)  # no row: nothing to catch up
        elif row.last_slot is not None and row.last_slot >= slot:
            self.done(job.name, row.last_slot)  # another host ran or recorded it
        elif row.lock_until is not None and row.lock_until > now:
            # Held: another host runs an earlier slot and tries this one when
            # it is over; try again in case it does not.
            self.agenda.push(min(now + self.heartbeat, row.lock_until) + margin, job.name, slot)
            return False
        elif not refused_before:
            # Free now: released since the claim, or refused for good (below).
            self._refused[job.name] = slot
            self.agenda.push(now, job.name, slot)
            return False
        else:
            # The fleet paused, the job disabled (or its rate, a row edited by
            # hand) since the slots were planned: they passed before, so they
            # were due, and they end in a record, not in silence.
            queue = self.backlog.pop(job.name)
            self._given_up[job.name] = Plan(Cause.UNCLAIMABLE, (), tuple(queue), None,
                                            UNCLAIMABLE_REASON)
            self.agenda.push(now, job.name, slot)
            return False
        self.regular(job, slot, margin)
        return False

    def _fan_out(self, job: Job, slot: float | None, now: float, margin: float) -> None:
        """A fan-out job's next look: its next slot, or within a fraction
        of its rate (its items come due one by one)."""
        if slot is not None:
            self.regular(job, slot, margin)
        else:
            assert job.rate is not None
            self.agenda.push(now + max(1.0, min(job.rate / 4, 30.0)), job.name, None)

    # -- deciding ------------------------------------------------------------

    def head(self, name: str) -> float | None:
        """The next backlog slot of ``name`` to run (None: none left)."""
        queue = self.backlog.get(name)
        return queue[0] if queue else None

    def done(self, name: str, upto: float) -> None:
        """The backlog slots of ``name`` up to ``upto`` are run or taken elsewhere."""
        queue = self.backlog.get(name)
        while queue and queue[0] <= upto:
            queue.popleft()
        if not queue:
            self.backlog.pop(name, None)

    def keep(self, names: set[str]) -> None:
        """Forget the plans of jobs not among ``names`` (a reload)."""
        for name in [n for n in self.backlog if n not in names]:
            del self.backlog[name]
        for name in [n for n in self._given_up if n not in names]:
            del self._given_up[name]
        for name in [n for n in self._refused if n not in names]:
            del self._refused[name]
        for name in [n for n in self.queued if n not in names]:
            del self.queued[name]

    def decide(self, job: Job, due: Due, now: float, *, busy: bool, full: bool,
               winding_up: bool = False) -> Decision:
        """What to do with an attempt due at ``now``: ``busy``, the job runs
        on this host (``winding_up``: its command is over, only its record
        is left); ``full``, this host is at ``--max-running``."""
        if due.resync is not None:
            self._given_up.pop(job.name, None)  # the resync reads them again
            return Decision(Act.RESYNC, due.slot, cause=due.resync)
        given_up = self._given_up.pop(job.name, None)
        if given_up is not None and given_up.first == due.slot:
            # Its next plan goes on after the newest of them.
            return Decision(Act.RECORD, given_up.last, plan=given_up)
        slot = due.slot
        if winding_up and slot is not None and not job.fan_out:
            # Not "previous run still going": look again once it is recorded
            # (a newer slot passing meanwhile makes this one passed).
            self.agenda.push(now + WIND_UP_WAIT, job.name, slot)
            return Decision(Act.WAIT)
        if slot is None:  # a rate job's turn: its end plans the next (Outcome.ENDED)
            return Decision(Act.WAIT if busy and not job.fan_out else Act.CLAIM)
        assert job.cron is not None
        head = self.head(job.name)
        if head is not None:  # a catch-up backlog: its oldest slot, one at a time
            if busy:
                return Decision(Act.WAIT)  # the run's end tries the next
            queue = self.backlog[job.name]
            if too_late(job, head, now):
                queue.popleft()
                if not queue:
                    del self.backlog[job.name]
                return Decision(Act.RECORD, head, plan=single(
                    head, Cause.DEADLINE, deadline_reason(job, head, now)))
            due_next = queue[1] if len(queue) > 1 else next_due(job, head, self.tolerance)
            return Decision(Act.CLAIM, head, due_next)
        waited = self._was_queued.pop(job.name, None) == slot
        if next_slot_at(job.schedule, slot) <= now and not waited:
            # (A slot that waited for a run's end (overlap: queue, replace)
            # is due now though its next slot may have come: a newer slot
            # would have taken its place, so none passed unrecorded.)
            if job.fan_out:
                slot = newest_due(job, slot, now)  # its items have their own slots
            else:
                return Decision(Act.RESYNC, slot, cause=Cause.LATE)
        if job.calendared:  # (never a fan-out job: the loader refuses it)
            exclusion = excluded(job, slot)
            if exclusion is not None:  # recorded skipped as it comes, by one host
                return Decision(Act.RECORD, slot, plan=single(
                    slot, Cause.EXCLUDED, exclusion.reason))
        if busy and not job.fan_out:
            if job.overlap != "forbid":
                return self._enqueue(job, slot)
            return Decision(Act.RECORD, slot, plan=single(
                slot, Cause.BUSY, "previous run still going"))
        held = self._held.get(job.name)
        if held is not None and now < held[1]:
            # The claim would be refused: the lock is held until then.
            return Decision(Act.RECORD, slot, plan=single(
                slot, Cause.LOCK_AT_LEAST, f"lock-at-least {job.lock_at_least:g}s after the "
                f"start at {utc(held[0])} here"))
        if too_late(job, slot, now):
            return Decision(Act.RECORD, slot, plan=single(
                slot, Cause.DEADLINE, deadline_reason(job, slot, now)))
        if full and not job.fan_out:
            if self._deferred.get(job.name) != slot:
                return Decision(Act.DEFER, slot)
            del self._deferred[job.name]
            if self.host_queue:  # its run waits for room here (scheduling/limits.py)
                return Decision(Act.CLAIM, slot, next_due(job, slot, self.tolerance))
            return Decision(Act.RECORD, slot, plan=single(slot, Cause.HOST_FULL, ""))
        deferred = self._deferred.pop(job.name, None) is not None
        return Decision(Act.CLAIM, slot, next_due(job, slot, self.tolerance),
                        batch=not job.fan_out and not deferred)

    def _enqueue(self, job: Job, slot: float) -> Decision:
        """``overlap: queue`` or ``replace``: ``slot`` waits for the end of
        the job's run here; a slot already waiting is dropped (recorded
        skipped: the newer one took its place)."""
        older = self.queued.get(job.name)
        self.queued[job.name] = slot
        plan = None
        if older is not None and older < slot:
            plan = single(older, Cause.QUEUE_FULL,
                          f"overlap: {job.overlap}: the queue holds one slot and {utc(slot)} "
                          "took its place while the previous run was still going")
        return Decision(Act.QUEUE, slot, plan=plan)
