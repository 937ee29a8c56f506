"""A lost run's record says why it ended (issue 36 item 3): after ``kill -9``
of its holder, ``history --output RUN`` (and the web Run page, which reads
the same record) ended with the command's last line and nothing more;
killed runs end with ``killed by ...``. The record now ends with a line
naming the holder, its last renewal and the host that recorded it lost.
Real daemons and ``exec`` processes, on every backend."""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from helpers import REPO, TestDb, clean_env, dblockrun_cmd, invoke, wait_for

from dblockrun.store import Store
from dblockrun.store import models as m

JOBS = """\
jobs:
  long:
    cron: "* * * * * *"
    command: echo "working on $(hostname)"; exec sleep 60
"""

#: The line a lost run's output ends with; groups: holder, last renewal, recorder.
LOST_LINE = re.compile(r"lost: its holder (\S+) last renewed its lease at (\S+Z), then stopped "
                       r"\(its host or daemon died, froze or lost the database\); recorded lost "
                       r"by (\S+)\n")


def cli(db: TestDb, *args: str) -> subprocess.CompletedProcess[str]:
    """A real process (exec: its fast start, its child)."""
    return subprocess.run([*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, *args],
                          capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=60)


@pytest.fixture
def daemons(db: TestDb, tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    procs = [subprocess.Popen(
        [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "daemon", str(jobs),
         "--heartbeat", "1s", "--lease", "3s", "--grace", "0s"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / f"daemon{i}.log").open("wb"),
        env=clean_env(), cwd=REPO) for i in range(2)]
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ends_with_why(output: str, holder: str, recorder: str, finished: float) -> None:
    line = LOST_LINE.search(output)
    assert line is not None and output.endswith(line[0]), output
    assert (line[1], line[3]) == (holder, recorder), output
    at = datetime.fromisoformat(line[2].replace("Z", "+00:00")).timestamp()
    assert at == pytest.approx(finished, abs=0.0011)


@pytest.mark.slow
def test_a_run_lost_with_its_daemon_says_who_recorded_it_and_the_last_renewal(
        db: TestDb, daemons: list[subprocess.Popen[bytes]]) -> None:
    with Store(db.url, db.prefix) as store:
        (run,) = wait_for(lambda: store.control.running("long") or None, 30,
                          what="a run of long")
        hosts = wait_for(lambda: h if len(h := store.live_hosts()) == 2 else None, 30,
                         what="both daemons' host rows")
        # Its live output written (with a renewal) before its holder dies.
        wait_for(lambda: (r := store.run(run.id)) and (r.output or "").startswith("working"),
                 30, what="the run's live output")
        holder = next(p for p in daemons if f":{p.pid}:" in run.host)
        holder.kill()  # kill -9: no release, no record
        holder.wait(timeout=10)
        survivor = next(h.id for h in hosts if h.id != run.host)
        # Recorded, not only read as lost (a run whose lease ran out reads lost at once).
        lost = wait_for(lambda: r if (r := store.run(run.id)) and r.finished is not None
                        else None, 30, what="the run recorded lost")
    assert lost.result == m.LOST and lost.finished is not None
    shown = invoke("--db", db.url, "--table-prefix", db.prefix, "history", "--output",
                   str(run.id))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("working on ")
    _ends_with_why(shown.stdout, run.host, survivor, lost.finished)


@pytest.mark.slow
def test_an_exec_run_lost_is_recorded_by_the_next_exec_with_why(db: TestDb,
                                                                tmp_path: Path) -> None:
    started, said = tmp_path / "started", tmp_path / "first.err"
    with open(said, "wb") as err:
        first = subprocess.Popen(
            [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "exec", "--name",
             "k9", "--lease", "6s", "--", "sh", "-c", f"touch {started}; exec sleep 30"],
            stdout=subprocess.DEVNULL, stderr=err, env=clean_env(), cwd=REPO)
    try:
        wait_for(lambda: started.exists() or first.poll() is not None, 60,
                 what="the first command")
        assert started.exists(), f"exec ended {first.returncode}: {said.read_text()}"
        first.kill()
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    with Store(db.url, db.prefix) as store:
        wait_for(lambda: cli(db, "exec", "--name", "k9", "--", "true").returncode == 0
                 and len(store.history("k9")) == 2, 30, interval=0.3, what="a second run")
        second, dead = store.history("k9")
        full = store.run(dead.id)
    assert full is not None and full.result == m.LOST and full.finished is not None
    assert full.output is not None
    _ends_with_why(full.output, dead.host, second.host, full.finished)
