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
from dblockrun.events import Event, RunEnded, RunLost, RunStarted, SlotPassed
from dblockrun.jobs import Job, SecretUrl
from dblockrun.notify import pings
from dblockrun.scheduling.targeting import HOSTNAME, loads_labels
from dblockrun.store import models as m
from dblockrun.supervise import Policy, Threads

if TYPE_CHECKING:
    from dblockrun.metrics import Metrics
    from dblockrun.store import Store

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

    def __init__(self, store: Store | None, holder: str, metrics: Metrics | None = None,
                 queue_size: int = QUEUE_SIZE, threads: Threads | None = None,
                 hostname: str | None = None) -> None:
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
            if event.result == m.MISSED:
                self.missed(event.job, event.slot, event.late, _missed_rule(event))
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
            if notify.on_change and self.store is not None:
                self._put(job.name, "notify", event, lambda: self._if_changed(end, event))
                return
            title, body_text = run_message(end, event, hostname=self.hostname)
            self._put(job.name, "notify", event,
                      lambda: self._notify(job, event, title, body_text, "failure"))
        elif end.result == m.OK and notify.sends(RECOVERY) and self.store is not None:
            self._put(job.name, "notify", RECOVERY, lambda: self._recovery(end))

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

    def missed(self, job: Job, slot: float, late: float, rule: str) -> None:
        if job.notify is not None and MISSED in job.notify.on:
            title, body = missed_message(job, self.holder, slot, late, rule, self.hostname)
            self._put(job.name, "notify", MISSED,
                      lambda: self._notify(job, MISSED, title, body, "warning"))

    def close(self, timeout: float) -> None:
        """Send what is queued, for up to ``timeout`` seconds (a shutdown)."""
        with self._lock:
            thread = self._thread
        if thread is None:
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
