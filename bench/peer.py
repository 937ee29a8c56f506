"""Peer comparison: procrastinate's periodic tasks and dblockrun, same PostgreSQL, same workloads.

    python bench/peer.py [--seconds 30] [--tasks 2000] [--deadline 60] [--procs 4]
                         [--workloads second,burst] [--concurrency 1]

procrastinate (https://procrastinate.readthedocs.io) is a PostgreSQL task
queue with periodic tasks; install it with ``pip install -e '.[bench]'``
(without it this prints one line and exits 0). Every phase gets a fresh
database (dropped at the end) and a counting proxy (bench/wirecount.py)
between the processes and PostgreSQL, so that statements are counted the
same way for both: simple-query ('Q') and Execute ('E') messages.

Workloads, each with ``--procs`` processes on this machine:

* ``second``: one job due every second, for a ``--seconds`` window.
  procrastinate: one periodic task ``cron="* * * * * *"`` and 4 worker
  processes (``procrastinate`` cron puts seconds LAST; every field ``*``
  reads the same either way). dblockrun: one job ``cron: "* * * * * *"``
  and 4 daemons.
* ``burst``: ``--tasks`` schedules due on one instant T, about 15-25 s
  after the phase starts; one slot is observed, until every task started
  or ``--deadline`` seconds after T. procrastinate: ``tick`` registered
  ``--tasks`` times with ``periodic_id`` p0..pN and cron ``M * * * * S``
  (hourly at T's minute and second: a per-minute cron would make every
  worker defer the previous minute's 2,000 jobs at its start, the
  catch-up of anything under 10 minutes old, which then overlaps T).
  dblockrun: ``--tasks`` jobs ``cron: "S M * * * *"``. The work of the
  slot is the same as for tasks due every minute.

procrastinate's task is an async function whose first instruction reads
``time.time()`` and appends a line (in the worker process: no new
process); dblockrun's command is ``bash -c`` whose printf builtin appends
``$EPOCHREALTIME`` (a new guard and bash process per run). Latency = that
time - the scheduled instant (procrastinate passes it as ``timestamp``;
dblockrun as ``DBLOCKRUN_SLOT``). Statements per slot: ``second``: the
window's statements / its slots (everything, idle polling and heartbeats
included); ``burst``: statements from T - 1 s to 1 s after the last start
(or the deadline). CPU: the processes' utime + stime (with reaped
children) over the same windows.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
from common import Table
from fleet import (
    BASH,
    CLOCK_NOTE,
    RECORD,
    Db,
    Fleet,
    code_version,
    cpu_seconds,
    fresh_database,
    load,
    pg_dsn,
    read_starts,
    sleep_until,
    slot_stats,
)
from wirecount import PgCountingProxy

HERE = Path(__file__).resolve().parent
TAIL = 3.0

HOW = """\
how each works (from their code, 3.x and this tree):
- procrastinate: every worker runs a periodic deferrer that wakes 0.5 s after each due
  instant (by its own clock) and calls procrastinate_defer_periodic_job_v2 once per due
  schedule, in BEGIN/COMMIT: with 4 workers, 4 calls per schedule and instant, one of which
  inserts the unique (task, periodic_id, timestamp) row and the job; NOTIFY wakes the
  workers, which fetch it (FOR UPDATE SKIP LOCKED) and run the task in their own process.
  The defers table keeps only the newest instant per schedule, so a worker whose deferrer
  runs more than one period late (busy, or its clock behind) can defer an older instant
  again: a duplicate is possible.
- dblockrun: every daemon fires each slot by the database clock and claims it with a
  conditional UPDATE of the job's row, which records the slot: one start per slot whatever
  the clocks; the winner starts the command (a new process) and renews its lease."""


@dataclass(frozen=True)
class Phase:
    """One workload's schedule: the expected (job, slot) pairs."""

    workload: str
    tasks: int
    slots: list[float]
    procrastinate_cron: str
    dblockrun_cron: str

    def expected(self) -> set[tuple[str, float]]:
        return {(f"p-{i}", s) for i in range(self.tasks) for s in self.slots}


class Procs:
    """Something running 4 processes: start, ready, cpu, stop."""

    def __init__(self, start: Callable[[], None], pids: Callable[[], list[int]],
                 alive: Callable[[], None], stop: Callable[[], None]) -> None:
        self.start, self.pids, self.alive, self.stop = start, pids, alive, stop

    def cpu(self) -> float:
        return sum(cpu_seconds(p) for p in self.pids())


def procrastinate_procs(db: Db, proxy: PgCountingProxy, phase: Phase, n: int, work: Path,
                        concurrency: int) -> Procs:
    from procrastinate.schema import SchemaManager

    with psycopg.connect(pg_dsn(db.name), autocommit=True) as conn:
        conn.execute(SchemaManager.get_schema())
    conninfo = f"host=127.0.0.1 port={proxy.port} user=postgres dbname={db.name}"
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        for i in range(n):
            log = open(work / f"worker-{i}.log", "wb")
            procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "peer_app.py"), conninfo, str(phase.tasks),
                 phase.procrastinate_cron, str(work / "starts.log"), f"w{i}", str(concurrency)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            log.close()
        deadline = time.monotonic() + 60
        while db.count("procrastinate_workers") < n:
            alive()
            if time.monotonic() > deadline:
                raise SystemExit(f"{n} procrastinate workers not registered after 60 s")
            time.sleep(0.2)

    def alive() -> None:
        for i, p in enumerate(procs):
            if p.poll() is not None:
                log = (work / f"worker-{i}.log").read_text(errors="replace")
                raise SystemExit(f"procrastinate worker {i} exited with {p.returncode}:\n"
                                 f"{log[-3000:]}")

    def stop() -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    return Procs(start, lambda: [p.pid for p in procs], alive, stop)


def dblockrun_procs(db: Db, proxy: PgCountingProxy, phase: Phase, n: int, work: Path) -> Procs:
    jobs = work / "jobs.yaml"
    lines = ["jobs:"]
    for i in range(phase.tasks):
        lines += [f"  p-{i}:", f'    cron: "{phase.dblockrun_cron}"', f"    shell: {BASH}",
                  f"    command: '{RECORD.format(path=work / 'starts.log')}'"]
    jobs.write_text("\n".join(lines) + "\n")
    fleet = Fleet(db, jobs, n, url=f"postgresql://postgres@127.0.0.1:{proxy.port}/{db.name}")
    return Procs(lambda: fleet.start(ready_timeout=120), lambda: [p.pid for p in fleet.procs],
                 fleet.check_alive, fleet.stop)


def burst_phase(tasks: int, lead: float) -> Phase:
    t = math.ceil(time.time() + lead)
    m, s = time.gmtime(t).tm_min, time.gmtime(t).tm_sec
    return Phase("burst", tasks, [float(t)], f"{m} * * * * {s}", f"{s} {m} * * * *")


def run_phase(system: str, workload: str, args: argparse.Namespace, folder: Path,
              table: Table) -> None:
    work = folder / f"{system}-{workload}"
    work.mkdir()
    record = work / "starts.log"
    with fresh_database("postgresql", str(folder)) as db, PgCountingProxy(5432) as proxy:
        if workload == "second":
            phase = Phase("second", 1, [], "* * * * * *", "* * * * * *")
        else:
            # Start-up: procrastinate 2-5 s; dblockrun with 2,000 jobs 5-10 s.
            phase = burst_phase(args.tasks, 12.0 if system == "procrastinate" else 20.0)
        procs = (procrastinate_procs(db, proxy, phase, args.procs, work, args.concurrency)
                 if system == "procrastinate"
                 else dblockrun_procs(db, proxy, phase, args.procs, work))
        try:
            procs.start()
            if workload == "second":
                w0 = math.ceil(time.time() + 2.0)
                slots = [float(s) for s in range(w0, w0 + args.seconds)]
                phase = Phase("second", 1, slots, phase.procrastinate_cron, phase.dblockrun_cron)
                sleep_until(w0)
                q0, c0, t0 = proxy.statements(), procs.cpu(), time.monotonic()
                sleep_until(w0 + args.seconds)
                q1, c1, t1 = proxy.statements(), procs.cpu(), time.monotonic()
                sleep_until(w0 + args.seconds + TAIL)
            else:
                slot = phase.slots[0]
                if time.time() > slot - 1.0:
                    raise SystemExit(f"peer: {system} was not ready 1 s before the burst's slot"
                                     " (start-up too slow on this machine)")
                sleep_until(slot - 1.0)
                q0, c0, t0 = proxy.statements(), procs.cpu(), time.monotonic()
                while (time.time() < slot + args.deadline
                       and len({s.job for s in read_starts(record) if s.slot == slot})
                       < phase.tasks):
                    procs.alive()
                    time.sleep(0.25)
                time.sleep(1.0)
                q1, c1, t1 = proxy.statements(), procs.cpu(), time.monotonic()
            procs.alive()
        finally:
            procs.stop()
        if proxy.encrypted():
            raise SystemExit("wirecount: encrypted connections could not be counted")
    limit = TAIL if workload == "second" else args.deadline
    starts = [s for s in read_starts(record) if s.t <= s.slot + limit]
    st = slot_stats(starts, phase.expected())
    last = max(st.latencies) if st.latencies else float("nan")
    spread = "/".join(str(v) for v in sorted(st.per_host.values(), reverse=True))
    table.add([system, workload, args.procs, len(phase.slots), st.expected, st.started,
               st.missing, st.duplicates, st.ms(0.5), st.ms(0.99), f"{last:.2f}", q1 - q0,
               f"{(q1 - q0) / len(phase.slots):.1f}", f"{t1 - t0:.1f}", f"{c1 - c0:.1f}",
               spread or "-"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=30, help="window of the per-second workload")
    ap.add_argument("--tasks", type=int, default=2000, help="schedules due at once (burst)")
    ap.add_argument("--deadline", type=float, default=60.0,
                    help="seconds after the burst's slot to wait for its starts")
    ap.add_argument("--procs", type=int, default=4, help="workers / daemons")
    ap.add_argument("--concurrency", type=int, default=1,
                    help="procrastinate worker concurrency (its default: 1)")
    ap.add_argument("--workloads", default="second,burst")
    args = ap.parse_args()
    if importlib.util.find_spec("procrastinate") is None:
        print("peer (procrastinate comparison): procrastinate is not installed; "
              "skipped: pip install -e .[bench]")
        return
    from importlib.metadata import version

    table = Table(["system", "workload", "procs", "slots", "expected", "started", "missed",
                   "duplicates", "p50 ms", "p99 ms", "max s", "statements", "per slot",
                   "window s", "CPU s", "starts per process"])
    with tempfile.TemporaryDirectory(prefix="dblockrun-bench-") as tmp:
        for workload in args.workloads.split(","):
            for system in ("procrastinate", "dblockrun"):
                run_phase(system, workload, args, Path(tmp), table)
    print(f"peer: procrastinate {version('procrastinate')} (periodic tasks, {args.procs} "
          f"workers, concurrency {args.concurrency}) vs dblockrun ({args.procs} daemons), "
          f"PostgreSQL; second: 1 job/s for {args.seconds} s; burst: {args.tasks} due at "
          f"once, waited up to {args.deadline:g} s; {load()}; {code_version()}")
    print(f"burst: procrastinate runs one task registered {args.tasks} times (periodic_id "
          "p0..), dblockrun that many jobs; both on an hourly cron at the slot's minute and "
          "second, so that procrastinate's start-up catch-up (each worker defers any "
          "occurrence under 10 min old) does not run into the slot; one slot observed")
    print(CLOCK_NOTE + " (procrastinate: time.time() in the task; dblockrun: bash's"
          " $EPOCHREALTIME)")
    print("statements: 'Q' + 'E' messages counted by a proxy both systems connect through"
          " (it adds a hop to every round trip, for both)")
    table.print()
    print(HOW, end="\n\n", flush=True)


if __name__ == "__main__":
    main()
