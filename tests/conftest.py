"""Real databases for the tests.

Backends come from `--backends` or `DBLOCKRUN_TEST_BACKENDS` (default
`sqlite,postgresql,mariadb`). PostgreSQL and MariaDB each get one fresh
database per test run (`dblockrun_t_<pid>_<hex>`), dropped at the end; tests
keep apart by prefixing their tables with `db.prefix`. SQLite gets a new file
per test.

An unreachable server skips the tests using it, or fails them when `CI=true`
or `DBLOCKRUN_TEST_STRICT=1`: in CI a missing database must never look green.

Tests marked `pgbouncer` also run, when postgresql is selected, on the
backends `pgbouncer-transaction` and `pgbouncer-session`: the same
PostgreSQL database through a PgBouncer of the run's own in that pool mode
(tests/pgbouncer.py; `db.backend` is `postgresql`, its URL has `?pooler=`);
`@pytest.mark.pgbouncer(modes=["session"])` picks the modes.
A pgbouncer that cannot start skips them, or fails them under CI as above.
"""

from __future__ import annotations

import compileall
import logging
import os
import secrets
import subprocess
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cpureport
import harness
import psycopg
import pymysql
import pytest
from harness import Fleet
from helpers import REPO, TestDb, new_prefix
from hooks import Hooks
from pgbouncer import POOL_MODES, Bouncers
from psycopg import sql
from runstores import InMemory, OnDatabase, RoleUnderTest

from dblockrun.store import Store
from dblockrun.store.memory import ManualClock, MemoryRunStore

# The dblockrun processes tests start (`python -m dblockrun`, from a work
# directory of their own) import this checkout, not whichever copy the
# virtualenv's editable install points at (another checkout, a worktree).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])

# Byte-compiled once, into the package's usual __pycache__ (git ignores it),
# as an installed wheel is: with PYTHONDONTWRITEBYTECODE set (CI's, and many
# shells') no process writes .pyc files, so every dblockrun process a test
# starts would compile the package's ~90 modules from source again, a
# quarter of a daemon's start (0.40 against 0.30 CPU-s on PostgreSQL) and
# the suite starts thousands. The variable stops writing, not reading; an
# edited module is compiled again (its .pyc names the source's mtime and
# size). Each xdist worker checks (milliseconds when done); the files are
# written atomically, so workers that race write the same bytes.
compileall.compile_dir(REPO / "dblockrun", quiet=2)

ALL_BACKENDS = ("sqlite", "postgresql", "mariadb")
SERVER_BACKENDS = ("postgresql", "mariadb")
DEFAULT_BACKENDS = ",".join(ALL_BACKENDS)

PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"
PG_ADMIN_DATABASES = ("test", "postgres")
MY_HOST, MY_PORT, MY_USER = "127.0.0.1", 3306, "root"
MY_ADMIN_DATABASE = "test"
CONNECT_TIMEOUT = 5


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backends",
        default=os.environ.get("DBLOCKRUN_TEST_BACKENDS") or DEFAULT_BACKENDS,
        help="comma-separated database backends to test: sqlite,postgresql,mariadb "
        "(default: $DBLOCKRUN_TEST_BACKENDS or all)",
    )


def selected_backends(config: pytest.Config) -> list[str]:
    raw = str(config.getoption("--backends"))
    chosen = [name.strip() for name in raw.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in ALL_BACKENDS]
    if unknown or not chosen:
        raise pytest.UsageError(
            f"--backends / DBLOCKRUN_TEST_BACKENDS: unknown backend(s) {unknown or raw!r}; "
            f"choose from {', '.join(ALL_BACKENDS)}"
        )
    return chosen


def strict() -> bool:
    """Unreachable databases fail instead of skip (always in CI)."""
    return (
        os.environ.get("CI", "").lower() in ("true", "1")
        or os.environ.get("DBLOCKRUN_TEST_STRICT") == "1"
    )


#: Set in an xdist worker by its readline (``80`` and ``24``), not by the user:
#: a table the CLI draws in a test would be cut to 80 columns there only. The
#: workers get the test command's values instead.
TERMINAL_SIZE = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist, before a worker starts: what it is to see of the terminal."""
    node.workerinput["terminal_size"] = {name: os.environ.get(name) for name in TERMINAL_SIZE}


def pytest_configure(config: pytest.Config) -> None:
    selected_backends(config)  # reject a bad list before collecting anything
    cpureport.register(config)
    harness.stop_on_signals()
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        for name, value in workerinput["terminal_size"].items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def pytest_unconfigure(config: pytest.Config) -> None:
    # Interrupted (SIGINT, SIGTERM) or not, no process a test started stays behind.
    harness.reap_all()


def pytest_report_header(config: pytest.Config) -> str:
    mode = "fail" if strict() else "skip"
    return f"dblockrun backends: {','.join(selected_backends(config))} (unreachable: {mode})"


#: Marks of the tests that take tens of seconds or more (real daemons, builds).
LONG_MARKS = ("slow", "image", "package", "docs", "budget")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests first, in their files' order (a stable sort), the quick ones after:
    the workers (pytest-xdist hands tests out in this order) then end together, instead of
    one finishing a soak while the others wait."""
    items.sort(key=lambda item: not any(item.get_closest_marker(name) for name in LONG_MARKS))


#: The backends a test marked `pgbouncer` also runs on (with postgresql).
POOLED_BACKENDS = tuple(f"pgbouncer-{mode}" for mode in POOL_MODES)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        backends = selected_backends(metafunc.config)
        marker = metafunc.definition.get_closest_marker("pgbouncer")
        if "postgresql" in backends and marker is not None:
            modes = marker.kwargs.get("modes", POOL_MODES)  # `@pytest.mark.pgbouncer(modes=[...])`
            backends = [*backends, *(f"pgbouncer-{mode}" for mode in modes)]
        metafunc.parametrize("backend", backends, indirect=True, ids=backends)
    if "run_store_kind" in metafunc.fixturenames:
        # The hot path's role: in memory, and on each selected database.
        kinds = ["memory", *selected_backends(metafunc.config)]
        metafunc.parametrize("run_store_kind", kinds, ids=kinds)


class ServerDatabases:
    """Creates one fresh database per server backend on first use; drops them all."""

    def __init__(self) -> None:
        self.name = f"dblockrun_t_{os.getpid()}_{secrets.token_hex(4)}"
        self._urls: dict[str, str] = {}
        self._errors: dict[str, str] = {}

    def url(self, backend: str) -> str:
        """The URL of this run's database on `backend`; skips/fails if unreachable."""
        if backend not in SERVER_BACKENDS:
            raise ValueError(f"not a server backend: {backend!r}")
        if backend not in self._urls and backend not in self._errors:
            try:
                self._urls[backend] = self._create(backend)
            except Exception as exc:  # any driver error means "unreachable"
                self._errors[backend] = f"{type(exc).__name__}: {exc}".strip()
        if backend in self._errors:
            reason = f"{backend} test database unavailable: {self._errors[backend]}"
            if strict():
                pytest.fail(f"{reason} (CI/DBLOCKRUN_TEST_STRICT: not skipping)", pytrace=False)
            pytest.skip(reason)
        return self._urls[backend]

    def _create(self, backend: str) -> str:
        if backend == "postgresql":
            with pg_admin() as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
            return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.name}"
        with my_admin() as my_conn, my_conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4")
        return f"mysql://{MY_USER}@{MY_HOST}:{MY_PORT}/{self.name}"

    def drop_all(self) -> None:
        if "postgresql" in self._urls:
            with pg_admin() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (self.name,)
                ).fetchone()
                warn_leaks("postgresql", self.name, row[0] if row else 0)
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(self.name)
                    )
                )
        if "mariadb" in self._urls:
            with my_admin() as my_conn, my_conn.cursor() as cur:
                cur.execute(
                    "SELECT id FROM information_schema.processlist"
                    " WHERE db = %s AND id <> connection_id()",
                    (self.name,),
                )
                leaked = [int(row[0]) for row in cur.fetchall()]
                warn_leaks("mariadb", self.name, len(leaked))
                for thread_id in leaked:  # a leaked open transaction would block the DROP
                    try:
                        cur.execute(f"KILL {thread_id}")
                    except pymysql.MySQLError:
                        pass  # already gone
                cur.execute(f"DROP DATABASE IF EXISTS `{self.name}`")


def warn_leaks(backend: str, name: str, count: int) -> None:
    if count:
        warnings.warn(
            f"{count} connection(s) to {backend} database {name} still open at the end "
            "of the test session: a test or fixture leaked them",
            pytest.PytestWarning,
            stacklevel=2,
        )


def pg_admin() -> psycopg.Connection[Any]:
    error: Exception | None = None
    for dbname in PG_ADMIN_DATABASES:
        try:
            return psycopg.connect(
                host=PG_HOST,
                port=PG_PORT,
                user=PG_USER,
                dbname=dbname,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT,
            )
        except psycopg.OperationalError as exc:
            error = exc
    assert error is not None
    raise error


def my_admin() -> pymysql.connections.Connection[Any]:
    return pymysql.connect(
        host=MY_HOST,
        port=MY_PORT,
        user=MY_USER,
        password="",
        database=MY_ADMIN_DATABASE,
        autocommit=True,
        connect_timeout=CONNECT_TIMEOUT,
    )


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


@pytest.fixture(scope="session")
def server_databases() -> Iterator[ServerDatabases]:
    """This run's PostgreSQL/MariaDB databases, created lazily, dropped at the end."""
    databases = ServerDatabases()
    yield databases
    databases.drop_all()


@pytest.fixture(scope="session")
def bouncers() -> Iterator[Bouncers]:
    """This run's PgBouncers in front of the test PostgreSQL, started lazily."""
    running = Bouncers(PG_HOST, PG_PORT, PG_USER)
    yield running
    running.stop()


def pooled_url(bouncers: Bouncers, server_databases: ServerDatabases, mode: str) -> str:
    """The run's PostgreSQL database through the PgBouncer in ``mode``;
    skips (fails under CI) when it cannot start."""
    direct = server_databases.url("postgresql")
    try:
        return bouncers.get(mode).url(direct)
    except RuntimeError as exc:
        if strict():
            pytest.fail(f"{exc} (CI/DBLOCKRUN_TEST_STRICT: not skipping)", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def session_db_url(
    tmp_path_factory: pytest.TempPathFactory, server_databases: ServerDatabases
) -> Callable[[str], str]:
    """`session_db_url(backend) -> url`: the database shared by the whole run.

    SQLite: one file in a per-session temporary directory.
    """
    sqlite_file = tmp_path_factory.mktemp("sqlite-session") / "test.db"

    def url(backend: str) -> str:
        if backend == "sqlite":
            return sqlite_url(sqlite_file)
        return server_databases.url(backend)

    return url


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test: `sqlite`, `postgresql` or `mariadb` (parametrized)."""
    if not hasattr(request, "param"):
        raise pytest.UsageError("the `backend` fixture is parametrized by conftest only")
    return str(request.param)


@pytest.fixture
def db(backend: str, tmp_path: Path, server_databases: ServerDatabases,
       request: pytest.FixtureRequest) -> TestDb:
    """A database on each selected backend; a fresh file per test for SQLite."""
    if backend == "sqlite":
        return TestDb("sqlite", sqlite_url(tmp_path / "dblockrun.db"), new_prefix())
    if backend in POOLED_BACKENDS:
        mode = backend.removeprefix("pgbouncer-")
        url = pooled_url(request.getfixturevalue("bouncers"), server_databases, mode)
        return TestDb("postgresql", url, new_prefix())
    return TestDb(backend, server_databases.url(backend), new_prefix())


@pytest.fixture
def sqlite_db(tmp_path: Path) -> TestDb:
    """A fresh SQLite database, for tests that need no server backend."""
    return TestDb("sqlite", sqlite_url(tmp_path / "dblockrun.db"), new_prefix())


@pytest.fixture
def store(db: TestDb) -> Iterator[Store]:
    """A Store on the test's database and table prefix; like dblockrun itself
    it creates the schema on first use."""
    s = Store(db.url, db.prefix)
    yield s
    s.close()


@pytest.fixture
def run_store(run_store_kind: str, tmp_path: Path,
              request: pytest.FixtureRequest) -> Iterator[RoleUnderTest]:
    """The hot path's role (tests/runstores.py) in memory on a clock the
    test moves, or on a real database (a fresh prefix; SQLite: a file)."""
    if run_store_kind == "memory":
        role: RoleUnderTest = InMemory()
    elif run_store_kind == "sqlite":
        role = OnDatabase("sqlite", sqlite_url(tmp_path / "dblockrun.db"), new_prefix())
    else:
        databases: ServerDatabases = request.getfixturevalue("server_databases")
        role = OnDatabase(run_store_kind, databases.url(run_store_kind), new_prefix())
    yield role
    role.close()


@pytest.fixture
def memory_store() -> MemoryRunStore:
    """The hot path's role in memory, on a :class:`ManualClock` (``.clock``)."""
    return MemoryRunStore(ManualClock())


@pytest.fixture(autouse=True)
def root_log_level() -> Iterator[None]:
    """The root logger's level as each test found it: a command run in-process
    (CliRunner) sets it (dblockrun.logs.setup), and a later test on the same
    worker that reads dblockrun's warnings with caplog saw none (the order of
    tests on an xdist worker is not the file's)."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


def fleet_timing(request: pytest.FixtureRequest) -> dict[str, str]:
    """The daemons' --heartbeat/--lease/--grace a test's ``fleet_timing`` mark sets (the
    harness's defaults otherwise: 1 s heartbeats, 6 s leases, 5 s grace)."""
    mark = request.node.get_closest_marker("fleet_timing")
    return dict(mark.kwargs) if mark is not None else {}


@pytest.fixture
def fleet(db: TestDb, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """Real daemons on the test's database (tests/harness.py), killed at the end if still up;
    a test that measures a lease or heartbeat says which (``fleet_timing``)."""
    daemons = Fleet(db, tmp_path, **fleet_timing(request))
    yield daemons
    daemons.close()


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    """An HTTP server recording what daemons send: notifications, pings (tests/hooks.py)."""
    h = Hooks()
    yield h
    h.server.shutdown()


@pytest.fixture
def sqlite_fleet(sqlite_db: TestDb, tmp_path: Path,
                 request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """:func:`fleet` on SQLite only, for behaviour that does not depend on the database."""
    daemons = Fleet(sqlite_db, tmp_path, **fleet_timing(request))
    yield daemons
    daemons.close()


@pytest.fixture
def system_user() -> Iterator[str]:
    """A new system user (and its group, ``<user>g``), removed at the end; root only."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a user and switch to it")
    name = f"dbrt{secrets.token_hex(3)}"
    group = f"{name}g"
    subprocess.run(["groupadd", group], check=True)
    subprocess.run(["useradd", "--create-home", "--groups", group, "--shell", "/bin/sh", name],
                   check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
        subprocess.run(["groupdel", group], check=False, capture_output=True)
