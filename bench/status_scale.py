"""`dblockrun status` with 10,000 jobs: wall time and statements sent.

    python bench/status_scale.py [--jobs 10000] [--runs 5] [--repeats 7]

For each backend (PostgreSQL and MariaDB; tables with a prefix of their own,
dropped at the end): 10,000 jobs, each with ``--runs`` finished runs; one
job in ten running under a live lease; one in a hundred a fan-out job with
10 items; four live hosts whose heartbeat lists every job (as a fleet's
daemons do). Then `dblockrun status` and `dblockrun status --json` run as
real processes, stdout to a pipe, round-robin with two baselines
(`python -c pass` and `dblockrun --version`), ``--repeats`` times each:
the median wall time, and its ratio to `dblockrun --version`, which is the
same interpreter start and imports without a database.

Statements are counted on the wire by a proxy in front of the server (one
more run each, not timed): PostgreSQL messages Query and Execute
(bench/wirecount.py), MySQL packets COM_QUERY and COM_STMT_EXECUTE. They
include everything the process sends: connecting, the schema version
check, then `status` itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from common import URLS, Table, bench_prefix, make_schema
from wirecount import counting

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GOAL_SECONDS = 1.0
GOAL_STATEMENTS = 5


# -- the data -------------------------------------------------------------------------


def fill(url: str, prefix: str, jobs: int, runs_per_job: int) -> None:
    store = make_schema(url, prefix)
    try:
        names = [f"job-{i:05d}" for i in range(jobs)]
        hosts = [f"web-{h}:{1000 + h}:bench{h}" for h in range(1, 5)]
        now = store.db_now()
        t = store.t
        lock_rows = []
        run_rows: list[dict[str, Any]] = []
        for i, name in enumerate(names):
            token = runs_per_job + (1 if i % 10 == 0 else 0)
            running = i % 10 == 0
            lock_rows.append({
                "name": name, "token": token, "last_start": now - 30,
                "holder": hosts[i % 4] if running else None,
                "lock_until": now + 3600 if running else None,
                "locked_at": now - 30 if running else None,
                "next_due": now + 60 + i % 300,
            })
            for r in range(runs_per_job):
                started = now - 300 * (runs_per_job - r)
                run_rows.append({"job": name, "item": None, "host": hosts[(i + r) % 4],
                                 "slot": started, "token": r + 1, "attempt": 1,
                                 "started": started, "finished": started + 1.5,
                                 "exit_code": 0 if r % 7 else 1,
                                 "result": "ok" if r % 7 else "failed", "output": "done\n"})
            if running:
                run_rows.append({"job": name, "item": None, "host": hosts[i % 4],
                                 "slot": now - 30, "token": token, "attempt": 1,
                                 "started": now - 30, "finished": None, "exit_code": None,
                                 "result": "running", "output": None})
        with store.engine.connect() as conn:
            for start in range(0, len(lock_rows), 1000):
                conn.execute(t.locks.insert(), lock_rows[start:start + 1000])
            for start in range(0, len(run_rows), 2000):
                conn.execute(t.runs.insert(), run_rows[start:start + 2000])
        for name in names[::100]:
            store.items.sync(name, [f"item-{k}" for k in range(10)])
        digests = json.dumps(dict.fromkeys(names, "3f9a0c1d2e4b"))
        for h in hosts:
            store.heartbeat_host(h, hostname=h.split(":")[0], pid=int(h.split(":")[1]),
                                 version="bench", clock_offset=0.0004, running=3, jobs=digests)
    finally:
        store.close()


def keep_hosts_live(url: str, prefix: str) -> None:
    """A heartbeat for the four hosts (not timed): they stay live in status."""
    from dblockrun.store import Store

    with Store(url, prefix) as store:
        hosts = store.t.hosts
        store._run(lambda c: c.execute(hosts.update().values(last_seen=store.now)))


def own_statements(url: str, prefix: str) -> int:
    """The statements status's reads take in the process (Store's counter),
    once the connection is set up and the schema checked."""
    from dblockrun.store import Store
    from dblockrun.store.status import report

    with Store(url, prefix, create=False) as store:
        report(store)
        before = store.statements
        report(store)
        return store.statements - before


def drop(url: str, prefix: str) -> None:
    from dblockrun.store import Store

    with Store(url, prefix, create=False) as store:
        store.drop_schema()


# -- timing -----------------------------------------------------------------------------


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return took, proc.stdout


def env_for() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DBLOCKRUN_DB", "DBLOCKRUN_DB_FILE", "DBLOCKRUN_JOBS",
                        "DBLOCKRUN_TABLE_PREFIX", "COLUMNS")}
    return env


def count_statements(url: str, backend: str, args: list[str], prefix: str) -> int:
    with counting(backend, url) as (proxy, through):
        keep_hosts_live(url, prefix)
        argv = [sys.executable, "-m", "dblockrun", "--db", through, "--table-prefix", prefix,
                *args]
        timed(argv, env_for())
        time.sleep(0.2)  # the proxy's threads have passed the last packets on
        return proxy.statements()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5, help="finished runs per job")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--backends", default="postgresql,mariadb")
    args = ap.parse_args()
    env = env_for()
    table = Table(["backend", "command", "median ms", "× --version", "status reads",
                   "sent by the process", "goal"])
    for backend in args.backends.split(","):
        url = URLS[backend]("")
        prefix = bench_prefix()
        print(f"{backend}: {args.jobs} jobs, {args.runs} runs each ...", flush=True)
        fill(url, prefix, args.jobs, args.runs)
        try:
            base = [sys.executable, "-m", "dblockrun", "--db", url, "--table-prefix", prefix]
            commands: dict[str, list[str]] = {
                "python -c pass": [sys.executable, "-c", "pass"],
                "dblockrun --version": [sys.executable, "-m", "dblockrun", "--version"],
                "status": [*base, "status"],
                "status --json": [*base, "status", "--json"],
            }
            times: dict[str, list[float]] = {name: [] for name in commands}
            shown: dict[str, str] = {}
            for _ in range(args.repeats):
                for name, argv in commands.items():
                    if name.startswith("status"):
                        keep_hosts_live(url, prefix)
                    took, out = timed(argv, env)
                    times[name].append(took)
                    shown[name] = out
            check(shown["status --json"], args.jobs, shown["status"])
            version = statistics.median(times["dblockrun --version"])
            reads = own_statements(url, prefix)
            for name in commands:
                med = statistics.median(times[name])
                sent: int | str = ""
                own: int | str = ""
                goal = ""
                if name.startswith("status"):
                    own = reads
                    sent = count_statements(url, backend, name.split(), prefix)
                    slow, many = med > GOAL_SECONDS, reads > GOAL_STATEMENTS
                    goal = "met" if not (slow or many) else (
                        f"{'time ' if slow else ''}{'statements ' if many else ''}not met")
                table.add([backend, name, f"{med * 1000:.0f}", f"{med / version:.2f}", own,
                           sent, goal])
        finally:
            drop(url, prefix)
    print(f"(goal: under {GOAL_SECONDS:g} s, status's reads at most {GOAL_STATEMENTS} "
          "statements; the process also connects and checks the schema version)")
    table.print()


def check(doc_text: str, jobs: int, table_text: str) -> None:
    """The output is the real thing: every job, the hosts live, the table as long."""
    doc = json.loads(doc_text)
    running = sum(1 for j in doc["jobs"] if j["state"] == "running")
    if (len(doc["jobs"]), len(doc["hosts"]), running) != (jobs, 4, (jobs + 9) // 10) \
            or table_text.count("\n") <= jobs:
        raise SystemExit(f"unexpected status output: {len(doc['jobs'])} jobs, "
                         f"{len(doc['hosts'])} hosts, {running} running")


if __name__ == "__main__":
    main()
