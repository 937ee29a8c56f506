"""The lean store of ``dblockrun exec``: Store's statements, sent with the
driver alone (sqlite3, libpq through ctypes, or PyMySQL), so that exec does
not import SQLAlchemy (about 150-300 ms of a 1-core start).

The statements are the ones :class:`~dblockrun.store.Store` sends for an
exec (its claim without slot or rate, renew, release, start_run, finish_run,
prune_runs), written out per dialect: the claim is the same single
conditional UPDATE on the database clock, renewals, release and the result
are conditioned on the fencing token. tests/test_exec_fast.py holds them to
that on all three databases. :func:`open_lean` returns None, and the caller
uses Store, for anything out of the ordinary: a schema that is missing or of
another version (Store creates or refuses it), a URL with options, a table
prefix that would need quoting, a SQLite file that does not exist yet. The
rare calls (disable, lock_state) go to a Store made on first use.

PostgreSQL goes through :mod:`dblockrun.store.libpq` (a ctypes binding,
loaded in about 4 ms) rather than psycopg, whose import alone takes 250-300
ms; psycopg only when no libpq can be loaded.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from dblockrun.dburl import DRIVERS
from dblockrun.errors import DatabaseError
from dblockrun.store import models as m
from dblockrun.store.sql import NOW, SCHEMA_VERSION

if TYPE_CHECKING:
    import ssl

    from dblockrun.store.store import Store

T = TypeVar("T")

# SQLAlchemy's own URL pattern (sqlalchemy.engine.url._parse_url), so that
# both paths read a URL the same way.
_URL = re.compile(
    r"""
        (?P<name>[\w\+]+)://
        (?:
            (?P<username>[^:/]*)
            (?::(?P<password>[^@]*))?
        @)?
        (?:
            (?:
                \[(?P<ipv6host>[^/\?]+)\] |
                (?P<ipv4host>[^/:\?]+)
            )?
            (?::(?P<port>[^/\?]*))?
        )?
        (?:/(?P<database>[^\?]*))?
        (?:\?(?P<query>.*))?
        """,
    re.X,
)

#: Prefixes SQLAlchemy leaves unquoted (lower case, no specials).
_PREFIX = re.compile(r"[a-z_][a-z0-9_]*")


def _error(exc: Exception) -> DatabaseError:
    # Store's own mapping (DatabaseError or DatabaseRefused, the same text);
    # it imports SQLAlchemy, but only once something went wrong.
    from dblockrun.store.store import _db_error

    return _db_error(exc)


def _unquote(text: str) -> str:
    if "%" not in text:
        return text  # the usual case, without importing urllib.parse
    from urllib.parse import unquote

    return unquote(text)


class Driver:
    """How the lean store reaches one database: its dialect (``sqlite``,
    ``postgresql``, ``mysql``), the driver (``sqlite3``, ``libpq``,
    ``psycopg``, ``pymysql``) and a function that opens a connection."""

    def __init__(self, dialect: str, name: str, connect: Callable[[], Any]) -> None:
        self.dialect = dialect
        self.name = name
        self.connect = connect

    def is_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the driver's (a database error, not a bug of ours)."""
        if self.name == "sqlite3":
            import sqlite3

            return isinstance(exc, sqlite3.Error)
        if self.name == "libpq":
            from dblockrun.store import libpq

            return isinstance(exc, libpq.Error)
        if self.name == "psycopg":
            import psycopg

            return isinstance(exc, psycopg.Error)
        import pymysql

        return isinstance(exc, pymysql.err.Error)

    def broken(self, conn: Any, exc: BaseException) -> bool:
        """Whether the connection died (then one retry on a new one, as Store)."""
        if self.dialect == "postgresql":  # libpq and psycopg connections alike
            return bool(getattr(conn, "broken", False) or getattr(conn, "closed", False))
        if self.dialect == "mysql":
            import pymysql

            if isinstance(exc, pymysql.err.InterfaceError):
                return True
            code = exc.args[0] if exc.args else None
            return isinstance(exc, pymysql.err.OperationalError) and code in (
                2006, 2013, 2014, 2045, 2055)
        return False


def _driver(url: str) -> Driver | None:
    """The driver for a plain URL, else None."""
    match = _URL.match(url)
    if match is None:
        return None
    driver = DRIVERS.get(match.group("name").lower())
    if driver is None or match.group("query") is not None:
        return None
    dialect = driver.split("+")[0]
    user = match.group("username")
    password = match.group("password")
    host = match.group("ipv4host") or match.group("ipv6host")
    port_text = match.group("port")
    database = match.group("database")
    if dialect == "sqlite":
        if user is not None or host or port_text or not database or database == ":memory:":
            return None
        path = os.path.abspath(_unquote(database))
        if not os.path.isfile(path):
            return None  # Store creates it, 0600 in a 0700 folder
        return Driver(dialect, "sqlite3", lambda: _connect_sqlite(path))
    kw: dict[str, Any] = {}
    if host:
        kw["host"] = host
    if port_text:
        if not port_text.isdigit():
            return None
        kw["port"] = int(port_text)
    if user:
        kw["user"] = _unquote(user)
    if password:
        kw["password"] = _unquote(password)
    if dialect == "postgresql":
        if database:
            kw["dbname"] = _unquote(database)
        # As Dialect.engine_options.
        kw.update(connect_timeout=5, application_name="dblockrun",
                  options="-c statement_timeout=15000")
        from dblockrun.store import libpq

        if libpq.load() is not None:
            params = {k: str(v) for k, v in kw.items()}
            params["client_encoding"] = "UTF8"  # results are decoded as UTF-8
            return Driver(dialect, "libpq", lambda: libpq.connect(params))
        return Driver(dialect, "psycopg", lambda: _connect_psycopg(kw))
    if database:
        kw["database"] = _unquote(database)
    kw.update(connect_timeout=5, read_timeout=15, write_timeout=15,
              init_command="SET time_zone = '+00:00'", charset="utf8mb4",
              # SQLAlchemy sets FOUND_ROWS: rowcount counts matched rows.
              client_flag=2, autocommit=True)
    return Driver(dialect, "pymysql", lambda: _connect_mysql(kw))


def _connect_sqlite(path: str) -> Any:
    import sqlite3

    conn = sqlite3.connect(path, timeout=15, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA busy_timeout=15000")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _connect_psycopg(kw: dict[str, Any]) -> Any:
    import psycopg

    return psycopg.connect(autocommit=True, **kw)


def _unverified_tls() -> ssl.SSLContext:
    """The TLS context of PyMySQL's "preferred" mode, without loading CA certificates.

    With no TLS options PyMySQL (1.2+) uses TLS when the server offers it,
    without verifying the certificate; but it first loads the system's CA
    certificates into the context (25-50 ms of exec's start), which a context
    that verifies nothing never reads. tests/test_exec_fast.py holds this one
    to PyMySQL's own.
    """
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _connect_mysql(kw: dict[str, Any]) -> Any:
    import pymysql

    class Connection(pymysql.connections.Connection):
        def _create_ssl_ctx(self, sslp: object) -> ssl.SSLContext:
            if sslp == {}:  # the "preferred" mode: no CA, no verification
                return _unverified_tls()
            return super()._create_ssl_ctx(sslp)  # type: ignore[misc, no-any-return]

    return Connection(**kw)


def _numbered(sql: str) -> str:
    """``%s`` placeholders as libpq's ``$1``, ``$2``... (our SQL has no other ``%``)."""
    first, *rest = sql.split("%s")
    return first + "".join(f"${i}{part}" for i, part in enumerate(rest, 1))


class _Sql:
    """The statements of one dialect and table prefix."""

    def __init__(self, dialect: str, prefix: str, *, numbered: bool = False) -> None:
        now = NOW[dialect]
        p = "?" if dialect == "sqlite" else "%s"
        q: Callable[[str], str] = _numbered if numbered else str
        locks, runs, meta = f"{prefix}locks", f"{prefix}runs", f"{prefix}meta"
        key = "`key`" if dialect == "mysql" else '"key"'
        self.version = q(f"SELECT {meta}.value FROM {meta} WHERE {meta}.{key} = {p}")
        ignore = {"sqlite": "INSERT OR IGNORE INTO", "mysql": "INSERT IGNORE INTO",
                  "postgresql": "INSERT INTO"}[dialect]
        self.ensure = q(f"{ignore} {locks} (name, token) VALUES ({p}, {p})" + (
            " ON CONFLICT DO NOTHING" if dialect == "postgresql" else ""))
        token = (f"last_insert_id({locks}.token + {p})" if dialect == "mysql"
                 else f"({locks}.token + {p})")
        self.claim = q(
            f"UPDATE {locks} SET holder={p}, lock_until=({now} + {p}), locked_at={now}, "
            f"token={token}, last_start={now}, run_requested={p} "
            f"WHERE {locks}.name = {p} AND ({locks}.lock_until IS NULL OR "
            f"{locks}.lock_until <= {now}) AND ({locks}.disabled_until IS NULL OR "
            f"{locks}.disabled_until <= {now})"
            + ("" if dialect == "mysql" else f" RETURNING {locks}.token")
        )
        mine = f"WHERE {locks}.name = {p} AND {locks}.holder = {p} AND {locks}.token = {p}"
        self.renew = q(f"UPDATE {locks} SET lock_until=({now} + {p}) {mine}")
        greatest = "max" if dialect == "sqlite" else "greatest"
        self.release = q(f"UPDATE {locks} SET lock_until={greatest}({now}, "
                         f"{locks}.locked_at + {p}) {mine}")
        self.start_run = q(
            f"INSERT INTO {runs} (job, item, host, slot, token, attempt, started, finished, "
            f"result) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {now}, "
            + "{finished}" + f", {p})"
            + (f" RETURNING {runs}.id" if dialect == "postgresql" else "")
        )
        finish_run = (f"UPDATE {runs} SET finished={now}, exit_code={p}, result={p}, "
                      f"output={p} WHERE {runs}.id = {p}")
        self.finish_run = q(finish_run)
        #: finish_run, only while the token is still the lock's.
        self.finish_run_fenced = q(
            finish_run + f" AND (EXISTS (SELECT {locks}.name FROM {locks} "
            f"WHERE {locks}.name = {p} AND {locks}.token = {p}))")
        # prune_runs: the id below which a job's runs go, then the DELETE.
        self.prune_cutoff = q(f"SELECT {runs}.id FROM {runs} WHERE {runs}.job = {p} "
                              f"ORDER BY {runs}.id DESC LIMIT {p} OFFSET {p}")
        self.prune = q(f"DELETE FROM {runs} WHERE {runs}.job = {p} AND {runs}.id <= {p}")
        self.now = now


class LeanStore:
    """One connection, serialised by a lock (exec has two threads: the run
    and its lease renewals). Raises DatabaseError like Store."""

    def __init__(self, url: str, prefix: str, driver: Driver) -> None:
        self.url = url
        self.prefix = prefix
        self.dialect = driver.dialect
        self.driver = driver
        self.statements = 0
        self._conn: Any = None
        self._lock = threading.Lock()
        self._sql = _Sql(driver.dialect, prefix, numbered=driver.name == "libpq")
        self._full: Store | None = None

    def __repr__(self) -> str:
        from dblockrun.dburl import redact

        return f"LeanStore({redact(self.url)!r}, prefix={self.prefix!r})"

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                except Exception:  # closing a dead connection
                    pass
                self._conn = None
        if self._full is not None:
            self._full.close()

    def __enter__(self) -> LeanStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def full(self) -> Store:
        """The SQLAlchemy store on the same database, for the rare calls."""
        if self._full is None:
            from dblockrun.store.store import Store

            self._full = Store(self.url, self.prefix)
        return self._full

    # -- plumbing -----------------------------------------------------------

    def _execute(self, fn: Callable[[Any], T]) -> T:
        with self._lock:
            fresh = self._conn is None
            try:
                if self._conn is None:
                    self._conn = self.driver.connect()
                return self._call(fn)
            except DatabaseError:
                raise
            except Exception as exc:
                if not self.driver.is_error(exc):
                    raise
                conn = self._conn
                broken = conn is None or self.driver.broken(conn, exc)
                if not broken:
                    raise _error(exc) from exc
                self._drop(conn)
                if fresh:
                    raise _error(exc) from exc
            # A pooled connection found dead: one retry on a new one, as Store.
            try:
                self._conn = self.driver.connect()
                return self._call(fn)
            except Exception as exc:
                if not self.driver.is_error(exc):
                    raise
                self._drop(self._conn)
                raise _error(exc) from exc

    def _call(self, fn: Callable[[Any], T]) -> T:
        cur = self._conn.cursor()
        try:
            return fn(cur)
        finally:
            cur.close()

    def _drop(self, conn: Any) -> None:
        self._conn = None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a dead connection
                pass

    def _exec(self, cur: Any, sql: str, params: tuple[Any, ...]) -> Any:
        self.statements += 1
        cur.execute(sql, params)
        return cur

    # -- what exec needs ------------------------------------------------------

    def schema_version(self) -> int | None:
        def go(cur: Any) -> int | None:
            row = self._exec(cur, self._sql.version, ("schema_version",)).fetchone()
            return None if row is None else int(row[0])

        return self._execute(go)

    def ensure_jobs(self, names: Iterable[str]) -> None:
        wanted = list(dict.fromkeys(names))

        def go(cur: Any) -> None:
            for name in wanted:
                self._exec(cur, self._sql.ensure, (name, 0))

        self._execute(go)

    def claim(self, name: str, holder: str, lease: float) -> int | None:
        """Store.claim without slot or rate: the same one conditional UPDATE."""
        params = (holder, lease, 1, None, name)

        def go(cur: Any) -> int | None:
            self._exec(cur, self._sql.claim, params)
            if self.dialect == "mysql":
                return int(cur.lastrowid) if cur.rowcount == 1 else None
            row = cur.fetchone()
            return None if row is None else int(row[0])

        return self._execute(go)

    def renew(self, name: str, holder: str, token: int, lease: float) -> bool:
        params = (lease, name, holder, token)
        return self._execute(lambda cur: bool(self._exec(cur, self._sql.renew, params).rowcount
                                              == 1))

    def release(self, name: str, holder: str, token: int, lock_at_least: float = 0.0) -> bool:
        params = (float(lock_at_least), name, holder, token)
        return self._execute(lambda cur: bool(self._exec(cur, self._sql.release, params).rowcount
                                              == 1))

    def start_run(self, job: str, host: str, *, token: int | None, slot: float | None = None,
                  attempt: int = 1, item: str | None = None, result: str = m.RUNNING) -> int:
        finished = "NULL" if result == m.RUNNING else self._sql.now
        sql = self._sql.start_run.format(finished=finished)
        params = (job, item, host, slot, token, attempt, result)

        def go(cur: Any) -> int:
            self._exec(cur, sql, params)
            if self.dialect == "postgresql":
                return int(cur.fetchone()[0])
            return int(cur.lastrowid)

        return self._execute(go)

    def finish_run(self, run_id: int, job: str, token: int | None, result: str,
                   exit_code: int | None, output: str | None) -> bool:
        sql = self._sql.finish_run
        params: tuple[Any, ...] = (exit_code, result, output, run_id)
        if token is not None:
            sql = self._sql.finish_run_fenced
            params += (job, token)
        return self._execute(lambda cur: bool(self._exec(cur, sql, params).rowcount == 1))

    def prune_runs(self, job: str, keep: int) -> int:
        """Store.prune_runs (every 50th run: not worth SQLAlchemy's import)."""

        def go(cur: Any) -> int:
            row = self._exec(cur, self._sql.prune_cutoff, (job, 1, keep)).fetchone()
            if row is None:
                return 0
            return int(self._exec(cur, self._sql.prune, (job, int(row[0]))).rowcount)

        return self._execute(go)

    # -- rare: through Store --------------------------------------------------

    def disable(self, name: str, *, for_seconds: float | None = None, until: float | None = None,
                reason: str | None = None) -> float:
        return self.full().disable(name, for_seconds=for_seconds, until=until, reason=reason)

    def lock_state(self, name: str) -> m.LockState | None:
        return self.full().lock_state(name)


def open_lean(url: str, prefix: str) -> LeanStore | None:
    """A lean store when the URL is plain and the schema current, else None.

    Raises DatabaseError when the database cannot be reached (as Store would).
    """
    if not _PREFIX.fullmatch(prefix):
        return None
    driver = _driver(url)
    if driver is None:
        return None
    store = LeanStore(url, prefix, driver)
    try:
        version = store.schema_version()
    except DatabaseError:
        if store._conn is None:  # could not connect: no use trying Store
            raise
        version = None  # no meta table yet: Store creates the schema
    if version != SCHEMA_VERSION:
        store.close()
        return None
    return store
