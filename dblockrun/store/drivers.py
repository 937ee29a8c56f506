"""What dblockrun knows of its three drivers (sqlite3, psycopg, PyMySQL), in
one place: the options every connection gets, how to open one from a plain
URL without SQLAlchemy, which errors mean a dead connection, a deadlock or a
row lock another session holds, and how a driver's error reads as a
:class:`~dblockrun.errors.DatabaseError`.

A statement waits for a row another session holds at most
:func:`lock_wait_for` of the lease (a quarter, 1 to 10 s), set once per
connection where it is opened (PostgreSQL's ``lock_timeout`` in the start-up
packet, MariaDB's ``innodb_lock_wait_timeout`` in the ``init_command`` that
sets the time zone): no statement more, on any path. Without it MariaDB
waited 50 s, past the client's 15 s read timeout, which then read as an
unreachable database; now the server says the row is held, in seconds.

A driver is imported only when a connection of its kind is opened or one of
its errors is looked at, so that ``exec`` on SQLite never loads psycopg.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from dblockrun.errors import DatabaseError, DatabaseRefused, SettingRefused, UsageError

#: PyMySQL client flags: FOUND_ROWS (rowcount counts matched rows) and
#: MULTI_STATEMENTS (a claim and its run record in one round trip).
MYSQL_CLIENT_FLAG = 2 | (1 << 16)

#: How long a statement waits for a row lock, as a share of the lease, and
#: the bounds: at least a second (MariaDB counts whole seconds), and at most
#: 10 s, below the read timeout and ``statement_timeout`` (15 s), so that the
#: server, not the client's timeout, ends the wait and says why.
LOCK_WAIT_SHARE = 0.25
LOCK_WAIT_MIN, LOCK_WAIT_MAX = 1.0, 10.0
#: The lease of a daemon, ``exec`` and the API by default (seconds).
DEFAULT_LEASE = 30.0


def lock_wait_for(lease: float) -> float:
    """How long a statement of a holder with ``lease`` waits for a row that
    another session holds (renewals and bookkeeping included): a quarter of
    the lease, 1 to 10 s (7.5 s at the default 30 s)."""
    return min(LOCK_WAIT_MAX, max(LOCK_WAIT_MIN, lease * LOCK_WAIT_SHARE))


DEFAULT_LOCK_WAIT = lock_wait_for(DEFAULT_LEASE)

#: Options of every connection, pooled or direct, by dialect (the lock wait
#: is added by :func:`connect_options`).
CONNECT_OPTIONS: dict[str, dict[str, Any]] = {
    "postgresql": {
        "connect_timeout": 5,
        "application_name": "dblockrun",
        "options": "-c statement_timeout=15000",
    },
    "mysql": {
        "connect_timeout": 5,
        "read_timeout": 15,
        "write_timeout": 15,
        "init_command": "SET time_zone = '+00:00'",
        "charset": "utf8mb4",
        "client_flag": MYSQL_CLIENT_FLAG,
    },
    "sqlite": {"timeout": 15, "check_same_thread": False},
}

#: ``?pooler=`` of a PostgreSQL URL: the pool mode of the connection pooler
#: (PgBouncer) between dblockrun and the server. Both: no ``options``
#: startup parameter (a pooler refuses it; the statement timeout is the
#: server's, docs/high-availability.md "PgBouncer"). ``transaction``: no prepared statements
#: (the next transaction may be on another server connection) and no
#: LISTEN (run-now and kill requests are read by the bookkeeping round and
#: the lease renewals). ``session`` (and no pooler): a connection keeps its
#: server connection, so both work.
POOLERS = ("transaction", "session")
_POOLER = re.compile(r"(?:^|&)pooler=([^&]*)")


def url_pooler(url: str) -> str | None:
    """The ``pooler`` query option of ``url`` (None: connected directly);
    UsageError for an unknown value or a URL other than PostgreSQL's."""
    query = _query(url)
    found = _POOLER.findall(query) if query else []
    if not found:
        return None
    scheme = url.partition("://")[0].lower()
    if _SCHEMES.get(scheme) != "postgresql":
        raise UsageError(f"database URL option pooler= is for postgresql:// URLs (a "
                         f"PgBouncer in front of PostgreSQL), not {scheme}://")
    if len(found) > 1 or found[0] not in POOLERS:
        raise UsageError(f"database URL option pooler={'&pooler='.join(found)}: want "
                         f"pooler=transaction or pooler=session (PgBouncer's pool_mode)")
    return str(found[0])


def without_pooler(url: str) -> str:
    """``url`` without its ``pooler`` option, which is dblockrun's, not the driver's."""
    query = _query(url)
    if not query or not _POOLER.search(query):
        return url
    kept = "&".join(pair for pair in query.split("&") if not pair.startswith("pooler="))
    base = url[:len(url) - len(query) - 1]
    return f"{base}?{kept}" if kept else base


#: The user information of a URL as SQLAlchemy reads it: a user name
#: without ``:``, ``/`` or ``@``, and a password up to the first ``@``
#: (which may hold ``?`` and ``/``).
_USERINFO = re.compile(r"[^:/@]*(?::[^@]*)?@")


def _query(url: str) -> str | None:
    """The query of ``url``: after the first ``?`` past the user information."""
    rest = url.partition("://")[2]
    user = _USERINFO.match(rest)
    _, mark, query = rest[user.end() if user else 0:].partition("?")
    return query if mark else None


def connect_options(dialect: str, pooler: str | None = None,
                    lock_wait: float = DEFAULT_LOCK_WAIT) -> dict[str, Any]:
    """The options of every connection to ``dialect``, pooled or direct,
    through ``pooler`` (:data:`POOLERS`) or not; a statement waits at most
    ``lock_wait`` seconds for a row lock (:func:`lock_wait_for`)."""
    options = dict(CONNECT_OPTIONS[dialect])
    if dialect == "postgresql":
        options["options"] += f" -c lock_timeout={round(lock_wait * 1000)}"
    elif dialect == "mysql":
        # Whole seconds, in the one SET the connection sends anyway: row
        # locks (InnoDB) and table locks (LOCK TABLES, metadata: a year by default).
        wait = max(1, int(lock_wait))
        options["init_command"] += (f", innodb_lock_wait_timeout = {wait}, "
                                    f"lock_wait_timeout = {wait}")
    if pooler is not None:
        # Left to the server: ALTER ROLE ... SET statement_timeout, lock_timeout
        del options["options"]
        if pooler == "transaction":
            options["prepare_threshold"] = None  # psycopg prepares nothing
    return options


#: Run on every new SQLite connection.
SQLITE_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA busy_timeout=15000",
                  "PRAGMA synchronous=NORMAL")

#: URL scheme -> dialect, for the schemes a direct connection serves.
_SCHEMES = {"postgresql": "postgresql", "postgres": "postgresql",
            "postgresql+psycopg": "postgresql", "mysql": "mysql", "mariadb": "mysql",
            "mysql+pymysql": "mysql", "mariadb+pymysql": "mysql", "sqlite": "sqlite"}


class UrlParts(NamedTuple):
    """A database URL's parts, ``scheme://user:password@hosts/database?query``,
    as the pooled engine's SQLAlchemy reads them (tests/test_exec_direct.py
    holds the two to each other); user, password and database still quoted."""

    scheme: str
    user: str | None
    password: str | None
    #: ``host``, ``host:port``, ``[v6]:port`` or a list, ``h1:5441,h2``.
    hosts: str
    #: One host's name and port (None for a list).
    host: str | None
    port: str | None
    database: str | None
    query: str | None


def split_url(url: str) -> UrlParts | None:
    """``url``'s parts, or None for a URL that a direct connection leaves to
    the pooled engine: no ``://``, user information that could be read two
    ways (more than one ``@``, a ``/`` in the user name: write ``%40``,
    ``%2F``), or a malformed host or port. The password runs from the
    user's first ``:`` to the ``@`` and may hold ``/`` and ``?``
    (``u:ab/cd@host``), as SQLAlchemy reads it."""
    scheme, sep, rest = url.partition("://")
    if not sep or rest.count("@") > 1:
        return None
    user = password = None
    if "@" in rest:
        userinfo, _, rest = rest.partition("@")
        user, colon, secret = userinfo.partition(":")
        if "/" in user:
            return None
        password = secret if colon else None
    before, mark, query = rest.partition("?")
    hosts, slash, database = before.partition("/")
    host = port = None
    if "," not in hosts:
        single = _host_port(hosts)
        if single is None:
            return None
        host, port = single
    return UrlParts(scheme, user, password, hosts, host, port, database if slash else None,
                    query if mark else None)


def _host_port(hosts: str) -> tuple[str | None, str | None] | None:
    """One host's name and port (``host:5432``, ``[::1]:5432``, ``host``);
    None when malformed (a port that is not a number)."""
    if hosts.startswith("["):
        host, bracket, after = hosts[1:].partition("]")
        if not host or not bracket or (after and not after.startswith(":")):
            return None
        port = after[1:]
    else:
        host, _, port = hosts.partition(":")
    if port and not (port.isascii() and port.isdigit()):
        return None
    return host or None, port or None


def _unquote(text: str) -> str:
    if "%" not in text:
        return text  # the usual case, without importing urllib.parse
    from urllib.parse import unquote

    return unquote(text)


class Driver:
    """One database kind's driver: opens connections, reads its errors."""

    def __init__(self, dialect: str, connect: Callable[[], Any] | None = None) -> None:
        self.dialect = dialect
        self.connect = connect or _no_connect

    def error_types(self) -> tuple[type[BaseException], ...]:
        if self.dialect == "sqlite":
            import sqlite3

            return (sqlite3.Error,)
        if self.dialect == "postgresql":
            import psycopg

            return (psycopg.Error,)
        import pymysql

        return (pymysql.err.Error,)

    def is_disconnect(self, conn: Any, exc: BaseException) -> bool:
        """The connection died (then one retry on a new one)."""
        if self.dialect == "postgresql":
            return bool(getattr(conn, "broken", False) or getattr(conn, "closed", False))
        if self.dialect == "mysql":
            import pymysql

            if isinstance(exc, pymysql.err.InterfaceError):
                return True
            code = exc.args[0] if exc.args else None
            return isinstance(exc, pymysql.err.OperationalError) and code in (
                2006, 2013, 2014, 2045, 2055)
        return False


def _no_connect() -> Any:
    raise RuntimeError("this driver opens no connections itself (pooled)")


def direct_driver(url: str, lock_wait: float = DEFAULT_LOCK_WAIT) -> Driver | None:
    """A driver that connects without SQLAlchemy for a plain URL (no query
    options but PostgreSQL's ``target_session_attrs`` and ``pooler``, an
    existing SQLite file), else None: the pooled engine serves it."""
    pooler = url_pooler(url)
    parts = split_url(without_pooler(url))
    if parts is None:
        return None
    dialect = _SCHEMES.get(parts.scheme.lower())
    if dialect is None:
        return None
    options = _libpq_options(parts.query) if dialect == "postgresql" else {}
    if options is None or options == {} and parts.query is not None:
        return None
    user, password, database = parts.user, parts.password, parts.database
    host, port = parts.host, parts.port
    if dialect == "sqlite":
        if user is not None or parts.hosts or not database or database == ":memory:":
            return None
        path = os.path.abspath(_unquote(database))
        if not os.path.isfile(path):
            return None  # the pooled store creates it, 0600 in a 0700 folder
        return Driver(dialect, lambda: connect_sqlite(path))
    kw: dict[str, Any] = connect_options(dialect, pooler, lock_wait)
    kw.update(options)
    if user:
        kw["user"] = _unquote(user)
    if password:
        kw["password"] = _unquote(password)
    if dialect == "postgresql" and "," in parts.hosts:
        # libpq's host list (a primary and its standbys): psycopg tries each.
        several = libpq_hosts(parts.hosts)
        if several is None:
            return None
        kw["host"], kw["port"] = several
    if dialect == "mysql" and "," in parts.hosts:
        hosts = mysql_hosts(parts.hosts)
        if hosts is None:
            return None
        if database:
            kw["database"] = _unquote(database)
        return Driver(dialect, lambda: connect_first(_connect_pymysql, hosts, kw))
    if host:
        kw["host"] = host
    if port:
        kw["port"] = int(port)
    if dialect == "postgresql":
        if database:
            kw["dbname"] = _unquote(database)
        return Driver(dialect, lambda: _connect_psycopg(kw))
    if database:
        kw["database"] = _unquote(database)
    return Driver(dialect, lambda: _connect_pymysql(kw))


def connect_sqlite(path: str) -> Any:
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None, **CONNECT_OPTIONS["sqlite"])
    sqlite_setup(conn)
    return conn


def sqlite_setup(conn: Any) -> None:
    cur = conn.cursor()
    for pragma in SQLITE_PRAGMAS:
        cur.execute(pragma)
    cur.close()


def _connect_psycopg(kw: dict[str, Any]) -> Any:
    import psycopg

    return psycopg.connect(autocommit=True, **kw)


def _connect_pymysql(kw: dict[str, Any]) -> Any:
    import pymysql

    return pymysql.connect(autocommit=True, **kw)


# -- several PostgreSQL hosts (a primary and its standbys) --------------------------

#: The query options a direct PostgreSQL connection passes to libpq.
_LIBPQ_OPTIONS = ("target_session_attrs",)
_LIBPQ_HOST = re.compile(r"[A-Za-z0-9._-]+")


def _libpq_options(query: str | None) -> dict[str, str] | None:
    """``target_session_attrs=read-write`` as libpq keywords; {} for no
    query, None for any other option (the pooled engine reads those)."""
    options: dict[str, str] = {}
    for pair in query.split("&") if query else ():
        key, _, value = pair.partition("=")
        if key not in _LIBPQ_OPTIONS or not value:
            return None
        options[key] = _unquote(value)
    return options


def libpq_hosts(text: str) -> tuple[str, str] | None:
    """``h1:5441,h2`` as libpq's ``host`` and ``port`` lists, ``("h1,h2",
    "5441,")`` (an empty port is the default); None for a malformed list."""
    hosts, ports = [], []
    for part in text.split(","):
        host, _, port = part.partition(":")
        if not _LIBPQ_HOST.fullmatch(host) or (port and not port.isdigit()):
            return None
        hosts.append(host)
        ports.append(port)
    return ",".join(hosts), ",".join(ports)


# -- several MySQL/MariaDB hosts (a Galera cluster) ----------------------------------

MYSQL_PORT = 3306


def mysql_hosts(text: str) -> list[tuple[str, int]] | None:
    """``h1:3401,h2,h3:3403`` as ``[(h1, 3401), (h2, 3306), (h3, 3403)]``;
    None when a host is empty or a port is not a number."""
    hosts: list[tuple[str, int]] = []
    for part in text.split(","):
        host, _, port = part.strip().partition(":")
        if not host or (port and not port.isdigit()):
            return None
        hosts.append((host, int(port) if port else MYSQL_PORT))
    return hosts


def connect_first(connect: Callable[[dict[str, Any]], Any], hosts: Sequence[tuple[str, int]],
                  kw: dict[str, Any]) -> Any:
    """A connection to the first of ``hosts`` that takes one, tried in order
    on every connect. A host that is down (refused, unknown, gone, timed out)
    is passed over; any other error (a wrong password) is raised at once."""
    import pymysql

    error: BaseException | None = None
    for host, port in hosts:
        try:
            return connect({**kw, "host": host, "port": port})
        except pymysql.err.OperationalError as exc:
            if not (exc.args and exc.args[0] in _MYSQL_UNREACHABLE):
                raise
            error = exc
    assert error is not None, "no hosts"
    raise error


# -- errors ----------------------------------------------------------------------

#: ER_LOCK_DEADLOCK; PostgreSQL's deadlock_detected and serialization_failure.
_MYSQL_DEADLOCK = 1213
_PG_RETRY = ("40P01", "40001")
#: A row lock waited for past the lock wait: ER_LOCK_WAIT_TIMEOUT;
#: PostgreSQL's lock_not_available (``lock_timeout``).
_MYSQL_LOCK_WAIT = 1205
_PG_LOCK_WAIT = "55P03"
#: MySQL/MariaDB errors retrying cannot fix: access denied (server, database,
#: table), unknown database.
_MYSQL_REFUSED = {1044, 1045, 1049, 1142, 1698}
#: MySQL/MariaDB: --read-only, a read-only transaction, a Galera node not ready.
_MYSQL_READ_ONLY = {1290, 1792, 1836}
_MYSQL_SCHEMA = {1146, 1054}  # no such table, no such column
#: A value out of range: a row edited by hand (a negative token, which
#: LAST_INSERT_ID(expr) cannot take), not an outage.
_MYSQL_BAD_ROW = {1264}
#: Client-side errors of PyMySQL that mean the server is not there.
_MYSQL_UNREACHABLE = {2003, 2005, 2006, 2013}
#: PostgreSQL's connection errors carry no SQLSTATE: these texts say refused.
_PG_REFUSED = ("password authentication failed", "no pg_hba.conf entry",
               "permission denied", "does not exist", "no password supplied")


#: MySQL/MariaDB: the statement was ended by ``KILL QUERY`` (a daemon's
#: request wait woken, dblockrun/store/doorbell.py).
_MYSQL_INTERRUPTED = 1317
#: MySQL/MariaDB: ``KILL QUERY`` of a connection that is gone, or of another
#: user's without the privilege to.
_MYSQL_KILL_REFUSED = {1094, 1095}


def _mysql_code(exc: BaseException) -> object:
    args = getattr(exc, "args", None)
    return args[0] if args else None


def is_interrupted(exc: BaseException) -> bool:
    """MySQL/MariaDB: the statement was ended by ``KILL QUERY``."""
    return _mysql_code(exc) == _MYSQL_INTERRUPTED


def is_kill_refused(exc: BaseException) -> bool:
    """MySQL/MariaDB: a ``KILL QUERY`` that found no such connection, or one
    of another user's without the privilege."""
    return _mysql_code(exc) in _MYSQL_KILL_REFUSED


def is_deadlock(exc: BaseException | None) -> bool:
    """The database rolled the statement back to break a deadlock (or a
    serialization conflict): sending it again is the remedy."""
    if exc is None:
        return False
    if getattr(exc, "sqlstate", None) in _PG_RETRY:
        return True
    args = getattr(exc, "args", None)
    return bool(args) and args[0] == _MYSQL_DEADLOCK  # type: ignore[index]


def is_lock_wait(exc: BaseException | None) -> bool:
    """The statement waited for a row lock another session holds until the
    connection's lock wait ran out (:func:`lock_wait_for`)."""
    if exc is None:
        return False
    if getattr(exc, "sqlstate", None) == _PG_LOCK_WAIT:
        return True
    return _mysql_code(exc) == _MYSQL_LOCK_WAIT


def _kind(orig: BaseException, text: str) -> str:
    """What went wrong, as the one-line outage message says it."""
    code = orig.args[0] if getattr(orig, "args", None) else None
    sqlstate = getattr(orig, "sqlstate", None)
    if is_deadlock(orig):
        return "deadlock"
    if is_lock_wait(orig):
        return "lock-held"
    if isinstance(code, int) and code in _MYSQL_BAD_ROW:
        return "bad-row"
    if (isinstance(code, int) and code in _MYSQL_REFUSED or sqlstate == "42501"
            or sqlstate is None and "FATAL" in text and any(p in text for p in _PG_REFUSED)):
        return "refused"
    if (isinstance(code, int) and code in _MYSQL_READ_ONLY or sqlstate == "25006"
            or "read-only" in text or "readonly database" in text):
        return "read-only"
    if (isinstance(code, int) and code in _MYSQL_SCHEMA or sqlstate in ("42P01", "42703")
            or "no such table" in text or "no such column" in text):
        return "schema"
    if (isinstance(code, int) and code in _MYSQL_UNREACHABLE
            or "connection" in text.lower() or "timeout" in text.lower()
            or "timed out" in text.lower() or "server closed" in text.lower()):
        return "unreachable"
    return "error"


def holder_text(row: Sequence[Any] | None, refused: str | None = None) -> str:
    """The session holding rows, from a row of the dialect's ``held_by``
    (store/queries.py: id, user, when its transaction began), for
    :func:`db_error`; ``refused``: why it could not be read."""
    if row is None:
        return f"which one: {refused}" if refused else "which one: not found"
    session, user, since = row
    from datetime import UTC, datetime

    began = "not visible" if since is None else datetime.fromtimestamp(
        float(since), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"id {session}, user {user or '?'}, since {began}"


def _message(orig: BaseException) -> str:
    """The driver's message on one line: PyMySQL's (code, text) as ``text (code)``."""
    args = getattr(orig, "args", None)
    if args and len(args) == 2 and isinstance(args[0], int) and isinstance(args[1], str):
        return f"{args[1]} (error {args[0]})"
    return str(orig)


#: A startup parameter refused (PgBouncer: ``unsupported startup parameter:
#: options``; a newer one: ``unsupported startup parameter in options: ...``).
_STARTUP_REFUSED = re.compile(r"unsupported startup parameter(?: in options)?: *([\w.-]+)")
#: PostgreSQL's duplicate_prepared_statement and invalid_sql_statement_name:
#: psycopg's prepared statements on a server connection a transaction pooler
#: handed to another client (or took back).
_PG_PREPARED = ("42P05", "26000")


def db_error(exc: BaseException, holder: str | None = None) -> DatabaseError:
    """A driver's (or SQLAlchemy's) error as dblockrun's, with its kind;
    ``holder``: for a lock wait, the session holding the rows, as
    :func:`holder_text` says it."""
    orig = getattr(exc, "orig", None) or exc
    text = " ".join(_message(orig).split())[:500]
    if is_lock_wait(orig):
        holder = holder or "which one: not known"
        return DatabaseError(f"the lock rows are held by another session ({holder}): {text}",
                             kind="lock-held", holder=holder)
    refused = _STARTUP_REFUSED.search(text)
    if refused is not None:
        return SettingRefused(
            f"database refused the connection's startup parameter {refused.group(1)!r} "
            f"({text}): a connection pooler such as PgBouncer accepts only a few; add "
            "?pooler=transaction (or ?pooler=session, as its pool_mode) to the database URL")
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate in _PG_PREPARED or sqlstate is not None and "prepared statement" in text:
        text += (" (a transaction-pooling PgBouncer in the way? add ?pooler=transaction "
                 "to the database URL)")
    kind = _kind(orig, text)
    if kind == "refused":
        return DatabaseRefused(f"database refused: {text}", kind=kind)
    return DatabaseError(f"database error: {text}", kind=kind)
