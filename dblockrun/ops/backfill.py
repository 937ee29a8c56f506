"""``dblockrun backfill`` and ``dblockrun rerun``: passed slots run again.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dblockrun.errors import DblockrunError, UsageError
from dblockrun.jobs import Job, JobsFile
from dblockrun.store import models as m
from dblockrun.store.control import Audit
from dblockrun.timetext import stamp, took

if TYPE_CHECKING:
    from dblockrun.running.runjob import RunContext
    from dblockrun.store import Store

log = logging.getLogger("dblockrun")

#: What ``--only`` picks: slots recorded missed, skipped, whose last run
#: failed (failed, timeout, killed, lost), or with no record at all (a slot
#: due while the fleet was paused).
KINDS = ("missed", "skipped", "failed", "unrecorded")
#: The most slots one backfill looks at (a per-second job over a day is 86,400).
MAX_SLOTS = 10_000
#: How often a backfill or rerun tries again for a busy job's lock or a group's seat.
WAIT_POLL = 0.5
#: The origins of a run record (``runs.origin``).
BACKFILL, RERUN = "backfill", "rerun"


class Stopped(DblockrunError):
    """The backfill stopped before its last slot."""


class Refused(DblockrunError):
    """The rerun was refused: its slot is running now."""


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


def plan(store: Store, job: Job, first: float, last: float,
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


# -- running a slot here -----------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """A claim won: the run's record and host."""

    run_id: int
    holder: str


class Here:
    """Runs a job's passed slots in this process, one at a time: the one
    claim (``again``), a group seat, the run's record with its origin,
    then :class:`~dblockrun.running.runjob.JobRun` under a lease renewed
    every third of it. ``say``: a progress line."""

    def __init__(self, store: Store, jobs: JobsFile, job: Job, lease: float,
                 say: Callable[[str], None]) -> None:
        from dblockrun.events import Events
        from dblockrun.running import spawn
        from dblockrun.running.heartbeat import Renewer
        from dblockrun.running.holder import new_holder_id
        from dblockrun.running.runjob import RunContext
        from dblockrun.running.runlog import log_run
        from dblockrun.running.runloop import RunLoop
        from dblockrun.store.outage import Outage

        self.store, self.jobs, self.job, self.say = store, jobs, job, say
        self.holder = new_holder_id()
        # Before any thread: the spawn service starts every command.
        spawn.start(fork=True)
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

    def __enter__(self) -> Here:
        self.renewer.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.renewer.stop()

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

    def claim(self, slot: float | None, *, undone: bool, origin: tuple[str, int | None],
              gone: Callable[[], str | None]) -> tuple[int, tuple[str, int] | None] | str:
        """The job's lock for ``slot`` (None: a run with no slot): the token
        and the group seat, waiting while the job is busy or its group full;
        or why it is not run (``gone``: the slot ran meanwhile, or runs
        now). Raises :class:`Stopped` when the fleet is paused, the job
        disabled, or on Ctrl-C."""
        from dblockrun.ops.actions import held_why
        from dblockrun.scheduling.limits import take_seat
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
            won = engine.claim(job.name, self.holder, self.ctx.lease, claim)
            if won is None:
                if (why := gone()) is not None:
                    return why
                wait = held_why(store, job.name) or "busy"
                wait = f"{job.name} is {wait}"
            elif job.group is None:
                return won.token, None
            else:
                seat = take_seat(store, self.jobs, job, self.holder, self.ctx.lease)
                if not isinstance(seat, str):
                    return won.token, seat
                store.release(job.name, self.holder, won.token)
                wait = seat
            if wait != told:
                self.say(f"{job.name}: waiting: {wait}")
                told = wait
            time.sleep(WAIT_POLL)

    def run(self, slot: float | None, token: int, seat: tuple[str, int] | None,
            origin: tuple[str, int | None], started: Callable[[int], None]) -> m.RunRecord:
        """Record the run and run it to its end (retries and on-failure
        included); its last attempt's record."""
        from dblockrun.running.runjob import JobRun
        from dblockrun.signals import handling

        job, store = self.job, self.store
        sent = time.monotonic()
        try:
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

        run = JobRun(self.ctx, job, token, slot, sent, run_id=run_id, seat=seat, origin=origin,
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
                got = here.claim(pending.slot, undone=True, origin=origin, gone=gone)
                if isinstance(got, str):
                    say(f"{job.name}: slot {stamp(pending.slot)}: not run: {got}")
                    tally.elsewhere += 1
                    continue
                run = here.run(pending.slot, got[0], got[1], origin, started)
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
            got = here.claim(slot, undone=False, origin=origin, gone=going)
        except Stopped as exc:
            raise Stopped(f"rerun of run {run_id} not started: {exc.message}") from None
        if isinstance(got, str):
            raise Refused(f"rerun of run {run_id} refused: {got}")

        def started(new_id: int) -> None:
            what = f"slot {stamp(slot)}" if slot is not None else "no slot"
            store.control.note(audit(f"run {run_id} ({what}) as run {new_id}"))
            say(f"{job.name}: rerun of run {run_id} ({what}): run {new_id} started on "
                f"{here.holder}")

        run = here.run(slot, got[0], got[1], origin, started)
    say(f"{job.name}: {_ended(run)}")
    return run
