"""The lock engine: the hot statements of :mod:`~dblockrun.store.queries`
sent through an :mod:`~dblockrun.store.executor`, and their results read the
way each database hands them back.

Every claim, renewal, release and run record of every path (daemon jobs,
batches, run-now, fan-out, ``exec``, :func:`dblockrun.lock`) goes through
here. Round trips: a won run costs two (the claim with its run record, the
result with the release), a lost claim one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Concatenate, NamedTuple, ParamSpec, Protocol, TypeVar

from dblockrun.errors import DatabaseError, SchemaTooNew
from dblockrun.store.drivers import is_kill_refused
from dblockrun.store.executor import Executor, Together
from dblockrun.store.models import (
    CLAIM_TOLERANCE,
    RUNNING,
    BooksRound,
    Claimed,
    ClaimedItem,
    ClockSample,
    HeldGap,
    LostRun,
    Told,
    Trigger,
    bad_token_why,
    token_usable,
)
from dblockrun.store.queries import (
    SCHEMA_VERSION,
    ClaimShape,
    MysqlQueries,
    Queries,
    queries_for,
)

log = logging.getLogger("dblockrun")
T = TypeVar("T")
P = ParamSpec("P")

#: Names per batch statement (SQLite's bound-parameter limit is far above).
BATCH_CHUNK = 500


def too_new(version: object) -> SchemaTooNew:
    return SchemaTooNew(f"the database schema is version {version}, this dblockrun knows up "
                        f"to {SCHEMA_VERSION}: upgrade dblockrun")


@dataclass(frozen=True)
class Claim:
    """What a claim asks for, beyond the lock being free and the job enabled."""

    slot: float | None = None
    rate: float | None = None
    next_due: float | None = None
    tolerance: float = CLAIM_TOLERANCE
    record: bool = False
    requested: bool = False
    check: bool = False  # read the row's token and the schema version too
    wait: bool = False  # a batch: wait for rows other hosts are claiming (ClaimShape.wait)
    #: A passed slot run again (``backfill``, ``rerun``: ClaimShape.again), and
    #: (``undone``) only if no run of it ended ok.
    again: float | None = None
    undone: bool = False

    @property
    def shape(self) -> ClaimShape:
        return ClaimShape(slot=self.slot is not None, rate=self.rate is not None,
                          next_due=self.next_due is not None, record=self.record,
                          requested=self.requested, check=self.check, wait=self.wait,
                          again=self.again is not None, undone=self.undone)

    def params(self, holder: str, lease: float, **more: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"holder": holder, "lease": lease, **more}
        if self.slot is not None:
            params.update(slot=self.slot, tol=self.tolerance)
        if self.rate is not None:
            params.update(rate=self.rate,
                          rate_tol=self.tolerance if self.slot is not None else 0.0)
        if self.next_due is not None:
            params["next"] = self.next_due
        if self.record:
            params["run_slot"] = self.slot
        if self.again is not None:
            params["again"] = self.again
        return params


class _Refused(Exception):
    """A claim's write refused rows its pick had taken: roll it all back."""


def in_transaction(dialect: str, send: Callable[[str], object], steps: Callable[[], T]) -> T:
    """``steps`` in one short transaction, each statement sent with ``send``
    (``BEGIN IMMEDIATE`` on SQLite: its one writer at a time stands in for
    row locks)."""
    if dialect == "mysql":
        # Read committed: rows a pick reads but does not take are not left
        # locked (they may be another host's, renewed right now).
        send("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
    send("BEGIN IMMEDIATE" if dialect == "sqlite" else "BEGIN")
    try:
        result = steps()
        send("COMMIT")
    except BaseException:
        try:
            send("ROLLBACK")
        except Exception:  # the connection is gone; the executor drops it
            pass
        raise
    return result


class _HasEngine(Protocol):
    def lock_engine(self) -> LockEngine: ...


E = TypeVar("E", bound=_HasEngine)


def on_engine(method: Callable[Concatenate[LockEngine, P], T]) -> Callable[Concatenate[E, P], T]:
    """A hot statement of the lock engine as a method of an object that has
    one (the store, its fan-out items)."""

    def call(self: E, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return method(self.lock_engine(), *args, **kwargs)

    call.__name__, call.__doc__ = method.__name__, method.__doc__
    return call


class RunEnd(NamedTuple):
    """A run's result and its lock's release (:meth:`LockEngine.finish_and_release`),
    its values in the order of the statement's columns (``Queries.END_COLUMNS``)."""

    run_id: int
    job: str
    holder: str
    token: int
    result: str
    exit_code: int | None
    output: str | None
    took: float | None
    least: float


class LockEngine:
    """The hot statements of one database and table prefix."""

    def __init__(self, executor: Executor, prefix: str) -> None:
        self.x = executor
        self.dialect = executor.dialect
        self.q: Queries = queries_for(self.dialect, prefix)
        executor.held_by = self.q.held_by
        self._texts: dict[Any, str] = {}
        self._bad_logged: set[str] = set()
        #: The runs' ends (result and release), those at the same moment together.
        self._ends: Together[RunEnd, tuple[bool, bool]] = Together(
            self._finish_and_release_many)

    @property
    def statements(self) -> int:
        return self.x.statements

    def close(self) -> None:
        self.x.close()

    def _text(self, name: str, *args: Any) -> str:
        """The text of ``Queries.name(*args)``, built once."""
        text = self._texts.get((name, args))
        if text is None:
            text = self._texts[(name, args)] = getattr(self.q, name)(*args)
        return text

    def _one_row(self, sql: str, params: dict[str, Any]) -> bool:
        """Send a write of one row: True when it matched."""
        return self.x.run(lambda cur: bool(self.x.send(cur, sql, params).rowcount == 1))

    # -- claims ------------------------------------------------------------------

    def claim(self, name: str, holder: str, lease: float, claim: Claim = Claim(), *,
              ensure: bool = False) -> Claimed | None:
        """One conditional UPDATE (with the run record when ``claim.record``).
        ``ensure`` (exec, the API): also read the row and the schema version
        in the same round trip; create the row if it has none, then claim."""
        if ensure:
            claim = replace(claim, check=True)
        won, known = self._claim(name, holder, lease, claim)
        if won is None and not known and ensure:
            self.ensure_jobs([name])
            won, known = self._claim(name, holder, lease, claim)
        return won

    def _claim(self, name: str, holder: str, lease: float,
               claim: Claim) -> tuple[Claimed | None, bool]:
        shape = claim.shape
        sql, params = self._text("claim", shape), claim.params(holder, lease, name=name)
        read = {"postgresql": self._read_pg, "mysql": self._read_mysql,
                "sqlite": self._read_sqlite}[self.dialect]
        won, found, version = self.x.run(lambda cur: read(cur, sql, params, shape))
        known = found is not None
        if won is None and known and not token_usable(int(found)):
            self.bad_token(name, int(found))
        if version is not None and int(version) != SCHEMA_VERSION:
            if won is not None:
                self.release(name, holder, won.token, 0.0)
            if int(version) > SCHEMA_VERSION:
                raise too_new(version)
            raise DatabaseError(f"the database schema is version {version}, older than "
                                f"{SCHEMA_VERSION}: it needs `dblockrun init-db`", kind="schema")
        return won, known

    # Each reader returns (won, the row's token as found or None, schema version).

    def _read_pg(self, cur: Any, sql: str, params: dict[str, Any],
                 shape: ClaimShape) -> tuple[Claimed | None, Any, Any]:
        row = self.x.send(cur, sql, params).fetchone()
        if not (shape.record or shape.check):  # UPDATE ... RETURNING token
            return (None, 0, None) if row is None else (
                Claimed(params["name"], int(row[0]), None), row[0], None)
        token, run_id, found, version = row
        found = found if shape.check else 0
        if token is None:
            return None, found, version
        return (Claimed(params["name"], int(token), None if run_id is None else int(run_id)),
                token, version)

    def _read_mysql(self, cur: Any, sql: str, params: dict[str, Any],
                    shape: ClaimShape) -> tuple[Claimed | None, Any, Any]:
        self.x.send(cur, sql, params)
        won = cur.rowcount == 1
        token = int(cur.lastrowid) if won else 0
        run_id: int | None = None
        if shape.record:
            try:
                cur.nextset()
                run_id = int(cur.lastrowid) if won else None
            except Exception as exc:
                if not won:
                    raise
                # The UPDATE is committed: the claim is ours without its
                # record. The caller records it (or releases the lock).
                log.warning("job %s: claimed (token %d) but its run record failed: %s",
                            params["name"], token, exc)
                return Claimed(params["name"], token, None), token, None
        found, version = 0, None
        if shape.check:
            cur.nextset()
            found, version = cur.fetchone()
        if shape.cleans:
            cur.nextset()  # the dead run's loss, last (Queries.claim, MySQL)
        if not won:
            return None, found, version
        return Claimed(params["name"], token, run_id), token, version

    def _read_sqlite(self, cur: Any, sql: str, params: dict[str, Any],
                     shape: ClaimShape) -> tuple[Claimed | None, Any, Any]:
        if shape.cleans:
            # The run before, if it died, is recorded lost first (as the
            # servers' claims do in the same round trip).
            self.x.send(cur, self.q.supersede, params)
        row = self.x.send(cur, sql, params).fetchone()
        if row is None:
            if not shape.check:  # embedded, but each statement is counted
                return None, 0, None
            found, version = self.x.send(cur, self.q.known_row, params).fetchone()
            return None, found, version
        token, started, version = int(row[0]), float(row[1]), row[2]
        won = Claimed(params["name"], token, None)
        if not shape.record or (version is not None and int(version) > SCHEMA_VERSION):
            return won, token, version
        try:
            self.x.send(cur, self.q.claim_record, {**params, "token": token, "started": started})
            return Claimed(won.name, token, int(cur.fetchone()[0])), token, version
        except Exception as exc:
            log.warning("job %s: claimed (token %d) but its run record failed: %s",
                        params["name"], token, exc)
            return won, token, version

    def bad_token(self, name: str, token: int) -> None:
        """A token edited below zero or to the BIGINT maximum is never
        claimed (:func:`~dblockrun.store.models.token_usable`): say once per
        job how to repair it, instead of failing every claim in silence."""
        if name not in self._bad_logged:
            self._bad_logged.add(name)
            log.error("job %s: its fencing token is %s (edited by hand?), so it is never "
                      "claimed; repair it with `dblockrun unlock %s`", name, bad_token_why(token),
                      name)

    def claim_batch(self, names: Sequence[str], holder: str, lease: float, claim: Claim,
                    limit: int) -> list[Claimed]:
        """Claim up to ``limit`` of ``names`` (all of one slot) with their run
        records, skipping rows another host is claiming at this moment: one
        statement on PostgreSQL, one short transaction elsewhere."""
        assert claim.slot is not None and claim.record
        won: list[Claimed] = []
        for i in range(0, len(names), BATCH_CHUNK):
            if len(won) >= limit:
                break
            params = claim.params(holder, lease, limit=limit - len(won))
            rows = self.x.run(partial(self._claim_chunk, claim.shape,
                                      names[i:i + BATCH_CHUNK], params))
            won += [Claimed(str(n), int(t), int(i)) for n, t, i in rows]
        return won

    def _claim_chunk(self, shape: ClaimShape, names: Sequence[str], params: dict[str, Any],
                     cur: Any) -> Any:
        """The rows (name, token, run id) won of a chunk of a batch."""
        q, send = self.q, self.x.send
        if self.dialect == "postgresql":
            return send(cur, self._text("batch_claim", shape, 0),
                        {**params, "names": list(names)}).fetchall()

        def steps() -> Any:
            named = {f"n{i}": n for i, n in enumerate(names)}
            picked = [str(r[0]) for r in send(cur, q.batch_pick(shape, len(names)),
                                              {**params, **named}).fetchall()]
            if not picked:
                return []
            chosen = {**params, **{f"c{i}": n for i, n in enumerate(picked)}}
            # The pick only shares the work out: the UPDATE is the same
            # conditional write as a single claim, and decides.
            send(cur, q.batch_update(shape, len(picked)), chosen)
            send(cur, q.batch_record(len(picked)), chosen)
            return send(cur, q.batch_read(len(picked)), chosen).fetchall()

        return in_transaction(self.dialect, lambda sql: send(cur, sql), steps)

    # -- a group's seats ---------------------------------------------------------------

    def claim_seat(self, seats: Sequence[str], holder: str, lease: float,
                   job: str, token: int | None = None) -> tuple[str, int] | None:
        """Take one free seat of ``seats`` (a group's seat rows, or the lanes
        of an ``overlap: allow N`` job) for ``job``, with the lease and
        fencing of a job's lock: one statement (one round trip). (seat,
        token), or None when every seat is held. ``token``: a lane's, the
        job's claim's (else the seat's own next one)."""
        sql = self._text("seat_claim", len(seats), token is not None)
        params: dict[str, Any] = {"holder": holder, "lease": lease, "job": job, "limit": 1,
                                  "token": token}
        if self.q.arrays:
            params["names"] = list(seats)
        else:
            params.update({f"n{i}": name for i, name in enumerate(seats)})

        def go(cur: Any) -> tuple[str, int] | None:
            self.x.send(cur, sql, params)
            if self.dialect == "mysql":
                won, token = cur.rowcount == 1, int(cur.lastrowid or 0)
                cur.nextset()
                row = cur.fetchone()
                return (str(row[0]), token) if won and row is not None else None
            row = cur.fetchone()
            return None if row is None else (str(row[0]), int(row[1]))

        return self.x.run(go)

    # -- fan-out items ----------------------------------------------------------------

    def claim_items(self, job: str, holder: str, lease: float, claim: Claim,
                    limit: int) -> list[ClaimedItem]:
        """Claim up to ``limit`` of a job's due items, oldest start first,
        skipping the rows other hosts are claiming right now."""
        shape, params = claim.shape, claim.params(holder, lease, job=job)
        q, send = self.q, self.x.send

        def keyed(keys: list[str], **more: Any) -> dict[str, Any]:
            return {**params, **more, **{f"k{i}": k for i, k in enumerate(keys)}}

        def steps(cur: Any) -> list[ClaimedItem]:
            if self.dialect == "mysql":
                # InnoDB locks every row a sorted locking read looks at, so
                # one host's pick would hide all items from the others: read
                # the candidates unlocked, then lock only those by key.
                keys = [str(r[0]) for r in send(cur, q.items_pick(shape, lock=False),
                                                 keyed([], limit=limit * 4 + 16)).fetchall()]
                if keys:
                    locked = {str(r[0]) for r in send(cur, q.items_lock(shape, len(keys)),
                                                      keyed(keys, limit=limit)).fetchall()}
                    keys = [k for k in keys if k in locked]
            else:
                keys = [str(r[0]) for r in send(cur, q.items_pick(shape),
                                                 keyed([], limit=limit)).fetchall()]
            if not keys:
                return []
            named = keyed(keys, run_slot=claim.slot)
            if send(cur, q.items_claim(shape, len(keys)), named).rowcount != len(keys):
                # Refused after the pick: the fleet paused or the job disabled
                # since (conditions on other rows than the picked ones, which
                # stay locked). Records and the read below would be of the
                # items' previous claims: none is written, none handed out.
                raise _Refused
            send(cur, q.items_record(len(keys)), named)
            rows = send(cur, q.items_claimed(len(keys)), named).fetchall()
            order = {k: i for i, k in enumerate(keys)}
            claimed = [ClaimedItem(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows]
            return sorted(claimed, key=lambda c: order[c.key])

        def go(cur: Any) -> list[ClaimedItem]:
            try:
                return in_transaction(self.dialect, lambda sql: send(cur, sql),
                                      lambda: steps(cur))
            except _Refused:  # rolled back
                return []

        return self.x.run(go)

    def _items_params(self, job: str, holder: str, items: Sequence[ClaimedItem],
                      **more: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"job": job, "holder": holder, **more}
        for i, c in enumerate(items):
            params[f"k{i}"], params[f"t{i}"], params[f"r{i}"] = c.key, c.token, c.run_id
        return params

    def renew_items(self, job: str, holder: str, items: Sequence[ClaimedItem],
                    lease: float) -> bool | str:
        """Extend a batch's leases; False if any token is no longer current,
        else True, or the kill request of one of its items (who and why)."""
        sql = self._text("items_renew", len(items))
        params = self._items_params(job, holder, items, lease=lease)

        def go(cur: Any) -> bool | str:
            self.x.send(cur, sql, params)
            if self.dialect == "mysql":
                cur.nextset()
            rows = cur.fetchall()
            if len(rows) != len(items):
                return False
            return next((str(kill) for _key, kill in rows if kill is not None), True)

        return self.x.run(go)

    def finish_items(self, job: str, holder: str, items: Sequence[ClaimedItem], result: str,
                     exit_code: int | None, output: str | None,
                     took: float | None = None) -> bool:
        """An attempt's result for the batch's runs (``run_id`` of each), only
        while every token is ours; the items stay held (a retry follows).
        ``took``: the command's duration (as :meth:`finish_run`)."""
        params = self._items_params(job, holder, items, result=result, code=exit_code,
                                    output=output, took=took)
        return self.x.run(lambda cur: int(self.x.send(
            cur, self.q.items_finish(len(items)), params).rowcount) == len(items))

    def release_items(self, job: str, holder: str, items: Sequence[ClaimedItem], result: str,
                      lock_at_least: float) -> bool:
        """Free the batch's items (those still ours), ``result`` their last."""
        params = self._items_params(job, holder, items, result=result,
                                    least=float(lock_at_least))
        return self.x.run(lambda cur: int(self.x.send(
            cur, self.q.items_release(len(items)), params).rowcount) == len(items))

    def finish_and_release_items(self, job: str, holder: str, items: Sequence[ClaimedItem],
                                 result: str, exit_code: int | None, output: str | None,
                                 lock_at_least: float,
                                 took: float | None = None) -> tuple[bool, bool]:
        """The batch's result (only while every token is ours) and the release
        of its items, in one round trip: (result written, released)."""
        n, q, send = len(items), self.q, self.x.send
        params = self._items_params(job, holder, items, result=result, code=exit_code,
                                    output=output, least=float(lock_at_least), took=took)

        def go(cur: Any) -> tuple[bool, bool]:
            if self.dialect == "sqlite":  # embedded: two statements
                written = send(cur, q.items_finish(n), params).rowcount
                released = send(cur, q.items_release(n), params).rowcount
            elif self.dialect == "mysql":
                written = send(cur, q.items_finish_and_release(n), params).rowcount
                cur.nextset()
                released = cur.rowcount
            else:
                written, released = send(cur, q.items_finish_and_release(n), params).fetchone()
            return int(written) == n, int(released) == n

        return self.x.run(go)

    # -- while it runs, and its end ------------------------------------------------

    def renew(self, name: str, holder: str, token: int, lease: float) -> bool:
        """Extend the lease; False when the token is no longer ours."""
        return name in self.renew_many(holder, [(name, token)], lease)

    def renew_many(self, holder: str, held: Sequence[tuple[str, int]], lease: float,
                   outputs: Sequence[tuple[int, str]] = ()) -> dict[str, str | None]:
        """Extend all of ``holder``'s leases ``held`` ((name, token) pairs) in
        one statement; returns the names renewed (the others are lost), each
        with its kill request (who and why; None: none). ``outputs``: (run
        id, output tail) of its running runs whose output grew, written in
        the same statement (SQLite, embedded: one more) where the run is
        still ``running``."""
        if not held:
            return {}
        sql = self._text("renew_many", len(held), len(outputs))
        params: dict[str, Any] = {"holder": holder, "lease": lease}
        for i, (name, token) in enumerate(held):
            params[f"n{i}"], params[f"t{i}"] = name, token
        live: dict[str, Any] = {}
        for i, (run_id, text) in enumerate(outputs):
            live[f"r{i}"], live[f"o{i}"] = run_id, text

        def go(cur: Any) -> dict[str, str | None]:
            if outputs and self.dialect == "sqlite":
                self.x.send(cur, self._text("live_outputs", len(outputs)), live)
            self.x.send(cur, sql, params if self.dialect == "sqlite" else {**params, **live})
            if self.dialect == "mysql":
                cur.nextset()
                if outputs:
                    cur.nextset()
            return {str(name): None if kill is None else str(kill)
                    for name, kill in cur.fetchall()}

        return self.x.run(go)

    def write_outputs(self, outputs: Sequence[tuple[int, str]]) -> None:
        """The live output tails of running runs ((run id, text) pairs) in
        one statement, without a renewal (a fan-out batch's: its items are
        renewed apart)."""
        if not outputs:
            return
        params: dict[str, Any] = {}
        for i, (run_id, text) in enumerate(outputs):
            params[f"r{i}"], params[f"o{i}"] = run_id, text
        sql = self._text("live_outputs", len(outputs))
        self.x.run(lambda cur: self.x.send(cur, sql, params))

    def set_next_due(self, names_due: dict[str, float]) -> None:
        """Each named job's next slot, for `status`: one statement per
        ``BATCH_CHUNK`` jobs (a daemon's start-up with 10,000 jobs sent one
        per job)."""
        rows = list(names_due.items())

        def go(cur: Any) -> None:
            for i in range(0, len(rows), BATCH_CHUNK):
                chunk = rows[i:i + BATCH_CHUNK]
                params: dict[str, Any] = {}
                for j, (name, due) in enumerate(chunk):
                    params[f"n{j}"], params[f"d{j}"] = name, due
                self.x.send(cur, self._text("next_due_many", len(chunk)), params)

        if rows:
            self.x.run(go)

    def release(self, name: str, holder: str, token: int, lock_at_least: float = 0.0) -> bool:
        """Free the lock, not before ``locked_at + lock_at_least``."""
        params = {"name": name, "holder": holder, "token": token, "least": float(lock_at_least)}
        return self._one_row(self.q.release, params)

    def start_run(self, job: str, host: str, *, token: int | None, slot: float | None = None,
                  attempt: int = 1, item: str | None = None, result: str = RUNNING,
                  output: str | None = None, origin: tuple[str, int | None] | None = None
                  ) -> int:
        """A run's record; ``origin``: a passed slot run again (``backfill``
        or ``rerun``, and the run it runs again), written in the same
        transaction."""
        sql = self._text("start_run", result == RUNNING)
        params = {"job": job, "item": item, "host": host, "slot": slot, "token": token,
                  "attempt": attempt, "result": result, "output": output}

        def go(cur: Any) -> int:
            self.x.send(cur, sql, params)
            return int(cur.lastrowid if self.dialect == "mysql" else cur.fetchone()[0])

        if origin is None:
            return self.x.run(go)

        def marked(cur: Any) -> int:
            def steps() -> int:
                run_id = go(cur)
                self.x.send(cur, self.q.run_origin, {"run_id": run_id, "origin": origin[0],
                                                     "origin_run": origin[1]})
                return run_id

            return in_transaction(self.dialect, lambda text: self.x.send(cur, text), steps)

        return self.x.run(marked)

    def supersede(self, name: str, holder: str) -> int:
        """Record lost the dead runs of the job ``name`` (their lease ran
        out or was taken over), as ``exec``'s claim does first: a slot run
        again is not held back by a run whose holder died. The number."""
        params = {"name": name, "holder": holder}
        return self.x.run(lambda cur: max(0, int(self.x.send(
            cur, self.q.supersede, params).rowcount)))

    def finish_run(self, run_id: int, job: str, token: int | None, result: str,
                   exit_code: int | None, output: str | None, took: float | None = None) -> bool:
        """Record a run's end, only while the job's token is still ``token``;
        ``took``: its command's duration (the run then ended that long after
        its start; None: it ends now)."""
        sql = self._text("finish_run", token is not None)
        params = {"run_id": run_id, "name": job, "token": token, "result": result,
                  "code": exit_code, "output": output, "took": took}
        return self._one_row(sql, params)

    def finish_and_release(self, run_id: int, job: str, holder: str, token: int, result: str,
                           exit_code: int | None, output: str | None,
                           lock_at_least: float = 0.0,
                           seat: tuple[str, int] | None = None,
                           took: float | None = None) -> tuple[bool, bool]:
        """:meth:`finish_run` and :meth:`release` in one round trip:
        (result written, released); ``seat``: also free the group seat the
        run held (dblockrun/scheduling/limits.py), in the same round trip.
        The ends of runs on other threads at the same moment go in the same
        statement (:class:`~dblockrun.store.executor.Together`): a burst's
        runs end together."""
        if self.dialect == "sqlite":  # embedded: two statements, no round trip
            done = (self.finish_run(run_id, job, token, result, exit_code, output, took),
                    self.release(job, holder, token, lock_at_least))
            if seat is not None:
                self.release_seat(seat, holder)
            return done
        end = RunEnd(run_id, job, holder, token, result, exit_code, output, took,
                     float(lock_at_least))
        if seat is not None:
            return self._finish_release_seat(end, seat)
        return self._ends(end)

    def _finish_and_release_many(self, ends: Sequence[RunEnd]) -> list[tuple[bool, bool]]:
        """The results and releases of ``ends``: one statement."""
        sql, params = self._text("finish_and_release", len(ends)), self.q.end_params(ends)
        if self.dialect == "postgresql":
            rows = self.x.run(lambda cur: self.x.send(cur, sql, params).fetchall())
            done = {int(run_id): (bool(written), bool(released))
                    for run_id, written, released in rows}
            return [done.get(end.run_id, (False, False)) for end in ends]
        matched = self.x.run(lambda cur: int(self.x.send(cur, sql, params).rowcount))
        if matched == 2 * len(ends):
            return [(True, True)] * len(ends)
        if len(ends) > 1:
            # Not all written (a token moved on): each again alone, to know
            # which (writing again what was written changes nothing).
            return [self._finish_and_release_many([end])[0] for end in ends]
        # No run row to join (pruned by hand?): the release alone decides.
        end = ends[0]
        return [(False, self.release(end.job, end.holder, end.token, end.least))]

    def _finish_release_seat(self, end: RunEnd,
                             seat: tuple[str, int]) -> tuple[bool, bool]:
        params: dict[str, Any] = {"holder": end.holder, "seat": seat[0], "seat_token": seat[1]}
        if self.dialect == "postgresql":  # finish_run's and release's own parameters
            params.update(run_id=end.run_id, name=end.job, token=end.token, result=end.result,
                          code=end.exit_code, output=end.output, least=end.least, took=end.took)
        else:  # one run's ends()
            params.update(self.q.end_params([end]))

        def go(cur: Any) -> tuple[bool, bool]:
            self.x.send(cur, self.q.finish_release_seat, params)
            if self.dialect == "postgresql":
                written, released = cur.fetchone()
                return int(written) == 1, int(released) == 1
            both = cur.rowcount == 2
            cur.nextset()  # past the seat's release
            return both, both

        written, released = self.x.run(go)
        if not released and self.dialect == "mysql":
            # No run row to join (pruned by hand?): the release alone decides.
            released = self.release(end.job, end.holder, end.token, end.least)
        return written, released

    def run_waits(self, run_id: int, output: str) -> bool:
        """The run's slot waits for ``output`` (a seat, room on the host)."""
        return self._one_row(self.q.run_waits, {"run_id": run_id, "output": output})

    def run_admitted(self, run_id: int) -> bool:
        """The waiting run's command starts: ``running`` from now."""
        return self._one_row(self.q.run_admitted, {"run_id": run_id})

    def release_seat(self, seat: tuple[str, int], holder: str) -> bool:
        """Free a group seat (its row, the token it was taken with)."""
        params = {"seat": seat[0], "seat_token": seat[1], "holder": holder}
        return self._one_row(self.q.seat_release, params)

    # -- job chains (after:, dblockrun/daemon/chains.py) --------------------------------

    def make_triggers(self, down: str, upstream: Sequence[str], results: Sequence[str], *,
                      since: float | None = None, ids: Sequence[int] = ()) -> int:
        """Make the triggers of ``down`` for the finished runs of
        ``upstream`` whose result is in ``results``: those that ended since
        ``since`` and are over, or the runs ``ids`` (their host just ended
        them). One statement; the number made."""
        sql = self._text("make_triggers", len(upstream), len(results), len(ids))
        params: dict[str, Any] = {"down": down, "since": since}
        params.update({f"u{i}": name for i, name in enumerate(upstream)})
        params.update({f"r{i}": result for i, result in enumerate(results)})
        params.update({f"i{i}": run_id for i, run_id in enumerate(ids)})
        return self.x.run(lambda cur: max(0, int(self.x.send(cur, sql, params).rowcount)))

    def pending_triggers(self, jobs: Sequence[str]) -> list[Trigger]:
        """The triggers of ``jobs`` not taken yet, oldest first (one statement)."""
        if not jobs:
            return []
        sql = self._text("pending_triggers", len(jobs))
        params = {f"j{i}": name for i, name in enumerate(jobs)}
        rows = self.x.run(lambda cur: self.x.send(cur, sql, params).fetchall())
        return [Trigger(str(job), int(run), str(up), str(result), float(ended))
                for job, run, up, result, ended in rows]

    def chained_before(self, job: str) -> bool:
        """Whether ``job`` has a trigger already: its ``after:`` is not new."""
        return self.x.run(lambda cur: self.x.send(cur, self.q.chained_before,
                                                  {"name": job}).fetchone() is not None)

    def claim_trigger(self, trigger: Trigger, holder: str, lease: float) -> Claimed | None:
        """Claim the job ``trigger.job`` for its trigger: the trigger taken
        and the job's one claim (the slot's conditions but the slot, with
        the first attempt's record, which names the upstream run), in one
        transaction; None (nothing written) if another host took the
        trigger or the claim lost (held, disabled, paused)."""
        claim = Claim(record=True)
        shape = claim.shape
        sql = self._text("claim", shape)
        params = claim.params(holder, lease, name=trigger.job, run_slot=None)
        keyed = {"name": trigger.job, "upstream_run": trigger.upstream_run,
                 "upstream_job": trigger.upstream_job}
        read = {"postgresql": self._read_pg, "mysql": self._read_mysql,
                "sqlite": self._read_sqlite}[self.dialect]

        def go(cur: Any) -> Claimed | None:
            send = self.x.send

            def steps() -> Claimed:
                if send(cur, self.q.take_trigger, keyed).rowcount != 1:
                    raise _Refused  # another host's, or taken already
                won, _found, _version = read(cur, sql, params, shape)
                if won is None or won.run_id is None:
                    raise _Refused  # the claim lost: the trigger stays for a later try
                send(cur, self.q.run_upstream, {**keyed, "run_id": won.run_id})
                return won

            try:
                return in_transaction(self.dialect, lambda text: send(cur, text), steps)
            except _Refused:  # rolled back
                return None

        return self.x.run(go)

    def record_trigger(self, trigger: Trigger, host: str, result: str,
                       output: str) -> int | None:
        """Record why ``trigger`` starts no run (``skipped``: its job is
        disabled ...): the trigger taken and its record, in one
        transaction; the record's id, None if another host took it first."""
        keyed = {"name": trigger.job, "upstream_run": trigger.upstream_run,
                 "upstream_job": trigger.upstream_job}
        record = {"job": trigger.job, "item": None, "host": host, "slot": None,
                  "token": None, "attempt": 1, "result": result, "output": output}

        def go(cur: Any) -> int | None:
            send = self.x.send

            def steps() -> int:
                if send(cur, self.q.take_trigger, keyed).rowcount != 1:
                    raise _Refused
                send(cur, self._text("start_run", False), record)
                run_id = int(cur.lastrowid if self.dialect == "mysql" else cur.fetchone()[0])
                send(cur, self.q.run_upstream, {**keyed, "run_id": run_id})
                return run_id

            try:
                return in_transaction(self.dialect, lambda text: send(cur, text), steps)
            except _Refused:
                return None

        return self.x.run(go)

    def prune_triggers(self, before: float) -> int:
        """Forget the taken triggers of upstream runs that ended before ``before``."""
        return self.x.run(lambda cur: max(0, int(self.x.send(
            cur, self.q.prune_triggers, {"before": before}).rowcount)))

    # -- bookkeeping ---------------------------------------------------------------

    def ensure_jobs(self, names: Iterable[str]) -> None:
        """Give each name its lock row (free, token 0) if it has none."""
        rows = [{"name": n} for n in dict.fromkeys(names)]
        if not rows:
            return

        def go(cur: Any) -> None:
            for row in rows:
                self.x.send(cur, self.q.ensure_job, row)

        self.x.run(go)

    def record_slots(self, name: str, host: str, result: str,
                     rows: Sequence[tuple[float, str, float | None]], *, first: float | None,
                     gap_of: int | None = None, next_due: float | None = None,
                     results: Sequence[str] | None = None) -> bool:
        """Record slots that ran nowhere (``rows``: slot, output, and for a
        summary record the first slot it stands for): with
        ``first``, only while the job's last slot is still before it,
        advancing it to the newest of ``rows`` (True for the one host that
        did); with ``gap_of``, only while the claim with that token is the
        row's last and its held gap unseen (:meth:`held_gaps`: the slots a
        claim moved on over); with neither, unconditionally (a dead
        holder's blocked slots, whose loss this host alone recorded). Two
        statements at most, whatever the number of rows, in one transaction.
        ``next_due``: with ``first``, the job's next slot after them, which
        ``status`` shows (it would show the passed one until the next claim).
        ``results``: each row's result, when they differ (a calendar's
        slots are ``skipped`` among ``missed`` ones); else ``result``."""
        insert = self._text("passed_runs", len(rows))
        params: dict[str, Any] = {"job": name, "host": host}
        for i, (slot, text, covers_from) in enumerate(rows):
            params[f"slot{i}"], params[f"out{i}"], params[f"from{i}"] = slot, text, covers_from
            params[f"result{i}"] = result if results is None else results[i]
        advance = {"name": name, "first": first, "slot": max(slot for slot, _, _ in rows),
                   "next": next_due}

        def go(cur: Any) -> bool:
            def steps() -> bool:
                if first is not None and self.x.send(cur, self.q.pass_slots,
                                                     advance).rowcount != 1:
                    return False
                if gap_of is not None and self.x.send(cur, self.q.held_gap_seen, {
                        "name": name, "token": gap_of}).rowcount != 1:
                    return False
                self.x.send(cur, insert, params)
                return True

            # One transaction: the advance (or the gap's mark) never commits
            # without the records, which a connection lost between the two
            # would leave unwritten while every host reads them as written.
            return in_transaction(self.dialect, lambda sql: self.x.send(cur, sql), steps)

        return self.x.run(go)

    def held_gaps(self) -> list[HeldGap]:
        """The slot claims that moved a job on over a lock held past its slot
        before, not looked at yet (one statement; rows only after such a claim)."""
        return [HeldGap(str(name), int(token), float(after), float(until), float(last))
                for name, token, after, until, last in self.x.run(
                    lambda cur: self.x.send(cur, self.q.held_gaps).fetchall())]

    def held_gaps_seen(self, gaps: Sequence[HeldGap]) -> None:
        """Mark ``gaps`` looked at (they held no slot to record)."""

        def go(cur: Any) -> None:
            for gap in gaps:
                self.x.send(cur, self.q.held_gap_seen, {"name": gap.name, "token": gap.token})

        self.x.run(go)

    def sweep_lost(self, recorder: str = "?") -> list[LostRun]:
        """Record as ``lost`` the runs whose lease ran out or was taken over,
        each ending at its lease's last renewal, its output saying so and
        that ``recorder`` (a daemon's id) recorded it; returns them. One
        statement when there are none (every heartbeat of every daemon)."""

        return self.x.run(lambda cur: self._mark_lost(
            cur, self.x.send(cur, self.q.lost_runs).fetchall(), recorder))

    def _mark_lost(self, cur: Any, found: Sequence[Sequence[Any]],
                   recorder: str) -> list[LostRun]:
        """Record the dead runs ``found`` (rows of ``lost_runs``) lost: those
        this host recorded (not another host at the same moment)."""
        lost: list[LostRun] = []
        for run_id, job, item, host, token, lock_until, ended, slot, first_id in found:
            params = {"id": int(run_id), "ended": float(ended), "recorder": recorder}
            if self.x.send(cur, self.q.mark_lost, params).rowcount == 1:
                lost.append(LostRun(int(run_id), str(job), item, str(host), int(token),
                                    None if lock_until is None else float(lock_until),
                                    float(ended), None if slot is None else float(slot),
                                    int(first_id if first_id is not None else run_id)))
        return lost

    def books_round(self, host_id: str, *, hostname: str, pid: int, version: str,
                    clock_offset: float | None, running: int, jobs: str | None,
                    within: float, labels: str | None = None,
                    targets: str | None = None, heartbeat: float | None = None,
                    audit_after: int = 0, fields: str | None = None) -> BooksRound:
        """A daemon's bookkeeping round (``q.books_in_one_trip``): one round
        trip when no run died (then one more per dead run)."""
        params = {"id": host_id, "hostname": hostname, "pid": pid, "version": version,
                  "offset": clock_offset, "running": running, "jobs": jobs, "within": within,
                  "labels": labels, "targets": targets, "heartbeat": heartbeat,
                  "audit_after": audit_after, "fields": fields}

        def go(cur: Any) -> BooksRound:
            wall0, mono0 = time.time(), time.monotonic()
            if self.q.one_round:
                db, live, serving, differing, requested, dead, told = self.x.send(
                    cur, self.q.books_round, params).fetchone()
            else:  # MySQL: one result a statement
                db, live, serving = self.x.send(cur, self.q.books_round, params).fetchone()
                differing, requested, dead, told = (_next_rows(cur) for _ in range(4))
                cur.nextset()  # the host row's write
                requested = [row[0] for row in requested]
            wall1, mono1 = time.time(), time.monotonic()
            db = float(db)
            sample = ClockSample(db_now=db, offset=db - (wall0 + wall1) / 2,
                                 mono_offset=db - (mono0 + mono1) / 2, rtt=mono1 - mono0)
            return BooksRound(sample, int(live), int(serving),
                              [(str(h), None if j is None else str(j)) for h, j in differing or []],
                              [str(n) for n in requested or []],
                              self._mark_lost(cur, dead or [], host_id),
                              [Told(int(t[0]), *t[1:]) for t in told or []])

        return self.x.run(go)

    def request_run(self, name: str) -> None:
        """File a run-now request (and announce it, on PostgreSQL)."""
        params = {"name": name, "channel": self.q.channel}
        self.x.run(lambda cur: self.x.send(cur, self.q.request_run, params))

    def ring(self) -> int:
        """MySQL/MariaDB: wake the daemons waiting for requests on this
        server (dblockrun/store/doorbell.py): ``KILL QUERY`` of each wait
        this user may end. How many were woken. One statement, then one a
        daemon; a wait this user may not end is passed over (its daemon
        reads the request with its next wait's end or bookkeeping round)."""
        q = self.mysql_q
        mark = {"mark": "%" + q.wait_mark.replace("_", "\\_")}

        def go(cur: Any) -> int:
            waits = self.x.send(cur, q.waiting, mark).fetchall()
            return sum(self._wake(cur, int(conn_id)) for (conn_id,) in waits)

        return self.x.run(go)

    @property
    def mysql_q(self) -> MysqlQueries:
        """The statements, MySQL's (the request doorbell's are MySQL's only)."""
        assert isinstance(self.q, MysqlQueries)
        return self.q

    def wake(self, conn_id: int) -> bool:
        """End the request wait on connection ``conn_id`` (a daemon's own, at
        its stop); whether it was there to end."""
        return self.x.run(lambda cur: self._wake(cur, conn_id))

    def _wake(self, cur: Any, conn_id: int) -> bool:
        try:
            self.x.send(cur, self.mysql_q.wake, {"id": conn_id})
            return True
        except Exception as exc:
            if not is_kill_refused(exc):
                raise
            return False

    def prune_runs(self, job: str, keep: int) -> int:
        """Delete all but the newest ``keep`` runs of ``job``."""

        def go(cur: Any) -> int:
            row = self.x.send(cur, self.q.prune_cutoff, {"job": job, "keep": keep}).fetchone()
            if row is None:
                return 0
            params = {"job": job, "cutoff": int(row[0])}
            return int(self.x.send(cur, self.q.prune, params).rowcount)

        return self.x.run(go)

    def db_now(self) -> float:
        return self.x.run(lambda cur: float(self.x.send(cur, self.q.clock).fetchone()[0]))


def _next_rows(cur: Any) -> list[Any]:
    """The rows of the next statement's result (MySQL, a query of several)."""
    cur.nextset()
    return list(cur.fetchall())
