"""Run-now requests (``dblockrun run JOB``): where a daemon learns of them.
One interface, two ways: PostgreSQL announces them (LISTEN/NOTIFY, with the
bookkeeping round reading them too, so a dead listener costs at most a
round); MySQL/MariaDB and SQLite are polled (one statement a
``request_poll``).

Through a transaction-pooling PgBouncer (``?pooler=transaction``) there is
no session to LISTEN on: the daemon does not listen, and the bookkeeping
round, which reads the requests anyway, is how they arrive (within a round,
12 s at the default heartbeat; no statement more). Kill requests come with
the lease renewals, every heartbeat."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from dblockrun.daemon.listen import RequestListener
from dblockrun.store import Store
from dblockrun.supervise import Threads


class Inbox(Protocol):
    def take(self) -> list[str] | None:
        """The jobs to look at for requests now (None: none). Raises
        :class:`~dblockrun.errors.DatabaseError`."""

    def due_in(self) -> float:
        """Seconds until :meth:`take` may have something new."""

    def hear(self, names: list[str] | None) -> None:
        """Requests read by a bookkeeping round (``names``), or None: read
        them all. From any thread."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class HeardInbox:
    """PostgreSQL: requests are announced and heard by a listener (without
    ``listen``, read by the bookkeeping rounds alone)."""

    def __init__(self, store: Store, wake: Callable[[], None], heartbeat: float,
                 killed: Callable[[], None], threads: Threads, *, listen: bool = True) -> None:
        self.store = store
        self.heartbeat = heartbeat
        self._wake = wake
        self._heard: set[str] = set()
        self._all = False
        self._lock = threading.Lock()
        self.listener = RequestListener(store, self.hear, heartbeat, killed=killed,
                                        threads=threads) if listen else None

    def hear(self, names: list[str] | None) -> None:
        with self._lock:
            if names is None:
                self._all = True
            else:
                self._heard.update(names)
        self._wake()

    def take(self) -> list[str] | None:
        with self._lock:
            heard, read_all = self._heard, self._all
            self._heard, self._all = set(), False
        if read_all:
            heard.update(self.store.requested())
        return sorted(heard) if heard else None

    def due_in(self) -> float:
        return self.heartbeat

    def start(self) -> None:
        if self.listener is not None:
            self.listener.start()

    def stop(self) -> None:
        if self.listener is not None:
            self.listener.stop()


class PolledInbox:
    """MySQL/MariaDB and SQLite: the requests are read every ``every`` seconds."""

    def __init__(self, store: Store, every: float) -> None:
        self.store = store
        self.every = every
        self._next = 0.0

    def hear(self, names: list[str] | None) -> None:
        self._next = 0.0

    def take(self) -> list[str] | None:
        if time.monotonic() < self._next:
            return None
        self._next = time.monotonic() + self.every
        return self.store.requested()

    def due_in(self) -> float:
        return self._next - time.monotonic()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def inbox_for(store: Store, wake: Callable[[], None], heartbeat: float, poll: float,
              killed: Callable[[], None], threads: Threads) -> Inbox:
    if store.lock.q.one_round:
        return HeardInbox(store, wake, heartbeat, killed, threads,
                          listen=store.pooler != "transaction")
    return PolledInbox(store, poll)
