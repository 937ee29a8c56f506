"""MySQL/MariaDB: hear ``dblockrun run`` and ``dblockrun kill`` requests as
they are filed, without polling for them.

MySQL has no LISTEN. Each daemon keeps one connection of its own that waits
in ``SELECT SLEEP(10)`` marked with the table prefix (store/queries.py
``request_wait``), one statement each :data:`WAIT` seconds. ``run`` and
``kill`` file their request, then end every such wait on the server that
their user may end with ``KILL QUERY`` (:meth:`Store.ring`): the woken
daemon reads the requests at once, and renews its leases, so reads a kill
request. A wait that ends on its own says nothing; the next begins.

A daemon not woken reads the request with its bookkeeping round (every
12 s at the default heartbeat; store/queries.py ``MysqlQueries.books_round``)
and a kill with its next renewal: when the requester's user may not end
another user's statements (without the PROCESS and CONNECTION ADMIN or
SUPER privileges), when the daemon waits on another node of a Galera
cluster (the process list is a node's own), or while this connection is
down. The wait's connection is the daemon's second server connection (the
first is its pool's).

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
from dblockrun.store import Store
from dblockrun.store.drivers import is_interrupted
from dblockrun.supervise import Loop, Policy, Threads

log = logging.getLogger("dblockrun")

#: How long one wait lasts: less than the connection's read timeout (15 s,
#: store/drivers.py); 6 statements a minute.
WAIT = 10.0
#: A wake renews the daemon's leases at once (so reads a kill request) at
#: most this often (dblockrun/running/heartbeat.py ``Renewer.renew_now``).
RENEW_GAP = 0.5


class Doorbell:
    """A thread that calls ``heard(None)`` (read all requests) and
    ``killed(RENEW_GAP)`` (renew now) each time its wait is ended by a request, and
    ``heard(None)`` after each connect."""

    def __init__(self, store: Store, heard: Callable[[list[str] | None], None],
                 retry: float, killed: Callable[[float], None],
                 threads: Threads | None = None) -> None:
        self.store = store
        self.heard = heard
        self.retry = retry
        self.killed = killed
        self._conn: Any = None
        self._worker = Loop(threads, "run-requests", Policy(max_delay=retry), self._loop,
                            join_timeout=WAIT + 5, interrupt=self._end_wait)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _end_wait(self) -> None:
        """At the stop: end the wait now rather than within :data:`WAIT`."""
        conn = self._conn
        if conn is None:
            return
        try:
            self.store.lock_engine().wake(conn.thread_id())
        except DatabaseError:
            pass  # it ends within WAIT

    def _loop(self) -> None:
        import pymysql  # a MySQL daemon's only

        failed = False
        while not self._worker.stopping:
            try:
                self._wait()
                failed = False
            except (DatabaseError, sa.exc.SQLAlchemyError, pymysql.Error, OSError) as exc:
                # the database or the connection is down: an outage, not a crash
                if not failed:
                    log.warning("run requests: not waiting for them (%s); requests are "
                                "read every bookkeeping round until it reconnects",
                                str(exc).strip().splitlines()[0] if str(exc).strip() else exc)
                failed = True
                self._worker.ok()
            finally:
                self._close()
            self._worker.wait(self.retry)

    def _wait(self) -> None:
        pooled = self.store.engine.raw_connection()
        conn: Any = pooled.driver_connection
        self._conn = conn
        pooled.detach()  # ours for good: closed here, not returned to the pool
        log.debug("run requests: waiting for them on connection %d", conn.thread_id())
        self.heard(None)  # those filed while not waiting
        wait = self.store.lock.mysql_q.request_wait
        while not self._worker.stopping:
            with conn.cursor() as cur:
                try:
                    cur.execute(wait, {"seconds": WAIT})
                    cur.fetchall()
                except Exception as exc:
                    if not is_interrupted(exc):
                        raise
                    if not self._worker.stopping:
                        self.heard(None)
                        self.killed(RENEW_GAP)  # (Renewer.renew_now)
            self._worker.ok()  # a round: a wait

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already dead
                pass
