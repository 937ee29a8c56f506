"""What a big fleet costs one PostgreSQL: N daemons, J jobs.

    python bench/fleet_scale.py [--configs 10x1000,30x1000,10x10000,100x100]
                                [--seconds 60] [--settle 10]

For each ``NxJ``: a fresh PostgreSQL database, N real `dblockrun daemon`
processes (distinct host ids) on one jobs file of J jobs, each due every
minute (6-field cron): job i at second i mod 60, and one job in ten at
second 0, so some are due together. Nine jobs in ten run ``true``; the
tenth appends its start record (bench/fleet.py ``RECORD``) for the start
latency (slot to the command's first instruction).

Measured over ``--seconds`` after the daemons are ready and ``--settle``
seconds more, scaled to one minute:

* statements: ``xact_commit + xact_rollback`` of the database
  (pg_stat_database; every statement is its own transaction in autocommit,
  and ``pg_stat_statements`` needs ``shared_preload_libraries``);
* database CPU: utime + stime of the PostgreSQL backends connected to this
  database (pg_stat_activity, /proc/PID/stat; the server's shared background
  processes are not counted);
* starts (runs with a token whose start falls in the window), p50/p99 start
  latency of the recording jobs, duplicates (more than one start of a job's
  slot, over the whole run: must be 0), and the daemons' CPU (with their
  spawn services and commands).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from common import Table
from fleet import (
    BASH,
    CLK_TCK,
    RECORD,
    Db,
    Fleet,
    code_version,
    fresh_database,
    load,
    pg_dsn,
    read_starts,
    slot_stats,
)


def jobs_file(folder: Path, jobs: int, record: Path) -> Path:
    path = folder / "jobs.yaml"
    lines = ["jobs:"]
    for i in range(jobs):
        second = 0 if i % 10 == 5 else i % 60
        command = f"'{RECORD.format(path=record)}'" if i % 10 == 0 else '"true"'
        lines += [f"  j{i}:", f'    cron: "{second} * * * * *"', f"    command: {command}"]
        if i % 10 == 0:
            lines.append(f"    shell: {BASH}")
    path.write_text("\n".join(lines) + "\n")
    return path


def backend_cpu(db: Db) -> dict[int, float]:
    """CPU seconds of each backend connected to the database."""
    with psycopg.connect(pg_dsn(db.name), autocommit=True) as conn:
        pids = [int(str(r[0])) for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (db.name,)).fetchall()]
    out: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def transactions(db: Db) -> int:
    with psycopg.connect(pg_dsn("test"), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                           "WHERE datname = %s", (db.name,)).fetchone()
    return int(str(row[0])) if row else 0


def query(db: Db, text: str, *params: object) -> int:
    with psycopg.connect(pg_dsn(db.name), autocommit=True) as conn:
        row = conn.execute(text, params).fetchone()
    return int(str(row[0])) if row and row[0] is not None else 0


@dataclass(frozen=True)
class Result:
    hosts: int
    jobs: int
    statements: float  # per minute
    db_cpu: float  # seconds per minute
    starts: float  # per minute
    p50: str
    p99: str
    duplicates: int
    daemon_cpu: float  # seconds per minute, all daemons


def measure(hosts: int, jobs: int, seconds: float, settle: float) -> Result:
    with tempfile.TemporaryDirectory(prefix="dblockrun-scale-") as tmp, \
            fresh_database("postgresql", tmp) as db:
        folder = Path(tmp)
        record = folder / "starts.txt"
        fleet = Fleet(db, jobs_file(folder, jobs, record), hosts)
        try:
            fleet.start(ready_timeout=120 + 3 * hosts)
            time.sleep(settle)
            fleet.check_alive()
            cpu0, db0, q0 = fleet.cpu(), backend_cpu(db), transactions(db)
            t0, w0 = time.monotonic(), time.time()
            time.sleep(seconds)
            cpu1, db1, q1 = fleet.cpu(), backend_cpu(db), transactions(db)
            t1, w1 = time.monotonic(), time.time()
            fleet.check_alive()
        finally:
            fleet.stop()
        scale = 60 / (t1 - t0)
        starts = query(db, "SELECT count(*) FROM dblockrun_runs WHERE token IS NOT NULL "
                           "AND started >= %s AND started < %s", w0, w1)
        duplicates = query(db, "SELECT count(*) - count(DISTINCT (job, slot)) FROM "
                               "dblockrun_runs WHERE token IS NOT NULL AND slot IS NOT NULL")
        recorded = [s for s in read_starts(record) if w0 <= s.slot < w1 - 5]
        expected = {(s.job, s.slot) for s in recorded}
        stats = slot_stats(recorded, expected)
        return Result(
            hosts, jobs, (q1 - q0) * scale,
            sum(c - db0.get(pid, 0.0) for pid, c in db1.items()) * scale,
            starts * scale, stats.ms(0.5), stats.ms(0.99), duplicates,
            (sum(cpu1) - sum(cpu0)) * scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="10x1000,30x1000,10x10000,100x100",
                    help="comma-separated HOSTSxJOBS")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=10.0)
    args = ap.parse_args()
    table = Table(["hosts", "jobs", "stmts/min", "stmts/s", "DB CPU s/min", "starts/min",
                   "p50 ms", "p99 ms", "dups", "daemon CPU s/min"])
    for config in args.configs.split(","):
        n, j = (int(x) for x in config.lower().split("x"))
        try:
            r = measure(n, j, args.seconds, args.settle)
        except SystemExit as exc:  # a fleet that did not start: say so, go on
            print(f"{config}: not measured: {exc}", flush=True)
            continue
        row = [r.hosts, r.jobs, f"{r.statements:.0f}", f"{r.statements / 60:.1f}",
               f"{r.db_cpu:.2f}", f"{r.starts:.0f}", r.p50, r.p99, r.duplicates,
               f"{r.daemon_cpu:.1f}"]
        table.add(row)
        print(f"{config}: " + " ".join(str(x) for x in row), flush=True)
    print(f"fleet scale on one PostgreSQL ({code_version()}; {load()}; {args.seconds:g} s "
          f"per configuration after start-up; default heartbeat 10 s)")
    table.print()
    if os.cpu_count() and os.cpu_count() == 2:
        print("2 cores shared by the daemons, their commands and PostgreSQL")


if __name__ == "__main__":
    main()
