"""`dblockrun exec` over a direct driver connection (sqlite3, psycopg,
PyMySQL; no SQLAlchemy): the lock engine's own statements, so the same rows,
tokens and results as the daemon's pooled Store, on every backend."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pymysql
import pytest
from helpers import TestDb, dblockrun_cmd, wait_for
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from dblockrun.errors import DatabaseError, SchemaTooNew
from dblockrun.running.execlock import ExecTarget
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.drivers import direct_driver, split_url
from dblockrun.store.engine import Claim, LockEngine
from dblockrun.store.executor import DirectExecutor

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(store: Store) -> Store:
    """conftest's store, with the schema created before the test."""
    store.ensure_schema()
    return store


@pytest.fixture
def direct(db: TestDb, store: Store) -> Iterator[LockEngine]:
    driver = direct_driver(db.url)
    assert driver is not None
    engine = LockEngine(DirectExecutor(driver), db.prefix)
    yield engine
    engine.close()


def _target(db: TestDb, prefix: str | None = None) -> ExecTarget:
    return ExecTarget(db.url, prefix or db.prefix)


def test_direct_only_for_a_plain_url_and_prefix(db: TestDb, store: Store) -> None:
    assert direct_driver(db.url) is not None
    assert direct_driver(db.url + "?x=1") is None  # options: the pool's SQLAlchemy reads them
    assert direct_driver("sqlite:////nonexistent/x.db") is None  # Store creates the file
    odd = _target(db, "Odd-Prefix_")
    try:
        assert odd.engine is odd.store().lock  # a prefix that needs quoting: through Store
    finally:
        odd.close()


def same_as_sqlalchemy(url: str) -> bool:
    """``url`` split as the pooled engine's SQLAlchemy reads it (one host),
    or left to the pooled engine (None)."""
    from urllib.parse import unquote

    parts = split_url(url)
    if parts is None or "," in parts.hosts:
        return True
    try:
        want = make_url(url)
    except ValueError:
        return True  # a port that is not a number: the direct path declines it too
    got = (parts.scheme,
           None if parts.user is None else unquote(parts.user),
           None if parts.password is None else unquote(parts.password),
           parts.host, None if parts.port is None else int(parts.port),
           None if parts.database is None else unquote(parts.database))
    return got == (want.drivername, want.username, want.password, want.host, want.port,
                   want.database)


@pytest.mark.parametrize("url", [
    "postgresql://u:p@h:5432/db", "postgresql://u:ab/cd@h/db", "mysql://u:p%40ss@h/db",
    "mysql://u:p?x@h/db", "mysql://u?x@h/db", "mysql://u@h", "mysql://h:3306/db?charset=x",
    "postgresql://[::1]:5432/db", "postgresql://u@/db", "postgresql://u@h/d%2Fb",
    "postgresql://:5432/db", "sqlite:///rel/x.db", "sqlite:////abs/x.db", "sqlite://",
    "sqlite:///:memory:", "postgresql://h/db?target_session_attrs=read-write",
])
def test_a_url_is_read_as_sqlalchemy_reads_it(url: str) -> None:
    assert split_url(url) is not None
    assert same_as_sqlalchemy(url)


@given(st.text(alphabet="ab:/@?%=&[]1.,", max_size=24))
def test_any_url_is_read_as_sqlalchemy_reads_it_or_left_to_it(rest: str) -> None:
    assert same_as_sqlalchemy(f"postgresql://{rest}")


def test_ambiguous_user_information_is_left_to_the_pooled_engine() -> None:
    assert split_url("mysql://u:p@ss@h/db") is None  # which '@'? (write %40)
    assert split_url("sqlite:///data/a@b.db") is None
    assert split_url("not a url") is None


def test_a_missing_schema_is_created_then_claimed(db: TestDb) -> None:
    if db.backend == "sqlite":
        Store(db.url, db.prefix, create=False).close()  # the file, without tables
    target = _target(db)
    try:
        won = target.claim("j", "h", 30)
        assert won is not None and won.token == 1 and won.run_id is not None
    finally:
        target.close()


def test_a_newer_schema_is_refused_and_the_lock_left_free(db: TestDb, store: Store) -> None:
    store.ensure_jobs(["j"])
    meta = store.t.meta
    with store.engine.connect() as conn:
        conn.execute(meta.update().where(meta.c.key == "schema_version").values(value="99"))
    target = _target(db)
    try:
        with pytest.raises(SchemaTooNew):
            target.claim("j", "h", 30)
    finally:
        target.close()
    state = store.lock_state("j")
    assert state is not None and state.token == 1  # it was won, then let go at once
    assert (state.lock_until or 0) <= store.db_now()


def test_unreachable_database_is_a_database_error() -> None:
    for url in ("postgresql://nobody@127.0.0.1:1/none", "mysql://nobody@127.0.0.1:1/none"):
        driver = direct_driver(url)
        assert driver is not None
        engine = LockEngine(DirectExecutor(driver), "dblockrun_")
        with pytest.raises(DatabaseError) as caught:
            engine.claim("j", "h", 30)
        assert caught.value.kind == "unreachable"


def test_claim_is_stores_claim(store: Store, direct: LockEngine) -> None:
    store.ensure_jobs(["a"])
    t_store = store.claim("a", "h", 30)
    won = direct.claim("b", "h", 30, ensure=True)  # creates the missing row
    assert won is not None and t_store == won.token == 1
    a, b = store.lock_state("a"), store.lock_state("b")
    assert a is not None and b is not None
    assert (a.holder, a.token, a.last_slot, a.next_due, a.disabled_until) == (
        b.holder, b.token, b.last_slot, b.next_due, b.disabled_until)
    for x in (a, b):
        assert x.lock_until is not None and x.locked_at is not None
        assert x.lock_until - x.locked_at == pytest.approx(30, abs=0.01)
        assert x.last_start == pytest.approx(x.locked_at, abs=0.01)


def test_tokens_interoperate_with_store(store: Store, direct: LockEngine) -> None:
    won = direct.claim("j", "direct", 30, ensure=True)
    assert won is not None and won.token == 1
    token = won.token
    assert store.claim("j", "other", 30) is None  # busy for Store
    assert direct.claim("j", "again", 30) is None  # and directly
    assert direct.renew("j", "direct", token, 30)
    assert not direct.renew("j", "direct", token + 1, 30)  # wrong token
    assert not direct.renew("j", "someone", token, 30)  # wrong holder
    assert direct.release("j", "direct", token)
    t2 = store.claim("j", "store", 30)
    assert t2 == 2
    assert direct.claim("j", "direct", 30) is None
    assert not direct.renew("j", "direct", token, 30)  # fenced: the token moved on
    assert store.release("j", "store", t2)
    again = direct.claim("j", "direct", 30)
    assert again is not None and again.token == 3


def test_disabled_job_is_busy(store: Store, direct: LockEngine) -> None:
    store.disable("j", for_seconds=60)
    assert direct.claim("j", "direct", 30, ensure=True) is None
    store.enable("j")
    won = direct.claim("j", "direct", 30, ensure=True)
    assert won is not None and won.token == 1


def test_a_run_is_recorded_like_the_daemons(store: Store, direct: LockEngine) -> None:
    won = direct.claim("j", "direct", 30, Claim(record=True), ensure=True)
    assert won is not None and won.run_id is not None
    run = store.run(won.run_id)
    assert run is not None
    assert (run.job, run.host, run.token, run.result, run.finished, run.attempt) == (
        "j", "direct", won.token, m.RUNNING, None, 1)
    output = "out: it's \"quoted\" \\ ✓ 日本\n"
    assert direct.finish_and_release(won.run_id, "j", "direct", won.token, m.FAILED, 3,
                                     output, 60) == (True, True)
    run = store.run(won.run_id)
    assert run is not None
    assert (run.result, run.exit_code, run.output) == (m.FAILED, 3, output)
    assert run.finished is not None and run.finished >= run.started
    state = store.lock_state("j")  # lock-at-least keeps it
    assert state is not None and state.lock_until is not None and state.locked_at is not None
    assert state.lock_until - state.locked_at == pytest.approx(60, abs=0.01)
    assert store.claim("j", "other", 30) is None


def test_two_round_trips_per_won_run_and_one_per_lost_claim(db: TestDb, store: Store,
                                                            direct: LockEngine) -> None:
    store.ensure_jobs(["j"])
    warm = direct.claim("warm", "h", 30, ensure=True)  # connection and row out of the way
    assert warm is not None
    before = direct.statements
    won = direct.claim("j", "h", 30, Claim(record=True), ensure=True)
    assert won is not None and won.run_id is not None
    direct.finish_and_release(won.run_id, "j", "h", won.token, m.OK, 0, "")
    trips = direct.statements - before
    assert trips == (5 if db.backend == "sqlite" else 2)
    before = direct.statements
    assert direct.claim("warm", "h2", 30, Claim(record=True), ensure=True) is None
    assert direct.statements - before == (3 if db.backend == "sqlite" else 1)


def test_stale_result_is_not_written(store: Store, direct: LockEngine) -> None:
    won = direct.claim("j", "direct", 0.05, Claim(record=True), ensure=True)
    assert won is not None and won.run_id is not None
    taken = None
    while taken is None:  # the 50 ms lease runs out
        taken = store.claim("j", "other", 30)
    store.sweep_lost()
    assert not direct.finish_run(won.run_id, "j", won.token, m.OK, 0, "")
    run = store.run(won.run_id)
    assert run is not None and run.result == m.LOST


def test_prune_runs_is_stores(store: Store, direct: LockEngine) -> None:
    for job in ("j", "k"):
        for _ in range(5):
            direct.start_run(job, "direct", token=None, result=m.OK)
    newest = [r.id for r in store.history("j")][:2]
    assert direct.prune_runs("j", 2) == 3
    assert [r.id for r in store.history("j")] == newest
    assert len(store.history("k")) == 5  # another job's runs stay
    assert direct.prune_runs("j", 2) == 0
    assert direct.prune_runs("none", 2) == 0


def test_a_dropped_connection_is_replaced(db: TestDb, store: Store,
                                          direct: LockEngine) -> None:
    if db.backend == "sqlite":
        pytest.skip("no server connection to drop")
    won = direct.claim("j", "direct", 30, ensure=True)
    assert won is not None
    assert isinstance(direct.x, DirectExecutor)
    conn = direct.x._conn
    if db.backend == "postgresql":
        with psycopg.connect(_pg_dsn(db.url), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    else:
        admin_my = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
        with admin_my.cursor() as cur:
            cur.execute(f"KILL {int(conn.thread_id())}")
        admin_my.close()
    assert direct.renew("j", "direct", won.token, 30)  # one retry on a new connection
    assert direct.x._conn is not conn


def _pg_dsn(url: str) -> str:
    rest = url.split("://", 1)[1]
    user_host, dbname = rest.split("/", 1)
    user, hostport = user_host.split("@")
    host, port = hostport.split(":")
    return f"host={host} port={port} user={user} dbname={dbname}"


def test_exec_does_not_import_sqlalchemy(db: TestDb, store: Store) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBLOCKRUN_")}
    argv = [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "exec", "--name",
            "x", "--", "sh", "-c", "echo $DBLOCKRUN_FENCING_TOKEN; exit 4"]
    argv.insert(1, "-X")
    argv.insert(2, "importtime")
    assert argv[0] == sys.executable
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 4
    assert proc.stdout == "1\n"
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    heavy = {"sqlalchemy", "croniter", "yaml", "rich", "prometheus_client"}
    assert not heavy & imported
    # Only the driver of the database at hand.
    others = {"sqlite": {"psycopg", "pymysql"}, "postgresql": {"pymysql"},
              "mariadb": {"psycopg"}}[db.backend]
    assert not others & imported
    runs = store.history("x")
    assert [(r.result, r.exit_code, r.token) for r in runs] == [(m.FAILED, 4, 1)]
    state = store.lock_state("x")
    assert state is not None and state.holder is not None and state.token == 1
    assert store.claim("x", "other", 30) == 2  # released


def test_default_sqlite_file_without_pathlib(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    from dblockrun.store.dburl import default_sqlite_path

    def with_pathlib() -> str:  # what it was, with pathlib
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return str(Path(state) / "dblockrun" / "dblockrun.db")

    monkeypatch.setenv("HOME", str(tmp_path))
    for xdg in (None, "", str(tmp_path / "state"), str(tmp_path / "state") + "/"):
        if xdg is None:
            monkeypatch.delenv("XDG_STATE_HOME", raising=False)
        else:
            monkeypatch.setenv("XDG_STATE_HOME", xdg)
        assert default_sqlite_path() == with_pathlib()
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # no home at all
    with pytest.raises(RuntimeError, match="home directory"):
        default_sqlite_path()


def _exec(db: TestDb, *args: str, wait: bool = True) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBLOCKRUN_")}
    argv = [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "exec", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)
    if wait:
        proc.communicate(timeout=60)
    return proc


def test_an_exec_killed_is_recorded_lost_by_the_next_one(db: TestDb, store: Store,
                                                         tmp_path: Path) -> None:
    # No daemon sweeps here (exec wrapping a crontab line): the next exec's
    # claim records the dead one's run as lost.
    started = tmp_path / "started"
    first = _exec(db, "--name", "k9", "--lease", "6s", "--", "sh", "-c",
                  f"touch {started}; sleep 30", wait=False)
    try:
        wait_for(started.exists, 30, what="the first command to start")
        first.kill()
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    wait_for(lambda: _exec(db, "--name", "k9", "--", "true").returncode == 0
             and len(store.history("k9")) == 2, 30, interval=0.3, what="a second run")
    results = [r.result for r in store.history("k9")]
    assert results == [m.OK, m.LOST]
    # Written, not only shown: the dead run has an end (its last renewal), so
    # history shows its duration instead of '-'.
    dead = store.history("k9")[1]
    assert dead.finished is not None and 0 <= dead.finished - dead.started < 6
