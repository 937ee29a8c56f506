"""Where the database is: URL resolution and driver mapping (a URL's password
is hidden by :func:`dblockrun.redact.url`).

Order: ``--db``, ``--db-file``, ``DBLOCKRUN_DB``, ``DBLOCKRUN_DB_FILE``,
``database:`` in the jobs file, ``database-file:`` in the jobs file, then the
embedded SQLite file under ``$XDG_STATE_HOME/dblockrun/``. A file holds the
URL on its first line (a secret mounted by systemd or Kubernetes; read by
:mod:`dblockrun.secretfile`); its content is never shown, not even in errors.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from dblockrun.errors import UsageError
from dblockrun.redact import url as redact
from dblockrun.secretfile import first_line

if TYPE_CHECKING:
    from pathlib import Path

#: URL scheme -> SQLAlchemy driver (the part before ``+`` is the dialect).
DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mysql+pymysql",
    "mysql+pymysql": "mysql+pymysql",
    "mariadb+pymysql": "mysql+pymysql",
    "sqlite": "sqlite",
}

_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$", re.S)


def default_sqlite_path() -> str:
    # os.path, not pathlib: exec resolves this on every start (pathlib and
    # what it imports cost a few ms). Path.home() raises when there is no home.
    state = os.environ.get("XDG_STATE_HOME")
    if not state:
        home = os.path.expanduser("~")
        if home == "~":
            raise RuntimeError("Could not determine home directory.")
        state = os.path.join(home, ".local", "state")
    return os.path.join(state, "dblockrun", "dblockrun.db")


def resolve_url(
    cli_db: str | None,
    file_db: str | None,
    *,
    cli_db_file: str | None = None,
    file_db_file: str | None = None,
) -> str:
    """The database URL the user asked for, by the documented precedence.

    ``cli_*`` come from the command line, ``file_*`` from the jobs file
    (``database:``, ``database-file:``); the environment sits between them.
    """
    candidates: tuple[tuple[str, str | None, bool], ...] = (
        ("--db", cli_db, False),
        ("--db-file", cli_db_file, True),
        ("DBLOCKRUN_DB", os.environ.get("DBLOCKRUN_DB"), False),
        ("DBLOCKRUN_DB_FILE", os.environ.get("DBLOCKRUN_DB_FILE"), True),
        ("database:", file_db, False),
        ("database-file:", file_db_file, True),
    )
    for source, candidate, is_file in candidates:
        if candidate is None:
            continue
        if not candidate.strip():
            # An empty value is a mistake (an unset shell variable, a blank
            # secret), never a request for the local default file.
            want = "the file holding the database URL" if is_file else "a database URL"
            if source.startswith("DBLOCKRUN_"):
                raise UsageError(f"{source} is set but empty: give {want}, or unset it")
            raise UsageError(f"{source} is empty: give {want}")
        return read_url_file(candidate) if is_file else candidate
    return default_url()


#: The jobs file operator commands read when given none: set by the
#: systemd unit and the Kubernetes example, so that ``dblockrun disable JOB``
#: typed on a fleet host reaches the fleet's database.
JOBS_ENV = "DBLOCKRUN_JOBS"
DEFAULT_JOBS_FILE = "/etc/dblockrun/jobs.yaml"


def jobs_file(given: str | None) -> tuple[str | None, bool]:
    """The jobs file to read, and whether the user named it: ``-f FILE``,
    else ``DBLOCKRUN_JOBS``, else ``/etc/dblockrun/jobs.yaml`` if it exists."""
    if given is not None and not given.strip():
        raise UsageError("-f is empty: give a jobs file")
    if given is not None:
        return given, True
    env = os.environ.get(JOBS_ENV)
    if env is not None:
        if not env.strip():
            raise UsageError(f"{JOBS_ENV} is set but empty: give a jobs file, or unset it")
        return env, True
    if os.path.isfile(DEFAULT_JOBS_FILE):
        return DEFAULT_JOBS_FILE, False
    return None, False


def url_needs_jobs_file(cli_db: str | None, cli_db_file: str | None) -> bool:
    """Whether the URL would come from the jobs file (or the default): nothing
    on the command line or in the environment names the database."""
    return (cli_db is None and cli_db_file is None
            and os.environ.get("DBLOCKRUN_DB") is None
            and os.environ.get("DBLOCKRUN_DB_FILE") is None)


def read_url_file(path: str) -> str:
    """The URL on the first line of ``path`` (a regular file: dblockrun/secretfile.py);
    errors name the file, never its content."""
    try:
        url = first_line(path, "database file")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not url:
        raise UsageError(f"database file {path}: the first line is empty (want a database URL)")
    if not _URL.match(url):
        raise UsageError(
            f"database file {path}: the first line is not a database URL "
            "(e.g. postgresql://user:password@host/db)"
        )
    return url


def driver_url(url: str) -> str:
    """Map a user URL to the SQLAlchemy URL with our chosen driver (without
    dblockrun's own option, ``pooler``: :func:`~dblockrun.store.drivers.url_pooler`)."""
    from dblockrun.store.drivers import url_pooler, without_pooler

    url_pooler(url)  # a bad value is a usage error here, not the driver's
    url = without_pooler(url)
    match = _URL.match(url)
    if not match:
        raise UsageError(f"database URL {redact(url)!r} is not a URL (e.g. postgresql://host/db)")
    scheme = match.group("scheme").lower()
    if scheme not in DRIVERS:
        known = "postgresql://, mysql://, mariadb://, sqlite:///path"
        raise UsageError(f"database URL scheme {scheme!r} is not supported (use {known})")
    rest = match.group("rest")
    if DRIVERS[scheme] != "sqlite" and rest.partition("?")[0].count("@") > 1:
        # The driver would take what follows the first '@' for the host, and
        # name it (the rest of the password) in its errors.
        raise UsageError(f"database URL {redact(url)!r}: write an '@' in the user name or "
                         "password as %40")
    result = f"{DRIVERS[scheme]}://{rest}"
    if DRIVERS[scheme] == "mysql+pymysql":
        result = _first_mysql_host(url, match.group("rest")) or result
    if DRIVERS[scheme] == "postgresql+psycopg":
        result = _pg_several_hosts(url, match.group("rest")) or result
    # SQLAlchemy parses the URL only when the engine is made; a bad port or
    # host would surface there as a bare ValueError and a traceback.
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(result)
    except (ValueError, ArgumentError):
        raise UsageError(
            f"database URL {redact(url)!r} is not a valid URL (check the host and port)"
        ) from None
    return result


# A MySQL URL's parts: user information (the password may hold '/'), the
# host list, the rest (``/database?query``).
_MYSQL_PARTS = re.compile(r"^(?P<user>(?:[^:/@]*:[^@]*|[^:/@]*)@)?(?P<hosts>[^/?]*)(?P<tail>.*)$",
                          re.S)


def mysql_nodes(url: str) -> list[tuple[str, int]] | None:
    """The hosts of a MySQL/MariaDB URL with several,
    ``mysql://u@h1:3401,h2:3402/db`` (a Galera cluster's nodes, tried in
    order on each connect: dblockrun/store/mysqlhosts.py); None for any other URL."""
    match = _URL.match(url)
    if not match or DRIVERS.get(match.group("scheme").lower()) != "mysql+pymysql":
        return None
    parts = _MYSQL_PARTS.match(match.group("rest"))
    if parts is None or "," not in parts.group("hosts"):
        return None
    from dblockrun.store.drivers import mysql_hosts

    hosts = mysql_hosts(parts.group("hosts"))
    if hosts is None or any(h.startswith("[") for h, _ in hosts):
        raise UsageError(f"database URL {redact(url)!r}: bad host list (want host:port,host:port)")
    return hosts


def _first_mysql_host(url: str, rest: str) -> str | None:
    """A URL with several hosts as the PyMySQL URL of its first (the pooled
    engine tries the others: dblockrun/store/mysqlhosts.py); None for one host."""
    hosts = mysql_nodes(url)
    parts = _MYSQL_PARTS.match(rest)
    if hosts is None or parts is None:
        return None
    host, port = hosts[0]
    return f"mysql+pymysql://{parts.group('user') or ''}{host}:{port}{parts.group('tail')}"


_PG_HOST = re.compile(r"[A-Za-z0-9._-]+(?::[0-9]+)?")


def _pg_several_hosts(url: str, rest: str) -> str | None:
    """libpq's multi-host URL, ``postgresql://u@h1:5441,h2:5442/db?target_session_attrs=read-write``
    (a primary and its standbys: each connect tries them in order and keeps the
    first that takes writes), in the form SQLAlchemy's psycopg dialect reads:
    ``postgresql+psycopg://u@/db?host=h1:5441&host=h2:5442&target_session_attrs=read-write``.
    None for a URL with one host."""
    parts = _MYSQL_PARTS.match(rest)  # user information, host list, rest: split alike
    if parts is None or "," not in parts.group("hosts"):
        return None
    hosts = parts.group("hosts").split(",")
    if not all(_PG_HOST.fullmatch(host) for host in hosts):
        raise UsageError(f"database URL {redact(url)!r}: bad host list (want host:port,host:port)")
    database, _, query = parts.group("tail").partition("?")
    given = "&".join(f"host={host}" for host in hosts)
    return (f"postgresql+psycopg://{parts.group('user') or ''}{database or '/'}"
            f"?{given}{'&' + query if query else ''}")


def dialect_of(url: str) -> str:
    """``sqlite``, ``postgresql`` or ``mysql``."""
    return driver_url(url).split("+")[0].split(":")[0]


def sqlite_path(url: str) -> Path | None:
    """The file of a sqlite URL, or None for memory or other databases."""
    from pathlib import Path

    if dialect_of(url) != "sqlite":
        return None
    path = driver_url(url)[len("sqlite:///") :].split("?")[0]
    return Path(path) if path and path != ":memory:" else None


def prepare_sqlite_file(url: str) -> None:
    """Create the folder of a SQLite file private to the user (0700, and so
    each missing folder above it, whatever the umask), file 0600."""
    path = sqlite_path(url)
    if path is None:
        return
    missing = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile by another process: its mode is its own
        folder.chmod(0o700)  # mkdir's mode is filtered by the umask: 000 gave 0777
    if not path.exists():
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


def missing_sqlite_file(url: str) -> str | None:
    """Why the SQLite file of ``url`` is not there (None if it is, or ``url``
    is no SQLite file): for commands that must not create it."""
    path = sqlite_path(url)
    if path is None or path.exists():
        return None
    relative = "" if path.is_absolute() else (
        f" (sqlite:///{path} is relative to the current folder; "
        "sqlite:////PATH with four slashes is absolute)")
    folder = path.absolute().parent
    if not folder.is_dir():
        return f"no folder {folder}{relative}"
    return f"no file {path.absolute()}{relative}" if relative else "no such file"


def default_url() -> str:
    """The embedded SQLite database, used when nothing names one."""
    return f"sqlite:///{default_sqlite_path()}"


def describe(url: str, prefix: str, default_prefix: str = "dblockrun_") -> str:
    """The database as messages name it: the URL without its password, and
    the table prefix unless it is the default."""
    shown = redact(url)
    return shown if prefix == default_prefix else f"{shown} (table prefix {prefix})"


#: A table prefix: lower-case letters, digits and '_', starting with a letter
#: or '_'. Lower case: PostgreSQL folds unquoted names, MySQL compares them by
#: the file system. Short enough for the longest table, index and sequence
#: name to fit PostgreSQL's 63 and MySQL's 64 characters.
TABLE_PREFIX = re.compile(r"[a-z_][a-z0-9_]*")
MAX_PREFIX = 40


def check_prefix(prefix: str) -> str:
    """``prefix`` if it can start dblockrun's table names, else UsageError."""
    if not TABLE_PREFIX.fullmatch(prefix) or len(prefix) > MAX_PREFIX:
        raise UsageError(
            f"bad table prefix {prefix[:60]!r}: use lower-case letters, digits and '_', "
            f"starting with a letter or '_' (at most {MAX_PREFIX})"
        )
    return prefix


def password_in_argv(db: str | None) -> str | None:
    """The warning that ``--db`` (``db``) holds a password, visible in ``ps``
    to every local user; None when it holds none. Said once per process,
    by both command-line paths (dblockrun/cli.py and the plain ``exec``)."""
    if db is None or redact(db) == db:
        return None
    return ("dblockrun: warning: --db holds a password, which every local user can "
            "read with ps: give the URL in DBLOCKRUN_DB or a file (--db-file)")
