"""`dblockrun pause` and `resume` (issue 13 item 4), on every backend: while
the fleet is paused no claim wins, on any path, on any host; running runs
finish; `status` says so first; `--for` ends by the database clock."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from harness import Fleet
from helpers import REPO, Ran, TestDb, clean_env, cli, invoke, wait_for

import dblockrun
from dblockrun.ops.who import operator_id
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.control import Audit
from dblockrun.store.dburl import describe
from dblockrun.store.engine import Claim
from dblockrun.timetext import iso


def run_cli(db: TestDb, *args: str) -> Ran:
    """In-process (helpers.invoke): what pause, resume and status say and do
    is tested, not a process's start (0.15-0.5 CPU-s of imports each)."""
    return invoke("--db", db.url, "--table-prefix", db.prefix, *args)


def started_after(store: Store, job: str, since: float) -> list[m.RunRecord]:
    return [r for r in store.history(job, 100) if r.started > since]


def test_pause_stops_new_starts_on_every_host_until_resumed(
        db: TestDb, store: Store, tmp_path: Path, fleet: Fleet) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n"
                    "  tick:\n    cron: '* * * * * *'\n    command: 'true'\n"
                    "  long:\n    rate: 1h\n    command: sleep 2\n")
    fleet.start_n(2, jobs, grace=None, cwd=REPO, env=clean_env())
    try:
        wait_for(lambda: store.control.running("long") or None, 30, what="long running")
        wait_for(lambda: any(r.result == m.OK for r in store.history("tick")), 10,
                 what="a tick")
        paused = run_cli(db, "pause", "--reason", "database upgrade")
        assert (paused.returncode, paused.stderr) == (0, "")
        assert paused.stdout == (f"fleet paused until resumed in {describe(db.url, db.prefix)}: "
                                 "no new run starts; running ones finish\n")
        pause = store.control.paused()
        assert pause is not None and pause.who == operator_id()
        # status says so first, in the table and in JSON.
        lines = run_cli(db, "status").stdout.splitlines()
        assert lines[1].startswith(f"PAUSED until resumed, by {operator_id()} since ")
        assert lines[1].endswith(": database upgrade; no new run starts on any host "
                                 "(`dblockrun resume` ends it)")
        doc = json.loads(run_cli(db, "status", "--json").stdout)
        assert doc["paused"] == {"since": iso(pause.since), "until": "forever",
                                 "by": operator_id(), "reason": "database upgrade"}
        assert {j["name"]: j["next_run_note"] for j in doc["jobs"]}["tick"] == "fleet paused"
        # The run under way finishes as it would have.
        (long_run,) = store.history("long")
        done = wait_for(lambda: (r := store.run(long_run.id)) and r.result != m.RUNNING and r,
                        10, what="long finished")
        assert done.result == m.OK
        # Three slots of tick pass on the database clock: none starts anywhere.
        wait_for(lambda: store.db_now() > pause.since + 3.2, 10, interval=0.2)
        assert started_after(store, "tick", pause.since) == []
        assert started_after(store, "long", pause.since) == []
        resumed = run_cli(db, "resume")
        assert resumed.stdout == (f"fleet resumed in {describe(db.url, db.prefix)} "
                                  f"(paused by {operator_id()})\n")
        at = store.db_now()
        wait_for(lambda: started_after(store, "tick", at) or None, 5, what="a tick after resume")
        again = run_cli(db, "resume")
        assert again.stdout == f"fleet was not paused in {describe(db.url, db.prefix)}\n"
    finally:
        fleet.stop()


def test_every_claim_path_refuses_while_paused(db: TestDb, store: Store) -> None:
    """Single, batch, run-now, exec's and the API's claim, fan-out items:
    all built from Queries.claimable, all refused while paused."""
    store.ensure_jobs(["single", "b1", "b2", "asked", "ex", "fan"])
    store.items.sync("fan", ["x"])
    store.request_run("asked")
    slot = store.db_now() - 0.5

    def claims() -> list[object]:
        engine = store.lock_engine()
        return [
            store.claim("single", "h", 30),
            store.claim_batch(["b1", "b2"], "h", 30, slot=slot, next_due=slot + 60,
                              limit=2) or None,
            store.claim_requested("asked", "h", 30),
            engine.claim("ex", "h", 30, Claim(record=True, check=True), ensure=True),
            store.items.claim("fan", "h", 30, slot=slot, rate=None, limit=1) or None,
        ]

    store.control.pause(Audit("alice@ops-1", "pause", reason="upgrade"), None)
    assert claims() == [None] * 5
    with dblockrun.lock("api", db=store, raise_on_busy=False) as lease:
        assert lease is None
    was = store.control.resume(Audit("alice@ops-1", "resume"))
    assert was is not None and was.reason == "upgrade"
    assert None not in claims()
    with dblockrun.lock("api", db=store, raise_on_busy=False) as lease:
        assert lease is not None


def test_pause_for_a_while_ends_by_the_database_clock(db: TestDb, store: Store) -> None:
    store.ensure_jobs(["j"])
    pause = store.control.pause(Audit("alice@ops-1", "pause"), 1.5)
    assert pause.ends == pytest.approx(pause.since + 1.5)
    assert store.claim("j", "h", 30) is None
    wait_for(lambda: store.claim("j", "h", 30), 10, what="the claim after the pause")
    lock = store.lock_state("j")
    assert lock is not None and lock.locked_at is not None and lock.locked_at >= pause.ends
    assert store.control.paused() is None


def test_exec_while_paused_exits_as_for_a_busy_lock(db: TestDb, store: Store) -> None:
    store.control.pause(Audit("alice@ops-1", "pause", reason="upgrade"), None)

    def exec_(*args: str) -> subprocess.CompletedProcess[str]:
        # A real process: exec (its fast start, its child, its exit status).
        return cli("--db", db.url, "--table-prefix", db.prefix, "exec", "--name", "ex", *args,
                   "--", "echo", "ran")

    quiet = exec_()
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    loud = exec_("-v", "--busy-exit-code", "75")
    assert (loud.returncode, loud.stdout) == (75, "")
    assert "lock ex: the fleet is paused (by alice@ops-1: upgrade); not running" in loud.stderr
    assert store.history("ex") == []


def test_pause_usage_errors(sqlite_db: TestDb) -> None:
    def pause(*args: str, process: bool = False) -> tuple[int, str]:
        proc = (cli("--db", sqlite_db.url, "--table-prefix", sqlite_db.prefix, "pause", *args)
                if process else run_cli(sqlite_db, "pause", *args))
        return proc.returncode, proc.stderr

    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        store.ensure_schema()
    # One in a real process: exit 2, that one line and no traceback, end to end.
    assert pause("--for", "0s", process=True) == (
        2, "dblockrun: --for: must be longer than 0s (got '0s')\n")
    assert pause("--for", "1x") == (
        2, "dblockrun: --for: '1x' is not a duration (use e.g. 250ms, 90s, 5m, 1h30m, 2d)\n")
    assert pause("--reason", "x" * 1001) == (
        2, "dblockrun: --reason is 1001 characters long (at most 1000)\n")
