"""SQL of draining a host (``dblockrun drain HOST``), next to the fleet's
pause (store/control.py) and written the same way: one row per host name
(the ``drain`` table, schema 13), replaced by a new drain, ending (not
deleted) when undrained, with its audit row in the same transaction.

While a row's end is ahead of the database clock, the one claim predicate
(``Queries.claimable``) refuses every claim of a holder on that host (a
holder id is ``HOST:pid:random``): no slot, run-now request, fan-out item
or ``exec`` lock is won there, whatever the daemon knows. The daemon reads
its own row to record its every-host slots ``skipped`` (dblockrun/daemon/drain.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dblockrun.durations import FOREVER
from dblockrun.store import models as m
from dblockrun.store.control import Audit

if TYPE_CHECKING:
    from dblockrun.store.cold import ColdPath
    from dblockrun.store.control import ControlStore

#: The announcement of a drain or undrain on the run-now channel: not a job
#: name (names have no ``@`` first).
DRAIN_NOTE = "@drain"


class DrainStore:
    def __init__(self, store: ColdPath, control: ControlStore) -> None:
        self.s = store
        self.control = control

    def drain(self, host: str, entry: Audit, for_seconds: float | None) -> m.Drain:
        """Drain ``host`` (a drain already there is replaced) for
        ``for_seconds`` of the database clock, or until undrained; with
        ``entry`` audited. On PostgreSQL the daemons are told at once
        (NOTIFY), on MySQL woken (the doorbell)."""
        drain, now = self.s.t.drain, self.s.now
        ends: Any = FOREVER if for_seconds is None else now + for_seconds

        def go(conn: Connection) -> m.Drain:
            conn.execute(drain.delete().where(drain.c.host == host))
            conn.execute(drain.insert().values(host=host, ends=ends, since=now, who=entry.who,
                                               reason=entry.reason))
            self._announce(conn)
            found = self._read(conn, host)
            assert found is not None
            return found

        done = self.control.audited(go, entry)
        self.s.ring()
        return done

    def undrain(self, host: str, entry: Audit) -> m.Drain | None:
        """End ``host``'s drain; the drain that was in effect (None: none
        was, and nothing is audited). Its row stays, ending now."""
        drain = self.s.t.drain

        def go(conn: Connection) -> m.Drain | None:
            was = self._read(conn, host, current=True)
            if was is not None:
                conn.execute(drain.update().where(drain.c.host == host,
                                                  drain.c.ends > self.s.now)
                             .values(ends=self.s.now))
                self._announce(conn)
            return was

        done = self.control.audited(go, entry)
        if done is not None:
            self.s.ring()
        return done

    def drained(self, host: str) -> m.Drain | None:
        """``host``'s drain in effect now, if any (one statement)."""
        return self.s._run(lambda c: self._read(c, host, current=True))

    def current(self) -> list[m.Drain]:
        """Every drain in effect now, by host name (one statement)."""
        drain = self.s.t.drain
        stmt = sa.select(drain).where(drain.c.ends > self.s.now).order_by(drain.c.host)
        return self.s._run(
            lambda c: [m.from_row(m.Drain, r._mapping) for r in c.execute(stmt)])

    def _read(self, conn: Connection, host: str, *, current: bool = False) -> m.Drain | None:
        drain = self.s.t.drain
        stmt = sa.select(drain).where(drain.c.host == host)
        if current:
            stmt = stmt.where(drain.c.ends > self.s.now)
        row = conn.execute(stmt).first()
        return None if row is None else m.from_row(m.Drain, row._mapping)

    def _announce(self, conn: Connection) -> None:
        """PostgreSQL: listening daemons hear it at commit (on the run-now
        channel, with a payload no job has: dblockrun/daemon/drain.py)."""
        if self.s.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_notify(self.s.lock.q.channel, DRAIN_NOTE)))
