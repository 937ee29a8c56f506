"""Job chains (``after:``): each finished run of an upstream job whose
result the downstream job's ``on:`` takes starts exactly one run of it,
on one host of the fleet.

The upstream run is the trigger's identity: a row of the triggers table
keyed by (downstream job, upstream run record), made once (an insert that
ignores a row already there) by whichever host first sees the run over:

- the host that ran it, right after recording its end (its record ids);
- every host that runs a downstream job, in its bookkeeping look (each
  ``ROUND_EVERY`` heartbeats): the upstream runs that ended within
  :data:`WINDOW` and are over: no later attempt, no live lease on their
  token (not waiting for a retry or an on-failure command). That covers a
  host that died between the end and the trigger, and a run recorded
  ``lost`` by another host's bookkeeping.

A trigger is taken in the transaction of the downstream job's one claim
(the slot's claim and lease, its fencing token, its first attempt's
record naming the upstream run), or of its one record of why it did not
run (``skipped: load is disabled``, through the slot book): the row lock on
the trigger orders the hosts that try, and a claim that loses (the job
held, disabled, the fleet paused) rolls the trigger back for later. So a
trigger starts one run or gets one record, never two, and a trigger whose
host dies before it is taken is taken by another host within one
bookkeeping look.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from dblockrun.daemon.halts import halted
from dblockrun.daemon.state import DaemonState
from dblockrun.errors import DatabaseError
from dblockrun.jobs import Job, JobsFile
from dblockrun.scheduling.planner import Cause
from dblockrun.store.models import Claimed, Trigger
from dblockrun.store.runstore import ChainStore

log = logging.getLogger("dblockrun")

#: How far back a host's look finds upstream runs with no trigger yet
#: (seconds): a host that ran one and died makes no trigger, the others
#: make it within a look; a run older than this (every host down that
#: long) starts nothing.
WINDOW = 3600.0
#: Taken triggers are kept this much longer than :data:`WINDOW` (no look
#: makes one again), then forgotten, every :data:`PRUNE_EVERY` looks.
PRUNE_EVERY = 100


class Chains:
    """One daemon's part of the job chains (see the module)."""

    def __init__(self, state: DaemonState, interval: float) -> None:
        #: Only its triggers, claims and reads (tests play it in memory).
        self.store: ChainStore = state.store
        self.holder = state.settings.holder
        self.lease = state.settings.lease
        #: Seconds between two looks for triggers (the bookkeeping round's).
        self.interval = interval
        self.clock = state.clock
        self.outage = state.outage
        self.book = state.book
        # (bound methods: each call reads the state's current jobs)
        self._local = state.jobs
        self._whole = state.file
        #: Per downstream job, from when its look finds upstream runs
        #: (database clock): :data:`WINDOW` back for a chain that has
        #: triggers, from this daemon's first look for a new one (a new
        #: ``after:`` starts nothing for the runs before it).
        self._since: dict[str, float] = {}
        #: Upstream runs that ended here: (job, the record of its last attempt).
        self._ended: list[tuple[str, int]] = []
        self._next_look = 0.0  # monotonic
        #: The local jobs that run after others, and the jobs any job of the
        #: whole file runs after, each for the file it was worked out from.
        self._mine: tuple[JobsFile | None, list[Job]] = (None, [])
        self._upstream: tuple[JobsFile | None, frozenset[str]] = (None, frozenset())
        self._looks = 0
        #: Triggers left pending for a moment (the job running here with
        #: overlap: queue, a full host): looked at again when a run ends.
        self._again = False

    # -- what the daemon tells it -----------------------------------------------

    def downstream(self) -> list[Job]:
        """This host's jobs that run after others."""
        local = self._local()
        if self._mine[0] is not local:  # worked out once per jobs file (each loop asks)
            self._mine = (local, [job for job in local.jobs if job.after is not None])
        return self._mine[1]

    def ended(self, job: str, run_id: int | None) -> None:
        """A run of ``job`` ended here (its end recorded); main thread."""
        whole = self._whole()
        if self._upstream[0] is not whole:
            self._upstream = (whole, frozenset(up for d in whole.jobs if d.after is not None
                                               for up in d.after.jobs))
        if run_id is not None and job in self._upstream[1]:
            self._ended.append((job, run_id))
        if self._again:
            self._next_look = 0.0

    def due_in(self) -> float:
        """Seconds until :meth:`look` has something to do."""
        if self._ended:
            return 0.0
        if not self.downstream():
            return float("inf")
        return max(0.0, self._next_look - time.monotonic())

    # -- triggers ---------------------------------------------------------------

    def look(self, start: Callable[[Job, Trigger, Claimed], object],
             busy: Callable[[str], bool], full: Callable[[], bool]) -> None:
        """Make the triggers of the runs that ended here, and (each
        interval) of any upstream run over; take this host's pending ones:
        claim and ``start`` each, or record why it cannot run."""
        ended, self._ended = self._ended, []
        mine = self.downstream()
        looking = bool(mine) and time.monotonic() >= self._next_look
        if not ended and not looking:
            return
        try:
            self._make(ended, mine if looking else [])
            if looking:
                self._next_look = time.monotonic() + self.interval
            pending = self.store.pending_triggers([job.name for job in mine]) if mine else []
            self.outage.ok()
        except DatabaseError as exc:
            self._ended = ended + self._ended
            self._next_look = time.monotonic() + self.outage.failed("job chains", exc)
            return
        self._again = False
        jobs = {job.name: job for job in mine}
        for trigger in pending:
            job = jobs.get(trigger.job)
            if job is None:
                continue
            try:
                self._take(job, trigger, start, busy, full)
                self.outage.ok()
            except DatabaseError as exc:
                self.outage.failed(f"start {job.name} after {trigger.upstream_job}", exc)
                self._again = True

    def _make(self, ended: list[tuple[str, int]], mine: list[Job]) -> None:
        now = self.clock.now()
        for job in self._whole().jobs:
            after = job.after
            if after is None:
                continue
            ids = [run_id for up, run_id in ended if up in after.jobs]
            if ids:
                self.store.make_triggers(job.name, list(after.jobs), after.results, ids=ids)
        for job in mine:
            assert job.after is not None
            if job.name not in self._since:
                self._since[job.name] = (now - WINDOW if self.store.chained_before(job.name)
                                         else now)
            self.store.make_triggers(job.name, list(job.after.jobs), job.after.results,
                                     since=max(self._since[job.name], now - WINDOW))
        if mine:
            self._looks += 1
            if self._looks % PRUNE_EVERY == 0:
                self.store.prune_triggers(now - 2 * WINDOW)

    def _take(self, job: Job, trigger: Trigger, start: Callable[[Job, Trigger, Claimed], object],
              busy: Callable[[str], bool], full: Callable[[], bool]) -> None:
        """One pending trigger of a job of this host."""
        if not job.enabled:
            self._passed(job, trigger, Cause.UNCLAIMABLE,
                         f"{job.name} is not enabled in the jobs file of {self.holder}")
            return
        if full() or (job.allow is None and busy(job.name) and job.overlap != "forbid"):
            self._again = True  # a host with room takes it, or this one after its run
            return
        won = self.store.claim_trigger(trigger, self.holder, self.lease)
        if won is not None:
            log.info("job %s: starting after %s run %d (%s)", job.name, trigger.upstream_job,
                     trigger.upstream_run, trigger.result, extra={"job": job.name})
            start(job, trigger, won)
            return
        if trigger not in self.store.pending_triggers([job.name]):
            return  # another host took it
        why = self._why_not(job, trigger)
        if why is None:
            self._again = True
        else:
            self._passed(job, trigger, *why)

    def _why_not(self, job: Job, trigger: Trigger) -> tuple[Cause, str] | None:
        """Why the claim of ``job`` for ``trigger`` lost: a cause and reason
        to record; None: try again later (the lock held without a run, by a
        run that its overlap waits for, or by a run started after the
        upstream run ended: the trigger was due when nothing ran, as a slot
        due then would have run; it waits its turn, not skipped because
        this look found it behind another trigger)."""
        halt = halted(self.store, job.name, self.clock.now())
        if halt is not None:
            return Cause.UNCLAIMABLE, ("the fleet is paused" if halt.job is None
                                       else f"{halt.job} is disabled")
        if self.store.drains.drained(self.holder.partition(":")[0]) is not None:
            return None  # this host is drained (dblockrun drain): the others take it
        running = [run for run in self.store.control.running(job.name)
                   if run.started < trigger.ended]
        if running and job.overlap == "forbid":
            hosts = ", ".join(sorted({run.host for run in running}))
            return Cause.BUSY, f"{job.name} was still running on {hosts} (overlap: forbid)"
        return None

    def _passed(self, job: Job, trigger: Trigger, cause: Cause, reason: str) -> None:
        self.book.trigger_passed(job, trigger, cause, reason, self.clock.now())
