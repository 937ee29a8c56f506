"""lock-at-most ends a run on time, in the daemon and in exec (issue 11.4).

A daemon job with ``lock-at-most: 8s`` ended at 9.0-9.1 s every time. The
command got its SIGTERM on time; the run then waited a second for the
command's orphans: a shell command leaves the zombies of its children to
whoever inherits them (init, a subreaper, a daemon running as PID 1), and
the runner counted a group holding only zombies as still running until its
1 s grace for background children ran out. (And exec's first run on a new
database ended 0.3 s early: lock-at-most counted from before its claim,
which made the schema.)

Here dblockrun runs as a child subreaper, as it does as PID 1 of a
container (a Kubernetes CronJob running ``dblockrun exec``, a ``dblockrun
daemon`` image without an init): the orphans come to it and nobody reaps
them, the worst case, and a deterministic one.

What is measured: from the command's own start (it writes ``date
+%s.%N`` first) to the run's end as recorded (``finished`` in the runs table,
written by the database clock; the servers run on this host, so both read
the same clock). It must be within 100 ms of the limit, plus MARGIN.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from harness import Fleet, as_subreaper
from helpers import REPO, TestDb, clean_env, dblockrun_cmd, wait_for

from dblockrun.store import Store
from dblockrun.store import models as m

LIMIT = 2.0
#: The contract: the run ends within this of lock-at-most.
TOLERANCE = 0.1
#: Measurement margin on top, for what lies between the stop and the
#: ``finished`` stamp: the command's end seen (a pidfd), its group checked,
#: the output reader ended, then the UPDATE that takes the stamp; and the
#: ``date`` that stamps the start. Measured -6 to +4 ms from the start stamp
#: (7-10 ms over the claim's) on the shared 2-core VM; 100 ms leaves room
#: for a loaded machine, and the old overshoot (1.0 s) still fails by 800 ms.
MARGIN = 0.1
#: The command starts after the claim (the deadline's origin): fork of the
#: guard, the shell and ``date``. Stopping earlier than this before the
#: limit, measured from the command's start, would be a bug too.
START_LATENCY = 0.3

def command(start: Path) -> str:
    # `true &` ends at once, and the shell, become `sleep`, never reaps it:
    # when sleep is stopped, that zombie goes to the subreaper. (The common
    # `sleep 30; true` leaves one too, unless the shell reaps sleep before
    # its own SIGTERM lands: a race, so not the test's case.)
    return f"date +%s.%N > {start}; true & exec sleep 30"


def check_stop(run: m.RunRecord, start: Path) -> float:
    """The run's end measured from the command's start, checked; returned."""
    assert run.finished is not None, run
    took = run.finished - float(start.read_text())
    print(f"\nlock-at-most {LIMIT:g}s: run ended {took:.3f}s after the command started "
          f"({took - LIMIT:+.3f}s); recorded duration {run.duration:.3f}s")
    assert LIMIT - START_LATENCY <= took <= LIMIT + TOLERANCE + MARGIN, took
    assert run.duration is not None
    # The recorded duration is the command's own: lock-at-most counts from
    # the claim's answer, a few ms before the command started.
    assert LIMIT - START_LATENCY <= run.duration <= LIMIT + TOLERANCE + MARGIN, run.duration
    return took


def ended(store: Store, job: str) -> m.RunRecord | None:
    done = [r for r in store.history(job) if r.result != m.RUNNING]
    return done[0] if done else None


def test_daemon_ends_a_run_at_lock_at_most(
        db: TestDb, store: Store, tmp_path: Path, fleet: Fleet) -> None:
    start = tmp_path / "start"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  slow:\n    rate: 1h\n    lock-at-most: {LIMIT:g}s\n"
                    f"    command: {command(start)!r}\n")
    daemon = fleet.start(jobs, grace=None, program=as_subreaper(dblockrun_cmd()), name="daemon",
                         cwd=REPO, env=clean_env())
    try:
        run = wait_for(lambda: ended(store, "slow"), 30, interval=0.02, what="the run ended")
    finally:
        daemon.stop()
    assert run.result == m.TIMEOUT, (run, daemon.text())
    assert run.exit_code == 128 + signal.SIGTERM, run
    check_stop(run, start)


def test_exec_ends_a_run_at_lock_at_most(db: TestDb, store: Store, tmp_path: Path) -> None:
    start = tmp_path / "start"
    proc = subprocess.run(
        as_subreaper([*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "exec",
                      "--lock-at-most", f"{LIMIT:g}s", "--name", "slow", "--",
                      "sh", "-c", command(start)]),
        capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    (run,) = store.history("slow")
    assert run.result == m.TIMEOUT, run
    check_stop(run, start)
