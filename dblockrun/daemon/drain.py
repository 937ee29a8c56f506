"""Whether this daemon's host is drained (``dblockrun drain HOST``), as
the main loop knows it.

The database refuses a drained host's claims whatever the daemon knows
(store/drain.py); the daemon reads its own drain so as not to try them,
and to record its every-host slots ``skipped: host drained`` through the
slot book (no other host may run them). It reads its row at start-up and
again when told: a drain or undrain announced on the run-now channel
(PostgreSQL's NOTIFY), or seen by the read of run requests that MySQL's
doorbell wakes and SQLite polls, which reads the host's drain row in the
same statement (store/inbox.py ``DrainRow``), or read from the audit trail by the bookkeeping round
(dblockrun/daemon/fleet.py), whichever comes first; no new poll. A
drain's end by its own time needs no read: the database clock passes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from dblockrun.errors import DatabaseError
from dblockrun.store.models import Drain
from dblockrun.store.store import FOREVER
from dblockrun.timetext import stamp

if TYPE_CHECKING:
    from dblockrun.store.roles import FleetBookkeeping

log = logging.getLogger("dblockrun")

#: What every-host slots passed while drained are recorded with (``skipped: host drained``).
DRAINED_REASON = "host drained"


class DrainWatch:
    """This host's drain: read when :meth:`told` (from any thread), applied
    by the main loop (:meth:`refresh`)."""

    def __init__(self, store: FleetBookkeeping, host: str, now: Callable[[], float],
                 wake: Callable[[], None]) -> None:
        self.store = store
        self.host = host
        self._now = now
        self._wake = wake
        self._stale = True  # read at start-up
        self._drain: Drain | None = None
        self._said: Drain | None = None  # the drain last logged (None: not drained)

    def told(self) -> None:
        """A drain or undrain was announced: read again (any thread)."""
        self._stale = True
        self._wake()

    def refresh(self) -> None:
        """Read this host's drain if told to (main loop; one statement then).
        A database error leaves it to be read again next time."""
        if self._stale:
            try:
                self._stale = False
                self._drain = self.store.drains.drained(self.host)
            except DatabaseError as exc:
                self._stale = True
                log.debug("could not read whether host %s is drained: %s", self.host, exc)
        self._say()

    def drained(self) -> Drain | None:
        """The drain in effect by the database clock now, if any."""
        drain = self._drain
        return drain if drain is not None and drain.ends > self._now() else None

    def _say(self) -> None:
        now = self.drained()
        if now == self._said:
            return
        if now is not None:
            until = "until undrained" if now.ends >= FOREVER else f"until {stamp(now.ends)}"
            why = f": {now.reason}" if now.reason else ""
            log.warning("host %s drained by %s %s%s; starting nothing new here (running "
                        "runs finish; every-host slots are recorded skipped)", self.host,
                        now.who, until, why)
        else:
            assert self._said is not None
            how = ("its time ran out" if self._drain is not None and self._drain == self._said
                   else "undrained")
            log.info("host %s no longer drained (%s): claiming again", self.host, how)
        self._said = now
