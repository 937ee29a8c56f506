"""MySQL/MariaDB: `run` and `kill` wake the daemons' request waits
(dblockrun/store/doorbell.py), so a request is picked up within a second
or two although the daemon's bookkeeping round and renewals come far less
often; a requester that may not wake them leaves the request to the round."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import my_admin
from harness import Fleet, Process
from helpers import REPO, Ran, TestDb, clean_env, invoke, wait_for

from dblockrun.store import Store
from dblockrun.store import models as m

JOBS = """\
jobs:
  manual:
    rate: 1d
    command: echo manual
  slow:
    rate: 1d
    command: sleep 300
"""


@pytest.fixture
def my_db(db: TestDb) -> TestDb:
    if db.backend != "mariadb":
        pytest.skip("the request doorbell is MySQL/MariaDB's (PostgreSQL LISTENs)")
    return db


def cli(db: TestDb, url: str, *args: str) -> Ran:
    """In-process (helpers.invoke): the request reaching the real daemon is
    tested, not the operator command's process (0.15-0.5 CPU-s of imports)."""
    return invoke("--db", url, "--table-prefix", db.prefix, *args)


def start(fleet: Fleet, heartbeat: float) -> Process:
    return fleet.start(JOBS, "-v", heartbeat=f"{heartbeat:g}s", lease=f"{3 * heartbeat:g}s",
                       grace=None, name="daemon", cwd=REPO, env=clean_env())


def waiting(store: Store) -> int:
    """Connections in the daemons' request wait."""
    with store.engine.connect() as conn:
        return int(conn.exec_driver_sql(
            "SELECT count(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE "
            f"'SELECT SLEEP(%%/* dblockrun requests {store.prefix} */'").scalar_one())


def first_runs(store: Store) -> None:
    wait_for(lambda: any(r.result == m.OK for r in store.history("manual")) or None, 30,
             what="the first run of manual")
    wait_for(lambda: store.control.running("slow") or None, 30, what="slow running")


def stop(proc: Process) -> float:
    began = time.monotonic()
    assert proc.stop() == 0
    return time.monotonic() - began


def test_run_and_kill_wake_the_daemon_at_once(
        my_db: TestDb, store: Store, tmp_path: Path, fleet: Fleet) -> None:
    """A 30 s heartbeat: the bookkeeping round reads requests every 36 s and
    renewals read kills every 30 s, yet both are picked up within 2 s. The
    daemon's stop ends its wait too (no 10 s wait at shutdown)."""
    proc = start(fleet, 30.0)
    try:
        first_runs(store)
        wait_for(lambda: waiting(store) == 1, 20, what="the daemon waiting for requests")
        began = time.monotonic()
        done = cli(my_db, my_db.url, "run", "manual", "--timeout", "2s")
        assert done.returncode == 0, done.stderr + proc.text()
        assert " started on " in done.stdout
        assert time.monotonic() - began < 10

        (run,) = store.control.running("slow")
        done = cli(my_db, my_db.url, "kill", "slow", "--timeout", "2s")
        assert done.returncode == 0, done.stderr + proc.text()
        ended = store.run(run.id)
        assert ended is not None and ended.result == m.KILLED
    finally:
        took = stop(proc)
    assert took < 5, f"the daemon took {took:.1f}s to stop"


@pytest.fixture
def other_user(my_db: TestDb) -> Iterator[str]:
    """A URL of another user, with every privilege on the test's database
    but none to see or end root's statements (no PROCESS, no SUPER)."""
    user = f"t_{secrets.token_hex(4)}"
    password = secrets.token_hex(8)
    database = my_db.url.rsplit("/", 1)[1]
    with my_admin() as conn, conn.cursor() as cur:
        cur.execute("CREATE USER %s@'127.0.0.1' IDENTIFIED BY %s", (user, password))
        cur.execute(f"GRANT ALL ON `{database}`.* TO %s@'127.0.0.1'", (user,))
    try:
        yield f"mysql://{user}:{password}@127.0.0.1:3306/{database}"
    finally:
        with my_admin() as conn, conn.cursor() as cur:
            cur.execute("DROP USER %s@'127.0.0.1'", (user,))


def test_a_request_the_daemon_cannot_be_woken_for_is_read_by_its_round(
        my_db: TestDb, store: Store, other_user: str, tmp_path: Path, fleet: Fleet) -> None:
    """Another user may not end the daemon's wait: its `run` wakes nobody,
    and the daemon's bookkeeping round (every 2.4 s at a 2 s heartbeat)
    reads the request; its `kill`, the daemon's next renewal."""
    proc = start(fleet, 2.0)
    try:
        first_runs(store)
        wait_for(lambda: waiting(store) == 1, 20, what="the daemon waiting for requests")
        other = Store(other_user, my_db.prefix)
        try:
            assert other.lock_engine().ring() == 0  # it sees no wait it may end
        finally:
            other.close()
        done = cli(my_db, other_user, "run", "manual", "--timeout", "10s")
        assert done.returncode == 0, done.stderr + proc.text()
        (run,) = store.control.running("slow")
        done = cli(my_db, other_user, "kill", "slow", "--timeout", "10s")
        assert done.returncode == 0, done.stderr + proc.text()
        ended = store.run(run.id)
        assert ended is not None and ended.result == m.KILLED
    finally:
        stop(proc)
