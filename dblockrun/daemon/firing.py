"""The daemon's attempts: for each due attempt the planner decides, this
claims (alone or in a batch), records through the slot book, reads the
database when the plan is in doubt, and starts the runs won. Every attempt
ends in an :class:`Outcome` the planner consumes (dblockrun/scheduling/planner.py); no
"when next" is decided here."""

from __future__ import annotations

import itertools
import logging
import random
import time
from dataclasses import replace

from dblockrun.daemon.chains import Chains
from dblockrun.daemon.drain import DRAINED_REASON
from dblockrun.daemon.fleet import FleetBooks
from dblockrun.daemon.halts import halted
from dblockrun.daemon.state import DaemonState
from dblockrun.errors import DatabaseError
from dblockrun.jobs import Job
from dblockrun.running.runjob import JobRun, RunContext
from dblockrun.running.seats import Queues, take_lane, take_seat
from dblockrun.scheduling.limits import Go, Refused, Seat, full_reason
from dblockrun.scheduling.planner import (
    SHARE_WAIT,
    Act,
    Cause,
    Decision,
    Outcome,
    Planner,
    Row,
    single,
)
from dblockrun.store import models as m
from dblockrun.store.models import Claimed, Trigger
from dblockrun.store.runstore import FiringStore
from dblockrun.timetext import utc

log = logging.getLogger("dblockrun")

#: The longest a host busy starting its share of a burst waits before it
#: claims what the others left (seconds after its first claim).
BUSY_WAIT = 3.0
#: How often it looks meanwhile whether its workers have begun its share.
LOOK_BACK = 0.05


class Firing:
    """A daemon's attempts (see the module); what it shares with the
    daemon's other parts it reads from ``state`` (dblockrun/daemon/state.py)."""

    def __init__(self, state: DaemonState, planner: Planner, ctx: RunContext,
                 books: FleetBooks, queues: Queues | None = None,
                 chains: Chains | None = None) -> None:
        #: What the attempts ask of the store (the daemon's is a Store).
        self.store: FiringStore = state.store
        self.s = state.settings
        self.clock = state.clock
        self.outage = state.outage
        self.metrics = state.metrics
        self.planner = planner
        self.runs = state.runs
        self.book = state.book
        self.ctx = ctx
        self.books = books
        # (bound methods: each call reads the state's current value)
        self._jobs = state.jobs
        self._stopping = state.stopping
        self._pause = state.pause
        #: The limits that queue (groups with when-full: queue, --when-full queue).
        self.queues = queues
        #: Arrivals, to order the slots that wait for the same instant.
        self._arrivals = itertools.count()
        #: Per job, the highest fencing token won here and the newest slot run here.
        self._seen: dict[str, tuple[int, float | None]] = {}
        #: The jobs whose run here was asked to stop for a newer slot (overlap: replace).
        self._replacing: set[str] = set()
        #: Job chains (after:): the triggers this host makes and takes.
        self.chains = chains
        #: The runs a batch's claim started, while :meth:`_fire_batch` collects them.
        self._batch_runs: list[JobRun] | None = None
        #: This host's drain (dblockrun drain): no claim is tried while it lasts.
        self.drain = state.drain
        #: The outages over (``Outage.ended``) the planner was told of.
        self._outages_over = state.outage.ended

    @property
    def margin(self) -> float:
        return self.clock.uncertainty + 0.001

    # -- the due attempts ----------------------------------------------------------

    def fire_due(self) -> None:
        ended = self.outage.ended
        if ended != self._outages_over:
            # The database is back (any thread's statement got through, which
            # woke the loop): the resyncs waiting for the backoff are due now.
            self._outages_over = ended
            self.planner.database_back(self.clock.now())
        batch: list[tuple[Job, float, float]] = []
        resync: list[tuple[Job, Cause, float | None]] = []
        while not self._stopping():
            now = self.clock.now()
            due = self.planner.agenda.pop_due(now)
            if due is None:
                break
            job = self._jobs().job(due.name)
            if job is None or not job.enabled:
                continue
            full = self.runs.full()
            # overlap: allow N: a run here does not hold the next slot back
            # (its claim, then a free lane, decides).
            alongside = job.allow is not None
            decision = self.planner.decide(
                job, due, now, busy=not alongside and self.runs.busy(job.name), full=full,
                winding_up=not alongside and self.runs.winding_up(job.name))
            if decision.act is Act.RESYNC:
                assert decision.cause is not None
                resync.append((job, decision.cause, decision.slot))
            elif decision.act is Act.CLAIM and decision.batch and not self._drained():
                assert decision.slot is not None and decision.due_next is not None
                batch.append((job, decision.slot, decision.due_next))
            else:
                self._act(job, decision, now)
        if resync:
            self.resync(resync)
        if len(batch) == 1:
            job, slot, due_next = batch[0]
            self._act(job, Decision(Act.CLAIM, slot, due_next), self.clock.now())
        elif batch:
            self._fire_batch(batch)

    def _act(self, job: Job, decision: Decision, now: float) -> None:
        """Carry out ``decision`` and plan what follows from its outcome."""
        slot, delay = decision.slot, 0.0
        if decision.act is Act.WAIT:
            return
        if decision.act is Act.DEFER:
            outcome, delay = Outcome.AT_LIMIT, SHARE_WAIT
        elif decision.act is Act.RECORD:
            outcome, delay = self._record(job, decision)
        elif decision.act is Act.QUEUE:
            outcome, delay = self._queue(job, decision)
        elif self._drained():
            outcome, delay = self._left(job, slot)
        elif job.fan_out:
            outcome = self._fan_out(job, slot, decision.due_next)
        elif slot is None and self.runs.full():
            outcome = Outcome.AT_LIMIT
        else:
            outcome, delay = self._claim(job, slot, decision.due_next)
        self._after(job, slot, outcome, delay)

    def _after(self, job: Job, slot: float | None, outcome: Outcome, delay: float = 0.0) -> None:
        """Hand the outcome to the planner; read the job's row if it asks."""
        if not self.planner.after(job, slot, outcome, self.clock.now(), self.margin,
                                  delay=delay):
            return
        try:
            lock = self.store.lock_state(job.name)
            self.outage.ok()
        except DatabaseError as exc:
            delay = self.outage.failed(f"read {job.name}", exc)
            self.planner.after(job, slot, Outcome.DB_ERROR, self.clock.now(), self.margin,
                               delay=delay)
            return
        row = Row() if lock is None else Row(lock.last_slot, lock.last_start, lock.lock_until)
        self.planner.after(job, slot, outcome, self.clock.now(), self.margin, row=row)

    def _record(self, job: Job, decision: Decision) -> tuple[Outcome, float]:
        """Record the decision's slot through the slot book."""
        assert decision.plan is not None
        plan = decision.plan
        if plan.cause is Cause.HOST_FULL:
            plan = replace(plan, reason=full_reason(self.s.holder, self.runs.cap or 0,
                                                     SHARE_WAIT))
        try:
            self.book.record(job, plan, self.clock.now())
            self.outage.ok()
        except DatabaseError as exc:
            return self._failed(job, exc, f"record {job.name}")
        return Outcome.RECORDED, 0.0

    def _queue(self, job: Job, decision: Decision) -> tuple[Outcome, float]:
        """``overlap: queue`` or ``replace``: the slot waits for the end of
        the job's run here (the planner holds it); the slot it took the
        place of is recorded skipped; ``replace`` asks the run to stop,
        through the kill request every holder reads with its renewal."""
        assert decision.slot is not None
        if decision.plan is not None:
            outcome, delay = self._record(job, decision)
            if outcome is Outcome.DB_ERROR:
                return outcome, delay
        if job.overlap == "replace" and job.name not in self._replacing:
            try:
                mine = [run for run in self.store.control.running(job.name)
                        if run.host == self.s.holder]
                asked = self.store.control.kill(
                    mine, self.s.holder, f"replaced by the slot {utc(decision.slot)} "
                    "(overlap: replace)") if mine else []
                self.outage.ok()
            except DatabaseError as exc:
                return self._failed(job, exc, f"stop {job.name} to replace it")
            if asked:
                self._replacing.add(job.name)
                log.info("job %s: stopping run %s to start the slot %s (overlap: replace)",
                         job.name, ", ".join(str(run.id) for run in asked),
                         utc(decision.slot), extra={"job": job.name})
        return Outcome.QUEUED, 0.0

    def _claim(self, job: Job, slot: float | None,
               due_next: float | None) -> tuple[Outcome, float]:
        """Claim ``slot`` (None: a rate-only job's turn) with its first
        attempt's record, and start the run won."""
        sent = time.monotonic()
        try:
            won = self.store.claim_and_record(job.name, self.s.holder, self.s.lease,
                                              slot=slot, rate=job.claim_spacing,
                                              next_due=due_next)
            self.outage.ok()
        except DatabaseError as exc:
            return self._failed(job, exc, f"claim {job.name}")
        if won is None:
            return self._lost(job, slot)
        self.metrics.claimed(job.name, "won")
        return self._start(job, won.token, slot, sent, won.run_id), 0.0

    def _lost(self, job: Job, slot: float | None) -> tuple[Outcome, float]:
        """A claim of ``job`` refused, alone or in a batch: another host won
        it, or for an every-host row (which no other host claims), why is
        read (:meth:`_refused`)."""
        self.metrics.claimed(job.name, "lost")
        if job.every_host:
            refused = self._refused(job, slot)
            if refused is not None:
                return refused
        return Outcome.LOST, 0.0

    def _refused(self, job: Job, slot: float | None) -> tuple[Outcome, float] | None:
        """An every-host row's claim refused: no other host claims the row,
        so why is read (a statement or two, only then; the claim predicate
        knew first). This host drained since it last read: the slot is left
        (:meth:`_left`). The fleet paused, or the job disabled, after the
        slot came due (it landed between the slot's decision and its
        claim): the slot is recorded ``skipped``, as every slot due outside
        a pause or disable gets a record (docs/fleet.md). None: a slot that
        came due while paused or disabled (not due: no record), or a row
        held (the job's previous run)."""
        if self.drain is not None:
            self.drain.told()
            self.drain.refresh()
            if self._drained():
                return self._left(job, slot)
        if slot is None:
            return None
        try:
            halt = halted(self.store, job.name, self.clock.now(), since=True)
            self.outage.ok()
        except DatabaseError as exc:
            return self._failed(job, exc, f"read why the claim of {job.name} was refused")
        if halt is None or halt.since is None or halt.since <= slot:
            return None
        why = ("the fleet was paused before its claim" if halt.job is None
               else f"{halt.job} was disabled before its claim")
        return self._record(job, Decision(Act.RECORD, slot, None,
                                          plan=single(slot, Cause.UNCLAIMABLE, why)))

    def _drained(self) -> bool:
        return self.drain is not None and self.drain.drained() is not None

    def _left(self, job: Job, slot: float | None) -> tuple[Outcome, float]:
        """This host is drained: a slot of an every-host job (run nowhere
        else) is recorded ``skipped: host drained`` through the slot book;
        any other is left to the other hosts (a rate job's turn looked at
        again in a second, when the drain may be over)."""
        if slot is None:
            return Outcome.AT_LIMIT, 1.0
        if not job.every_host:
            return Outcome.RECORDED, 0.0  # the other hosts claim it
        return self._record(job, Decision(Act.RECORD, slot, None,
                                          plan=single(slot, Cause.DRAINED, DRAINED_REASON)))

    def _failed(self, job: Job, exc: DatabaseError, what: str) -> tuple[Outcome, float]:
        """An attempt the database failed: counted; after the outage's
        backoff the job's last slot is read again and what passed planned."""
        self.metrics.claimed(job.name, "error")
        return Outcome.DB_ERROR, self.outage.failed(what, exc)

    def _fire_batch(self, batch: list[tuple[Job, float, float]]) -> None:
        """Many jobs due at once: claim them in few statements, this host's
        share first so the work spreads over the fleet, then whatever no
        other host took: a moment later, and once its workers have begun
        its share (:meth:`_until_begun`)."""
        groups: dict[tuple[float, float, float | None], list[Job]] = {}
        for job, slot, due_next in batch:
            groups.setdefault((slot, due_next, job.claim_spacing), []).append(job)
        for (slot, due_next, rate), jobs in groups.items():
            by_name = {job.name: job for job in jobs}
            outcomes: dict[str, tuple[Outcome, float]] = {}
            pending = list(by_name)
            random.shuffle(pending)
            hosts = self.books.serving_hosts  # a drained host claims none
            share = len(pending) if len(pending) < 4 * hosts else -(-len(pending) // hosts)
            first = time.monotonic()
            runs: list[JobRun] = []
            capped = False  # --max-running held this host back in the last pass
            for look, limit in enumerate((share, len(pending))):
                if not pending or self._stopping():
                    break
                if limit != share:
                    self._pause(first + SHARE_WAIT - time.monotonic())
                    self._until_begun(first, runs)
                free = self.runs.free()
                take = limit if free is None else min(limit, free)
                capped = take < limit
                if take <= 0:
                    continue
                sent = time.monotonic()
                try:
                    # The second look waits for the rows other hosts are
                    # still claiming: a claim whose host dies before its
                    # commit rolls back, and the slot is left to this one.
                    won = self.store.claim_batch(pending, self.s.holder, self.s.lease,
                                                 slot=slot, next_due=due_next, rate=rate,
                                                 limit=take, wait=look == 1)
                    self.outage.ok()
                except DatabaseError as exc:
                    delay = self.outage.failed(f"claim {len(pending)} jobs", exc)
                    for name in pending:
                        self.metrics.claimed(name, "error")
                        outcomes[name] = (Outcome.DB_ERROR, delay)
                    pending = []
                    break
                self._batch_runs = runs
                try:
                    for claimed in won:
                        self.metrics.claimed(claimed.name, "won")
                        outcomes[claimed.name] = (self._start(
                            by_name[claimed.name], claimed.token, slot, sent, claimed.run_id),
                            0.0)
                finally:
                    self._batch_runs = None
                taken = {c.name for c in won}
                pending = [name for name in pending if name not in taken]
            look_again = max(0.0, first + SHARE_WAIT - time.monotonic())
            for name in pending:
                if capped:  # left to the other hosts: looked at once more
                    outcomes[name] = (Outcome.AT_LIMIT, look_again)
                else:
                    outcomes[name] = self._lost(by_name[name], slot)
            for job in jobs:
                outcome, delay = outcomes.get(job.name, (Outcome.LOST, 0.0))
                self._after(job, slot, outcome, delay)

    def _until_begun(self, first: float, runs: list[JobRun]) -> None:
        """Wait (at most BUSY_WAIT from ``first``) until a worker has begun
        each of ``runs``, this host's share of a burst: a host late to the
        burst (deciding it on a busy machine) claims its own share
        meanwhile, and this one loses no time (its workers are busy until
        then). The main loop waits with it, as it does for SHARE_WAIT."""
        deadline = first + BUSY_WAIT
        seen = 0  # runs[:seen] have begun (workers take them about in order)
        while not self._stopping() and (left := deadline - time.monotonic()) > 0:
            while seen < len(runs) and runs[seen].begun:
                seen += 1
            if seen == len(runs):
                return
            self._pause(min(LOOK_BACK, left))

    # -- plans in doubt --------------------------------------------------------------

    def resync(self, wanted: list[tuple[Job, Cause, float | None]]) -> None:
        """Read the last slot of each job in ``wanted`` (one statement) and
        record what its plan does not run; on a database error all are read
        again after the backoff."""
        now = self.clock.now()
        try:
            if len(wanted) == 1:
                lock = self.store.lock_state(wanted[0][0].name)
                locks = {} if lock is None else {lock.name: lock}
            else:
                locks, now = self.store.lock_states()
            self.outage.ok()
        except DatabaseError as exc:
            delay = self.outage.failed("read the lock rows", exc)
            for job, cause, since in wanted:
                self.planner.not_recorded(job, self.clock.now(), cause, since, delay)
            return
        for job, cause, since in wanted:
            lock = locks.get(job.name)
            disabled = lock is not None and lock.disabled_at(now)
            row = None if lock is None else Row(lock.last_slot, lock.last_start, lock.lock_until)
            began = None
            if disabled:
                # The slots that passed before the disable began are recorded:
                # after an outage, a late wake-up, and at start (the fleet, or
                # an every-host row's own host, was down before the disable).
                try:
                    began = self.store.disabled_since(job.name, now)
                except DatabaseError as exc:
                    self.outage.failed(f"read when {job.name} was disabled", exc)
            plan = self.planner.resynced(job, row, now, cause, since, self.margin,
                                         disabled=disabled, disabled_since=began)
            if plan is None:
                continue
            try:
                recorded = self.book.record(job, plan, now)
                self.outage.ok()
            except DatabaseError as exc:
                delay = self.outage.failed(f"record the passed slots of {job.name}", exc)
                self.planner.not_recorded(job, self.clock.now(), cause, since, delay)
                continue
            if not recorded:  # another host recorded or ran some first: read again
                self.planner.not_recorded(job, self.clock.now(), cause, since, 0.0)

    def finished(self) -> None:
        """Plan again the jobs whose run just ended: a backlog's next slot, a
        rate-only job's next start (its lease is over now)."""
        for name in self.runs.finished():
            self._replacing.discard(name)
            job = self._jobs().job(name)
            if job is not None and job.enabled and job.scheduled:
                self._after(job, None, Outcome.ENDED)
        for name, run_id in self.runs.ended_runs():
            if self.chains is not None:
                self.chains.ended(name, run_id)

    # -- job chains (after:) ------------------------------------------------------------

    def chained(self) -> None:
        """Make and take the triggers of job chains (dblockrun/daemon/chains.py)."""
        if self.chains is None or self._stopping() or self._drained():
            return  # (drained: the other hosts take the triggers)
        self.chains.look(self._triggered, self.runs.busy, self.runs.full)

    def _triggered(self, job: Job, trigger: Trigger, won: Claimed) -> Outcome:
        """A trigger's claim won: its run starts as a slot's does."""
        self.metrics.claimed(job.name, "won")
        return self._start(job, won.token, None, time.monotonic(), won.run_id, upstream=trigger)

    # -- run-now requests -----------------------------------------------------------

    def requested(self, names: list[str]) -> None:
        """Run the jobs an operator asked for with `dblockrun run JOB`
        (enabled jobs of the local file; fan-out jobs follow their items)."""
        if self._drained():
            return  # the request stays for another host
        for name in names:
            job = self._jobs().job(name)
            if job is None or not job.enabled or job.fan_out or (
                    job.allow is None and self.runs.busy(name)):
                continue
            if self.runs.full():
                continue  # the request stays for a host with room
            sent = time.monotonic()
            token = self.store.claim_requested(name, self.s.holder, self.s.lease)
            if token is not None:
                log.info("job %s: run requested by an operator", name)
                self._start(job, token, None, sent)

    # -- starting -------------------------------------------------------------------

    def _start(self, job: Job, token: int, slot: float | None, claimed_mono: float,
               run_id: int | None = None, upstream: Trigger | None = None) -> Outcome:
        if self._went_back(job, token, slot, run_id):
            return Outcome.RECORDED
        if job.allow is None and self.queues is not None and self.queues.applies(job):
            return self._start_queued(self.queues, job, token, slot, claimed_mono, run_id,
                                      upstream)
        lane = seat = None
        if job.allow is not None:
            lane = self._seat(job, token, slot, run_id, lane=True)
            if lane is None:
                return Outcome.GROUP_FULL
        if job.group is not None:
            seat = self._seat(job, token, slot, run_id)
            if seat is None:
                if lane is not None:
                    self._free_lane(lane)
                return Outcome.GROUP_FULL
        if lane is not None:
            self._free_job_row(job, token)
        run = JobRun(self.ctx, job, token, slot, claimed_mono, on_done=self.runs.done,
                     run_id=run_id, seat=seat, lane=lane, upstream=upstream)
        self.runs.add(run)
        run.start()
        if self._batch_runs is not None:
            self._batch_runs.append(run)
        return Outcome.STARTED

    def _start_queued(self, queues: Queues, job: Job, token: int, slot: float | None,
                      claimed_mono: float, run_id: int | None,
                      upstream: Trigger | None = None) -> Outcome:
        """A run whose slot may wait (dblockrun/scheduling/limits.py): it
        starts if its seat (or room) is free and no older slot waits for it;
        else its record says ``waiting`` and it tries again, unless its
        queue is full (recorded skipped, as a full group or host skips)."""
        now = self.clock.now()
        if run_id is None:  # a run-now request: its record first
            try:
                run_id = self.store.start_run(job.name, self.s.holder, token=token, slot=slot)
                self.outage.ok()
            except DatabaseError as exc:  # its lease runs out; the claim is over
                self.outage.failed(f"record {job.name}", exc)
                return Outcome.RECORDED
        run = JobRun(self.ctx, job, token, slot, claimed_mono, on_done=self.runs.done,
                     run_id=run_id, queue=queues,
                     order=(slot if slot is not None else now, next(self._arrivals)),
                     upstream=upstream)
        self.runs.add(run)  # it counts no command while it waits
        try:
            got = queues.enter(run)
            if not isinstance(got, Go | Refused):
                self.store.run_waits(run_id, got.reason)
                got = queues.over(run, got) or got
            self.outage.ok()
        except DatabaseError as exc:
            what = f"a seat of group {job.group}" if job.group else "room for the slot"
            self.outage.failed(f"find {what} for {job.name}", exc)
            got = Refused(Cause.GROUP_FULL if job.group else Cause.HOST_FULL,
                          f"could not find {what}: database error")
        if isinstance(got, Go):
            run.watch.seat = got.seat
            run.start()
            return Outcome.STARTED
        if isinstance(got, Refused):
            self.runs.drop(run)
            try:
                self.book.claimed(job, single(slot or now, got.cause, got.reason), token,
                                  run_id, self.clock.now())
            except DatabaseError as exc:  # its lease runs out; the run is recorded lost
                self.outage.failed(f"release {job.name}", exc)
            return Outcome.GROUP_FULL
        log.info("job %s: slot %s waits for %s (%d ahead)", job.name,
                 utc(slot) if slot is not None else "-", got.reason, got.ahead,
                 extra={"job": job.name})
        run.wait(got.reason)
        return Outcome.STARTED

    def _seat(self, job: Job, token: int, slot: float | None,
              run_id: int | None, *, lane: bool = False) -> Seat | None:
        """A grouped job's claim won: take a seat of its group too (one more
        round trip); ``lane``: an ``overlap: allow N`` job's, a lane of the
        job. With none free (or the database failing), the claim is
        released and its slot recorded skipped with the reason (it is taken,
        so no host runs it late)."""
        what = f"a lane of {job.name}" if lane else f"a seat of group {job.group}"
        try:
            got = (take_lane(self.store, job, self.s.holder, self.s.lease, token) if lane else
                   take_seat(self.store, self._jobs(), job, self.s.holder, self.s.lease))
            self.outage.ok()
        except DatabaseError as exc:
            self.outage.failed(f"claim {what}", exc)
            got = f"could not take {what}: database error"
        if not isinstance(got, str):
            return got
        cause = Cause.LANES_FULL if lane else Cause.GROUP_FULL
        try:
            self.book.claimed(job, single(slot or self.clock.now(), cause, got),
                              token, run_id, self.clock.now())
        except DatabaseError as exc:  # its lease runs out; the run is recorded lost
            self.outage.failed(f"release {job.name}", exc)
        return None

    def _free_lane(self, lane: Seat) -> None:
        """A lane taken for a run that cannot start (its group is full)."""
        try:
            self.store.release_seat(lane, self.s.holder)
        except DatabaseError as exc:  # its lease runs out
            self.outage.failed(f"release {lane[0]}", exc)

    def _free_job_row(self, job: Job, token: int) -> None:
        """``overlap: allow N``: the run holds its lane from now on; the job's
        row is freed (after its lock-at-least) for the next slot's claim."""
        try:
            self.store.release(job.name, self.s.holder, token, job.lock_at_least)
        except DatabaseError as exc:  # its lease runs out: the next claims wait that long
            self.outage.failed(f"release {job.name}", exc)

    def _went_back(self, job: Job, token: int, slot: float | None,
                   run_id: int | None) -> bool:
        """Whether the database lost writes this daemon saw committed (a
        failover to a standby that had not received them): a fencing token
        no higher than one it already won, or a slot it already ran. Either
        is logged and counted; a slot already run here is not run again (its
        claim is recorded skipped and released)."""
        seen_token, seen_slot = self._seen.get(job.name, (0, None))
        again = slot is not None and seen_slot is not None and slot <= seen_slot
        if token > seen_token and not again:
            self._seen[job.name] = (token, slot if slot is not None else seen_slot)
            return False
        self.metrics.went_backwards(job.name)
        log.error("job %s: the database went backwards (token %d after %d, last slot %s after "
                  "%s this daemon ran): it lost committed writes, e.g. in a failover to an "
                  "asynchronous standby%s", job.name, token, seen_token,
                  utc(slot) if slot is not None else "-",
                  utc(seen_slot) if seen_slot is not None else "-",
                  "; not running that slot again" if again else "")
        self._seen[job.name] = (token, seen_slot)  # the database's sequence from here on
        if not again:
            return False
        try:
            if run_id is not None:
                self.store.finish_and_release(run_id, job.name, self.s.holder, token, m.SKIPPED,
                                              None, "not run: this daemon already ran the slot")
            else:
                self.store.release(job.name, self.s.holder, token)
        except DatabaseError as exc:
            self.outage.failed(f"release {job.name}", exc)
        return True

    def _fan_out(self, job: Job, slot: float | None, due_next: float | None) -> Outcome:
        """Work through the job's items unless still at it."""
        if self.runs.busy(job.name):
            log.info("job %s: still working through the items of the previous slot", job.name)
            return Outcome.LOST
        if self.runs.full():
            log.info("job %s: at --max-running: its items are left to the other hosts", job.name)
            return Outcome.AT_LIMIT
        # Imported here: a daemon keeps every module it imports, and most
        # daemons have no job with items (issue 33 item 4).
        from dblockrun.running.fanout import FanOut

        worker = FanOut(self.ctx, job, slot, on_done=self.runs.done, next_due=due_next,
                        room=self.runs.free)
        self.runs.add(worker)
        worker.start()
        return Outcome.STARTED
