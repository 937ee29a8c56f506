"""Several real `dblockrun daemon` processes on one database."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import TestDb, dblockrun_cmd, wait_for

from dblockrun.store import Store

RUN_SECONDS = 16

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


def start_daemon(db: TestDb, jobs: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "daemon", str(jobs),
           "--heartbeat", "1s", "--lease", "3s", "--grace", "5s"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def stop_all(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    return [p.wait(timeout=30) for p in procs]


@pytest.mark.slow
def test_three_daemons_run_each_slot_exactly_once(db: TestDb, tmp_path: Path) -> None:
    out = tmp_path / "runs.log"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOB.format(log=out))
    procs = [start_daemon(db, jobs, tmp_path / f"daemon{i}.log") for i in range(3)]
    try:
        store = Store(db.url, db.prefix)
        wait_for(lambda: len(store.hosts(seen_within=30)) == 3, 30, what="3 daemons registered")
        begin = time.monotonic()
        wait_for(lambda: time.monotonic() - begin >= RUN_SECONDS or any(
            p.poll() is not None for p in procs), RUN_SECONDS + 5, interval=0.5,
            what="the run period")
        assert all(p.poll() is None for p in procs), "a daemon died"
    finally:
        codes = stop_all(procs)
    assert codes == [0, 0, 0]
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
