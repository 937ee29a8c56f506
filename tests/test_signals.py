"""A stop request may arrive at any instant of the daemon's main loop.

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

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TestDb

#: Stopping with nothing running takes well under a second; past this, it hung.
STOP_DEADLINE = 30

CHILD = """\
import logging, sys, threading
from dblockrun.config import load_jobs
from dblockrun.daemon import Daemon, DaemonOptions
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
    if frame.f_code.co_name == "_replan_finished":
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
