"""Log database trouble once per outage, not once per attempt; back off.

Rows another session holds (kind ``lock-held``) are not an outage of the
database: the statements that do not touch them go through meanwhile. They
are logged once per holding session (and once more when no statement has
waited on them for :attr:`Outage.max_delay`: free again), never with a
``database back`` after each statement that got through."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from dblockrun.errors import DatabaseError

R = TypeVar("R")

log = logging.getLogger("dblockrun")


#: How the one line of an outage names its kind (DatabaseError.kind).
_KINDS = {
    "unreachable": "database unreachable",
    "refused": "database refused us",
    "read-only": "database is read-only (a standby, or read_only set)",
    "deadlock": "database deadlock",
    "lock-held": "database lock wait",
    "schema": "database schema missing or different",
}


def describe(exc: BaseException) -> str:
    """What an outage is, in a few words, from the error's kind."""
    return _KINDS.get(getattr(exc, "kind", ""), "database error")


class Outage:
    """Tracks whether the database is answering, for logs, health and backoff.

    ``clock`` (``time.monotonic``-like) and ``sleep`` are when it is and how
    the retry's backoff waits: the real ones, or a test's manual clock
    (dblockrun/store/memory.py: ``Outage(clock.now, clock.advance)``), so
    that a test of an outage waits no real seconds. Its delays, ``last_ok``
    and :meth:`retry`'s budget are in this clock's seconds; the renewer
    schedules its rounds on it too (it backs off by the delays it gets)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] = time.sleep,
                 min_delay: float = 0.5, max_delay: float = 10.0,
                 on_back: Callable[[], object] | None = None) -> None:
        self.clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0
        self.last_ok = clock()
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.errors = 0
        #: How many outages are over: the daemon's attempts that wait for
        #: the backoff are due at once when it grows (dblockrun/daemon/firing.py),
        #: and ``on_back`` is called (from the thread whose statement got
        #: through: the daemon's wakes its main loop).
        self.ended = 0
        self.on_back = on_back
        #: The session holding rows, as last logged, and when a statement last
        #: waited on it (on the clock).
        self._holder: str | None = None
        self._held_seen = 0.0
        self._held_since = 0.0

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, what: str, exc: BaseException) -> float:
        """Note a failure; returns how long to wait before trying again."""
        with self._lock:
            self.errors += 1
            self._failures += 1
            if getattr(exc, "kind", "") == "lock-held":
                now = self.clock()
                holder = getattr(exc, "holder", None) or "?"
                if holder != self._holder:
                    self._holder, self._held_since = holder, now
                    log.error("%s (%s): %s; retrying with backoff", describe(exc), what, exc)
                self._held_seen = now
                return min(self.max_delay, self.min_delay * 2.0 ** min(self._failures - 1, 10))
            if self._since is None:
                self._since = self.clock()
                log.error("%s (%s): %s; retrying with backoff", describe(exc), what, exc)
            delay: float = self.min_delay * 2.0 ** min(self._failures - 1, 10)
            return min(self.max_delay, delay)

    def ok(self) -> None:
        with self._lock:
            self.last_ok = self.clock()
            back = self._since is not None
            if self._since is not None:
                log.warning("database back after %.1fs", self.last_ok - self._since)
                self.ended += 1
            self._since = None
            self._failures = 0
            # No statement waited on the held rows for a while: free again.
            if self._holder is not None and self.last_ok - self._held_seen >= self.max_delay:
                log.warning("the lock rows are free again (held by another session, %s, "
                            "for %.1fs or more)", self._holder,
                            self._held_seen - self._held_since)
                self._holder = None
        if back and self.on_back is not None:
            self.on_back()

    def retry(self, what: str, fn: Callable[[], R], within: float) -> R | None:
        """Call ``fn`` until it answers or ``within`` seconds from now would
        pass, backing off between tries (the run lifecycle's one retry loop:
        recording a run, its result, a release). ``fn``'s answer, or None
        after the last try failed (logged as part of the outage)."""
        until = self.clock() + within
        while True:
            try:
                result = fn()
                self.ok()
                return result
            except DatabaseError as exc:
                delay = self.failed(what, exc)
                if self.clock() + delay > until:
                    log.warning("%s: gave up: %s", what, exc)
                    return None
                self._sleep(delay)
