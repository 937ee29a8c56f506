"""What a daemon plans, without a database or a clock: the agenda of due
attempts, a job's next attempt, the slots a late wake-up passed over, and the
next start a claim leaves due. Pure next to :mod:`dblockrun.schedule`: every
time is passed in (database-clock epoch seconds)."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from dblockrun.jobs import Job
from dblockrun.schedule import next_slot_at

#: At most this many slots passed over by one late wake-up are kept (the
#: newest), to be recorded missed.
MAX_PASSED = 100


@dataclass(order=True)
class Due:
    """One planned attempt: at ``fire_at``, of ``name``, for ``slot`` (None:
    a job without slots, due by its rate)."""

    fire_at: float
    seq: int
    name: str = field(compare=False)
    slot: float | None = field(compare=False)


class Agenda:
    """The attempts planned, soonest first. A job without slots has one
    pending attempt: a newer plan replaces the older one."""

    def __init__(self) -> None:
        self._heap: list[Due] = []
        self._seq = 0
        self._unslotted: dict[str, int] = {}

    def clear(self) -> None:
        """Forget every plan (a reload plans anew)."""
        self._heap = []
        self._unslotted = {}

    def push(self, fire_at: float, name: str, slot: float | None) -> None:
        self._seq += 1
        if slot is None:
            self._unslotted[name] = self._seq
        heapq.heappush(self._heap, Due(fire_at, self._seq, name, slot))

    def next_at(self) -> float | None:
        """When the soonest attempt is due (None: nothing planned)."""
        while self._heap and self._replaced(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0].fire_at if self._heap else None

    def pop_due(self, now: float) -> Due | None:
        """The soonest attempt due at ``now``, taken off the agenda."""
        while self._heap and self._heap[0].fire_at <= now:
            due = heapq.heappop(self._heap)
            if not self._replaced(due):
                return due
        return None

    def _replaced(self, due: Due) -> bool:
        return due.slot is None and self._unslotted.get(due.name) != due.seq

    def __len__(self) -> int:
        return len(self._heap)


def next_attempt(job: Job, after: float, margin: float,
                 jitter: float) -> tuple[float, float | None]:
    """(when to try, slot): a cron job's next slot strictly after ``after``,
    or for a rate-only job an attempt at ``after``; ``margin`` (the clock's
    uncertainty) and ``jitter`` later."""
    if job.cron is not None:
        slot = next_slot_at(job.cron, job.timezone, after)
        return slot + margin + jitter, slot
    return after + margin + jitter, None


def catch_up(job: Job, slot: float, now: float) -> tuple[float, deque[float]]:
    """A late wake-up (a paused host, a long claim) tries only the newest
    slot not after ``now``: (that slot, the older ones it passed over, the
    newest ``MAX_PASSED`` of them)."""
    assert job.cron is not None
    passed: deque[float] = deque(maxlen=MAX_PASSED)
    while (later := next_slot_at(job.cron, job.timezone, slot)) <= now:
        passed.append(slot)
        slot = later
    return slot, passed


def too_late(job: Job, slot: float, now: float) -> bool:
    """Past the job's starting-deadline: the slot is recorded missed."""
    return job.starting_deadline is not None and now - slot > job.starting_deadline


def next_due(job: Job, slot: float, tolerance: float) -> float:
    """The next slot a run claimed for ``slot`` leaves due (what `status`
    shows): the next one, or for a cron + rate job the first one at least
    ``rate`` later (less the claim's ``tolerance``)."""
    assert job.cron is not None
    after = slot if job.rate is None else slot + job.rate - tolerance - 0.001
    return next_slot_at(job.cron, job.timezone, after)
