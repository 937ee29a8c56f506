"""1,000 idle hosts on one PostgreSQL, simulated: the cost model's idle term.

    python bench/idle_hosts.py [--hosts 1,1000] [--jobs 100] [--seconds 60]
                               [--pooler transaction]

Each simulated host is the daemon's own bookkeeping, not a copy of its
statements: a :class:`dblockrun.daemon.fleet.FleetBooks` (host row, clock,
lost runs, live hosts, drift, run-now requests, operator actions; the held
slots every fifth round, through the daemon's :class:`SlotBook`) with a
host id of its own, whose :meth:`FleetBooks.step` (what the daemon's
bookkeeping thread does each round) comes on the daemon's timer: every 1.2
heartbeats (the default heartbeat, 10 s). Not a thread per host (1,000
Python threads on 2 cores starve each other and the pool): one timer
hands each due step to one of ``--workers`` threads, and the steps'
lateness is reported, so a simulator that fell behind shows it. The hosts
start spread over one round's interval, as a fleet's daemons start at
different moments. An idle daemon renews no lease, so its
:class:`~dblockrun.running.heartbeat.Renewer` sends nothing and is left
out; nothing is due (the jobs are yearly), so nothing is claimed.

The hosts share one :class:`~dblockrun.store.Store` (one pool of server
connections, directly or through a PgBouncer with ``--pooler``): the
statements are the daemon's, the connections are not (a real daemon holds
its own; ``bench/fleet_scale.py`` runs real ones). The daemon's pool
trimming sends no statement and is left off here (it would close the shared
pool's connections under the other hosts).

Measured over ``--seconds`` after every host has made a round: statements
per second on the database (``xact_commit + xact_rollback``, every
statement its own transaction in autocommit), per host per minute (the
cost model says 5: one round a 12 s), and the database CPU of the backends
serving the bench database. Goal (issue 21): under 100 statements a second
for 1,000 idle hosts.
"""

from __future__ import annotations

import argparse
import heapq
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import Table, percentile
from fleet import code_version, fresh_database, load
from fleet_scale import backend_cpu, pooler, transactions

from dblockrun.config.load import load_jobs
from dblockrun.daemon.fleet import FleetBooks
from dblockrun.errors import DatabaseError
from dblockrun.events import Events
from dblockrun.metrics import Metrics
from dblockrun.running.heartbeat import DbClock
from dblockrun.scheduling.slotbook import SlotBook
from dblockrun.store import Store
from dblockrun.store.outage import Outage

HEARTBEAT = 10.0
GOAL_PER_S = 100.0


class SharedStore(Store):
    """The hosts' one store: its pool is not trimmed after a round."""

    def trim_pool(self) -> bool:
        return False


def jobs_file(folder: Path, jobs: int) -> Path:
    path = folder / "jobs.yaml"
    lines = ["jobs:"]
    for i in range(jobs):
        lines += [f"  j{i}:", f'    cron: "0 0 1 1 {i % 7}"', "    command: \"true\""]
    path.write_text("\n".join(lines) + "\n")
    return path


def measure(hosts: int, jobs: int, seconds: float, mode: str | None,
            workers: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="dblockrun-idlehosts-") as tmp, \
            fresh_database("postgresql", tmp) as db, pooler(mode, db) as (url, _):
        jobs_of = load_jobs(str(jobs_file(Path(tmp), jobs)))
        store = SharedStore(url)
        try:
            store.ensure_jobs(j.name for j in jobs_of.jobs)
            events = Events()
            books = [FleetBooks(store, f"sim-{i}:{i}:bench", HEARTBEAT, DbClock(), Outage(),
                                Metrics(), lambda: jobs_of, lambda: 0, None,
                                book=SlotBook(store, f"sim-{i}:{i}:bench", events))
                     for i in range(hosts)]
            interval = 1.2 * HEARTBEAT
            began = time.monotonic()
            # Every host has made its first round (its start-up reads too) by then.
            window = (began + 2 * interval, began + 2 * interval + seconds)
            due = [(began + interval * (1 + i / hosts), i, 0) for i in range(hosts)]
            heapq.heapify(due)
            late: list[float] = []
            failed = 0
            marks: dict[str, tuple[int, dict[int, float], float]] = {}

            def step(i: int, rounds: int, at: float) -> None:
                nonlocal failed
                lag = time.monotonic() - at
                try:
                    books[i].step(rounds)
                except DatabaseError:
                    failed += 1
                if window[0] <= at < window[1]:
                    late.append(lag)

            with ThreadPoolExecutor(workers) as pool:
                while due:
                    at, i, rounds = heapq.heappop(due)
                    for name, edge in (("start", window[0]), ("end", window[1])):
                        if name not in marks and at >= edge:
                            time.sleep(max(0.0, edge - time.monotonic()))
                            marks[name] = (transactions(db), backend_cpu(db), time.monotonic())
                    if "end" in marks:
                        break
                    time.sleep(max(0.0, at - time.monotonic()))
                    pool.submit(step, i, rounds, at)
                    heapq.heappush(due, (at + interval, i, rounds + 1))
            live = len(store.hosts(seen_within=3 * HEARTBEAT))
        finally:
            store.close()
    (q0, cpu0, t0), (q1, cpu1, t1) = marks["start"], marks["end"]
    per_s = (q1 - q0) / (t1 - t0)
    db_cpu = sum(c - cpu0.get(pid, 0.0) for pid, c in cpu1.items()) / (t1 - t0) * 60
    late.sort()
    return [str(hosts), str(jobs), str(live), f"{per_s:.1f}", f"{per_s * 60 / hosts:.2f}",
            f"{db_cpu:.2f}", f"{percentile(late, 0.99) * 1000:.0f}",
            f"{late[-1] * 1000:.0f}" if late else "-", str(failed),
            "yes" if per_s < GOAL_PER_S else "NO"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="1,1000")
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--pooler", choices=("transaction", "session"))
    ap.add_argument("--workers", type=int, default=8)
    args = ap.parse_args()
    table = Table(["hosts", "jobs", "live", "stmts/s", "per host/min", "DB CPU s/min",
                   "p99 late ms", "max late ms", "failed", "< 100/s"])
    for n in (int(x) for x in args.hosts.split(",")):
        row = measure(n, args.jobs, args.seconds, args.pooler, args.workers)
        table.add(row)
        print(" ".join(row), flush=True)
    via = f"through PgBouncer ({args.pooler})" if args.pooler else "direct"
    print(f"idle hosts simulated on one PostgreSQL, {via} ({code_version()}; {load()}; "
          f"{args.seconds:g} s; heartbeat {HEARTBEAT:g} s)")
    table.print()


if __name__ == "__main__":
    main()
