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

The thread, its connection and its outage handling: dblockrun/store/requestwait.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dblockrun.errors import DatabaseError
from dblockrun.store.drivers import is_interrupted
from dblockrun.store.requestwait import RequestWait
from dblockrun.store.store import Store
from dblockrun.supervise import Threads

log = logging.getLogger("dblockrun")

#: How long one wait lasts: less than the connection's read timeout (15 s,
#: store/drivers.py); 6 statements a minute.
WAIT = 10.0
#: A wake renews the daemon's leases at once (so reads a kill request) at
#: most this often (dblockrun/running/heartbeat.py ``Renewer.renew_now``).
RENEW_GAP = 0.5


class Doorbell(RequestWait):
    """A thread that calls ``heard(None)`` (read all requests) and
    ``killed(RENEW_GAP)`` (renew now) each time its wait is ended by a request, and
    ``heard(None)`` after each connect."""

    def __init__(self, store: Store, heard: Callable[[list[str] | None], None],
                 retry: float, killed: Callable[[float], None],
                 threads: Threads | None = None) -> None:
        super().__init__(store, heard, retry, threads, join_timeout=WAIT + 5,
                         interrupt=self._end_wait)
        self.killed = killed

    def _end_wait(self) -> None:
        """At the stop: end the wait now rather than within :data:`WAIT`."""
        conn = self._conn
        if conn is None:
            return
        try:
            self.store.lock_engine().wake(conn.thread_id())
        except DatabaseError:
            pass  # it ends within WAIT

    def driver_errors(self) -> tuple[type[BaseException], ...]:
        import pymysql  # a MySQL daemon's only

        return (pymysql.Error,)

    def wait(self, conn: Any) -> None:
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
