"""Overlap policies (``overlap:``): what a slot due while the job's run is
still going becomes. ``forbid`` (skipped) is covered by the busy tests;
here ``queue`` and ``replace``, with real `dblockrun daemon` processes on
every database, two daemons sharing the job."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from harness import Fleet
from helpers import TestDb, invoke, overlaps, wait_for
from jobfiles import FILE, error, jobs_file

from dblockrun.cli import cli
from dblockrun.config.load import load_jobs_text
from dblockrun.daemon.registry import Runs
from dblockrun.jobs import Job
from dblockrun.ops import output
from dblockrun.scheduling.limits import lane_names
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.models import RunRecord
from dblockrun.store.status import report
from dblockrun.timetext import utc

# --- the jobs file -----------------------------------------------------------------


def test_overlap_is_read_from_the_job_and_from_defaults() -> None:
    jobs = load_jobs_text(textwrap.dedent("""\
        defaults:
          overlap: queue
        jobs:
          a: {cron: "@hourly", command: x}
          b: {cron: "@hourly", command: x, overlap: replace}
          c: {cron: "@hourly", command: x, overlap: forbid}
        """), FILE)
    assert [j.overlap for j in jobs.jobs] == ["queue", "replace", "forbid"]
    # The default leaves the definition's hash as it was without the key.
    plain = load_jobs_text('jobs: {c: {cron: "@hourly", command: x}}', FILE)
    assert plain.jobs[0].definition_hash() == jobs.jobs[2].definition_hash()
    assert jobs.jobs[0].definition_hash() != jobs.jobs[2].definition_hash()


@pytest.mark.parametrize(("text", "message"), [
    ('jobs:\n  a: {cron: "@hourly", command: x, overlap: sometimes}\n',
     "jobs.yaml:2: job 'a': overlap: must be one of forbid, queue, replace, allow N (what a "
     "slot due "
     "while the job's run is still going becomes), got a string ('sometimes')"),
    ('jobs:\n  a:\n    rate: 5m\n    command: x\n    overlap: queue\n',
     "jobs.yaml:5: job 'a': overlap: only for a cron job without items (a rate job starts "
     "when its last start is a rate old; a fan-out job's items have their own slots)"),
    ('jobs:\n  a:\n    cron: "@hourly"\n    items: [x]\n    command: x\n    overlap: replace\n',
     "jobs.yaml:6: job 'a': overlap: only for a cron job without items"),
])
def test_a_bad_overlap_names_file_line_job_and_key(text: str, message: str) -> None:
    assert message in error(text)


# --- the daemons -------------------------------------------------------------------


def slots_from(store: Store, job: str, first: float) -> dict[float, RunRecord]:
    """The job's finished records from slot ``first`` on, by slot (each
    slot has one record: one start, or one record of why not)."""
    records = [r for r in store.history(job, 200) if r.slot is not None and r.slot >= first]
    slots = [r.slot for r in records]
    assert len(set(slots)) == len(slots), records
    return {r.slot: r for r in records if r.slot is not None and r.result != m.RUNNING}


@pytest.mark.slow
def test_queue_runs_the_slot_that_came_while_busy_after_the_run(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """A slot every 2 s, each run 3.2 s, two daemons: the slot due while a
    run goes on waits and starts when it ends (late, never alongside); of
    two slots that came during one run, the older is recorded skipped
    (the queue holds one) and the newer runs."""
    jobs = jobs_file(tmp_path / "jobs.yaml", {"q": """\
        cron: "*/2 * * * * *"
        overlap: queue
        command: sleep 3.2
        """})
    fleet.start_n(2, jobs)
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: len(store.hosts(seen_within=30)) == 2, 30, what="2 daemons registered")
        first = store.db_now() + 1

        def enough() -> dict[float, RunRecord] | None:
            done = slots_from(store, "q", first)
            results = [r.result for r in done.values()]
            return done if results.count(m.OK) >= 4 and m.SKIPPED in results else None

        done = wait_for(enough, 60, interval=0.2, what="4 runs and a skipped slot")
    finally:
        codes = fleet.stop()
    assert codes == [0, 0]
    ok = [r for r in done.values() if r.result == m.OK]
    assert overlaps(ok) == [], done
    # A slot that came while the run before went on started when it ended.
    ok.sort(key=lambda r: r.started)
    waited = [(before, after) for before, after in zip(ok, ok[1:], strict=False)
              if after.slot is not None and before.finished is not None
              and after.slot < before.finished - 0.1]
    assert waited, ok
    for before, after in waited:
        assert before.finished is not None
        assert 0 <= after.started - before.finished < 3.0, (before, after)
    slots = sorted(done)
    assert slots == [slots[0] + 2 * i for i in range(len(slots))], done  # none unrecorded
    for skipped in (r for r in done.values() if r.result == m.SKIPPED):
        record = store.run(skipped.id)
        assert record is not None and record.output is not None
        assert "overlap: queue: the queue holds one slot" in record.output, record.output
    store.close()


@pytest.mark.slow
def test_replace_stops_the_running_run_and_starts_the_new_slot(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """A slot every 4 s, a run that would take 60 s, two daemons: at the
    next slot the run is stopped through the kill request (its record says
    it was replaced, and by which slot) and the new slot's run starts."""
    jobs = jobs_file(tmp_path / "jobs.yaml", {"r": """\
        cron: "*/4 * * * * *"
        overlap: replace
        command: sleep 60
        """})
    fleet.start_n(2, jobs)
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: len(store.hosts(seen_within=30)) == 2, 30, what="2 daemons registered")
        first = store.db_now() + 1

        def replaced() -> dict[float, RunRecord] | None:
            done = slots_from(store, "r", first)
            return done if len(done) >= 2 else None

        done = wait_for(replaced, 60, interval=0.2, what="2 replaced runs")
        running = wait_for(lambda: next((r for r in store.history("r", 5)
                                         if r.result == m.RUNNING), None), 20,
                           what="the replacing run")
    finally:
        codes = fleet.stop()
    assert codes == [0, 0]
    runs = sorted(done.values(), key=lambda r: r.started)
    for run in runs:
        assert run.result == m.KILLED, runs
        record = store.run(run.id)
        assert record is not None and record.output is not None
        assert run.slot is not None
        assert f"replaced by the slot {utc(run.slot + 4)} (overlap: replace)" in record.output
        # Stopped within a few seconds of the next slot, not after 60 s.
        assert run.duration is not None and run.duration < 15, run
    for before, after in zip(runs, runs[1:], strict=False):
        assert after.slot == (before.slot or 0) + 4
        assert before.finished is not None and after.started >= before.finished - 0.05
    assert running.slot is not None and running.slot > runs[-1].slot  # type: ignore[operator]
    store.close()


# --- overlap: allow N ----------------------------------------------------------------


def test_allow_n_is_read_with_its_bound() -> None:
    jobs = load_jobs_text(textwrap.dedent("""\
        jobs:
          a: {cron: "@hourly", command: x, overlap: allow 3}
          b: {cron: "@hourly", command: x, overlap: "allow  12"}
          c: {cron: "@hourly", command: x}
        """), FILE)
    assert [(j.overlap, j.allow) for j in jobs.jobs] == [
        ("allow 3", 3), ("allow 12", 12), ("forbid", None)]
    assert lane_names(jobs.jobs[0]) == ["lane:a:1", "lane:a:2", "lane:a:3"]
    assert lane_names(jobs.jobs[2]) == []
    assert jobs.jobs[0].definition_hash() != load_jobs_text(
        'jobs: {a: {cron: "@hourly", command: x, overlap: allow 2}}', FILE
    ).jobs[0].definition_hash()


@pytest.mark.parametrize(("value", "message"), [
    ("allow", "jobs.yaml:4: job 'a': overlap: allow needs a bound: allow N, at most N runs of "
              "the job at once across the fleet (e.g. allow 2)"),
    ("allow 0", "jobs.yaml:4: job 'a': overlap: allow N: N must be a whole number from 1 to "
                "1000 (runs of the job at once across the fleet), got '0'"),
    ("allow two", "got 'two'"),
    ("allow 1001", "got '1001'"),
    ("allow -1", "got '-1'"),
])
def test_a_bad_allow_bound_names_file_line_job_and_key(value: str, message: str) -> None:
    assert message in error(f'jobs:\n  a:\n    cron: "@hourly"\n    overlap: {value}\n'
                            "    command: x\n")


def test_validate_accepts_allow_n_and_rejects_it_without_a_bound(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text('jobs:\n  a:\n    cron: "@hourly"\n    command: x\n    overlap: allow 2\n')
    bad = tmp_path / "bad.yaml"
    bad.write_text('jobs:\n  a:\n    cron: "@hourly"\n    command: x\n    overlap: allow\n')
    runner = CliRunner()
    ok = runner.invoke(cli, ["validate", str(good)])
    assert ok.exit_code == 0, ok.output
    failed = runner.invoke(cli, ["validate", str(bad)])
    assert failed.exit_code == 2
    assert f"{bad}:5: job 'a': overlap: allow needs a bound" in failed.output
    assert "Traceback" not in failed.output


def running_at_once(runs: list[RunRecord]) -> int:
    """The most of ``runs`` going at one instant (start to finish)."""
    edges = sorted([(r.started, 1) for r in runs]
                   + [(r.finished or float("inf"), -1) for r in runs], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _at, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.mark.slow
def test_allow_2_runs_two_at_once_across_the_fleet_and_skips_the_third(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """A slot every second, each run 2.5 s, two daemons: with ``allow 2``
    two runs go at once (on either host), never three; a slot due while two
    go is recorded skipped (2 runs already going); every slot has exactly
    one record. The same job with ``forbid`` never has two at once."""
    jobs = jobs_file(tmp_path / "jobs.yaml", {"many": """\
        cron: "* * * * * *"
        overlap: allow 2
        command: sleep 2.5
        """, "one": """\
        cron: "* * * * * *"
        command: sleep 2.5
        """})
    fleet.start_n(2, jobs)
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: len(store.hosts(seen_within=30)) == 2, 30, what="2 daemons registered")
        first = store.db_now() + 1

        def enough() -> dict[float, RunRecord] | None:
            done = slots_from(store, "many", first)
            results = [r.result for r in done.values()]
            return done if results.count(m.OK) >= 6 and m.SKIPPED in results else None

        wait_for(enough, 60, interval=0.2, what="6 runs and a skipped slot")
    finally:
        codes = fleet.stop()
    assert codes == [0, 0]
    # Read once both stopped: the runs they had going have ended (within --grace).
    done, single = slots_from(store, "many", first), slots_from(store, "one", first)
    ok = [r for r in done.values() if r.result == m.OK]
    assert running_at_once(ok) == 2, ok
    slots = sorted(done)
    assert slots == [slots[0] + i for i in range(len(slots))], done  # none unrecorded
    for skipped in (r for r in done.values() if r.result == m.SKIPPED):
        record = store.run(skipped.id)
        assert record is not None and record.output is not None
        assert record.output.startswith("skipped: overlap: allow 2: 2 runs already going (on "), \
            record.output
    # Each run's fencing token is the job's, one per start, increasing with the slot.
    by_slot = sorted(ok, key=lambda r: r.slot or 0)
    tokens = [r.token or 0 for r in by_slot]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), by_slot
    forbid = [r for r in single.values() if r.result == m.OK]
    assert forbid and running_at_once(forbid) == 1, single
    assert any(r.result == m.SKIPPED for r in single.values()), single
    # The lanes are not jobs.
    assert store.job_names() == ["many", "one"]
    store.close()


@pytest.mark.slow
@pytest.mark.fleet_timing(lease="3s")  # what it measures
def test_a_dead_hosts_lanes_are_found_lost_freed_and_kill_stops_every_run(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """``allow 2`` with runs that would take a minute: the first daemon
    holds both lanes; killed (SIGKILL), its two runs are recorded lost by the
    other daemon's bookkeeping, which then takes the lanes once their
    leases ran out; `dblockrun kill JOB` stops both of its runs."""
    jobs = jobs_file(tmp_path / "jobs.yaml", {"long": """\
        cron: "* * * * * *"
        overlap: allow 2
        command: sleep 60
        """})
    first = fleet.start(jobs)
    store = Store(db.url, db.prefix)
    try:
        held = wait_for(lambda: len(store.control.running("long")) == 2 and
                        store.control.running("long"), 30, what="2 runs of the first daemon")
        fleet.start(jobs)
        wait_for(lambda: len(store.hosts(seen_within=30)) == 2, 30, what="2 daemons registered")
        first.kill()
        killed = store.db_now()
        # Where the dead daemon's leases of the lanes end (it renews them no more).
        lanes, _now = store.lock_states()
        ends = [lock.lock_until or 0.0 for name, lock in lanes.items() if name.startswith("lane:")]
        assert len(ends) == 2, lanes

        def taken_over() -> list[RunRecord] | None:
            now = store.control.running("long")
            return now if len(now) == 2 and not {r.id for r in now} & {r.id for r in held} \
                else None

        after = wait_for(taken_over, 20, interval=0.2, what="both lanes taken over")
        lost = [store.run(r.id) for r in held]
        assert [r.result if r else None for r in lost] == [m.LOST, m.LOST], lost
        assert all(r.host != held[0].host for r in after), after
        # Not before the dead host's leases ran out (a run's start is its
        # claim of the job's row, a round trip before it takes the lane).
        assert min(r.started for r in after) >= min(ends) - 0.2, (ends, after)
        print(f"\nallow 2: both lanes taken over {max(r.started for r in after) - killed:.1f}s "
              "after the SIGKILL (lease 3s)")
        # status shows each run going (the job's own row is free between claims).
        shown = report(store, ["long"]).jobs[0]
        assert shown.state == "running", shown
        assert [r.id for r in shown.lane_runs] == sorted(r.id for r in after), shown
        assert "; 2 runs: " in output.status_text(
            [shown], store.live_hosts(), shown.db_now, wide=True), shown
        # The job is due every second: once the kill frees its lanes, the
        # next slot starts a run at once. Disabled first (as an operator
        # stopping it for good would), nothing takes the lanes again.
        on = ("--db", db.url, "--table-prefix", db.prefix)
        off = invoke(*on, "disable", "long", "--reason", "stop it")
        assert off.returncode == 0, off
        stop = invoke(*on, "kill", "long")
        assert stop.returncode == 0, stop
        for run in after:
            assert f"run {run.id} on {run.host} killed" in stop.stdout, stop.stdout
        ended = [store.run(r.id) for r in after]
        assert [r.result if r else None for r in ended] == [m.KILLED, m.KILLED], ended
        assert report(store, ["long"]).jobs[0].lane_runs == ()
        assert store.control.running("long") == []
    finally:
        codes = fleet.stop()
    assert codes[1:] == [0]
    store.close()


class FakeRun:
    def __init__(self, job: Job) -> None:
        self.job = job
        self.commands = 1
        self.queued = self.wants_room = False
        self.order = (0.0, 0)

    def is_alive(self) -> bool:
        return True

    def winding_up(self) -> bool:
        return False


def test_a_host_counts_each_run_of_an_allow_job_for_max_running() -> None:
    """Two runs of one ``allow`` job on a host are two commands for
    ``--max-running`` and both are stopped at shutdown (``all``); the job
    is busy here until the last one ends."""
    job = load_jobs_text('jobs: {a: {cron: "@hourly", command: x, overlap: allow 2}}',
                        FILE).jobs[0]
    ended: list[int] = []
    runs = Runs(cap=2, ended=lambda: ended.append(1))
    first, second = FakeRun(job), FakeRun(job)
    runs.add(first)
    runs.add(second)
    assert (runs.count(), runs.full(), len(runs.all())) == (2, True, 2)
    runs.done(first)
    assert (runs.count(), runs.busy("a"), runs.all()) == (1, True, [second])
    runs.done(second)
    assert (runs.count(), runs.busy("a"), runs.finished()) == (0, False, {"a"})


@pytest.mark.slow
def test_run_now_takes_a_lane_and_says_when_all_are_held(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """`dblockrun run` of an ``allow 2`` job: each request starts a run
    alongside the others while a lane is free; with both held the third is
    not started, and says why."""
    jobs = jobs_file(tmp_path / "jobs.yaml", {"long": """\
        cron: "@yearly"
        overlap: allow 2
        command: sleep 60
        """})
    fleet.start(jobs, grace="0.5s")
    store = Store(db.url, db.prefix)
    run = ("--db", db.url, "--table-prefix", db.prefix, "run", "long")
    try:
        wait_for(lambda: len(store.hosts(seen_within=30)) == 1, 30, what="the daemon registered")
        for started in (1, 2):
            asked = invoke(*run)
            assert asked.returncode == 0, asked
            assert len(store.control.running("long")) == started
        third = invoke(*run)
        assert third.returncode == 1, third
        assert "overlap: allow 2: 2 runs already going (on " in third.stderr, third.stderr
        assert len(store.control.running("long")) == 2
    finally:
        codes = fleet.stop()
    assert codes == [0]
    store.close()
