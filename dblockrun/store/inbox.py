"""Run-now requests (``dblockrun run JOB``): where a daemon learns of them.
One interface, two ways. PostgreSQL announces them (LISTEN/NOTIFY:
:mod:`dblockrun.store.listen`) and MySQL/MariaDB wakes a wait for them
(``KILL QUERY``: :mod:`dblockrun.store.doorbell`); either way the
bookkeeping round reads them too, so a dead listener or a daemon the
requester could not wake costs at most a round. SQLite is polled (one
statement a ``request_poll``).

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

from dblockrun.store.listen import RequestListener
from dblockrun.store.store import Store
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


class Listener(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


class HeardInbox:
    """PostgreSQL and MySQL/MariaDB: requests are heard by a listener (or
    with none, read by the bookkeeping rounds alone)."""

    def __init__(self, store: Store, wake: Callable[[], None], heartbeat: float,
                 listener: Callable[[HeardInbox], Listener] | None) -> None:
        self.store = store
        self.heartbeat = heartbeat
        self._wake = wake
        self._heard: set[str] = set()
        self._all = False
        self._lock = threading.Lock()
        self.listener = listener(self) if listener is not None else None

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
    """SQLite: the requests are read every ``every`` seconds."""

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
              killed: Callable[[float | None], None], threads: Threads) -> Inbox:
    """``killed(gap)``: renew the leases now, at most once per ``gap``
    seconds (None: per heartbeat); a kill may have been asked for."""
    if store.lock.q.one_round:
        if store.pooler == "transaction":
            return HeardInbox(store, wake, heartbeat, None)
        return HeardInbox(store, wake, heartbeat, lambda inbox: RequestListener(
            store, inbox.hear, heartbeat, killed=lambda: killed(None), threads=threads))
    if store.dialect.name == "mysql":
        from dblockrun.store.doorbell import Doorbell

        return HeardInbox(store, wake, heartbeat, lambda inbox: Doorbell(
            store, inbox.hear, heartbeat, killed=killed, threads=threads))
    return PolledInbox(store, poll)
