"""Supervised background work: no background loop of the daemon dies silently.

Every loop (the heartbeat, bookkeeping, run-request listener, notifier,
metrics server, run watcher and run workers) runs under a
:class:`Supervised`. A *crash* is an exception the loop does not handle
itself (a database error is an outage, handled where it happens; a crash is
a bug). Each crash is

- logged with its traceback, once: the first since the loop last completed
  a round; further crashes before it completes one again only at debug;
- counted in ``dblockrun_thread_crashes_total{thread}`` (dblockrun/prometheus.py);
- recorded in the daemon's :class:`Threads`: ``/healthz`` answers 503 and
  the systemd watchdog pings stop until the loop completes a round again;
- followed by what the loop's :class:`Policy` says: a restart after a capped
  exponential backoff, and, for a loop that must not stay down (the
  heartbeat), the daemon's exit with status 1 once it has crashed without
  completing a round for ``give_up`` seconds.

Loops that serve many independent items (the run watcher's commands, the
workers' steps, the notifier's events) report an item's crash with
:meth:`Supervised.crashed` and go on with the next item.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("dblockrun")

#: The first restart comes this long after a crash; each next one twice as
#: long after, up to the loop's ``Policy.max_delay``.
MIN_DELAY = 0.5


@dataclass(frozen=True)
class Policy:
    """What a crash of one loop leads to."""

    #: The longest wait before a restart (the backoff doubles from MIN_DELAY).
    max_delay: float
    #: Seconds of crashing without a completed round after which the loop is
    #: not restarted again and the daemon exits with status 1 (None: never).
    give_up: float | None = None


class Threads:
    """The supervised loops of one daemon: which are crashed now (for
    ``/healthz`` and the watchdog), how often each crashed (the counter),
    and whether one gave up (the daemon then exits with status 1)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._crashes: dict[str, int] = {}
        #: Crashed loops that have not completed a round since: what crashed them.
        self._down: dict[str, str] = {}
        #: Why the daemon must stop (a loop gave up), or None.
        self.fatal: str | None = None

    def supervise(self, name: str, policy: Policy) -> Supervised:
        """The supervision of the loop ``name`` (counted from 0 from now on)."""
        with self._lock:
            self._crashes.setdefault(name, 0)
        return Supervised(self, name, policy)

    def problem(self) -> str | None:
        """What is wrong with the loops (None: nothing)."""
        with self._lock:
            if self.fatal is not None:
                return self.fatal
            if not self._down:
                return None
            return "; ".join(f"thread {name} crashed ({why})"
                             for name, why in sorted(self._down.items()))

    def crash_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._crashes)

    def mark_crashed(self, name: str, why: str) -> bool:
        """Count a crash; whether the loop was up until now."""
        with self._lock:
            self._crashes[name] = self._crashes.get(name, 0) + 1
            was_up = name not in self._down
            self._down[name] = why
            return was_up

    def mark_ok(self, name: str) -> bool:
        """The loop completed a round; whether it was down until now."""
        with self._lock:
            return self._down.pop(name, None) is not None

    def give_up(self, why: str) -> None:
        """A loop gave up: the daemon stops, exit status 1."""
        with self._lock:
            if self.fatal is None:
                self.fatal = why


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class Supervised:
    """One loop's supervision (see the module)."""

    def __init__(self, threads: Threads, name: str, policy: Policy) -> None:
        self.threads = threads
        self.name = name
        self.policy = policy
        self._lock = threading.Lock()
        #: Crashes since the last completed round, and when the first was.
        self._failures = 0
        self._since = 0.0

    def thread(self, target: Callable[[], None], stop: threading.Event | None = None,
               name: str | None = None) -> threading.Thread:
        """A daemon thread that runs ``target`` until it returns, restarting
        it after a crash as the policy says (a set ``stop`` ends the wait)."""
        return threading.Thread(target=self.run, args=(target, stop or threading.Event()),
                                name=name or self.name, daemon=True)

    def run(self, target: Callable[[], None], stop: threading.Event) -> None:
        while True:
            try:
                target()
                return
            except Exception as exc:
                delay = self.crashed(exc, restart=True)
            if delay is None or stop.wait(delay):
                return

    def ok(self) -> None:
        """The loop completed a round: it works (again)."""
        if not self._failures:
            return  # the usual case, without a lock (a crash sets it under the lock)
        with self._lock:
            failures, self._failures = self._failures, 0
            was_down = self.threads.mark_ok(self.name)
        if was_down:
            log.warning("thread %s works again after %d %s", self.name, failures,
                        "crash" if failures == 1 else "crashes")

    def crashed(self, exc: BaseException, restart: bool = False) -> float | None:
        """Record the crash ``exc`` (logged, counted, unhealthy until the
        next :meth:`ok`); with ``restart``, the seconds to wait before the
        restart, or None: give up (the daemon exits with status 1)."""
        now = time.monotonic()
        why = _describe(exc)
        with self._lock:
            self._failures += 1
            if self._failures == 1:
                self._since = now
            failures, since = self._failures, self._since
            first = self.threads.mark_crashed(self.name, why)
        give_up = self.policy.give_up
        delay: float | None = min(self.policy.max_delay, MIN_DELAY * 2.0 ** min(failures - 1, 10))
        if not restart:
            then = "going on with the next one"
        elif give_up is not None and now - since >= give_up:
            delay = None
            self.threads.give_up(f"thread {self.name} kept crashing for {now - since:.1f}s "
                                  f"({why})")
            then = "it kept crashing, so the daemon stops (exit status 1)"
            if not first:  # the last word on it, always said (the traceback was)
                log.error("thread %s crashed again: %s; %s", self.name, why, then)
                return None
        else:
            then = f"restarting it in {delay:g}s"
        if first:
            log.error("thread %s crashed: %s; %s", self.name, why, then, exc_info=exc)
        else:
            log.debug("thread %s crashed again (%d since its last round): %s; %s", self.name,
                      failures, why, then, exc_info=exc)
        return delay


class Loop:
    """A background loop's thread, stop event and supervision: the one start
    and stop of every loop that runs until its owner stops it (bookkeeping,
    heartbeat, run-request listener). ``target`` runs in the thread; it
    calls :meth:`wait` between rounds and :meth:`ok` after each."""

    def __init__(self, threads: Threads | None, name: str, policy: Policy,
                 target: Callable[[], None], join_timeout: float = 30.0,
                 wake: threading.Event | None = None,
                 interrupt: Callable[[], None] | None = None) -> None:
        self.supervised = (threads or Threads()).supervise(name, policy)
        self._stop = threading.Event()
        #: Set with the stop, so that a loop waiting on it too ends at once.
        self._wake = wake
        #: Called after the stop is set, for a loop blocked where no event
        #: reaches (a wait in the database: dblockrun/store/doorbell.py).
        self._interrupt = interrupt
        self._join_timeout = join_timeout
        self._thread = self.supervised.thread(target, self._stop)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the loop to end and wait for it (at most ``join_timeout``)."""
        self._stop.set()
        if self._wake is not None:
            self._wake.set()
        if self._interrupt is not None and self._thread.is_alive():
            self._interrupt()
        if self._thread.is_alive():
            self._thread.join(timeout=self._join_timeout)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until stopped; whether the loop is stopping."""
        return self._stop.wait(seconds)

    def ok(self) -> None:
        """The loop completed a round."""
        self.supervised.ok()
