"""``dblockrun plan NEW``: what deploying a changed jobs file would do
(issue 37 item 2).

The slot lists are `next`'s (scheduling/cron.py), daylight saving included;
the passed slots are the misfire policy's (scheduling/planner.py) from the
job's last recorded slot in the database; the limits are `validate`'s
warnings; the hosts are what the live daemons publish. Exit status 0: no
change, 1: a change, 2: an error.
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner, Result
from harness import Fleet
from helpers import TestDb, cli, set_last_slot, wait_for
from helpers import invoke as in_process

from dblockrun.cli import cli as dblockrun
from dblockrun.config.load import load_jobs_text
from dblockrun.ops.plan import (
    ADDED,
    CHANGED,
    REMOVED,
    RUNS_CURRENT,
    RUNS_NONE,
    RUNS_OTHER,
    FleetFacts,
    job_slots,
    key_changes,
    make_plan,
)
from dblockrun.store import Store
from dblockrun.store.models import HostStatus

OLD = """\
jobs:
  report:
    cron: "0 6 * * *"
    timezone: Europe/Amsterdam
    command: ./report --all
    env: {TOKEN: first}
  cleanup:
    rate: 6h
    command: ./cleanup
  gone:
    cron: "*/5 * * * *"
    command: "true"
"""
NEW = """\
jobs:
  report:
    cron: "30 2 * * *"
    timezone: Europe/Amsterdam
    command: ./report --fast
    env: {TOKEN: second}
    starting-deadline: 1h
  cleanup:
    rate: 6h
    command: ./cleanup
  fresh:
    cron: "0 * * * *"
    command: ./fresh
"""


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def invoke(db: TestDb, *args: str) -> Result:
    return CliRunner().invoke(dblockrun, ["--db", db.url, "--table-prefix", db.prefix, *args],
                              prog_name="dblockrun")


def files(tmp_path: Path, old: str = OLD, new: str = NEW) -> tuple[str, str]:
    (tmp_path / "old.yaml").write_text(old)
    (tmp_path / "new.yaml").write_text(new)
    return str(tmp_path / "old.yaml"), str(tmp_path / "new.yaml")


def doc_of(result: Result) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def jobs_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {job["name"]: job for job in doc["jobs"]}


def no_fleet(now: float) -> FleetFacts:
    return FleetFacts(now, (), {}, b"k" * 32)


# -- the slot lists, daylight saving included (pure) ----------------------------------


def test_slots_before_and_after_cross_the_spring_gap_in_amsterdam() -> None:
    old = load_jobs_text(OLD, "old.yaml")
    new = load_jobs_text(NEW, "new.yaml")
    now = at("2027-03-26T12:00:00+00:00")
    plan = make_plan(new, old, no_fleet(now), count=4)
    report = next(j for j in plan.jobs if j.name == "report")
    assert report.change == CHANGED
    assert report.before is not None and report.after is not None
    assert report.before.shown() == ["2027-03-27T06:00:00+01:00", "2027-03-28T06:00:00+02:00",
                                     "2027-03-29T06:00:00+02:00", "2027-03-30T06:00:00+02:00"]
    # 02:30 does not exist on 28 March: the slot runs once, as the gap ends.
    assert report.after.shown() == ["2027-03-27T02:30:00+01:00", "2027-03-28T03:00:00+02:00",
                                    "2027-03-29T02:30:00+02:00", "2027-03-30T02:30:00+02:00"]


def test_the_repeated_autumn_hour_is_one_slot_and_days_bound_the_list() -> None:
    new = load_jobs_text(NEW, "new.yaml")
    report = new.job("report")
    assert report is not None
    slots = job_slots(report, at("2027-10-30T12:00:00+00:00"), 1000,
                      until=at("2027-10-30T12:00:00+00:00") + 3 * 86400)
    assert slots.shown() == ["2027-10-31T02:30:00+02:00", "2027-11-01T02:30:00+01:00",
                             "2027-11-02T02:30:00+01:00"]
    assert not slots.more
    cut = job_slots(report, at("2027-10-30T12:00:00+00:00"), 2,
                    until=at("2027-10-30T12:00:00+00:00") + 3 * 86400)
    assert len(cut.times) == 2 and cut.more


def test_changed_keys_show_old_and_new_values_but_no_secret() -> None:
    old = load_jobs_text(OLD, "old.yaml").job("report")
    new = load_jobs_text(NEW, "new.yaml").job("report")
    assert old is not None and new is not None
    changes = {k.key: (k.before, k.after) for k in key_changes(old, new)}
    assert changes == {
        "command": ("./report --all", "./report --fast"),
        "cron": ("0 6 * * *", "30 2 * * *"),
        "env": ("TOKEN", "TOKEN (a value differs)"),  # names only: values may be secrets
        "starting-deadline": (None, "1h"),
    }


# -- against a database ---------------------------------------------------------------


def test_exit_status_0_without_change_1_with_one_2_on_a_bad_file(
        db: TestDb, tmp_path: Path) -> None:
    old, new = files(tmp_path)
    with Store(db.url, db.prefix) as store:
        store.ensure_schema()
    same = invoke(db, "plan", old, "--current", old)
    assert same.exit_code == 0, same.output
    assert same.stdout.splitlines()[-1] == "no change; 3 unchanged"

    changed = invoke(db, "plan", new, "--current", old)
    assert changed.exit_code == 1, changed.output
    lines = changed.stdout.splitlines()
    assert "added fresh" in lines
    assert "removed gone" in lines
    assert "changed report: command, cron, env, starting-deadline" in lines
    assert "  cron               0 6 * * * -> 30 2 * * *" in lines
    assert "  starting-deadline  (not set) -> 1h" in lines
    assert lines[-1] == "1 added, 1 removed, 1 changed; 1 unchanged"
    # The slot table: a column per side, each in its job's zone.
    head = lines.index("  next slots:", lines.index("changed report: command, cron, env, "
                                                    "starting-deadline"))
    assert lines[head + 1].split() == ["before", "(Europe/Amsterdam)", "after",
                                       "(Europe/Amsterdam)"]
    assert len([line for line in lines[head + 2:head + 12] if "T06:00:00" in line
                and "T02:30:00" in line]) >= 9  # (one day of the ten may cross DST)

    bad = tmp_path / "bad.yaml"
    bad.write_text(NEW.replace("starting-deadline: 1h", "starting-deadline: soon"))
    # A real process: plan's exit 2, one line and no traceback end to end.
    refused = cli("--db", db.url, "--table-prefix", db.prefix, "plan", str(bad),
                  "--current", old)
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr.startswith(f"dblockrun: {bad}:7: job 'report': starting-deadline: ")
    assert "Traceback" not in refused.stderr
    assert len(refused.stderr.splitlines()) == 1


def test_no_database_is_exit_status_2_not_a_change(tmp_path: Path) -> None:
    old, new = files(tmp_path)
    missing = tmp_path / "none.db"
    result = in_process("--db", f"sqlite:///{missing}", "plan", new, "--current", old)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("dblockrun: no dblockrun database at ")
    assert result.stdout == ""


def test_passed_slots_are_caught_up_or_recorded_missed_by_the_new_policy(
        db: TestDb, tmp_path: Path) -> None:
    old, new = files(tmp_path)
    now = time.time()
    with Store(db.url, db.prefix) as store:
        store.ensure_schema()
        # fresh (re-added) last ran 2.5 hours ago; report three days ago.
        set_last_slot(store, "fresh", now - 2.5 * 3600)
        set_last_slot(store, "report", now - 3 * 86400)
    result = invoke(db, "plan", new, "--current", old, "--json")
    assert result.exit_code == 1, result.output
    jobs = jobs_of(doc_of(result))
    fresh = jobs["fresh"]["passed"]
    # catch-up: latest (the default) runs the newest passed slot; the others
    # (one or two hourly slots in 2.5 hours, by the minute now) are missed.
    passed = {math.floor(t / 3600) - math.floor((now - 2.5 * 3600) / 3600)
              for t in (now, time.time())}
    assert len(fresh["run"]) == 1 and len(fresh["recorded"]) + 1 in passed, fresh
    assert fresh["result"] == "missed"
    assert datetime.fromisoformat(fresh["run"][0].replace("Z", "+00:00")).minute == 0
    # report: its starting-deadline (1h) makes every passed 02:30 slot
    # (Amsterdam) older than an hour missed; within the hour after one
    # (01:30-02:30 UTC in winter) that newest one is still to run.
    report = jobs["report"]["passed"]
    local = datetime.fromtimestamp(now, ZoneInfo("Europe/Amsterdam"))
    newest = local.replace(hour=2, minute=30, second=0, microsecond=0)
    if newest > local:
        newest -= timedelta(days=1)
    age = now - newest.timestamp()
    if age < 3600 - 60:
        assert report["run"] == [newest.astimezone(UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.000Z")], report
    elif age > 3600 + 60:
        assert report["run"] == [], report
    assert len(report["run"]) + len(report["recorded"]) in (2, 3), report
    assert "starting-deadline 3600s" in report["reason"]
    text = invoke(db, "plan", new, "--current", old).stdout
    assert "    runs (catch-up): " in text
    assert "    recorded missed: " in text


def test_limits_the_new_file_makes_full_are_warned_of(db: TestDb, tmp_path: Path) -> None:
    grouped = NEW.replace("jobs:\n", "groups: {backups: 1}\njobs:\n", 1) + (
        '  one:\n    cron: "0 * * * *"\n    command: x\n    group: backups\n'
        '  two:\n    cron: "0 * * * *"\n    command: x\n    group: backups\n')
    old, new = files(tmp_path, new=grouped)
    with Store(db.url, db.prefix) as store:
        store.ensure_schema()
    result = invoke(db, "plan", new, "--current", old, "--max-running", "2")
    assert result.exit_code == 1, result.output
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning: ")]
    assert warnings[0].startswith("warning: group backups (limit 1): one, two come due "
                                  "together (first at ")
    assert warnings[0].endswith("(new with this file)")
    assert warnings[1].startswith("warning: --max-running 2: fresh, one, two come due")
    doc = doc_of(invoke(db, "plan", new, "--current", old, "--max-running", "2", "--json"))
    assert [w["new"] for w in doc["warnings"]] == [True, True]


def test_json_shape(db: TestDb, tmp_path: Path) -> None:
    old, new = files(tmp_path)
    with Store(db.url, db.prefix) as store:
        store.ensure_schema()
    doc = doc_of(invoke(db, "plan", new, "--current", old, "--json", "--count", "3"))
    assert set(doc) == {"version", "database", "new", "current", "now", "changed", "jobs",
                        "unchanged", "hosts", "warnings", "notes"}
    assert doc["changed"] is True and doc["unchanged"] == ["cleanup"] and doc["hosts"] == []
    jobs = jobs_of(doc)
    assert {name: job["change"] for name, job in jobs.items()} == {
        "fresh": ADDED, "gone": REMOVED, "report": CHANGED}
    assert set(jobs["report"]) == {"name", "change", "keys", "before", "after", "passed",
                                   "hosts", "notes"}
    assert len(jobs["report"]["after"]["slots"]) == 3
    assert jobs["gone"]["after"] is None
    assert {"key": "cron", "before": "0 6 * * *", "after": "30 2 * * *",
            "known": True} in jobs["report"]["keys"]


# -- against a running fleet ------------------------------------------------------------


@pytest.mark.slow
def test_plan_names_the_hosts_running_the_old_definition_until_they_run_the_new(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    old, new = files(tmp_path)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(OLD)
    daemons = fleet.start_n(2, jobs, lease="6s", heartbeat="1s")

    def hosts_running(text: str) -> list[str] | None:
        live = fleet.store.live_hosts()
        if len(live) == 2 and all(text in (h.jobs or "") for h in live):
            return [h.id for h in live]
        return None

    ids = wait_for(lambda: hosts_running('"gone"'), 60, what="2 daemons publishing OLD")
    result = fleet.cli("plan", new, "--current", old)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    report = lines[lines.index("changed report: command, cron, env, starting-deadline"):]
    for host in ids:
        assert any(line.startswith("  host ") and f"({host}): runs the current definition ("
                   in line and line.endswith("keeps it with NEW") for line in report), report
    doc = doc_of_text(fleet.cli("plan", new, "--current", old, "--json").stdout)
    assert {d["id"] for d in jobs_of(doc)["report"]["hosts"]
            if d["runs"] == RUNS_CURRENT} == set(ids)
    assert {d["id"] for d in jobs_of(doc)["gone"]["hosts"] if not d["keeps"]} == set(ids)

    # The fleet takes NEW (a reload); the same plan then has nothing to do.
    jobs.write_text(NEW)
    for daemon in daemons:
        daemon.send(signal.SIGHUP)
    wait_for(lambda: hosts_running('"fresh"'), 60, what="2 daemons publishing NEW")
    after = fleet.cli("plan", new, "--current", old)
    assert after.returncode == 0, after.stdout + after.stderr
    assert after.stdout.splitlines()[-1] == "no change; 3 unchanged"
    assert fleet.stop() == [0, 0]


def doc_of_text(text: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(text)
    return doc


def test_with_no_live_daemon_and_no_current_file_every_job_is_added() -> None:
    """With no live daemon and no database rows, every job of NEW not in the
    current file is added; the plan names no host."""
    new = load_jobs_text(NEW, "new.yaml")
    plan = make_plan(new, None, no_fleet(at("2026-12-01T00:00:00+00:00")))
    assert {j.name: j.change for j in plan.jobs} == {"report": ADDED, "cleanup": ADDED,
                                                     "fresh": ADDED}
    assert all(j.hosts == () for j in plan.jobs)
    assert plan.notes == ("no live daemon: the before side is empty (no current jobs file): "
                          "every job of NEW is added",)


# -- the hosts' published definitions (pure) ----------------------------------------------

KEY = b"k" * 32


def host(name: str, jobs: dict[str, Any], labels: dict[str, str] | None = None) -> HostStatus:
    """A live host as its row reads: ``jobs`` each a Job it runs."""
    return HostStatus(
        id=f"{name}:1:ab", hostname=name, pid=1, version="x", started=0.0, last_seen=0.0,
        clock_offset=0.0, running=0,
        jobs=json.dumps({row: job.definition_hash(KEY) for row, job in jobs.items()}),
        labels=json.dumps(labels or {"hostname": name}),
        fields=json.dumps({row: job.field_digests(KEY) for row, job in jobs.items()}))


def test_hosts_are_named_with_the_definition_each_runs() -> None:
    old, new = load_jobs_text(OLD, "old.yaml"), load_jobs_text(NEW, "new.yaml")
    third = load_jobs_text(OLD.replace("./report --all", "./report --third"), "third.yaml")
    runs_old = {j.name: j for j in old.jobs}
    hosts = (host("web-1", runs_old), host("web-2", {**runs_old, "report": third.jobs[0]}))
    plan = make_plan(new, old, FleetFacts(at("2026-12-01T00:00:00+00:00"), hosts, {}, KEY))
    report = next(j for j in plan.jobs if j.name == "report")
    assert [(d.hostname, d.runs, d.keeps) for d in report.hosts] == [
        ("web-1", RUNS_CURRENT, True), ("web-2", RUNS_OTHER, True)]
    assert report.keys[0].known  # web-1 runs the current file's: its values are known
    assert ("job report: web-2 run a definition that is neither the current file's nor NEW's"
            in plan.notes)
    gone = next(j for j in plan.jobs if j.name == "gone")
    assert (gone.change, [d.keeps for d in gone.hosts]) == (REMOVED, [False, False])
    fresh = next(j for j in plan.jobs if j.name == "fresh")
    assert (fresh.change, [d.runs for d in fresh.hosts]) == (ADDED, [RUNS_NONE, RUNS_NONE])

    # Only the third definition runs: the keys come from its digests, values unknown.
    only = make_plan(new, old, FleetFacts(0.0, hosts[1:], {}, KEY))
    report = next(j for j in only.jobs if j.name == "report")
    assert report.before is None
    assert [(k.key, k.known) for k in report.keys] == [
        ("command", False), ("cron", False), ("env", False), ("starting-deadline", False)]

    # Every host runs NEW already: nothing changes, whatever the current file says.
    done = make_plan(new, old, FleetFacts(0.0, (host("web-1", {j.name: j for j in new.jobs}),),
                                          {}, KEY))
    assert (done.changed, done.unchanged) == (False, ("cleanup", "fresh", "report"))


def test_a_host_that_new_run_on_leaves_out_drops_the_job() -> None:
    old = load_jobs_text(OLD, "old.yaml")
    new = load_jobs_text(OLD.replace('    command: "true"\n',
                                     '    command: "true"\n    run-on: {role: batch}\n'),
                         "new.yaml")
    hosts = (host("web-1", {j.name: j for j in old.jobs}, {"hostname": "web-1", "role": "web"}),
             host("batch-1", {j.name: j for j in old.jobs},
                  {"hostname": "batch-1", "role": "batch"}))
    plan = make_plan(new, old, FleetFacts(0.0, hosts, {}, KEY))
    (gone,) = plan.jobs
    assert gone.change == CHANGED
    assert [(d.hostname, d.runs, d.keeps) for d in gone.hosts] == [
        ("web-1", RUNS_CURRENT, False), ("batch-1", RUNS_CURRENT, True)]
    assert [k.key for k in gone.keys] == ["run-on"]


def test_an_every_host_job_is_compared_row_by_row() -> None:
    text = 'jobs:\n  sweep:\n    cron: "0 * * * *"\n    command: ./sweep\n    on: every-host\n'
    old = load_jobs_text(text, "old.yaml")
    (sweep,) = old.jobs
    rows = {name: replace(sweep, name=f"sweep@{name}") for name in ("web-1", "web-2")}
    hosts = tuple(host(name, {job.name: job}) for name, job in rows.items())
    assert not make_plan(old, old, FleetFacts(0.0, hosts, {}, KEY)).changed
    new = load_jobs_text(text.replace("./sweep", "./sweep --all"), "new.yaml")
    (changed,) = make_plan(new, old, FleetFacts(0.0, hosts, {}, KEY)).jobs
    assert [(d.row, d.runs) for d in changed.hosts] == [("sweep@web-1", RUNS_CURRENT),
                                                        ("sweep@web-2", RUNS_CURRENT)]
    assert changed.notes == ("an every-host job: each host's row JOB@HOST has its own last "
                             "slot",)
