"""Limits that queue (issue 23): a group with `when-full: queue`, and
`daemon --max-running N --when-full queue`: the slots a full group or host
used to skip wait, oldest first, bounded, visible in `status`. Real
`dblockrun daemon` processes on every database."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from harness import Fleet
from helpers import FIRST_RUN, TestDb, overlaps, slots_done, wait_for
from jobfiles import jobs_file

from dblockrun.cli import cli
from dblockrun.config.load import load_jobs_text
from dblockrun.errors import ConfigError
from dblockrun.ops import output
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.models import RunRecord
from dblockrun.store.status import report

FILE = "jobs.yaml"


# --- the jobs file and the options ---------------------------------------------------------


def test_a_group_says_whether_a_full_group_queues_and_how_many_wait() -> None:
    jobs = load_jobs_text(textwrap.dedent("""\
        groups:
          backups: {seats: 1, when-full: queue}
          reports: {seats: 2, when-full: queue, queue: 3}
          mail: {seats: 1, when-full: skip}
          misc: 4
        jobs: {}
        """), FILE)
    assert jobs.groups == (("backups", 1), ("mail", 1), ("misc", 4), ("reports", 2))
    assert jobs.group_queues == (("backups", 10), ("reports", 3))


@pytest.mark.parametrize(("group", "message"), [
    ("{seats: 1, when-full: wait}",
     "jobs.yaml:3: groups.backups.when-full: must be skip or queue, got 'wait'"),
    ("{seats: 1, when-full: queue, queue: 0}",
     "jobs.yaml:3: groups.backups.queue: must be at least 1, got 0"),
    ("{seats: 1, when-full: queue, queue: -2}",
     "jobs.yaml:3: groups.backups.queue: must be at least 1, got -2"),
    ("{seats: 1, when-full: queue, queue: many}",
     "jobs.yaml:3: groups.backups.queue: must be a whole number, got a string ('many')"),
    ("{seats: 1, queue: 3}",
     "jobs.yaml:3: groups.backups.queue: a queue's bound needs when-full: queue"),
    ("{seats: 0, when-full: queue}",
     "jobs.yaml:3: groups.backups.seats: must be at least 1, got 0"),
    ("{when-full: queue}",
     "jobs.yaml:3: groups.backups: needs seats: (at most this many of its jobs at once)"),
    ("{seats: 1, when_full: queue}",
     "jobs.yaml:3: groups.backups.when_full: unknown key (did you mean 'when-full'?)"),
])
def test_bad_queue_settings_are_rejected_with_file_line_and_key(
        tmp_path: Path, group: str, message: str) -> None:
    text = f"# queues\ngroups:\n  backups: {group}\njobs: {{}}\n"
    with pytest.raises(ConfigError) as info:
        load_jobs_text(text, FILE)
    assert info.value.render() == message
    path = tmp_path / FILE
    path.write_text(text)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2
    assert message.replace("jobs.yaml", str(path)) in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--when-full", "queue"], "--when-full queue needs --max-running N"),
    (["--max-running", "1", "--queue", "3"], "--queue needs --when-full queue"),
    (["--max-running", "1", "--when-full", "queue", "--queue", "0"],
     "0 is not in the range x>=1"),
    (["--max-running", "1", "--when-full", "later"], "'later' is not one of 'skip', 'queue'"),
])
def test_bad_when_full_options_are_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["daemon", *args, FILE])
    assert result.exit_code == 2
    assert message in result.output


# --- real daemons ---------------------------------------------------------------------


def queue_runs(store: Store, names: set[str], first: float, count: int
               ) -> dict[float, dict[str, RunRecord]]:
    return wait_for(lambda: slots_done(store, names, first, count), 40, interval=0.2,
                    what=f"{count} slots of {sorted(names)}")


QUEUED_GROUP = "groups:\n  backups: {seats: 1, when-full: queue}"
GROUPED = {name: """\
    cron: "*/3 * * * * *"
    group: backups
    command: sleep 1
    """ for name in ("dump-users", "dump-orders")}


@pytest.mark.slow
def test_a_full_group_that_queues_runs_every_slot_one_after_the_other(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """Two jobs of a group of one seat, due at the same instants, two
    daemons: every slot of both runs (none skipped), never two at once, and
    the slot that waited keeps its slot time (its start shows the delay).
    While one waits, status shows it (text and JSON), and for what."""
    jobs = jobs_file(tmp_path / "jobs.yaml", GROUPED, QUEUED_GROUP)
    fleet.start_n(2, jobs)
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: len(store.hosts(seen_within=30)) == 2, 30, what="2 daemons registered")
        first = store.db_now() + 1

        def waiting() -> Any:
            got = report(store)
            doc = json.loads(output.status_json(got.jobs, got.hosts, got.db_now, None,
                                                got.paused, got.groups))
            return (got, doc) if doc["waiting"] else None

        got, doc = wait_for(waiting, 20, interval=0.1, what="a waiting slot in status")
        slots = queue_runs(store, set(GROUPED), first, 3)
    finally:
        codes = fleet.stop()
    assert codes == [0, 0]
    [entry] = doc["waiting"]
    assert entry["job"] in GROUPED and entry["slot"] is not None and entry["since"]
    # (Who holds it is named when the seat is still held as the holders are read.)
    assert entry["for"].startswith("a seat of group backups at its limit (1)"), entry
    assert {j["name"]: j["state"] for j in doc["jobs"]}[entry["job"]] == "waiting"
    text = output.status_text(got.jobs, got.hosts, got.db_now, None, 200, got.paused,
                              got.groups, wide=True)
    assert "waiting slots (oldest first)" in text
    assert "a seat of group backups at its limit (1)" in text
    runs = [r for per_slot in slots.values() for r in per_slot.values()]
    assert {r.result for r in runs} == {"ok"}, [(r, store.run(r.id)) for r in runs]
    assert overlaps(runs) == [], runs
    for per_slot in slots.values():
        later = max(per_slot.values(), key=lambda r: r.started)
        assert later.slot is not None and later.started - later.slot >= 0.9, per_slot  # waited
    store.close()


@pytest.mark.slow
def test_the_oldest_waiting_slot_gets_the_seat_first_across_the_fleet(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """A seat held for a while; meanwhile a slot comes due on one host and,
    a second later, another on a second host. The older slot runs first,
    every time, whichever host's try comes first when the seat frees."""
    jobs = jobs_file(tmp_path / "jobs.yaml", {
        "hold": """\
            cron: "0-59/6 * * * * *"
            group: backups
            run-on: {hostname: a}
            command: sleep 3
            """,
        "older": """\
            cron: "1-59/6 * * * * *"
            group: backups
            run-on: {hostname: b}
            command: sleep 0.5
            """,
        "newer": """\
            cron: "2-59/6 * * * * *"
            group: backups
            run-on: {hostname: a}
            command: sleep 0.5
            """}, QUEUED_GROUP)
    for host in ("a", "b"):
        fleet.start(jobs, "--label", f"hostname={host}", name=host)
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: len(store.hosts(seen_within=30)) == 2, 30, what="2 daemons registered")
        first = store.db_now() + 1

        def rounds() -> list[tuple[RunRecord, RunRecord]] | None:
            done = [r for r in store.history(limit=200)
                    if r.slot is not None and r.slot >= first and r.finished is not None]
            older = sorted((r for r in done if r.job == "older"), key=lambda r: r.slot or 0)
            newer = {(r.slot or 0) - 1: r for r in done if r.job == "newer"}
            pairs = [(o, newer[o.slot or 0]) for o in older if (o.slot or 0) in newer]
            return pairs if len(pairs) >= 3 else None

        pairs = wait_for(rounds, 45, interval=0.2, what="3 rounds of older and newer")
    finally:
        codes = fleet.stop()
    assert codes == [0, 0]
    for older, newer in pairs:
        assert (older.result, newer.result) == ("ok", "ok"), [
            (r.id, r.job, r.result, (store.run(r.id) or r).output) for r in (older, newer)]
        assert older.started < newer.started, (older, newer)
    store.close()


def test_a_seat_taken_while_a_renewal_is_on_its_way_costs_no_lease() -> None:
    """A waiting slot takes its seat (the run loop) while the heartbeat's
    renewal of its lock alone is on its way (the renewer's thread): that
    renewal says nothing of the seat, so the lease is kept (the seat is
    renewed from the next round on), not judged lost. It used to be: the
    older slot dropped its seat and its run, and a newer slot ran first
    (this test's fleet version, under load, on PostgreSQL)."""
    from typing import cast

    from dblockrun.running.heartbeat import Renewer
    from dblockrun.running.runner import LeaseWatch
    from dblockrun.store.outage import Outage

    watch = LeaseWatch("older", "b", 4, 6.0, last_ok=0.0)

    class Seating:
        """Renews what it is sent; the waiting slot takes a seat meanwhile."""

        def __init__(self) -> None:
            self.sent: list[list[tuple[str, int]]] = []

        def renew_many(self, holder: str, held: list[tuple[str, int]], lease: float,
                       outputs: list[tuple[int, str]]) -> dict[str, str | None]:
            self.sent.append(list(held))
            watch.seat = ("backups#1", 7)  # the run loop's seat, mid-statement
            return {name: None for name, _token in held}

    store = Seating()
    renewer = Renewer(cast(Any, store), 1.0, Outage())
    renewer.add(watch)
    assert renewer.renew_all()
    assert not watch.lost and watch.last_ok > 0.0
    assert renewer.renew_all()  # the seat from this round on
    assert store.sent == [[("older", 4)], [("older", 4), ("backups#1", 7)]]
    assert not watch.lost


@pytest.mark.slow
@pytest.mark.fleet_timing(lease="20s")  # its renewal is held up for seconds on purpose
def test_a_waiting_slot_keeps_its_lock_when_it_takes_its_seat_during_a_renewal(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """The fleet version of the test above, made deterministic: the
    waiting slot's lock row is locked by the test (PostgreSQL row lock), so
    its host's renewal of it waits, while the seat frees and the slot takes
    it; then the renewal gets through. The run goes on, ``ok`` (it was
    stopped: "lock lost (token 1 no longer current)", recorded killed)."""
    if db.backend != "postgresql":
        pytest.skip("holds a row lock with psycopg (PostgreSQL)")
    import psycopg

    jobs = jobs_file(tmp_path / "jobs.yaml", {
        "hold": """\
            cron: "0-59/10 * * * * *"
            group: backups
            run-on: {hostname: a}
            command: sleep 3
            """,
        "older": """\
            cron: "1-59/10 * * * * *"
            group: backups
            run-on: {hostname: b}
            command: sleep 3
            """}, QUEUED_GROUP)
    for host in ("a", "b"):
        fleet.start(jobs, "--label", f"hostname={host}", name=host)
    store = Store(db.url, db.prefix)
    try:
        waiting = wait_for(lambda: next((r for r in store.history(limit=50)
                                         if r.job == "older" and r.result == m.WAITING), None),
                           FIRST_RUN, interval=0.05, what="a slot of older waiting")
        with psycopg.connect(db.url) as conn:
            # b's next renewal of older's lock waits for this transaction.
            conn.execute(f"SELECT name FROM {db.prefix}locks WHERE name = %s FOR UPDATE",
                         ("older",))
            with psycopg.connect(db.url, autocommit=True) as look:
                wait_for(lambda: look.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE %s", (f"UPDATE {db.prefix}locks SET %kill_by%",)
                ).fetchone() == (1,), 30, interval=0.05, what="b's renewal held up")
            wait_for(lambda: (r := store.run(waiting.id)) is not None and r.result != m.WAITING,
                     30, interval=0.05, what="the waiting slot admitted")
            conn.commit()  # the renewal sent before the seat was taken answers now
        end = wait_for(lambda: (r := store.run(waiting.id)) is not None and r.finished
                       is not None and r, 30, interval=0.1, what="older's run over")
    finally:
        codes = fleet.stop()
    assert codes == [0, 0]
    assert end.result == "ok", (end.result, end.output, (tmp_path / "b.log").read_text())
    store.close()


# A full group queue records the slot skipped with the reason: one daemon's
# logic, on the memory store in tests/test_firing_memory.py (its SQL: the
# claims, seats and waiting runs of tests/test_firing_contract.py on every
# database, and the fleet tests above).


TWO_JOBS = {name: """\
    cron: "*/3 * * * * *"
    command: sleep 1
    """ for name in ("left", "right")}


@pytest.mark.slow
def test_a_full_host_that_queues_runs_every_slot_one_after_the_other(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """`--max-running 1 --when-full queue`, alone, two jobs due together:
    both run every slot, one after the other."""
    jobs = jobs_file(tmp_path / "jobs.yaml", TWO_JOBS)
    fleet.start(jobs, "--max-running", "1",
                "--when-full", "queue")
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: len(store.hosts(seen_within=30)) == 1, FIRST_RUN,
                 what="the daemon registered")
        first = store.db_now() + 1

        def waiting() -> dict[str, Any] | None:
            got = report(store)
            doc = json.loads(output.status_json(got.jobs, got.hosts, got.db_now))
            return doc["waiting"][0] if doc["waiting"] else None

        entry = wait_for(waiting, 20, interval=0.1, what="a waiting slot in status")
        slots = queue_runs(store, set(TWO_JOBS), first, 3)
    finally:
        codes = fleet.stop()
    assert codes == [0]
    assert entry["for"].endswith("(--max-running 1)") and entry["for"].startswith("room on ")
    runs = [r for per_slot in slots.values() for r in per_slot.values()]
    assert {r.result for r in runs} == {"ok"}, slots
    assert overlaps(runs) == []
    store.close()


# A full host queue records the slot skipped with the reason: one daemon's
# logic, on the memory store in tests/test_firing_memory.py (its SQL:
# tests/test_firing_contract.py; a real daemon's host queue: the test above).


def test_validate_warns_of_jobs_due_together_only_in_a_group_that_skips(
        tmp_path: Path) -> None:
    path = tmp_path / FILE
    jobs = {name: 'cron: "0 2 * * *"\ngroup: GROUP\ncommand: "true"' for name in ("a", "b")}
    for group, warned in (("{seats: 1, when-full: queue}", False), ("1", True),
                          ("{seats: 1, when-full: skip}", True)):
        jobs_file(path, {n: body.replace("GROUP", "backups") for n, body in jobs.items()},
                  f"groups:\n  backups: {group}")
        result = CliRunner().invoke(cli, ["validate", str(path)])
        assert result.exit_code == 0
        assert ("warning: group backups (limit 1): a, b come due together" in result.output) \
            is warned, (group, result.output)


HOLD = {
    "hold": """\
        cron: "0-59/6 * * * * *"
        group: backups
        command: sleep 3
        """}


# A slot that waits past its starting deadline is recorded missed: one
# daemon's logic, on the memory store in tests/test_firing_memory.py (its
# SQL: tests/test_firing_contract.py and tests/test_runstore_contract.py).


@pytest.mark.slow
def test_a_daemon_stopped_while_a_slot_waits_records_it_skipped(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    jobs = jobs_file(tmp_path / "jobs.yaml", {
        "hold": HOLD["hold"], "after": """\
            cron: "1-59/6 * * * * *"
            group: backups
            command: "true"
            """},
        QUEUED_GROUP)
    fleet.start(jobs)
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: len(store.hosts(seen_within=30)) == 1, FIRST_RUN,
                 what="the daemon registered")
        waiting = wait_for(lambda: next((r for r in store.history("after", 5)
                                         if r.result == "waiting"), None),
                           20, interval=0.05, what="a waiting slot")
    finally:
        codes = fleet.stop()
    assert codes == [0]
    record = store.run(waiting.id)
    assert record is not None and record.result == "skipped", record
    assert record.output == ("skipped: the daemon stopped while the slot waited for a seat of "
                             "group backups at its limit (1): held by hold on "
                             f"{record.host}\n")
    store.close()


def test_status_and_the_web_pages_show_a_waiting_slot(store: Store, tmp_path: Path) -> None:
    """A slot whose record waits (as a daemon marks it): `status` text and
    JSON, the API and the fleet page list it, oldest first; a dead waiter's
    slot is swept lost like a dead run."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient
    from webtools import PASSWORD, app_for, bearer, csrf_of, users_file

    store.ensure_schema()
    store.ensure_jobs(["dump-orders", "dump-users"])
    slot = store.db_now() - 2
    why = "a seat of group backups at its limit (1): held by dump-orders on h2"
    older = store.claim_and_record("dump-users", "h1", 300, slot=slot)
    newer = store.claim_and_record("dump-orders", "h2", 300, slot=slot + 1)
    assert older is not None and older.run_id is not None and newer is not None
    assert store.run_waits(older.run_id, why)
    got = report(store)
    assert {s.lock.name: s.state for s in got.jobs} == {"dump-orders": "running",
                                                        "dump-users": "waiting"}
    doc = json.loads(output.status_json(got.jobs, got.hosts, got.db_now))
    assert [(w["job"], w["host"], w["for"], w["run_id"]) for w in doc["waiting"]] == [
        ("dump-users", "h1", why, older.run_id)]
    text = output.status_text(got.jobs, got.hosts, got.db_now, None, 300, wide=True)
    assert "waiting slots (oldest first)" in text and why in text
    client = TestClient(app_for(store, users_file(tmp_path / "users.yaml")))
    assert client.get("/api/v1/status", headers=bearer("vera")).json()["waiting"][0][
        "for"] == why
    client.post("/login", data={"name": "vera", "password": PASSWORD, "next": "/",
                                "csrf": csrf_of(client.get("/login").text)})
    page = client.get("/").text
    assert '<table id="waiting"' in page and f'<td data-label="for">{why}</td>' in page
    # Its command starts: running from now, its slot kept.
    assert store.run_admitted(older.run_id)
    run = store.run(older.run_id)
    assert run is not None and run.result == "running" and run.slot == slot
    assert run.started > slot + 1.5
    assert json.loads(output.status_json(*(lambda r: (r.jobs, r.hosts, r.db_now))(
        report(store))))["waiting"] == []
    # A waiter whose lease ran out (its daemon died) is swept lost.
    third = store.claim_and_record("dump-orders", "h3", 0.5, slot=slot + 2)
    assert third is None  # still held by h2
    store.release("dump-orders", "h2", newer.token)
    third = store.claim_and_record("dump-orders", "h3", 0.2, slot=slot + 2)
    assert third is not None and third.run_id is not None
    assert store.run_waits(third.run_id, why)
    wait_for(lambda: any(r.id == third.run_id for r in store.sweep_lost()), 10,
             interval=0.1, what="the dead waiter swept lost")
    lost = store.run(third.run_id)
    assert lost is not None and lost.result == "lost"
