"""``dblockrun backfill``: which of a job's passed slots run again, and why.

A slot with no run that ended ok and none running now, that the fleet has
passed (the job's last slot in the database is at or past it: no daemon
claims it any more): recorded missed or skipped (a summary record's slots
each count), whose last run failed (failed, timeout, killed, lost), or with
no record at all. Read from the store only; running them is
:mod:`dblockrun.ops.again`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dblockrun.errors import UsageError
from dblockrun.jobs import Job, JobsFile
from dblockrun.store import models as m
from dblockrun.timetext import stamp

if TYPE_CHECKING:
    from dblockrun.store.roles import StatusReading

#: What ``--only`` picks: slots recorded missed, skipped, whose last run
#: failed (failed, timeout, killed, lost), or with no record at all (a slot
#: due while the fleet was paused).
KINDS = ("missed", "skipped", "failed", "unrecorded")
#: The most slots one backfill looks at (a per-second job over a day is 86,400).
MAX_SLOTS = 10_000


@dataclass(frozen=True)
class Pending:
    """A slot a backfill runs: when, which kind of slot (:data:`KINDS`),
    its newest record (``record 3``, ``run 41 ended timeout``, ``no
    record``) and that record's id."""

    slot: float
    kind: str
    detail: str
    record: int | None

    @property
    def why(self) -> str:
        """``missed, record 3``."""
        return f"{self.kind}, {self.detail}"


@dataclass(frozen=True)
class Plan:
    """What a backfill would run, and the slots of its range it leaves alone."""

    job: Job
    first: float
    last: float
    pending: list[Pending]
    done: int  # slots with a run that ended ok
    running: int  # slots running now
    left_out: int  # slots ``--only`` leaves out
    not_passed: int  # slots the fleet has not passed yet (the daemons' still)

    def counts(self) -> str:
        """``missed 3, failed 1``."""
        kinds = [p.kind for p in self.pending]
        return ", ".join(f"{kind} {kinds.count(kind)}" for kind in KINDS if kind in kinds)


def local_job(jobs: JobsFile | None, name: str) -> Job:
    """The job ``name`` of the local jobs file: its command runs here."""
    if jobs is None:
        raise UsageError(f"no jobs file: {name}'s command comes from the local jobs file "
                         "(give -f FILE or set DBLOCKRUN_JOBS)")
    job = jobs.job(name)
    if job is None:
        raise UsageError(f"{jobs.path} has no job {name}: its command comes from the local "
                         "jobs file")
    if not job.enabled:
        raise UsageError(f"{name} has `enabled: false` in {jobs.path}")
    if job.fan_out:
        raise UsageError(f"{name} is a fan-out job (items): its slots are its items', "
                         "not run again by backfill or rerun")
    if job.every_host:
        raise UsageError(f"{name} runs on every host: backfill and rerun run a job's slot "
                         "once, not on each host")
    return job


def slots_between(job: Job, first: float, last: float) -> list[float]:
    """The job's cron slots in [``first``, ``last``], oldest first."""
    from dblockrun.scheduling.cron import next_slot_at

    if job.cron is None:
        raise UsageError(f"{job.name} has no cron schedule: only a cron job's slots can be "
                         "backfilled")
    slots: list[float] = []
    slot = next_slot_at(job.schedule, first - 1e-6)
    while slot <= last:
        if len(slots) == MAX_SLOTS:
            raise UsageError(f"{job.name} has more than {MAX_SLOTS} slots from {stamp(first)} "
                             f"to {stamp(last)}: give a shorter range")
        slots.append(slot)
        slot = next_slot_at(job.schedule, slot)
    return slots


def plan(store: StatusReading, job: Job, first: float, last: float,
         only: Sequence[str] = ()) -> Plan:
    """The slots of ``job`` in [``first``, ``last``] with no run that ended
    ok and none running now, of the kinds ``only`` (all if empty), oldest
    first; slots the fleet has not passed yet are the daemons' and left out."""
    if last < first:
        raise UsageError(f"--to {stamp(last)} is before --from {stamp(first)}")
    state = store.lock_state(job.name)
    if state is None:
        from dblockrun.ops.actions import no_such_job

        raise no_such_job(store, [job.name], " (has a daemon loaded it?)")
    passed = state.last_slot if state.last_slot is not None else float("-inf")
    slots = slots_between(job, first, last)
    newest: dict[float, m.SlotRecord] = {}
    ok: set[float] = set()
    running: set[float] = set()
    ranges: list[m.SlotRecord] = []
    for record in store.slot_records(job.name, first, last):
        if record.covers_from is not None:
            ranges.append(record)  # a summary of passed slots: each slot it covers
        if record.result == m.OK:
            ok.add(record.slot)
        elif record.result in m.UNFINISHED:
            running.add(record.slot)
        newest[record.slot] = record  # oldest first: the newest record wins
    pending: list[Pending] = []
    left_out = not_passed = 0
    for slot in slots:
        if slot in ok or slot in running:
            continue
        if slot > passed:
            not_passed += 1
            continue
        found = newest.get(slot) or next(
            (r for r in reversed(ranges) if r.covers_from is not None
             and r.covers_from <= slot <= r.slot), None)
        if found is None:
            item = Pending(slot, "unrecorded", "no record", None)
        elif found.result in m.PASSED:
            item = Pending(slot, found.result, f"record {found.id}", found.id)
        else:
            item = Pending(slot, "failed", f"run {found.id} ended {found.result}", found.id)
        if only and item.kind not in only:
            left_out += 1
            continue
        pending.append(item)
    done = sum(1 for slot in slots if slot in ok)
    run_now = sum(1 for slot in slots if slot in running and slot not in ok)
    return Plan(job, first, last, pending, done, run_now, left_out, not_passed)
