"""One claimed run of a job: record it, run the command under the lease,
retry, record the result, release the lock, apply on-failure."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from dblockrun.durations import fence_margin
from dblockrun.errors import DatabaseError
from dblockrun.events import Events, RunEnded, RunStarted
from dblockrun.jobs import Job
from dblockrun.latch import Latch
from dblockrun.redact import Pieces
from dblockrun.running.heartbeat import Renewer
from dblockrun.running.runloop import RunLoop
from dblockrun.running.runner import (
    GRACE_RAN_OUT,
    LeaseWatch,
    LiveOutput,
    Process,
    ProcessEnd,
    argv_for,
    stored_text,
)
from dblockrun.running.spawn import MAX_LINE
from dblockrun.store import models as m
from dblockrun.store.base import Disables
from dblockrun.store.outage import Outage
from dblockrun.store.runstore import RunStore
from dblockrun.withheld import generation as withheld_generation
from dblockrun.withheld import withheld

if TYPE_CHECKING:
    from dblockrun.running.seats import Queues
    from dblockrun.running.slotbook import SlotBook
    from dblockrun.scheduling.limits import Seat
    from dblockrun.scheduling.planner import Cause
    from dblockrun.store.models import Trigger

log = logging.getLogger("dblockrun")
out_log = logging.getLogger("dblockrun.output")

_RESULT = {"timeout": m.TIMEOUT, "fenced": m.KILLED, "stopped": m.KILLED, "killed": m.KILLED,
           "error": m.FAILED, "limit": m.FAILED}


@dataclass(frozen=True)
class RunContext:
    store: RunStore
    holder: str
    lease: float
    kill_grace: float
    renewer: Renewer
    outage: Outage
    stop: threading.Event
    stop_grace: Callable[[], float | None]
    #: Takes each step of the runs and watches their commands.
    loop: RunLoop
    #: The environment commands start from, read once (dict(os.environ)
    #: decodes every variable again, 0.5 ms a start with a few dozen) and
    #: read-only, so what each job inherits of it is filtered once
    #: (:func:`inherited_env`).
    environ: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType(dict(os.environ)))
    #: Where the runs' starts and ends are told (dblockrun/events.py): the
    #: log, metrics, notifications and pings subscribe there.
    events: Events | None = None
    #: Why the shutdown stops a command (dblockrun/running/runner.py).
    stop_why: Callable[[], str] = lambda: GRACE_RAN_OUT
    #: Records a claimed slot that ends without a run (a queued slot given
    #: up): its record, release, log line and event (the daemon's slot book).
    book: SlotBook | None = None
    #: The database clock (a passed slot's lateness).
    now: Callable[[], float] = time.time


#: A growing retry delay is shortened by up to this share, at random, so the
#: retries of jobs that failed together (a database away) spread out.
RETRY_JITTER = 0.2


def retry_wait(job: Job, attempt: int, draw: Callable[[], float] = random.random) -> float:
    """The pause after failed attempt ``attempt`` (1: the first): ``retry-delay``
    times ``backoff`` for each retry before, at most ``max-delay`` (and
    ``lock-at-most``); a growing
    delay (backoff above 1) then loses up to :data:`RETRY_JITTER` of itself
    (``draw`` gives 0 to 1). A constant delay is exact, as before backoff."""
    if job.backoff == 1:
        return job.retry_delay
    # No wait outlasts lock-at-most: the run is stopped by then anyway.
    cap = job.lock_at_most if job.max_delay is None else min(job.max_delay, job.lock_at_most)
    try:
        delay = min(job.retry_delay * job.backoff ** (attempt - 1), cap)
    except OverflowError:
        delay = cap
    return delay * (1 - RETRY_JITTER * draw())


def result_of(outcome: ProcessEnd) -> str:
    if outcome.reason == "exit":
        return m.OK if outcome.exit_code == 0 else m.FAILED
    return _RESULT[outcome.reason]


def shell_status(code: int | None) -> int | None:
    """A shell-style exit status: 128+N for a command killed by signal N."""
    if code is None:
        return None
    return 128 - code if code < 0 else code


def stored_output(outcome: ProcessEnd) -> str:
    """The output tail a run is recorded with; a command that could not
    start, or that was stopped (an operator's kill, lock-at-most, its lease,
    a shutdown), ends with why (``killed by alice@web-1: ...``,
    ``reached lock-at-most``)."""
    output = stored_text(outcome.tail)
    if outcome.detail:
        output = (output + outcome.detail + "\n")[-65536:]
    return output


#: PATH of a command that inherits none of the daemon's (cron's).
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: What a ``user:`` job's login environment sets (runner.RunAs.env), never
#: the daemon's user's.
_LOGIN_VARS = ("HOME", "USER", "LOGNAME", "SHELL")


#: What :func:`inherited_env` filtered from a read-only environment, by the
#: environment's id, the secrets' generation, ``env-inherit`` and whether the
#: job has a ``user:``; each entry keeps its environment (so its id stays its
#: own). Every run of a job filters the same daemon's environment the same
#: way: a few dozen variables at every start of a 10,000-job burst.
_INHERITED: dict[tuple[int, int, str | tuple[str, ...], bool],
                 tuple[Mapping[str, str], dict[str, str]]] = {}
#: Entries kept at most (one a job's env-inherit, a context, in practice).
_INHERITED_MAX = 64


def inherited_env(job: Job, environ: Mapping[str, str]) -> dict[str, str]:
    """What a command of ``job`` takes from ``environ`` (the daemon's
    environment), as its ``env-inherit`` says: all of it, none, or the
    variables named (``LC_*``: every name starting ``LC_``); a ``user:`` job
    inherits none unless it says so. The daemon's secrets
    (dblockrun/withheld.py) never; a PATH always (cron's when none is
    inherited). A read-only ``environ`` (the run context's) is filtered
    once per ``env-inherit``; the caller gets its own copy."""
    inherit = job.env_inherit if job.env_inherit is not None else (
        "none" if job.user else "all")
    if not isinstance(environ, MappingProxyType):
        return _inherited(inherit, bool(job.user), environ)
    key = (id(environ), withheld_generation(), inherit, bool(job.user))
    kept = _INHERITED.get(key)
    if kept is None or kept[0] is not environ:
        if len(_INHERITED) >= _INHERITED_MAX:
            _INHERITED.clear()
        kept = _INHERITED[key] = (environ, _inherited(inherit, bool(job.user), environ))
    return dict(kept[1])


def _inherited(inherit: str | tuple[str, ...], user: bool,
               environ: Mapping[str, str]) -> dict[str, str]:
    """:func:`inherited_env`'s filter."""
    if inherit == "all":
        env = {k: v for k, v in environ.items() if not withheld(k)}
    elif inherit == "none":
        env = {}
    else:
        names = tuple(n for n in inherit if not n.endswith("*"))
        prefixes = tuple(n[:-1] for n in inherit if n.endswith("*"))
        env = {k: v for k, v in environ.items()
               if (k in names or (prefixes and k.startswith(prefixes))) and not withheld(k)}
    if user:
        for name in _LOGIN_VARS:  # the user's own, set when it starts
            env.pop(name, None)
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def base_env(job: Job, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What ``job``'s command inherits of ``environ`` (default: this
    process's environment), the job's ``env`` and ``DBLOCKRUN_JOB``."""
    env = inherited_env(job, os.environ if environ is None else environ)
    env.update(dict(job.env))
    env["DBLOCKRUN_JOB"] = job.file_name  # an every-host job: its name in the file
    return env


def command_env(job: Job, *, holder: str, run_id: int, token: int, slot: float | None,
                item: str | None = None, environ: Mapping[str, str] | None = None,
                upstream: Trigger | None = None) -> dict[str, str]:
    env = base_env(job, environ)
    env.update(
        DBLOCKRUN_RUN_ID=str(run_id),
        DBLOCKRUN_FENCING_TOKEN=str(token),
        DBLOCKRUN_HOST_ID=holder,
    )
    if slot is not None:
        env["DBLOCKRUN_SLOT"] = datetime.fromtimestamp(slot, UTC).isoformat().replace(
            "+00:00", "Z"
        )
    if item is not None:
        env["DBLOCKRUN_ITEM"] = item
    if upstream is not None:  # after: the run that started this one
        env.update(DBLOCKRUN_UPSTREAM_JOB=upstream.upstream_job,
                   DBLOCKRUN_UPSTREAM_RUN=str(upstream.upstream_run),
                   DBLOCKRUN_UPSTREAM_RESULT=upstream.result)
    return env


def line_logger(prefix: str, **fields: object) -> Callable[[bytes], None]:
    """Log each output line of a command, prefixed (``[job] ``), with ``fields``,
    its credentials hidden as in the stored tail (a credential split by a
    64 KiB cut too: dblockrun/redact.py ``Pieces``)."""
    redacted = Pieces(MAX_LINE)

    def on_line(line: bytes) -> None:
        out_log.info("%s%s", prefix, redacted(line).decode("utf-8", "replace").rstrip("\r\n"),
                     extra=fields)

    return on_line


class ItemHook(Protocol):
    """What a run of fan-out items (dblockrun/running/fanout.py) holds instead of
    the job's lock row: a batch of claimed items, each with its own lease,
    token and run record. Its attempts are recorded, finished and released
    through it; the rest of the lifecycle is the same as a job's."""

    #: The batch's first item, and how logs name the batch (``a +2``).
    item: str
    label: str

    def env(self) -> dict[str, str]:
        """``DBLOCKRUN_ITEM`` (a batch of one) and ``DBLOCKRUN_ITEMS``."""

    def renew(self) -> bool | str:
        """Extend the items' leases (as :attr:`LeaseWatch.renew`)."""

    def record(self, attempt: int) -> int:
        """Record attempt ``attempt`` (above 1) of each item; its first run's id."""

    def run_ids(self) -> list[int]:
        """The run records of the attempt recorded last, one per item."""

    def finish(self, result: str, code: int | None, output: str, took: float) -> bool:
        """An attempt's result (its command ran ``took`` seconds), the items still held."""

    def finish_and_release(self, result: str, code: int | None, output: str,
                           lock_at_least: float, took: float) -> tuple[bool, bool]:
        """The last attempt's result and the items' release."""

    def release(self, lock_at_least: float) -> bool:
        """Free the items (their result already recorded)."""


class JobRun:
    """One claimed run, without a thread of its own: each step (start,
    result, retry, on-failure) is taken on the context's run loop, whose
    watcher applies the command's stops; the spawn service watches the
    lease (the lifeline)."""

    def __init__(
        self,
        ctx: RunContext,
        job: Job,
        token: int,
        slot: float | None,
        claimed_mono: float,
        on_done: Callable[[JobRun], None] | None = None,
        line_sink: Callable[[bytes], None] | None = None,
        on_start: Callable[[int], None] | None = None,
        run_id: int | None = None,
        err_sink: Callable[[bytes], None] | None = None,
        seat: tuple[str, int] | None = None,
        item: ItemHook | None = None,
        queue: Queues | None = None,
        order: tuple[float, int] = (0.0, 0),
        lane: tuple[str, int] | None = None,
        upstream: Trigger | None = None,
        origin: tuple[str, int | None] | None = None,
    ) -> None:
        """``run_id``: the first attempt's run record, when the claim made it.
        ``line_sink``: the command's output lines (default: logged);
        ``err_sink``: its stderr lines apart (default: with the output);
        ``seat``: the group seat the run holds (dblockrun/scheduling/limits.py), renewed
        with its lease and released at its end; ``item``: a run of fan-out
        items, which it records, renews and releases; ``queue``: the limits
        its slot may wait for (dblockrun/scheduling/limits.py), before
        :meth:`start` or :meth:`wait`; ``order``: its place among waiting
        slots (older first); ``lane``: the lane of
        an ``overlap: allow N`` job the run holds instead of the job's row
        (dblockrun/scheduling/limits.py; taken with the claim's token): its
        lease, kill requests, result and release are the lane's;
        ``upstream``: the trigger that started it (``after:``), which its
        commands are told of; ``origin``: a passed slot run again
        (``backfill``, ``rerun``), which its retries' records say too."""
        self.ctx = ctx
        self.job = job
        self.token = token
        self.slot = slot
        self.item = item
        self.upstream = upstream
        self.origin = origin
        #: The job, or the job and its items, as logs name the run.
        self.label = job.name if item is None else f"{job.name}:{item.label}"
        #: The lock row the run holds: the job's, or its lane.
        self.lock = job.name if lane is None else lane[0]
        #: What the lock's release keeps it held for (a lane: nothing; the
        #: job's row kept lock-at-least when the run took the lane).
        self.least = job.lock_at_least if lane is None else 0.0
        self.watch = LeaseWatch(self.lock, ctx.holder, token, ctx.lease, last_ok=claimed_mono,
                                seat=seat, renew=item.renew if item is not None else None)
        # The lease counts from the claim's request (it may have expired by
        # then); lock-at-most from its answer, a few ms before the command
        # starts: a slow claim (exec's first, making the schema: 0.3 s) must
        # not shorten the run.
        self.deadline = time.monotonic() + job.lock_at_most
        self.on_done = on_done
        self.line_sink = line_sink
        self.err_sink = err_sink
        self.on_start = on_start
        self.last_outcome: ProcessEnd | None = None
        #: Why its last attempt's command was not started (None: it was, or no attempt).
        self.not_started: str | None = None
        self.last_run_id: int | None = None
        #: A worker has begun its first attempt (a burst's host, before it
        #: claims more: dblockrun/daemon/firing.py ``_until_begun``).
        self.begun = False
        self.done = Latch()
        self._recorded = run_id
        self._released = False
        self._first_run_id: int | None = None
        self._seat_released = False
        self._winding_up = False
        self.queue = queue
        #: Its slot waits for a seat or room (counts no command meanwhile).
        self.queued = queue is not None
        self.wants_room = False
        self.order = order
        #: What it waits for, as its record says.
        self._waits_for: str | None = None

    @property
    def run_id(self) -> int | None:
        """The first attempt's record, when the claim made it."""
        return self._recorded

    def start(self) -> None:
        """Start the run; :attr:`done` is set once it is over."""
        self.ctx.renewer.add(self.watch)
        self._step(lambda: self._attempt(1))

    def wait(self, reason: str) -> None:
        """Its slot waits (its record says so: ``reason``); it tries for a
        seat or room every :data:`~dblockrun.scheduling.limits.QUEUE_POLL`,
        holding the job's lock meanwhile."""
        from dblockrun.scheduling.limits import QUEUE_POLL

        self._waits_for = reason
        self.ctx.renewer.add(self.watch)
        self.ctx.loop.call_later(QUEUE_POLL, lambda: self._step(self._try))

    def _try(self) -> None:
        """A waiting slot's try: start, wait on, or end without a run."""
        from dblockrun.scheduling.limits import QUEUE_POLL, Go, Refused
        from dblockrun.scheduling.planner import Cause

        ctx, job, queue = self.ctx, self.job, self.queue
        assert queue is not None
        if self._lease_ran_out():
            log.warning("job %s: the waiting slot lost its lease; not starting it", job.name)
            self._end()  # its record is swept lost
            return
        if ctx.stop.is_set():
            self._not_run(Cause.STOPPED, "the daemon stopped while the slot waited for "
                          f"{self._waits_for}")
            return
        if self.watch.killed is not None:
            self._not_run(None, f"killed while waiting: {self.watch.killed}")
            return
        try:
            got = queue.enter(self)
            if not isinstance(got, Go | Refused) and got.reason != self._waits_for:
                if self.run_id is not None:
                    ctx.store.run_waits(self.run_id, got.reason)
                self._waits_for = got.reason
            ctx.outage.ok()
        except DatabaseError as exc:  # tried again; the heartbeat watches the lease
            ctx.outage.failed(f"find a seat for {job.name}", exc)
            got = None
        if isinstance(got, Go):
            self._admitted(got.seat)
        elif isinstance(got, Refused):
            self._not_run(got.cause, got.reason)
        else:
            ctx.loop.call_later(QUEUE_POLL, lambda: self._step(self._try))

    def _admitted(self, seat: Seat | None) -> None:
        """The waiting slot got its seat (or room): its command starts now,
        its record ``running`` from now (lock-at-most counts from here)."""
        ctx, run_id = self.ctx, self.run_id
        self.watch.seat = seat
        if run_id is not None:
            ctx.outage.retry(f"record the start of {self.job.name}",
                             lambda: ctx.store.run_admitted(run_id),
                             self._lease_left(ctx.kill_grace + 1))
        self.deadline = time.monotonic() + self.job.lock_at_most
        log.info("job %s: the waiting slot starts (it waited for %s)", self.job.name,
                 self._waits_for, extra={"job": self.job.name})
        self._attempt(1)

    def _not_run(self, cause: Cause | None, reason: str) -> None:
        """End a waiting slot without a run, the lock released in the same
        round trip: passed for ``cause`` (recorded ``skipped`` or ``missed``
        through the slot book, as every passed slot is), or killed by an
        operator (``cause`` None: recorded ``killed``, told as a run's end)."""
        from dblockrun.scheduling.planner import single  # croniter: not for exec

        job, ctx, run_id, token = self.job, self.ctx, self.run_id, self.token
        ctx.renewer.remove(self.watch)
        within = 30.0
        if cause is not None and ctx.book is not None:
            book, now = ctx.book, ctx.now()
            plan = single(self.slot if self.slot is not None else now, cause, reason)

            def record() -> bool:
                book.claimed(job, plan, token, run_id, now)
                return True

            self._released = ctx.outage.retry(f"record {job.name}", record, within) is not None
            self._end()
            return
        result = m.KILLED if cause is None else single(0.0, cause, reason).result
        if run_id is not None:
            both = ctx.outage.retry(
                f"record {job.name}", lambda: ctx.store.finish_and_release(
                    run_id, job.name, ctx.holder, token, result, None, reason + "\n"),
                within)
            self._released = both is not None
        log.warning("job %s: waiting slot %s: %s", job.name, run_id, reason,
                    extra={"job": job.name})
        if cause is None and run_id is not None:
            self._emit(RunEnded(
                job=job, host=ctx.holder, run_id=run_id, first_run_id=run_id, slot=self.slot,
                attempt=1, result=result, exit_code=None, duration=0.0, output=reason + "\n",
                detail=reason, final=True, token=token, upstream=self.upstream))
        self._end()

    def run(self) -> None:
        """Start the run and wait for its end (``exec``)."""
        self.start()
        self.done.wait()

    def is_alive(self) -> bool:
        return not self.done.is_set()

    def _step(self, step: Callable[[], None]) -> None:
        """``step`` on a worker of the run loop; the run ends if it fails,
        and the worker reports the crash (dblockrun/supervise.py: logged with
        its traceback, counted, /healthz red until a step completes)."""

        def guarded() -> None:
            try:
                step()
            except BaseException as exc:
                log.error("job %s: run failed (%s: %s); ending it", self.job.name,
                          type(exc).__name__, exc, extra={"job": self.job.name})
                self._end()
                raise

        self.ctx.loop.submit(guarded)

    def _lease_ran_out(self) -> bool:
        """Whether the lease was lost, or not renewed in time (the daemon was
        stopped, the database away): another host may hold the job now."""
        ctx = self.ctx
        return self.watch.lost or time.monotonic() >= self.watch.fence_at(
            fence_margin(ctx.lease, ctx.kill_grace))

    def _lease_left(self, margin: float) -> float:
        """The seconds until the lease's fence (``margin`` before it ran
        out): a retry's budget, counted on the machine's clock as the
        lease is (the spawn service shares its stamps)."""
        return self.watch.fence_at(margin) - time.monotonic()

    def _attempt(self, attempt: int) -> None:
        """Record the attempt (unless the claim did) and start the command,
        never under a lease that ran out meanwhile (a daemon frozen between
        its claim and the command's start; the run's record is then swept
        ``lost`` by the bookkeeping)."""
        job, ctx = self.job, self.ctx
        self.begun = True
        if self._lease_ran_out():
            self.not_started = "its lease ran out before the command could start"
            log.warning("job %s: not starting attempt %d: %s", self.label, attempt,
                        self.not_started)
            self._end()
            return
        run_id = self._recorded if attempt == 1 else None
        item = self.item
        if run_id is None:
            run_id = ctx.outage.retry(
                f"record run of {job.name}",
                (lambda: item.record(attempt)) if item is not None else
                lambda: ctx.store.start_run(job.name, ctx.holder, token=self.token,
                                            slot=self.slot, attempt=attempt,
                                            origin=self.origin),
                self._lease_left(ctx.kill_grace + 1))
            if run_id is None:
                self.not_started = "its run could not be recorded"
                log.error("job %s: could not record the run; not starting it", job.name)
                self._end()
                return
        self.last_run_id = run_id
        if attempt == 1:
            self._first_run_id = run_id
        env = self._env(run_id)
        self._emit(RunStarted(job=job, host=ctx.holder, run_id=run_id, token=self.token,
                              slot=self.slot, attempt=attempt,
                              item=item.item if item is not None else None))
        process = Process(
            argv_for(job.command, job.shell),
            env=env,
            cwd=job.workdir,
            on_line=self.line_sink or line_logger(f"[{self.label}] ", job=job.name, run_id=run_id,
                                                  item=item.item if item else None),
            deadline=self.deadline,
            watch=self.watch,
            stop=ctx.stop,
            kill_grace=ctx.kill_grace,
            stop_grace=ctx.stop_grace,
            stop_why=ctx.stop_why,
            on_start=self.on_start,
            user=job.user,
            on_err_line=self.err_sink,
            limits=job.limits,
            name=job.name,
        )
        # Its records show the output while it runs (a batch: each item's).
        self.watch.output = LiveOutput([run_id] if item is None else item.run_ids(),
                                       process.output.tail)
        started = time.monotonic()

        def ended(outcome: ProcessEnd | None = None) -> None:
            ctx.loop.unwatch(process)
            self._ended(attempt, run_id, outcome or process.finish(), started)

        failed = process.start(on_end=lambda: self._step(ended))
        if failed is not None:
            ended(failed)
        else:
            ctx.loop.watch(process)

    def _env(self, run_id: int) -> dict[str, str]:
        """The environment of the run's commands (its items' too)."""
        env = command_env(self.job, holder=self.ctx.holder, run_id=run_id, token=self.token,
                          slot=self.slot, environ=self.ctx.environ, upstream=self.upstream)
        if self.item is not None:
            env.update(self.item.env())
        return env

    def _ended(self, attempt: int, run_id: int, outcome: ProcessEnd, started: float) -> None:
        """An attempt's command ended: record it and tell it, then retry,
        apply on-failure or end the run."""
        job, ctx = self.job, self.ctx
        self.last_outcome = outcome
        result = result_of(outcome)
        took = time.monotonic() - started
        retry = (result == m.FAILED and attempt <= job.retries and not self.watch.lost
                 and self.watch.killed is None  # an operator's kill ends the run, retries too
                 and not ctx.stop.is_set() and time.monotonic() + 0.1 < self.deadline)
        # A command that failed or ran into lock-at-most triggers on-failure;
        # one stopped by a shutdown or fencing does not.
        on_failure = not retry and result in (m.FAILED, m.TIMEOUT) and not ctx.stop.is_set()
        last = not retry and not (on_failure and job.on_failure.wanted)
        # Nothing but the record and the release follows: the run no longer
        # holds up the job's next slot (:meth:`winding_up`).
        self._winding_up = last
        output = stored_output(outcome)
        self._record_result(run_id, outcome, output, took, release=last)
        self._emit(RunEnded(
            job=job, host=ctx.holder, run_id=run_id, first_run_id=self._first_run_id or run_id,
            slot=self.slot, attempt=attempt, result=result,
            exit_code=shell_status(outcome.exit_code), duration=took, output=output,
            detail=outcome.detail, final=not retry, token=self.token,
            item=self.item.item if self.item is not None else None, upstream=self.upstream))
        if retry:
            ctx.loop.call_later(retry_wait(job, attempt),
                                lambda: self._step(lambda: self._retry(attempt)))
        elif on_failure:
            self._on_failure(outcome)
        else:
            self._end()

    def _emit(self, event: RunStarted | RunEnded) -> None:
        if self.ctx.events is not None:
            self.ctx.events.emit(event)

    @property
    def commands(self) -> int:
        """Commands it counts for ``--max-running``: one, from its claim (or
        the end of its slot's wait) to its release."""
        return 0 if self.queued else 1

    def winding_up(self) -> bool:
        """Whether the run's command is over and only its bookkeeping (its
        record, the release; retried through an outage) is left: its job's
        next slot then waits for it rather than being skipped."""
        return self._winding_up

    def _retry(self, attempt: int) -> None:
        """After a failed attempt's retry delay (cut short by a shutdown)."""
        ctx = self.ctx
        if self._lease_ran_out():
            # No attempt starts without the lease.
            log.warning("job %s: not retrying: its lease could not be renewed in time",
                        self.label)
            self._end()
            return
        if ctx.stop.is_set() or time.monotonic() + 0.1 >= self.deadline:
            if not ctx.stop.is_set() and self.last_outcome is not None:
                self._on_failure(self.last_outcome)
            else:
                self._end()
            return
        log.info("job %s: retrying (attempt %d of %d)", self.job.name, attempt + 1,
                 self.job.retries + 1)
        self._attempt(attempt + 1)

    def _end(self) -> None:
        """Stop renewing, release the lock unless the result did, and say so."""
        if self.done.is_set():
            return
        try:
            self.ctx.renewer.remove(self.watch)
            if not self._released:
                self._release()
            if self.watch.seat is not None and not self._seat_released:
                self._release_seat(self.watch.seat)
        finally:
            self.done.set()
            if self.on_done is not None:
                self.on_done(self)

    def _record_result(self, run_id: int, outcome: ProcessEnd, output: str, took: float, *,
                       release: bool) -> None:
        """The run's result, its command's duration ``took`` (not until the
        write got through an outage); with ``release`` the lock's release in
        the same round trip (where the store can), the lease's renewals
        stopped first."""
        job, ctx = self.job, self.ctx
        result = result_of(outcome)
        code = shell_status(outcome.exit_code)
        store, what, within = ctx.store, f"record result of {job.name}", 60.0
        written: bool | None
        item = self.item
        if release:
            ctx.renewer.remove(self.watch)
            both = ctx.outage.retry(what, (lambda: item.finish_and_release(
                result, code, output, job.lock_at_least, took)) if item is not None else
                lambda: store.finish_and_release(
                run_id, self.lock, ctx.holder, self.token, result, code, output,
                self.least, seat=self.watch.seat, took=took), within)
            written = None if both is None else both[0]
            self._released = self._seat_released = both is not None
            if self._released:
                self._prune()
        else:
            written = ctx.outage.retry(what, (lambda: item.finish(result, code, output, took))
                                       if item is not None else lambda: store.finish_run(
                run_id, self.lock, self.token, result, code, output, took=took), within)
        if written is False:
            log.warning("job %s: run %d result not recorded: token %d is no longer current",
                        job.name, run_id, self.token)

    def _release(self) -> None:
        job, ctx, item = self.job, self.ctx, self.item
        ctx.outage.retry(f"release {job.name}",
                         (lambda: item.release(job.lock_at_least)) if item is not None else
                         lambda: ctx.store.release(self.lock, ctx.holder, self.token,
                                                   self.least),
                         30.0)
        self._prune()

    def _release_seat(self, seat: tuple[str, int]) -> None:
        """Free the group seat the run held (its lock-at-least holds the job, not the seat)."""
        ctx = self.ctx
        ctx.outage.retry(f"release {seat[0]}",
                         lambda: ctx.store.release_seat(seat, ctx.holder),
                         30.0)

    def _prune(self) -> None:
        job, ctx = self.job, self.ctx
        if job.history_limit and self.last_run_id and self.last_run_id % 50 == 0:
            try:
                ctx.store.prune_runs(job.name, job.history_limit)
            except DatabaseError:
                pass

    def _on_failure(self, outcome: ProcessEnd) -> None:
        """Disable the job and/or start its on-failure command; the run ends
        after that command (its lock stays held while it runs)."""
        job, ctx = self.job, self.ctx
        disable_for = job.on_failure.disable_for
        store = ctx.store
        if disable_for and isinstance(store, Disables):
            reason = (f"on-failure: run {self.last_run_id} exited "
                      f"{shell_status(outcome.exit_code)} on {ctx.holder}")
            if ctx.outage.retry(f"disable {job.name}",
                                lambda: store.disable(job.name, for_seconds=disable_for,
                                                      reason=reason),
                                30.0) is not None:
                log.warning("job %s: disabled for %gs after failure", job.name, disable_for)
        if job.on_failure.command is None:
            self._end()
            return
        env = self._env(self.last_run_id or 0)
        env["DBLOCKRUN_EXIT_CODE"] = str(shell_status(outcome.exit_code))
        process = Process(
            argv_for(job.on_failure.command, job.shell), env=env, cwd=job.workdir,
            on_line=line_logger(f"[{job.name} on-failure] ", job=job.name,
                                run_id=self.last_run_id),
            deadline=time.monotonic() + 300, watch=None, stop=ctx.stop,
            kill_grace=ctx.kill_grace, stop_grace=ctx.stop_grace, stop_why=ctx.stop_why,
            user=job.user, limits=job.limits, name=job.name,
        )

        def ended() -> None:
            ctx.loop.unwatch(process)
            process.finish()
            self._end()

        if process.start(on_end=lambda: self._step(ended)) is not None:
            self._end()
        else:
            ctx.loop.watch(process)
