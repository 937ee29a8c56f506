"""The slot book: the one writer of the slots that ran nowhere.

Whatever passed a slot (:class:`~dblockrun.scheduling.planner.Cause`), its
plan is recorded here: the job's last slot advanced over them and their
records inserted, two statements whatever their number
(:meth:`LockEngine.record_slots <dblockrun.store.engine.LockEngine.record_slots>`),
one log line, and a :class:`~dblockrun.events.SlotPassed` event per record
(metrics and notifications subscribe). The write is conditional on none of
the slots being handled yet, so of the daemons that plan the same slots one
records them; the others read again and plan what is left.
"""

from __future__ import annotations

import logging

from dblockrun.events import Events, SlotPassed
from dblockrun.jobs import Job
from dblockrun.scheduling.calendars import next_real_slot
from dblockrun.scheduling.cron import next_slot_at
from dblockrun.scheduling.planner import Cause, Plan, record_texts, single
from dblockrun.store.models import Trigger
from dblockrun.store.runstore import RunStore
from dblockrun.timetext import utc

log = logging.getLogger("dblockrun")


class SlotBook:
    def __init__(self, store: RunStore, holder: str, events: Events) -> None:
        self.store = store
        self.holder = holder
        self.events = events

    def record(self, job: Job, plan: Plan, now: float, *, conditional: bool = True,
               gap_of: int | None = None) -> bool:
        """Record ``plan``'s slots (those it runs are claimed as usual);
        False when another host handled one of them first (read again).
        ``gap_of``: slots a claim moved the job on over (the claim's token;
        :meth:`LockEngine.held_gaps <dblockrun.store.engine.LockEngine.held_gaps>`),
        recorded by the one host that marks them seen.
        Raises :class:`~dblockrun.errors.DatabaseError`."""
        rows = record_texts(plan)
        if not rows:
            return True
        first = plan.first if conditional and gap_of is None else None
        summary_from = plan.summary.first if plan.summary is not None else None
        # The job's next slot, for `status` (a slot the plan runs: its claim says it).
        last = plan.last
        next_due = None
        if job.cron is not None and not plan.run and last is not None:
            next_due = (next_real_slot(job, last) if job.calendared
                        else next_slot_at(job.schedule, last))
        # Each record's result, reason and cause (a calendar's slots: their own).
        fates = ([plan.of(slot) if count == 1 else (plan.result, plan.reason, plan.cause)
                  for slot, _text, count in rows] if plan.excluded
                 else [(plan.result, plan.reason, plan.cause)] * len(rows))
        if not self.store.record_slots(job.name, self.holder, plan.result,
                                       [(slot, text, summary_from if count > 1 else None)
                                        for slot, text, count in rows], first=first,
                                       gap_of=gap_of, next_due=next_due,
                                       results=[result for result, _, _ in fates]
                                       if plan.excluded else None):
            return False
        self._log(job, plan)
        for (slot, _text, count), (result, reason, cause) in zip(rows, fates, strict=True):
            self.events.emit(SlotPassed(
                job=job, host=self.holder, slot=slot, result=result, reason=reason,
                cause=cause.value, late=now - slot, count=count,
                first=plan.summary.first if count > 1 and plan.summary else None))
        return True

    def claimed(self, job: Job, plan: Plan, token: int, run_id: int | None,
                now: float) -> None:
        """A slot this host claimed but cannot run (no free seat in its
        group): its claim's record ends ``skipped`` with the reason and the
        lock is released, in one round trip where the claim made the record."""
        (slot, text, _count), = record_texts(plan)
        if run_id is not None:
            self.store.finish_and_release(run_id, job.name, self.holder, token, plan.result,
                                          None, text)
        else:
            self.store.release(job.name, self.holder, token)
            self.store.start_run(job.name, self.holder, token=token, slot=slot,
                                 result=plan.result, output=text)
        self._log(job, plan)
        self.events.emit(SlotPassed(job=job, host=self.holder, slot=slot, result=plan.result,
                                    reason=plan.reason, cause=plan.cause.value,
                                    late=now - slot))

    def trigger_passed(self, job: Job, trigger: Trigger, cause: Cause, reason: str,
                       now: float) -> bool:
        """A trigger of ``job`` (``after:``, dblockrun/daemon/chains.py)
        that starts no run (the job disabled, the fleet paused, the job
        still running with overlap: forbid): its one record, with the
        reason and the upstream run, the trigger taken in the same
        transaction; False when another host took it first."""
        plan = single(trigger.ended, cause, reason)
        (_slot, text, _count), = record_texts(plan)
        if self.store.record_trigger(trigger, self.holder, plan.result, text) is None:
            return False
        log.warning("job %s: the run after %s run %d %s: %s", job.name, trigger.upstream_job,
                    trigger.upstream_run, plan.result, reason)
        self.events.emit(SlotPassed(job=job, host=self.holder, slot=trigger.ended,
                                    result=plan.result, reason=reason, cause=cause.value,
                                    late=now - trigger.ended))
        return True

    def _log(self, job: Job, plan: Plan) -> None:
        count, last = plan.count, plan.last
        assert last is not None
        more = "more than " if plan.summary is not None and plan.summary.more else ""
        if count == 1:
            what = f"slot {utc(last)} {plan.result}"
        else:
            first = plan.first
            assert first is not None
            what = f"{more}{count} slots from {utc(first)} to {utc(last)} {plan.result}"
        runs = ""
        if plan.run:
            runs = (f"; running the newest {len(plan.run)}, oldest first" if len(plan.run) > 1
                    else "; running the newest")
        excluded = (f" ({len(plan.excluded)} of them excluded: "
                    f"{', '.join(sorted({reason for _, reason in plan.excluded}))})"
                    if plan.excluded else "")
        # A slot a calendar excludes is what the file asks for, not a warning.
        level = logging.INFO if plan.cause is Cause.EXCLUDED else logging.WARNING
        log.log(level, "job %s: %s: %s%s%s", job.name, what, plan.reason, excluded, runs)
