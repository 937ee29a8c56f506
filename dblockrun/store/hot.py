"""The hot statements (claim, renew, release, a run's start and end) as
plain SQL text, sent with the driver's own cursor on a pooled connection.

Why not SQLAlchemy Core here: building and executing a Core statement costs
about 300 µs of CPU in the daemon, more than the round trip to a local
database; the text below is the same SQL, bound the same way (named
parameters, never formatted values), at the driver's cost. Everything else
(schema, status, history, operations) stays in Core.

Round trips per won run: one for the claim together with the run record,
one for the result together with the release:

* PostgreSQL: data-modifying CTEs (``WITH c AS (UPDATE ... RETURNING) INSERT``).
* MySQL/MariaDB: the claim and the INSERT go as two statements in one round
  trip (the connection has CLIENT.MULTI_STATEMENTS); the INSERT runs only if
  the UPDATE matched (``ROW_COUNT() = 1``). The result and the release are one
  multi-table UPDATE.
* SQLite: embedded, no round trips; the pairs are two statements.

A batch claim (many jobs of one slot in one statement) is in
:meth:`HotPath.claim_batch`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dblockrun.store import models as m
from dblockrun.store.sql import NOW

T = TypeVar("T")

#: CLIENT.FOUND_ROWS (rowcount counts matched rows, as SQLAlchemy sets it) and
#: CLIENT.MULTI_STATEMENTS (the claim and its run record in one round trip).
MYSQL_CLIENT_FLAG = 2 | (1 << 16)
#: ER_LOCK_DEADLOCK
_DEADLOCK = 1213


def is_deadlock(exc: BaseException | None) -> bool:
    """InnoDB rolled the statement (its transaction) back to break a deadlock."""
    args = getattr(exc, "args", None)
    return bool(args) and args[0] == _DEADLOCK  # type: ignore[index]


@dataclass(frozen=True)
class ClaimShape:
    """Which conditions a claim carries (each shape is one statement text)."""

    slot: bool = False
    rate: bool = False
    next_due: bool = False
    record: bool = False  # also insert the run record of attempt 1


@dataclass(frozen=True)
class Claimed:
    name: str
    token: int
    run_id: int | None


class HotPath:
    """The hot statements of one engine and table prefix."""

    def __init__(self, engine: Engine, dialect: str, prefix: str,
                 counted: Callable[[], None], error: Callable[[Exception], Exception]) -> None:
        self.engine = engine
        self.dialect = dialect
        self._counted = counted
        self._error = error
        self._dbapi_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        quote = engine.dialect.identifier_preparer.quote
        self.locks = quote(f"{prefix}locks")
        self.runs = quote(f"{prefix}runs")
        self.now = NOW[dialect]
        self._param = "%({})s" if dialect != "sqlite" else ":{}"
        self._texts: dict[Any, str] = {}

    # -- plumbing -----------------------------------------------------------

    def p(self, name: str) -> str:
        """A named bound parameter in the driver's style."""
        return self._param.format(name)

    def _text(self, key: Any, build: Callable[[], str]) -> str:
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = build()
        return text

    def execute(self, fn: Callable[[Any], T], *, retry_deadlock: bool = True) -> T:
        """``fn(cursor)`` on a pooled connection; a connection found dead is
        dropped and ``fn`` tried once more on a new one, as Store does. A
        statement InnoDB rolled back to break a deadlock is sent again
        (``retry_deadlock``; only where sending it twice is harmless)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                conn = self.engine.raw_connection()
            except (sa.exc.SQLAlchemyError, self._dbapi_error) as exc:
                # The pool's connect raises the driver's own error.
                raise self._error(exc) from exc
            try:
                cur = conn.cursor()
                try:
                    return fn(cur)
                finally:
                    cur.close()
            except self._dbapi_error as exc:
                gone = self.engine.dialect.is_disconnect(
                    exc, conn.dbapi_connection, None)  # type: ignore[arg-type]
                if gone:
                    conn.invalidate(exc)
                deadlock = retry_deadlock and is_deadlock(exc)
                if not (gone or deadlock) or attempt == 3 or (gone and attempt == 2):
                    raise self._error(exc) from exc
            finally:
                conn.close()

    def send(self, cur: Any, sql: str, params: dict[str, Any]) -> Any:
        """One round trip."""
        self._counted()
        cur.execute(sql, params)
        return cur

    # -- claim ----------------------------------------------------------------

    def _set_and_where(self, shape: ClaimShape, token: str) -> tuple[str, str]:
        p, now, locks = self.p, self.now, self.locks
        sets = [f"holder = {p('holder')}", f"lock_until = ({now} + {p('lease')})",
                f"locked_at = {now}", f"token = {token}", f"last_start = {now}",
                "run_requested = NULL"]
        where = [f"({locks}.lock_until IS NULL OR {locks}.lock_until <= {now})",
                 f"({locks}.disabled_until IS NULL OR {locks}.disabled_until <= {now})"]
        if shape.slot:
            sets.append(f"last_slot = {p('slot')}")
            where.append(f"({locks}.last_slot IS NULL OR {locks}.last_slot < {p('slot')})")
            where.append(f"{p('slot')} <= {now} + {p('tol')}")
        if shape.rate:
            where.append(f"({locks}.last_start IS NULL OR "
                         f"{locks}.last_start <= {now} - {p('rate')})")
        if shape.next_due:
            sets.append(f"next_due = {p('next')}")
        elif shape.rate:
            sets.append(f"next_due = {now} + {p('rate')}")
        return ", ".join(sets), " AND ".join(where)

    def _claim_text(self, shape: ClaimShape) -> str:
        p, locks, runs = self.p, self.locks, self.runs
        mysql = self.dialect == "mysql"
        token = f"LAST_INSERT_ID({locks}.token + 1)" if mysql else f"{locks}.token + 1"
        sets, where = self._set_and_where(shape, token)
        update = f"UPDATE {locks} SET {sets} WHERE {locks}.name = {p('name')} AND {where}"
        if not shape.record:
            return update if mysql else update + f" RETURNING {locks}.token"
        columns = "job, item, host, slot, token, attempt, started, finished, result"
        double = "DOUBLE" if mysql else "DOUBLE PRECISION"
        if self.dialect == "postgresql":
            return (f"WITH c AS ({update} RETURNING {locks}.name, {locks}.token, "
                    f"{locks}.locked_at) "
                    f"INSERT INTO {runs} ({columns}) SELECT c.name, NULL, {p('holder')}, "
                    f"CAST({p('run_slot')} AS {double}), c.token, 1, c.locked_at, NULL, "
                    f"{p('running')} FROM c RETURNING {runs}.token, {runs}.id")
        if mysql:
            return (f"{update}; INSERT INTO {runs} ({columns}) SELECT {locks}.name, NULL, "
                    f"{p('holder')}, CAST({p('run_slot')} AS {double}), {locks}.token, 1, "
                    f"{locks}.locked_at, NULL, {p('running')} FROM {locks} "
                    f"WHERE {locks}.name = {p('name')} AND {locks}.token = LAST_INSERT_ID() "
                    f"AND ROW_COUNT() = 1")
        return update + f" RETURNING {locks}.token, {locks}.locked_at"

    def _sqlite_record_text(self) -> str:
        p = self.p
        return (f"INSERT INTO {self.runs} (job, item, host, slot, token, attempt, started, "
                f"finished, result) VALUES ({p('name')}, NULL, {p('holder')}, {p('run_slot')}, "
                f"{p('token')}, 1, {p('started')}, NULL, {p('running')}) RETURNING id")

    def claim(self, shape: ClaimShape, params: dict[str, Any]) -> Claimed | None:
        """The conditional UPDATE of Store.claim (and the run record when
        ``shape.record``). ``params``: name, holder, lease, and slot/tol,
        rate, next as the shape has them; run_slot with ``record``."""
        sql = self._text(("claim", shape), lambda: self._claim_text(shape))
        if shape.record:
            params = {**params, "running": m.RUNNING}
        name = params["name"]

        def go(cur: Any) -> Claimed | None:
            self.send(cur, sql, params)
            if self.dialect == "mysql":
                if cur.rowcount != 1:
                    if shape.record:
                        cur.nextset()
                    return None
                token = int(cur.lastrowid)
                if not shape.record:
                    return Claimed(name, token, None)
                cur.nextset()
                return Claimed(name, token, int(cur.lastrowid))
            row = cur.fetchone()
            if row is None:
                return None
            if self.dialect == "postgresql" or not shape.record:
                return Claimed(name, int(row[0]), int(row[1]) if shape.record else None)
            # SQLite: the run record is a second statement (no round trip).
            token, started = int(row[0]), float(row[1])
            self.send(cur, self._text("sqlite_record", self._sqlite_record_text),
                      {**params, "token": token, "started": started})
            return Claimed(name, token, int(cur.fetchone()[0]))

        # Two statements in one round trip on MySQL: the UPDATE is committed
        # before the INSERT runs, so a deadlocked INSERT is not sent again.
        return self.execute(go, retry_deadlock=not (shape.record and self.dialect == "mysql"))

    # -- while it runs, and its end ---------------------------------------------

    def _mine(self) -> str:
        p, locks = self.p, self.locks
        return (f"{locks}.name = {p('name')} AND {locks}.holder = {p('holder')} "
                f"AND {locks}.token = {p('token')}")

    def renew(self, name: str, holder: str, token: int, lease: float) -> bool:
        sql = self._text("renew", lambda: (
            f"UPDATE {self.locks} SET lock_until = ({self.now} + {self.p('lease')}) "
            f"WHERE {self._mine()}"))
        params = {"name": name, "holder": holder, "token": token, "lease": lease}
        return self.execute(lambda cur: bool(self.send(cur, sql, params).rowcount == 1))

    def _release_text(self) -> str:
        greatest = "max" if self.dialect == "sqlite" else "GREATEST"
        return (f"UPDATE {self.locks} SET lock_until = {greatest}({self.now}, "
                f"{self.locks}.locked_at + {self.p('least')}) WHERE {self._mine()}")

    def release(self, name: str, holder: str, token: int, least: float) -> bool:
        sql = self._text("release", self._release_text)
        params = {"name": name, "holder": holder, "token": token, "least": float(least)}
        return self.execute(lambda cur: bool(self.send(cur, sql, params).rowcount == 1))

    def _finish_text(self) -> str:
        p, now, locks, runs = self.p, self.now, self.locks, self.runs
        result = (f"finished = {now}, exit_code = {p('code')}, result = {p('result')}, "
                  f"output = {p('output')}")
        if self.dialect == "postgresql":
            return (f"WITH r AS (UPDATE {runs} SET {result} WHERE {runs}.id = {p('run_id')} "
                    f"AND EXISTS (SELECT 1 FROM {locks} WHERE {locks}.name = {p('name')} "
                    f"AND {locks}.token = {p('token')}) RETURNING {runs}.id) "
                    f"{self._release_text()} RETURNING (SELECT count(*) FROM r)")
        # MySQL/MariaDB: one multi-table UPDATE (matched rows: 2 when both).
        return (f"UPDATE {runs} r JOIN {locks} l ON l.name = {p('name')} "
                f"AND l.holder = {p('holder')} AND l.token = {p('token')} "
                f"SET r.finished = {now}, r.exit_code = {p('code')}, r.result = {p('result')}, "
                f"r.output = {p('output')}, "
                f"l.lock_until = GREATEST({now}, l.locked_at + {p('least')}) "
                f"WHERE r.id = {p('run_id')}")

    def finish_and_release(self, run_id: int, name: str, holder: str, token: int,
                           result: str, exit_code: int | None, output: str | None,
                           least: float) -> tuple[bool, bool]:
        """Record the run's result and release the lock, both only while the
        token is ours: (result written, released)."""
        if self.dialect == "sqlite":
            return (self.finish_run(run_id, name, token, result, exit_code, output),
                    self.release(name, holder, token, least))
        sql = self._text("finish_release", self._finish_text)
        params = {"run_id": run_id, "name": name, "holder": holder, "token": token,
                  "result": result, "code": exit_code, "output": output, "least": float(least)}

        def go(cur: Any) -> tuple[bool, bool]:
            self.send(cur, sql, params)
            if self.dialect == "postgresql":
                row = cur.fetchone()
                return (row is not None and int(row[0]) == 1, row is not None)
            both = cur.rowcount == 2
            return both, both

        written, released = self.execute(go)
        if not released and self.dialect == "mysql":
            # No run row to join (pruned by hand?): the release alone decides.
            released = self.release(name, holder, token, least)
        return written, released

    def finish_run(self, run_id: int, name: str, token: int | None, result: str,
                   exit_code: int | None, output: str | None) -> bool:
        p, now, locks, runs = self.p, self.now, self.locks, self.runs
        checked = token is not None

        def build() -> str:
            text = (f"UPDATE {runs} SET finished = {now}, exit_code = {p('code')}, "
                    f"result = {p('result')}, output = {p('output')} "
                    f"WHERE {runs}.id = {p('run_id')}")
            if checked:
                text += (f" AND EXISTS (SELECT 1 FROM {locks} WHERE {locks}.name = {p('name')} "
                         f"AND {locks}.token = {p('token')})")
            return text

        sql = self._text(("finish_run", checked), build)
        params = {"run_id": run_id, "name": name, "token": token, "result": result,
                  "code": exit_code, "output": output}
        return self.execute(lambda cur: bool(self.send(cur, sql, params).rowcount == 1))

    # -- many jobs of one slot --------------------------------------------------

    def claim_batch(self, names: Sequence[str], holder: str, lease: float, slot: float,
                    next_due: float, tol: float, limit: int) -> list[Claimed]:
        """Claim up to ``limit`` of ``names`` for one slot, skipping rows another
        host is claiming right now, and record their runs: one statement on
        PostgreSQL, one short transaction on MySQL/MariaDB and SQLite."""
        if not names or limit <= 0:
            return []
        params: dict[str, Any] = {"holder": holder, "lease": lease, "slot": slot,
                                  "next": next_due, "tol": tol, "limit": limit,
                                  "running": m.RUNNING}
        shape = ClaimShape(slot=True, next_due=True)
        if self.dialect == "postgresql":
            sql = self._text("batch", lambda: self._pg_batch_text(shape))
            params["names"] = list(names)

            def go(cur: Any) -> list[Claimed]:
                self.send(cur, sql, params)
                return [Claimed(str(n), int(t), int(i)) for n, t, i in cur.fetchall()]

            return self.execute(go)
        return self._batch_in_transaction(shape, names, params)

    def _pg_batch_text(self, shape: ClaimShape) -> str:
        p, locks, runs = self.p, self.locks, self.runs
        sets, where = self._set_and_where(shape, f"{locks}.token + 1")
        return (
            f"WITH pick AS (SELECT {locks}.name FROM {locks} "
            f"WHERE {locks}.name = ANY({p('names')}) AND {where} "
            f"LIMIT {p('limit')} FOR UPDATE SKIP LOCKED), "
            f"c AS (UPDATE {locks} SET {sets} FROM pick WHERE {locks}.name = pick.name "
            f"AND {where} RETURNING {locks}.name, {locks}.token, {locks}.locked_at) "
            f"INSERT INTO {runs} (job, item, host, slot, token, attempt, started, finished, "
            f"result) SELECT c.name, NULL, {p('holder')}, CAST({p('slot')} AS DOUBLE PRECISION), "
            f"c.token, 1, c.locked_at, NULL, {p('running')} FROM c "
            f"RETURNING {runs}.job, {runs}.token, {runs}.id")

    def _batch_in_transaction(self, shape: ClaimShape, names: Sequence[str],
                              params: dict[str, Any]) -> list[Claimed]:
        p, locks, runs = self.p, self.locks, self.runs
        mysql = self.dialect == "mysql"
        sets, where = self._set_and_where(shape, f"{locks}.token + 1")
        listed = ", ".join(p(f"n{i}") for i in range(len(names)))
        named = {f"n{i}": n for i, n in enumerate(names)}
        lock_rows = " FOR UPDATE SKIP LOCKED" if mysql else ""
        pick = (f"SELECT {locks}.name FROM {locks} WHERE {locks}.name IN ({listed}) "
                f"AND {where} LIMIT {int(params['limit'])}{lock_rows}")

        def go(cur: Any) -> list[Claimed]:
            for attempt in (1, 2, 3):
                try:
                    return once(cur)
                except self._dbapi_error as exc:
                    # InnoDB picks a victim when two batches deadlock: try again.
                    if not is_deadlock(exc) or attempt == 3:
                        raise
            raise AssertionError("unreachable")

        def once(cur: Any) -> list[Claimed]:
            if mysql:
                # Read committed: rows the pick reads but does not take are not
                # left locked (they may be another host's, being renewed or
                # released right now).
                self.send(cur, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED", {})
            self.send(cur, "BEGIN" if mysql else "BEGIN IMMEDIATE", {})
            try:
                picked = [str(r[0]) for r in self.send(cur, pick, {**params, **named}).fetchall()]
                if not picked:
                    self.send(cur, "COMMIT", {})
                    return []
                chosen = ", ".join(p(f"c{i}") for i in range(len(picked)))
                names_of = {f"c{i}": n for i, n in enumerate(picked)}
                both = {**params, **names_of}
                # The pick only shares the work out: the UPDATE is the same
                # conditional write as a single claim, and decides.
                self.send(cur, f"UPDATE {locks} SET {sets} WHERE {locks}.name IN ({chosen}) "
                               f"AND {where}", both)
                ours = (f"{locks}.name IN ({chosen}) AND {locks}.holder = {p('holder')} "
                        f"AND {locks}.last_slot = {p('slot')}")
                self.send(cur, f"INSERT INTO {runs} (job, item, host, slot, token, attempt, "
                               f"started, finished, result) SELECT {locks}.name, NULL, "
                               f"{p('holder')}, {p('slot')}, {locks}.token, 1, "
                               f"{locks}.locked_at, NULL, {p('running')} FROM {locks} "
                               f"WHERE {ours}", both)
                rows = self.send(
                    cur, f"SELECT {runs}.job, {runs}.token, {runs}.id FROM {runs} "
                         f"JOIN {locks} ON {locks}.name = {runs}.job "
                         f"AND {locks}.token = {runs}.token "
                         f"WHERE {ours} AND {runs}.attempt = 1 "
                         f"AND {runs}.finished IS NULL", both).fetchall()
                self.send(cur, "COMMIT", {})
            except BaseException:
                try:
                    cur.execute("ROLLBACK")
                except Exception:  # the connection is gone; the pool drops it
                    pass
                raise
            return [Claimed(str(n), int(t), int(i)) for n, t, i in rows]

        return self.execute(go)
