"""The command line as a user drives it: output, exit statuses, where the database is."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from conftest import ServerDatabases, sqlite_url
from harness import Fleet, Process, track
from helpers import TestDb, dblockrun_cmd, new_prefix, sigint_default, wait_for
from helpers import clean_env as env_without_db

from dblockrun.cli import cli
from dblockrun.errors import UsageError
from dblockrun.ops.who import operator_id
from dblockrun.redact import url as redact
from dblockrun.store import Store
from dblockrun.store.dburl import password_in_argv

REPO = Path(__file__).resolve().parent.parent
#: What both command-line paths say once when --db holds a password.
PASSWORD_WARNING = password_in_argv("postgresql://u:p@h/d")

GOOD = """\
jobs:
  nightly:
    cron: "0 6 * * *"
    timezone: Asia/Kolkata
    command: echo hi
  hourly:
    rate: 1h
    command: ["true"]
"""

UNKNOWN_KEY = """\
jobs:
  x:
    cron: "* * * * *"
    command: echo hi
    bogus: 1
"""

LEAST_OVER_MOST = """\
jobs:
  x:
    cron: "* * * * *"
    command: echo hi
    lock-at-most: 1m
    lock-at-least: 5m
"""

STATUS_JOB_KEYS = {
    "name", "state", "holder", "lock_until", "token", "last_slot", "next_run",
    "disabled_until", "disabled_reason", "last_run", "running",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No database from the developer's environment; the default file goes to tmp."""
    for name in ("DBLOCKRUN_DB", "DBLOCKRUN_DB_FILE", "DBLOCKRUN_JOBS",
                 "DBLOCKRUN_TABLE_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def known(db: TestDb, *names: str) -> None:
    """Jobs the database knows, as a daemon that loaded them leaves them."""
    with Store(db.url, db.prefix) as store:
        store.ensure_jobs(names)


def where(db: TestDb) -> str:
    """How messages name the test's database (no password in these URLs)."""
    return f"{db.url} (table prefix {db.prefix})"


def invoke(db: TestDb | None, *args: str) -> Result:
    """`dblockrun [--db URL --table-prefix P] ARGS...` in-process."""
    head = ["--db", db.url, "--table-prefix", db.prefix] if db is not None else []
    return CliRunner().invoke(cli, [*head, *args], prog_name="dblockrun")


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def sqlite_file(db: TestDb) -> Path:
    return Path(db.url.removeprefix("sqlite:///"))


def status_doc(db: TestDb | None, *args: str) -> dict[str, Any]:
    result = invoke(db, "status", "--json", *args)
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def job_of(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [j for j in doc["jobs"] if j["name"] == name]
    assert len(found) == 1, doc
    return found[0]


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def run_cli(args: Sequence[str], env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """dblockrun as a real process, as a terminal would run it."""
    full_env = dict(os.environ)
    for name in ("DBLOCKRUN_DB", "DBLOCKRUN_DB_FILE", "DBLOCKRUN_JOBS",
                 "DBLOCKRUN_TABLE_PREFIX"):
        full_env.pop(name, None)
    full_env.update(env or {})
    return subprocess.run([*dblockrun_cmd(), *args], capture_output=True, text=True,
                          env=full_env, cwd=REPO, timeout=timeout)


# -- validate -------------------------------------------------------------------


def test_validate_good_file(tmp_path: Path) -> None:
    path = write(tmp_path / "jobs.yaml", GOOD)
    result = invoke(None, "validate", path)
    assert result.exit_code == 0
    assert result.stdout == f"{path}: ok, 2 job(s)\n"
    assert result.stderr == ""


def test_validate_lock_at_least_over_most_is_one_line_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path / "jobs.yaml", LEAST_OVER_MOST)
    result = invoke(None, "validate", path)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"dblockrun: {path}:6: job 'x': lock-at-least: 5m is longer than lock-at-most 1m\n"
    )


def test_validate_unknown_key_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path / "jobs.yaml", UNKNOWN_KEY)
    proc = run_cli(["validate", path])
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"dblockrun: {path}:5: job 'x': bogus: unknown key")


def test_validate_missing_file_exits_2(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.yaml")
    result = invoke(None, "validate", path)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"dblockrun: {path}: cannot read")
    assert "Traceback" not in result.output


# -- disable / enable / status ----------------------------------------------------


def test_disable_for_shows_in_status_and_enable_clears(sqlite_db: TestDb) -> None:
    known(sqlite_db, "backup")
    result = invoke(sqlite_db, "disable", "backup", "--for", "3h", "--reason", "maintenance")
    assert result.exit_code == 0, result.output
    m = re.fullmatch(rf"backup disabled until (\S+Z) in {re.escape(where(sqlite_db))}\n",
                     result.stdout)
    assert m, result.stdout

    doc = status_doc(sqlite_db)
    job = job_of(doc, "backup")
    assert job["state"] == "disabled"
    assert job["disabled_reason"] == "maintenance"
    assert job["disabled_until"] == m.group(1)
    ahead = parse_iso(job["disabled_until"]) - parse_iso(doc["db_time"])
    assert timedelta(hours=3) - timedelta(seconds=30) < ahead <= timedelta(hours=3)

    result = invoke(sqlite_db, "enable", "backup")
    assert result.exit_code == 0
    assert result.stdout == f"backup enabled in {where(sqlite_db)}\n"
    job = job_of(status_doc(sqlite_db), "backup")
    assert job["state"] == "idle"
    assert job["disabled_until"] is None
    assert job["disabled_reason"] is None


def test_disable_without_duration_is_forever(sqlite_db: TestDb) -> None:
    known(sqlite_db, "backup")
    result = invoke(sqlite_db, "disable", "backup")
    assert result.exit_code == 0
    assert result.stdout == f"backup disabled until forever in {where(sqlite_db)}\n"
    job = job_of(status_doc(sqlite_db), "backup")
    assert job["state"] == "disabled"
    assert job["disabled_until"] == "forever"
    assert job["disabled_reason"] is None


def test_disable_until_a_time(sqlite_db: TestDb) -> None:
    known(sqlite_db, "backup")
    result = invoke(sqlite_db, "disable", "backup", "--until", "2099-01-02T03:04:05Z")
    assert result.exit_code == 0
    assert result.stdout == (
        f"backup disabled until 2099-01-02T03:04:05.000Z in {where(sqlite_db)}\n")
    assert job_of(status_doc(sqlite_db), "backup")["disabled_until"] == "2099-01-02T03:04:05.000Z"


def test_enable_unknown_job_exits_2(sqlite_db: TestDb) -> None:
    known(sqlite_db, "backup")
    result = invoke(sqlite_db, "enable", "nope")
    assert result.exit_code == 2
    assert result.stderr == f"dblockrun: no such job in {where(sqlite_db)}: nope\n"


def test_a_jobs_file_given_as_a_job_name_is_told_to_come_with_f(sqlite_db: TestDb) -> None:
    """``dblockrun status jobs.yaml`` (an operator's slip: the jobs file is
    an option) says how to name a jobs file, exit 2."""
    known(sqlite_db, "backup")
    result = invoke(sqlite_db, "status", "jobs.yaml")
    assert result.exit_code == 2
    assert result.stderr == (f"dblockrun: no such job in {where(sqlite_db)}: jobs.yaml"
                             " (a jobs file is named with -f: dblockrun -f jobs.yaml ...)\n")


def test_disable_for_and_until_together_exit_2(sqlite_db: TestDb) -> None:
    result = invoke(sqlite_db, "disable", "backup", "--for", "3h",
                    "--until", "2099-01-01T00:00:00Z")
    assert result.exit_code == 2
    assert result.stderr == "dblockrun: give --for or --until, not both\n"
    assert not sqlite_file(sqlite_db).exists()  # nothing was done


def test_disable_bad_duration_exits_2(sqlite_db: TestDb) -> None:
    result = invoke(sqlite_db, "disable", "backup", "--for", "5x")
    assert result.exit_code == 2
    assert result.stderr == ("dblockrun: --for: '5x' is not a duration "
                             "(use e.g. 250ms, 90s, 5m, 1h30m, 2d)\n")


def test_status_json_shape(sqlite_db: TestDb) -> None:
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        store.ensure_jobs(["a", "b"])
        token = store.claim("a", "other-host", 30)
    assert token == 1
    doc = status_doc(sqlite_db)
    assert set(doc) == {"version", "db_time", "live_within", "paused", "jobs", "hosts",
                        "groups", "warnings", "waiting"}
    assert doc["paused"] is None
    assert doc["version"] == 1
    assert isinstance(doc["hosts"], list)
    assert [j["name"] for j in doc["jobs"]] == ["a", "b"]
    for job in doc["jobs"]:
        assert STATUS_JOB_KEYS <= set(job), sorted(STATUS_JOB_KEYS - set(job))
    a, b = doc["jobs"]
    assert (a["state"], a["holder"], a["token"]) == ("locked", "other-host", 1)
    assert parse_iso(a["lock_until"]) > parse_iso(doc["db_time"])
    assert (b["state"], b["holder"], b["token"], b["lock_until"]) == ("idle", None, 0, None)
    # Asking for one job shows only that one.
    assert [j["name"] for j in status_doc(sqlite_db, "b")["jobs"]] == ["b"]


def test_status_unknown_job_exits_2(sqlite_db: TestDb) -> None:
    known(sqlite_db, "known")
    result = invoke(sqlite_db, "status", "known", "nope", "other")
    assert result.exit_code == 2
    assert result.stderr == f"dblockrun: no such job in {where(sqlite_db)}: nope, other\n"


def test_status_table_shows_disabled_reason(
    sqlite_db: TestDb, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich folds cells on narrow terminals
    known(sqlite_db, "backup")
    invoke(sqlite_db, "disable", "backup", "--reason", "disk full")
    result = invoke(sqlite_db, "status", "--wide")
    assert result.exit_code == 0
    assert "backup" in result.stdout
    # Who disabled it, as the audit trail names them.
    assert f"until enabled by {operator_id()}: disk full" in result.stdout


# -- where the database is ----------------------------------------------------------


def where_is(name: str, *urls: str) -> list[str]:
    """The URLs whose database knows job `name`."""
    found = []
    for url in urls:
        with Store(url, "p_") as store:
            if store.lock_state(name) is not None:
                found.append(url)
    return found


def test_database_url_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flag, env, infile = (sqlite_url(tmp_path / f"{n}.db") for n in ("flag", "env", "file"))
    default = sqlite_url(tmp_path / "state" / "dblockrun" / "dblockrun.db")
    jobs = write(tmp_path / "jobs.yaml", f"database: {infile}\n" + GOOD)
    everywhere = (flag, env, infile, default)

    def disable(job: str, *extra: str) -> None:
        result = CliRunner().invoke(
            cli, [*extra, "--table-prefix", "p_", "disable", job, "--create", "-f", jobs])
        assert result.exit_code == 0, result.output

    monkeypatch.setenv("DBLOCKRUN_DB", env)
    disable("one", "--db", flag)
    assert where_is("one", *everywhere) == [flag]
    disable("two")
    assert where_is("two", *everywhere) == [env]
    monkeypatch.delenv("DBLOCKRUN_DB")
    disable("three")
    assert where_is("three", *everywhere) == [infile]
    result = CliRunner().invoke(cli, ["--table-prefix", "p_", "disable", "four", "--create"])
    assert result.exit_code == 0, result.output
    assert where_is("four", *everywhere) == [default]


def test_default_sqlite_file_is_private(tmp_path: Path) -> None:
    result = invoke(None, "disable", "backup", "--create")
    assert result.exit_code == 0, result.output
    folder = tmp_path / "state" / "dblockrun"
    file = folder / "dblockrun.db"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    job = job_of(status_doc(None), "backup")
    assert job["state"] == "disabled"


# -- passwords and bad URLs ---------------------------------------------------------


@pytest.mark.parametrize("url", [
    "postgresql://u:s3cret@127.0.0.1:1/x",
    "mysql://u:s3cret@127.0.0.1:1/x",
    "postgresql://127.0.0.1:1/x?user=u&password=s3cret",
])
def test_password_not_in_database_error(url: str) -> None:
    proc = run_cli(["--db", url, "status"])
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    # First: a password given with --db is visible in ps (issue 25 item 8).
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("dblockrun: warning: --db holds a password")
    assert lines[1].startswith("dblockrun: database error")
    assert "s3cret" not in proc.stderr


def test_malformed_url_exits_2_without_password_or_traceback() -> None:
    proc = run_cli(["--db", "postgresql://u:s3cret@127.0.0.1:abc/x", "status"])
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "s3cret" not in proc.stderr
    assert proc.stderr == (
        f"{PASSWORD_WARNING}\n"
        "dblockrun: database URL 'postgresql://u:***@127.0.0.1:abc/x' is not a valid URL "
        "(check the host and port)\n"
    )


def test_password_not_in_successful_output(server_databases: ServerDatabases) -> None:
    # The local PostgreSQL trusts local connections, so the password is ignored.
    url = server_databases.url("postgresql").replace("://postgres@", "://postgres:s3cret@")
    db = TestDb("postgresql", url, new_prefix())
    try:
        result = invoke(db, "init-db")
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith("schema version ")
        assert "postgres:***@" in result.stdout
        invoke(db, "disable", "backup", "--reason", "r")
        for args in (("status",), ("status", "--json"), ("history",), ("history", "--json")):
            result = invoke(db, *args)
            assert result.exit_code == 0, result.output
            assert "s3cret" not in result.output
    finally:
        with Store(url, db.prefix) as store:
            store.drop_schema()


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:s3cret@db.internal/ops", "postgresql://u:***@db.internal/ops"),
    ("mysql://root:s3cret@127.0.0.1:3306/x", "mysql://root:***@127.0.0.1:3306/x"),
    ("postgresql://u:ab/cd@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:a:b@h/db", "postgresql://u:***@h/db"),
    ("postgresql://h/db?user=u&PASSWORD=s3cret&sslmode=require",
     "postgresql://h/db?user=u&PASSWORD=***&sslmode=require"),
    ("postgresql://u@db.internal/ops", "postgresql://u@db.internal/ops"),
    ("postgresql://db.internal:5432/ops", "postgresql://db.internal:5432/ops"),
    ("sqlite:////var/lib/a:b@c.db", "sqlite:////var/lib/a:b@c.db"),
    # Not URLs: only what may be the password is hidden (issue 11, item 21).
    ("u:s3cret@host", "u:***@host"),
    ("postgresql//u:s3cret@h/db", "postgresql//u:***@h/db"),
    ("postgresql:/u:s3/cret@h/db", "postgresql:/u:***@h/db"),
    ("postgresql:u:s3cret@h/db", "postgresql:***@h/db"),
    ("u:s3@cret@h/db", "u:***@h/db"),
    ("u@host/db", "u@host/db"),
    ("not a url", "not a url"),
])
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_unsupported_scheme_exits_2() -> None:
    result = invoke(None, "--db", "redis://x", "status")
    assert result.exit_code == 2
    assert result.stderr == (
        "dblockrun: database URL scheme 'redis' is not supported "
        "(use postgresql://, mysql://, mariadb://, sqlite:///path)\n"
    )


# -- history, next, help --------------------------------------------------------------


def test_history_lists_an_exec_run_and_its_output(sqlite_db: TestDb) -> None:
    proc = run_cli(["--db", sqlite_db.url, "--table-prefix", sqlite_db.prefix,
                    "exec", "--name", "report", "--", "sh", "-c", "echo one; echo two"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "one\ntwo\n"

    result = invoke(sqlite_db, "history", "--json")
    assert result.exit_code == 0
    runs = json.loads(result.stdout)["runs"]
    assert len(runs) == 1
    run = runs[0]
    assert (run["job"], run["result"], run["exit_code"], run["token"]) == ("report", "ok", 0, 1)
    assert run["finished"] is not None

    result = invoke(sqlite_db, "history", "--output", str(run["id"]))
    assert result.exit_code == 0
    assert result.stdout == "one\ntwo\n"

    result = invoke(sqlite_db, "history", "--output", str(run["id"] + 100))
    assert result.exit_code == 2
    assert result.stderr == f"dblockrun: no run {run['id'] + 100} in {where(sqlite_db)}\n"


def test_next_prints_times_in_the_jobs_timezone(tmp_path: Path) -> None:
    path = write(tmp_path / "jobs.yaml", GOOD)
    result = invoke(None, "next", path, "--count", "2")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1] == "hourly: every 1h (rate)"
    m = re.fullmatch(r"nightly: (\S+), (\S+)", lines[0])
    assert m, lines[0]
    first, second = (datetime.fromisoformat(t) for t in m.groups())
    for t in (first, second):
        assert t.utcoffset() == timedelta(hours=5, minutes=30)  # Asia/Kolkata, no DST
        assert (t.hour, t.minute, t.second) == (6, 0, 0)
    assert second - first == timedelta(days=1)
    assert first > datetime.now(first.tzinfo)
    assert len(lines) == 2


# Every command of DESIGN.md "Commands".
EVERY_COMMAND = ("daemon", "status", "disable", "enable", "exec", "history", "run", "validate",
                 "next", "init-db")


def command_names(help_text: str) -> list[str]:
    section = help_text.split("Commands:\n", 1)[1]
    return [line.split()[0] for line in section.splitlines() if line.startswith("  ")]


def test_help_lists_every_command() -> None:
    result = invoke(None, "--help")
    assert result.exit_code == 0
    assert result.stdout.startswith("Usage: dblockrun [OPTIONS] COMMAND [ARGS]...")
    names = command_names(result.stdout)
    missing = [name for name in EVERY_COMMAND if name not in names]
    assert missing == []


# -- issue 11, item 3: `run` and `enabled: false` -------------------------------------

DISABLED_HERE = """\
jobs:
  manual:
    rate: 1d
    command: echo manual
    enabled: false
"""


def test_run_refuses_a_job_disabled_in_the_jobs_file(sqlite_db: TestDb, tmp_path: Path) -> None:
    jobs = write(tmp_path / "jobs.yaml", DISABLED_HERE)
    known(sqlite_db, "manual")
    result = invoke(sqlite_db, "run", "manual", "-f", jobs, "--no-wait")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        f"dblockrun: manual has `enabled: false` in {jobs}: no daemon with that file runs it\n")
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        assert store.requested() == []  # no request filed


# -- issue 11, item 5: duration options ---------------------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["daemon", "--lease", "0s"], "--lease: must be longer than 0s (got '0s')",
                 id="daemon-lease"),
    pytest.param(["daemon", "--heartbeat", "0"], "--heartbeat: must be longer than 0s (got '0')",
                 id="daemon-heartbeat"),
    pytest.param(["daemon", "--grace", "-1s"],
                 "--grace: '-1s' is negative (use e.g. 250ms, 90s, 5m, 1h30m, 2d)",
                 id="daemon-grace"),
    pytest.param(["exec", "-n", "x", "--lock-at-most", "0ms", "true"],
                 "--lock-at-most: must be longer than 0s (got '0ms')", id="exec-lock-at-most"),
    pytest.param(["exec", "-n", "x", "--lease", "0s", "true"],
                 "--lease: must be longer than 0s (got '0s')", id="exec-lease"),
    # A lease a run cannot renew in time: every run was stopped after 0.67 s as
    # "lease could not be renewed before it expired".
    pytest.param(["daemon", "--heartbeat", "1s", "--lease", "2s"],
                 "--lease 2s is too short for renewals every 1s: a run would be stopped 667ms "
                 "after its last renewal, before the next renewal could land; give a longer "
                 "--lease or a shorter --heartbeat", id="daemon-lease-under-a-heartbeat"),
    pytest.param(["exec", "-n", "x", "--lease", "2s", "true"],
                 "--lease 2s is too short for renewals every 667ms (a third of it): a run "
                 "would be stopped 667ms after its last renewal, before the next renewal could "
                 "land; give a longer --lease", id="exec-lease-too-short"),
    pytest.param(["disable", "backup", "--for", "0s"],
                 "--for: must be longer than 0s (got '0s')", id="disable-for"),
    pytest.param(["run", "backup", "--timeout", "0s"],
                 "--timeout: must be longer than 0s (got '0s')", id="run-timeout"),
])
def test_durations_that_make_no_sense_exit_2_naming_the_option(
        sqlite_db: TestDb, tmp_path: Path, args: list[str], message: str) -> None:
    if args[0] == "daemon":  # a real process: it would run (for ever) if not refused
        jobs = write(tmp_path / "jobs.yaml", GOOD)
        proc = run_cli(["--db", sqlite_db.url, *args, jobs], timeout=20)
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"dblockrun: {message}\n")
    else:
        result = invoke(sqlite_db, *args)
        assert (result.exit_code, result.stdout, result.stderr) == (
            2, "", f"dblockrun: {message}\n")
    if args[0] == "exec":  # the click-free start says the same
        proc = run_cli(["--db", sqlite_db.url, *args])
        assert (proc.returncode, proc.stderr) == (2, f"dblockrun: {message}\n")
    assert not sqlite_file(sqlite_db).exists()  # nothing was started or created


# -- issue 11, item 12: which database an operator command acts on ---------------------------


def fleet_jobs(tmp_path: Path, fleet: TestDb) -> str:
    """A jobs file naming the fleet's database, as on a fleet host."""
    return write(tmp_path / "fleet.yaml", f"database: {fleet.url}\n" + GOOD)


def test_an_operator_command_reaches_the_fleet_database_through_DBLOCKRUN_JOBS(
        sqlite_db: TestDb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    known(sqlite_db, "nightly")
    monkeypatch.setenv("DBLOCKRUN_JOBS", fleet_jobs(tmp_path, sqlite_db))
    result = CliRunner().invoke(cli, ["--table-prefix", sqlite_db.prefix, "disable", "nightly",
                                      "--until", "2099-01-01T00:00:00Z"])
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == (
        f"nightly disabled until 2099-01-01T00:00:00.000Z in {where(sqlite_db)}\n")
    assert job_of(status_doc(sqlite_db), "nightly")["state"] == "disabled"
    assert not (tmp_path / "state").exists()  # no local SQLite file on the side


def test_an_operator_command_reads_etc_dblockrun_jobs_yaml_by_default(
        sqlite_db: TestDb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dblockrun.store.dburl

    known(sqlite_db, "nightly")
    # As the systemd example: the URL in a file next to the jobs file.
    (tmp_path / "etc").mkdir()
    write(tmp_path / "etc" / "db-url", sqlite_db.url + "\n")
    etc_jobs = write(tmp_path / "etc" / "jobs.yaml", "database-file: db-url\n" + GOOD)
    monkeypatch.setattr(dblockrun.store.dburl, "DEFAULT_JOBS_FILE", etc_jobs)
    result = CliRunner().invoke(cli, ["--table-prefix", sqlite_db.prefix, "enable", "nightly"])
    assert (result.exit_code, result.stdout) == (
        0, f"nightly was not disabled in {where(sqlite_db)}: nothing to do (nothing recorded)\n")
    assert not (tmp_path / "state").exists()


def test_a_local_sqlite_file_is_not_made_up_for_an_operator_command(tmp_path: Path) -> None:
    """The report: `disable every5 --for 3h` with no database in reach acted on
    a fresh local SQLite file and said it had worked."""
    default = tmp_path / "state" / "dblockrun" / "dblockrun.db"
    for args in (["disable", "every5", "--for", "3h"], ["enable", "every5"],
                 ["run", "every5"], ["unlock", "every5"], ["status"], ["history"]):
        result = invoke(None, *args)
        assert (result.exit_code, result.stdout) == (1, ""), args
        assert result.stderr == (
            f"dblockrun: no dblockrun database at sqlite:///{default}: no folder "
            f"{default.parent}; nothing names a database: give --db, or a jobs file with "
            "`database:` (-f, DBLOCKRUN_JOBS, /etc/dblockrun/jobs.yaml)\n"), args
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("args", [
    ["disable", "nosuchjob", "--for", "3h"], ["enable", "nosuchjob"], ["unlock", "nosuchjob"],
    ["run", "nosuchjob"], ["status", "nosuchjob"], ["history", "nosuchjob"],
])
def test_a_job_the_database_does_not_know_is_exit_2(sqlite_db: TestDb, args: list[str]) -> None:
    known(sqlite_db, "nightly")
    result = invoke(sqlite_db, *args)
    hint = {"disable": " (--create to disable it before a daemon has loaded it)",
            "run": " (has a daemon loaded it?)"}.get(args[0], "")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"dblockrun: no such job in {where(sqlite_db)}: nosuchjob{hint}\n"
    assert [j["name"] for j in status_doc(sqlite_db)["jobs"]] == ["nightly"]  # no phantom row


def test_disable_create_pauses_a_job_before_it_is_deployed(sqlite_db: TestDb) -> None:
    result = invoke(sqlite_db, "disable", "later", "--create", "--reason", "not yet")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"later disabled until forever in {where(sqlite_db)}\n"
    job = job_of(status_doc(sqlite_db), "later")
    assert (job["state"], job["disabled_reason"]) == ("disabled", "not yet")


def tables_of(db: TestDb) -> list[str]:
    import sqlalchemy as sa

    engine = sa.create_engine(db.url.replace("postgresql://", "postgresql+psycopg://")
                              .replace("mysql://", "mysql+pymysql://"))
    try:
        with engine.connect() as conn:
            return [t for t in sa.inspect(conn).get_table_names() if t.startswith(db.prefix)]
    finally:
        engine.dispose()


def test_a_missing_sqlite_file_is_not_created(sqlite_db: TestDb) -> None:
    for args in (["status"], ["history"], ["disable", "x"], ["unlock", "x"]):
        result = invoke(sqlite_db, *args)
        assert (result.exit_code, result.stdout, result.stderr) == (
            1, "", f"dblockrun: no dblockrun database at {where(sqlite_db)}: no such file; "
                   "start a daemon on it or run `dblockrun init-db`\n"), args
    assert not sqlite_file(sqlite_db).exists()


def test_read_only_commands_never_create_tables(db: TestDb) -> None:
    if db.backend == "sqlite":
        sqlite_file(db).touch()  # an empty file: a database without dblockrun's tables
    for args in (["status"], ["status", "--json"], ["history"], ["history", "--output", "1"],
                 ["enable", "x"], ["disable", "x"], ["run", "x"], ["unlock", "x"]):
        result = invoke(db, *args)
        assert (result.exit_code, result.stdout) == (1, ""), args
        assert result.stderr == (f"dblockrun: the database {where(db)} has no dblockrun "
                                 "tables; start a daemon on it or run `dblockrun init-db`\n"), args
    assert tables_of(db) == []
    result = invoke(db, "init-db")
    assert result.exit_code == 0, result.output
    assert tables_of(db) != []


def test_every_operator_command_names_its_database(
        server_databases: ServerDatabases, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    url = server_databases.url("postgresql").replace("://postgres@", "://postgres:s3cret@")
    db = TestDb("postgresql", url, new_prefix())
    shown = f"{redact(url)} (table prefix {db.prefix})"
    assert "postgres:***@" in shown
    try:
        known(db, "backup")
        result = invoke(db, "status")
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines()[0] == f"database: {shown}"
        expected = {
            ("disable", "backup", "--until", "2099-01-01T00:00:00Z"):
                f"backup disabled until 2099-01-01T00:00:00.000Z in {shown}\n",
            ("enable", "backup"): f"backup enabled in {shown}\n",
            ("run", "backup", "--no-wait"): f"backup: run requested in {shown}\n",
            ("unlock", "backup"): f"backup unlocked (token now 1) in {shown}\n",
        }
        for args, out in expected.items():
            result = invoke(db, *args)
            # (--db holds a password here: warned about, once.)
            assert (result.exit_code, result.stdout, result.stderr) == (
                0, out, f"{PASSWORD_WARNING}\n"), args
    finally:
        with Store(url, db.prefix) as store:
            store.drop_schema()


# -- issue 11, item 13: global options before or after the command --------------------------


def test_global_options_work_before_and_after_the_command(
        sqlite_db: TestDb, tmp_path: Path) -> None:
    known(sqlite_db, "nightly")
    jobs = fleet_jobs(tmp_path, sqlite_db)
    prefix = ["--table-prefix", sqlite_db.prefix]
    for args in (["status", "--json", "--db", sqlite_db.url, *prefix],
                 ["-f", jobs, *prefix, "status", "--json"],
                 ["status", "--json", "-f", jobs, *prefix],
                 ["--db", "sqlite:////nonexistent/x.db", "status", "--json", "--db",
                  sqlite_db.url, *prefix]):  # after the command wins
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, (args, result.output)
        assert [j["name"] for j in json.loads(result.stdout)["jobs"]] == ["nightly"], args
    result = CliRunner().invoke(cli, ["status", "--db", "redis://x", "--debug"])
    assert isinstance(result.exception, UsageError)  # --debug after the command: raised


# -- issue 11, item 14: database URLs and the table prefix ------------------------------------


def test_a_relative_sqlite_path_with_a_missing_folder_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for args in (["status"], ["history"]):
        result = invoke(None, "--db", "sqlite:///nonexistent/dir/x.db", *args)
        assert (result.exit_code, result.stdout) == (1, "")
        assert result.stderr == (
            "dblockrun: no dblockrun database at sqlite:///nonexistent/dir/x.db: no folder "
            f"{tmp_path}/nonexistent/dir (sqlite:///nonexistent/dir/x.db is relative to the "
            "current folder; sqlite:////PATH with four slashes is absolute); start a daemon "
            "on it or run `dblockrun init-db`\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--db", ""], {}, "--db is empty: give a database URL"),
    (["--db-file", ""], {}, "--db-file is empty: give the file holding the database URL"),
    ([], {"DBLOCKRUN_DB": ""},
     "DBLOCKRUN_DB is set but empty: give a database URL, or unset it"),
    ([], {"DBLOCKRUN_DB_FILE": " "},
     "DBLOCKRUN_DB_FILE is set but empty: give the file holding the database URL, or unset it"),
    ([], {"DBLOCKRUN_JOBS": ""}, "DBLOCKRUN_JOBS is set but empty: give a jobs file, or unset it"),
])
def test_an_empty_database_setting_is_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str],
        message: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for command in (["status"], ["exec", "-n", "x", "true"]):
        result = invoke(None, *args, *command)
        assert (result.exit_code, result.stdout, result.stderr) == (
            2, "", f"dblockrun: {message}\n"), command
    proc = run_cli([*args, "exec", "-n", "x", "true"], env=env)  # the click-free start too
    assert (proc.returncode, proc.stderr) == (2, f"dblockrun: {message}\n")
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("prefix", ["bad prefix", "Upper_", "1st_", "x;drop", "p" * 41, ""])
def test_a_bad_table_prefix_is_refused(sqlite_db: TestDb, prefix: str) -> None:
    message = (f"dblockrun: bad table prefix {prefix!r}: use lower-case letters, digits and "
               "'_', starting with a letter or '_' (at most 40)\n")
    for args in (["init-db"], ["status"], ["exec", "-n", "x", "true"]):
        result = invoke(None, "--db", sqlite_db.url, "--table-prefix", prefix, *args)
        assert (result.exit_code, result.stderr) == (2, message), args
    proc = run_cli(["--db", sqlite_db.url, "--table-prefix", prefix, "exec", "-n", "x", "true"])
    assert (proc.returncode, proc.stderr) == (2, message)
    assert not sqlite_file(sqlite_db).exists()


# -- issue 11, item 21: one line for every error ----------------------------------------------


def test_a_directory_as_the_jobs_file_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "jobs.d"
    folder.mkdir()
    for args in (["validate", str(folder)], ["next", str(folder)], ["daemon", str(folder)],
                 ["status", "-f", str(folder)], ["-f", str(folder), "disable", "x"]):
        result = invoke(None, *args)
        assert (result.exit_code, result.stdout, result.stderr) == (
            2, "", f"dblockrun: {folder}: not a regular file (a directory)\n"), args


def test_a_malformed_url_shows_all_but_its_password() -> None:
    proc = run_cli(["--db", "postgresql//u:s3cret@db.internal/ops", "status"])
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"{PASSWORD_WARNING}\n"
                           "dblockrun: database URL 'postgresql//u:***@db.internal/ops' is not "
                           "a URL (e.g. postgresql://host/db)\n")


# -- issue 11, item 24: help, metavars, logs, quick start ------------------------------------


def option_help(command: str, option: str) -> click.Option:
    param = next(p for p in cli.commands[command].params if option in getattr(p, "opts", ()))
    assert isinstance(param, click.Option)
    return param


def test_options_have_help_and_durations_say_so() -> None:
    assert option_help("history", "--limit").help == "How many runs, newest first."
    assert option_help("next", "-c").help == "How many fire times per job."
    durations = [("daemon", "--heartbeat"), ("daemon", "--lease"), ("daemon", "--grace"),
                 ("exec", "--lock-at-most"), ("exec", "--lock-at-least"), ("exec", "--lease"),
                 ("disable", "--for"), ("run", "--timeout")]
    assert {option_help(c, o).metavar for c, o in durations} == {"DURATION"}
    until = option_help("disable", "--until").help or ""
    assert until.endswith("without a zone, local time.")
    for name, command in cli.commands.items():
        for param in command.params:
            assert not isinstance(param, click.Option) or param.help, (name, param.name)


def test_the_daemon_names_its_database_in_plain_words(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    jobs = write(tmp_path / "jobs.yaml", "jobs:\n  one: {rate: 1d, command: 'true'}\n")
    proc = sqlite_fleet.start(Path(jobs), heartbeat=None, lease=None, grace=None, name="daemon",
                              env=env_without_db(), cwd=REPO)
    try:
        line = proc.wait(lambda: next((x for x in proc.text().splitlines()
                                       if " starting: " in x), None), 30, what="the start line")
    finally:
        assert proc.stop() == 0
    assert line.endswith(f" starting: 1 job from {jobs}, database {where(sqlite_db)}")


def test_quickstart_takes_daemon_options_without_a_jobs_file(tmp_path: Path) -> None:
    venv_cli = REPO / ".venv" / "bin" / "dblockrun"
    if not venv_cli.exists() or (REPO / "pyproject.toml").stat().st_mtime > \
            venv_cli.stat().st_mtime:
        pytest.skip("quickstart would install into .venv first")
    proc = Process([str(REPO / "scripts" / "quickstart"), "--log-format", "json"],
                   tmp_path / "quickstart.log", stdout_to_log=True, cwd=tmp_path,
                   env=env_without_db(XDG_STATE_HOME=str(tmp_path / "state")))
    try:
        def started() -> dict[str, Any] | None:
            for text in proc.text().splitlines():
                if text.startswith("{") and " starting: " in text:
                    doc: dict[str, Any] = json.loads(text)
                    return doc
            return None

        doc = wait_for(started, 30, what="the daemon's JSON start line")
    finally:
        proc.stop()
    assert "from examples/jobs.yaml" in doc["msg"]


def test_the_kubernetes_example_points_operator_commands_at_the_daemons_jobs_file() -> None:
    import yaml

    docs = list(yaml.safe_load_all((REPO / "examples" / "k8s-deployment.yaml").read_text()))
    deployment = next(d for d in docs if d and d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DBLOCKRUN_JOBS"] == container["args"][-1]


def test_without_a_jobs_file_daemon_validate_and_next_say_where_one_comes_from() -> None:
    for command in ("daemon", "validate", "next"):
        result = invoke(None, command)
        assert (result.exit_code, result.stdout, result.stderr) == (
            2, "", "dblockrun: no jobs file: give FILE or -f FILE, set DBLOCKRUN_JOBS, or "
                   "create /etc/dblockrun/jobs.yaml\n"), command


def test_validate_takes_the_jobs_file_from_f_or_dblockrun_jobs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "jobs.yaml", GOOD)
    assert invoke(None, "-f", path, "validate").stdout == f"{path}: ok, 2 job(s)\n"
    monkeypatch.setenv("DBLOCKRUN_JOBS", path)
    assert invoke(None, "validate").stdout == f"{path}: ok, 2 job(s)\n"
    other = write(tmp_path / "other.yaml", GOOD)
    result = invoke(None, "validate", other, "-f", path)
    assert (result.exit_code, result.stderr) == (
        2, f"dblockrun: two jobs files ({other} and -f {path}): give one\n")


@pytest.mark.parametrize(("args", "option"), [
    (["disable", "backup", "--for", "3"], "--for"),
    (["pause", "--for", "90"], "--for"),
    (["run", "backup", "--timeout", "5"], "--timeout"),
    (["status", "--live-within", "30"], "--live-within"),
    (["daemon", "--heartbeat", "2"], "--heartbeat"),
])
def test_a_duration_option_without_a_unit_says_so(sqlite_db: TestDb, args: list[str],
                                                  option: str) -> None:
    """Issue 23, item 10: `--for 3` is not three seconds by surprise."""
    result = invoke(sqlite_db, *args)
    number = args[-1]
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"dblockrun: {option}: '{number}' has no unit: write {number}s, "
                             f"{number}m, {number}h or {number}d\n")
    assert not sqlite_file(sqlite_db).exists()  # nothing was done


def test_a_plain_exec_with_a_lease_without_a_unit_says_so(sqlite_db: TestDb) -> None:
    """The exec path without click (dblockrun/__main__.py) refuses it too."""
    result = run_cli(["--db", sqlite_db.url, "exec", "-n", "x", "--lease", "30", "true"])
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "dblockrun: --lease: '30' has no unit: write 30s, 30m, 30h or 30d\n"


def test_cron_every_points_to_rate(tmp_path: Path) -> None:
    path = write(tmp_path / "jobs.yaml", 'jobs:\n  a:\n    cron: "@every 5m"\n'
                                          '    command: "true"\n')
    result = invoke(None, "validate", path)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"dblockrun: {path}:3: job 'a': cron: '@every 5m' is not cron: "
                             "for a fixed interval write `rate: 5m` instead of `cron:`\n")


# -- issue 23, item 13: command-line consistency --------------------------------------------


@pytest.mark.parametrize("command", ["history", "audit"])
def test_dash_n_is_execs_name_only(sqlite_db: TestDb, command: str) -> None:
    """`-n` was `--limit` here and `--name` in exec: it is exec's alone now."""
    known(sqlite_db, "backup")
    result = invoke(sqlite_db, command, "-n", "3")
    assert (result.exit_code, result.stdout) == (2, "")
    assert "No such option '-n'" in result.stderr
    assert invoke(sqlite_db, command, "--limit", "3").exit_code == 0
    assert [o for _c, o in _short_options() if o == "-n"] == ["-n"]  # exec's --name


def _short_options() -> list[tuple[str, str]]:
    return [(name, opt) for name, command in cli.commands.items() for param in command.params
            if isinstance(param, click.Option) and not param.hidden
            for opt in param.opts if not opt.startswith("--")]


def test_global_options_are_described_once_in_help() -> None:
    top = invoke(None, "--help")
    assert top.exit_code == 0 and "--db URL" in top.stdout and "--table-prefix" in top.stdout
    for name in cli.commands:
        result = invoke(None, name, "--help")
        assert result.exit_code == 0, name
        assert "--db URL" not in result.stdout and "--debug" not in result.stdout.split(
            "Options:")[1], name
        assert "may also follow the command name: see `dblockrun --help`." in " ".join(
            result.stdout.split()), name
    # Still accepted after the command name.
    assert invoke(None, "validate", "--debug", "--help").exit_code == 0


def test_ctrl_c_while_kill_waits_exits_130_without_aborted(sqlite_db: TestDb) -> None:
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        store.ensure_jobs(["report"])
        won = store.claim_and_record("report", "web-1:7:ab", 300)  # a run no daemon stops
        assert won is not None
        proc = track(subprocess.Popen(
            [*dblockrun_cmd(), "--db", sqlite_db.url, "--table-prefix", sqlite_db.prefix,
             "kill", "report", "--timeout", "60s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_db(),
            preexec_fn=sigint_default))
        try:
            wait_for(lambda: bool(store.control.entries("report")), 30, what="the kill request")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert (proc.returncode, out, err) == (130, "", "")


def test_json_durations_are_rounded_to_the_millisecond() -> None:
    from dblockrun.ops.output import run_json
    from dblockrun.store.models import RunRecord

    run = RunRecord(id=1, job="j", item=None, host="h", slot=None, token=1, attempt=1,
                    started=1000.0, finished=1001.23456789, exit_code=0, result="ok")
    doc = run_json(run)
    assert doc is not None and doc["duration"] == 1.235


def test_shell_completion_completes_job_names(sqlite_db: TestDb,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from click.shell_completion import ShellComplete

    known(sqlite_db, "backup", "backup-users", "report")

    def complete(*words: str) -> list[str]:
        found = ShellComplete(cli, {}, "dblockrun", "_DBLOCKRUN_COMPLETE").get_completions(
            list(words[:-1]), words[-1])
        return [item.value for item in found]

    head = ("--db", sqlite_db.url, "--table-prefix", sqlite_db.prefix)
    assert complete(*head, "disable", "ba") == ["backup", "backup-users"]
    assert complete(*head, "status", "backup", "") == ["backup", "backup-users", "report"]
    # Global options after the command name count too.
    assert complete("kill", *head, "r") == ["report"]
    # No database in reach: nothing, and nothing created.
    monkeypatch.setenv("XDG_STATE_HOME", str(sqlite_file(sqlite_db).parent / "state"))
    assert complete("enable", "b") == []
    assert not (sqlite_file(sqlite_db).parent / "state").exists()


# -- issue 23, item 6: `run` tells the truth -------------------------------------------------


def test_run_says_at_once_when_no_daemon_is_live_or_the_fleet_is_paused(
        db: TestDb, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    known(db, "backup")
    filed = ("; the request stays filed (`dblockrun run backup --cancel` withdraws it)\n")
    started = time.monotonic()
    result = invoke(db, "run", "backup", "--timeout", "30s")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == ("dblockrun: backup: no daemon is live (none sent a heartbeat "
                             "within 1.5 of its --heartbeat, 15s by default); it starts once "
                             "one that has backup is" + filed)
    assert time.monotonic() - started < 10  # not the 30 s timeout
    table = invoke(db, "status", "--wide").stdout.splitlines()
    line = [s for s in table if s.startswith("backup ")]
    assert re.match(r"backup +idle; run requested \d+\.\ds ago +- ", line[0]), line

    assert invoke(db, "pause", "--reason", "db upgrade").exit_code == 0
    result = invoke(db, "run", "backup")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (f"dblockrun: backup: the fleet is paused (by {operator_id()}: db "
                             "upgrade); it starts after `dblockrun resume`" + filed)
    # --no-wait files it and says no more.
    result = invoke(db, "run", "backup", "--no-wait")
    assert (result.exit_code, result.stdout) == (0, f"backup: run requested in {where(db)}\n")

    assert invoke(db, "run", "backup", "--cancel").stdout == (
        f"backup: run request withdrawn in {where(db)}\n")
    assert invoke(db, "run", "backup", "--cancel").stdout == (
        f"backup: no run request filed in {where(db)}: nothing to do (nothing recorded)\n")
    assert job_of(status_doc(db), "backup")["run_requested"] is None
    with Store(db.url, db.prefix) as store:
        assert [e.action for e in store.control.entries("backup")] == [
            "cancel-run", "run", "run", "run"]
    result = invoke(db, "run", "backup", "--wait", "--no-wait")
    assert (result.exit_code, result.stderr) == (
        2, "dblockrun: give one of --no-wait, --wait and --cancel\n")


# -- issue 36 -------------------------------------------------------------------------


def test_top_help_points_at_the_options_where_they_are() -> None:
    """Item 9: the global options are listed below the description that
    says they may follow the command name, and it says so."""
    text = invoke(None, "--help").stdout
    said = " ".join(text.split("Options:")[0].split())
    assert "The options below (--db, --db-file, -f, --table-prefix, --debug) may also follow " \
           "the command name" in said
    assert "above" not in said


def test_validate_reports_every_problem_of_a_file(tmp_path: Path) -> None:
    """Item 4: ``comand`` and ``lock-at-mots`` in one file are two lines,
    each with its file and line, exit 2 (it said only ``comand``)."""
    jobs = write(tmp_path / "jobs.yaml", "jobs:\n  x:\n    cron: '* * * * *'\n"
                 "    comand: echo\n    lock-at-mots: 5m\n")
    proc = subprocess.run([*dblockrun_cmd(), "validate", jobs], capture_output=True, text=True,
                          env=env_without_db(), timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        f"dblockrun: {jobs}:4: job 'x': comand: unknown key (did you mean 'command'?)\n"
        f"dblockrun: {jobs}:5: job 'x': lock-at-mots: unknown key (did you mean "
        "'lock-at-most'?)\n")
