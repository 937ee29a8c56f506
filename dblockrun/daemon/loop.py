"""The daemon: its main loop and lifecycle. It sleeps until the planner's
next attempt by the database clock (dblockrun/scheduling/planner.py), has the attempts
made (dblockrun/daemon/firing.py), hands run-now requests from its inbox
(dblockrun/store/inbox.py) to them, and starts, reloads and stops the parts that
work beside it: lease renewals, bookkeeping, the request listener,
notifications, metrics (ARCHITECTURE.md names each thread and its owner)."""

from __future__ import annotations

import gc
import logging
import resource
import threading
import time
from dataclasses import dataclass

from dblockrun.config.load import load_jobs
from dblockrun.config.secreturl import resolve_secrets
from dblockrun.daemon.chains import Chains
from dblockrun.daemon.drain import DrainWatch
from dblockrun.daemon.firing import Firing
from dblockrun.daemon.fleet import FleetBooks
from dblockrun.daemon.registry import Runs
from dblockrun.daemon.reload import FileWatch, reloaded, reread
from dblockrun.daemon.sdnotify import SystemdNotifier
from dblockrun.daemon.state import DaemonState, Settings
from dblockrun.daemon.wakeup import Signals
from dblockrun.errors import (
    DatabaseError,
    DatabaseRefused,
    SchemaTooNew,
    ThreadCrashed,
)
from dblockrun.events import Events
from dblockrun.jobs import JobsFile
from dblockrun.metrics import Metrics
from dblockrun.notify.alerts import Alerts
from dblockrun.notify.notifier import Notifier
from dblockrun.running import spawn
from dblockrun.running.heartbeat import DbClock, Renewer
from dblockrun.running.holder import new_holder_id as new_holder_id
from dblockrun.running.runjob import RunContext
from dblockrun.running.runlog import log_run
from dblockrun.running.runloop import RunLoop
from dblockrun.running.seats import Queues
from dblockrun.running.slotbook import SlotBook
from dblockrun.scheduling.planner import Planner
from dblockrun.scheduling.targeting import (
    HOSTNAME,
    LocalJobs,
    label_text,
    loads_labels,
)
from dblockrun.store import Store
from dblockrun.store.dburl import describe as describe_db
from dblockrun.store.drain import DRAIN_NOTE
from dblockrun.store.inbox import HeardInbox, Inbox, inbox_for
from dblockrun.store.models import CLAIM_TOLERANCE
from dblockrun.store.outage import Outage
from dblockrun.store.outage import describe as describe_outage
from dblockrun.supervise import Threads

log = logging.getLogger("dblockrun")


@dataclass(frozen=True)
class DaemonOptions:
    heartbeat: float = 10.0
    lease: float = 30.0
    grace: float = 30.0
    kill_grace: float = 5.0
    #: How often the daemon looks for `dblockrun run` requests (one statement)
    #: on MySQL and SQLite; on PostgreSQL it hears them (dblockrun/store/listen.py).
    request_poll: float = 1.0
    #: Serve Prometheus metrics and /healthz on [HOST:]PORT.
    metrics_addr: str | None = None
    #: This host's labels (``--label``, ``DBLOCKRUN_LABELS``); ``hostname``
    #: defaults to this machine's (dblockrun/scheduling/targeting.py).
    labels: tuple[tuple[str, str], ...] = ()
    #: Commands at once on this host (None: no limit); at it, the host leaves
    #: slots to the others (dblockrun/scheduling/limits.py).
    max_running: int | None = None
    #: ``--when-full queue``: at ``--max-running``, at most this many slots
    #: nobody else took wait here for room (None: they are recorded skipped).
    host_queue: int | None = None
    #: ``--watch-file``: reload when the jobs file changes (dblockrun/daemon/reload.py).
    watch_file: bool = False


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


@dataclass(frozen=True)
class Parts:
    """What works beside the main loop, each on its own thread, and their
    supervision (the state's ``threads``, dblockrun/supervise.py): a crashed
    one fails /healthz and stops the watchdog pings."""

    renewer: Renewer
    books: FleetBooks
    inbox: Inbox
    notifier: Notifier
    #: ``--watch-file``'s thread (None: not asked for).
    watch: FileWatch | None = None


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
        local = LocalJobs(jobs, dict(options.labels))
        holder = holder or new_holder_id(local.labels[HOSTNAME])
        threads, events, signals, clock = Threads(), Events(), Signals(), DbClock()
        #: This host's drain (``dblockrun drain``), as the main loop applies it.
        self.drain = DrainWatch(store, local.labels[HOSTNAME], clock.now, signals.wake.set)
        #: What the daemon's parts share, built once (dblockrun/daemon/state.py).
        self.state = DaemonState(
            store=store, settings=Settings(holder, options.lease, options.heartbeat),
            local=local, runs=Runs(options.max_running, signals.wake.set),
            book=SlotBook(store, holder, events), clock=clock,
            # The end of an outage wakes the loop: the resyncs waiting for the
            # backoff are due then (Firing.fire_due).
            outage=Outage(on_back=signals.wake.set),
            # Prometheus with --metrics only: prometheus_client is not imported without it.
            metrics=self._metrics(), events=events, threads=threads, signals=signals,
            stop=stop or threading.Event(),
            # systemd's notify socket, if started by it (before the environment
            # commands start from is read: they don't inherit its variables).
            systemd=SystemdNotifier(alive=lambda: threads.problem() is None),
            grace=options.grace, drain=self.drain)
        self.parts = self._parts()
        self.firing = self._firing()
        self.state.metrics.watch(self._live_metrics)
        self.state.metrics.watch_threads(threads)

    @property
    def holder(self) -> str:
        return self.state.settings.holder

    def _metrics(self) -> Metrics:
        if not self.options.metrics_addr:
            return Metrics()
        from dblockrun.prometheus import Prometheus

        return Prometheus()

    def _parts(self) -> Parts:
        state, opts = self.state, self.options
        threads = state.threads
        renewer = Renewer(self.store, opts.heartbeat, state.outage, threads)
        inbox = inbox_for(self.store, state.signals.wake.set, opts.heartbeat,
                          opts.request_poll, killed=renewer.renew_now, threads=threads,
                          host=self.drain.host)
        alerts = Alerts(self.store, self.holder, state.jobs, state.events)
        books = FleetBooks(state, inbox.hear if isinstance(inbox, HeardInbox) else None,
                           settled=self._warn_unmatched, alerts=alerts)
        notifier = Notifier(self.store, self.holder, state.metrics, threads=threads,
                            hostname=state.local.labels[HOSTNAME], file=state.file)
        # The log, metrics, notifications, pings and alerts hear of runs and slots.
        for hear in (log_run, state.metrics.hear, notifier.hear, alerts.hear):
            state.events.subscribe(hear)
        watch = (FileWatch(lambda: state.local.jobs.path, self.request_reload, threads)
                 if opts.watch_file else None)
        return Parts(renewer, books, inbox, notifier, watch)

    def _firing(self) -> Firing:
        state, opts, parts = self.state, self.options, self.parts
        # running/ is below daemon/: the run context and the queues take the
        # state's bound methods, not the state (dblockrun/daemon/state.py).
        ctx = RunContext(
            store=self.store, holder=self.holder, lease=opts.lease, kill_grace=opts.kill_grace,
            renewer=parts.renewer, outage=state.outage, stop=state.stop,
            stop_grace=state.signals.grace_ends, stop_why=state.signals.stop_why,
            loop=RunLoop(state.stop, threads=state.threads),
            events=state.events, book=state.book, now=state.clock.now)
        queues = Queues(self.store, state.jobs, state.runs, self.holder, opts.lease,
                        state.clock.now, opts.host_queue, state.file)
        chains = Chains(state, parts.books.interval)
        return Firing(
            state, Planner(opts.heartbeat, CLAIM_TOLERANCE, host_queue=opts.host_queue is not None),
            ctx, parts.books, queues, chains)

    # -- control from signal handlers ---------------------------------------

    def request_stop(self) -> None:
        """SIGTERM: stop claiming; running jobs get ``grace`` to finish."""
        self.state.request_stop()

    def interrupt(self) -> None:
        """SIGINT: the first is a stop request; one while stopping ends the
        grace now (a second Ctrl-C): running commands are stopped at once
        and recorded killed. (A repeated SIGTERM, as some supervisors send,
        keeps the grace.)"""
        if self.state.signals.stop_requested:
            self.state.signals.deadline = time.monotonic()
            self.state.signals.stop_now = True
        self.request_stop()

    def request_reload(self) -> None:
        self.state.signals.reload = True
        self.state.signals.wake.set()

    # -- main loop ------------------------------------------------------------

    def run(self) -> None:
        count = len(self.state.local.file.jobs)
        log.info("daemon %s starting: %d %s from %s, database %s", self.holder, count,
                 "job" if count == 1 else "jobs", self.state.local.jobs.path,
                 describe_db(self.store.url, self.store.prefix))
        if self.state.local.targeted:
            log.info("labels %s: %d of the %d jobs run on this host",
                     label_text(self.state.local.labels), len(self.state.local.jobs.jobs), count)
        _raise_open_files_limit()
        # Every command is started by the spawn service, started now, before
        # this process has a thread of its own (nothing forks the daemon).
        service = spawn.start()
        self._limits(service.pid)
        server = None
        if self.options.metrics_addr:
            from dblockrun.prometheus import Prometheus, serve, url_of

            assert isinstance(self.state.metrics, Prometheus)  # made so for --metrics (_metrics)
            server = serve(self.state.metrics, self.options.metrics_addr, self.problem,
                           self.state.threads)
            log.info("metrics on %s", url_of(server))
        try:
            self._run()
        finally:
            if server is not None:
                server.shutdown()
            self.state.signals.wake.close()
            self.state.systemd.close()
        if self.state.threads.fatal is not None:
            raise ThreadCrashed(f"{self.state.threads.fatal}: stopped")

    def healthy(self) -> bool:
        """What /healthz answers: no problem (see :meth:`problem`)."""
        return self.problem() is None

    def problem(self) -> str | None:
        """Why this daemon is unhealthy: a background thread crashed (and
        has not completed a round since), or the database did not answer
        within the last three heartbeats; None: healthy."""
        return self.state.threads.problem() or (None if self._database_up()
                                                else "database unreachable")

    def _database_up(self) -> bool:
        """The database answered within the last three heartbeats."""
        return (not self.state.outage.down
                and time.monotonic() - self.state.outage.last_ok < 3 * self.options.heartbeat)

    def _live_metrics(self) -> dict[str, float | None]:
        return {
            "running": self.parts.renewer.count,
            "db_errors": self.state.outage.errors,
            "clock_offset": self.state.clock.offset,
            "db_up": 1.0 if self._database_up() else 0.0,
        }

    def _run(self) -> None:
        if not self._startup():
            self.state.systemd.stopping("stopped before it reached the database")
            return
        parts = self.parts
        parts.renewer.start()
        parts.books.start()
        parts.inbox.start()
        if parts.watch is not None:
            parts.watch.start()
        self._plan_all()
        # What the start-up made (modules, jobs, plans) lives as long as the
        # daemon: out of the collector's way, which from here on collects
        # (the daemon command held collections back until now).
        gc.freeze()
        gc.enable()
        self.state.systemd.ready(self._describe())
        try:
            while not self.state.stopping():
                self.state.systemd.watchdog()
                if self.state.signals.reload:
                    self.state.signals.reload = False
                    self._reload()
                self.drain.refresh()
                self.firing.fire_due()
                self._take_requests()
                self.firing.finished()
                self.firing.chained()
                self.state.signals.wake.wait(self._sleep_time())
        finally:
            self._shutdown()

    def _startup(self) -> bool:
        while not self.state.stopping():
            try:
                self.store.ensure_schema()
                self._ensure_rows()
                self.parts.books.report_bad_rows()
                self.parts.books.round()
                self.drain.refresh()
                self._publish_next_due()
                self.state.outage.ok()
                return True
            except (DatabaseRefused, SchemaTooNew):
                raise  # retrying cannot fix these: exit status 1 with the reason
            except DatabaseError as exc:
                gc.enable()  # an outage at start-up may last: collect meanwhile
                delay = self.state.outage.failed("startup", exc)
                self.state.systemd.status(f"waiting for the database: {describe_outage(exc)}")
                self.state.pause(delay)
        return False

    def _limits(self, spawn_pid: int) -> None:
        """Once a job has ``limits:``: how this host enforces them, said once
        (dblockrun/running/resources.py; imported only then)."""
        if any(job.limits.any for job in self.state.local.jobs.jobs):
            from dblockrun.running import resources

            resources.start(self.state.local.jobs.jobs, spawn_pid)

    def _warn_unmatched(self) -> None:
        """Warn of the jobs no live host's labels match: after a reload, and
        a few rounds after start-up (dblockrun/daemon/fleet.py ``SETTLE_ROUNDS``)."""
        if not any(j.run_on for j in self.state.local.file.jobs):
            return  # no statement for files without run-on
        live = [loads_labels(h.labels) for h in self.store.hosts(3 * self.options.heartbeat)
                if h.id != self.holder]
        for warning in self.state.local.unmatched_warnings(live):
            log.warning("%s", warning)

    def _ensure_rows(self) -> None:
        """The lock rows of the jobs file, its seats and lanes, and this
        host's every-host rows (two statements)."""
        jobs, every_host = self.state.local.rows()
        self.store.ensure_jobs(jobs)
        self.store.ensure_every_host(every_host)

    def _publish_next_due(self) -> None:
        """Each enabled cron job's next slot, for `status` (one statement)."""
        self.store.set_next_due(self.state.local.next_due(self.state.clock.now()))

    def _describe(self) -> str:
        """What the daemon runs, for systemd's STATUS= (no secret in it)."""
        count = len(self.state.local.jobs.jobs)
        return (f"{count} {'job' if count == 1 else 'jobs'} from {self.state.local.jobs.path}, "
                f"database {describe_db(self.store.url, self.store.prefix)}")

    def _sleep_time(self) -> float:
        until_poll = self.parts.inbox.due_in()
        if self.firing.chains is not None:  # job chains: the next look for triggers
            until_poll = min(until_poll, self.firing.chains.due_in())
        next_at = self.firing.planner.agenda.next_at()
        # (the watchdog's cap: the loop pings systemd at least that often)
        heartbeat = self.options.heartbeat
        longest = min(heartbeat, self.state.systemd.sleep_cap() or heartbeat)
        if next_at is None:
            return max(0.0, min(longest, until_poll))
        return max(0.0, min(longest, next_at - self.state.clock.now(), until_poll))

    def _take_requests(self) -> None:
        """Run the jobs an operator asked for with `dblockrun run JOB`."""
        try:
            names = self.parts.inbox.take()
            if names is None:
                return  # nothing was read: says nothing of the database
            if DRAIN_NOTE in names:  # a drain or undrain announced: read it now
                names.remove(DRAIN_NOTE)
                self.drain.told()
                self.drain.refresh()
            self.firing.requested(names)
            self.state.outage.ok()
        except DatabaseError as exc:
            self.state.outage.failed("run requests", exc)

    def _plan_all(self, before: JobsFile | None = None) -> None:
        """Plan every enabled job: at start from its last slot in the
        database, so what passed while no daemon ran it is recorded; after a
        reload, the jobs whose definition changed (or are new) from now."""
        planner, now = self.firing.planner, self.state.clock.now()
        enabled = [job for job in self.state.local.jobs.jobs if job.enabled and job.scheduled]
        if before is None:
            planner.start(enabled, now)
        else:
            planner.reload(enabled, before.job, now, self.firing.margin)

    # -- reload and shutdown --------------------------------------------------

    def _reload(self) -> None:
        new = reread(self.state.local.file, lambda path: resolve_secrets(load_jobs(path)))
        if new is None:
            return
        before, file_before = self.state.local.jobs, self.state.local.file
        self.state.local.load(new)
        self._limits(spawn.start().pid)
        try:
            self._ensure_rows()
            self.parts.books.report_bad_rows()
            self._warn_unmatched()
        except DatabaseError as exc:
            self.state.outage.failed("reload", exc)
        self._plan_all(before=before)
        try:
            self._publish_next_due()
        except DatabaseError as exc:
            self.state.outage.failed("reload", exc)
        reloaded(file_before, new)

    def _shutdown(self) -> None:
        runs = self.firing.runs.all()
        self.state.systemd.stopping(f"stopping: {len(runs)} running job(s) to finish or stop")
        if runs:
            log.info("stopping: waiting up to %gs for %d running job(s) "
                     "(interrupt again to stop them now)", self.options.grace, len(runs))
        told = False
        while left := self.firing.runs.left():
            if self.state.signals.stop_now and not told:
                told = True
                log.warning("interrupted again: stopping %d running job(s) now", left)
            self.state.systemd.watchdog()
            self.state.signals.wake.wait(0.1)  # rung by a finished run or a signal handler
        parts = self.parts
        if parts.watch is not None:
            parts.watch.stop()
        parts.inbox.stop()
        parts.notifier.close(timeout=5.0)  # the last runs' notifications and pings
        parts.books.stop()
        parts.renewer.stop()
        try:
            self.store.remove_host(self.holder)
        except DatabaseError:
            pass
        log.info("daemon %s stopped", self.holder)
