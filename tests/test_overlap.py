"""Overlap policies (``overlap:``): what a slot due while the job's run is
still going becomes. ``forbid`` (skipped) is covered by the busy tests;
here ``queue`` and ``replace``, with real `dblockrun daemon` processes on
every database, two daemons sharing the job."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from helpers import TestDb, wait_for
from test_limits import jobs_file, overlaps, start_daemon, stop_all

from dblockrun.config.load import load_jobs_text
from dblockrun.errors import ConfigError
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.models import RunRecord
from dblockrun.timetext import utc

FILE = "jobs.yaml"


def error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_jobs_text(textwrap.dedent(text), FILE)
    return info.value.render()


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
     "jobs.yaml:2: job 'a': overlap: must be one of forbid, queue, replace (what a slot due "
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
def test_queue_runs_the_slot_that_came_while_busy_after_the_run(db: TestDb,
                                                                tmp_path: Path) -> None:
    """A slot every 2 s, each run 3.2 s, two daemons: the slot due while a
    run goes on waits and starts when it ends (late, never alongside); of
    two slots that came during one run, the older is recorded skipped
    (the queue holds one) and the newer runs."""
    jobs = jobs_file(tmp_path / "jobs.yaml", {"q": """\
        cron: "*/2 * * * * *"
        overlap: queue
        command: sleep 3.2
        """})
    procs = [start_daemon(db, jobs, tmp_path / f"d{i}.log") for i in range(2)]
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
        codes = stop_all(procs)
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
def test_replace_stops_the_running_run_and_starts_the_new_slot(db: TestDb,
                                                                 tmp_path: Path) -> None:
    """A slot every 4 s, a run that would take 60 s, two daemons: at the
    next slot the run is stopped through the kill request (its record says
    it was replaced, and by which slot) and the new slot's run starts."""
    jobs = jobs_file(tmp_path / "jobs.yaml", {"r": """\
        cron: "*/4 * * * * *"
        overlap: replace
        command: sleep 60
        """})
    procs = [start_daemon(db, jobs, tmp_path / f"d{i}.log") for i in range(2)]
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
        codes = stop_all(procs)
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
