"""What the two ways a daemon waits for run-now and kill requests share
(PostgreSQL's LISTEN, dblockrun/store/listen.py; MySQL/MariaDB's wait
ended by ``KILL QUERY``, dblockrun/store/doorbell.py): a connection of its
own, taken from the pool for good; a supervised thread that waits on it and,
when the database or the connection is down, says so once and tries again
after ``retry`` while the bookkeeping round reads the requests.

Supervised (dblockrun/supervise.py): a driver error is the connection being
down (a warning, then the retry); any other exception is a crash, restarted
after a backoff of at most ``retry``, the bookkeeping round reading the
requests meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from dblockrun.errors import DatabaseError
from dblockrun.store.store import Store
from dblockrun.supervise import Loop, Policy, Threads

log = logging.getLogger("dblockrun")


class RequestWait:
    """A thread that hands ``heard`` the requests its connection learns of
    (``heard(None)``: read them all, as after each connect)."""

    #: What the log says while it cannot wait ("not listening").
    down_text = "not waiting for them"

    def __init__(self, store: Store, heard: Callable[[list[str] | None], None], retry: float,
                 threads: Threads | None, join_timeout: float,
                 interrupt: Callable[[], None] | None = None) -> None:
        self.store = store
        self.heard = heard
        self.retry = retry
        self._conn: Any = None
        self._worker = Loop(threads, "run-requests", Policy(max_delay=retry), self._loop,
                            join_timeout=join_timeout, interrupt=interrupt)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def driver_errors(self) -> tuple[type[BaseException], ...]:
        """The driver's errors: the connection down, not a crash."""
        raise NotImplementedError

    def wait(self, conn: Any) -> None:
        """Wait on ``conn`` for requests until the stop (raises when the
        connection fails)."""
        raise NotImplementedError

    def _loop(self) -> None:
        down: tuple[type[BaseException], ...] = (
            DatabaseError, sa.exc.SQLAlchemyError, OSError, *self.driver_errors())
        failed = False
        while not self._worker.stopping:
            try:
                self.wait(self._own_connection())
                failed = False
            except down as exc:
                # the database or the connection is down: an outage, not a crash
                if not failed:
                    text = str(exc).strip()
                    log.warning("run requests: %s (%s); requests are read every bookkeeping "
                                "round until it reconnects", self.down_text,
                                text.splitlines()[0] if text else exc)
                failed = True
                self._worker.ok()
            finally:
                self._close()
            self._worker.wait(self.retry)

    def _own_connection(self) -> Any:
        pooled = self.store.engine.raw_connection()
        self._conn = pooled.driver_connection
        pooled.detach()  # ours for good: closed here, not returned to the pool
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already dead
                pass
