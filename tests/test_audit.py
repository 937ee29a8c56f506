"""The audit trail (issue 13 item 5), on every backend: each operator action
(disable, enable, run, kill, unlock, pause, resume) records who, when, what
and why; `dblockrun audit [JOB]` shows them; `status` shows who disabled a
job."""

from __future__ import annotations

import getpass
import json
import re
import socket
from datetime import datetime
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers import TestDb

from dblockrun.cli import cli
from dblockrun.ops.who import operator_id
from dblockrun.store import Store
from dblockrun.store.status import report


def parse_iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def invoke(db: TestDb, *args: str) -> Result:
    head = ["--db", db.url, "--table-prefix", db.prefix]
    result = CliRunner().invoke(cli, [*head, *args], prog_name="dblockrun")
    return result


def ok(db: TestDb, *args: str) -> str:
    result = invoke(db, *args)
    assert (result.exit_code, result.stderr) == (0, ""), (args, result.output)
    return result.stdout


def entries(db: TestDb, *args: str) -> list[dict[str, Any]]:
    doc = json.loads(ok(db, "audit", "--json", *args))
    assert set(doc) == {"version", "entries"} and doc["version"] == 1
    found: list[dict[str, Any]] = doc["entries"]
    return found


def test_every_operator_action_is_audited(db: TestDb, store: Store) -> None:
    store.ensure_jobs(["backup", "report"])
    me = operator_id()
    before = store.db_now()
    ok(db, "disable", "backup", "--for", "1h", "--reason", "disk full")
    ok(db, "enable", "backup")
    ok(db, "run", "backup", "--no-wait")
    ok(db, "unlock", "backup")
    ok(db, "pause", "--for", "2h", "--reason", "db upgrade")
    ok(db, "resume")
    won = store.claim_and_record("report", "web-1:7:ab", 30)
    assert won is not None
    ok(db, "kill", "report", "--no-wait", "--reason", "stuck")
    ok(db, "disable", "report")
    found = entries(db)
    assert [{k: e[k] for k in ("who", "action", "job", "detail", "reason")} for e in found] == [
        {"who": me, "action": "disable", "job": "report", "detail": "until enabled",
         "reason": None},
        {"who": me, "action": "kill", "job": "report",
         "detail": f"run {won.run_id} on web-1:7:ab (token 1)", "reason": "stuck"},
        {"who": me, "action": "resume", "job": None, "detail": None, "reason": None},
        {"who": me, "action": "pause", "job": None, "detail": "for 2h", "reason": "db upgrade"},
        {"who": me, "action": "unlock", "job": "backup", "detail": None, "reason": None},
        {"who": me, "action": "run", "job": "backup", "detail": None, "reason": None},
        {"who": me, "action": "enable", "job": "backup", "detail": None, "reason": None},
        {"who": me, "action": "disable", "job": "backup", "detail": "for 1h",
         "reason": "disk full"},
    ]
    # Newest first, ids and times (the database clock) in order.
    ids = [e["id"] for e in found]
    assert ids == sorted(ids, reverse=True)
    times = [parse_iso(e["at"]) for e in found]
    assert times == sorted(times, reverse=True) and times[-1] >= before - 0.01
    # One job's entries; a limit.
    assert [e["action"] for e in entries(db, "backup")] == ["unlock", "run", "enable", "disable"]
    assert [e["action"] for e in entries(db, "--limit", "2")] == ["disable", "kill"]
    # The table.
    table = ok(db, "audit", "backup", "--limit", "1").splitlines()
    assert table[0] == "operator actions"
    assert table[1].split() == ["id", "at", "who", "action", "job", "detail"]
    assert table[3].split()[3:] == [me, "unlock", "backup", "-"]


def test_what_fails_is_not_audited(db: TestDb, store: Store) -> None:
    store.ensure_jobs(["idle"])
    assert invoke(db, "enable", "nope").exit_code == 2
    assert invoke(db, "unlock", "nope").exit_code == 2
    assert invoke(db, "kill", "idle").exit_code == 1
    ok(db, "resume")  # not paused: nothing to resume
    assert entries(db) == []
    assert invoke(db, "audit", "nope").stderr.startswith("dblockrun: no such job in ")


def test_status_shows_who_disabled_a_job(db: TestDb, store: Store) -> None:
    store.ensure_jobs(["backup", "report"])
    ok(db, "disable", "backup", "--reason", "disk full")
    doc = json.loads(ok(db, "status", "--json"))
    jobs = {j["name"]: j for j in doc["jobs"]}
    assert (jobs["backup"]["disabled_by"], jobs["backup"]["disabled_reason"]) == (
        operator_id(), "disk full")
    assert jobs["report"]["disabled_by"] is None
    line = [s for s in ok(db, "status", "--wide").splitlines() if s.startswith("backup ")]
    assert f"disabled until enabled by {operator_id()}: disk full" in line[0]
    # Enabled: nobody disabled it any more.
    ok(db, "enable", "backup")
    assert report(store, ["backup"]).jobs[0].lock.disabled_by is None


def test_who_is_the_user_behind_sudo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "ops-1")
    monkeypatch.setattr(getpass, "getuser", lambda: "root")
    monkeypatch.setenv("SUDO_USER", "alice")
    assert operator_id() == "alice@ops-1"
    monkeypatch.delenv("SUDO_USER")
    assert operator_id() == "root@ops-1"
    monkeypatch.setattr(getpass, "getuser", lambda: "bob")
    monkeypatch.setenv("SUDO_USER", "alice")  # bob's own shell, sudo's variable left over
    assert operator_id() == "bob@ops-1"


def test_a_second_disable_says_what_it_replaced_and_enable_of_an_enabled_job_records_nothing(
        db: TestDb, store: Store) -> None:
    """Issue 23, item 10."""
    store.ensure_jobs(["backup"])
    me, where = operator_id(), f"{db.url} (table prefix {db.prefix})"
    first = ok(db, "disable", "backup", "--until", "2099-01-02T03:04:05Z", "--reason", "disk full")
    assert first == f"backup disabled until 2099-01-02T03:04:05.000Z in {where}\n"
    second = ok(db, "disable", "backup", "--until", "2099-02-01T00:00:00Z")
    assert second == (f"backup disabled until 2099-02-01T00:00:00.000Z in {where}; this "
                      f"replaces the disable until 2099-01-02T03:04:05.000Z by {me} "
                      "(disk full)\n")
    assert ok(db, "enable", "backup") == f"backup enabled in {where}\n"
    assert ok(db, "enable", "backup") == (
        f"backup was not disabled in {where}: nothing to do (nothing recorded)\n")
    # A disable that ran out is no disable: nothing to replace, nothing to clear.
    store.disable("backup", until=store.db_now() - 10)
    assert ok(db, "enable", "backup").startswith("backup was not disabled in ")
    assert ok(db, "disable", "backup", "--for", "1h").endswith(f" in {where}\n")
    assert [e["action"] for e in entries(db)] == ["disable", "enable", "disable", "disable"]


def test_disable_until_a_passed_time_is_refused(db: TestDb, store: Store) -> None:
    store.ensure_jobs(["backup"])
    result = invoke(db, "disable", "backup", "--until", "2020-01-01T00:00:00Z")
    assert (result.exit_code, result.stdout) == (2, "")
    assert re.fullmatch(r"dblockrun: --until 2020-01-01T00:00:00\.000Z has passed \(the "
                        r"database's clock reads \S+Z\): nothing would be disabled\n",
                        result.stderr), result.stderr
    assert report(store, ["backup"]).jobs[0].state == "idle"
    assert entries(db) == []


@pytest.mark.parametrize("args", [
    ["disable", "backpu"], ["enable", "backpu"], ["unlock", "backpu"], ["run", "backpu"],
    ["status", "backpu"], ["history", "backpu"], ["kill", "backpu"], ["audit", "backpu"],
])
def test_every_operator_command_suggests_a_known_job(db: TestDb, store: Store,
                                                     args: list[str]) -> None:
    store.ensure_jobs(["backup", "backup-users", "report"])
    result = invoke(db, *args)
    hint = {"disable": " (--create to disable it before a daemon has loaded it)",
            "run": " (has a daemon loaded it?)"}.get(args[0], "")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"dblockrun: no such job in {db.url} (table prefix {db.prefix}): "
                             f"backpu (did you mean backup?){hint}\n")
