"""The command line as a user drives it: output, exit statuses, where the database is."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import ServerDatabases, new_prefix, sqlite_url
from helpers import TestDb, dblockrun_cmd

from dblockrun.cli import cli
from dblockrun.dburl import redact
from dblockrun.store import Store

REPO = Path(__file__).resolve().parent.parent

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
    monkeypatch.delenv("DBLOCKRUN_DB", raising=False)
    monkeypatch.delenv("DBLOCKRUN_TABLE_PREFIX", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def invoke(db: TestDb | None, *args: str) -> Result:
    """`dblockrun [--db URL --table-prefix P] ARGS...` in-process."""
    head = ["--db", db.url, "--table-prefix", db.prefix] if db is not None else []
    return CliRunner().invoke(cli, [*head, *args], prog_name="dblockrun")


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


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
    full_env.pop("DBLOCKRUN_DB", None)
    full_env.pop("DBLOCKRUN_TABLE_PREFIX", None)
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
    result = invoke(sqlite_db, "disable", "backup", "--for", "3h", "--reason", "maintenance")
    assert result.exit_code == 0, result.output
    m = re.fullmatch(r"backup disabled until (\S+Z)\n", result.stdout)
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
    assert result.stdout == "backup enabled\n"
    job = job_of(status_doc(sqlite_db), "backup")
    assert job["state"] == "idle"
    assert job["disabled_until"] is None
    assert job["disabled_reason"] is None


def test_disable_without_duration_is_forever(sqlite_db: TestDb) -> None:
    result = invoke(sqlite_db, "disable", "backup")
    assert result.exit_code == 0
    assert result.stdout == "backup disabled until forever\n"
    job = job_of(status_doc(sqlite_db), "backup")
    assert job["state"] == "disabled"
    assert job["disabled_until"] == "forever"
    assert job["disabled_reason"] is None


def test_disable_until_a_time(sqlite_db: TestDb) -> None:
    result = invoke(sqlite_db, "disable", "backup", "--until", "2099-01-02T03:04:05Z")
    assert result.exit_code == 0
    assert result.stdout == "backup disabled until 2099-01-02T03:04:05.000Z\n"
    assert job_of(status_doc(sqlite_db), "backup")["disabled_until"] == "2099-01-02T03:04:05.000Z"


def test_enable_unknown_job_exits_2(sqlite_db: TestDb) -> None:
    result = invoke(sqlite_db, "enable", "nope")
    assert result.exit_code == 2
    assert result.stderr == "dblockrun: no such job in the database: nope\n"


def test_disable_for_and_until_together_exit_2(sqlite_db: TestDb) -> None:
    result = invoke(sqlite_db, "disable", "backup", "--for", "3h",
                    "--until", "2099-01-01T00:00:00Z")
    assert result.exit_code == 2
    assert result.stderr == "dblockrun: give --for or --until, not both\n"
    assert status_doc(sqlite_db)["jobs"] == []  # nothing was disabled


def test_disable_bad_duration_exits_2(sqlite_db: TestDb) -> None:
    result = invoke(sqlite_db, "disable", "backup", "--for", "5x")
    assert result.exit_code == 2
    assert ("Invalid value for --for: '5x' is not a duration "
            "(use e.g. 250ms, 90s, 5m, 1h30m, 2d)") in result.stderr
    assert "Traceback" not in result.output


def test_status_json_shape(sqlite_db: TestDb) -> None:
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        store.ensure_jobs(["a", "b"])
        token = store.claim("a", "other-host", 30)
    assert token == 1
    doc = status_doc(sqlite_db)
    assert set(doc) == {"version", "db_time", "jobs", "hosts"}
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
    invoke(sqlite_db, "disable", "known")
    result = invoke(sqlite_db, "status", "known", "nope")
    assert result.exit_code == 2
    assert result.stderr == "dblockrun: no such job in the database: nope\n"


def test_status_table_shows_disabled_reason(
    sqlite_db: TestDb, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich folds cells on narrow terminals
    invoke(sqlite_db, "disable", "backup", "--reason", "disk full")
    result = invoke(sqlite_db, "status")
    assert result.exit_code == 0
    assert "backup" in result.stdout
    assert "until enabled: disk full" in result.stdout


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
            cli, [*extra, "--table-prefix", "p_", "disable", job, "-f", jobs])
        assert result.exit_code == 0, result.output

    monkeypatch.setenv("DBLOCKRUN_DB", env)
    disable("one", "--db", flag)
    assert where_is("one", *everywhere) == [flag]
    disable("two")
    assert where_is("two", *everywhere) == [env]
    monkeypatch.delenv("DBLOCKRUN_DB")
    disable("three")
    assert where_is("three", *everywhere) == [infile]
    result = CliRunner().invoke(cli, ["--table-prefix", "p_", "disable", "four"])
    assert result.exit_code == 0, result.output
    assert where_is("four", *everywhere) == [default]


def test_default_sqlite_file_is_private(tmp_path: Path) -> None:
    result = invoke(None, "disable", "backup")
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
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dblockrun: database error")
    assert "s3cret" not in proc.stderr


def test_malformed_url_exits_2_without_password_or_traceback() -> None:
    proc = run_cli(["--db", "postgresql://u:s3cret@127.0.0.1:abc/x", "status"])
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "s3cret" not in proc.stderr
    assert proc.stderr == (
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
    ("u:s3cret@host", "***"),
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
    assert result.stderr == f"dblockrun: no run {run['id'] + 100}\n"


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
