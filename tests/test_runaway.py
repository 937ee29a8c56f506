"""Runaway commands under a real `dblockrun daemon` (issue 7): a 200 MB output
flood keeps the daemon's memory flat and stores exactly the last 64 KiB;
background children die with the run; a command ignoring SIGTERM is killed
after the grace; one that closes its output early does not hang anything.

The database plays no part here, so these run on SQLite only.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from harness import Fleet, Process, pid_alive
from helpers import TestDb, wait_for

from dblockrun.store import Store
from dblockrun.store import models as m

REPO = Path(__file__).resolve().parent.parent
TAIL = 64 * 1024
#: The daemon's kill grace after SIGTERM (DaemonOptions.kill_grace).
KILL_GRACE = 5.0
#: How much the daemon's RSS may grow while a command floods 200 MB through it.
RSS_GROWTH_LIMIT = 40 * 1024 * 1024

FLOOD_LINES = 200_000  # x 1000 bytes = 200 MB


def flood_line(i: int) -> bytes:
    return f"{i:09d} ".encode() + b"x" * 989 + b"\n"


def start_daemon(fleet: Fleet, jobs: Path, log: Path | None = None) -> Process:
    """A daemon with the harness's heartbeat and lease (a 2 s lease ran out
    under a 200 MB flood on a loaded CI) and a short grace, its stdout and
    stderr into ``log`` (none: /dev/null)."""
    return fleet.start(jobs, grace="1s",
                       log=log or Path(os.devnull), stdout_to_log=True, cwd=REPO)


def runs(db: TestDb, job: str) -> list[m.RunRecord]:
    with Store(db.url, db.prefix) as store:
        return [r for r in (store.run(x.id) for x in store.history(job, 100)) if r is not None]


def finished(db: TestDb, job: str) -> m.RunRecord | None:
    done = [r for r in runs(db, job) if r.result != m.RUNNING]
    return done[0] if done else None


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_output_flood_keeps_memory_flat(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    go = tmp_path / "go"
    script = tmp_path / "flood.py"
    script.write_text(
        "import os, sys, time\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.02)\n"
        "out = sys.stdout.buffer\n"
        f"for i in range({FLOOD_LINES}):\n"
        "    out.write(f'{i:09d} '.encode() + b'x' * 989 + b'\\n')\n")
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  flood: {{rate: 1h, lock-at-most: 5m, "
                    f"command: [python3, {str(script)!r}]}}\n")
    daemon = start_daemon(sqlite_fleet, jobs)  # its log (200 MB of it) goes to /dev/null
    wait_for(lambda: runs(sqlite_db, "flood") or None, 30, what="the flood run started")
    baseline = rss(daemon.pid)
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                samples.append(rss(daemon.pid))
            except (OSError, AssertionError):
                return
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    go.touch()
    run = wait_for(lambda: finished(sqlite_db, "flood"), 240, what="the flood run finished")
    took = time.monotonic() - started
    stop.set()
    sampler.join()
    peak = max(samples)
    print(f"\nflood: {FLOOD_LINES * 1000 / 1e6:.0f} MB in {took:.1f}s; daemon RSS "
          f"{baseline / 2**20:.1f} MiB before, peak {peak / 2**20:.1f} MiB "
          f"(+{(peak - baseline) / 2**20:.1f} MiB), {len(samples)} samples")
    assert run.result == m.OK, run
    assert len(samples) > 10
    assert peak - baseline < RSS_GROWTH_LIMIT, (baseline, peak)
    expected = b"".join(flood_line(i) for i in range(FLOOD_LINES - 70, FLOOD_LINES))[-TAIL:]
    assert run.output is not None
    assert run.output.encode() == expected


def test_background_children_die_with_the_run(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    quick, slow = tmp_path / "quick.pid", tmp_path / "slow.pid"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n"
        # Exits at once, leaving a child that holds the output pipe open.
        f"  quick: {{rate: 1h, command: 'sleep 300 & echo $! > {quick}; exit 0'}}\n"
        # Reaches lock-at-most with a background child.
        f"  slow: {{rate: 1h, lock-at-most: 1s, "
        f"command: 'sleep 300 & echo $! > {slow}; sleep 300'}}\n")
    start_daemon(sqlite_fleet, jobs, tmp_path / "d.log")
    run = wait_for(lambda: finished(sqlite_db, "quick"), 30, what="quick finished")
    assert run.result == m.OK and (run.duration or 0) < 5, run
    child = int(quick.read_text())
    wait_for(lambda: not pid_alive(child), 5, what="quick's background child gone")
    run = wait_for(lambda: finished(sqlite_db, "slow"), 30, what="slow stopped")
    assert run.result == m.TIMEOUT, run
    child = int(slow.read_text())
    wait_for(lambda: not pid_alive(child), 5, what="slow's background child gone")


def test_sigterm_ignored_is_killed_after_the_grace(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    pidfile = tmp_path / "pid"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  stubborn: {{rate: 1h, lock-at-most: 1s, command: "
                    f"'trap \"\" TERM; echo $$ > {pidfile}; while :; do sleep 0.1; done'}}\n")
    start_daemon(sqlite_fleet, jobs, tmp_path / "d.log")
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30))
    run = wait_for(lambda: finished(sqlite_db, "stubborn"), 30, what="stubborn stopped")
    assert run.result == m.TIMEOUT, run
    assert run.exit_code == 128 + signal.SIGKILL, run
    # lock-at-most, then SIGTERM (ignored), then SIGKILL after the grace.
    assert run.duration is not None
    assert 1.0 + KILL_GRACE - 0.5 <= run.duration <= 1.0 + KILL_GRACE + 3.0, run.duration
    assert not pid_alive(pid)


def test_closed_stdout_does_not_hang_the_daemon(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    done = tmp_path / "done"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n"
        f"  closer: {{rate: 1h, command: 'echo bye; exec >&- 2>&-; sleep 2; touch {done}'}}\n"
        "  forever: {rate: 1h, lock-at-most: 2s, command: 'exec >&- 2>&-; sleep 300'}\n"
        "  canary: {cron: '* * * * * *', command: 'true'}\n")
    start_daemon(sqlite_fleet, jobs, tmp_path / "d.log")
    run = wait_for(lambda: finished(sqlite_db, "closer"), 30, what="closer finished")
    assert run.result == m.OK and done.exists(), run
    assert run.duration is not None and run.duration >= 2.0
    assert run.output == "bye\n"
    run = wait_for(lambda: finished(sqlite_db, "forever"), 30, what="forever stopped")
    assert run.result == m.TIMEOUT, run
    # The daemon kept scheduling all along (a run a second; poll, the
    # command may have been stopped after only 2 of them).
    wait_for(lambda: len(runs(sqlite_db, "canary")) >= 3, 10, what="3 canary runs")


def test_long_lines_of_letters_do_not_stall_the_daemon(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    # 4 MB of one letter, no newline: cut into 64 KiB log lines. The log's password
    # scrubber once backtracked quadratically on such lines (~10 s of CPU each),
    # starving the heartbeat until the run was fenced.
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  letters: {rate: 1h, "
                    "command: \"head -c 4000000 /dev/zero | tr '\\\\0' x\"}\n")
    start_daemon(sqlite_fleet, jobs, tmp_path / "d.log")
    run = wait_for(lambda: finished(sqlite_db, "letters"), 60, what="letters finished")
    assert run.result == m.OK, run.result
    assert run.duration is not None and run.duration < 10, run.duration
    assert run.output == "x" * TAIL


def test_daemon_logs_and_stores_stdout_and_stderr_in_order(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    # The daemon reads both streams through one pipe: the order written is
    # the order logged and stored (exec alone keeps them apart).
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  both: {rate: 1h, "
                    "command: 'echo one; echo two >&2; echo three; echo four >&2'}\n")
    log = tmp_path / "d.log"
    start_daemon(sqlite_fleet, jobs, log)
    run = wait_for(lambda: finished(sqlite_db, "both"), 30, what="both finished")
    assert (run.result, run.output) == (m.OK, "one\ntwo\nthree\nfour\n"), run
    logged = [line.split("] ", 1)[1] for line in log.read_text().splitlines()
              if "[both] " in line]
    assert logged == ["one", "two", "three", "four"]
