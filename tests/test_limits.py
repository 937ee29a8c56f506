"""Limits: `daemon --max-running N` and fleet-wide groups (`groups:` + `group:`),
with real `dblockrun daemon` processes on every database."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from harness import Fleet
from helpers import TestDb, invoke, overlaps, slots_done, wait_for
from jobfiles import FILE, error, jobs_file, load

from dblockrun.cli import cli
from dblockrun.ops import output
from dblockrun.scheduling.limits import seat_names
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.status import report

# --- the jobs file -----------------------------------------------------------------


def test_groups_and_group_are_read() -> None:
    jobs = load("""\
        groups:
          backups: 1
          reports: 3
        defaults:
          group: reports
        jobs:
          db:
            cron: "@daily"
            command: x
            group: backups
          weekly:
            cron: "@weekly"
            command: x
        """)
    assert jobs.groups == (("backups", 1), ("reports", 3))
    assert [(j.name, j.group) for j in jobs.jobs] == [("db", "backups"), ("weekly", "reports")]


@pytest.mark.parametrize(("text", "message"), [
    ("groups:\n  backups: 1\njobs:\n  j:\n    cron: '@daily'\n    command: x\n    group: backup\n",
     "jobs.yaml:7: job 'j': group: unknown group 'backup' (groups: backups)"),
    ("jobs:\n  j:\n    cron: '@daily'\n    command: x\n    group: backups\n",
     "jobs.yaml:5: job 'j': group: unknown group 'backups': define it under groups: at the "
     "top (groups: {backups: 1})"),
    ("groups:\n  backups: 0\njobs: {}\n",
     "jobs.yaml:2: groups.backups: must be at least 1, got 0"),
    ("groups:\n  backups: two\njobs: {}\n",
     "jobs.yaml:2: groups.backups: must be a whole number, got a string ('two')"),
    ("groups:\n  backups: 1001\njobs: {}\n",
     "jobs.yaml:2: groups.backups: must be at most 1000, got 1001"),
    ("groups:\n  'a b': 1\njobs: {}\n",
     "jobs.yaml:2: groups.a b: bad group name: use letters, digits, '.', '_' and '-'"),
    ("groups: [backups]\njobs: {}\n",
     "jobs.yaml:1: groups: must be a mapping of group names to limits, got a list"),
    ("groups:\n  b: 1\njobs:\n  j:\n    cron: '@daily'\n    command: x\n    group: ''\n",
     "jobs.yaml:7: job 'j': group: must not be empty"),
    ("groups:\n  b: 1\njobs:\n  j:\n    cron: '@daily'\n    command: x\n    items: [a]\n"
     "    group: b\n",
     "jobs.yaml:8: job 'j': group: a fan-out job (items, items-command) cannot be in a group"),
])
def test_bad_groups_are_rejected_with_file_line_job_and_key(text: str, message: str) -> None:
    assert error(text) == message


def test_max_running_must_be_at_least_one() -> None:
    result = CliRunner().invoke(cli, ["daemon", "--max-running", "0", FILE])
    assert result.exit_code == 2
    assert "--max-running" in result.output and "0 is not in the range x>=1" in result.output


# --- seats in the store -----------------------------------------------------------------


def test_seats_are_taken_renewed_and_freed_with_the_run(store: Store, backend: str) -> None:
    store.ensure_schema()
    seats = seat_names("backups", 2)
    store.ensure_jobs(["a", "b", "c", *seats])
    warm = store.claim("c", "warm", 30)  # schema check and connection out of the way
    assert warm is not None and store.release("c", "warm", warm)
    slot = store.db_now()
    before = store.statements
    won = store.claim_and_record("a", "h1", 30, slot=slot)
    assert won is not None and won.run_id is not None
    seat = store.claim_seat(seats, "h1", 30, "a")
    assert seat == (seats[0], 1)
    assert store.finish_and_release(won.run_id, "a", "h1", won.token, m.OK, 0, "",
                                    seat=seat) == (True, True)
    # One round trip more than a job without a group (2), at the claim; the
    # seat is freed with the result. SQLite sends each statement on its own.
    assert store.statements - before == (6 if backend == "sqlite" else 3)
    # Freed: both seats are taken (the first one's token moves on), then none.
    first = store.claim_seat(seats, "h1", 30, "a")
    second = store.claim_seat(seats, "h2", 30, "b")
    assert first is not None and second is not None
    assert sorted([first, second]) == [(seats[0], 2), (seats[1], 1)]
    assert store.claim_seat(seats, "h3", 30, "c") is None
    assert sorted(store.seat_holders(seats)) == [("a", "h1"), ("b", "h2")]
    # Renewed with the holder's leases, in the one statement.
    before = store.statements
    assert store.renew_many("h1", [first, second], 60) == {first[0]: None}
    assert store.statements - before == 1
    # The seat rows are not jobs; status shows them as the group's use.
    assert [s.lock.name for s in report(store).jobs] == ["a", "b", "c"]
    got = report(store)
    assert [j.lock.name for j in got.jobs] == ["a", "b", "c"]
    assert [(g.group, g.seats, sorted(g.held)) for g in got.groups] == [
        ("backups", 2, [("a", "h1"), ("b", "h2")])]
    text = output.status_text(got.jobs, got.hosts, got.db_now, 15.0, None, None, got.groups)
    assert "groups\ngroup    in use  held by\n" in text
    assert "backups  2/2     " in text
    doc = json.loads(output.status_json(got.jobs, got.hosts, got.db_now, 15.0, None,
                                        got.groups))
    assert doc["groups"][0]["name"] == "backups"
    assert (doc["groups"][0]["seats"], doc["groups"][0]["held"]) == (2, 2)


def test_a_seat_whose_lease_ran_out_is_taken_over_and_fences_the_old_holder(
        store: Store) -> None:
    store.ensure_schema()
    seats = seat_names("g", 1)
    store.ensure_jobs(seats)
    dead = store.claim_seat(seats, "dead", 0.3, "a")
    assert dead == (seats[0], 1)
    assert store.claim_seat(seats, "h2", 30, "b") is None
    taken = wait_for(lambda: store.claim_seat(seats, "h2", 30, "b"), 10, what="the takeover")
    assert taken == (seats[0], 2)
    assert store.renew_many("dead", [dead], 30) == {}
    assert not store.release_seat(dead, "dead")
    assert store.seat_holders(seats) == [("b", "h2")]


def test_concurrent_claims_take_each_seat_once(store: Store) -> None:
    store.ensure_schema()
    seats = seat_names("g", 3)
    store.ensure_jobs(seats)
    got: dict[str, tuple[str, int] | None] = {}
    errors: list[BaseException] = []
    go = threading.Barrier(6)

    def host(h: str) -> None:
        try:
            go.wait()
            got[h] = store.claim_seat(seats, h, 30, "job")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=host, args=(f"h{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    won = [seat for seat in got.values() if seat is not None]
    assert sorted(won) == [(seat, 1) for seat in seats]


# --- real daemons ---------------------------------------------------------------------


TWO_JOBS = {name: """\
    cron: "*/2 * * * * *"
    command: sleep 0.8
    """ for name in ("left", "right")}


@pytest.mark.slow
def test_a_full_host_leaves_the_slot_to_another_host(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """Two jobs due together, a host with --max-running 1 beside one
    without: every slot of both jobs runs, and the full host never runs two
    at once."""
    jobs = jobs_file(tmp_path / "jobs.yaml", TWO_JOBS)
    full = fleet.start(jobs, "--max-running", "1", name="full")
    fleet.start(jobs, name="free")
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: len(store.hosts(seen_within=30)) == 2, 30, what="2 daemons registered")
        full_host = next(h.id for h in store.hosts(seen_within=30) if h.pid == full.pid)
        first = store.db_now() + 1
        slots = wait_for(lambda: slots_done(store, {"left", "right"}, first, 4), 30,
                         interval=0.2, what="4 slots of both jobs")
    finally:
        codes = fleet.stop()
    assert codes == [0, 0]
    results = {(job, r.result) for runs in slots.values() for job, r in runs.items()}
    assert results == {("left", "ok"), ("right", "ok")}, slots
    assert overlaps([r for runs in slots.values() for r in runs.values()
                     if r.host == full_host]) == []
    store.close()


# test_a_full_host_alone_records_the_slot_skipped_with_the_reason and
# test_a_slot_due_while_the_host_is_full_is_skipped_not_run_late moved to
# tests/test_firing_memory.py (one host's --max-running decisions, in-process on the
# memory store); the SQL they rely on stays covered by the contract tests and, with
# real daemons, by test_a_full_host_leaves_the_slot_to_another_host above.


GROUPS = "groups:\n  backups: 1"
GROUPED = {name: """\
    cron: "*/2 * * * * *"
    group: backups
    command: sleep 1.2
    """ for name in ("db-dump", "files")}


@pytest.mark.slow
def test_a_group_runs_one_job_at_a_time_across_the_fleet(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """Two slow jobs of a group of 1, due together, two daemons: never two
    at once anywhere, and the other slot is recorded skipped, naming the
    holder."""
    jobs = jobs_file(tmp_path / "jobs.yaml", GROUPED, GROUPS)
    fleet.start_n(2, jobs)
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: len(store.hosts(seen_within=30)) == 2, 30, what="2 daemons registered")
        first = store.db_now() + 1
        slots = wait_for(lambda: slots_done(store, {"db-dump", "files"}, first, 3), 30,
                         interval=0.2, what="3 slots of both jobs")
        # The seat rows are not jobs.
        assert sorted(s.lock.name for s in report(store).jobs) == ["db-dump", "files"]
    finally:
        codes = fleet.stop()
    assert codes == [0, 0]
    for runs in slots.values():
        assert sorted(r.result for r in runs.values()) == ["ok", "skipped"], runs
        ran = next(r for r in runs.values() if r.result == "ok")
        skipped = store.run(next(r for r in runs.values() if r.result == "skipped").id)
        assert skipped is not None and skipped.output == (
            f"skipped: group backups at its limit (1): held by {ran.job} on {ran.host}\n")
    assert overlaps([r for runs in slots.values() for r in runs.values()
                     if r.result == "ok"]) == []
    store.close()


@pytest.mark.slow
@pytest.mark.fleet_timing(lease="3s")  # what it measures
def test_a_seat_held_by_a_killed_daemon_is_taken_over_after_its_lease(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    holder_jobs = jobs_file(tmp_path / "holder.yaml", {"long": """\
        rate: 1h
        group: backups
        command: sleep 60
        """}, GROUPS)
    other_jobs = jobs_file(tmp_path / "other.yaml", {"short": """\
        cron: "* * * * * *"
        group: backups
        command: "true"
        """}, GROUPS)
    holder = fleet.start(holder_jobs, name="holder")
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: any(r.result == "running" for r in store.history("long")), 30,
                 what="the long job running")
        fleet.start(other_jobs, name="other")
        skipped = wait_for(lambda: [r for r in store.history("short")
                                    if r.result == "skipped"] or None,
                           30, interval=0.2, what="a skipped slot of the short job")
        record = store.run(skipped[0].id)
        assert record is not None and record.output is not None
        assert record.output.startswith("skipped: group backups at its limit (1): held by long")
        assert not [r for r in store.history("short") if r.result == "ok"]
        # Run now: it takes a seat like any run, and says why it could not.
        asked = invoke("--db", db.url, "--table-prefix", db.prefix, "run", "short")
        assert asked.returncode == 1, asked
        assert "not started on" in asked.stderr
        assert "group backups at its limit (1): held by long on" in asked.stderr
        holder.kill()
        killed = store.db_now()
        ran = wait_for(lambda: [r for r in store.history("short") if r.result == "ok"] or None,
                       15, interval=0.2, what="the short job run after the kill")
    finally:
        codes = fleet.stop()
    assert codes[1:] == [0]
    # Not before the dead holder's lease (3 s from its last renewal, at most
    # a heartbeat before the kill) ran out; soon after it.
    start = min(r.started for r in ran)
    assert killed + 3 - 1 - 0.2 <= start <= killed + 3 + 3, (killed, start)
    store.close()


# --- validate: jobs that would starve ------------------------------------------------


STARVING = """\
groups: {backups: 1}
jobs:
  dump-users: {cron: "0 * * * *", command: x, group: backups}
  dump-orders: {cron: "0 * * * *", command: x, group: backups}
  files: {cron: "30 * * * *", command: x, group: backups}
  report: {cron: "0 * * * *", command: x}
"""


def test_validate_warns_of_group_jobs_due_together_beyond_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(STARVING)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{path}: ok, 4 job(s)\n"
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{path}: warning: group backups (limit 1): dump-orders, "
                               "dump-users come due together (first at "), lines
    assert "168 time(s) within 7 days): all but 1 are skipped each time" in lines[0]
    # files comes at :30, alone in its group: not named.
    assert "files" not in lines[0]


def test_validate_warns_of_a_host_limit_only_when_given(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(STARVING)
    lines = CliRunner().invoke(cli, ["validate", str(path), "--max-running", "2"]
                               ).stderr.splitlines()
    assert len(lines) == 2
    assert lines[1].startswith(f"{path}: warning: --max-running 2: dump-orders, dump-users, "
                               "report come due together"), lines
    assert "a host alone runs 2 and skips the rest each time" in lines[1]
    roomy = CliRunner().invoke(cli, ["validate", str(path), "--max-running", "3"])
    assert len(roomy.stderr.splitlines()) == 1  # the group's only


def test_validate_is_quiet_when_group_jobs_are_staggered(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(STARVING.replace('dump-orders: {cron: "0 * * * *"',
                                     'dump-orders: {cron: "15 * * * *"'))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert (result.exit_code, result.stderr) == (0, "")
