"""``status --check`` sees what a monitor must page about (issue 36 items 1
and 2): a paused fleet and a job whose slots are being recorded ``missed``
or ``skipped`` are problems, with who, why and since, unless ``--allow``
accepts them; a slot the pause dropped is not shown (or checked) as
overdue. A real daemon and real ``dblockrun`` processes, on every backend."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO, Ran, TestDb, clean_env, dblockrun_cmd, invoke, wait_for

from dblockrun.ops.check import overdue
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.control import Pause
from dblockrun.store.status import _dropped, passed_since, report

JOBS = """\
jobs:
  tick:
    cron: "*/3 * * * * *"
    command: echo tick
  slow:
    cron: "* * * * * *"
    command: sleep 2.5
"""


def cli(db: TestDb, *args: str) -> Ran:
    """In-process (helpers.invoke): status --check's verdict and exit status
    are tested, not a process's start (0.15-0.5 CPU-s of imports each)."""
    return invoke("--db", db.url, "--table-prefix", db.prefix, *args)


@pytest.fixture
def daemon(db: TestDb, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A daemon with a 10 s lease: the pause test freezes it while commands
    run, which under CI load can pass a 3 s lease (a run found lost is a
    problem of its own); no test here measures a lease."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    proc = subprocess.Popen(
        [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "daemon", str(jobs),
         "--heartbeat", "1s", "--lease", "10s", "--grace", "0s"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "daemon.log").open("wb"), env=clean_env(),
        cwd=REPO)
    yield proc
    proc.send_signal(signal.SIGCONT)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_paused_fleet_is_a_problem_and_its_dropped_slot_is_not_overdue(
        db: TestDb, daemon: subprocess.Popen[bytes]) -> None:
    with Store(db.url, db.prefix) as store:
        wait_for(lambda: any(r.result == m.OK for r in store.history("tick")), 30,
                 what="a first run of tick")
        # Paused while the daemon is not behind: tick's next slot is ahead.
        wait_for(lambda: (row := store.lock_state("tick")) is not None and (
            row.next_due or 0) > store.db_now() + 0.5, 30, what="tick's next slot ahead")
        paused = cli(db, "pause", "--reason", "forgot to resume")
        assert paused.returncode == 0, paused.stderr
        check = cli(db, "status", "--check", "--allow", "skipped")
        assert check.returncode == 1
        assert re.fullmatch(
            r"problem: fleet paused by \S+ since \S+Z \(\d+s ago\), until resumed: forgot to "
            r"resume; no job starts \(`dblockrun resume` ends it; --allow paused accepts "
            r"it\)\n", check.stdout), check.stdout
        doc = json.loads(cli(db, "status", "--check", "--allow", "skipped", "--json").stdout)
        assert doc["ok"] is False and doc["problems"][0].startswith("fleet paused by ")
        ok = cli(db, "status", "--check", "--allow", "paused,skipped")
        assert ok.returncode == 0, ok.stdout
        # Two of tick's slots pass while paused: neither run nor recorded.
        before = store.lock_state("tick")
        assert before is not None and before.last_start is not None
        wait_for(lambda: store.db_now() > before.last_start + 7, 20,  # type: ignore[operator]
                 what="two slots of tick to pass")
        # Resumed, and looked at before the daemon claims tick's next slot
        # (frozen; --live-within: it stays live for the look). Frozen inside
        # a claim's transaction, it holds the rows itself (a problem, rightly):
        # then it goes on a moment and is frozen again.
        for _ in range(10):
            daemon.send_signal(signal.SIGSTOP)
            try:
                if store.control.paused() is not None:
                    assert cli(db, "resume").returncode == 0
                # The check first: its "not overdue" holds for two periods
                # (6 s) after the resume, while the daemon stays frozen.
                check = cli(db, "status", "--check", "--allow", "skipped", "--live-within",
                            "60s")
                doc = json.loads(cli(db, "status", "--json", "tick", "--live-within",
                                     "60s").stdout)
            finally:
                daemon.send_signal(signal.SIGCONT)
            if "held by another session" not in check.stdout:
                break
            time.sleep(0.3)  # not a wait for an event: a moment out of its transaction
    (job,) = doc["jobs"]
    # Not "due 7.2s ago": that slot will never run.
    assert job["next_run"] is None
    assert re.fullmatch(r"its next slot; the pause dropped \S+Z \(\S+ ago\)",
                        job["next_run_note"]), job
    # Not overdue either: it has had no slot since the pause ended.
    assert check.returncode == 0, check.stdout
    assert check.stdout.startswith("ok: 2 job(s), 1 live daemon(s) in ")


@pytest.mark.slow
def test_slots_recorded_skipped_are_a_problem_with_since_who_and_why(
        db: TestDb, daemon: subprocess.Popen[bytes]) -> None:
    """``slow`` runs 2.5 s every second: its slots between are recorded
    skipped, a problem (the check was green while a job's slots went by)."""
    with Store(db.url, db.prefix) as store:
        wait_for(lambda: any(r.result == m.SKIPPED for r in store.history("slow")), 30,
                 what="a skipped slot of slow")
        check = wait_for(lambda: c if (c := cli(db, "status", "--check")).returncode == 1
                         and "job slow: " in c.stdout else None, 30, what="the problem")
    line = next(x for x in check.stdout.splitlines() if x.startswith("problem: job slow: "))
    assert re.fullmatch(
        r"problem: job slow: its slots are recorded skipped since \S+Z \(\S+ ago, \d+ records?\), "
        r"the last by \S+: skipped: .+ \(--allow skipped accepts it\)", line), line
    assert "problem: job tick" not in check.stdout
    ok = cli(db, "status", "--check", "--allow", "skipped")
    assert (ok.returncode, ok.stdout.startswith("ok: 2 job(s), 1 live daemon(s)")) == (0, True)
    bad = cli(db, "status", "--check", "--allow", "sleepy")
    assert (bad.returncode, bad.stderr) == (
        2, "dblockrun: --allow sleepy: want paused, missed, skipped\n")


def test_a_streak_of_passed_slots_counts_from_the_first_after_the_last_run(
        store: Store) -> None:
    """Since when a job's slots are recorded passed: the first slot after
    its last other record (a summary record: the first slot it stands for)."""
    store.ensure_jobs(["job"])
    won = store.claim_and_record("job", "web-1:7:ab", 30, slot=100.0)
    assert won is not None and won.run_id is not None
    store.finish_and_release(won.run_id, "job", "web-1:7:ab", won.token, "ok", 0, None, 0.0)
    assert store.lock.record_slots("job", "web-2:8:cd", m.MISSED,
                                   [(160.0, "missed: 3 slots from 120 to 160: down", 120.0)],
                                   first=None)
    assert store.lock.record_slots("job", "web-2:8:cd", m.SKIPPED,
                                   [(180.0, "skipped: a full group", None)], first=None)
    (s,) = report(store, ["job"]).jobs
    streak = passed_since(store, [s])["job"]
    assert (streak.since, streak.records, streak.newest.result, streak.newest.host,
            streak.newest.output) == (120.0, 2, m.SKIPPED, "web-2:8:cd", "skipped: a full group")


@pytest.mark.parametrize(("due_to_pause", "dropped"), [(0.0, True), (-2.0, True), (-4.0, False)])
def test_a_slot_tried_late_once_the_pause_began_is_the_pauses_too(
        due_to_pause: float, dropped: bool) -> None:
    """A job every 3 s whose slot came due just before a pause began, and
    whose daemon, a moment behind, tried it once the pause had begun: the
    pause dropped that slot too, so after the resume the job is not overdue.
    A slot due more than a period before the pause was not the pause's."""
    since, ends, now = 1000.0, 1030.0, 1031.0
    due = since + due_to_pause
    lock = m.LockState(name="tick", holder=None, lock_until=None, locked_at=None, token=1,
                       last_slot=due - 3, last_start=due - 3, next_due=due,
                       disabled_until=None, disabled_reason=None)
    status = _dropped(m.JobStatus(lock=lock, last_run=None, running=None, db_now=now),
                      Pause(ends=ends, since=since, who="alice@ops", reason=None))
    assert (status.dropped == due) is dropped
    assert (overdue(status) is None) is dropped
