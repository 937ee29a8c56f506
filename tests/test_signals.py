"""Stopping the daemon by signal: a second SIGINT ends the grace; and a stop
request may arrive at any instant of the daemon's main loop.


CPython runs a signal handler on the main thread at the next function entry
(or backward jump) after the signal arrives, whatever that thread holds. If the
handler took a lock the main loop can be holding at that instant (as
`threading.Event.set()` takes the lock that the loop's own `Event.wait()` holds
around its bookkeeping), the daemon waits for itself forever and SIGTERM never
stops it; systemd then SIGKILLs it and its leases stay taken until they expire.

A real signal lands in that window only rarely. So the daemon runs in a child
process under a trace function that does what the SIGTERM handler does,
`Daemon.request_stop()`, at every function entry of the main thread once the
loop has gone round once: every instant a real handler could run at.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import Fleet, pid_alive
from helpers import REPO, TestDb, clean_env, wait_for

from dblockrun.store import Store
from dblockrun.store import models as m

#: Stopping with nothing running takes well under a second; past this, it hung.
STOP_DEADLINE = 30

CHILD = """\
import logging, sys, threading
from dblockrun.config.load import load_jobs
from dblockrun.daemon.loop import Daemon, DaemonOptions
from dblockrun.store import Store

url, prefix, jobs_path = sys.argv[1:4]
logging.basicConfig(level=logging.INFO)
jobs = load_jobs(jobs_path)
daemon = Daemon(jobs, Store(url, prefix),
                DaemonOptions(heartbeat=1.0, lease=3.0, grace=5.0), stop=threading.Event())
armed = False
requests = 0

def at_every_call(frame, event, arg):
    global armed, requests
    if event != "call":
        return None
    if frame.f_code.co_name == "finished":  # Firing.finished: the loop's last step
        armed = True  # the loop has fired what was due and is heading for its sleep
    if armed:
        requests += 1
        daemon.request_stop()  # what the SIGTERM handler runs
    return None

sys.settrace(at_every_call)
daemon.run()
sys.settrace(None)
print("stopped after", requests, "stop requests")
"""

JOBS = """\
jobs:
  tick:
    rate: 100ms
    command: "true"
"""


def test_stop_request_at_any_instant_of_the_main_loop_stops_the_daemon(
    db: TestDb, tmp_path: Path
) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    try:
        res = subprocess.run(
            [sys.executable, "-c", CHILD, db.url, db.prefix, str(jobs)],
            capture_output=True, text=True, timeout=STOP_DEADLINE,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the daemon did not stop within {STOP_DEADLINE}s of the stop request "
                    f"(it deadlocked in the handler):\n{exc.stderr!r}")
    assert res.returncode == 0, res.stderr
    assert "stopped after" in res.stdout, res.stdout + res.stderr
    assert "stopped" in res.stderr, res.stderr


def test_second_sigint_stops_the_running_commands_now(
    db: TestDb, store: Store, tmp_path: Path, fleet: Fleet
) -> None:
    # Ctrl-C twice, as at a foreground program: the first lets the run
    # finish within --grace (a minute), the second stops it at once.
    pidfile = tmp_path / "pid"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  long:\n    rate: 1h\n"
                    f"    command: 'echo $$ > {pidfile}; exec sleep 300'\n")
    daemon = fleet.start(jobs, grace="60s", name="daemon", cwd=REPO, env=clean_env())
    log = daemon.log
    try:
        pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30,
                           what="the command started"))
        daemon.send(signal.SIGINT)
        wait_for(lambda: "stopping: waiting up to 60s for 1 running job" in log.read_text(),
                 30, what="the daemon stopping")
        assert pid_alive(pid), "the first SIGINT must leave the run its grace"
        sent = time.monotonic()
        daemon.send(signal.SIGINT)
        assert daemon.exited(20) == 0, log.read_text()
        took = time.monotonic() - sent
    finally:
        daemon.kill()
    assert took < 5, f"{took:.1f}s to stop after the second SIGINT"
    assert not pid_alive(pid)
    (run,) = store.history("long")
    assert (run.result, run.exit_code) == (m.KILLED, 128 + signal.SIGTERM), run
    assert "interrupted again: stopping 1 running job(s) now" in log.read_text()
