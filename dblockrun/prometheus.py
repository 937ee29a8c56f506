"""Prometheus metrics and /healthz for ``daemon --metrics ADDR``.

The :class:`dblockrun.metrics.Metrics` interface kept with prometheus-client
(its exposition format and metric types rather than hand-written ones), and
its HTTP server. Imported only by a daemon started with ``--metrics``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dblockrun.errors import UsageError
from dblockrun.events import Alert, Event, RunEnded, SlotPassed
from dblockrun.metrics import Metrics, parse_addr
from dblockrun.supervise import Policy, Supervised, Threads

DURATION_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600)
#: ``dblockrun_missed_slots_total{reason}`` of a passed slot, by its cause
#: (others: its result, ``missed`` or ``skipped``).
_PASSED_KIND = {"host-full": "max-running", "group-full": "group",
                # A calendar's day, a blackout window, outside the active range:
                # what the file asks for, apart from the skips an alert watches.
                "excluded": "excluded"}

#: Connections served at once; more are closed as soon as accepted, so a
#: flood of idle sockets holds at most this many of the daemon's descriptors
#: (the rest stay free for runs) and costs no thread each.
MAX_CONNECTIONS = 16
#: Seconds a connection may wait on one read or write before it is closed.
CONNECTION_TIMEOUT = 5.0


class _Live(Collector):
    """Values read at scrape time from the daemon's state."""

    def __init__(self, read: Callable[[], dict[str, float | None]]) -> None:
        self.read = read

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        v = self.read()
        yield GaugeMetricFamily("dblockrun_running_commands", "Commands running on this host",
                                value=v.get("running") or 0)
        yield CounterMetricFamily("dblockrun_database_errors", "Failed database statements",
                                  value=v.get("db_errors") or 0)
        offset = v.get("clock_offset")
        if offset is not None:
            yield GaugeMetricFamily("dblockrun_clock_offset_seconds",
                                    "Database clock minus this host's clock", value=offset)
        yield GaugeMetricFamily("dblockrun_database_up",
                                "1 while the database answered within the last 3 heartbeats",
                                value=v.get("db_up") or 0)


class _Crashes(Collector):
    """Each supervised thread's crashes (dblockrun/supervise.py), 0 until one."""

    def __init__(self, threads: Threads) -> None:
        self.threads = threads

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("dblockrun_thread_crashes",
                                     "Unexpected exceptions in the daemon's background threads",
                                     labels=["thread"])
        for name, count in sorted(self.threads.crash_counts().items()):
            family.add_metric([name], count)
        yield family


class Prometheus(Metrics):
    """The counts of a daemon with ``--metrics``, served by :func:`serve`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.runs = Counter("dblockrun_runs", "Finished runs", ["job", "result"], registry=r)
        self.duration = Histogram("dblockrun_run_duration_seconds", "Run duration", ["job"],
                                  buckets=DURATION_BUCKETS, registry=r)
        self.claims = Counter("dblockrun_claims", "Claim attempts by outcome (won, lost: "
                              "busy, disabled or taken by another host, error)",
                              ["job", "outcome"], registry=r)
        self.last_success = Gauge("dblockrun_last_success_timestamp_seconds",
                                  "End of the last successful run", ["job"], registry=r)
        self.backwards = Counter(
            "dblockrun_database_went_backwards",
            "Claims whose fencing token or slot was not newer than one this daemon had "
            "seen: the database lost committed writes", ["job"], registry=r)
        self.missed = Counter("dblockrun_missed_slots", "Slots recorded missed or skipped",
                              ["job", "reason"], registry=r)
        # (issue 13) dblockrun/notify/notifier.py: sent, failed, or dropped (its queue was full).
        self.notifications = Counter("dblockrun_notifications", "Notifications by event and "
                                     "outcome (sent, failed, dropped)",
                                     ["job", "event", "outcome"], registry=r)
        self.pings = Counter("dblockrun_pings", "Heartbeat pings by signal (start, success, "
                             "fail) and outcome (sent, failed, dropped)",
                             ["job", "signal", "outcome"], registry=r)
        # (issue 37) dblockrun/notify/alerts.py and storm.py: each alert kind fired or
        # cleared here (once fleet-wide), notifications held (after: N) or collapsed.
        self.alerts = Counter("dblockrun_alerts", "Alerts by kind (late, slow, fast, "
                              "storm, failure, missed) and state (fired, cleared, held, "
                              "collapsed)", ["kind", "state"], registry=r)

    def claimed(self, job: str, outcome: str) -> None:
        self.claims.labels(job, outcome).inc()

    def went_backwards(self, job: str) -> None:
        self.backwards.labels(job).inc()

    def sent(self, what: str, job: str, label: str, outcome: str) -> None:
        counter = self.pings if what == "ping" else self.notifications
        counter.labels(job, label, outcome).inc()

    def alert(self, kind: str, state: str) -> None:
        self.alerts.labels(kind, state).inc()

    def watch(self, read: Callable[[], dict[str, float | None]]) -> None:
        self.registry.register(_Live(read))

    def watch_threads(self, threads: Threads) -> None:
        """``dblockrun_thread_crashes_total{thread}``."""
        self.registry.register(_Crashes(threads))

    def hear(self, event: Event) -> None:
        """A subscriber of the run and slot events (dblockrun/events.py):
        each attempt's end, each slot recorded missed or skipped."""
        if isinstance(event, RunEnded):
            self.run_finished(event.job.name, event.result, event.duration)
        elif isinstance(event, SlotPassed):
            kind = _PASSED_KIND.get(event.cause, event.result)
            self.missed.labels(event.job.name, kind).inc(event.count)
        elif isinstance(event, Alert):
            self.alert(event.kind, "cleared" if event.cleared else "fired")

    def run_finished(self, job: str, result: str, seconds: float) -> None:
        self.runs.labels(job, result).inc()
        self.duration.labels(job).observe(seconds)
        if result == "ok":
            self.last_success.labels(job).set(time.time())

    def render(self) -> bytes:
        return generate_latest(self.registry)



def url_of(server: ThreadingHTTPServer) -> str:
    """Where ``server`` serves the metrics, as a scraper would ask for them."""
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}/metrics"


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most :data:`MAX_CONNECTIONS` at once:
    one over the bound is closed as soon as it is accepted; supervised
    (dblockrun/supervise.py)."""

    daemon_threads = True
    request_queue_size = 64
    supervised: Supervised

    def __init__(self, address: tuple[str, int],
                 handler: type[BaseHTTPRequestHandler]) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, handler)

    def service_actions(self) -> None:
        """Each turn of ``serve_forever`` (every 0.5 s): the serving thread's round."""
        self.supervised.ok()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            super().finish_request(request, client_address)
        finally:
            self._slots.release()


def serve(metrics: Prometheus, addr: str, problem: Callable[[], str | None],
          threads: Threads | None = None) -> ThreadingHTTPServer:
    """Serve /metrics and /healthz (503 with ``problem()`` if it names one)
    in a background thread, restarted after a crash (backoff up to 10 s): at
    most :data:`MAX_CONNECTIONS` connections at once, each closed after
    :data:`CONNECTION_TIMEOUT` without traffic."""

    class Handler(BaseHTTPRequestHandler):
        timeout = CONNECTION_TIMEOUT

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] == "/metrics":
                self._reply(200, metrics.render(), "text/plain; version=0.0.4")
            elif self.path.split("?")[0] == "/healthz":
                why = problem()
                self._reply(200 if why is None else 503,
                            b"ok\n" if why is None else f"{why}\n".encode(), "text/plain")
            else:
                self._reply(404, b"not found\n", "text/plain")

        def _reply(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    host, port = parse_addr(addr)
    try:
        server = _Server((host, port), Handler)
    except OSError as exc:
        raise UsageError(f"--metrics {addr}: {exc.strerror}") from exc
    server.daemon_threads = True
    server.supervised = (threads or Threads()).supervise("metrics", Policy(max_delay=10.0))
    server.supervised.thread(server.serve_forever).start()
    return server
