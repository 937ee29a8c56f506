"""`dblockrun daemon` as a real process on every backend: shutdown, reload,
starting-deadline, overlap, retries, on-failure, lock-at-most, the command's
environment and its output.

Each test starts its own daemon on its own table prefix and asserts what a
user would notice: run records, exit statuses and log lines.
"""

from __future__ import annotations

import math
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest
from harness import Fleet, pid_alive
from helpers import (
    FIRST_RUN,
    TestDb,
    fail_next_run_inserts,
    first_with,
    runs_of,
    stop_across_slots,
    wait_for,
)

from dblockrun.store import Store
from dblockrun.store import models as m

pytestmark = pytest.mark.slow


EVERY_SECOND = '"* * * * * *"'


def parse_iso_z(text: str) -> float:
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text[:-1] + "+00:00").timestamp()


# -- 1, 2: SIGTERM ----------------------------------------------------------


def test_sigterm_lets_a_run_finish_within_grace(
    store: Store, fleet: Fleet
) -> None:
    d = fleet.start("jobs:\n  finish:\n    rate: 1h\n"
                    "    command: sleep 1.5; echo finished\n", grace="10s")
    running = d.wait(lambda: first_with(store, "finish", m.RUNNING), FIRST_RUN,
                       what="run started")
    sent = time.monotonic()
    d.send(signal.SIGTERM)
    assert d.proc.wait(timeout=15) == 0
    took = time.monotonic() - sent
    assert took < 8, f"daemon took {took:.1f}s to stop after its run ended"
    run = store.run(running.id)
    assert run is not None
    assert (run.result, run.exit_code) == (m.OK, 0)
    assert "finished" in (run.output or "")
    assert [r.id for r in runs_of(store, "finish")] == [running.id]
    assert running.host not in {h.id for h in store.hosts()}
    assert "waiting up to 10s for 1 running job" in d.text()
    token = store.claim("finish", "test", 10.0)
    assert token is not None and running.token is not None and token > running.token


def test_sigterm_stops_a_run_longer_than_grace(
    store: Store, fleet: Fleet, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    d = fleet.start(f"jobs:\n  long:\n    rate: 1h\n"
                    f"    command: echo $$ > {pidfile}; exec sleep 30\n", grace="1s")
    running = d.wait(lambda: first_with(store, "long", m.RUNNING), 20, what="run started")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, what="pid file")
    pid = int(pidfile.read_text())
    assert pid_alive(pid)
    sent = time.monotonic()
    d.send(signal.SIGTERM)
    assert d.proc.wait(timeout=15) == 0
    took = time.monotonic() - sent
    assert took < 5, f"daemon took {took:.1f}s to stop with --grace 1s"
    assert not pid_alive(pid), "the command outlived the daemon"
    run = store.run(running.id)
    assert run is not None
    assert run.result == m.KILLED
    assert run.exit_code in (128 + signal.SIGTERM, 128 + signal.SIGKILL)
    assert running.host not in {h.id for h in store.hosts()}
    assert store.claim("long", "test", 10.0) is not None


def test_sigterm_stops_an_on_failure_command_after_grace(
    sqlite_db: TestDb, sqlite_fleet: Fleet, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    d = sqlite_fleet.start(
        "jobs:\n  fails:\n    rate: 1h\n    command: exit 3\n"
        f"    on-failure: {{command: 'echo $$ > {pidfile}; exec sleep 30'}}\n", grace="1s")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 20,
             what="the on-failure command started")
    pid = int(pidfile.read_text())
    sent = time.monotonic()
    d.send(signal.SIGTERM)
    assert d.proc.wait(timeout=40) == 0
    took = time.monotonic() - sent
    assert took < 5, f"daemon took {took:.1f}s to stop with --grace 1s"
    assert not pid_alive(pid), "the on-failure command outlived the daemon"
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        assert [(r.result, r.exit_code) for r in runs_of(store, "fails")] == [(m.FAILED, 3)]
        assert store.claim("fails", "test", 10.0) is not None


# -- 3: SIGHUP ----------------------------------------------------------------

JOB_ALPHA = f"  alpha:\n    cron: {EVERY_SECOND}\n    command: 'true'\n"
JOB_BETA = f"  beta:\n    cron: {EVERY_SECOND}\n    command: 'true'\n"


def test_sighup_reloads_and_a_bad_file_keeps_the_old_jobs(
    store: Store, fleet: Fleet
) -> None:
    d = fleet.start("jobs:\n" + JOB_ALPHA)
    d.wait(lambda: first_with(store, "alpha", m.OK), FIRST_RUN, what="alpha ran")
    assert runs_of(store, "beta") == []

    d.jobs.write_text("jobs:\n" + JOB_ALPHA + JOB_BETA)
    d.send(signal.SIGHUP)
    d.wait(lambda: first_with(store, "beta", m.OK), 10, what="beta ran after reload")
    assert d.alive()
    assert "reloaded" in d.text()

    bad = "jobs:\n" + JOB_ALPHA + JOB_BETA + "    bogus: 1\n"
    bad_line = bad.splitlines().index("    bogus: 1") + 1
    d.jobs.write_text(bad)
    d.send(signal.SIGHUP)
    d.wait(lambda: "reload failed" in d.text(), 10, what="'reload failed' in the log")
    assert f"{d.jobs}:{bad_line}: job 'beta': bogus" in d.text()
    counts = {job: len(runs_of(store, job, m.OK)) for job in ("alpha", "beta")}

    def kept_running() -> bool:
        return all(len(runs_of(store, job, m.OK)) > n for job, n in counts.items())

    d.wait(kept_running, 10, what="alpha and beta still running after the failed reload")
    assert d.alive()
    assert d.stop() == 0


# -- 4: starting-deadline ------------------------------------------------------


def test_starting_deadline_records_a_late_slot_as_missed(
    store: Store, fleet: Fleet
) -> None:
    d = fleet.start(f"jobs:\n  punctual:\n    cron: {EVERY_SECOND}\n"
                    "    starting-deadline: 300ms\n    command: 'true'\n")
    d.wait(lambda: first_with(store, "punctual", m.OK), 20, what="first run")
    # The local servers share this host's clock. Pause the daemon mid-second
    # (no run going), resume 0.6s past a slot: that slot is 0.6s late, over
    # the 300ms deadline.
    stop_at, resume_at = stop_across_slots(d.send)
    late_slot = math.floor(resume_at)
    d.wait(lambda: any(r.slot == late_slot for r in runs_of(store, "punctual", m.MISSED)),
           10, what="the late slot recorded missed")
    d.wait(lambda: any(r.slot is not None and r.slot > late_slot
                       for r in runs_of(store, "punctual", m.OK)), 10,
           what="an ok run after the missed slot")
    assert "missed" in d.text()
    # Every slot of the pause is recorded missed (README: older ones are
    # "recorded `missed` when `starting-deadline` is set"); none ran late.
    runs = runs_of(store, "punctual")
    paused = [r for r in runs if r.slot is not None and stop_at < r.slot <= resume_at]
    expected = range(math.ceil(stop_at), late_slot + 1)
    assert [(r.slot, r.result) for r in paused] == [(float(s), m.MISSED) for s in expected]
    assert all(r.token is None for r in paused)
    slots = [r.slot for r in runs]
    assert len(set(slots)) == len(slots)
    assert {r.result for r in runs} <= {m.OK, m.MISSED}
    assert d.stop() == 0


# -- 5: no overlap --------------------------------------------------------------


# test_overlapping_slots_are_skipped moved to tests/test_firing_memory.py (one daemon's
# overlap decision, in-process on the memory store); its SQL stays covered by
# tests/test_firing_contract.py and, with real daemons, by tests/test_overlap.py.


# -- 6: retries ------------------------------------------------------------------


# test_retries_share_one_token moved to tests/test_firing_memory.py (one daemon's retry
# decisions, the delay on the test's clock); its SQL stays covered on every database by
# tests/test_firing_contract.py's test_a_retrys_attempts_are_recorded_under_the_claims_token
# and, with a real daemon on every database, test_notify.py's
# test_pings_start_then_success_or_fail_with_the_run_id_and_the_output (a retried run).


# -- 7: on-failure disable-for --------------------------------------------------


# test_on_failure_disables_the_job moved to tests/test_firing_memory.py (one daemon's
# on-failure decision, in-process on the memory store); what it writes stays covered on
# every database by tests/test_firing_contract.py's
# test_a_disable_for_a_while_keeps_its_reason_and_refuses_claims_until_it_ends.


# -- 8: lock-at-most ------------------------------------------------------------


def test_lock_at_most_stops_the_command(
    store: Store, fleet: Fleet, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    d = fleet.start(f"jobs:\n  stuck:\n    rate: 1h\n    lock-at-most: 1s\n"
                    f"    command: echo $$ > {pidfile}; exec sleep 30\n")
    run = d.wait(lambda: first_with(store, "stuck", m.TIMEOUT), FIRST_RUN,
                 what="timeout record")
    assert run.exit_code in (128 + signal.SIGTERM, 128 + signal.SIGKILL)
    assert run.duration is not None and 0.9 <= run.duration < 4, run.duration
    pid = int(pidfile.read_text())
    wait_for(lambda: not pid_alive(pid), 5, what="the command gone")
    # The log line may follow the record it tells of (another thread writes it).
    wait_for(lambda: "reached lock-at-most" in d.text(), 10, what="the lock-at-most log line")
    assert d.stop() == 0
    assert store.claim("stuck", "test", 10.0) is not None


# -- 9: environment ---------------------------------------------------------------


def test_command_environment_and_workdir(
    store: Store, fleet: Fleet, tmp_path: Path
) -> None:
    out = tmp_path / "env"
    out.mkdir()
    wd = tmp_path / "work dir"
    wd.mkdir()
    names = ("DBLOCKRUN_JOB", "DBLOCKRUN_RUN_ID", "DBLOCKRUN_SLOT",
             "DBLOCKRUN_FENCING_TOKEN", "DBLOCKRUN_HOST_ID", "GREETING")
    script = "".join(f'      echo "{n}=${n}"\n' for n in names)
    d = fleet.start(
                    f"jobs:\n  envjob:\n    cron: {EVERY_SECOND}\n"
                    f"    env: {{GREETING: 'hello world'}}\n    workdir: '{wd}'\n"
                    f"    command: |\n      tmp='{out}'/$DBLOCKRUN_RUN_ID.tmp\n      {{\n{script}"
                    f'      echo "PWD=$(pwd -P)"\n      }} > "$tmp"\n'
                    f"      mv \"$tmp\" '{out}'/$DBLOCKRUN_RUN_ID.env\n"
                    )

    def first_ok_with_file() -> tuple[m.RunRecord, dict[str, str]] | None:
        for run in runs_of(store, "envjob", m.OK):
            path = out / f"{run.id}.env"
            if path.exists():
                env = dict(line.split("=", 1) for line in path.read_text().splitlines())
                return run, env
        return None

    run, env = d.wait(first_ok_with_file, 20, what="an ok run that wrote its env")
    assert d.stop() == 0
    assert env["DBLOCKRUN_JOB"] == "envjob"
    assert env["DBLOCKRUN_RUN_ID"] == str(run.id)
    assert run.slot is not None
    assert env["DBLOCKRUN_SLOT"].endswith("Z")
    assert parse_iso_z(env["DBLOCKRUN_SLOT"]) == pytest.approx(run.slot, abs=1e-3)
    assert env["DBLOCKRUN_FENCING_TOKEN"] == str(run.token)
    assert env["DBLOCKRUN_HOST_ID"] == run.host
    assert env["GREETING"] == "hello world"
    assert env["PWD"] == str(wd.resolve())


# -- 10: output ---------------------------------------------------------------------


def test_output_is_logged_with_the_job_prefix_and_kept(
    store: Store, fleet: Fleet
) -> None:
    d = fleet.start("jobs:\n  chatty.job-1:\n    rate: 1h\n"
                    "    command: echo line one; echo line two >&2; printf 'no newline'\n")
    run = d.wait(lambda: first_with(store, "chatty.job-1", m.OK), 20, what="ok run")
    d.wait(lambda: "[chatty.job-1] no newline" in d.text(), 5, what="output in the log")
    text = d.text()
    assert "[chatty.job-1] line one\n" in text
    assert "[chatty.job-1] line two\n" in text
    assert d.stop() == 0
    hist = store.history("chatty.job-1")
    assert [r.id for r in hist] == [run.id]
    assert hist[0].output == "line one\nline two\nno newline"


# test_a_cron_and_rate_job_keeps_its_rate_among_jobs_due_at_once,
# test_a_cron_and_rate_job_runs_every_period_without_drift and
# test_a_cron_and_rate_job_publishes_its_next_start_after_the_rate moved to
# tests/test_firing_memory.py (one daemon's rate decisions, in-process on the memory
# store); their SQL (a slot claim's rate and its tolerance, a batch held to the rate,
# next_due) stays covered on every database by tests/test_firing_contract.py.


def test_a_slot_whose_run_record_deadlocks_still_runs(
    db: TestDb, store: Store, fleet: Fleet
) -> None:
    if db.backend != "mariadb":
        pytest.skip("the claim and its record are two statements of one round trip on MariaDB")
    store.ensure_schema()
    fail_next_run_inserts(store, 1)
    d = fleet.start(f"jobs:\n  tick: {{cron: {EVERY_SECOND}, command: 'true'}}\n")
    d.wait(lambda: len(runs_of(store, "tick", m.OK)) >= 3, 30, "three runs")
    with store.engine.connect() as conn:
        left = conn.exec_driver_sql(f"SELECT n FROM `{store.t.runs.name}_fail`").scalar()
    assert left == 0  # the forced deadlock happened
    runs = runs_of(store, "tick")
    slots = [r.slot or 0.0 for r in runs[:3]]
    # The deadlocked record was written on its own: no slot was lost to it.
    assert [b - a for a, b in zip(slots, slots[1:], strict=False)] == [1.0, 1.0], d.text()
    assert [r.result for r in runs[:3]] == [m.OK] * 3


def test_a_negative_token_is_logged_once_and_blocks_only_its_job(
    db: TestDb, store: Store, fleet: Fleet
) -> None:
    if db.backend != "mariadb":
        pytest.skip("LAST_INSERT_ID(expr) takes no negative token on MySQL/MariaDB only")
    store.ensure_jobs(["edited", "fine"])
    locks = store.t.locks
    with store.engine.connect() as conn:
        conn.execute(locks.update().where(locks.c.name == "edited").values(token=-5))
    d = fleet.start(f"jobs:\n  edited: {{cron: {EVERY_SECOND}, command: 'true'}}\n"
                    f"  fine: {{cron: {EVERY_SECOND}, command: 'true'}}\n")
    # Both are due on every instant (a batch claim): the edited row must not
    # take the other job down with it, nor flap the outage log every second.
    d.wait(lambda: len(runs_of(store, "fine", m.OK)) >= 4, 30, "four runs of `fine`")
    log = d.text()
    assert log.count("its fencing token is negative") == 1, log
    assert "dblockrun unlock edited" in log
    assert "database error" not in log and "database back" not in log, log
    assert runs_of(store, "edited") == []


def test_a_token_that_goes_backwards_is_logged_and_the_job_goes_on(
    store: Store, fleet: Fleet
) -> None:
    # A failover to an asynchronous standby can lose the newest claims: the
    # next claim then hands out a token this daemon already had (issue 14).
    d = fleet.start(f"jobs:\n  flip: {{cron: {EVERY_SECOND}, command: 'true'}}\n")
    d.wait(lambda: len(runs_of(store, "flip", m.OK)) >= 3, 30, "three runs")
    locks = store.t.locks
    with store.engine.connect() as conn:
        conn.execute(locks.update().where(locks.c.name == "flip").values(token=1))
    d.wait(lambda: "went backwards" in d.text(), 15, "the went-backwards line")
    assert d.text().count("went backwards") == 1, d.text()
    before = len(runs_of(store, "flip", m.OK))
    d.wait(lambda: len(runs_of(store, "flip", m.OK)) > before + 1, 15, "more runs")
    slots = [r.slot for r in runs_of(store, "flip") if r.result != m.SKIPPED]
    assert len(slots) == len(set(slots)), slots
    assert d.stop() == 0
