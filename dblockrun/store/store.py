"""The lock store: the schema, the cold statements (SQLAlchemy Core: flags,
hosts, history) and the lock engine's hot ones (store/engine.py), on one
pooled engine. Every statement runs in autocommit and takes the time from
the database clock (:meth:`Dialect.now`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dblockrun.durations import FOREVER as FOREVER
from dblockrun.errors import DatabaseError
from dblockrun.jobs import EVERY_HOST_SEP
from dblockrun.redact import url as redact
from dblockrun.store import models as m
from dblockrun.store.cold import Dialect
from dblockrun.store.control import Audit, ControlStore
from dblockrun.store.dburl import dialect_of, driver_url, mysql_nodes, prepare_sqlite_file
from dblockrun.store.drain import DrainStore
from dblockrun.store.drivers import (
    DEFAULT_LOCK_WAIT,
    Driver,
    db_error,
    sqlite_setup,
    url_pooler,
)
from dblockrun.store.engine import Claim, LockEngine, on_engine, too_new
from dblockrun.store.executor import PooledExecutor
from dblockrun.store.items import ItemStore
from dblockrun.store.migrate import migrate
from dblockrun.store.models import CLAIM_TOLERANCE, BooksRound, Claimed
from dblockrun.store.schema import SCHEMA_VERSION, Name, Tables, build_tables
from dblockrun.store.sessions import SessionStore

if TYPE_CHECKING:
    from dblockrun.store.alerts import AlertStore
    from dblockrun.store.status import PassedSince, StatusReport

T = TypeVar("T")
log = logging.getLogger("dblockrun")

DEFAULT_PREFIX = "dblockrun_"
#: The ``meta`` row of the fleet's secret (:meth:`Store.fleet_key`).
FLEET_KEY = "fleet_key"


def new_fleet_key() -> str:
    """32 random bytes, as hex (the ``meta`` table holds text)."""
    import secrets

    return secrets.token_hex(32)


class Store:
    """The lock store on one database. Thread-safe (one pooled engine)."""

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX, *, create: bool = True,
                 lock_wait: float = DEFAULT_LOCK_WAIT) -> None:
        """``lock_wait``: how long a statement waits for a row another
        session holds (store/drivers.py ``lock_wait_for`` of the lease)."""
        self.url = url
        self.prefix = prefix
        self.dialect = Dialect(dialect_of(url))
        #: The pool mode of a connection pooler in front of the database
        #: (``?pooler=``: store/drivers.py ``POOLERS``), or None.
        self.pooler = url_pooler(url)
        if self.dialect.name == "sqlite":
            prepare_sqlite_file(url)
        self.engine: Engine = sa.create_engine(
            driver_url(url),
            isolation_level="AUTOCOMMIT",
            # Autocommit: nothing to roll back when a connection returns to the pool.
            pool_reset_on_return=None,
            **self.dialect.engine_options(self.pooler, lock_wait),
        )
        if self.dialect.name == "sqlite":
            sa.event.listen(self.engine, "connect", lambda conn, _record: sqlite_setup(conn))
        nodes = mysql_nodes(url)
        if nodes is not None:
            from dblockrun.store.mysqlhosts import connect_in_order

            connect_in_order(self.engine, nodes)
        self.t: Tables = build_tables(prefix)
        #: Raw driver connections from the pool, under the one retry policy.
        self.x = PooledExecutor(Driver(self.dialect.name), self.engine)
        sa.event.listen(self.engine, "before_cursor_execute", lambda *_args: self.x.count())
        #: The hot statements (claims, leases, runs): store/engine.py.
        self.lock = LockEngine(self.x, prefix)
        self._schema_checked = False
        self._schema_lock = threading.Lock()
        self._create = create
        self._items: ItemStore | None = None
        self._control: ControlStore | None = None
        self._drains: DrainStore | None = None
        self._sessions: SessionStore | None = None
        self._alerts: Any = None
        self._fleet_key: bytes | None = None

    # -- plumbing ---------------------------------------------------------

    @property
    def statements(self) -> int:
        """Statements sent so far (round trips)."""
        return self.x.statements

    def __repr__(self) -> str:
        return f"Store({redact(self.url)!r}, prefix={self.prefix!r})"

    def close(self) -> None:
        self.engine.dispose()

    def trim_pool(self) -> bool:
        """Close the pool's idle connections when it holds more than one and
        none is in use: a burst's extra connections (up to the pool's 5, and
        10 more while it lasts) are not kept for good, so a quiet daemon holds
        one server connection for its statements. The next statement opens
        one again (SQLAlchemy's public ``Engine.dispose``). Whether it did.
        A connection another thread takes between the check and the
        dispose (a window of microseconds) still serves it; it then goes
        back to the old pool and is closed when the garbage collector frees
        that pool."""
        pool = self.engine.pool
        if not isinstance(pool, sa.pool.QueuePool):
            return False
        if pool.checkedout() or pool.checkedin() <= 1:
            return False
        self.engine.dispose()
        return True

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _check_schema(self) -> None:
        """Once per store: create the schema, or check its version."""
        if not self._schema_checked:
            with self._schema_lock:
                if not self._schema_checked:
                    self.ensure_schema(create=self._create)
                    self._schema_checked = True

    @contextmanager
    def _conn(self) -> Iterator[Connection]:
        self._check_schema()
        try:
            with self.engine.connect() as conn:
                yield conn
        except sa.exc.SQLAlchemyError as exc:
            raise db_error(exc) from exc

    def _run(self, fn: Callable[[Connection], T]) -> T:
        """A cold statement (SQLAlchemy Core) under the executor's retry policy:
        no ping before each statement (it would double the round trips)."""
        self._check_schema()
        return self.x.run_core(fn)

    @property
    def now(self) -> sa.ColumnElement[float]:
        return self.dialect.now()

    @property
    def items(self) -> ItemStore:
        """Fan-out items of jobs (their own module: store/items.py)."""
        if self._items is None:
            self._items = ItemStore(self)
        return self._items

    @property
    def control(self) -> ControlStore:
        """Kill requests, the fleet-wide pause, the audit trail (store/control.py)."""
        if self._control is None:
            self._control = ControlStore(self)
        return self._control

    @property
    def drains(self) -> DrainStore:
        """Drained hosts (store/drain.py)."""
        if self._drains is None:
            self._drains = DrainStore(self, self.control)
        return self._drains

    @property
    def sessions(self) -> SessionStore:
        """``dblockrun web``'s signed-in sessions (store/sessions.py)."""
        if self._sessions is None:
            self._sessions = SessionStore(self)
        return self._sessions

    @property
    def alerts(self) -> AlertStore:
        """The alerts ledger: ``expect:`` alerts and storms (store/alerts.py,
        imported here: a daemon without ``expect:`` or a storm needs none)."""
        if self._alerts is None:
            from dblockrun.store.alerts import AlertStore

            self._alerts = AlertStore(self)
        alerts: AlertStore = self._alerts
        return alerts

    # -- schema -------------------------------------------------------------

    def schema_version(self) -> int | None:
        """The schema's version (None: no tables); the fleet's key, read by
        the same statement, is kept for :meth:`fleet_key`."""
        meta = self.t.meta
        try:
            with self.engine.connect() as conn:
                if not sa.inspect(conn).has_table(meta.name):
                    return None
                rows = conn.execute(sa.select(meta.c.key, meta.c.value).where(
                    meta.c.key.in_(("schema_version", FLEET_KEY))))
                values = {str(key): str(value) for key, value in rows}
        except sa.exc.SQLAlchemyError as exc:
            raise db_error(exc) from exc
        if FLEET_KEY in values:
            self._fleet_key = values[FLEET_KEY].encode()
        value = values.get("schema_version")
        return None if value is None else int(value)

    def fleet_key(self) -> bytes:
        """The fleet's secret (``meta.fleet_key``, made with the schema):
        every daemon keys its definition hashes and per-key digests with it
        (:meth:`Job.digests <dblockrun.jobs.Job.digests>`), so that
        hosts compare and a reader without database access cannot test
        guesses. Read with the schema's version: no statement of its own
        but when it is missing (deleted by hand: made again)."""
        self._check_schema()
        if self._fleet_key is None:
            meta = self.t.meta

            def read(conn: Connection) -> str | None:
                conn.execute(self.dialect.insert_ignore(meta).values(
                    key=FLEET_KEY, value=new_fleet_key()))
                found = conn.execute(sa.select(meta.c.value).where(meta.c.key == FLEET_KEY))
                return found.scalar()

            value = self._run(read)
            if value is None:  # cannot happen: it was inserted or there
                raise DatabaseError(f"no {FLEET_KEY} in {meta.name}")
            self._fleet_key = value.encode()
        return self._fleet_key

    def ensure_schema(self, *, create: bool = True) -> int:
        """Create the schema if missing (``create``), refuse a newer one."""
        version = self.schema_version()
        if version is not None and version > SCHEMA_VERSION:
            raise too_new(version)
        if version == SCHEMA_VERSION:
            return version
        if not create:
            raise DatabaseError(
                f"no dblockrun schema (prefix {self.prefix!r}) in the database: "
                "run `dblockrun init-db`"
            )
        deadline = time.monotonic() + 20
        while True:
            try:
                self._create_schema()
                break
            except sa.exc.SQLAlchemyError as exc:
                # Another process may be creating the same tables right now.
                if time.monotonic() > deadline:
                    raise db_error(exc) from exc
                time.sleep(0.2)
                if self.schema_version() == SCHEMA_VERSION:
                    break
        return SCHEMA_VERSION

    def _create_schema(self) -> None:
        # Create what is missing, change what is older (store/migrate.py),
        # then record the version.
        meta = self.t.meta
        with self.engine.connect() as conn:
            self.t.metadata.create_all(conn, checkfirst=True)
            migrate(conn, self.t)
            stmt = self.dialect.insert_ignore(meta).values(
                key="schema_version", value=str(SCHEMA_VERSION)
            )
            conn.execute(stmt)
            conn.execute(self.dialect.insert_ignore(meta).values(
                key=FLEET_KEY, value=new_fleet_key()))
            conn.execute(
                meta.update()
                .where(meta.c.key == "schema_version", meta.c.value != str(SCHEMA_VERSION))
                .values(value=str(SCHEMA_VERSION))
            )

    def drop_schema(self) -> None:
        with self.engine.connect() as conn:
            self.t.metadata.drop_all(conn, checkfirst=True)
        self._schema_checked = False

    # -- clock --------------------------------------------------------------

    db_now = on_engine(LockEngine.db_now)

    def clock_sample(self) -> m.ClockSample:
        """Read the database clock once, timed from both local clocks."""
        with self._conn() as conn:
            stmt = sa.select(self.now)
            wall0, mono0 = time.time(), time.monotonic()
            db = float(conn.execute(stmt).scalar_one())
            wall1, mono1 = time.time(), time.monotonic()
        return m.ClockSample(db_now=db, offset=db - (wall0 + wall1) / 2,
                             mono_offset=db - (mono0 + mono1) / 2, rtt=mono1 - mono0)

    # -- lock rows ----------------------------------------------------------

    def ensure_jobs(self, names: Iterable[str]) -> None:
        """Make sure each name has its lock row (free, token 0)."""
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return

        def go(conn: Connection) -> None:
            have = set(self._names(conn, wanted))
            missing = [{"name": n, "token": 0} for n in wanted if n not in have]
            for batch in _chunks(missing, 500):
                conn.execute(self.dialect.insert_ignore(self.t.locks), list(batch))

        self._run(go)

    def ensure_every_host(self, rows: Sequence[tuple[str, str]]) -> None:
        """Make sure each every-host row (``JOB@HOST``, its job) has its lock
        row; a new one starts disabled as its job's own row is (so ``disable
        JOB`` holds for hosts that join later). The job's row must exist."""
        if not rows:
            return
        locks = self.t.locks
        base = locks.alias("job_row")

        def go(conn: Connection) -> None:
            have = set(self._names(conn, [row for row, _job in rows]))
            for row, job in rows:
                if row in have:
                    continue
                copy = sa.select(sa.literal(row, Name(255)), sa.literal(0, sa.BigInteger()),
                                 base.c.disabled_until, base.c.disabled_reason
                                 ).where(base.c.name == job)
                conn.execute(self.dialect.insert_ignore(locks).from_select(
                    ["name", "token", "disabled_until", "disabled_reason"], copy))

        self._run(go)

    def with_every_host(self, names: Sequence[str]) -> list[str]:
        """``names``, each followed by its every-host rows (``NAME@HOST``) that
        the database has: what ``status``, ``history``, ``disable`` and
        ``enable`` of an every-host job act on. One statement."""
        if not names:
            return []
        locks = self.t.locks
        stmt = sa.select(locks.c.name).where(sa.or_(*(
            locks.c.name.startswith(f"{n}{EVERY_HOST_SEP}", autoescape=True) for n in names)))
        found = sorted(str(r[0]) for r in self._run(lambda c: c.execute(stmt).all()))
        out: list[str] = []
        for name in names:
            out.append(name)
            # Exact: SQLite's LIKE ignores case.
            out.extend(row for row in found if row.startswith(f"{name}{EVERY_HOST_SEP}"))
        return list(dict.fromkeys(out))

    def claim(self, name: str, holder: str, lease: float, *, slot: float | None = None,
              rate: float | None = None, next_due: float | None = None,
              slot_tolerance: float = CLAIM_TOLERANCE) -> int | None:
        """Try to take the lock of ``name``: one conditional UPDATE.

        Wins only if the lock is free (lease expired), the job is not disabled,
        the slot is newer than the last one claimed (and not in the future),
        and the last start is at least ``rate`` old. Returns the new fencing
        token, or None when another host has it (or the slot is taken).
        """
        won = self.lock_engine().claim(name, holder, lease, Claim(
            slot=slot, rate=rate, next_due=next_due, tolerance=slot_tolerance))
        return None if won is None else won.token

    def claim_and_record(self, name: str, holder: str, lease: float, *,
                         slot: float | None = None, rate: float | None = None,
                         next_due: float | None = None,
                         slot_tolerance: float = CLAIM_TOLERANCE) -> Claimed | None:
        """:meth:`claim`, and when won the run record of its first attempt
        (``running``), in the same round trip."""
        return self.lock_engine().claim(name, holder, lease, Claim(
            slot=slot, rate=rate, next_due=next_due, tolerance=slot_tolerance, record=True))

    def claim_batch(self, names: Sequence[str], holder: str, lease: float, *, slot: float,
                    next_due: float, limit: int, rate: float | None = None,
                    slot_tolerance: float = CLAIM_TOLERANCE,
                    wait: bool = False) -> list[Claimed]:
        """Claim up to ``limit`` of ``names`` (all due at ``slot``, next due at
        ``next_due``, each at least ``rate`` after its last start) and record
        their runs, in one statement where the database allows; rows another
        host is claiming at the same moment are skipped, or with ``wait``
        claimed if that claim rolls back."""
        claim = Claim(slot=slot, rate=rate, next_due=next_due, tolerance=slot_tolerance,
                      record=True, wait=wait)
        return self.lock_engine().claim_batch(names, holder, lease, claim, limit)

    def claim_requested(self, name: str, holder: str, lease: float) -> int | None:
        """Claim a job that an operator asked to run now (``dblockrun run``)."""
        won = self.lock_engine().claim(name, holder, lease, Claim(requested=True))
        return None if won is None else won.token

    def lock_engine(self) -> LockEngine:
        """The hot statements, once the schema is checked."""
        self._check_schema()
        return self.lock

    renew = on_engine(LockEngine.renew)
    renew_many = on_engine(LockEngine.renew_many)
    write_outputs = on_engine(LockEngine.write_outputs)
    set_next_due = on_engine(LockEngine.set_next_due)
    release = on_engine(LockEngine.release)
    record_slots = on_engine(LockEngine.record_slots)
    held_gaps = on_engine(LockEngine.held_gaps)
    held_gaps_seen = on_engine(LockEngine.held_gaps_seen)
    claim_seat = on_engine(LockEngine.claim_seat)
    release_seat = on_engine(LockEngine.release_seat)
    run_waits = on_engine(LockEngine.run_waits)
    run_admitted = on_engine(LockEngine.run_admitted)
    make_triggers = on_engine(LockEngine.make_triggers)
    pending_triggers = on_engine(LockEngine.pending_triggers)
    chained_before = on_engine(LockEngine.chained_before)
    claim_trigger = on_engine(LockEngine.claim_trigger)
    record_trigger = on_engine(LockEngine.record_trigger)
    prune_triggers = on_engine(LockEngine.prune_triggers)

    def seat_holders(self, seats: Sequence[str]) -> list[tuple[str, str]]:
        """The (job, host) holding each seat of ``seats`` whose lease holds."""
        locks = self.t.locks
        stmt = (sa.select(locks.c.held_for, locks.c.holder)
                .where(locks.c.name.in_(list(seats)), locks.c.lock_until > self.now,
                       locks.c.holder.is_not(None))
                .order_by(locks.c.name))
        return self._run(lambda c: [(str(j), str(h)) for j, h in c.execute(stmt)])

    def bad_tokens(self, names: Iterable[str]) -> list[tuple[str, int]]:
        """Which of ``names`` have a token no claim takes (edited below zero
        or to the BIGINT maximum: :func:`~dblockrun.store.models.token_usable`),
        with it."""
        locks, wanted = self.t.locks, list(dict.fromkeys(names))
        bad = sa.or_(locks.c.token < 0, locks.c.token >= m.TOKEN_MAX)
        return self._run(lambda c: [
            (str(n), int(t)) for chunk in _chunks(wanted, 500) for n, t in c.execute(
                sa.select(locks.c.name, locks.c.token).where(locks.c.name.in_(chunk), bad))])

    def log_bad_tokens(self, names: Iterable[str]) -> None:
        """Log each of ``names`` whose token no claim takes (:meth:`bad_tokens`)
        once, saying how to repair it: once per job for this store, whether
        this or a claim that met it saw it first (the lock engine's
        ``bad_token``)."""
        for name, token in self.bad_tokens(names):
            self.lock.bad_token(name, token)

    def _names(self, conn: Connection, names: Sequence[str],
               *where: sa.ColumnElement[bool]) -> list[str]:
        """Those of ``names`` whose lock rows are ``where``: a statement per 500."""
        locks = self.t.locks
        return [str(r[0]) for chunk in _chunks(names, 500) for r in conn.execute(
            sa.select(locks.c.name).where(locks.c.name.in_(chunk), *where))]

    def force_unlock(self, name: str, audit: Audit | None = None) -> int | None:
        """Free the lock whoever holds it and bump the token (fencing the holder);
        forget a last slot or start in the future, which would hold the job back.

        A token no claim takes (edited below zero or to the BIGINT maximum)
        gets the one after the newest its runs were given (1 if none): never
        a token already handed out, so no holder is unfenced and no daemon
        sees the database go backwards. If the newest run's token is the
        maximum itself, no newer token exists: refused, saying so.

        The new token, or None if there is no such job.
        """
        locks, runs, now = self.t.locks, self.t.runs, self.now

        def past(column: sa.Column[Any]) -> sa.ColumnElement[Any]:
            return sa.case((column > now, None), else_=column)

        usable = sa.and_(locks.c.token >= 0, locks.c.token < m.TOKEN_MAX)
        issued = (sa.select(sa.func.max(runs.c.token))
                  .where(runs.c.job == name, runs.c.item.is_(None), runs.c.token >= 0))
        after = sa.func.coalesce(issued.scalar_subquery(), 0)
        stmt = self._update_lock(
            name, holder=None, lock_until=None,
            token=sa.case((usable, locks.c.token), else_=after) + 1,
            last_slot=past(locks.c.last_slot), last_start=past(locks.c.last_start))
        read = sa.select(locks.c.token).where(locks.c.name == name)

        def go(conn: Connection) -> int | None:
            token = conn.execute(read).scalar()
            if token is None:
                return None
            if not m.token_usable(int(token)):
                newest = conn.execute(issued).scalar()
                if newest is not None and int(newest) >= m.TOKEN_MAX - 1:
                    raise DatabaseError(
                        f"job {name}: its runs were given fencing tokens up to {newest}, "
                        "the largest there is: no newer token exists, so the lock cannot "
                        "be repaired without reusing one; rename the job", kind="bad-row")
            conn.execute(stmt)
            return int(conn.execute(read).scalar_one())

        return self.control.audited(go, audit)

    def _update_lock(self, name: str, **values: Any) -> sa.Update:
        locks = self.t.locks
        return locks.update().where(locks.c.name == name).values(**values)

    # -- runs ---------------------------------------------------------------

    start_run = on_engine(LockEngine.start_run)
    finish_run = on_engine(LockEngine.finish_run)
    finish_and_release = on_engine(LockEngine.finish_and_release)
    sweep_lost = on_engine(LockEngine.sweep_lost)
    prune_runs = on_engine(LockEngine.prune_runs)

    def shown_runs(self, *, output: bool = True) -> sa.Select[Any]:
        """The runs as operators are shown them: a run still ``running`` whose
        lease ran out or was taken over reads ``lost``, before any daemon (or
        the next claim) has written it so. ``output``: with the output tail."""
        runs = self.t.runs
        lost = sa.literal_column(self.lock.q.lost_where("1 = 1"), sa.Boolean())
        result = sa.case((lost, m.LOST), else_=runs.c.result).label("result")
        left_out = {"result"} if output else {"result", "output"}
        return sa.select(*[c for c in runs.c if c.name not in left_out], result)

    def record_slots_in(self, job: str, after: float,
                        upto: float) -> tuple[set[float], list[tuple[float, float]]]:
        """The slots in (``after``, ``upto``] the job has a record of, and
        the ranges (first, last) of its summary records that reach into it."""
        runs = self.t.runs
        stmt = sa.select(runs.c.slot, runs.c.covers_from).where(
            runs.c.job == job, runs.c.item.is_(None), runs.c.slot > after,
            sa.func.coalesce(runs.c.covers_from, runs.c.slot) <= upto)
        slots: set[float] = set()
        ranges: list[tuple[float, float]] = []
        for slot, covers_from in self._run(lambda c: c.execute(stmt).all()):
            if covers_from is not None:
                ranges.append((float(covers_from), float(slot)))
            if slot <= upto:
                slots.add(float(slot))
        return slots, ranges

    def slot_records(self, job: str, first: float, last: float) -> list[m.SlotRecord]:
        """The job's records of its slots in [``first``, ``last``] (and the
        summary records that reach into it), oldest first, their results as
        :meth:`shown_runs` shows them (a dead holder's: lost): what
        ``backfill`` reads to find the slots with no run that ended ok."""
        runs = self.t.runs
        shown = self.shown_runs(output=False).selected_columns
        stmt = (sa.select(shown.id, shown.slot, shown.covers_from, shown.result)
                .where(runs.c.job == job, runs.c.item.is_(None), runs.c.slot >= first,
                       sa.func.coalesce(runs.c.covers_from, runs.c.slot) <= last)
                .order_by(runs.c.id))
        return self._run(lambda c: [m.SlotRecord(int(r[0]), float(r[1]),
                                                 None if r[2] is None else float(r[2]), str(r[3]))
                                    for r in c.execute(stmt)])

    def newest_record_slot(self, job: str, before: float) -> float | None:
        """The newest slot before ``before`` the job has a record of."""
        runs = self.t.runs
        stmt = sa.select(sa.func.max(runs.c.slot)).where(
            runs.c.job == job, runs.c.item.is_(None), runs.c.slot < before)
        found = self._run(lambda c: c.execute(stmt).scalar())
        return None if found is None else float(found)

    def previous_result(self, job: str, before_id: int) -> str | None:
        """The result of the job's last run recorded before run ``before_id``
        (not a missed or skipped slot; not a fan-out item), as ``history``
        shows it, or None: there was none. A notification of recovery reads it."""
        runs, earlier = self.t.runs, self.t.runs.alias("earlier")
        last = (sa.select(sa.func.max(earlier.c.id))
                .where(earlier.c.job == job, earlier.c.id < before_id, earlier.c.item.is_(None),
                       earlier.c.result.not_in((m.MISSED, m.SKIPPED)))
                .scalar_subquery())
        stmt = sa.select(self.shown_runs().selected_columns.result).where(runs.c.id == last)
        found = self._run(lambda c: c.execute(stmt).scalar())
        return None if found is None else str(found)

    def history(self, job: str | None = None, limit: int = 20,
                item: str | None = None, *, output: bool = True) -> list[m.RunRecord]:
        """The newest ``limit`` runs; without ``output``, their output tails
        are not read (each may be 64 KiB: 100,000 runs would be 6 GB)."""
        runs = self.t.runs
        stmt = self.shown_runs(output=output).order_by(runs.c.id.desc()).limit(limit)
        if job is not None:  # an every-host job: every host's runs
            stmt = stmt.where(runs.c.job.in_(self.with_every_host([job])))
        if item is not None:
            stmt = stmt.where(runs.c.item == item)
        return self._run(lambda c: [m.from_row(m.RunRecord, r._mapping) for r in c.execute(stmt)])

    def runs_between(self, start: float, end: float, limit: int) -> list[m.Span]:
        """The fleet's runs in [``start``, ``end``) as the dashboard's timeline
        draws them, oldest first, at most ``limit``: each run that was
        running at some time of it (begun before ``end``, not ended before
        ``start``), and each passed slot (missed, skipped) of it; their
        results as :meth:`shown_runs` shows them (a dead holder's: lost)."""
        runs = self.t.runs
        shown = self.shown_runs(output=False).selected_columns
        passed = runs.c.result.in_(m.PASSED)
        ran = sa.and_(~passed, runs.c.started < end,
                      sa.or_(runs.c.finished.is_(None), runs.c.finished >= start))
        slots = sa.and_(passed, runs.c.slot >= start, runs.c.slot < end)
        stmt = (sa.select(*(shown[name] for name in m.Span._fields))
                .where(sa.or_(ran, slots)).order_by(runs.c.id).limit(limit))
        return self._run(lambda c: [m.Span._make(row) for row in c.execute(stmt)])

    def run(self, run_id: int) -> m.RunRecord | None:
        if not m.run_id_possible(run_id):
            return None
        stmt = self.shown_runs().where(self.t.runs.c.id == run_id)
        row = self._run(lambda c: c.execute(stmt).first())
        return None if row is None else m.from_row(m.RunRecord, row._mapping)

    # -- flags --------------------------------------------------------------

    def disable(self, name: str, *, for_seconds: float | None = None, until: float | None = None,
                reason: str | None = None, audit: Audit | None = None) -> m.Disabled:
        """Pause a job cluster-wide (an every-host job: on every host): the
        database time it ends, and the disable in effect it replaced. An
        operator's ``audit`` is recorded with it, and names who disabled it."""
        self.ensure_jobs([name])
        locks = self.t.locks
        end: Any = FOREVER if until is None else until
        if for_seconds is not None:
            end = self.now + for_seconds
        stmt = locks.update().where(locks.c.name.in_(self.with_every_host([name]))).values(
            disabled_until=end, disabled_reason=reason,
            disabled_by=audit.who if audit else None)
        read = sa.select(locks.c.disabled_until, locks.c.disabled_by, locks.c.disabled_reason
                         ).where(locks.c.name == name)
        before = read.where(locks.c.disabled_until > self.now)

        def go(conn: Connection) -> m.Disabled:
            was = conn.execute(before).first()
            conn.execute(stmt)
            replaced = None if was is None else m.Disable(float(was[0]), was[1], was[2])
            return m.Disabled(float(conn.execute(read).scalar_one()), replaced)

        return self.control.audited(go, audit)

    def disabled_since(self, name: str, now: float) -> float | None:
        """When the disable in effect on ``name`` (a row ``JOB@HOST``: its
        job's) began, by the audit trail: the newest ``disable`` of the job
        at or before ``now``; None when none is audited (``on-failure``)."""
        audit = self.t.audit
        job = name.split(EVERY_HOST_SEP, 1)[0]
        stmt = sa.select(sa.func.max(audit.c.at)).where(
            audit.c.job == job, audit.c.action == "disable", audit.c.at <= now)
        found = self._run(lambda c: c.execute(stmt).scalar())
        return None if found is None else float(found)

    def enable(self, name: str, audit: Audit | None = None) -> bool | None:
        """Clear a disable (an every-host job: on every host). True: cleared;
        False: nothing to clear (no disable in effect: no audit row); None:
        no such job."""
        locks = self.t.locks
        rows = locks.c.name.in_(self.with_every_host([name]))
        stmt = locks.update().where(rows).values(
            disabled_until=None, disabled_reason=None, disabled_by=None)
        disabled = sa.func.sum(sa.case((locks.c.disabled_until > self.now, 1), else_=0))
        read = sa.select(sa.func.count(), disabled).where(rows)

        def go(conn: Connection) -> bool | None:
            count, now_disabled = conn.execute(read).one()
            if not count:
                return None
            if not now_disabled:
                return False
            conn.execute(stmt)
            return True

        return self.control.audited(go, audit)

    def request_run(self, name: str, audit: Audit | None = None) -> None:
        self.ensure_jobs([name])
        self.lock_engine().request_run(name)
        if audit is not None:  # the request is the lock engine's statement: then its record
            self._run(lambda c: self.control.record(c, audit))
        self.ring()

    def ring(self) -> None:
        """MySQL/MariaDB: wake the daemons waiting for requests
        (dblockrun/store/doorbell.py), a run-now or kill request being
        filed. Best effort: a daemon not woken (another user's without the
        privilege, on another Galera node, or the database failing now)
        reads the request with its next bookkeeping round."""
        if self.dialect.name != "mysql":
            return
        try:
            woken = self.lock_engine().ring()
            log.debug("woke %d daemons' request waits", woken)
        except DatabaseError as exc:
            log.debug("could not wake the daemons' request waits (%s): they read the "
                      "request with their next bookkeeping round", exc)

    def cancel_request(self, name: str, audit: Audit | None = None) -> bool | None:
        """Withdraw the run-now request of ``name`` (an every-host job: of
        each host's row). True: withdrawn; False: none was filed (nothing
        recorded); None: no such job."""
        locks = self.t.locks
        rows = locks.c.name.in_(self.with_every_host([name]))
        filed = sa.func.sum(sa.case((locks.c.run_requested.is_not(None), 1), else_=0))
        read = sa.select(sa.func.count(), filed).where(rows)
        stmt = locks.update().where(rows).values(run_requested=None)

        def go(conn: Connection) -> bool | None:
            count, requested = conn.execute(read).one()
            if not count:
                return None
            if not requested:
                return False
            conn.execute(stmt)
            return True

        return self.control.audited(go, audit)

    def forget(self, rows: Sequence[str], audit: Audit | None = None) -> tuple[int, int] | None:
        """Delete the lock rows ``rows`` of a job no daemon defines, their
        fan-out items and their runs, in one transaction with the operator's
        ``audit``: (lock rows, runs) deleted; None (nothing done) while one
        of them is held by a live lease (a command may be running)."""
        locks, items, runs, now = self.t.locks, self.t.items, self.t.runs, self.now
        names = list(rows)
        held = sa.select(sa.func.count()).where(locks.c.name.in_(names), locks.c.lock_until > now)
        held_items = sa.select(sa.func.count()).where(items.c.job.in_(names),
                                                      items.c.lock_until > now)

        def go(conn: Connection) -> tuple[int, int] | None:
            if conn.execute(held).scalar() or conn.execute(held_items).scalar():
                return None
            gone = conn.execute(runs.delete().where(runs.c.job.in_(names))).rowcount
            conn.execute(items.delete().where(items.c.job.in_(names)))
            count = conn.execute(locks.delete().where(locks.c.name.in_(names))).rowcount
            return count, gone

        return self.control.audited(go, audit)

    def requested(self, drain_of: str | None = None) -> list[str]:
        """Jobs an operator asked to run now (one statement, whatever the job
        count); ``drain_of``: with the drain row of that host, if any, as
        ``@drain SINCE ENDS`` (a polled daemon sees a drain or undrain come
        with the same statement: store/inbox.py ``PolledInbox``)."""
        locks = self.t.locks
        stmt: sa.Select[Any] | sa.CompoundSelect[Any] = (
            sa.select(locks.c.name).where(locks.c.run_requested.is_not(None)))
        if drain_of is not None:
            from dblockrun.store.drain import DRAIN_NOTE

            drain = self.t.drain
            note = (sa.literal(f"{DRAIN_NOTE} ", sa.String) + sa.cast(drain.c.since, sa.String)
                    + " " + sa.cast(drain.c.ends, sa.String))
            stmt = sa.union_all(stmt, sa.select(note).where(drain.c.host == drain_of))
        return self._run(lambda c: [str(r[0]) for r in c.execute(stmt)])

    # -- hosts --------------------------------------------------------------

    def heartbeat_host(self, host_id: str, *, hostname: str, pid: int, version: str,
                       clock_offset: float | None, running: int, jobs: str | None,
                       labels: str | None = None, targets: str | None = None,
                       heartbeat: float | None = None, fields: str | None = None) -> None:
        """Write the host's row; ``fields`` None: the row's are kept."""
        hosts, now = self.t.hosts, self.now
        values = {"last_seen": now, "clock_offset": clock_offset, "running": running, "jobs": jobs,
                  "labels": labels, "targets": targets}
        if fields is not None:
            values["fields"] = fields

        def go(conn: Connection) -> None:
            res = conn.execute(hosts.update().where(hosts.c.id == host_id).values(**values))
            if res.rowcount == 0:
                conn.execute(hosts.insert().values(id=host_id, hostname=hostname, pid=pid,
                                                   version=version, started=now,
                                                   heartbeat=heartbeat, **values))

        self._run(go)

    def books_round(self, host_id: str, *, hostname: str, pid: int, version: str,
                    clock_offset: float | None, running: int, jobs: str | None,
                    within: float, labels: str | None = None,
                    targets: str | None = None, heartbeat: float | None = None,
                    audit_after: int = 0, fields: str | None = None) -> BooksRound:
        """A daemon's bookkeeping round: write its host row (with its labels
        and targeting, dblockrun/scheduling/targeting.py, and its heartbeat), sample the clock,
        record dead runs lost, read the other live hosts and the run-now
        requests, and the operator actions daemons log audited after
        ``audit_after``. PostgreSQL: one statement (store/queries.py
        ``books_round``); MySQL: one round trip of statements; SQLite:
        six, and no requests (its daemons poll for them)."""
        engine = self.lock_engine()
        if engine.q.books_in_one_trip:
            return engine.books_round(host_id, hostname=hostname, pid=pid, version=version,
                                      clock_offset=clock_offset, running=running, jobs=jobs,
                                      within=within, labels=labels, targets=targets,
                                      heartbeat=heartbeat, audit_after=audit_after,
                                      fields=fields)
        sample = self.clock_sample()
        self.heartbeat_host(host_id, hostname=hostname, pid=pid, version=version,
                            clock_offset=clock_offset, running=running, jobs=jobs,
                            labels=labels, targets=targets, heartbeat=heartbeat,
                            fields=fields)
        lost = self.sweep_lost(host_id)
        others = [h for h in self.hosts(seen_within=within) if h.id != host_id]
        drained = {d.host for d in self.drains.current()}
        serving = [h for h in others if h.id.partition(":")[0] not in drained]
        return BooksRound(sample, len(others), len(serving),
                          [(h.id, h.jobs) for h in others if h.jobs != jobs], [], lost,
                          self.control.told_after(audit_after))

    @property
    def _host_columns(self) -> list[sa.Column[Any]]:
        """A host row's columns but ``fields`` (per job, its keys' digests:
        read only where drift is found, :meth:`host_fields`)."""
        return [c for c in self.t.hosts.c if c.name != "fields"]

    def host_fields(self, ids: list[str]) -> dict[str, str | None]:
        """The ``fields`` of the hosts ``ids`` (read when drift is found)."""
        hosts = self.t.hosts
        stmt = sa.select(hosts.c.id, hosts.c.fields).where(hosts.c.id.in_(ids))
        return self._run(lambda c: {str(r[0]): r[1] for r in c.execute(stmt)})

    def remove_host(self, host_id: str) -> None:
        hosts = self.t.hosts
        self._run(lambda c: c.execute(hosts.delete().where(hosts.c.id == host_id)))

    def hosts(self, seen_within: float | None = None) -> list[m.HostStatus]:
        hosts = self.t.hosts
        stmt = sa.select(*self._host_columns).order_by(hosts.c.hostname, hosts.c.id)
        if seen_within is not None:
            stmt = stmt.where(hosts.c.last_seen >= self.now - seen_within)
        return self._run(lambda c: [m.from_row(m.HostStatus, r._mapping) for r in c.execute(stmt)])

    def host_labels(self, host_id: str) -> str | None:
        """A host's labels as its row keeps them (JSON; None: no such row)."""
        hosts = self.t.hosts
        stmt = sa.select(hosts.c.labels).where(hosts.c.id == host_id)
        return self._run(lambda c: c.execute(stmt).scalar_one_or_none())

    def live_hosts(self, within: float | None = None) -> list[m.HostStatus]:
        """The live daemons: seen within ``within`` seconds, or (None) each
        within its own window, by its heartbeat (store/status.py ``live_window``)."""
        if within is not None:
            return self.hosts(seen_within=within)
        from dblockrun.store.status import live_window_sql

        hosts = self.t.hosts
        stmt = (sa.select(*self._host_columns).order_by(hosts.c.hostname, hosts.c.id)
                .where(hosts.c.last_seen >= self.now - live_window_sql(hosts.c.heartbeat)))
        return self._run(lambda c: [m.from_row(m.HostStatus, r._mapping) for r in c.execute(stmt)])

    # -- status -------------------------------------------------------------

    def status(self, names: Sequence[str] | None = None,
               live_within: float | None = None) -> StatusReport:
        """What ``dblockrun status`` shows: the jobs (all, or ``names``),
        the live hosts, the pause and the groups' seats, read at one database
        time in a fixed number of statements (store/status.py ``report``)."""
        from dblockrun.store.status import report

        return report(self, names, live_within)

    def passed_since(self, jobs: Sequence[m.JobStatus]) -> dict[str, PassedSince]:
        """Of ``jobs``, those whose slots are being recorded passed: since
        when, how many and why (``status --check``; store/status.py)."""
        from dblockrun.store.status import passed_since

        return passed_since(self, jobs)

    def held_rows(self) -> str | None:
        """Why the lock rows are held past the lock wait by another session,
        naming it where it can be seen; None if they are not (``status
        --check``; store/status.py)."""
        from dblockrun.store.status import held_rows

        return held_rows(self)

    def lock_states(self) -> tuple[dict[str, m.LockState], float]:
        """Every job's lock row, and the database time: one statement (the
        one `status` reads first)."""
        from dblockrun.store.status import lock_rows

        return self._run(lambda c: lock_rows(self, c))

    def job_names(self) -> list[str]:
        """Every job's lock row name (not the groups' seat rows, nor the
        jobs' lanes), sorted."""
        locks = self.t.locks
        stmt = (sa.select(locks.c.name)
                .where(*(locks.c.name.not_like(f"{prefix}%") for prefix in m.NOT_JOB_PREFIXES))
                .order_by(locks.c.name))
        return self._run(lambda c: [str(r[0]) for r in c.execute(stmt)])

    def seat_names(self) -> list[str]:
        """The groups' seat rows' names: ``status`` of some jobs with them
        (``status(names + seats)``) shows the groups' seats too."""
        locks = self.t.locks
        stmt = sa.select(locks.c.name).where(locks.c.name.like(f"{m.SEAT_PREFIX}%"))
        return self._run(lambda c: sorted(str(r[0]) for r in c.execute(stmt)))

    def lock_state(self, name: str) -> m.LockState | None:
        locks = self.t.locks
        row = self._run(lambda c: c.execute(sa.select(locks).where(locks.c.name == name)).first())
        return None if row is None else m.from_row(m.LockState, row._mapping)


def _chunks(seq: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]

