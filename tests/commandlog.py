"""Jobs whose commands write a line to a log of the test's when they start
(and, stopped, when they end): ``start|end TOKEN PID EPOCH``, read back to
see which run ran when, on a Fleet of real daemons (tests/harness.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness import Fleet, Process

from dblockrun.store.status import report

#: A job due every second whose run lasts 30 s unless stopped; one at a time.
LONG_JOB = """\
jobs:
  long:
    cron: "* * * * * *"
    lock-at-most: 60s
    env:
      LOG: {log}
    command: |
      echo "start $DBLOCKRUN_FENCING_TOKEN $$ $(date +%s.%N)" >> "$LOG"
      trap 'echo "end $DBLOCKRUN_FENCING_TOKEN $$ $(date +%s.%N)" >> "$LOG"; exit 143' TERM
      sleep 30 & wait
"""


@dataclass
class Line:
    kind: str
    token: int
    pid: int
    at: float


def log_of(fleet: Fleet) -> Path:
    """Where the fleet's commands write their lines."""
    return fleet.workdir / "runs.log"


def start_logging(fleet: Fleet, n: int, jobs: str = LONG_JOB, **options: str) -> list[Process]:
    """``n`` daemons on ``jobs`` (its ``{log}``: :func:`log_of`), with
    ``--grace 2s`` and ``options`` (``lease``, ``url``...) for :meth:`Fleet.start`."""
    path = fleet.jobs_file(jobs.format(log=log_of(fleet)))
    return fleet.start_n(n, path, **{"grace": "2s", **options})


def read_lines(path: Path) -> list[Line]:
    if not path.exists():
        return []
    out = []
    for raw in path.read_text().splitlines():
        kind, token, pid, at = raw.split()
        out.append(Line(kind, int(token), int(pid), float(at)))
    return out


def starts(fleet: Fleet) -> list[Line]:
    return [ln for ln in read_lines(log_of(fleet)) if ln.kind == "start"]


def running(fleet: Fleet, job: str = "long") -> tuple[str, int] | None:
    """The holder and fencing token of the job's run, while one runs."""
    rows = report(fleet.store, [job]).jobs
    if not rows:
        return None
    status = rows[0]
    if status.running is None or status.lock.holder is None:
        return None
    return status.lock.holder, status.lock.token
