"""What a big fleet costs one PostgreSQL: N daemons, J jobs.

    python bench/fleet_scale.py [--configs 10x1000,30x1000,100x1000]
                                [--pooler transaction] [--every 1]
                                [--seconds 60] [--settle 10] [--ready-timeout S]

For each ``NxJ``: a fresh PostgreSQL database, N real `dblockrun daemon`
processes (distinct host ids) on one jobs file of J jobs. With ``--every
1`` each job is due every minute (6-field cron): job i at second i mod 60,
and one job in ten at second 0, so some are due together; with ``--every
E`` each job is due every E minutes, the jobs spread over those minutes
(job i in minute (i // 60) mod E), so a minute sees J/E starts: sparse
enough that the 2-core machine that runs the daemons, their commands and
the database is not what is measured. Nine jobs in ten run ``true``; the
tenth appends its start record (bench/fleet.py ``RECORD``) for the start
delay (slot to the command's first instruction).

``--pooler transaction`` (or ``session``) puts a PgBouncer in that pool
mode in front of the server (tests/pgbouncer.py, its default pool of 30
server connections; the daemons' URL says ``?pooler=``); the server's
``max_connections`` is left as it is.

Measured over ``--seconds`` after the daemons are ready and ``--settle``
seconds more, scaled to one minute:

* statements: ``xact_commit + xact_rollback`` of the database
  (pg_stat_database; every statement is its own transaction in autocommit,
  and ``pg_stat_statements`` needs ``shared_preload_libraries``);
* database CPU: utime + stime of the PostgreSQL backends connected to this
  database (pg_stat_activity, /proc/PID/stat; the server's shared background
  processes are not counted);
* server connections: the backends connected to the database at the end
  of the window (the most seen in samples every 5 s);
* starts (runs with a token whose start falls in the window), p50/p99/max
  start delay of the recording jobs, duplicates (more than one start of a
  job's slot, over the whole run: must be 0), the daemons' CPU (with their
  spawn services and commands) and their RSS (daemon + spawn service, the
  mean per host).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from common import Table, percentile
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from pgbouncer import Bouncer  # noqa: E402  (the tests' own PgBouncer)


def jobs_file(folder: Path, jobs: int, record: Path, every: int = 1) -> Path:
    path = folder / "jobs.yaml"
    lines = ["jobs:"]
    for i in range(jobs):
        second = 0 if i % 10 == 5 else i % 60
        minute = "*" if every == 1 else f"{(i // 60) % every}-59/{every}"
        command = f"'{RECORD.format(path=record)}'" if i % 10 == 0 else '"true"'
        lines += [f"  j{i}:", f'    cron: "{second} {minute} * * * *"', f"    command: {command}"]
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


def rss_mb(pid: int) -> float:
    """VmRSS of the process and of its live children (a daemon's spawn
    service), in MB."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        own = next((int(line.split()[1]) for line in
                    Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0.0
    return own / 1024 + sum(rss_mb(int(child)) for child in children[:1])


@contextlib.contextmanager
def pooler(mode: str | None, db: Db) -> Iterator[tuple[str, Bouncer | None]]:
    """The daemons' URL: the database's, or through a PgBouncer in ``mode``."""
    if mode is None:
        yield db.url, None
        return
    bouncer = Bouncer(mode, "127.0.0.1", 5432, "postgres")
    try:
        yield bouncer.url(db.url), bouncer
    finally:
        bouncer.stop()


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
    connections: int  # server connections to the database, the most seen
    starts: float  # per minute
    p50: str
    p99: str
    max: str
    duplicates: int
    daemon_cpu: float  # seconds per minute, all daemons
    rss: float  # MB per host: daemon + spawn service


def measure(hosts: int, jobs: int, seconds: float, settle: float, mode: str | None,
            every: int, ready_timeout: float | None = None) -> Result:
    with tempfile.TemporaryDirectory(prefix="dblockrun-scale-") as tmp, \
            fresh_database("postgresql", tmp) as db, pooler(mode, db) as (url, _):
        folder = Path(tmp)
        record = folder / "starts.txt"
        fleet = Fleet(db, jobs_file(folder, jobs, record, every), hosts, url=url)
        try:
            fleet.start(ready_timeout=ready_timeout or 120 + 3 * hosts)
            time.sleep(settle)
            fleet.check_alive()
            cpu0, db0, q0 = fleet.cpu(), backend_cpu(db), transactions(db)
            t0, w0 = time.monotonic(), time.time()
            connections = 0
            while time.monotonic() < t0 + seconds:
                time.sleep(min(5.0, max(0.0, t0 + seconds - time.monotonic())))
                try:
                    connections = max(connections, query(
                        db, "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                            "AND pid <> pg_backend_pid()", db.name))
                except psycopg.OperationalError as exc:  # the server full: say so, go on
                    print(f"{hosts}x{jobs}: no connection sample: {exc}", flush=True)
            cpu1, db1, q1 = fleet.cpu(), backend_cpu(db), transactions(db)
            t1, w1 = time.monotonic(), time.time()
            rss = sum(rss_mb(p.pid) for p in fleet.procs) / hosts
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
        worst = (f"{percentile(stats.latencies, 1.0) * 1000:.0f}" if stats.latencies
                 else "-")
        return Result(
            hosts, jobs, (q1 - q0) * scale,
            sum(c - db0.get(pid, 0.0) for pid, c in db1.items()) * scale, connections,
            starts * scale, stats.ms(0.5), stats.ms(0.99), worst, duplicates,
            (sum(cpu1) - sum(cpu0)) * scale, rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="10x1000,30x1000,100x1000",
                    help="comma-separated HOSTSxJOBS")
    ap.add_argument("--pooler", choices=("transaction", "session"),
                    help="through a PgBouncer in this pool mode (default: direct)")
    ap.add_argument("--every", type=int, default=1,
                    help="each job is due every this many minutes (default 1)")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--ready-timeout", type=float,
                    help="seconds for every daemon to start (default 120 + 3 per host)")
    args = ap.parse_args()
    table = Table(["hosts", "jobs", "stmts/min", "stmts/s", "DB CPU s/min", "server conns",
                   "starts/min", "p50 ms", "p99 ms", "max ms", "dups", "daemon CPU s/min",
                   "RSS MB/host"])
    for config in args.configs.split(","):
        n, j = (int(x) for x in config.lower().split("x"))
        try:
            r = measure(n, j, args.seconds, args.settle, args.pooler, args.every,
                        args.ready_timeout)
        except SystemExit as exc:  # a fleet that did not start: say so, go on
            print(f"{config}: not measured: {exc}", flush=True)
            continue
        row = [r.hosts, r.jobs, f"{r.statements:.0f}", f"{r.statements / 60:.1f}",
               f"{r.db_cpu:.2f}", r.connections, f"{r.starts:.0f}", r.p50, r.p99, r.max,
               r.duplicates, f"{r.daemon_cpu:.1f}", f"{r.rss:.0f}"]
        table.add(row)
        print(f"{config}: " + " ".join(str(x) for x in row), flush=True)
    via = f"through PgBouncer, pool_mode = {args.pooler}" if args.pooler else "direct"
    print(f"fleet scale on one PostgreSQL, {via} ({code_version()}; {load()}; "
          f"{args.seconds:g} s per configuration after start-up; each job due every "
          f"{args.every} min; default heartbeat 10 s)")
    table.print()
    if os.cpu_count() and os.cpu_count() == 2:
        print("2 cores shared by the daemons, their commands and PostgreSQL")


if __name__ == "__main__":
    main()
