"""Hostile input and least privilege (issue 7): credentials from files, passwords
never shown, database trouble as one clear line, a lock table edited into
nonsense, a role without DDL, fuzzed names/items/reasons, and `user:` jobs.

Real `dblockrun` processes against real SQLite, PostgreSQL and MariaDB where the
process is what is tested (exec, daemon, a password or a bad URL file on a real
stderr: status); other commands in-process (helpers.invoke).
"""

from __future__ import annotations

import functools
import json
import pwd
import re
import secrets
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import MY_HOST, MY_PORT, PG_HOST, PG_PORT, my_admin, pg_admin
from harness import Fleet, Process, daemon_argv
from helpers import REPO, Ran, TestDb, clean_env, cli, history_of, invoke, lock_row, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jobfiles import write_jobs

from dblockrun.errors import DatabaseError
from dblockrun.store import Store
from dblockrun.store.dburl import resolve_url
from dblockrun.store.schema import build_tables
from dblockrun.store.status import report

SECRET = "s3cr3t-Pw"


def one_clear_line(proc: subprocess.CompletedProcess[str] | Ran, status: int,
                   *needles: str) -> str:
    """The process failed with ``status`` and exactly one `dblockrun: ...` line."""
    assert proc.returncode == status, (proc.returncode, proc.stdout, proc.stderr)
    # (A URL with a password given with --db is warned about first: its own line.)
    lines = [line for line in proc.stderr.splitlines()
             if line.strip() and not line.startswith("dblockrun: warning: --db holds a password")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dblockrun: "), lines
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def logged(daemon: Process, text: str) -> bool:
    return text in daemon.text()


# -- 1. credentials ------------------------------------------------------------


def test_url_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {}
    for name in ("cli", "env", "jobs"):
        files[name] = tmp_path / f"{name}.url"
        files[name].write_text(f"sqlite:///{name}-file.db\nsecond line ignored\n")
    monkeypatch.delenv("DBLOCKRUN_DB", raising=False)
    monkeypatch.delenv("DBLOCKRUN_DB_FILE", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def resolve() -> str:
        return resolve_url(cli_db, file_db, cli_db_file=cli_file, file_db_file=jobs_file)

    cli_db: str | None = "sqlite:///cli.db"
    cli_file: str | None = str(files["cli"])
    file_db: str | None = "sqlite:///jobs.db"
    jobs_file: str | None = str(files["jobs"])
    monkeypatch.setenv("DBLOCKRUN_DB", "sqlite:///env.db")
    monkeypatch.setenv("DBLOCKRUN_DB_FILE", str(files["env"]))
    assert resolve() == "sqlite:///cli.db"
    cli_db = None
    assert resolve() == "sqlite:///cli-file.db"
    cli_file = None
    assert resolve() == "sqlite:///env.db"
    monkeypatch.delenv("DBLOCKRUN_DB")
    assert resolve() == "sqlite:///env-file.db"
    monkeypatch.delenv("DBLOCKRUN_DB_FILE")
    assert resolve() == "sqlite:///jobs.db"
    file_db = None
    assert resolve() == "sqlite:///jobs-file.db"
    jobs_file = None
    assert resolve() == f"sqlite:///{tmp_path}/state/dblockrun/dblockrun.db"


@pytest.mark.parametrize("content", ["", "\n\n", "hunter2-not-a-url\n", b"\xff\xfe"])
def test_bad_url_file_is_named_never_shown(tmp_path: Path, content: str | bytes) -> None:
    secret_file = tmp_path / "db-url"
    if isinstance(content, bytes):
        secret_file.write_bytes(content)
    else:
        secret_file.write_text(content)
    proc = cli("--db-file", str(secret_file), "status")
    line = one_clear_line(proc, 2, str(secret_file))
    assert "hunter2" not in proc.stderr
    missing = invoke("--db-file", str(tmp_path / "nope"), "status")
    one_clear_line(missing, 2, "cannot read database file", str(tmp_path / "nope"))
    folder = invoke("status", env=clean_env(DBLOCKRUN_DB_FILE=str(tmp_path)))
    one_clear_line(folder, 2, str(tmp_path))
    assert line


def test_url_from_files_cli_env_and_jobs_file(tmp_path: Path, sqlite_db: TestDb) -> None:
    url_file = tmp_path / "secrets" / "db-url"
    url_file.parent.mkdir()
    url_file.write_text(f"  {sqlite_db.url}  \n")
    url_file.chmod(0o600)
    prefix = ["--table-prefix", sqlite_db.prefix]
    ok = cli("--db-file", str(url_file), *prefix, "exec", "-n", "via-cli-file", "--", "true")
    assert ok.returncode == 0, ok.stderr
    env = clean_env(DBLOCKRUN_DB_FILE=str(url_file))
    ok = cli(*prefix, "exec", "-n", "via-env-file", "--", "true", env=env)
    assert ok.returncode == 0, ok.stderr
    # database-file: is relative to the jobs file.
    jobs = write_jobs(tmp_path / "jobs.yaml",
                      "database-file: secrets/db-url\njobs:\n  j: {rate: 1h, command: 'true'}\n")
    ok = cli(*prefix, "exec", "-f", str(jobs), "-n", "via-jobs-file", "--", "true")
    assert ok.returncode == 0, ok.stderr
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        names = {row.lock.name for row in report(store).jobs}
    assert {"via-cli-file", "via-env-file", "via-jobs-file"} <= names
    bad = write_jobs(tmp_path / "bad.yaml", "database-file: [x]\njobs: {}\n")
    one_clear_line(invoke("validate", str(bad)), 2, f"{bad}:1: database-file: must be a string")


def test_sqlite_default_file_is_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = cli("exec", "-n", "private", "--", "true",
               env=clean_env(XDG_STATE_HOME=str(state), HOME=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    folder, file = state / "dblockrun", state / "dblockrun" / "dblockrun.db"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(file.stat().st_mode) == 0o600


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
def test_password_hidden_everywhere(tmp_path: Path, scheme: str) -> None:
    url = f"{scheme}://scheduler:{SECRET}@127.0.0.1:1/ops"
    jobs = write_jobs(tmp_path / "jobs.yaml", "jobs:\n  j: {rate: 1s, command: 'true'}\n")
    outputs = []
    for debug in ([], ["--debug"]):
        for fmt in ("text", "json"):
            d = Process(daemon_argv(["--db", url], jobs, "--log-format", fmt, before=debug),
                       tmp_path / f"daemon{len(debug)}{fmt}.log")
            wait_for(functools.partial(logged, d, "database unreachable"), 30,
                     what="the outage log line")
            assert d.stop() == 0
            outputs.append(d.text())
            assert d.text().count("database unreachable") == 1, d.text()
        for args in (["status"], ["status", "--json"], ["exec", "-n", "x", "--", "true"],
                     ["history"], ["init-db"], ["disable", "j"]):
            # status and exec in real processes: a password never on a real stderr.
            run = cli if args[0] in ("status", "exec") else invoke
            proc = run(*debug, "--db", url, *args)
            assert proc.returncode == 1, (args, proc.stderr)
            if not debug:
                one_clear_line(proc, 1, "127.0.0.1")
            outputs.append(proc.stdout + proc.stderr)
    # An invalid URL, too.
    proc = cli("--db", f"{scheme}://u:{SECRET}@host:notaport/db", "status")
    one_clear_line(proc, 2, "u:***@host")
    outputs.append(proc.stderr)
    for out in outputs:
        assert SECRET not in out, out


# -- 2. database trouble as input -------------------------------------------------


@pytest.fixture
def marker_jobs(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "ran"
    jobs = write_jobs(tmp_path / "jobs.yaml",
                      f"jobs:\n  j: {{rate: 1s, command: 'touch {marker}'}}\n")
    return jobs, marker


def assert_refused_everywhere(url: str, prefix: str, jobs: Path, marker: Path, status: int,
                              *needles: str) -> None:
    """status, exec and daemon: one line, the same status, nothing run."""
    base = ["--db", url, "--table-prefix", prefix]
    one_clear_line(invoke(*base, "status"), status, *needles)
    one_clear_line(cli(*base, "exec", "-n", "j", "--", "touch", str(marker)), status, *needles)
    daemon = cli(*base, "daemon", str(jobs), timeout=60)
    assert daemon.returncode == status, daemon.stderr
    assert "Traceback" not in daemon.stderr
    last = daemon.stderr.strip().splitlines()[-1]
    assert last.startswith("dblockrun: ") and all(n in last for n in needles), daemon.stderr
    assert not marker.exists()


@pytest.fixture
def mariadb_user() -> Iterator[tuple[str, str]]:
    name = f"dbr_t{secrets.token_hex(3)}"
    try:
        conn = my_admin()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"mariadb unavailable: {exc}")
    with conn, conn.cursor() as cur:
        cur.execute(f"CREATE USER '{name}'@'%' IDENTIFIED BY 'right'")
        try:
            yield name, "right"
        finally:
            cur.execute(f"DROP USER '{name}'@'%'")


def test_wrong_password(mariadb_user: tuple[str, str], marker_jobs: tuple[Path, Path]) -> None:
    # PostgreSQL here trusts 127.0.0.1 (pg_hba), so only MariaDB can see a wrong password.
    user, _right = mariadb_user
    url = f"mysql://{user}:wrong-{SECRET}@{MY_HOST}:{MY_PORT}/test"
    assert_refused_everywhere(url, "dbr_", *marker_jobs, 1, "database refused", "Access denied")


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
def test_missing_database(scheme: str, marker_jobs: tuple[Path, Path]) -> None:
    pg = scheme == "postgresql"
    host = f"postgres@{PG_HOST}:{PG_PORT}" if pg else f"root@{MY_HOST}:{MY_PORT}"
    url = f"{scheme}://{host}/dbr_missing_{secrets.token_hex(3)}"
    try:
        (pg_admin if scheme == "postgresql" else my_admin)().close()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"{scheme} unavailable: {exc}")
    assert_refused_everywhere(url, "dbr_", *marker_jobs, 1, "database refused")


def test_unreachable_host(tmp_path: Path, marker_jobs: tuple[Path, Path]) -> None:
    jobs, marker = marker_jobs
    url = "postgresql://postgres@127.0.0.1:1/ops"
    one_clear_line(invoke("--db", url, "status"), 1, "Connection refused")
    one_clear_line(cli("--db", url, "exec", "-n", "j", "--", "touch", str(marker)), 1,
                   "Connection refused")
    # The daemon waits for the database (it may still be booting): one line, no run.
    d = Process(daemon_argv(["--db", url], jobs), tmp_path / "d.log")
    wait_for(lambda: "retrying with backoff" in d.text(), 30, what="the outage line")
    assert d.stop() == 0
    assert d.text().count("database unreachable") == 1
    assert "Traceback" not in d.text()
    assert not marker.exists()


def test_schema_from_newer_version(db: TestDb, marker_jobs: tuple[Path, Path]) -> None:
    with Store(db.url, db.prefix) as store:
        store.ensure_schema()
        with store.engine.connect() as conn:
            meta = store.t.meta
            conn.execute(meta.update().where(meta.c.key == "schema_version").values(value="99"))
    assert_refused_everywhere(db.url, db.prefix, *marker_jobs, 1,
                              "schema is version 99", "upgrade dblockrun")


def some_runs(db: TestDb, name: str) -> list[Any] | None:
    return history_of(db, name) or None


def test_lock_table_edited_into_nonsense(db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    far = 253402300799.0 * 4  # beyond year 9999
    with Store(db.url, db.prefix) as store:
        now = store.db_now()
    lock_row(db, "null-holder", holder=None, lock_until=now + 3600, token=7)
    lock_row(db, "far-future", holder="nobody:1:x", lock_until=far, locked_at=-1.0)
    lock_row(db, "negative", token=-5, holder="ghost", lock_until=now - 10, last_start=now + 3600)
    lock_row(db, "future-slot", last_slot=far)
    with Store(db.url, db.prefix) as store, store.engine.connect() as conn:
        locks = store.t.locks
        with pytest.raises(sa.exc.IntegrityError):  # tokens cannot be NULL
            conn.execute(locks.update().where(locks.c.name == "negative").values(token=None))
    jobs = write_jobs(tmp_path / "jobs.yaml", "jobs:\n" + "".join(
        f"  {n}: {{rate: 1s, command: 'true'}}\n"
        for n in ("null-holder", "far-future", "negative", "canary"))
        + "  future-slot: {cron: '* * * * * *', command: 'true'}\n")
    d = fleet.start(jobs)
    try:
        # status must show the nonsense, not crash.
        for args in (["status"], ["status", "--json"], ["history"]):
            proc = invoke("--db", db.url, "--table-prefix", db.prefix, *args)
            assert proc.returncode == 0, proc.stderr
        doc = json.loads(invoke("--db", db.url, "--table-prefix", db.prefix, "status",
                             "--json").stdout)
        states = {j["name"]: j for j in doc["jobs"]}
        assert states["null-holder"]["state"] == "locked"
        assert states["null-holder"]["holder"] is None
        assert states["far-future"]["state"] == "locked"
        # The canary runs several times meanwhile; the locked jobs never do.
        wait_for(lambda: len(history_of(db, "canary")) >= 3, 30, what="three canary runs")
        assert history_of(db, "null-holder") == []
        assert history_of(db, "far-future") == []
        # A last start or slot in the future holds a job back: not run either. (On
        # MariaDB a negative token makes the claim fail: LAST_INSERT_ID() is unsigned.)
        assert history_of(db, "negative") == []
        assert history_of(db, "future-slot") == []
        # Recovery: `dblockrun unlock` frees the lock, bumps the token and forgets
        # a last start or slot in the future.
        for name in ("null-holder", "far-future", "negative", "future-slot"):
            proc = invoke("--db", db.url, "--table-prefix", db.prefix, "unlock", name)
            assert proc.returncode == 0, proc.stderr
        for name, first_token in (("null-holder", 9), ("far-future", 2), ("negative", 2),
                                  ("future-slot", 2)):
            wait_for(functools.partial(some_runs, db, name), 30, what=f"a run of {name}")
            assert history_of(db, name)[-1].token == first_token, name
        assert "Traceback" not in d.text()
    finally:
        assert d.stop() == 0
    missing = invoke("--db", db.url, "--table-prefix", db.prefix, "unlock", "no-such-job")
    one_clear_line(missing, 2, "no such job")


def test_unlock_fences_a_running_holder(db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    pidfile = tmp_path / "pid"
    command = f"echo $$ > {pidfile}; exec sleep 60"
    jobs = write_jobs(tmp_path / "jobs.yaml",
                      f"jobs:\n  long: {{rate: 1h, command: '{command}'}}\n")
    d = fleet.start(jobs)
    try:
        pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30))
        assert invoke("--db", db.url, "--table-prefix", db.prefix, "unlock", "long").returncode == 0
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 15, what="the fenced command gone")
        # Its result is no longer the daemon's to write (token changed): swept as lost.
        wait_for(lambda: history_of(db, "long")[0].result in ("lost", "killed"), 15,
                 what="run lost")
    finally:
        assert d.stop() == 0


# -- 3. least privilege ---------------------------------------------------------------


def _tables(prefix: str) -> list[str]:
    """Every table of the schema (a table a release adds is granted as the
    docs' least-privilege GRANT lists it: docs/security.md names them all)."""
    return sorted(build_tables(prefix).metadata.tables)


def test_the_least_privilege_grants_in_the_docs_name_every_table() -> None:
    """An operator copying docs/security.md's GRANT gets every table the
    daemons read and write (a table a release adds, left out, is a daemon
    refused at its first claim)."""
    text = (REPO / "docs" / "security.md").read_text()
    grant = text[text.index("GRANT SELECT, INSERT, UPDATE, DELETE ON"):]
    grant = grant[:grant.index("TO dblockrun_app")]
    named = set(re.findall(r"dblockrun_[a-z_]+", grant))
    assert named == set(build_tables("dblockrun_").metadata.tables)
    mysql = text[text.index("-- MariaDB / MySQL"):]
    mysql = mysql[:mysql.index("\n")]
    assert {f"dblockrun{t}" for t in re.findall(r"(_[a-z]+)", mysql)} | {"dblockrun_meta"} \
        == named


@pytest.fixture
def dml_only_url(db: TestDb) -> Iterator[str]:
    """A URL for a role that may only SELECT/INSERT/UPDATE/DELETE dblockrun's tables."""
    if db.backend == "sqlite":
        pytest.skip("SQLite has no roles")
    init = invoke("--db", db.url, "--table-prefix", db.prefix, "init-db")
    assert init.returncode == 0, init.stderr
    role = f"dbr_lp_{secrets.token_hex(3)}"
    database = db.url.rsplit("/", 1)[1]
    if db.backend == "postgresql":
        import psycopg
        from psycopg import sql

        with psycopg.connect(host=PG_HOST, port=PG_PORT, user="postgres", dbname=database,
                             autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw'").format(
                sql.Identifier(role)))
            for table in _tables(db.prefix):
                conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                    sql.Identifier(table), sql.Identifier(role)))
            for sequence in ("runs_id_seq", "audit_id_seq"):
                conn.execute(sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(
                    sql.Identifier(f"{db.prefix}{sequence}"), sql.Identifier(role)))
        try:
            yield f"postgresql://{role}:pw@{PG_HOST}:{PG_PORT}/{database}"
        finally:
            with psycopg.connect(host=PG_HOST, port=PG_PORT, user="postgres", dbname=database,
                                 autocommit=True) as conn:
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
        return
    with my_admin() as my_conn, my_conn.cursor() as cur:
        cur.execute(f"CREATE USER '{role}'@'%' IDENTIFIED BY 'pw'")
        for table in _tables(db.prefix):
            cur.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{database}`.`{table}`"
                        f" TO '{role}'@'%'")
        try:
            yield f"mysql://{role}:pw@{MY_HOST}:{MY_PORT}/{database}"
        finally:
            cur.execute(f"DROP USER '{role}'@'%'")


def test_daemon_and_exec_without_ddl(
        db: TestDb, dml_only_url: str, tmp_path: Path, fleet: Fleet) -> None:
    url = dml_only_url
    with Store(url, db.prefix) as store, store.engine.connect() as conn:
        with pytest.raises(sa.exc.SQLAlchemyError):  # really no DDL
            conn.execute(sa.text(f"CREATE TABLE {db.prefix}intruder (x INT)"))
    marker = tmp_path / "exec-ran"
    proc = cli("--db", url, "--table-prefix", db.prefix, "exec", "-n", "e", "--",
               "touch", str(marker))
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()
    jobs = write_jobs(tmp_path / "jobs.yaml", "jobs:\n  j: {rate: 1s, command: 'echo hi'}\n"
                      "  f: {rate: 1s, items: [a, b], command: 'true'}\n")
    # A lease a loaded machine cannot outlast between a claim and its command's
    # start: every run must be ok (a 2 s lease lost one, under parallel tests).
    d = fleet.start(jobs, url=url, heartbeat="0.5s", lease="10s", grace="2s")
    try:
        wait_for(lambda: len(history_of(db, "j")) >= 2 and len(history_of(db, "f")) >= 2, 30,
                 what="runs as the DML-only role")

        def run(*args: str) -> None:
            done = invoke("--db", url, "--table-prefix", db.prefix, *args)
            assert done.returncode == 0, (args, done.stderr)

        for args in (["status"], ["history"], ["pause", "--for", "1h"]):
            run(*args)
        # Paused, then no run of j going: `unlock` forces the lock open, and a
        # run still finishing would lose it (an ERROR, rightly: under load a
        # 0.01 s run's result came after the unlock).
        wait_for(lambda: all(r.result != "running" for r in history_of(db, "j")), 30,
                 what="j's runs over")
        for args in (["disable", "j", "--for", "1h"], ["enable", "j"], ["unlock", "j"],
                     ["resume"], ["audit"]):
            run(*args)
    finally:
        assert d.stop() == 0
    assert "ERROR" not in d.text(), d.text()
    assert all(r.result == "ok" for r in history_of(db, "j")), history_of(db, "j")


def test_no_schema_and_no_ddl_is_one_line(db: TestDb, dml_only_url: str) -> None:
    # The same role against a prefix whose tables do not exist: told to run init-db.
    proc = invoke("--db", dml_only_url, "--table-prefix", f"{db.prefix}x", "status")
    one_clear_line(proc, 1, "database")


# -- 5. fuzzing --------------------------------------------------------------------

NASTY = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
    max_size=120,
) | st.sampled_from(["'; DROP TABLE x; --", "%s %(x)s %%", "\\", "\n\r\t", "a" * 180,
                     "Ünïcødé ✓ 😀", '"quoted"', "`back`", "?", ":name", "$1"])


@pytest.fixture
def fuzz_store(db: TestDb) -> Iterator[Store]:
    store = Store(db.url, db.prefix)
    store.ensure_schema()
    yield store
    store.close()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NASTY, reason=NASTY, items=st.lists(NASTY, max_size=5, unique=True))
def test_strings_round_trip(fuzz_store: Store, name: str, reason: str, items: list[str]) -> None:
    store = fuzz_store
    # A unique head keeps examples apart (MariaDB compares names case-insensitively).
    job = f"{secrets.token_hex(4)}{name}"
    store.ensure_jobs([job])
    store.disable(job, for_seconds=60, reason=reason)
    [row] = report(store, [job]).jobs
    assert (row.lock.name, row.lock.disabled_reason) == (job, reason)
    store.items.sync(job, items)
    assert sorted(s.item for s in store.items.states(job)) == sorted(items)
    run_id = store.start_run(job, "h", token=None, item=items[0] if items else None)
    store.finish_run(run_id, job, None, "ok", 0, reason)
    run = store.run(run_id)
    assert run is not None and (run.job, run.output) == (job, reason)
    assert store.enable(job)


def test_nul_is_a_clear_error(db: TestDb, tmp_path: Path) -> None:
    with Store(db.url, db.prefix) as store:
        for call in (lambda: store.ensure_jobs(["a\x00b"]),
                     lambda: store.disable("nul", reason="a\x00b")):
            try:
                call()
            except DatabaseError as exc:  # PostgreSQL: text cannot hold NUL
                assert "NUL" in exc.message
    # The jobs file refuses it; the command line cannot even carry it (execve).
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text('jobs:\n  j: {rate: 1s, command: "echo \\0"}\n')
    one_clear_line(invoke("validate", str(jobs)), 2, "NUL")


def test_cli_refuses_names_and_reasons_the_table_cannot_hold(sqlite_db: TestDb) -> None:
    base = ["--db", sqlite_db.url, "--table-prefix", sqlite_db.prefix]
    one_clear_line(invoke(*base, "disable", "x" * 300), 2, "bad job name")
    one_clear_line(cli(*base, "exec", "-n", "a;b", "--", "true"), 2, "bad lock name")
    one_clear_line(invoke(*base, "disable", "j", "--reason", "r" * 1001), 2, "at most 1000")
    proc = invoke(*base, "disable", "j", "--create", "--reason",
               "it's 100% \"done\"; DROP TABLE x;\nok")
    assert proc.returncode == 0, proc.stderr
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        assert report(store, ["j"]).jobs[0].lock.disabled_reason == (
            "it's 100% \"done\"; DROP TABLE x;\nok")


# -- 6. user: ------------------------------------------------------------------------


def test_unknown_user_is_a_load_error(tmp_path: Path) -> None:
    jobs = write_jobs(tmp_path / "jobs.yaml",
                      "jobs:\n  j:\n    rate: 1s\n    command: 'true'\n    user: no-such-user-x\n")
    one_clear_line(invoke("validate", str(jobs)), 2,
                   f"{jobs}:5: job 'j': user: unknown user 'no-such-user-x'")


def test_user_key_runs_the_command_as_that_user(
        system_user: str, sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    pw = pwd.getpwnam(system_user)
    # Output goes to the stored tail (pytest's tmp_path is private to root).
    probe = "id -un; id -Gn; echo $HOME $USER $LOGNAME; pwd; ps -o user= -p $PPID"
    jobs = write_jobs(tmp_path / "jobs.yaml",
                      f"jobs:\n  j:\n    rate: 1h\n    user: {system_user}\n"
                      f"    command: '{probe}'\n"
                      f"  f:\n    rate: 1h\n    user: {system_user}\n    items-command: id -un\n"
                      f"    command: 'echo $DBLOCKRUN_ITEM; id -un'\n")
    d = sqlite_fleet.start(jobs)

    def finished(name: str) -> Any:
        with Store(sqlite_db.url, sqlite_db.prefix) as store:
            runs = [r for r in store.history(name, 10) if r.result != "running"]
            return store.run(runs[0].id) if runs else None

    try:
        run = wait_for(lambda: finished("j"), 30, what="the probe's run")
        item = wait_for(lambda: finished("f"), 30, what="the item's run")
    finally:
        assert d.stop() == 0
    assert run.result == "ok", run.output
    who, groups, env, cwd, guard = run.output.splitlines()
    assert who == system_user
    assert f"{system_user}g" in groups.split()
    assert env.split() == [pw.pw_dir, system_user, system_user]
    assert cwd == pw.pw_dir  # like cron: the user's home unless the job has a workdir
    assert guard.strip() == "root"  # the watchdog stays the daemon's: the job cannot kill it
    assert item.output.split() == [system_user, system_user]  # items-command as the user too
