"""``dblockrun backfill`` and ``dblockrun rerun``: passed slots run again
(which ones: :mod:`dblockrun.ops.backfill`).

Where they run: here, in the operator's process, as ``exec`` runs its
command: the job's definition comes from the local jobs file (never from
the database), progress and the end of each run are shown as they come,
and the exit status says how it went. Each run goes through the one run
lifecycle (:class:`~dblockrun.running.runjob.JobRun`: record, command under
the lease, retries, result with the release, on-failure), after the one
claim (:meth:`Queries.claimable <dblockrun.store.queries.Queries.claimable>`
with ``again``): the job's lock free, the job enabled, the fleet not paused,
the slot passed by the fleet (its last slot at or past it, so no daemon
claims it any more), no run of it going on, and for a backfill no run of it
ended ok. The lease serializes the claims of a job, so two backfills, or a
backfill and a rerun, never run one slot at once, and a backfilled slot
never runs twice ok.

A backfill takes the job's lock for each run, whatever its ``overlap``:
one slot at a time across the fleet, oldest first; the daemons' slots that
come due meanwhile find the job busy, as with any run of it. A grouped job
takes a seat of its group first (waiting for one). Records say
``backfill`` or ``rerun`` (``runs.origin``) and ``history`` shows it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dblockrun.errors import DblockrunError, UsageError
from dblockrun.jobs import Job, JobsFile
from dblockrun.ops.backfill import Plan, local_job
from dblockrun.store import models as m
from dblockrun.store.control import Audit
from dblockrun.timetext import stamp, took

if TYPE_CHECKING:
    from dblockrun.running.runjob import RunContext
    from dblockrun.running.spawn import SpawnService
    from dblockrun.store import Store

log = logging.getLogger("dblockrun")

#: How often a backfill or rerun tries again for a busy job's lock or a group's seat.
WAIT_POLL = 0.5
#: The origins of a run record (``runs.origin``).
BACKFILL, RERUN = "backfill", "rerun"


class Stopped(DblockrunError):
    """The backfill stopped before its last slot."""


class Refused(DblockrunError):
    """The rerun was refused: its slot is running now."""


@dataclass(frozen=True)
class Won:
    """A claim of the job won: its token, its group's seat (if grouped),
    and when it was sent (monotonic: where its lease counts from)."""

    token: int
    seat: tuple[str, int] | None
    sent: float


class Here:
    """Runs a job's passed slots in this process, one at a time: the one
    claim (``again``), a group seat, the run's record with its origin,
    then :class:`~dblockrun.running.runjob.JobRun` under a lease renewed
    every third of it. ``say``: a progress line."""

    def __init__(self, store: Store, jobs: JobsFile, job: Job, lease: float,
                 say: Callable[[str], None]) -> None:
        from dblockrun.events import Events
        from dblockrun.running.heartbeat import Renewer
        from dblockrun.running.holder import new_holder_id
        from dblockrun.running.runjob import RunContext
        from dblockrun.running.runlog import log_run
        from dblockrun.running.runloop import RunLoop
        from dblockrun.store.outage import Outage

        self.store, self.jobs, self.job, self.say = store, jobs, job, say
        self.holder = new_holder_id()
        outage = Outage()
        self.stop = threading.Event()
        self.renewer = Renewer(store, lease / 3, outage)
        events = Events()  # the runs' log lines; no notifications from here
        events.subscribe(log_run)
        self.ctx: RunContext = RunContext(
            store=store, holder=self.holder, lease=lease, kill_grace=5.0,
            renewer=self.renewer, outage=outage, stop=self.stop, stop_grace=lambda: None,
            loop=RunLoop(self.stop), events=events)
        self.interrupted = 0
        self._pgid: list[int] = []
        self._service: SpawnService | None = None

    def __enter__(self) -> Here:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._service is not None:
            self.renewer.stop()
            self._service.stop()

    def _ready(self) -> None:
        """Before the first run: the spawn service (which starts every
        command; forked before any thread) and the lease renewals. Not
        before: a backfill or rerun refused (paused fleet, disabled job,
        nothing to run) starts neither."""
        if self._service is None:
            from dblockrun.running import spawn

            self._service = spawn.start(fork=True)
            self.renewer.start()

    def _signalled(self, signum: int) -> None:
        """Ctrl-C or SIGTERM: forwarded to the running command; no slot starts after it."""
        self.interrupted = signum
        if self._pgid:
            try:
                os.killpg(self._pgid[-1], signum)
            except ProcessLookupError:
                pass

    def why_not(self) -> str | None:
        """Why no claim of the job can win now: the fleet paused, the job disabled."""
        paused = self.store.control.paused()
        if paused is not None:
            reason = f": {paused.reason}" if paused.reason else ""
            return f"the fleet is paused (by {paused.who}{reason})"
        state = self.store.lock_state(self.job.name)
        if state is not None and state.disabled_until is not None and (
                state.disabled_until > self.store.db_now()):
            why = f" ({state.disabled_reason})" if state.disabled_reason else ""
            return f"{self.job.name} is disabled{why}"
        return None

    def claim(self, slot: float | None, *, undone: bool,
              gone: Callable[[], str | None]) -> Won | str:
        """The job's lock for ``slot`` (None: a run with no slot) and its
        group's seat, waiting while the job is busy or its group full; or
        why it is not run (``gone``: the slot ran meanwhile, or runs now).
        Raises :class:`Stopped` when the fleet is paused or the job
        disabled, KeyboardInterrupt after a Ctrl-C."""
        from dblockrun.running.holder import held_why
        from dblockrun.running.seats import take_seat
        from dblockrun.store.engine import Claim

        job, store, engine = self.job, self.store, self.store.lock_engine()
        claim = Claim() if slot is None else Claim(again=slot, undone=undone)
        told: str | None = None
        while True:
            if self.interrupted:
                raise KeyboardInterrupt
            if (why := self.why_not()) is not None:
                raise Stopped(why)
            engine.supersede(job.name, self.holder)  # a dead run of the slot holds nothing
            sent = time.monotonic()  # the lease counts from the claim's request
            won = engine.claim(job.name, self.holder, self.ctx.lease, claim)
            if won is None:
                if (why := gone()) is not None:
                    return why
                wait = held_why(store, job.name) or "busy"
                wait = f"{job.name} is {wait}"
            elif job.group is None:
                return Won(won.token, None, sent)
            else:
                seat = take_seat(store, self.jobs, job, self.holder, self.ctx.lease)
                if not isinstance(seat, str):
                    return Won(won.token, seat, sent)
                store.release(job.name, self.holder, won.token)
                wait = seat
            if wait != told:
                self.say(f"{job.name}: waiting: {wait}")
                told = wait
            time.sleep(WAIT_POLL)

    def run(self, slot: float | None, won: Won, origin: tuple[str, int | None],
            started: Callable[[int], None]) -> m.RunRecord:
        """Record the run and run it to its end (retries and on-failure
        included); its last attempt's record."""
        from dblockrun.running.runjob import JobRun
        from dblockrun.signals import handling

        job, store = self.job, self.store
        token, seat = won.token, won.seat
        try:
            self._ready()
            run_id = store.start_run(job.name, self.holder, token=token, slot=slot,
                                     origin=origin)
        except BaseException:
            store.release(job.name, self.holder, token)
            if seat is not None:
                store.release_seat(seat, self.holder)
            raise
        started(run_id)

        def quiet(_line: bytes) -> None:
            """The command's output is its record's (``history --output``)."""

        run = JobRun(self.ctx, job, token, slot, won.sent, run_id=run_id, seat=seat, origin=origin,
                     line_sink=quiet, on_start=self._pgid.append)
        with handling({signal.SIGINT: self._signalled, signal.SIGTERM: self._signalled}):
            run.run()
        ended = store.run(run.last_run_id or run_id)
        if ended is None:
            raise DblockrunError(f"run {run_id} of {job.name} has no record any more")
        return ended


def _ended(run: m.RunRecord) -> str:
    code = "" if run.exit_code is None else f" (exit {run.exit_code})"
    return f"run {run.id} ended {run.result}{code} in {took(run.duration)}"


@dataclass
class Tally:
    """What a backfill did with its slots."""

    slots: int
    ok: int = 0
    bad: int = 0  # ran, not ok
    elsewhere: int = 0  # ran ok meanwhile elsewhere (another backfill)

    @property
    def left(self) -> int:
        return self.slots - self.ok - self.bad - self.elsewhere

    def text(self) -> str:
        """``9 ok, 1 not ok, 2 not run``."""
        return ", ".join([f"{self.ok} ok"] + [f"{n} {what}" for n, what in (
            (self.bad, "not ok"), (self.elsewhere, "ran ok elsewhere"),
            (self.left, "not run")) if n])


def backfill(store: Store, jobs: JobsFile, chosen: Plan, *, lease: float, keep_going: bool,
             audit: Audit, say: Callable[[str], None]) -> Tally:
    """Run the plan's slots here, oldest first, one at a time. Stops at the
    first that does not end ok, unless ``keep_going``; raises
    :class:`Stopped` when the fleet is paused or the job disabled, and
    KeyboardInterrupt on Ctrl-C (what ran is said first)."""
    job = chosen.job
    store.control.note(audit)
    tally = Tally(len(chosen.pending))
    with Here(store, jobs, job, lease, say) as here:
        for pending in chosen.pending:
            origin = (BACKFILL, pending.record)

            def gone(slot: float = pending.slot) -> str | None:
                records = store.slot_records(job.name, slot, slot)
                for record in reversed(records):
                    if record.slot == slot and record.result == m.OK:
                        return f"ran ok meanwhile (run {record.id})"
                return None

            def started(run_id: int, slot: float = pending.slot, why: str = pending.why) -> None:
                say(f"{job.name}: slot {stamp(slot)} ({why}): run {run_id} started "
                    f"on {here.holder}")

            try:
                got = here.claim(pending.slot, undone=True, gone=gone)
                if isinstance(got, str):
                    say(f"{job.name}: slot {stamp(pending.slot)}: not run: {got}")
                    tally.elsewhere += 1
                    continue
                run = here.run(pending.slot, got, origin, started)
            except Stopped as exc:
                raise Stopped(f"{job.name}: backfill stopped: {exc.message}; "
                              f"{tally.text()} (the same backfill runs what is left "
                              "later)") from None
            say(f"{job.name}: slot {stamp(pending.slot)}: {_ended(run)}")
            if run.result == m.OK:
                tally.ok += 1
            else:
                tally.bad += 1
            if here.interrupted:  # Ctrl-C: exit status 130, after what ran is said
                say(f"{job.name}: backfill interrupted: {tally.text()}")
                raise KeyboardInterrupt
            if run.result != m.OK and not keep_going:
                say(f"{job.name}: stopped at the first slot that did not run ok "
                    f"({tally.left} not run; --keep-going runs on): "
                    f"`dblockrun history --output {run.id}`")
                break
    return tally


def rerun(store: Store, jobs: JobsFile | None, run_id: int, *, lease: float,
          audit: Callable[[str], Audit], say: Callable[[str], None]) -> m.RunRecord:
    """Run run ``run_id``'s slot again here, as a new run (a new token);
    :class:`Refused` while a run of that slot is going on. The new run's
    record as it ended."""
    before = store.run(run_id) if m.run_id_possible(run_id) else None
    if before is None:
        from dblockrun.store.dburl import describe

        raise UsageError(f"no run {run_id} in {describe(store.url, store.prefix)}")
    if before.item is not None:
        raise UsageError(f"run {run_id} is an item's of the fan-out job {before.job}: "
                         "not run again by rerun")
    job = local_job(jobs, before.job)
    assert jobs is not None
    slot = before.slot

    def going() -> str | None:
        """The run of the slot going on now (the run itself, or another)."""
        for run in store.control.running(before.job):
            if run.id == run_id or (slot is not None and run.slot == slot):
                what = f"slot {stamp(slot)}" if slot is not None else f"run {run_id}"
                return (f"{what} of {before.job} is running now: run {run.id} on {run.host} "
                        f"since {stamp(run.started)} (wait for its end, or `dblockrun kill "
                        f"--run {run.id}`)")
        return None

    if (why := going()) is not None:
        raise Refused(f"rerun of run {run_id} refused: {why}")
    origin = (RERUN, run_id)
    with Here(store, jobs, job, lease, say) as here:
        try:
            got = here.claim(slot, undone=False, gone=going)
        except Stopped as exc:
            raise Stopped(f"rerun of run {run_id} not started: {exc.message}") from None
        if isinstance(got, str):
            raise Refused(f"rerun of run {run_id} refused: {got}")

        def started(new_id: int) -> None:
            what = f"slot {stamp(slot)}" if slot is not None else "no slot"
            store.control.note(audit(f"run {run_id} ({what}) as run {new_id}"))
            say(f"{job.name}: rerun of run {run_id} ({what}): run {new_id} started on "
                f"{here.holder}")

        run = here.run(slot, got, origin, started)
    say(f"{job.name}: {_ended(run)}")
    return run
