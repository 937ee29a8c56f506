"""PostgreSQL: hear ``dblockrun run`` requests as they are filed, and
``dblockrun kill`` requests (the daemon then renews its leases at once, and
the renewal hands it the request).

`dblockrun run JOB` files its request and sends ``NOTIFY`` in the same
statement (store/queries.py ``request_run``). Each daemon on PostgreSQL
keeps one connection of its own, in autocommit, that ``LISTEN``\\s on the
table prefix's channel, so a request reaches every daemon within a round
trip and an idle daemon sends no statement to look for requests. Each time
it (re)connects it has the daemon read the requests filed meanwhile; while
it cannot connect, the bookkeeping round (every 12 s by default) still
hands the daemon the requests it reads.

The thread, its connection and its outage handling: dblockrun/store/requestwait.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from dblockrun.store.requestwait import RequestWait
from dblockrun.store.store import Store
from dblockrun.supervise import Threads

log = logging.getLogger("dblockrun")

#: How long one wait for notifications lasts (a stop is seen within it).
WAIT = 1.0
#: Run announcements are handed to the daemon at most this often (the jobs
#: heard meanwhile together): any role that can connect can NOTIFY, and a
#: flood must not cost a claim statement per announcement.
HAND_EVERY = 0.25


class RequestListener(RequestWait):
    """A thread that calls ``heard([job])`` for each request announced, and
    ``heard(None)`` (read all requests) once listening, after each connect."""

    down_text = "not listening"

    def __init__(self, store: Store, heard: Callable[[list[str] | None], None],
                 retry: float, killed: Callable[[], None] | None = None,
                 threads: Threads | None = None) -> None:
        super().__init__(store, heard, retry, threads, join_timeout=2 * WAIT + 5)
        self.killed = killed
        self.channel = store.lock.q.channel
        self.kill_channel = store.lock.q.kill_channel

    def driver_errors(self) -> tuple[type[BaseException], ...]:
        import psycopg  # a PostgreSQL daemon's only

        return (psycopg.Error,)

    def wait(self, conn: Any) -> None:
        # The prefix is letters, digits and _ (validated): a quoted identifier.
        conn.execute(f'LISTEN "{self.channel}"')
        if self.killed is not None:
            conn.execute(f'LISTEN "{self.kill_channel}"')
        log.debug("run requests: listening on %s", self.channel)
        self.heard(None)
        pending: set[str] = set()
        next_hand = 0.0
        while not self._worker.stopping:
            for note in conn.notifies(timeout=WAIT):
                if note.channel == self.channel and note.payload:
                    pending.add(note.payload)
                elif note.channel == self.kill_channel and self.killed is not None:
                    self.killed()  # (coalesced by the renewer: Renewer.renew_now)
                next_hand = self._hand(pending, next_hand)
            next_hand = self._hand(pending, next_hand)
            self._worker.ok()  # a round: a wait for notifications

    def _hand(self, pending: set[str], next_hand: float) -> float:
        """Hand the jobs heard to the daemon unless it was handed some less
        than :data:`HAND_EVERY` ago; when to hand the next ones."""
        now = time.monotonic()
        if not pending or now < next_hand:
            return next_hand
        self.heard(sorted(pending))
        pending.clear()
        return now + HAND_EVERY
