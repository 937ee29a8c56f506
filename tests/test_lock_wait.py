"""Rows another session holds (issue 36 item 14): on MariaDB a user granted
only SELECT may ``SELECT ... FOR UPDATE`` the lock rows and hold them. The
daemons waited on them as long as the driver let them (50 s of InnoDB's
wait, cut at 15 s by the client's read timeout), then logged an unreachable
database. Now each statement waits a quarter of the lease at most, the log
and ``status --check`` name the session holding the rows, and the fleet
carries on within seconds once they are free. A running job whose lease
cannot be renewed is still stopped: never two at once comes first.

Real daemons and a real second account: on MariaDB granted SELECT only; on
PostgreSQL (where SELECT alone may not lock rows) granted UPDATE."""

from __future__ import annotations

import re
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pymysql
import pytest
from helpers import REPO, Ran, TestDb, clean_env, dblockrun_cmd, invoke, wait_for

from dblockrun.store import Store
from dblockrun.store import models as m

JOBS = """\
jobs:
  tick:
    cron: "* * * * * *"
    command: echo tick
  long:
    rate: 1h
    command: echo started; exec sleep 60
"""

#: How long the other session holds the rows.
HOLD = 8.0
LOG_TIME = re.compile(r"^(\S+) ", re.M)


@dataclass
class Reader:
    """The other account's session: its id as the server names it, its
    user, and the thread holding the rows until :attr:`release` is set."""

    session: int
    user: str
    release: threading.Event
    thread: threading.Thread
    released_at: float = 0.0


def _mariadb_reader(db: TestDb) -> Iterator[tuple[Any, str]]:
    """A connection of a new MariaDB user granted SELECT only on the test
    database (dropped at the end), and its user name."""
    database = urlsplit(db.url).path.lstrip("/")
    user, password = f"r{db.prefix.strip('_')}", secrets.token_hex(8)
    admin = pymysql.connect(host="127.0.0.1", port=3306, user="root", password="",
                            autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'")
            cur.execute(f"GRANT SELECT ON `{database}`.* TO '{user}'@'%'")
        conn = pymysql.connect(host="127.0.0.1", port=3306, user=user, password=password,
                               database=database, autocommit=False)
        try:
            yield conn, user
        finally:
            conn.close()
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{user}'@'%'")
        admin.close()


def _postgres_reader(db: TestDb) -> Iterator[tuple[Any, str]]:
    """A connection of a new PostgreSQL role granted SELECT and UPDATE on
    the lock table (dropped at the end), and its name; a role with SELECT
    alone is refused the row locks (checked here too)."""
    user, password = f"r{db.prefix.strip('_')}", secrets.token_hex(8)
    locks = f"{db.prefix}locks"
    with Store(db.url, db.prefix) as store:  # the tables to grant on
        store.ensure_schema()
    with psycopg.connect(db.url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
        try:
            admin.execute(f"GRANT SELECT ON {locks} TO {user}")
            parts = urlsplit(db.url)
            conninfo = (f"host=127.0.0.1 port=5432 dbname={parts.path.lstrip('/')} "
                        f"user={user} password={password}")
            with psycopg.connect(conninfo) as select_only:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    select_only.execute(f"SELECT name FROM {locks} FOR UPDATE")
            admin.execute(f"GRANT UPDATE ON {locks} TO {user}")
            conn = psycopg.connect(conninfo)
            try:
                yield conn, user
            finally:
                conn.close()
        finally:
            admin.execute(f"DROP OWNED BY {user}")
            admin.execute(f"DROP ROLE {user}")


def _hold(conn: Any, db: TestDb, user: str) -> Reader:
    """``BEGIN; SELECT name FROM locks FOR UPDATE`` in ``conn``, held in a
    thread until released (then committed)."""
    ready = threading.Event()
    release = threading.Event()
    found: dict[str, int] = {}

    def hold() -> None:
        cur = conn.cursor()
        cur.execute("SELECT CONNECTION_ID()" if db.backend == "mariadb"
                    else "SELECT pg_backend_pid()")
        found["session"] = int(cur.fetchone()[0])
        cur.execute(f"SELECT name FROM {db.prefix}locks FOR UPDATE")
        cur.fetchall()
        ready.set()
        release.wait(60)
        reader.released_at = time.time()
        conn.commit()
        cur.close()

    thread = threading.Thread(target=hold, daemon=True)
    reader = Reader(0, user, release, thread)
    thread.start()
    assert ready.wait(30), "the other session could not lock the rows"
    reader.session = found["session"]
    return reader


@pytest.fixture
def other_account(db: TestDb) -> Iterator[tuple[Any, str]]:
    if db.backend == "mariadb":
        yield from _mariadb_reader(db)
    elif db.backend == "postgresql":
        yield from _postgres_reader(db)
    else:
        pytest.skip("SQLite has one host's sessions only; a writer waits busy_timeout")


def cli(db: TestDb, *args: str) -> Ran:
    """In-process (helpers.invoke): what status --check finds is tested, not
    its process (0.15-0.5 CPU-s of imports each, polled here)."""
    return invoke("--db", db.url, "--table-prefix", db.prefix, *args)


def _log_times(text: str, needle: str) -> list[float]:
    return [datetime.fromisoformat(m[1]).timestamp()
            for line in text.splitlines() if needle in line
            for m in [LOG_TIME.match(line)] if m]


@pytest.mark.slow
def test_rows_held_by_another_account_are_named_and_the_fleet_carries_on(
        db: TestDb, tmp_path: Path, other_account: tuple[Any, str]) -> None:
    conn, user = other_account
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    log = tmp_path / "daemon.log"
    # --lease 4s: a statement waits for a held row at most 1 s (a quarter).
    daemon = subprocess.Popen(
        [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "daemon", str(jobs),
         "--heartbeat", "1s", "--lease", "4s", "--grace", "0s"],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=clean_env(), cwd=REPO)
    store = Store(db.url, db.prefix)
    reader: Reader | None = None
    try:
        (running,) = wait_for(lambda: store.control.running("long") or None, 30,
                              what="the long job running")
        wait_for(lambda: any(r.result == m.OK for r in store.history("tick")), 30,
                 what="a run of tick")
        reader = _hold(conn, db, user)
        held_at = time.time()
        holder = rf"id {reader.session}, user {re.escape(user)}\S*, since \S+Z"
        check = wait_for(lambda: c if (c := cli(db, "status", "--check")).returncode == 1
                         and "held by another session" in c.stdout else None, 20,
                         what="status --check to see the held rows")
        assert re.search(rf"^problem: the lock rows are held by another session \({holder}\): ",
                         check.stdout, re.M), check.stdout
        wait_for(lambda: time.time() - held_at >= HOLD, HOLD + 5, what="the hold")
        reader.release.set()
        reader.thread.join(30)
        released = reader.released_at
        # Within seconds of the release, tick runs again.
        again = wait_for(lambda: next((r for r in store.history("tick", 5)
                                       if r.started > released and r.result == m.OK), None),
                         15, what="tick running again after the release")
        assert again.started - released < 5.0, again.started - released
        lost = wait_for(lambda: r if (r := store.run(running.id)) and r.finished else None, 30,
                        what="the long run's record")
    finally:
        if reader is not None:
            reader.release.set()
            reader.thread.join(30)
        store.close()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    text = log.read_text()
    # Named for what it is, in the log: not an unreachable database.
    assert re.search(rf"ERROR database lock wait \(\S[^)]*\): the lock rows are held by another "
                     rf"session \({holder}\): ", text), text
    assert "database unreachable" not in text and "Lost connection" not in text, text
    # Each statement waited about its lock wait, not 15 s: the first line
    # came within a heartbeat and a wait of the hold.
    first = min(_log_times(text, "database lock wait"))
    assert first - held_at < 4.0, first - held_at
    # Said once per holding session (and once more when free), not once per statement.
    assert text.count("database lock wait") <= 3, text
    # Never two at once comes first: the run whose lease could not be
    # renewed was stopped, and says why.
    assert lost.result in (m.KILLED, m.LOST), lost
    if lost.result == m.KILLED:
        assert "lease could not be renewed before it expired" in (lost.output or ""), lost


def test_a_transaction_in_another_database_on_the_server_is_not_named(
        db: TestDb, other_account: tuple[Any, str]) -> None:
    """MariaDB: InnoDB does not say which table a transaction's row locks
    are on, so the holder named is looked for among the sessions using the
    fleet's database: another application's older transaction elsewhere on
    the same server is no suspect (before, the oldest on the server was
    named, whatever its database)."""
    if db.backend != "mariadb":
        pytest.skip("PostgreSQL names the holder from pg_locks, by table")
    conn, user = other_account
    with Store(db.url, db.prefix) as store:
        store.ensure_schema()
        store.ensure_jobs(["tick"])
    elsewhere = pymysql.connect(host="127.0.0.1", port=3306, user="root", password="",
                                database="test", autocommit=False)
    table = f"elsewhere_{db.prefix.strip('_')}"
    reader: Reader | None = None
    try:
        with elsewhere.cursor() as cur:
            cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)")
            cur.execute(f"INSERT INTO {table} VALUES (1)")
            elsewhere.commit()
            cur.execute(f"SELECT id FROM {table} FOR UPDATE")  # older, and on
        reader = _hold(conn, db, user)  # the fleet's rows
        check = cli(db, "status", "--check")
        assert check.returncode == 1, check.stdout
        assert re.search(rf"^problem: the lock rows are held by another session "
                         rf"\(id {reader.session}, user {re.escape(user)}\S*, ",
                         check.stdout, re.M), check.stdout
    finally:
        if reader is not None:
            reader.release.set()
            reader.thread.join(30)
        elsewhere.rollback()
        with elsewhere.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {table}")
        elsewhere.close()


def test_the_lock_wait_is_a_quarter_of_the_lease_set_once_per_connection() -> None:
    """Decided in one place (store/drivers.py) and sent with what every
    connection sends anyway: PostgreSQL's start-up options, MariaDB's one
    ``init_command``; none through a pooler (left to ALTER ROLE, as the
    statement timeout is)."""
    from dblockrun.store.drivers import connect_options, lock_wait_for

    assert [lock_wait_for(lease) for lease in (2, 4, 30, 60, 600)] == [1, 1, 7.5, 10, 10]
    assert connect_options("postgresql", lock_wait=2.5)["options"] == (
        "-c statement_timeout=15000 -c lock_timeout=2500")
    assert connect_options("mysql", lock_wait=7.5)["init_command"] == (
        "SET time_zone = '+00:00', innodb_lock_wait_timeout = 7, lock_wait_timeout = 7")
    assert "options" not in connect_options("postgresql", "session", 2.5)


def test_a_daemon_sends_no_statement_more_for_its_lock_wait(db: TestDb, tmp_path: Path) -> None:
    """The session's lock wait rides on the connection's set-up: a
    daemon's connection to MariaDB reads it, no statement sets it."""
    if db.backend == "sqlite":
        pytest.skip("SQLite: busy_timeout, one host")
    from dblockrun.store.drivers import lock_wait_for

    store = Store(db.url, db.prefix, lock_wait=lock_wait_for(4.0))
    try:
        before = store.statements
        sql = ("SELECT @@innodb_lock_wait_timeout" if db.backend == "mariadb"
               else "SELECT current_setting('lock_timeout')")
        got = store.x.run(lambda cur: store.x.send(cur, sql).fetchone()[0])
        assert store.statements == before + 1  # the read itself
        assert str(got) in ("1", "1s")
    finally:
        store.close()
