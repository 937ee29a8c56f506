"""SQL of the operators' fleet controls (SQLAlchemy Core, cold): kill
requests, the fleet-wide pause, and the audit trail every operator action
writes in the same transaction as the action.

A kill request is written on the row that holds the run (the job's lock, or
a fan-out item's row) with the run's fencing token (``kill_token``) and who
asked (``kill_by``); the holder reads it with its next lease renewal
(``Queries.kill_of``), so a request for a run that has ended since is never
applied to the next one. On PostgreSQL the request is also announced (``NOTIFY``), and daemons
that listen renew at once. The pause is one row of the ``pause`` table, which
``Queries.claimable`` consults: no claim on any path wins while it lasts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dblockrun.durations import FOREVER
from dblockrun.store import models as m
from dblockrun.store.engine import in_transaction
from dblockrun.store.models import Told
from dblockrun.store.queries import TOLD_ACTIONS

if TYPE_CHECKING:
    from dblockrun.store.cold import ColdPath

T = TypeVar("T")

#: The pause row's id: one pause for the whole fleet (the table prefix's).
FLEET = "fleet"


@dataclass(frozen=True)
class Audit:
    """An operator action to record: who (``user@host``), what, on which job
    (None: the whole fleet), details and the operator's reason."""

    who: str
    action: str
    job: str | None = None
    detail: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class AuditRecord:
    id: int
    at: float  # the database clock
    who: str
    action: str
    job: str | None
    detail: str | None
    reason: str | None


@dataclass(frozen=True)
class Pause:
    """The fleet-wide pause: from ``since`` until ``ends`` (database clock;
    :data:`~dblockrun.durations.FOREVER`: until resumed)."""

    ends: float
    since: float
    who: str
    reason: str | None


class ControlStore:
    def __init__(self, store: ColdPath) -> None:
        self.s = store

    # -- the audit trail ------------------------------------------------------------

    def record(self, conn: Connection, entry: Audit) -> None:
        """Write ``entry`` (in the caller's transaction), at the database time."""
        conn.execute(self.s.t.audit.insert().values(
            at=self.s.now, who=entry.who, action=entry.action, job=entry.job,
            detail=entry.detail, reason=entry.reason))

    def note(self, entry: Audit) -> None:
        """Record an action whose own writes are the lock engine's (``run``,
        ``backfill``, ``rerun``: their claims), in a transaction of its own."""
        self.s._run(lambda c: self.record(c, entry))

    def audited(self, go: Callable[[Connection], T], entry: Audit | None) -> T:
        """``go`` and, when it acted (a result other than None or False), the
        audit row ``entry``, in one transaction; without ``entry``, ``go`` alone."""
        if entry is None:
            return self.s._run(go)

        def both(conn: Connection) -> T:
            def steps() -> T:
                result = go(conn)
                if result is not None and result is not False:
                    self.record(conn, entry)
                return result

            return in_transaction(self.s.dialect.name, conn.exec_driver_sql, steps)

        return self.s._run(both)

    def entries(self, job: str | None = None, limit: int = 20) -> list[AuditRecord]:
        """The newest ``limit`` entries (of ``job``), newest first."""
        audit = self.s.t.audit
        stmt = sa.select(audit).order_by(audit.c.id.desc()).limit(limit)
        if job is not None:
            stmt = stmt.where(audit.c.job == job)
        return self.s._run(
            lambda c: [m.from_row(AuditRecord, r._mapping) for r in c.execute(stmt)])

    def last_id(self) -> int:
        """The newest entry's id (0: none): where a starting daemon's
        bookkeeping begins to read the actions it logs."""
        audit = self.s.t.audit
        return self.s._run(lambda c: int(c.execute(
            sa.select(sa.func.coalesce(sa.func.max(audit.c.id), 0))).scalar_one()))

    def told_after(self, after: int) -> list[Told]:
        """The actions daemons log (queries.TOLD_ACTIONS) audited after ``after``."""
        audit = self.s.t.audit
        stmt = (sa.select(audit.c.id, audit.c.who, audit.c.action, audit.c.job,
                          audit.c.detail, audit.c.reason)
                .where(audit.c.id > after, audit.c.action.in_(TOLD_ACTIONS))
                .order_by(audit.c.id))
        return self.s._run(lambda c: [Told(int(r[0]), *r[1:]) for r in c.execute(stmt)])

    # -- the fleet-wide pause ---------------------------------------------------------

    def pause(self, entry: Audit, for_seconds: float | None) -> Pause:
        """Pause the fleet (a pause already there is replaced) for
        ``for_seconds`` of the database clock, or until resumed."""
        pause, now = self.s.t.pause, self.s.now
        ends: Any = FOREVER if for_seconds is None else now + for_seconds

        def go(conn: Connection) -> Pause:
            conn.execute(pause.delete().where(pause.c.id == FLEET))
            conn.execute(pause.insert().values(id=FLEET, ends=ends, since=now, who=entry.who,
                                               reason=entry.reason))
            found = self._read(conn)
            assert found is not None
            return found

        return self.audited(go, entry)

    def resume(self, entry: Audit) -> Pause | None:
        """End the pause; the pause that was in effect (None: none was). Its
        row stays, ending now: ``status`` tells the slots it dropped from a
        job that is due (:meth:`last_pause`)."""
        pause = self.s.t.pause

        def go(conn: Connection) -> Pause | None:
            was = self._read(conn, current=True)
            if was is not None:
                conn.execute(pause.update().where(pause.c.id == FLEET, pause.c.ends > self.s.now)
                             .values(ends=self.s.now))
            return was

        return self.audited(go, entry)

    def paused(self) -> Pause | None:
        """The pause in effect now, if any (one statement)."""
        return self.s._run(lambda c: self._read(c, current=True))

    def last_pause(self) -> Pause | None:
        """The pause in effect now, or else the last one, ended (resumed,
        or over by its own time); one statement."""
        return self.s._run(self._read)

    def _read(self, conn: Connection, *, current: bool = False) -> Pause | None:
        pause = self.s.t.pause
        stmt = sa.select(pause).where(pause.c.id == FLEET)
        if current:
            stmt = stmt.where(pause.c.ends > self.s.now)
        row = conn.execute(stmt).first()
        return None if row is None else m.from_row(Pause, row._mapping)

    # -- kill requests ------------------------------------------------------------------

    def running(self, job: str | None = None, item: str | None = None,
                run_id: int | None = None) -> list[m.RunRecord]:
        """The runs still running under a live lease: of ``job`` (and
        ``item``), or the run ``run_id``."""
        runs = self.s.t.runs
        if run_id is not None and not m.run_id_possible(run_id):
            return []
        stmt = (sa.select(runs).where(runs.c.result.in_(m.UNFINISHED), self._held())
                .order_by(runs.c.id))
        if run_id is not None:
            stmt = stmt.where(runs.c.id == run_id)
        if job is not None:
            stmt = stmt.where(runs.c.job == job)
        if item is not None:
            stmt = stmt.where(runs.c.item == item)
        return self.s._run(
            lambda c: [m.from_row(m.RunRecord, r._mapping) for r in c.execute(stmt)])

    def waiting(self, jobs: Sequence[str]) -> list[m.RunRecord]:
        """The slots of ``jobs`` waiting under a live lease (``when-full:
        queue``), oldest slot first (a rate job's turn: when it was
        claimed), one statement."""
        runs = self.s.t.runs
        if not jobs:
            return []
        stmt = (sa.select(runs).where(runs.c.result == m.WAITING, runs.c.job.in_(list(jobs)),
                                      self._held())
                .order_by(sa.func.coalesce(runs.c.slot, runs.c.started), runs.c.id))
        return self.s._run(
            lambda c: [m.from_row(m.RunRecord, r._mapping) for r in c.execute(stmt)])

    def _held(self) -> sa.ColumnElement[bool]:
        """A run's lock row (or item) holds it with its token, its lease live."""
        q = self.s.lock.q
        return sa.literal_column(
            f"(EXISTS (SELECT 1 FROM {q.locks} WHERE {q.holding(q.locks, True)}) "
            f"OR EXISTS (SELECT 1 FROM {q.items} WHERE {q.holding(q.items, True)}))",
            sa.Boolean())

    def kill(self, runs: list[m.RunRecord], who: str,
             reason: str | None) -> list[m.RunRecord]:
        """Ask the holders of ``runs`` to stop them: a request on each
        holding row, only while it still holds that run (its token, a live
        lease), and an audit row per run, in one transaction. The runs asked."""
        locks, items, now = self.s.t.locks, self.s.t.items, self.s.now
        by = (who if not reason else f"{who}: {reason}")[:1000]  # the column's size

        def go(conn: Connection) -> list[m.RunRecord] | None:
            asked: list[m.RunRecord] = []
            for run in runs:
                if run.item is None:
                    # The job's row, or the lane of an overlap: allow N job's
                    # run (the job's row may still have the run's token too,
                    # within its lock-at-least: the lane is the run's).
                    lane = sa.and_(locks.c.held_for == run.job,
                                   sa.func.substr(locks.c.name, 1, len(m.LANE_PREFIX))
                                   == m.LANE_PREFIX)
                    where = sa.and_(sa.or_(locks.c.name == run.job, lane),
                                    locks.c.token == run.token, locks.c.lock_until > now)
                    stmt = locks.update().where(where)
                else:
                    where = sa.and_(items.c.job == run.job, items.c.item == run.item,
                                    items.c.token == run.token, items.c.lock_until > now)
                    stmt = items.update().where(where)
                if conn.execute(stmt.values(kill_token=run.token, kill_by=by)).rowcount >= 1:
                    asked.append(run)
                    self.record(conn, Audit(who, "kill", run.job, _run_detail(run), reason))
            if asked and self.s.dialect.name == "postgresql":
                # Delivered at commit: listening daemons renew now (listen.py).
                channel = self.s.lock.q.kill_channel
                conn.execute(sa.select(sa.func.pg_notify(channel, asked[0].job)))
            return asked

        def steps(conn: Connection) -> list[m.RunRecord]:
            return in_transaction(self.s.dialect.name, conn.exec_driver_sql,
                                  lambda: go(conn)) or []

        asked = self.s._run(steps)
        if asked:
            self.s.ring()  # MySQL: the holders renew now, so read it
        return asked


def _run_detail(run: m.RunRecord) -> str:
    item = f", item {run.item}" if run.item is not None else ""
    return f"run {run.id}{item} on {run.host} (token {run.token})"
