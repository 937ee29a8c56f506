"""The whole fleet's ``status --json`` document (with what the Fleet page
filters, counts and sorts by: web/fleetview.py), shared by every request
for it: read at most once a second while asked for, and served while the
next one is read (stale-while-revalidate).

Reading and serializing 10,000 jobs takes about 0.6 s; a dashboard or a
monitor polling ``GET /api/v1/status`` gets the newest document at once
(at most ``max_age`` plus one read old), and the database sees one reader
whatever the number of clients. A request for some jobs (``?job=``) reads
them itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How old a document may be before a request starts the next read.
MAX_AGE = 1.0
#: Older than this (the last reads failed), a request reads it itself.
TOO_OLD = 15.0


class Snapshot(Generic[T]):
    """What ``read`` returns, shared (a str in the tests; a
    :class:`~dblockrun.web.fleetview.FleetStatus` in the server)."""

    def __init__(self, read: Callable[[], T], max_age: float = MAX_AGE,
                 too_old: float = TOO_OLD) -> None:
        self._read = read
        self.max_age, self.too_old = max_age, too_old
        self._doc: tuple[float, T] | None = None
        self._lock = threading.Lock()  # guards _doc and _reading
        self._first = threading.Lock()  # one inline read at a time
        self._reading = False

    def get(self) -> T:
        """The newest document; read here when there is none yet (or it is
        :attr:`too_old`), else in the background when older than :attr:`max_age`."""
        with self._lock:
            doc = self._doc
            age = None if doc is None else time.monotonic() - doc[0]
            if age is not None and self.max_age < age <= self.too_old and not self._reading:
                self._reading = True
                threading.Thread(target=self._refresh, name="status-snapshot",
                                 daemon=True).start()
        if doc is not None and age is not None and age <= self.too_old:
            return doc[1]
        with self._first:
            with self._lock:  # another request may have read it meanwhile
                if self._doc is not None and time.monotonic() - self._doc[0] <= self.max_age:
                    return self._doc[1]
            return self._store(self._read())

    def forget(self) -> None:
        """After an action: the next request reads the document itself."""
        with self._lock:
            self._doc = None

    def _store(self, text: T, started: float | None = None) -> T:
        with self._lock:
            self._doc = (time.monotonic() if started is None else started, text)
        return text

    def _refresh(self) -> None:
        started = time.monotonic()
        try:
            self._store(self._read(), started)
        except Exception:  # noqa: BLE001 - logged; the next request tries again
            log.exception("reading the status document failed")
        finally:
            with self._lock:
                self._reading = False
