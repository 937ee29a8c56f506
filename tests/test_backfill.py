"""`dblockrun backfill` and `dblockrun rerun` (issue 37 item 3), on every
backend: a passed slot runs again through the one claim, as its own slot
(DBLOCKRUN_SLOT), once ok however many backfills race each other and the
daemons; progress, --only, --dry-run, the first failure, the audit trail;
a rerun is a new run of the same slot, refused while that slot runs."""

from __future__ import annotations

import math
import re
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from harness import Fleet
from helpers import (
    REPO,
    Ran,
    TestDb,
    clean_env,
    dblockrun_cmd,
    invoke,
    pass_time,
    set_last_slot,
    wait_for,
)

from dblockrun.jobs import Job
from dblockrun.ops.backfill import plan
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.control import Audit
from dblockrun.timetext import stamp

#: A per-second job whose command appends its DBLOCKRUN_SLOT to a file.
TICK = """\
jobs:
  tick:
    cron: "* * * * * *"
    catch-up: none
    command: 'echo "$DBLOCKRUN_SLOT" >> {out}{more}'
"""


def env_slot(slot: float) -> str:
    """A slot as DBLOCKRUN_SLOT gives it."""
    return datetime.fromtimestamp(slot, UTC).isoformat().replace("+00:00", "Z")


def jobs_file(path: Path, out: Path, more: str = "") -> Path:
    path.write_text(TICK.format(out=out, more=more))
    return path


def cli(db: TestDb, jobs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A real process: a backfill or rerun that runs the job's command (its
    child, the spawner's threads and socket live in that process)."""
    return subprocess.run([*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix,
                           "-f", str(jobs), *args], capture_output=True, text=True,
                          env=clean_env(), cwd=REPO, timeout=120)


def op(db: TestDb, jobs: Path, *args: str) -> Ran:
    """In-process (helpers.invoke), for a command that runs nothing (history,
    --dry-run, a refusal): what the command says and records is tested, not
    its process, which costs 0.15-0.5 CPU-s of imports."""
    return invoke("--db", db.url, "--table-prefix", db.prefix, "-f", str(jobs), *args)


def started(db: TestDb, jobs: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix,
                             "-f", str(jobs), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=REPO)


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def ok_runs(store: Store, slot: float) -> list[m.RunRecord]:
    return [r for r in store.history("tick", 1000) if r.slot == slot and r.result == m.OK]


def missed_slots(store: Store, first: float, count: int, result: str = m.MISSED) -> list[float]:
    """``count`` per-second slots from ``first``, recorded ``result`` as the
    slot book records passed slots, the job's last slot past them."""
    slots = [first + i for i in range(count)]
    set_last_slot(store, "tick", slots[-1])
    store.record_slots("tick", "h:1:a", result, [(s, f"{result}: test\n", None) for s in slots],
                       first=None)
    return slots


def test_backfill_after_an_outage_runs_each_missed_slot_once_in_order(
        db: TestDb, store: Store, tmp_path: Path, fleet: Fleet) -> None:
    out = tmp_path / "slots.txt"
    jobs = jobs_file(tmp_path / "jobs.yaml", out)
    daemon = fleet.start(jobs, lease="6s", heartbeat="2s", cwd=REPO, env=clean_env())
    wait_for(lambda: any(r.result == m.OK for r in store.history("tick")), 20,
             what="a first run")
    assert daemon.stop() == 0
    down = store.db_now()
    # The outage: no daemon runs for 11 s, so at least eleven slots pass;
    # the restarted daemon runs the newest (due now, catch-up: none) and
    # records the others missed: ten or more, however fast it starts (a
    # fixed count, waited for, depended on how fast it started: 9 of 10
    # runs timed out at nine missed slots after a 10.5 s outage).
    pass_time(11)
    fleet.start(jobs, lease="6s", heartbeat="2s", cwd=REPO, env=clean_env())

    def back() -> float | None:
        """The slot of the restarted daemon's first run: its plan of the
        outage (the missed records, then the run) is written by then."""
        return min((r.slot for r in store.history("tick", 1000)
                    if r.result == m.OK and r.slot is not None and r.slot > down), default=None)

    first_after = wait_for(back, 30, what="the restarted daemon's first run")
    slots = sorted(r.slot for r in store.history("tick", 1000)
                   if r.result == m.MISSED and r.slot is not None and down < r.slot < first_after)
    # A record a slot up to that run (past RECORDED, the oldest share a
    # summary record at the newest of theirs), at least ten.
    assert len(slots) >= 10 and slots == [slots[0] + k for k in range(len(slots))], slots
    assert slots[-1] == first_after - 1, (slots, first_after)
    before = set(lines(out))
    assert not before & {env_slot(s) for s in slots}
    # The daemon runs on meanwhile: its new slots and the backfill share the lock.
    done = cli(db, jobs, "backfill", "tick", "--from", env_slot(slots[0]),
               "--to", env_slot(slots[-1]))
    assert (done.returncode, done.stderr) == (0, "")
    # A slot may wait a moment for the daemon's run of the job to end.
    said = [line for line in done.stdout.splitlines()
            if not line.startswith("tick: waiting: tick is busy")]
    assert said[0].startswith(f"tick: backfilling {len(slots)} slot(s) from {stamp(slots[0])} "
                              f"to {stamp(slots[-1])} (missed {len(slots)})")
    assert said[-1] == f"tick: backfill done: {len(slots)} ok"
    # Each slot: started, then its result, oldest first.
    for i, slot in enumerate(slots):
        assert said[1 + 2 * i].startswith(f"tick: slot {stamp(slot)} (missed, record ")
        assert said[2 + 2 * i].startswith(f"tick: slot {stamp(slot)}: run ")
        assert " ended ok (exit 0) in " in said[2 + 2 * i]
    # Each ran once, in order, with its historical DBLOCKRUN_SLOT.
    wanted = {env_slot(s) for s in slots}
    assert [line for line in lines(out) if line in wanted] == [env_slot(s) for s in slots]
    runs = [r for r in store.history("tick", 1000) if r.origin == "backfill"]
    assert sorted(r.slot or 0.0 for r in runs) == slots
    assert [r.slot for r in sorted(runs, key=lambda r: r.id)] == slots
    assert all(len(ok_runs(store, s)) == 1 for s in slots)
    # history shows them as backfilled; the audit trail has the action.
    shown = op(db, jobs, "history", "tick", "--limit", "1000").stdout
    assert f"backfill {stamp(slots[0])}" in shown
    (entry,) = [e for e in store.control.entries("tick") if e.action == "backfill"]
    assert entry.detail == (f"{len(slots)} slot(s) from {stamp(slots[0])} to "
                            f"{stamp(slots[-1])}")
    # Again: nothing left to run.
    again = op(db, jobs, "backfill", "tick", "--from", env_slot(slots[0]),
                "--to", env_slot(slots[-1]))
    assert again.returncode == 0
    assert again.stdout.startswith("tick: no slot to backfill")
    fleet.stop()


def test_two_backfills_at_once_run_each_slot_once(db: TestDb, store: Store,
                                                   tmp_path: Path) -> None:
    out = tmp_path / "slots.txt"
    jobs = jobs_file(tmp_path / "jobs.yaml", out, "; sleep 0.2")
    slots = missed_slots(store, math.floor(time.time()) - 40, 10)
    span = ("--from", env_slot(slots[0]), "--to", env_slot(slots[-1]))
    both = [started(db, jobs, "backfill", "tick", *span) for _ in range(2)]
    ends = [p.communicate(timeout=120) for p in both]
    assert [p.returncode for p in both] == [0, 0], ends
    assert sorted(lines(out)) == [env_slot(s) for s in slots]  # each once
    assert all(len(ok_runs(store, s)) == 1 for s in slots)
    # Each said which it ran; together, every slot once.
    ran = sum(stdout.count(" ended ok ") for stdout, _err in ends)
    assert ran == len(slots)
    for stdout, _err in ends:  # each ran or saw run elsewhere every slot it planned
        said = stdout.splitlines()
        if said[0].startswith("tick: no slot to backfill"):
            continue  # it looked after the other had run them all
        planned = int(said[0].split()[2])
        done = re.fullmatch(r"tick: backfill done: (\d+) ok(?:, (\d+) ran ok elsewhere)?",
                            said[-1])
        assert done is not None, said[-1]
        assert int(done[1]) + int(done[2] or 0) == planned


def test_dry_run_lists_and_only_picks(db: TestDb, store: Store, tmp_path: Path) -> None:
    out = tmp_path / "slots.txt"
    jobs = jobs_file(tmp_path / "jobs.yaml", out)
    first = math.floor(time.time()) - 40
    missed = missed_slots(store, first, 2)
    skipped = [first + 2]
    store.record_slots("tick", "h:1:a", m.SKIPPED, [(skipped[0], "skipped: busy\n", None)],
                       first=None)
    failed = store.start_run("tick", "h:1:a", token=None, slot=first + 3)
    store.finish_run(failed, "tick", None, m.FAILED, 3, "boom\n")
    done = store.start_run("tick", "h:1:a", token=None, slot=first + 4)
    store.finish_run(done, "tick", None, m.OK, 0, "")
    set_last_slot(store, "tick", first + 5)  # first + 5: passed with no record
    span = ("--from", env_slot(first), "--to", env_slot(first + 7))
    listed = op(db, jobs, "backfill", "tick", *span, "--dry-run")
    assert (listed.returncode, listed.stderr) == (0, "")
    assert listed.stdout.splitlines() == [
        f"tick: would backfill 5 slot(s) from {stamp(first)} to {stamp(first + 7)} "
        "(missed 2, skipped 1, failed 1, unrecorded 1); other slots: 1 ran ok, "
        "2 not passed yet (the daemons'); nothing run (--dry-run)",
        *(f"{stamp(s)}  missed      record {r.id}" for s, r in zip(
            missed, sorted((r for r in store.history("tick") if r.result == m.MISSED),
                           key=lambda r: r.slot or 0), strict=True)),
        f"{stamp(first + 2)}  skipped     record {failed - 1}",
        f"{stamp(first + 3)}  failed      run {failed} ended failed",
        f"{stamp(first + 5)}  unrecorded  no record",
    ]
    assert not out.exists()
    assert store.control.entries("tick") == []  # a dry run is no action
    only = cli(db, jobs, "backfill", "tick", *span, "--only", "failed,unrecorded")
    assert only.returncode == 0, only.stderr
    assert lines(out) == [env_slot(first + 3), env_slot(first + 5)]
    bad = op(db, jobs, "backfill", "tick", *span, "--only", "missed,late")
    assert (bad.returncode, bad.stderr) == (
        2, "dblockrun: --only late: want missed, skipped, failed, unrecorded\n")


def test_stops_at_the_first_failure_unless_keep_going(db: TestDb, store: Store,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "slots.txt"
    slots = missed_slots(store, math.floor(time.time()) - 40, 5)
    fails = env_slot(slots[2])
    jobs = jobs_file(tmp_path / "jobs.yaml", out, f'; [ "$DBLOCKRUN_SLOT" != {fails} ]')
    span = ("--from", env_slot(slots[0]), "--to", env_slot(slots[-1]))
    stopped = cli(db, jobs, "backfill", "tick", *span)
    assert stopped.returncode == 1
    assert lines(out) == [env_slot(s) for s in slots[:3]]
    said = stopped.stdout.splitlines()
    assert " ended failed (exit 1) in " in said[-3]
    assert said[-2].startswith("tick: stopped at the first slot that did not run ok (2 not "
                               "run; --keep-going runs on)")
    assert said[-1] == "tick: backfill done: 2 ok, 1 not ok, 2 not run"
    going = cli(db, jobs, "backfill", "tick", *span, "--keep-going")
    assert going.returncode == 1
    # The failed slot again (it has no ok run), then the two after it.
    assert lines(out)[3:] == [env_slot(s) for s in slots[2:]]
    assert going.stdout.splitlines()[-1] == "tick: backfill done: 2 ok, 1 not ok"
    assert [len(ok_runs(store, s)) for s in slots] == [1, 1, 0, 1, 1]


def test_backfill_honours_pause_and_disable(db: TestDb, store: Store, tmp_path: Path) -> None:
    out = tmp_path / "slots.txt"
    jobs = jobs_file(tmp_path / "jobs.yaml", out)
    slots = missed_slots(store, math.floor(time.time()) - 40, 3)
    span = ("--from", env_slot(slots[0]), "--to", env_slot(slots[-1]))
    store.control.pause(Audit("alice@ops", "pause", reason="upgrade"), None)
    # In-process: a refusal starts no spawn service (invoke fails on its
    # thread or socket left behind).
    paused = op(db, jobs, "backfill", "tick", *span)
    assert paused.returncode == 1
    assert paused.stderr == ("dblockrun: tick: backfill stopped: the fleet is paused (by "
                             "alice@ops: upgrade); 0 ok, 3 not run (the same backfill runs "
                             "what is left later)\n")
    store.control.resume(Audit("alice@ops", "resume"))
    store.disable("tick", reason="broken")
    disabled = op(db, jobs, "backfill", "tick", *span)
    assert disabled.returncode == 1
    assert "backfill stopped: tick is disabled (broken)" in disabled.stderr
    assert not out.exists()


def test_rerun_runs_the_slot_again_and_is_refused_while_it_runs(
        db: TestDb, store: Store, tmp_path: Path) -> None:
    out = tmp_path / "slots.txt"
    slot = math.floor(time.time()) - 40
    set_last_slot(store, "tick", slot + 5)
    failed = store.start_run("tick", "h:1:a", token=None, slot=slot)
    store.finish_run(failed, "tick", None, m.FAILED, 3, "boom\n")
    jobs = jobs_file(tmp_path / "jobs.yaml", out)
    again = cli(db, jobs, "rerun", str(failed))
    assert (again.returncode, again.stderr) == (0, "")
    new = max(r.id for r in store.history("tick"))
    assert new != failed
    assert again.stdout.splitlines() == [
        f"tick: rerun of run {failed} (slot {stamp(slot)}): run {new} started on "
        + again.stdout.split(" started on ")[1].split("\n")[0],
        again.stdout.splitlines()[1]]
    assert again.stdout.splitlines()[1].startswith(f"tick: run {new} ended ok (exit 0) in ")
    run = store.run(new)
    assert run is not None and (run.slot, run.result, run.origin, run.origin_run) == (
        slot, m.OK, "rerun", failed)
    assert lines(out) == [env_slot(slot)]
    assert f"rerun of {failed}" in op(db, jobs, "history", "tick").stdout
    (entry,) = [e for e in store.control.entries("tick") if e.action == "rerun"]
    assert entry.detail == f"run {failed} (slot {stamp(slot)}) as run {new}"
    # A rerun of an ok run is a new run too; while it runs, its slot is refused.
    release = tmp_path / "release"
    slow = jobs_file(tmp_path / "slow.yaml", out,
                     f"; while [ ! -e {release} ]; do sleep 0.1; done")
    going = started(db, slow, "rerun", str(new))
    running = wait_for(lambda: store.control.running("tick") or None, 30, what="rerun running")
    refused = op(db, slow, "rerun", str(failed))
    assert refused.returncode == 1
    assert refused.stderr == (
        f"dblockrun: rerun of run {failed} refused: slot {stamp(slot)} of tick is running "
        f"now: run {running[0].id} on {running[0].host} since {stamp(running[0].started)} "
        f"(wait for its end, or `dblockrun kill --run {running[0].id}`)\n")
    release.touch()
    assert going.wait(timeout=60) == 0
    assert len(ok_runs(store, slot)) == 2
    missing = op(db, jobs, "rerun", "999999")
    assert missing.returncode == 2 and "no run 999999 in " in missing.stderr


def test_each_slot_of_a_summary_record_is_backfilled(db: TestDb, store: Store) -> None:
    """Many passed slots are one summary record (``covers_from`` to
    ``slot``): backfill plans each slot it stands for."""
    job = Job("tick", "true", cron="* * * * * *")
    first = math.floor(time.time()) - 60
    set_last_slot(store, "tick", first + 9)
    store.record_slots("tick", "h:1:a", m.MISSED,
                       [(first + 9, "missed: 10 slots from A to B: down\n", first)], first=None)
    (summary,) = store.history("tick")
    chosen = plan(store, job, first - 5, first + 20)
    assert [(p.slot, p.kind, p.record) for p in chosen.pending] == [
        *((first + i, "unrecorded", None) for i in range(-5, 0)),
        *((first + i, "missed", summary.id) for i in range(10))]
    assert chosen.not_passed == 11
    assert [p.slot for p in plan(store, job, first - 5, first + 20, ["missed"]).pending] == [
        first + i for i in range(10)]


def test_a_grouped_job_waits_for_a_seat_of_its_group(db: TestDb, store: Store,
                                                     tmp_path: Path) -> None:
    out, said = tmp_path / "slots.txt", tmp_path / "said.txt"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("groups:\n  backups: 1\n"
                    + TICK.format(out=out, more="") + "    group: backups\n")
    slots = missed_slots(store, math.floor(time.time()) - 40, 2)
    seat_row = "group:backups:1"
    store.ensure_jobs([seat_row])
    seat = store.claim_seat([seat_row], "other:1:x", 60.0, "dump")  # another job's run
    assert seat is not None
    with said.open("w") as sink:
        proc = subprocess.Popen([*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix,
                                 "-f", str(jobs), "backfill", "tick", "--from",
                                 env_slot(slots[0]), "--to", env_slot(slots[-1])],
                                stdout=sink, stderr=subprocess.STDOUT, text=True,
                                env=clean_env(), cwd=REPO)
        try:
            wait_for(lambda: "tick: waiting: group backups at its limit (1): held by dump on "
                     "other:1:x" in said.read_text(), 30, what="the wait for a seat")
            assert not out.exists()  # nothing ran without its seat
            store.release_seat(seat, "other:1:x")
            assert proc.wait(timeout=60) == 0, said.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
    assert lines(out) == [env_slot(s) for s in slots]
