"""Idle cost and memory of a daemon whose jobs are never due (yearly cron).

    python bench/idle.py [--seconds 60] [--jobs 10,1000]

For each job count, a real `dblockrun daemon` on PostgreSQL (a database of
its own, created and dropped here, so that its statement count is the
daemon's alone) runs for ``--seconds`` after its start-up. Reported: CPU
seconds per hour (utime + stime from /proc/PID/stat, scaled) and as a share
of one core, statements per minute (``xact_commit`` of that database: every
statement is its own transaction in autocommit), and the daemon's RSS.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from common import PG_DSN, Table
from psycopg import sql

TARGET_CORE_PCT = 0.5
TARGET_RSS_MB = 60.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def commits(admin: psycopg.Connection[tuple[object, ...]], dbname: str) -> int:
    admin.execute("SELECT pg_stat_clear_snapshot()")
    row = admin.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                        (dbname,)).fetchone()
    return int(str(row[0])) if row else 0


def jobs_file(folder: str, n: int) -> str:
    path = os.path.join(folder, f"jobs-{n}.yaml")
    with open(path, "w") as out:
        out.write("jobs:\n")
        for i in range(n):
            out.write(f"  idle-{i}:\n    cron: \"0 0 1 1 *\"\n    command: \"true\"\n")
    return path


def wait_started(url_dsn: str, prefix: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(url_dsn, autocommit=True) as conn:
                row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                    sql.Identifier(f"{prefix}hosts"))).fetchone()
                if row and int(str(row[0])) > 0:
                    return
        except psycopg.Error:
            pass
        time.sleep(0.5)
    raise SystemExit("the daemon did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--jobs", default="10,1000")
    ap.add_argument("--settle", type=float, default=12.0,
                    help="seconds after start-up before measuring")
    args = ap.parse_args()
    dbname = f"bench_idle_{os.getpid()}_{secrets.token_hex(3)}"
    prefix = "dblockrun_"
    url = f"postgresql://postgres@127.0.0.1:5432/{dbname}"
    dsn = PG_DSN.replace("dbname=test", f"dbname={dbname}")
    admin = psycopg.connect(PG_DSN, autocommit=True)
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    table = Table(["jobs", "cpu s/hour", "% of a core", "target %", "stmts/min", "RSS MB",
                   "target MB", "met"])
    tmp = tempfile.mkdtemp(prefix="dblockrun-bench-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBLOCKRUN_")}
    try:
        for n in [int(x) for x in args.jobs.split(",")]:
            path = jobs_file(tmp, n)
            proc = subprocess.Popen(
                [sys.executable, "-m", "dblockrun", "--db", url, "--table-prefix", prefix,
                 "daemon", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            try:
                wait_started(dsn, prefix, 60)
                time.sleep(args.settle)
                c0, q0, t0 = cpu_seconds(proc.pid), commits(admin, dbname), time.monotonic()
                time.sleep(args.seconds)
                c1, q1, t1 = cpu_seconds(proc.pid), commits(admin, dbname), time.monotonic()
                rss = rss_mb(proc.pid)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
            took = t1 - t0
            per_hour = (c1 - c0) / took * 3600
            pct = (c1 - c0) / took * 100
            ok = pct < TARGET_CORE_PCT and rss < TARGET_RSS_MB
            table.add([n, f"{per_hour:.1f}", f"{pct:.2f}", f"{TARGET_CORE_PCT:g}",
                       f"{(q1 - q0) / took * 60:.0f}", f"{rss:.1f}", f"{TARGET_RSS_MB:g}",
                       "yes" if ok else "NO"])
    finally:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(dbname)))
        admin.close()
    print(f"idle daemon (no job due; PostgreSQL; {args.seconds:g} s measured after start-up;"
          f" default heartbeat 10 s: a bookkeeping round every 12 s, run-now by LISTEN)")
    table.print()


if __name__ == "__main__":
    main()
