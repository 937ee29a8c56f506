"""SQL of the alerts ledger (SQLAlchemy Core, cold): a job's ``expect:``
alerts and the notification storms (dblockrun/notify/alerts.py, storm.py).

Each alert is a row keyed by (job, kind, ref), inserted by whichever host
sees it first: the database's key decides, the others' inserts are ignored,
so each alert is sent once across the fleet; its recovery is sent by the
one host whose conditional update sets ``cleared``. Times are the
database's clock. Nothing here runs on the path of a start: the watch is
one statement a bookkeeping round, and only for jobs with ``expect:``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dblockrun.store import models as m

if TYPE_CHECKING:
    from dblockrun.store.cold import ColdPath

#: The kind of a passed slot's row (counted for a storm) and of a storm's.
SLOT, STORM = "slot", "storm"
#: Results a failure streak counts (``notify: {after: N}``).
FAILURES = (m.FAILED, m.TIMEOUT, m.LOST)
#: Passed slots' rows are kept this long (a storm's window is far shorter) ...
SLOT_ROWS_KEPT = 86400.0
#: ... and a cleared alert's this long.
CLEARED_KEPT = 30 * 86400.0


@dataclass(frozen=True)
class LockSeen:
    last_slot: float | None
    last_start: float | None
    disabled_until: float | None


@dataclass(frozen=True)
class RunSeen:
    id: int
    slot: float | None
    started: float


@dataclass(frozen=True)
class Watch:
    """What one watch read of the jobs with ``expect:``: their lock rows,
    their running runs, their open alerts, and the database clock."""

    now: float
    locks: dict[str, LockSeen]
    running: dict[str, list[RunSeen]]
    #: (job, kind, ref) of each alert not cleared.
    open: list[tuple[str, str, str]]


def slot_ref(slot: float) -> str:
    """A slot as an alert's ``ref`` (exact: the repr of the float)."""
    return repr(float(slot))


class AlertStore:
    def __init__(self, store: ColdPath) -> None:
        self.s = store

    def watch(self, jobs: Sequence[str]) -> Watch:
        """One statement: the lock rows, running runs and open alerts of ``jobs``."""
        t, now = self.s.t, self.s.now
        d: sa.Double[float] = sa.Double()
        s = sa.String(64)

        def null(kind: Any) -> Any:
            return sa.cast(sa.null(), kind)

        locks = sa.select(
            t.locks.c.name.label("job"), sa.literal("lock", s).label("what"),
            sa.cast(t.locks.c.last_slot, d).label("a"), sa.cast(t.locks.c.last_start, d),
            sa.cast(t.locks.c.disabled_until, d), null(s).label("ref"), now.label("now"),
        ).where(t.locks.c.name.in_(jobs))
        runs = sa.select(
            t.runs.c.job, sa.literal("run", s), sa.cast(t.runs.c.id, d),
            sa.cast(t.runs.c.slot, d), sa.cast(t.runs.c.started, d), null(s), now,
        ).where(t.runs.c.result == m.RUNNING, t.runs.c.job.in_(jobs))
        alerts = sa.select(
            t.alerts.c.job, sa.cast(t.alerts.c.kind, s), null(d), null(d), null(d),
            sa.cast(t.alerts.c.ref, s), now,
        ).where(t.alerts.c.cleared.is_(None), t.alerts.c.job.in_(jobs))
        stmt = sa.union_all(locks, runs, alerts)
        rows = self.s._run(lambda c: c.execute(stmt).all())
        seen = Watch(now=0.0, locks={}, running={}, open=[])
        db_now = None
        for job, what, a, b, c, ref, at in rows:
            db_now = float(at)
            if what == "lock":
                seen.locks[job] = LockSeen(a, b, c)
            elif what == "run":
                seen.running.setdefault(job, []).append(RunSeen(int(a), b, float(c)))
            else:
                seen.open.append((job, what, ref))
        if db_now is None:
            db_now = float(self.s._run(lambda c: c.execute(sa.select(now)).scalar_one()))
        return Watch(db_now, seen.locks, seen.running, seen.open)

    def claim(self, job: str, kind: str, ref: str, host: str, *, detail: str = "",
              cleared: bool = False, cause: str | None = None) -> bool:
        """Insert the alert's row; whether this host's insert made it (it
        sends the alert). ``cleared``: an alert with nothing to recover from
        (fast)."""
        t, now = self.s.t, self.s.now
        stmt = self.s.dialect.insert_ignore(t.alerts).values(
            job=job, kind=kind, ref=ref, opened=now, cleared=now if cleared else None,
            host=host, cause=cause, detail=detail[:1000] or None)
        return bool(self.s._run(lambda c: self._inserted(c, stmt)))

    def _inserted(self, conn: Connection, stmt: Any) -> bool:
        """Whether an insert that ignores a row already there made its row
        (PostgreSQL's ON CONFLICT DO NOTHING reports no row count through
        SQLAlchemy: it returns the row it made)."""
        if self.s.dialect.name == "postgresql":
            return conn.execute(stmt.returning(self.s.t.alerts.c.job)).first() is not None
        return bool(conn.execute(stmt).rowcount == 1)

    def clear(self, job: str, kind: str, ref: str) -> bool:
        """Mark the alert cleared; whether this host's update did (it sends
        the recovery)."""
        t = self.s.t.alerts
        stmt = (t.update().where(t.c.job == job, t.c.kind == kind, t.c.ref == ref,
                                 t.c.cleared.is_(None)).values(cleared=self.s.now))
        return bool(self.s._run(lambda c: c.execute(stmt).rowcount == 1))

    def failure_streak(self, job: str, run_id: int, upto: int) -> int:
        """How many of the job's runs in a row, up to run ``run_id``'s and at
        most ``upto``, ended failed, timed out or lost (a run's retries are
        one run: its last attempt's result counts)."""
        shown = self.s.shown_runs(output=False).subquery()
        stmt = (sa.select(shown.c.attempt, shown.c.result)
                .where(shown.c.job == job, shown.c.id <= run_id, shown.c.item.is_(None),
                       shown.c.result.not_in((*m.PASSED, *m.UNFINISHED)))
                .order_by(shown.c.id.desc()).limit(upto * 20))
        rows = self.s._run(lambda c: c.execute(stmt).all())
        streak, new_run = 0, True
        for attempt, result in rows:
            if new_run:
                if result not in FAILURES:
                    break
                streak += 1
                if streak >= upto:
                    break
            new_run = int(attempt) <= 1
        return streak

    # -- storms ------------------------------------------------------------------

    def passed(self, host: str, slots: Sequence[tuple[str, float, str]]) -> None:
        """Rows for passed slots (job, slot, cause), counted for storms;
        the rows older than a day deleted with them."""
        t, now = self.s.t.alerts, self.s.now
        rows = [{"job": job, "kind": SLOT, "ref": slot_ref(slot), "host": host,
                 "cause": cause} for job, slot, cause in slots]

        def go(conn: Connection) -> None:
            conn.execute(self.s.dialect.insert_ignore(t).values(opened=now), rows)
            conn.execute(t.delete().where(
                sa.or_(sa.and_(t.c.kind == SLOT, t.c.opened < now - SLOT_ROWS_KEPT),
                       t.c.cleared < now - CLEARED_KEPT)))

        self.s._run(go)

    def storm_jobs(self, cause: str, window: float) -> list[str]:
        """The jobs with a slot passed for ``cause`` within ``window`` seconds, sorted."""
        t = self.s.t.alerts
        stmt = (sa.select(t.c.job).distinct()
                .where(t.c.kind == SLOT, t.c.cause == cause,
                       t.c.opened > self.s.now - window).order_by(t.c.job))
        return self.s._run(lambda c: [str(row[0]) for row in c.execute(stmt)])

    def claim_storm(self, cause: str, host: str, window: float, detail: str) -> bool:
        """Whether this host sends the storm of ``cause``: its row made, or
        taken over from a storm last seen more than ``window`` ago (one
        conditional statement decides among hosts); a storm still going is
        marked seen, so it is sent once while it lasts."""
        t, now = self.s.t.alerts, self.s.now
        key = sa.and_(t.c.job == "", t.c.kind == STORM, t.c.ref == cause)

        def go(conn: Connection) -> bool:
            if self._inserted(conn, self.s.dialect.insert_ignore(t).values(
                    job="", kind=STORM, ref=cause, opened=now, cleared=now, host=host,
                    cause=cause, detail=detail[:1000])):
                return True
            taken = conn.execute(t.update().where(key, t.c.cleared < now - window).values(
                opened=now, cleared=now, host=host, detail=detail[:1000]))
            if taken.rowcount == 1:
                return True
            conn.execute(t.update().where(key).values(cleared=now))
            return False

        return bool(self.s._run(go))
