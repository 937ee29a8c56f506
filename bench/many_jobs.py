"""Many jobs due on the same instant: 2,000 jobs, 4 daemons.

    python bench/many_jobs.py [--jobs 2000] [--daemons 4] [--period 30] [--slots 2]
                              [--deadline 28] [--backends postgresql,mariadb]

Per backend, a fresh database (dropped at the end) and ``--daemons`` real
`dblockrun daemon` processes on this machine sharing ``--jobs`` jobs that
are all due on the same instants, every PERIOD seconds (with 30, twice a
minute: ``cron: "7,37 * * * * *"``, the seconds chosen so that the first
slot comes about 16 s after the bench starts). Each command is bash's
printf builtin appending ``$EPOCHREALTIME``, the job, ``$DBLOCKRUN_SLOT``
and ``$DBLOCKRUN_HOST_ID`` to one file (a single small O_APPEND write). After
every daemon is up, ``--slots`` consecutive slots are observed; for each,
the bench waits until every job started or ``--deadline`` seconds after the
slot, whichever comes first, so it ends in bounded time however late the
starts are; a job that has not started by then is reported missing.

Per slot: jobs started / expected, duplicates (a job started twice for the
slot: must be 0), time from the slot to the last start (target: 2 s),
p50/p99 of (first instruction - slot), starts per daemon and busiest/mean
(target 1.5). Then the daemons' CPU seconds from just before the first slot
to the end: utime + stime of each daemon and of the children it has reaped
(guards, commands), from /proc/PID/stat.

``--floor`` first starts the same commands with no scheduler, two at a time
(``xargs -P 2``, each a ``bash -c`` of the job's command with its environment
set as a daemon sets it): the time and CPU that ``--jobs`` process starts cost
on this machine in this run, whatever schedules them. The table gives the last
start's ratio to it (issue 33's target: 6 s, or 1.2x the floor on a slower day).

``--features both`` runs each backend twice in the same run, each time on a
fresh database: plain, then with the fleet features switched on where they
cost nothing by design: every job has ``run-on`` (the daemons carry the
matching ``--label``) and a ``notify`` on failure and timeout (the commands
succeed, so nothing is sent), and the daemons have a ``--max-running`` above
the number of jobs. It prints both rows and their ratios, including the
statements the daemons sent per start over the slots (PostgreSQL: the
database's ``xact_commit + xact_rollback``, one per statement in autocommit;
MariaDB: the server's global ``Questions``, nothing else running).
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pymysql
from common import MY_HOST, MY_PORT, MY_USER, Table
from fleet import (
    BASH,
    CLOCK_NOTE,
    RECORD,
    Db,
    Fleet,
    code_version,
    fresh_database,
    load,
    pg_dsn,
    read_starts,
    sleep_until,
    slot_stats,
)

TARGET_LAST_S = 2.0
TARGET_BALANCE = 1.5
LEAD = 16.0  # init-db and start-up of 4 daemons with 2,000 jobs: 7-12 s


def seconds_field(period: int, phase: int) -> str:
    """The cron seconds at which ``t % period == phase``: with 30 and 7, ``7,37``."""
    return ",".join(str(s) for s in range(60) if s % period == phase)


#: The daemon options and jobs-file defaults of ``--features``.
FEATURE_OPTIONS = ("--label", "role=bench", "--max-running", "1000000")
FEATURE_DEFAULTS = ["defaults:", "  run-on: {role: bench}",
                    "  notify: {urls: ['json://127.0.0.1:9/never'], on: [failure, timeout]}"]


def jobs_yaml(n: int, period: int, phase: int, record: Path, features: bool = False) -> str:
    out = [*(FEATURE_DEFAULTS if features else []), "jobs:"]
    cron = f"{seconds_field(period, phase)} * * * * *"
    for i in range(n):
        out += [f"  many-{i}:", f'    cron: "{cron}"', f"    shell: {BASH}",
                f"    command: '{RECORD.format(path=record)}'"]
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class Floor:
    """The same commands started with no scheduler, two at a time."""

    seconds: float  # the first start to the last
    cpu_ms: float  # per start: xargs and the commands (reaped children)


def floor(n: int, folder: Path) -> Floor:
    """Start ``n`` of the bench's commands two at a time with ``xargs -P 2``
    (bash for each, as the daemons' spawn service starts them), each with the
    job name, slot and host a daemon would give it."""
    record = folder / "floor.log"
    script = ("DBLOCKRUN_JOB=$1 DBLOCKRUN_SLOT=0 DBLOCKRUN_HOST_ID=floor; "
              + RECORD.format(path=record))
    names = "".join(f"many-{i}\n" for i in range(n)).encode()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    subprocess.run(["xargs", "-P", "2", "-n", "1", BASH, "-c", script, "floor"], input=names,
                   check=True, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    starts = [s.t for s in read_starts(record)]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if len(starts) != n:
        raise SystemExit(f"floor: {len(starts)} of {n} commands started")
    return Floor(max(starts) - t0, cpu / n * 1000)


def started_for(record: Path, slot: float) -> int:
    return len({s.job for s in read_starts(record) if s.slot == slot})


def statements(db: Db) -> int:
    """Statements the database has run so far (see the module's docstring)."""
    if db.backend == "postgresql":
        with psycopg.connect(pg_dsn(db.name), autocommit=True) as conn:
            row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                               "WHERE datname = current_database()").fetchone()
            return int(row[0]) if row else 0
    my = pymysql.connect(host=MY_HOST, port=MY_PORT, user=MY_USER, password="")
    try:
        with my.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS LIKE 'Questions'")
            got = cur.fetchone()
            return int(got[1]) if got else 0
    finally:
        my.close()


@dataclass(frozen=True)
class Outcome:
    """What the comparison of ``--features both`` needs of one run."""

    last: float  # the slowest slot's last start, seconds after the slot
    cpu_ms: float  # daemons' CPU per start
    per_start: float  # statements per start


def run_backend(backend: str, args: argparse.Namespace, folder: Path, table: Table,
                cpu_table: Table, features: bool = False, base: Floor | None = None) -> Outcome:
    variant = "features" if features else "plain"
    with fresh_database(backend, str(folder)) as db:
        work = folder / f"{backend}-{variant}"
        work.mkdir()
        record = work / "starts.log"
        jobs_file = work / "jobs.yaml"
        # The first slot about LEAD seconds from now (start-up takes 7-12 s), not
        # at :00 or :30: less waiting, the same schedule shifted.
        phase = int(time.time() + LEAD) % args.period
        jobs_file.write_text(jobs_yaml(args.jobs, args.period, phase, record, features))
        fleet = Fleet(db, jobs_file, args.daemons,
                      extra=FEATURE_OPTIONS if features else ())
        t_ready = time.monotonic()
        try:
            fleet.start(ready_timeout=300)
            t_ready = time.monotonic() - t_ready
            first = math.ceil((time.time() + 2.0 - phase) / args.period) * args.period + phase
            slots = [float(first + k * args.period) for k in range(args.slots)]
            sleep_until(first - 1.0)
            cpu0, w0, sent0 = fleet.cpu(), time.monotonic(), statements(db)
            for slot in slots:
                sleep_until(slot + 0.5)
                while (time.time() < slot + args.deadline
                       and started_for(record, slot) < args.jobs):
                    fleet.check_alive()
                    time.sleep(0.25)
            time.sleep(1.0)  # the last commands end and are reaped
            cpu1, w1, sent1 = fleet.cpu(), time.monotonic(), statements(db)
        finally:
            fleet.stop()
        # A start after its slot's deadline counts as missing: the bench stopped
        # waiting for it (the daemons may go on starting until they are stopped).
        starts = [s for s in read_starts(record) if s.t <= s.slot + args.deadline]
        slowest = 0.0
        for slot in slots:
            expected = {(f"many-{i}", slot) for i in range(args.jobs)}
            st = slot_stats(starts, expected)
            last = max(st.latencies) if st.latencies else float("inf")
            slowest = max(slowest, last)
            mean = st.started / args.daemons
            counts = sorted(st.per_host.values(), reverse=True)
            balance = counts[0] / mean if counts and mean else float("inf")
            ok = (st.missing == 0 and st.duplicates == 0 and last <= TARGET_LAST_S
                  and balance <= TARGET_BALANCE)
            table.add([backend, variant, time.strftime("%H:%M:%S", time.gmtime(slot)), st.expected,
                       st.started, st.missing, st.duplicates, f"{last:.2f}",
                       st.ms(0.5), st.ms(0.99), "/".join(map(str, counts)) or "-",
                       f"{balance:.2f}", f"{last / base.seconds:.2f}" if base else "-",
                       "yes" if ok else "NO"])
        used = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
        n_starts = sum(1 for s in starts if s.slot in slots)
        cpu_ms = sum(used) / n_starts * 1000 if n_starts else float("nan")
        per_start = (sent1 - sent0) / n_starts if n_starts else float("nan")
        cpu_table.add([backend, variant, f"{t_ready:.1f}", f"{w1 - w0:.1f}", f"{sum(used):.1f}",
                       " / ".join(f"{u:.1f}" for u in used), f"{cpu_ms:.2f}",
                       f"{cpu_ms / base.cpu_ms:.2f}" if base else "-", f"{per_start:.3f}"])
        return Outcome(slowest, cpu_ms, per_start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--daemons", type=int, default=4)
    ap.add_argument("--period", type=int, default=30,
                    help="seconds between slots (divides 60)")
    ap.add_argument("--slots", type=int, default=2, help="consecutive slots observed")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds after a slot to wait for its starts (default: period - 2)")
    ap.add_argument("--backends", default="postgresql,mariadb")
    ap.add_argument("--features", choices=("off", "on", "both"), default="off",
                    help="run with run-on, notify and --max-running (both: plain, then with)")
    ap.add_argument("--floor", action="store_true",
                    help="first time the same commands started two at a time, no scheduler")
    args = ap.parse_args()
    if 60 % args.period:
        ap.error("--period must divide 60")
    if args.deadline is None:
        args.deadline = max(1.0, args.period - 2.0)
    table = Table(["backend", "variant", "slot (UTC)", "expected", "started", "missing",
                   "duplicates", "last start s", "p50 ms", "p99 ms", "starts per daemon",
                   "busiest/mean", "x floor", "met"])
    cpu_table = Table(["backend", "variant", "start-up s", "window s", "CPU s (all daemons)",
                       "per daemon", "CPU ms per start", "x floor", "statements per start"])
    compare = Table(["backend", "last start s plain / features", "ratio",
                     "CPU ms per start plain / features", "ratio",
                     "statements per start plain / features"])
    variants = {"off": (False,), "on": (True,), "both": (False, True)}[args.features]
    with tempfile.TemporaryDirectory(prefix="dblockrun-bench-") as tmp:
        base = floor(args.jobs, Path(tmp)) if args.floor else None
        for backend in args.backends.split(","):
            got = [run_backend(backend, args, Path(tmp), table, cpu_table, features, base)
                   for features in variants]
            if len(got) == 2:
                plain, feat = got
                compare.add([backend, f"{plain.last:.2f} / {feat.last:.2f}",
                             f"{feat.last / plain.last:.2f}",
                             f"{plain.cpu_ms:.1f} / {feat.cpu_ms:.1f}",
                             f"{feat.cpu_ms / plain.cpu_ms:.2f}",
                             f"{plain.per_start:.2f} / {feat.per_start:.2f}"])
    print(f"many jobs: {args.jobs} jobs due on the same instant every {args.period} s, "
          f"{args.daemons} daemons, {args.slots} slot(s), waiting at most {args.deadline:g} s "
          f"after each; targets: every job once, last start within {TARGET_LAST_S:g} s, "
          f"busiest/mean <= {TARGET_BALANCE:g}; {load()}; {code_version()}")
    print(CLOCK_NOTE)
    if base is not None:
        print(f"floor: the same {args.jobs} commands started two at a time with no scheduler "
              f"(xargs -P 2): the last {base.seconds:.2f} s after the first, "
              f"{base.cpu_ms:.2f} ms of CPU per start")
    table.print()
    print("daemons' CPU from 1 s before the first slot to 1 s after the last wait (utime + "
          "stime of each daemon and its reaped children: guards and commands); start-up: "
          "until every daemon registered")
    cpu_table.print()
    if args.features == "both":
        print("fleet features (run-on + --label, notify on failure and timeout, --max-running) "
              "against the plain run, same run, each on a fresh database:")
        compare.print()


if __name__ == "__main__":
    main()
