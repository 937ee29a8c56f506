"""The scheduler loop: sleep until the next due slot by the database clock,
claim it, run the command under a renewed lease, record the run."""

from __future__ import annotations

import json
import logging
import random
import resource
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime

from dblockrun import spawn
from dblockrun.catchup import CatchUp
from dblockrun.config import load_jobs
from dblockrun.errors import ConfigError, DatabaseError, DatabaseRefused, SchemaTooNew
from dblockrun.fanout import FanOut
from dblockrun.fleet import FleetBooks
from dblockrun.heartbeat import DbClock, Renewer
from dblockrun.holder import new_holder_id as new_holder_id
from dblockrun.jobs import Job, JobsFile
from dblockrun.limits import Seat, all_seats, full_reason, take_seat
from dblockrun.listen import RequestListener
from dblockrun.metrics import Metrics, serve
from dblockrun.metrics import url_of as metrics_url
from dblockrun.notify import Notifier
from dblockrun.outage import Outage
from dblockrun.outage import describe as describe_outage
from dblockrun.planning import Agenda, catch_up, next_attempt, next_due, too_late
from dblockrun.runjob import JobRun, RunContext
from dblockrun.runloop import RunLoop
from dblockrun.schedule import next_slot_at
from dblockrun.sdnotify import SystemdNotifier
from dblockrun.secreturl import resolve_secrets
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.engine import CLAIM_TOLERANCE, Claimed
from dblockrun.targeting import (
    HOSTNAME,
    describe,
    every_host_rows,
    label_text,
    loads_labels,
    local_jobs,
    targets_json,
    unmatched,
)
from dblockrun.wakeup import Wakeup

log = logging.getLogger("dblockrun")

#: A batch claim takes this host's share first; the rest of the batch is tried
#: this long after, once the other hosts have had their turn.
_SHARE_WAIT = 0.25


@dataclass(frozen=True)
class DaemonOptions:
    heartbeat: float = 10.0
    lease: float = 30.0
    grace: float = 30.0
    kill_grace: float = 5.0
    #: How often the daemon looks for `dblockrun run` requests (one statement)
    #: on MySQL and SQLite; on PostgreSQL it hears them (dblockrun/listen.py).
    request_poll: float = 1.0
    #: Serve Prometheus metrics and /healthz on [HOST:]PORT.
    metrics_addr: str | None = None
    #: This host's labels (``--label``, ``DBLOCKRUN_LABELS``); ``hostname``
    #: defaults to this machine's (dblockrun/targeting.py).
    labels: tuple[tuple[str, str], ...] = ()
    #: Commands at once on this host (None: no limit); at it, the host leaves
    #: slots to the others (dblockrun/limits.py).
    max_running: int | None = None


def _raise_open_files_limit() -> None:
    """Each running command holds a few descriptors (output pipes and
    lifeline here, pidfd and copies in the spawn service, which inherits
    the limit): lift the soft limit (often 1,024) to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class Daemon:
    def __init__(
        self,
        jobs: JobsFile,
        store: Store,
        options: DaemonOptions = DaemonOptions(),
        *,
        stop: threading.Event | None = None,
        holder: str | None = None,
    ) -> None:
        self.store = store
        self.options = options
        #: This host's labels; ``self.jobs`` is the part of ``self.file`` it runs.
        self.labels = {HOSTNAME: socket.gethostname(), **dict(options.labels)}
        self._labels_json = json.dumps(self.labels, sort_keys=True)
        self._load(jobs)
        self.stop = stop or threading.Event()
        self.holder = holder or new_holder_id()
        #: systemd's notify socket, if started by it (before the environment
        #: commands start from is read: they don't inherit its variables).
        self.systemd = SystemdNotifier()
        self.clock = DbClock()
        self.outage = Outage()
        self.renewer = Renewer(store, options.heartbeat, self.outage)
        self.metrics = Metrics()
        self.metrics.watch(self._live_metrics)
        self._wake = Wakeup()
        # Set from signal handlers, so plain flags: acted on by the main loop.
        self._stop_requested = False
        self._stop_now = False
        self._reload_requested = False
        self._agenda = Agenda()
        self._running: dict[str, JobRun | FanOut] = {}
        self._running_lock = threading.Lock()
        self._shutdown_deadline: float | None = None
        self._next_request_poll = 0.0
        #: PostgreSQL: requests are announced (LISTEN/NOTIFY) and read by the
        #: bookkeeping round; the jobs heard of, and whether to read them all.
        self._announced = store.lock.q.one_round
        self._heard: set[str] = set()
        self._heard_all = False
        self._heard_lock = threading.Lock()
        self.listener = (RequestListener(store, self._hear, options.heartbeat,
                                         killed=self.renewer.renew_now)
                         if self._announced else None)
        self._finished: set[str] = set()
        #: Slots left to other hosts because this one was at --max-running,
        #: per job: looked at again once, _SHARE_WAIT later.
        self._deferred: dict[str, float] = {}
        #: Per job, the highest fencing token won here and the newest slot run here.
        self._seen: dict[str, tuple[int, float | None]] = {}
        #: Missed slots after downtime: recorded at start, or run one at a time.
        self.catchup = CatchUp(store, self.holder, self.metrics)
        #: Host row, clock samples, lost runs, drift: on their own timer.
        self.books = FleetBooks(store, self.holder, options.heartbeat, self.clock, self.outage,
                                self.metrics, lambda: self.jobs, self._running_count,
                                self._hear if self._announced else None,
                                labels=self._labels_json, targets=lambda: self._targets)
        #: Notifications and pings, sent by a thread of its own (dblockrun/notify.py).
        self.notifier = Notifier(store, self.holder, self.metrics)
        self.ctx = RunContext(
            store=store,
            holder=self.holder,
            lease=options.lease,
            kill_grace=options.kill_grace,
            renewer=self.renewer,
            outage=self.outage,
            stop=self.stop,
            stop_grace=lambda: self._shutdown_deadline,
            loop=RunLoop(self.stop),
            metrics=self.metrics,
            notifier=self.notifier,
        )

    # -- control from signal handlers ---------------------------------------
    # A handler runs on the main thread, between any two of its bytecodes: it
    # must take no lock the main thread might hold (so no Event.set()).

    def request_stop(self) -> None:
        """SIGTERM: stop claiming; running jobs get ``grace`` to finish."""
        if self._shutdown_deadline is None:
            self._shutdown_deadline = time.monotonic() + self.options.grace
        self._stop_requested = True
        self._wake.set()

    def interrupt(self) -> None:
        """SIGINT: the first is a stop request; one while stopping ends the
        grace now (a second Ctrl-C): running commands are stopped at once
        and recorded killed. (A repeated SIGTERM, as some supervisors send,
        keeps the grace.)"""
        if self._stop_requested:
            self._shutdown_deadline = time.monotonic()
            self._stop_now = True
        self.request_stop()

    def request_reload(self) -> None:
        self._reload_requested = True
        self._wake.set()

    def _stopping(self) -> bool:
        """Whether to stop; passes a requested stop on to the run threads."""
        if self._stop_requested and not self.stop.is_set():
            self.stop.set()
        return self.stop.is_set()

    def _pause(self, seconds: float) -> None:
        """Sleep on the main thread; a stop request cuts it short."""
        deadline = time.monotonic() + seconds
        while not self._stopping() and (left := deadline - time.monotonic()) > 0:
            self.systemd.watchdog()
            self._wake.wait(min(left, self.systemd.sleep_cap() or left))

    # -- main loop ------------------------------------------------------------

    def run(self) -> None:
        from dblockrun.dburl import describe  # (issue 11 item 24: no repr, no "1 jobs")

        count = len(self.file.jobs)
        log.info(
            "daemon %s starting: %d %s from %s, database %s",
            self.holder, count, "job" if count == 1 else "jobs", self.jobs.path,
            describe(self.store.url, self.store.prefix),
        )
        if len(self.labels) > 1 or self._targets is not None:
            log.info("labels %s: %d of the %d jobs run on this host",
                     label_text(self.labels),
                     len(self.jobs.jobs), count)
        _raise_open_files_limit()
        # Every command is started by the spawn service, started now, before
        # this process has a thread of its own (nothing forks the daemon).
        spawn.start()
        server = None
        if self.options.metrics_addr:
            server = serve(self.metrics, self.options.metrics_addr, self.healthy)
            log.info("metrics on %s", metrics_url(server))
        try:
            self._run()
        finally:
            if server is not None:
                server.shutdown()
            self._wake.close()
            self.systemd.close()

    def healthy(self) -> bool:
        """The database answered within the last three heartbeats."""
        return (not self.outage.down
                and time.monotonic() - self.outage.last_ok < 3 * self.options.heartbeat)

    def _live_metrics(self) -> dict[str, float | None]:
        return {
            "running": self.renewer.count,
            "db_errors": self.outage.errors,
            "clock_offset": self.clock.offset,
            "db_up": 1.0 if self.healthy() else 0.0,
        }

    def _run(self) -> None:
        if not self._startup():
            self.systemd.stopping("stopped before it reached the database")
            return
        self.renewer.start()
        self.books.start()
        if self.listener is not None:
            self.listener.start()
        self._plan_all()
        self.systemd.ready(self._describe())
        try:
            while not self._stopping():
                self.systemd.watchdog()
                if self._reload_requested:
                    self._reload_requested = False
                    self._do_reload()
                self._fire_due()
                self._poll_requests()
                self._replan_finished()
                self._wake.wait(self._sleep_time())
        finally:
            self._shutdown()

    def _load(self, file: JobsFile) -> None:
        """Take ``file`` (at start, or reloaded): this host runs the jobs
        whose ``run-on`` its labels match (dblockrun/targeting.py)."""
        self.file = file
        self.jobs = local_jobs(file, self.labels)
        self._targets = targets_json(file)

    def _ensure_rows(self) -> None:
        """The lock rows of the file's jobs (a targeted job's too, so status
        shows it unmatched), and this host's rows of its every-host jobs."""
        self.store.ensure_jobs([*(j.name for j in self.file.jobs), *all_seats(self.file)])
        self.store.ensure_every_host(every_host_rows(self.jobs))

    def _warn_unmatched(self) -> None:
        """A warning for each job of the file no live host's labels match."""
        if not any(j.run_on for j in self.file.jobs):
            return  # no statement for files without run-on
        live = [loads_labels(h.labels) for h in self.store.hosts(3 * self.options.heartbeat)
                if h.id != self.holder]
        for job in unmatched(self.file, [*live, self.labels]):
            log.warning("job %s: no live host matches run-on %s (this host: %s), so it runs "
                        "nowhere", job.name, describe(job.run_on),
                        label_text(self.labels))

    def _startup(self) -> bool:
        while not self._stopping():
            try:
                self.store.ensure_schema()
                self._ensure_rows()
                self.books.report_bad_rows()
                self.books.round()
                self._warn_unmatched()
                self._publish_next_due()
                self.catchup.begin(self.jobs.jobs)
                self.outage.ok()
                return True
            except (DatabaseRefused, SchemaTooNew):
                raise  # retrying cannot fix these: exit status 1 with the reason
            except DatabaseError as exc:
                delay = self.outage.failed("startup", exc)
                self.systemd.status(f"waiting for the database: {describe_outage(exc)}")
                self._pause(delay)
        return False

    def _describe(self) -> str:
        """What the daemon runs, for systemd's STATUS= (no secret in it)."""
        from dblockrun.dburl import describe

        count = len(self.jobs.jobs)
        return (f"{count} {'job' if count == 1 else 'jobs'} from {self.jobs.path}, database "
                f"{describe(self.store.url, self.store.prefix)}")

    def _running_count(self) -> int:
        with self._running_lock:
            return len(self._running)

    def _free(self) -> int | None:
        """How many more runs this host may start (None: no --max-running)."""
        cap = self.options.max_running
        return None if cap is None else max(0, cap - self._running_count())

    def _sleep_time(self) -> float:
        until_poll = (self.options.heartbeat if self._announced
                      else self._next_request_poll - time.monotonic())
        next_at = self._agenda.next_at()
        # (the watchdog's cap: the loop pings systemd at least that often)
        longest = min(self.options.heartbeat, self.systemd.sleep_cap() or self.options.heartbeat)
        if next_at is None:
            return max(0.0, min(longest, until_poll))
        until_due = next_at - self.clock.now()
        return max(0.0, min(longest, until_due, until_poll))

    def _hear(self, names: list[str] | None) -> None:
        """Requests announced or read by a round (``names``), or None: read
        them all (the listener has just connected). From other threads."""
        with self._heard_lock:
            if names is None:
                self._heard_all = True
            else:
                self._heard.update(names)
        self._wake.set()

    def _requests(self) -> list[str] | None:
        """The jobs to look at for run-now requests now, or None: none."""
        if self._announced:
            with self._heard_lock:
                heard, read_all = self._heard, self._heard_all
                self._heard, self._heard_all = set(), False
            if read_all:
                heard.update(self.store.requested())
            return sorted(heard) if heard else None
        if time.monotonic() < self._next_request_poll:
            return None
        self._next_request_poll = time.monotonic() + self.options.request_poll
        return self.store.requested()

    def _poll_requests(self) -> None:
        """Run the jobs an operator asked for with `dblockrun run JOB`."""
        try:
            names = self._requests()
            if names is None:
                return
            for name in names:
                job = self.jobs.job(name)
                # (issue 11 item 3) `enabled: false` in this host's file: not run here either.
                if job is None or not job.enabled or job.fan_out:
                    continue  # only enabled jobs of the local file; fan-out jobs follow their items
                with self._running_lock:
                    if name in self._running:
                        continue
                if self._free() == 0:
                    continue  # at --max-running: the request stays for a host with room
                sent = time.monotonic()
                token = self.store.claim_requested(name, self.holder, self.options.lease)
                if token is not None:
                    log.info("job %s: run requested by an operator", name)
                    self._start(job, token, None, sent)
            self.outage.ok()
        except DatabaseError as exc:
            self.outage.failed("run requests", exc)

    # -- planning -------------------------------------------------------------

    def _push(self, fire_at: float, name: str, slot: float | None) -> None:
        self._agenda.push(fire_at, name, slot)

    def _plan_all(self) -> None:
        self._agenda.clear()
        now = self.clock.now()
        # At start: from where catch-up left each job (dblockrun/catchup.py).
        start, self.catchup.checked_at = self.catchup.checked_at or now, None
        resume, self.catchup.resume = self.catchup.resume, {}
        self.catchup.keep(j.name for j in self.jobs.jobs if j.enabled)
        for job in self.jobs.jobs:
            if job.enabled:
                head = self.catchup.head(job.name)
                if head is not None:
                    self._push(now, job.name, head)
                else:
                    self._plan(job, resume.get(job.name, start))

    def _plan(self, job: Job, after: float) -> None:
        """Queue the job's next attempt: its next slot strictly after database
        time ``after``, or for a rate-only job an attempt at ``after``."""
        jitter = random.uniform(0, job.jitter) if job.jitter else 0.0
        fire_at, slot = next_attempt(job, after, self.clock.uncertainty + 0.001, jitter)
        self._push(fire_at, job.name, slot)

    def _publish_next_due(self) -> None:
        now = self.clock.now()
        due: dict[str, float | None] = {}
        for job in self.jobs.jobs:
            if job.cron is not None and job.enabled:
                due[job.name] = next_slot_at(job.cron, job.timezone, now)
        self.store.set_next_due(due)

    # -- firing ---------------------------------------------------------------

    def _fire_due(self) -> None:
        batch: list[tuple[Job, float, float]] = []
        while not self._stopping():
            now = self.clock.now()
            head = self._agenda.pop_due(now)
            if head is None:
                break
            job = self.jobs.job(head.name)
            if job is None or not job.enabled:
                continue
            if head.slot is not None and self.catchup.head(job.name) is not None:
                self._fire_missed(job, head.slot, now)
                continue
            due_next = self._batchable(job, head.slot, now)
            if due_next is not None and head.slot is not None:
                batch.append((job, head.slot, due_next))
            else:
                self._fire(job, head.slot, now)
        if len(batch) == 1:
            self._fire(batch[0][0], batch[0][1], self.clock.now())
        elif batch:
            self._fire_batch(batch)

    def _batchable(self, job: Job, slot: float | None, now: float) -> float | None:
        """The next slot after ``slot`` when this attempt is a plain claim of
        the newest slot (what a batch claim does), else None."""
        if slot is None or job.cron is None or job.fan_out or job.name in self._deferred:
            return None
        if too_late(job, slot, now):
            return None
        if next_slot_at(job.cron, job.timezone, slot) <= now:
            return None  # slots were passed: _fire drops or records them
        with self._running_lock:
            if job.name in self._running:
                return None  # _fire skips the slot
        return next_due(job, slot, CLAIM_TOLERANCE)

    def _fire_batch(self, batch: list[tuple[Job, float, float]]) -> None:
        """Many jobs due at once: claim them in few statements, this host's
        share first so the work spreads over the fleet, then (a moment later)
        whatever no other host took."""
        groups: dict[tuple[float, float, float | None], list[Job]] = {}
        for job, slot, due_next in batch:
            groups.setdefault((slot, due_next, job.rate), []).append(job)
        for (slot, due_next, rate), jobs in groups.items():
            by_name = {job.name: job for job in jobs}
            pending = list(by_name)
            random.shuffle(pending)
            hosts = self.books.live_hosts
            share = len(pending) if len(pending) < 4 * hosts else -(-len(pending) // hosts)
            first = time.monotonic()
            capped = False  # --max-running held this host back in the last pass
            for limit in (share, len(pending)):
                if not pending or self._stopping():
                    break
                if limit != share:
                    self._pause(first + _SHARE_WAIT - time.monotonic())
                free = self._free()
                take = limit if free is None else min(limit, free)
                capped = take < limit
                if take <= 0:
                    continue
                sent = time.monotonic()
                try:
                    won = self.store.claim_batch(pending, self.holder, self.options.lease,
                                                 slot=slot, next_due=due_next, rate=rate,
                                                 limit=take)
                    self.outage.ok()
                except DatabaseError as exc:
                    delay = self.outage.failed(f"claim {len(pending)} jobs", exc)
                    for name in pending:
                        self.metrics.claims.labels(name, "error").inc()
                        self._push(self.clock.now() + delay, name, slot)
                    pending = []
                    break
                for claimed in won:
                    self.metrics.claims.labels(claimed.name, "won").inc()
                    self._start(by_name[claimed.name], claimed.token, slot, sent,
                                claimed.run_id)
                taken = {c.name for c in won}
                pending = [name for name in pending if name not in taken]
            deferred = set(pending) if capped else set()
            look_again = self.clock.now() + max(0.0, first + _SHARE_WAIT - time.monotonic())
            for name in pending:
                if name in deferred:
                    # Left to the other hosts: looked at once more (_at_limit).
                    self._deferred[name] = slot
                    self._push(look_again, name, slot)
                else:
                    self.metrics.claims.labels(name, "lost").inc()
            for job in jobs:
                if job.name not in deferred:
                    self._plan(job, slot)

    def _fire(self, job: Job, slot: float | None, now: float) -> None:
        passed: deque[float] = deque()
        if slot is not None:
            # Older passed slots are dropped, or recorded missed when the job
            # has a starting-deadline.
            slot, passed = catch_up(job, slot, now)
            due_next = next_due(job, slot, CLAIM_TOLERANCE)
        with self._running_lock:
            busy_here = job.name in self._running
        if job.fan_out:
            self._fan_out(job, slot, busy_here,
                          due_next if slot is not None else None)
            return
        try:
            if passed:  # recorded missed, deadline or not (one read spares the
                #          skip_slot of those another host has run)
                known = self.store.lock_state(job.name)
                floor = known.last_slot if known is not None else None
                for old in passed:
                    if floor is None or old > floor:
                        self._missed(job, old, now, newer=slot)
            if slot is not None and busy_here:
                if self.store.skip_slot(job.name, slot):
                    self.store.start_run(job.name, self.holder, token=None, slot=slot,
                                         result=m.SKIPPED)
                    self.metrics.missed.labels(job.name, "skipped").inc()
                    log.warning("job %s: slot %s skipped: previous run still going",
                                job.name, _utc(slot).isoformat())
                self._plan(job, slot)
                return
            if (
                slot is not None
                and job.starting_deadline is not None
                and now - slot > job.starting_deadline
            ):
                self._missed(job, slot, now)
                self._plan(job, slot)
                return
            if self._free() == 0:
                self._at_limit(job, slot)
                return
        except DatabaseError as exc:
            self._claim_failed(job, slot, exc)
            return
        self._deferred.pop(job.name, None)
        claimed = self._claim(job, slot, due_next if slot is not None else None)
        if claimed is None:
            return
        won, sent = claimed
        if won is not None:
            self._start(job, won.token, slot, sent, won.run_id)
        if slot is not None:
            self._plan(job, slot)
        else:
            self._plan_rate(job, refused=won is None)

    def _claim(self, job: Job, slot: float | None,
               due_next: float | None) -> tuple[Claimed | None, float] | None:
        """Claim the job's ``slot`` (None: a rate-only job's turn) with its
        first attempt's record, counted in the metrics: (what was won, when
        the claim was sent), or None after a database error (tried again
        after the outage's backoff)."""
        sent = time.monotonic()
        try:
            won = self.store.claim_and_record(job.name, self.holder, self.options.lease,
                                              slot=slot, rate=job.rate, next_due=due_next)
            self.outage.ok()
        except DatabaseError as exc:
            self._claim_failed(job, slot, exc)
            return None
        self.metrics.claims.labels(job.name, "won" if won is not None else "lost").inc()
        return won, sent

    def _claim_failed(self, job: Job, slot: float | None, exc: DatabaseError) -> None:
        """An attempt the database failed: counted, and tried again after
        the outage's backoff."""
        self.metrics.claims.labels(job.name, "error").inc()
        delay = self.outage.failed(f"claim {job.name}", exc)
        self._push(self.clock.now() + delay, job.name, slot)

    def _at_limit(self, job: Job, slot: float | None) -> None:
        """This host already runs ``--max-running`` commands: it does not
        claim, and leaves the slot to the other hosts. Looked at again
        ``_SHARE_WAIT`` later, a slot still unclaimed is recorded skipped
        (by one host: the conditional skip), saying why."""
        if slot is None:  # a rate job: tried again soon, here or on a host with room
            self._push(self.clock.now() + 1.0, job.name, None)
            return
        if self._deferred.get(job.name) != slot:
            self._deferred[job.name] = slot
            self._push(self.clock.now() + _SHARE_WAIT, job.name, slot)
            return  # the next slot is planned after the second look
        del self._deferred[job.name]
        limit = self.options.max_running or 0
        if self.store.skip_slot(job.name, slot):
            self.store.start_run(job.name, self.holder, token=None, slot=slot,
                                 result=m.SKIPPED,
                                 output=full_reason(self.holder, limit, _SHARE_WAIT))
            self.metrics.missed.labels(job.name, "max-running").inc()
            log.warning("job %s: slot %s skipped: this host is at its --max-running limit "
                        "(%d) and no other host took it", job.name, _utc(slot).isoformat(),
                        limit)
        self._plan(job, slot)

    def _missed(self, job: Job, slot: float, now: float, newer: float | None = None) -> None:
        """Record ``slot`` missed, once fleet-wide: too late for the job's
        starting-deadline, or passed over for a ``newer`` slot."""
        if newer is None:
            why = f"{now - slot:.1f}s late, starting-deadline {job.starting_deadline:g}s"
        else:
            why = (f"passed over: tried {now - slot:.1f}s late (this daemon was paused, busy "
                   f"or without the database), so only the newest slot, "
                   f"{_utc(newer).isoformat()}")
        if self.store.skip_slot(job.name, slot):
            self.store.start_run(job.name, self.holder, token=None, slot=slot, result=m.MISSED,
                                 output=f"missed: {why}\n")
            self.metrics.missed.labels(job.name, "missed").inc()
            log.warning("job %s: slot %s missed (%s)", job.name, _utc(slot).isoformat(), why)
            rule = (f"starting-deadline {job.starting_deadline:g}s" if newer is None else
                    f"passed over for the newer slot {_utc(newer).isoformat()}")
            self.notifier.missed(job, slot, now - slot, rule)

    def _fire_missed(self, job: Job, slot: float, now: float) -> None:
        """The oldest missed slot a catch-up still runs (dblockrun/catchup.py),
        with the normal slot claim, so two daemons never both run it. The
        next one is tried when this run is over, or at once when another
        host took this one; the regular schedule resumes after the last."""
        if slot != self.catchup.head(job.name):
            return  # planned before the catch-up moved on
        with self._running_lock:
            if job.name in self._running:
                return  # its end tries the next (_replan_finished)
        queue = self.catchup.backlog[job.name]
        due_next = queue[1] if len(queue) > 1 else next_due(job, slot, CLAIM_TOLERANCE)
        try:
            if too_late(job, slot, now):
                self._missed(job, slot, now)
                self.catchup.done(job.name, slot)
                self._next_missed(job, slot)
                return
        except DatabaseError as exc:
            self._claim_failed(job, slot, exc)
            return
        claimed = self._claim(job, slot, due_next)
        if claimed is None:
            return
        won, sent = claimed
        if won is not None:
            self.catchup.done(job.name, slot)
            if self.catchup.head(job.name) is None:
                self._plan(job, slot)
            self._start(job, won.token, slot, sent, won.run_id)
            return
        try:
            lock = self.store.lock_state(job.name)
        except DatabaseError as exc:
            self._push(self.clock.now() + self.outage.failed(f"read {job.name}", exc),
                       job.name, slot)
            return
        now = self.clock.now()
        if lock is None or (lock.last_slot is not None and lock.last_slot >= slot):
            # Another host ran it (or recorded it): on to the next.
            self.catchup.done(job.name, slot if lock is None else max(slot, lock.last_slot or slot))
            self._next_missed(job, slot)
        elif lock.lock_until is not None and lock.lock_until > now:
            # Held: another host runs an earlier missed slot, and tries the
            # next when it is over; try again in case it does not.
            retry = min(now + self.options.heartbeat, lock.lock_until)
            self._push(retry + self.clock.uncertainty, job.name, slot)
        else:
            log.warning("job %s: catch-up stopped at slot %s: it cannot be claimed (disabled, "
                        "its rate, or a lock row edited by hand)", job.name,
                        _utc(slot).isoformat())
            self.catchup.drop(job.name)
            self._plan(job, slot)

    def _next_missed(self, job: Job, after: float) -> None:
        head = self.catchup.head(job.name)
        if head is not None:
            self._push(self.clock.now(), job.name, head)
        else:
            self._plan(job, after)

    def _plan_rate(self, job: Job, refused: bool = False) -> None:
        """Next attempt of a rate-only job: when its last start is ``rate`` old.
        ``refused``: its claim was just lost though it looked due (the fleet
        paused, the job disabled): not again before a heartbeat (or its rate)."""
        assert job.rate is not None
        now = self.clock.now()
        try:
            lock = self.store.lock_state(job.name)
        except DatabaseError as exc:
            self._push(now + self.outage.failed(f"read {job.name}", exc), job.name, None)
            return
        due = now + job.rate
        if lock is not None and lock.last_start is not None:
            # min(): a last start in the future (a row edited by hand) must not
            # silence the job for longer than a rate; `dblockrun unlock` repairs it.
            due = min(lock.last_start, now) + job.rate
            if lock.lock_until is not None and lock.lock_until > due:
                due = lock.lock_until
        if refused:
            due = max(due, now + min(job.rate, self.options.heartbeat))
        self._push(max(due, now + 0.05) + self.clock.uncertainty, job.name, None)

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
        self.metrics.went_backwards.labels(job.name).inc()
        log.error("job %s: the database went backwards (token %d after %d, last slot %s after "
                  "%s this daemon ran): it lost committed writes, e.g. in a failover to an "
                  "asynchronous standby%s", job.name, token, seen_token,
                  _utc(slot).isoformat() if slot is not None else "-",
                  _utc(seen_slot).isoformat() if seen_slot is not None else "-",
                  "; not running that slot again" if again else "")
        self._seen[job.name] = (token, seen_slot)  # the database's sequence from here on
        if not again:
            return False
        try:
            if run_id is not None:
                self.store.finish_and_release(run_id, job.name, self.holder, token, m.SKIPPED,
                                              None, "not run: this daemon already ran the slot")
            else:
                self.store.release(job.name, self.holder, token)
        except DatabaseError as exc:
            self.outage.failed(f"release {job.name}", exc)
        return True

    def _start(self, job: Job, token: int, slot: float | None, claimed_mono: float,
               run_id: int | None = None) -> None:
        if self._went_back(job, token, slot, run_id):
            return
        seat = None
        if job.group is not None:
            seat = self._seat(job, token, slot, run_id)
            if seat is None:
                return
        run = JobRun(self.ctx, job, token, slot, claimed_mono, on_done=self._done, run_id=run_id,
                     seat=seat)
        with self._running_lock:
            self._running[job.name] = run
        run.start()

    def _seat(self, job: Job, token: int, slot: float | None,
              run_id: int | None) -> Seat | None:
        """A grouped job's claim won: take a seat of its group too (one more
        round trip). With none free (or the database failing), the claim is
        released and the run recorded skipped with the reason: its slot is
        taken, so no host runs it late."""
        try:
            got = take_seat(self.store, self.jobs, job, self.holder, self.options.lease)
            self.outage.ok()
        except DatabaseError as exc:
            self.outage.failed(f"claim a seat of group {job.group}", exc)
            got = f"skipped: could not take a seat of group {job.group}: database error\n"
        if not isinstance(got, str):
            return got
        self.metrics.missed.labels(job.name, "group").inc()
        log.warning("job %s: %s", job.name, got.strip())
        try:
            if run_id is not None:
                self.store.finish_and_release(run_id, job.name, self.holder, token, m.SKIPPED,
                                              None, got)
            else:
                self.store.release(job.name, self.holder, token)
                self.store.start_run(job.name, self.holder, token=token, slot=slot,
                                     result=m.SKIPPED, output=got)
        except DatabaseError as exc:  # its lease runs out; the run is recorded lost
            self.outage.failed(f"release {job.name}", exc)
        return None

    def _fan_out(self, job: Job, slot: float | None, busy_here: bool,
                 next_due: float | None) -> None:
        """Work through the job's items (in a thread) unless still at it."""
        if busy_here:
            log.info("job %s: still working through the items of the previous slot", job.name)
        elif self._free() == 0:
            log.info("job %s: at --max-running: its items are left to the other hosts", job.name)
        else:
            worker = FanOut(self.ctx, job, slot, on_done=self._done, next_due=next_due)
            with self._running_lock:
                self._running[job.name] = worker
            worker.start()
        if slot is not None:
            self._plan(job, slot)
        else:
            assert job.rate is not None
            # Items come due one by one; look again within a fraction of the rate.
            self._push(self.clock.now() + max(1.0, min(job.rate / 4, 30.0)), job.name, None)

    def _done(self, run: JobRun | FanOut) -> None:
        with self._running_lock:
            if self._running.get(run.job.name) is run:
                del self._running[run.job.name]
            self._finished.add(run.job.name)
        self._wake.set()

    def _replan_finished(self) -> None:
        """A rate-only job is due again ``rate`` after its start: plan that
        now that its run (and so its lease) is over."""
        with self._running_lock:
            names, self._finished = self._finished, set()
        for name in names:
            job = self.jobs.job(name)
            head = self.catchup.head(name)
            if job is not None and job.enabled and head is not None:
                self._push(self.clock.now(), name, head)  # the next missed slot
            elif job is not None and job.enabled and job.cron is None and not job.fan_out:
                self._plan_rate(job)

    # -- reload and shutdown --------------------------------------------------

    def _do_reload(self) -> None:
        try:
            new = resolve_secrets(load_jobs(self.jobs.path))
        except ConfigError as exc:
            log.error("reload failed, keeping the %d jobs loaded before: %s",
                      len(self.file.jobs), exc.message)
            return
        self._load(new)
        try:
            self._ensure_rows()
            self.books.report_bad_rows()
            self._warn_unmatched()
        except DatabaseError as exc:
            self.outage.failed("reload", exc)
        self._plan_all()
        try:
            self._publish_next_due()
        except DatabaseError as exc:
            self.outage.failed("reload", exc)
        log.info("reloaded %s: %d %s", new.path, len(new.jobs),
                 "job" if len(new.jobs) == 1 else "jobs")

    def _shutdown(self) -> None:
        with self._running_lock:
            runs = list(self._running.values())
        self.systemd.stopping(f"stopping: {len(runs)} running job(s) to finish or stop")
        if runs:
            log.info("stopping: waiting up to %gs for %d running job(s) "
                     "(interrupt again to stop them now)", self.options.grace, len(runs))
        told = False
        while left := sum(run.is_alive() for run in runs):
            if self._stop_now and not told:
                told = True
                log.warning("interrupted again: stopping %d running job(s) now", left)
            self.systemd.watchdog()
            self._wake.wait(0.1)  # rung by a finished run or a signal handler
        if self.listener is not None:
            self.listener.stop()
        self.notifier.close(timeout=5.0)  # the last runs' notifications and pings
        self.books.stop()
        self.renewer.stop()
        try:
            self.store.remove_host(self.holder)
        except DatabaseError:
            pass
        log.info("daemon %s stopped", self.holder)
