"""Several real `dblockrun daemon` processes on one database."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from harness import Fleet
from helpers import TestDb, wait_for

from dblockrun.store import Store

RUN_SECONDS = 16
#: Every line of an outage (dblockrun/store/outage.py) starts with one of these.
OUTAGE = re.compile(r"database (unreachable|refused|is read-only|deadlock|schema|error) \(")

JOB = """\
jobs:
  tick:
    cron: "* * * * * *"
    lock-at-most: 10s
    env:
      LOG: {log}
    command: |
      line="$DBLOCKRUN_SLOT $DBLOCKRUN_FENCING_TOKEN $DBLOCKRUN_HOST_ID"
      echo "start $line $(date +%s.%N)" >> "$LOG"
      sleep 0.3
      echo "end $line $(date +%s.%N)" >> "$LOG"
"""


@pytest.mark.slow
@pytest.mark.pgbouncer
def test_three_daemons_run_each_slot_exactly_once(db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """Also through PgBouncer: behind a transaction pooler, three daemons
    sharing its server connections would trip over psycopg's prepared
    statements (``prepared statement "_pg3_0" already exists``) unless the
    URL's ``?pooler=transaction`` turns them off."""
    out = tmp_path / "runs.log"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOB.format(log=out))
    procs = fleet.start_n(3, jobs)
    try:
        store = Store(db.url, db.prefix)
        wait_for(lambda: len(store.hosts(seen_within=30)) == 3, 30, what="3 daemons registered")
        begin = time.monotonic()
        wait_for(lambda: time.monotonic() - begin >= RUN_SECONDS or any(
            not p.alive() for p in procs), RUN_SECONDS + 5, interval=0.5,
            what="the run period")
        assert all(p.alive() for p in procs), "a daemon died"
    finally:
        codes = fleet.stop()
    logs = [d.text() for d in procs]
    assert codes == [0, 0, 0], logs
    for log in logs:
        assert "prepared statement" not in log and not OUTAGE.search(log), log
    starts: dict[str, tuple[float, str, int]] = {}
    ends: dict[str, float] = {}
    for line in out.read_text().splitlines():
        kind, slot, token, host, ts = line.split()
        if kind == "start":
            assert slot not in starts, f"slot {slot} started twice"
            starts[slot] = (float(ts), host, int(token))
        else:
            ends[slot] = float(ts)
    assert len(starts) >= RUN_SECONDS - 2
    # Every second between the first and last slot ran, each exactly once.
    epochs = sorted(
        int(time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone) for s in starts
    )
    assert epochs == list(range(epochs[0], epochs[-1] + 1)), "a slot was skipped"
    # No two runs overlapped.
    intervals = sorted((starts[s][0], ends[s]) for s in starts if s in ends)
    for (_s1, e1), (s2, _e2) in zip(intervals, intervals[1:], strict=False):
        assert s2 >= e1, "two runs overlapped"
    tokens = [t for _ts, _h, t in starts.values()]
    assert len(set(tokens)) == len(tokens)
    # The database agrees: one ok run per slot.
    runs = store.history("tick", 1000)
    assert {r.result for r in runs} == {"ok"}
    assert len({r.slot for r in runs}) == len(runs)
    store.close()


MANY = 48


@pytest.mark.slow
def test_many_jobs_due_at_once_run_once_each_spread_over_daemons(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """Jobs due on the same instant are claimed in batches, each host its
    share first: every job has exactly one record per slot (run, or skipped
    while its run of the previous slot was still going on a busy machine),
    no job starts twice in a slot, and every daemon gets work."""
    out = tmp_path / "runs.log"
    jobs = tmp_path / "jobs.yaml"
    lines = ["jobs:"]
    for i in range(MANY):
        lines += [f"  job{i:02d}:", '    cron: "*/3 * * * * *"', "    env:", f"      LOG: {out}",
                  "    command: echo \"$DBLOCKRUN_JOB $DBLOCKRUN_SLOT $DBLOCKRUN_HOST_ID\""
                  " >> \"$LOG\""]
    jobs.write_text("\n".join(lines) + "\n")
    fleet.start_n(3, jobs)
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: len(store.hosts(seen_within=30)) == 3, 30, what="3 daemons registered")
        first = store.db_now() + 1  # slots after all three daemons are up

        def two_slots_accounted() -> list[float] | None:
            per_slot: dict[float, set[str]] = {}
            for run in store.history(limit=10_000):
                if run.slot is not None and run.slot >= first and run.result in ("ok", "skipped"):
                    per_slot.setdefault(run.slot, set()).add(run.job)
            done = sorted(s for s, names in per_slot.items() if len(names) == MANY)
            return done[:2] if len(done) >= 2 else None

        slots = wait_for(two_slots_accounted, 60, interval=0.5, what="two slots of every job")
    finally:
        codes = fleet.stop()
    assert codes == [0, 0, 0]
    records: dict[tuple[str, float], int] = {}
    for run in store.history(limit=10_000):
        if run.slot in slots:
            records[run.job, run.slot] = records.get((run.job, run.slot), 0) + 1
    assert len(records) == 2 * MANY and set(records.values()) == {1}
    starts: dict[tuple[str, str], int] = {}
    hosts: set[str] = set()
    for line in out.read_text().splitlines():
        job, slot, host = line.split()
        starts[job, slot] = starts.get((job, slot), 0) + 1
        hosts.add(host)
    assert max(starts.values()) == 1, "a job started twice in one slot"
    assert len(hosts) == 3, f"not every daemon got work: {hosts}"
    store.close()
