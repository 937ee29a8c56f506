"""Notifications (apprise) and heartbeat pings, sent in the background.

A daemon has one :class:`Notifier`, subscribed to the run and slot events
(dblockrun/events.py, :meth:`Notifier.hear`): each is a queue put, never a
wait, and its one thread sends them, each with bounded timeouts. Sent once
per event, by the host that ran the run (or recorded the missed slot, or
recorded another host's run lost). A send that fails is logged (once per
job until one gets through again) and counted in
``dblockrun_notifications_total`` / ``dblockrun_pings_total``; it never
changes a run's result, and never delays a start or a renewal. A full queue
drops the event, logged and counted as ``dropped``.

"recovery", and ``on: change`` (a run's end sent only when its result
differs from the previous run's), need the job's previous result (any host):
one read, made here in the background and only for jobs that ask for them.

``notify: {after: N}`` holds a failure until the Nth in a row (one read of
the job's last runs, here, for such jobs only); the recovery after held
failures is held too. The alerts of ``expect:`` (dblockrun/notify/alerts.py)
arrive as events, claimed once across the fleet already. A passed slot's
``missed`` notification waits a moment for those of other jobs passed for
the same cause: a storm sends one notification instead
(dblockrun/notify/storm.py).

A title names the host by its ``hostname`` label (``--label hostname=NAME``),
as ``status`` and ``run-on`` do; the body's ``host:`` is the daemon's id.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING

from dblockrun.config.secreturl import quiet_apprise, scrub, shown
from dblockrun.errors import DatabaseError
from dblockrun.events import Alert, Event, RunEnded, RunLost, RunStarted, SlotPassed
from dblockrun.jobs import Job, JobsFile, SecretUrl, Storm
from dblockrun.notify import pings
from dblockrun.scheduling.targeting import HOSTNAME, loads_labels
from dblockrun.store import models as m
from dblockrun.supervise import Policy, Threads

if TYPE_CHECKING:
    from dblockrun.metrics import Metrics
    from dblockrun.store.roles import Alerting

log = logging.getLogger("dblockrun")

#: Events waiting to be sent, at most; more are dropped (and counted).
QUEUE_SIZE = 1000
#: Seconds one notification may take (apprise's limit on the whole call).
TIMEOUT = 10.0
#: The output tail in a notification, in characters (chat services cap a message).
OUTPUT_CHARS = 3000

FAILURE, RECOVERY, TIMEOUT_EVENT, MISSED = "failure", "recovery", "timeout", "missed"

#: The event a run's result is, for notifications (ok: recovery, if it is one).
_EVENT = {m.FAILED: FAILURE, m.TIMEOUT: TIMEOUT_EVENT}


@dataclass(frozen=True)
class RunEnd:
    """A run's end, as its notifications and end ping tell it."""

    job: Job
    host: str
    #: The first attempt's run id (the rid of the pings), and the last one's.
    first_run_id: int
    run_id: int
    slot: float | None
    result: str
    exit_code: int | None
    duration: float
    output: str
    detail: str = ""
    #: A fan-out run's item (a batch's first).
    item: str | None = None
    #: The upstream run that started it (``after:``; None: a slot's run).
    upstream: m.Trigger | None = None


def _utc(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _hostname(holder: str) -> str:
    return holder.split(":", 1)[0]


def run_message(end: RunEnd, event: str, previous: str | None = None,
                hostname: str | None = None) -> tuple[str, str]:
    """The title and body of a notification about a run's end; ``hostname``:
    the host's ``hostname`` label (None: its id's first part)."""
    job = end.job.name
    what = {FAILURE: "failed", TIMEOUT_EVENT: "timed out", RECOVERY: "recovered"}[event]
    title = f"dblockrun: job {job} {what} on {hostname or _hostname(end.host)}"
    lines = [
        f"job: {job}",
        *([f"item: {end.item}"] if end.item is not None else []),
        f"event: {event}",
        f"result: {end.result}",
        f"exit status: {'-' if end.exit_code is None else end.exit_code}",
        f"host: {end.host}",
        f"slot: {_utc(end.slot)}",
        *([f"after: {end.upstream.upstream_job} {end.upstream.upstream_run} "
           f"({end.upstream.result})"] if end.upstream is not None else []),
        f"run: {end.run_id}",
        f"duration: {end.duration:.2f}s",
    ]
    if previous is not None:
        lines.append(f"previous run: {previous}")
    if end.detail:
        lines.append(f"detail: {end.detail}")
    tail = end.output[-OUTPUT_CHARS:]
    lines += ["", f"output (last {OUTPUT_CHARS} characters):" if tail else "output: none"]
    if tail:
        lines.append(tail.rstrip("\n"))
    return title, "\n".join(lines)


def missed_message(job: Job, host: str, slot: float, late: float,
                   rule: str, hostname: str | None = None) -> tuple[str, str]:
    """``rule``: why the slot was not run (its starting-deadline, or passed
    over for a newer slot)."""
    title = f"dblockrun: job {job.name} missed a slot ({hostname or _hostname(host)})"
    body = "\n".join([
        f"job: {job.name}",
        f"event: {MISSED}",
        "result: missed",
        f"host: {host}",
        f"slot: {_utc(slot)}",
        f"late: {late:.1f}s ({rule})",
    ])
    return title, body


def lost_message(lost: RunLost, hostname: str | None = None) -> tuple[str, str]:
    """The title and body of a notification about a run recorded lost;
    ``hostname``: the dead host's ``hostname`` label (None: its id's first part)."""
    title = f"dblockrun: job {lost.name} lost on {hostname or _hostname(lost.host)}"
    body = "\n".join([
        f"job: {lost.name}",
        f"event: {FAILURE}",
        f"result: {m.LOST}",
        "exit status: -",
        f"host: {lost.host}",
        f"slot: {_utc(lost.slot)}",
        f"run: {lost.run_id}",
        f"last renewal: {_utc(lost.ended)}",
        f"recorded by: {lost.recorded_by}",
        "detail: its host stopped renewing the lease (the daemon died, froze or lost "
        "the database)",
    ])
    return title, body


def alert_message(alert: Alert, hostname: str | None = None) -> tuple[str, str]:
    """The title and body of an ``expect:`` alert (or of its recovery)."""
    job = alert.job
    what = {"late": "is late", "slow": "is slow", "fast": "was fast"}[alert.kind]
    if alert.cleared:
        what = f"{alert.kind} alert cleared"
    title = f"dblockrun: job {job.name} {what} ({hostname or _hostname(alert.host)})"
    assert job.expect is not None
    lines = [
        f"job: {job.name}",
        f"event: {RECOVERY if alert.cleared else alert.kind}",
        f"alert: {alert.kind}",
        f"host: {alert.host}",
        f"slot: {_utc(alert.slot)}",
        *([f"run: {alert.run_id}"] if alert.run_id is not None else []),
        f"expect: {job.expect.text()}",
        f"detail: {alert.detail}",
    ]
    return title, "\n".join(lines)


def _missed_rule(passed: SlotPassed) -> str:
    """Why a slot was missed, as a missed notification says it."""
    if passed.cause == "deadline" and passed.job.starting_deadline is not None:
        return f"starting-deadline {passed.job.starting_deadline:g}s"
    return passed.reason.removeprefix("missed: ")


def send_apprise(url: str, title: str, body: str, kind: str) -> None:
    """Send one notification to one apprise URL; raises OSError with
    apprise's reason (secrets scrubbed) if it was not delivered."""
    import apprise  # here: 0.1-0.2 s of plugins, for daemons that notify only

    service = apprise.Apprise()
    if not service.add(url):
        raise OSError("apprise does not support this URL")
    result = service.notify(body=body, title=title, notify_type=kind, timeout=TIMEOUT)
    if not result:
        reasons = [e.message for e in result.logs() if e.level in ("WARNING", "ERROR")]
        why = reasons[-1] if reasons else f"status {result.status.name.lower()}"
        raise OSError(scrub(why, url))


class Notifier:
    """The daemon's background sender of notifications and pings."""

    def __init__(self, store: Alerting | None, holder: str, metrics: Metrics | None = None,
                 queue_size: int = QUEUE_SIZE, threads: Threads | None = None,
                 hostname: str | None = None,
                 file: Callable[[], JobsFile] | None = None) -> None:
        self.store = store
        self.holder = holder
        #: This host's ``hostname`` label, for titles.
        self.hostname = hostname
        self.metrics = metrics
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(queue_size)
        self._thread: threading.Thread | None = None
        # An event whose sending raises is a crash of this thread; it goes on
        # with the next event (sent in order, with no backoff: a later one
        # is another job's).
        self._supervised = (threads or Threads()).supervise("notifier", Policy(max_delay=1.0))
        self._lock = threading.Lock()
        #: (job, what) whose last send failed: logged once until one gets through.
        self._failing: dict[tuple[str, str], int] = {}
        #: The file's ``notify-storm:``, and the passed slots waiting for
        #: their storm's decision (dblockrun/notify/storm.py).
        self._file = file
        self._passed: list[SlotPassed] = []
        self._unrecorded: list[SlotPassed] = []
        self._timer: threading.Timer | None = None

    # -- events, from the run lifecycle (never blocking) -------------------------

    def hear(self, event: Event) -> None:
        """A subscriber of the run and slot events (dblockrun/events.py): a
        run's start ping, its end's (after its last attempt), a missed slot,
        a run this host's bookkeeping recorded lost (its holder died)."""
        if isinstance(event, RunStarted):
            if event.attempt == 1:
                self.run_started(event.job, event.run_id)
        elif isinstance(event, RunEnded):
            if event.final and (event.job.notify or event.job.ping):
                # As sent before the record kept its reason: that is a line of its own.
                output = event.output
                if event.detail:
                    output = output.removesuffix(event.detail + "\n")
                self.run_ended(RunEnd(
                    job=event.job, host=event.host, first_run_id=event.first_run_id,
                    run_id=event.run_id, slot=event.slot, result=event.result,
                    exit_code=event.exit_code, duration=event.duration, output=output,
                    detail=event.detail, item=event.item, upstream=event.upstream))
        elif isinstance(event, SlotPassed):
            self.slot_passed(event)
        elif isinstance(event, Alert):
            self.alert(event)
        elif event.job is not None:
            self.run_lost(event)

    def run_started(self, job: Job, run_id: int) -> None:
        if job.ping is not None:
            self._put(job.name, "ping", pings.START,
                      lambda: self._ping(job, job.ping, pings.START, run_id, b""))

    def run_ended(self, end: RunEnd) -> None:
        job = end.job
        if job.ping is not None:
            signal = pings.SUCCESS if end.result == m.OK else pings.FAIL
            body = end.output.encode("utf-8", "replace")
            ping = job.ping
            self._put(job.name, "ping", signal,
                      lambda: self._ping(job, ping, signal, end.first_run_id, body))
        notify = job.notify
        if notify is None:
            return
        event = _EVENT.get(end.result)
        if event is not None and notify.sends(event):
            if notify.after > 1 and self.store is not None:
                self._put(job.name, "notify", event, lambda: self._if_streak(end, event))
                return
            if notify.on_change and self.store is not None:
                self._put(job.name, "notify", event, lambda: self._if_changed(end, event))
                return
            title, body_text = run_message(end, event, hostname=self.hostname)
            self._put(job.name, "notify", event,
                      lambda: self._notify(job, event, title, body_text, "failure"))
        elif end.result == m.OK and notify.sends(RECOVERY) and self.store is not None:
            self._put(job.name, "notify", RECOVERY, lambda: self._recovery(end))

    def _if_streak(self, end: RunEnd, event: str) -> None:
        """``after: N``: a failure sent only from the Nth failure in a row."""
        assert end.job.notify is not None and self.store is not None
        after = end.job.notify.after
        try:
            streak = self.store.alerts.failure_streak(end.job.name, end.run_id, after)
        except DatabaseError as exc:
            streak = after  # cannot tell: sent, rather than a failure held for good
            log.warning("job %s: cannot read the failures in a row, so sent: %s",
                        end.job.name, exc, extra={"job": end.job.name})
        if streak < after:
            log.info("job %s: %s notification held: failure %d in a row of %d (notify.after)",
                     end.job.name, event, streak, after, extra={"job": end.job.name})
            if self.metrics is not None:
                self.metrics.alert(FAILURE, "held")
            return
        if end.job.notify.on_change:
            self._if_changed(end, event)
            return
        title, body = run_message(end, event, hostname=self.hostname)
        lines = body.split("\n")
        lines.insert(lines.index(f"event: {event}") + 1, f"failures in a row: {after} or more")
        self._notify(end.job, event, title, "\n".join(lines), "failure")

    def alert(self, alert: Alert) -> None:
        """An ``expect:`` alert this host claimed (or cleared): sent if the
        job's ``on:`` asks for its kind (a clearing: and for ``recovery``)."""
        notify = alert.job.notify
        if notify is None or not notify.sends(alert.kind):
            return
        if alert.cleared and not notify.sends(RECOVERY):
            return
        event = RECOVERY if alert.cleared else alert.kind
        title, body = alert_message(alert, self.hostname)
        self._put(alert.job.name, "notify", event,
                  lambda: self._notify(alert.job, event, title, body,
                                       "success" if alert.cleared else "warning"))

    def run_lost(self, lost: RunLost) -> None:
        """Another host's run this host recorded lost: its ``failure``
        notification and ``/fail`` ping (that host cannot send them)."""
        job = lost.job
        assert job is not None
        if job.ping is not None:
            ping = job.ping
            self._put(job.name, "ping", pings.FAIL,
                      lambda: self._ping(job, ping, pings.FAIL, lost.first_run_id, b""))
        if job.notify is not None and FAILURE in job.notify.on:

            def send() -> None:  # on the notifier's thread: it may read the database
                title, body = lost_message(lost, self._hostname_of(lost.host))
                self._notify(job, FAILURE, title, body, "failure")

            self._put(job.name, "notify", FAILURE, send)

    def _hostname_of(self, host: str) -> str | None:
        """Another host's ``hostname`` label, from its host row (None: no
        row, no label, or the database away: the title names its id's first part)."""
        if self.store is None:
            return None
        try:
            return loads_labels(self.store.host_labels(host)).get(HOSTNAME)
        except DatabaseError:
            return None

    def slot_passed(self, passed: SlotPassed) -> None:
        """A passed slot of a job whose ``missed`` notifications are on (a
        missed one, or one skipped for a cause of the fleet's: down, the
        database away, a dead host, a pause): it
        waits ``notify-storm.wait`` for those passed for the same cause;
        its row in the alerts ledger, counted for storms, is written now
        (on the notifier's thread)."""
        notify = passed.job.notify
        if notify is None or MISSED not in notify.on:
            return
        from dblockrun.notify import storm  # here: a daemon whose jobs miss no slot needs none

        if passed.result != m.MISSED and passed.cause not in storm.FLEET_CAUSES:
            return  # a skip of its own (busy, a full group ...): no notification, no storm
        if self.store is None:
            if passed.result == m.MISSED:
                self.missed(passed.job, passed.slot, passed.late, _missed_rule(passed))
            return
        with self._lock:
            self._passed.append(passed)
            self._unrecorded.append(passed)
            if self._timer is None:
                self._timer = threading.Timer(self._settings().wait, self._storm_due)
                self._timer.daemon = True
                self._timer.start()
        self._put(passed.job.name, "notify", MISSED, self._record_passed)

    def _record_passed(self) -> None:
        with self._lock:
            rows, self._unrecorded = self._unrecorded, []
        if not rows or self.store is None:
            return
        try:
            self.store.alerts.passed(self.holder, [(p.job.name, p.slot, p.cause)
                                                   for p in rows])
        except DatabaseError as exc:
            log.warning("passed slots not counted for notification storms: %s", exc)

    def _settings(self) -> Storm:
        return self._file().storm if self._file is not None else Storm()

    def _storm_due(self) -> None:
        """The timer's end: the storm's decision, on the notifier's thread."""
        try:
            self._queue.put_nowait(self._decide_storm)
        except queue.Full:
            with self._lock:
                self._timer = None
            self._decide_storm()

    def _decide_storm(self) -> None:
        """Each cause of the passed slots waiting: a storm (more than its
        threshold of jobs within its window, fleet-wide) sends one
        notification, by the host that claims it; else each is sent."""
        with self._lock:
            waiting, self._passed, self._timer = self._passed, [], None
        settings = self._settings()
        by_cause: dict[str, list[SlotPassed]] = {}
        for passed in waiting:
            by_cause.setdefault(passed.cause, []).append(passed)
        for cause, events in by_cause.items():
            if not self._stormed(cause, events, settings):
                for p in events:  # sent here: a stop's close queued this last
                    if p.result == m.MISSED:
                        title, body = missed_message(p.job, self.holder, p.slot, p.late,
                                                     _missed_rule(p), self.hostname)
                        self._notify(p.job, MISSED, title, body, "warning")

    def _stormed(self, cause: str, events: list[SlotPassed], settings: Storm) -> bool:
        """Whether ``events`` are part of a storm (sent here, or by another host)."""
        from dblockrun.notify import storm

        assert self.store is not None
        try:
            names = self.store.alerts.storm_jobs(cause, settings.window)
            if len(names) <= settings.threshold:
                return False
            title, body = storm.message(cause, names, settings, events, self.holder,
                                        self.hostname)
            won = self.store.alerts.claim_storm(cause, self.holder, settings.window, title)
        except DatabaseError as exc:
            log.warning("cannot tell whether passed slots are a storm, so each is sent: %s",
                        exc)
            return False
        collapsed = sum(1 for p in events if p.result == m.MISSED)
        if self.metrics is not None:
            for _ in range(collapsed):
                self.metrics.alert(MISSED, "collapsed")
        if won:
            log.warning("%s", title)
            if self.metrics is not None:
                self.metrics.alert(storm.STORM, "fired")
            self._send_storm(names, events, title, body)
        return True

    def _send_storm(self, names: list[str], events: list[SlotPassed], title: str,
                    body: str) -> None:
        """To each URL of the jobs named (each once), as known to this host's file."""
        from dblockrun.notify.storm import STORM

        jobs = {p.job.name: p.job for p in events}
        if self._file is not None:
            file = self._file()
            jobs.update((name, job) for name in names if (job := file.job(name)) is not None)
        urls: dict[str, str] = {}
        for job in jobs.values():
            if job.notify is not None and MISSED in job.notify.on:
                for url in job.notify.urls:
                    urls.setdefault(url.value, shown(url.value))
        for value, where in urls.items():
            self._attempt("", "notify", STORM, where,
                          partial(send_apprise, value, title, body, "warning"))

    def missed(self, job: Job, slot: float, late: float, rule: str) -> None:
        if job.notify is not None and MISSED in job.notify.on:
            title, body = missed_message(job, self.holder, slot, late, rule, self.hostname)
            self._put(job.name, "notify", MISSED,
                      lambda: self._notify(job, MISSED, title, body, "warning"))

    def close(self, timeout: float) -> None:
        """Send what is queued, for up to ``timeout`` seconds (a shutdown)."""
        with self._lock:
            thread = self._thread
            timer, self._timer = self._timer, None
        if thread is None:
            return
        if timer is not None:  # the passed slots waiting for their storm: decided now
            timer.cancel()
            try:
                self._queue.put(self._decide_storm, timeout=timeout)
            except queue.Full:
                return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        thread.join(timeout)

    # -- the queue -------------------------------------------------------------------

    def _put(self, job: str, what: str, label: str, send: Callable[[], None]) -> None:
        self._start()
        try:
            self._queue.put_nowait(send)
        except queue.Full:
            self._count(job, what, label, "dropped")
            log.warning("job %s: %s %s dropped: %d notifications and pings are waiting",
                        job, "ping" if what == "ping" else "notification", label,
                        self._queue.qsize(), extra={"job": job})

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            quiet_apprise()
            self._thread = self._supervised.thread(self._work)
            self._thread.start()

    def _work(self) -> None:
        while (send := self._queue.get()) is not None:
            try:
                send()
            except Exception as exc:  # it serves every job: on to the next event
                self._supervised.crashed(exc)
            else:
                self._supervised.ok()

    # -- sending -------------------------------------------------------------------------

    def _count(self, job: str, what: str, label: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.sent(what, job, label, outcome)

    def _attempt(self, job: str, what: str, label: str, target: str,
                 send: Callable[[], None]) -> None:
        """``send``, counted; a failure logged once per job until one succeeds."""
        name = "ping" if what == "ping" else "notification"
        try:
            send()
        except Exception as exc:
            self._count(job, what, label, "failed")
            failures = self._failing.get((job, what), 0) + 1
            self._failing[(job, what)] = failures
            level = logging.WARNING if failures == 1 else logging.DEBUG
            log.log(level, "job %s: %s %s to %s failed: %s%s", job, name, label, target,
                    exc or type(exc).__name__,
                    " (logged once until one gets through)" if failures == 1 else "",
                    extra={"job": job})
            return
        self._count(job, what, label, "sent")
        failures = self._failing.pop((job, what), 0)
        if failures:
            log.info("job %s: %ss get through again (%d failed)", job, name, failures,
                     extra={"job": job})

    def _notify(self, job: Job, event: str, title: str, body: str, kind: str) -> None:
        assert job.notify is not None
        for url in job.notify.urls:
            self._attempt(job.name, "notify", event, shown(url.value),
                          partial(send_apprise, url.value, title, body, kind))

    def _previous(self, end: RunEnd, event: str) -> tuple[bool, str | None]:
        """(read, the result of the job's run before ``end``'s)."""
        assert self.store is not None
        try:
            return True, self.store.previous_result(end.job.name, end.first_run_id)
        except DatabaseError as exc:
            self._count(end.job.name, "notify", event, "failed")
            log.warning("job %s: %s notification not sent: cannot read the previous "
                        "run: %s", end.job.name, event, exc, extra={"job": end.job.name})
            return False, None

    def _recovery(self, end: RunEnd) -> None:
        """A run that ended ok: a recovery if the job's previous run did not."""
        read, previous = self._previous(end, RECOVERY)
        if not read or previous is None or previous == m.OK:
            return
        assert end.job.notify is not None and self.store is not None
        after = end.job.notify.after
        if after > 1:  # the failures before were held: so is their recovery
            try:
                streak = self.store.alerts.failure_streak(end.job.name, end.first_run_id - 1,
                                                          after)
            except DatabaseError:
                streak = after
            if streak < after:
                return
        title, body = run_message(end, RECOVERY, previous, self.hostname)
        self._notify(end.job, RECOVERY, title, body, "success")

    def _if_changed(self, end: RunEnd, event: str) -> None:
        """``on: change``: a failure or timeout unless the previous run's
        result was the same (a first run's is a change)."""
        read, previous = self._previous(end, event)
        if not read or previous == end.result:
            return
        title, body = run_message(end, event, previous, self.hostname)
        self._notify(end.job, event, title, body, "failure")

    def _ping(self, job: Job, url: SecretUrl | None, signal: str, run_id: int,
              body: bytes) -> None:
        assert url is not None
        target = pings.ping_url(url.value, signal, pings.run_uuid(job.name, run_id))

        def send() -> None:
            try:
                pings.send(target, body)
            except Exception as exc:
                raise OSError(scrub(str(exc), url.value)) from None

        self._attempt(job.name, "ping", signal, shown(url.value), send)
