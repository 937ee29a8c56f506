"""1,000 idle hosts on one PostgreSQL, simulated: the cost model's idle term.

    python bench/idle_hosts.py [--hosts 1,1000] [--jobs 100] [--seconds 60]
                               [--pooler transaction]

Each simulated host is the daemon's own bookkeeping, not a copy of its
statements: a :class:`dblockrun.daemon.fleet.FleetBooks` (host row, clock,
lost runs, live hosts, drift, run-now requests, operator actions; the held
slots every fifth round, through the daemon's :class:`SlotBook`) with a
host id of its own, on its own thread and its own timer (a round every 1.2
heartbeats, the default heartbeat of 10 s), as a daemon starts it. The
hosts are started spread over one round's interval, as a fleet's daemons
start at different moments. An idle daemon renews no lease, so its
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
import tempfile
import threading
import time
from pathlib import Path

from common import Table
from fleet import code_version, fresh_database, load
from fleet_scale import backend_cpu, pooler, transactions

from dblockrun.config.load import load_jobs
from dblockrun.daemon.fleet import FleetBooks
from dblockrun.events import Events
from dblockrun.metrics import Metrics
from dblockrun.running.heartbeat import DbClock
from dblockrun.scheduling.slotbook import SlotBook
from dblockrun.store import Store
from dblockrun.store.outage import Outage
from dblockrun.supervise import Threads

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


def measure(hosts: int, jobs: int, seconds: float, mode: str | None) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="dblockrun-idlehosts-") as tmp, \
            fresh_database("postgresql", tmp) as db, pooler(mode, db) as (url, _):
        jobs_of = load_jobs(str(jobs_file(Path(tmp), jobs)))
        store = SharedStore(url)
        store.ensure_jobs(j.name for j in jobs_of.jobs)
        threads = Threads()
        books: list[FleetBooks] = []
        events = Events()
        try:
            interval = 1.2 * HEARTBEAT
            began = time.monotonic()
            for i in range(hosts):
                holder = f"sim-{i}:{i}:bench"
                book = FleetBooks(store, holder, HEARTBEAT, DbClock(), Outage(), Metrics(),
                                  lambda: jobs_of, lambda: 0, None,
                                  book=SlotBook(store, holder, events), threads=threads)
                books.append(book)
                time.sleep(max(0.0, began + interval * i / hosts - time.monotonic()))
                book.start()
            # Every host has made its first round (its start-up reads too) by then.
            time.sleep(interval + 2.0)
            problem = threads.problem()
            if problem is not None:
                raise SystemExit(f"a simulated host's thread crashed: {problem}")
            q0, cpu0, t0 = transactions(db), backend_cpu(db), time.monotonic()
            time.sleep(seconds)
            q1, cpu1, t1 = transactions(db), backend_cpu(db), time.monotonic()
            live = len(store.hosts(seen_within=3 * HEARTBEAT))
        finally:
            stoppers = [threading.Thread(target=b.stop) for b in books]
            for t in stoppers:
                t.start()
            for t in stoppers:
                t.join()
            store.close()
    per_s = (q1 - q0) / (t1 - t0)
    db_cpu = sum(c - cpu0.get(pid, 0.0) for pid, c in cpu1.items()) / (t1 - t0) * 60
    return [str(hosts), str(jobs), str(live), f"{per_s:.1f}", f"{per_s * 60 / hosts:.2f}",
            f"{db_cpu:.2f}", "yes" if per_s < GOAL_PER_S or hosts < 1000 else "NO"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="1,1000")
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--pooler", choices=("transaction", "session"))
    args = ap.parse_args()
    table = Table(["hosts", "jobs", "live", "stmts/s", "per host/min", "DB CPU s/min",
                   "< 100/s"])
    for n in (int(x) for x in args.hosts.split(",")):
        row = measure(n, args.jobs, args.seconds, args.pooler)
        table.add(row)
        print(" ".join(row), flush=True)
    via = f"through PgBouncer ({args.pooler})" if args.pooler else "direct"
    print(f"idle hosts simulated on one PostgreSQL, {via} ({code_version()}; {load()}; "
          f"{args.seconds:g} s; heartbeat {HEARTBEAT:g} s)")
    table.print()


if __name__ == "__main__":
    main()
