"""The lean store of `dblockrun exec` (the driver alone, no SQLAlchemy): the
same rows, tokens and results as Store, on every backend."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from helpers import TestDb, dblockrun_cmd

from dblockrun.errors import DatabaseError
from dblockrun.store import Store, libpq
from dblockrun.store import models as m
from dblockrun.store.lean import LeanStore, open_lean

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(store: Store) -> Store:
    """conftest's store, with the schema created before the test."""
    store.ensure_schema()
    return store


@pytest.fixture
def lean(db: TestDb, store: Store) -> Iterator[LeanStore]:
    s = open_lean(db.url, db.prefix)
    assert s is not None
    yield s
    s.close()


def test_only_on_a_current_schema_and_a_plain_url(db: TestDb) -> None:
    assert open_lean(db.url, db.prefix) is None  # no schema yet: Store creates it
    with Store(db.url, db.prefix) as s:
        s.ensure_schema()
    found = open_lean(db.url, db.prefix)
    assert found is not None
    found.close()
    assert open_lean(db.url, "Odd-Prefix_") is None  # would need quoting
    assert open_lean(db.url + "?x=1", db.prefix) is None  # options: Store reads them


def test_schema_of_another_version_goes_to_store(db: TestDb, store: Store) -> None:
    meta = store.t.meta
    with store.engine.connect() as conn:
        conn.execute(meta.update().where(meta.c.key == "schema_version").values(value="99"))
    assert open_lean(db.url, db.prefix) is None


def test_unreachable_database_is_a_database_error() -> None:
    with pytest.raises(DatabaseError):
        open_lean("postgresql://nobody@127.0.0.1:1/none", "dblockrun_")
    with pytest.raises(DatabaseError):
        open_lean("mysql://nobody@127.0.0.1:1/none", "dblockrun_")


def test_claim_is_stores_claim(store: Store, lean: LeanStore) -> None:
    store.ensure_jobs(["a", "b"])
    lean.ensure_jobs(["b", "c"])  # existing rows stay as they are
    assert store.lock_state("c") is not None
    t_store = store.claim("a", "h", 30)
    t_lean = lean.claim("b", "h", 30)
    assert t_store == t_lean == 1
    a, b = store.lock_state("a"), store.lock_state("b")
    assert a is not None and b is not None
    assert (a.holder, a.token, a.last_slot, a.next_due, a.disabled_until) == (
        b.holder, b.token, b.last_slot, b.next_due, b.disabled_until)
    for x in (a, b):
        assert x.lock_until is not None and x.locked_at is not None
        assert x.lock_until - x.locked_at == pytest.approx(30, abs=0.01)
        assert x.last_start == pytest.approx(x.locked_at, abs=0.01)


def test_tokens_interoperate_with_store(store: Store, lean: LeanStore) -> None:
    lean.ensure_jobs(["j"])
    token = lean.claim("j", "lean", 30)
    assert token == 1
    assert store.claim("j", "other", 30) is None  # busy for Store
    assert lean.claim("j", "again", 30) is None  # and for lean
    assert lean.renew("j", "lean", token, 30)
    assert not lean.renew("j", "lean", token + 1, 30)  # wrong token
    assert not lean.renew("j", "someone", token, 30)  # wrong holder
    assert lean.release("j", "lean", token)
    t2 = store.claim("j", "store", 30)
    assert t2 == 2
    assert lean.claim("j", "lean", 30) is None
    assert not lean.renew("j", "lean", token, 30)  # fenced: the token moved on
    assert store.release("j", "store", t2)
    assert lean.claim("j", "lean", 30) == 3


def test_disabled_job_is_busy(store: Store, lean: LeanStore) -> None:
    store.disable("j", for_seconds=60)
    assert lean.claim("j", "lean", 30) is None
    store.enable("j")
    assert lean.claim("j", "lean", 30) == 1


def test_lock_at_least_keeps_the_lock(store: Store, lean: LeanStore) -> None:
    lean.ensure_jobs(["j"])
    token = lean.claim("j", "lean", 30)
    assert token is not None
    assert lean.release("j", "lean", token, lock_at_least=60)
    state = store.lock_state("j")
    assert state is not None and state.lock_until is not None and state.locked_at is not None
    assert state.lock_until - state.locked_at == pytest.approx(60, abs=0.01)
    assert store.claim("j", "other", 30) is None


def test_runs_are_recorded_like_stores(store: Store, lean: LeanStore) -> None:
    lean.ensure_jobs(["j"])
    token = lean.claim("j", "lean", 30)
    assert token is not None
    run_id = lean.start_run("j", "lean", token=token)
    run = store.run(run_id)
    assert run is not None
    assert (run.job, run.host, run.token, run.result, run.finished, run.attempt) == (
        "j", "lean", token, m.RUNNING, None, 1)
    output = "out: it's \"quoted\" \\ ✓ 日本\n"
    assert lean.finish_run(run_id, "j", token, m.FAILED, 3, output)
    run = store.run(run_id)
    assert run is not None
    assert (run.result, run.exit_code, run.output) == (m.FAILED, 3, output)
    assert run.finished is not None and run.finished >= run.started
    skipped = lean.start_run("j", "lean", token=None, result=m.SKIPPED)
    record = store.run(skipped)
    assert record is not None and record.finished is not None


def test_stale_result_is_not_written(store: Store, lean: LeanStore) -> None:
    lean.ensure_jobs(["j"])
    token = lean.claim("j", "lean", 0.05)
    assert token is not None
    run_id = lean.start_run("j", "lean", token=token)
    store.sweep_lost()
    taken = None
    while taken is None:  # the 50 ms lease runs out
        taken = store.claim("j", "other", 30)
    store.sweep_lost()
    assert not lean.finish_run(run_id, "j", token, m.OK, 0, "")
    run = store.run(run_id)
    assert run is not None and run.result == m.LOST


def test_rare_calls_go_through_store(store: Store, lean: LeanStore) -> None:
    lean.ensure_jobs(["j"])
    assert lean.lock_state("j") == store.lock_state("j")
    lean.disable("j", for_seconds=60, reason="why")
    state = store.lock_state("j")
    assert state is not None and state.disabled_reason == "why"


def test_prune_runs_is_stores(store: Store, lean: LeanStore) -> None:
    for job in ("j", "k"):
        for _ in range(5):
            lean.start_run(job, "lean", token=None, result=m.OK)
    newest = [r.id for r in store.history("j")][:2]
    assert lean.prune_runs("j", 2) == 3
    assert [r.id for r in store.history("j")] == newest
    assert len(store.history("k")) == 5  # another job's runs stay
    assert lean.prune_runs("j", 2) == 0
    assert lean.prune_runs("none", 2) == 0
    assert store.prune_runs("k", 4) == 1
    assert lean._full is None  # without SQLAlchemy


def test_a_dropped_connection_is_replaced(db: TestDb, store: Store, lean: LeanStore) -> None:
    if db.backend == "sqlite":
        pytest.skip("no server connection to drop")
    lean.ensure_jobs(["j"])
    token = lean.claim("j", "lean", 30)
    assert token is not None
    conn = lean._conn
    if db.backend == "postgresql":
        pid = conn.backend_pid if lean.driver.name == "libpq" else conn.info.backend_pid
        with psycopg.connect(_pg_dsn(db.url), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    else:
        thread_id = conn.thread_id()
        admin_my = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
        with admin_my.cursor() as cur:
            cur.execute(f"KILL {int(thread_id)}")
        admin_my.close()
    assert lean.renew("j", "lean", token, 30)  # one retry on a new connection, as Store
    assert lean._conn is not conn


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
    # psycopg too: on PostgreSQL exec goes through libpq (store/libpq.py).
    heavy = {"sqlalchemy", "croniter", "yaml", "rich", "prometheus_client", "psycopg"}
    assert not heavy & imported
    runs = store.history("x")
    assert [(r.result, r.exit_code, r.token) for r in runs] == [(m.FAILED, 4, 1)]
    state = store.lock_state("x")
    assert state is not None and state.holder is not None and state.token == 1
    assert store.claim("x", "other", 30) == 2  # released


def test_mysql_tls_is_pymysqls_preferred_mode_without_the_ca_load(db: TestDb, store: Store,
                                                                  lean: LeanStore) -> None:
    if db.backend != "mariadb":
        pytest.skip("PyMySQL only")
    lean.ensure_jobs(["j"])
    assert isinstance(lean._conn, pymysql.connections.Connection)
    conn: Any = lean._conn
    stock: Any = pymysql.connections.Connection(host="127.0.0.1", user="root",
                                                defer_connect=True)
    if not getattr(stock, "ssl", False):  # a PyMySQL without the "preferred" mode
        assert not conn.ssl
        return
    ours, theirs = conn.ctx, stock.ctx
    assert (conn.ssl, conn._ssl_required) == (stock.ssl, stock._ssl_required) == (True, False)
    assert (ours.verify_mode, ours.check_hostname, ours.protocol, ours.minimum_version) == (
        theirs.verify_mode, theirs.check_hostname, theirs.protocol, theirs.minimum_version)
    assert ours.verify_mode == ssl.CERT_NONE  # so CA certificates would go unread
    assert ours.cert_store_stats()["x509_ca"] == 0


def test_postgresql_goes_through_libpq_else_psycopg(db: TestDb, store: Store,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if db.backend != "postgresql":
        pytest.skip("PostgreSQL only")
    found = open_lean(db.url, db.prefix)
    assert found is not None and found.driver.name == "libpq"
    found.close()
    monkeypatch.setattr(libpq, "load", lambda: None)  # no libpq to load: psycopg
    fallback = open_lean(db.url, db.prefix)
    assert fallback is not None and fallback.driver.name == "psycopg"
    with fallback:
        fallback.ensure_jobs(["j"])
        token = fallback.claim("j", "lean", 30)
        assert token == 1
        run_id = fallback.start_run("j", "lean", token=token)
        assert fallback.finish_run(run_id, "j", token, m.OK, 0, "it's \"quoted\" ✓\n")
        assert fallback.release("j", "lean", token)
    run = store.run(run_id)
    assert run is not None and run.output == "it's \"quoted\" ✓\n"
    assert store.claim("j", "other", 30) == 2


def test_default_sqlite_file_without_pathlib(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    from dblockrun.dburl import default_sqlite_path

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
