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
Python threads on 2 cores starve each other and the pool): ``--procs``
processes each take a share of the hosts, and in each one timer hands
each due step to one of ``--workers`` threads. The steps' lateness is
reported, so a simulator that fell behind shows it, and so are the
statements the simulator sent (counted in the client: the executor's
round trips and SQLAlchemy's cursor executions) beside the database's
count, which also holds autovacuum's and the probes' own. Each host
makes its first round (and the reads of its start-up) before the timer
starts; then the hosts' rounds are spread over the interval, as a fleet's
daemons start at different moments. An idle daemon renews no lease, so its
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
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from common import Table, percentile
from fleet import code_version, fresh_database, load
from fleet_scale import backend_cpu, pooler, transactions

from dblockrun.config.load import load_jobs
from dblockrun.daemon.fleet import FleetBooks
from dblockrun.daemon.registry import Runs
from dblockrun.daemon.state import DaemonState, Settings
from dblockrun.daemon.wakeup import Signals
from dblockrun.errors import DatabaseError
from dblockrun.events import Events
from dblockrun.running.slotbook import SlotBook
from dblockrun.scheduling.targeting import LocalJobs
from dblockrun.store import Store
from dblockrun.store.status import ROUND_EVERY

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


@dataclass
class Slice:
    """What one simulator process did: its steps' lateness inside the
    window, the steps that failed, and the statements it sent in the window
    (the executor's round trips and SQLAlchemy's cursor executions)."""

    late: list[float] = field(default_factory=list)
    failed: int = 0
    sent: int = 0


def run_slice(url: str, jobs_path: str, hosts: range, total: int, began: float,
              window: tuple[float, float], workers: int) -> Slice:
    """Drive the steps of ``hosts`` (of ``total``, started from wall time
    ``began``) until the window's end."""
    jobs_of = load_jobs(jobs_path)
    store = SharedStore(url)
    out = Slice()
    sent = [0]

    def core(*_: object) -> None:
        if window[0] <= time.time() < window[1]:
            sent[0] += 1

    sa.event.listen(store.engine, "before_cursor_execute", core)
    events, signals = Events(), Signals()  # (one wake-up pipe for all, not one a host)

    def state(holder: str) -> DaemonState:
        return DaemonState(store, Settings(holder, 30.0, HEARTBEAT), LocalJobs(jobs_of, {}),
                           Runs(None, lambda: None), SlotBook(store, holder, events),
                           signals=signals)

    books = {i: FleetBooks(state(f"sim-{i}:{i}:bench")) for i in hosts}
    interval = ROUND_EVERY * HEARTBEAT
    # Each host's first round (with its start-up reads) before the timer
    # starts, so that no start-up is inside the window however slow.
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda i: books[i].step(0), hosts))
    due = [(began + interval * i / total, i, 1) for i in hosts]
    heapq.heapify(due)
    lock = threading.Lock()

    def step(i: int, rounds: int, at: float) -> None:
        lag = time.time() - at
        try:
            books[i].step(rounds)
        except DatabaseError:
            with lock:
                out.failed += 1
        if window[0] <= at < window[1]:
            with lock:
                out.late.append(lag)

    raw: list[int] = []
    try:
        with ThreadPoolExecutor(workers) as pool:
            while due:
                at, i, rounds = heapq.heappop(due)
                for edge in window[len(raw):]:
                    if at >= edge:  # the executor's round trips at the window's edges
                        time.sleep(max(0.0, edge - time.time()))
                        raw.append(store.x.statements)
                if len(raw) == 2:
                    break
                time.sleep(max(0.0, at - time.time()))
                pool.submit(step, i, rounds, at)
                heapq.heappush(due, (at + interval, i, rounds + 1))
    finally:
        store.close()
    out.sent = sent[0] + (raw[1] - raw[0] if len(raw) == 2 else 0)
    return out


def measure(hosts: int, jobs: int, seconds: float, mode: str | None, workers: int,
            procs: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="dblockrun-idlehosts-") as tmp, \
            fresh_database("postgresql", tmp) as db, pooler(mode, db) as (url, _):
        path = str(jobs_file(Path(tmp), jobs))
        store = Store(url)
        try:
            store.ensure_jobs(j.name for j in load_jobs(path).jobs)
            interval = ROUND_EVERY * HEARTBEAT
            # The processes' imports and the hosts' first rounds first.
            began = time.time() + 10.0 + hosts * 0.03
            window = (began + interval, began + interval + seconds)
            with ProcessPoolExecutor(procs) as pool:
                slices = [pool.submit(run_slice, url, path, range(k, hosts, procs), hosts,
                                      began, window, workers) for k in range(procs)]
                time.sleep(max(0.0, window[0] - time.time()))
                q0, cpu0, t0 = transactions(db), backend_cpu(db), time.monotonic()
                time.sleep(max(0.0, window[1] - time.time()))
                q1, cpu1, t1 = transactions(db), backend_cpu(db), time.monotonic()
                done = [f.result() for f in slices]
            live = len(store.hosts(seen_within=3 * HEARTBEAT))
        finally:
            store.close()
    per_s = (q1 - q0) / (t1 - t0)
    db_cpu = sum(c - cpu0.get(pid, 0.0) for pid, c in cpu1.items()) / (t1 - t0) * 60
    late = sorted(x for d in done for x in d.late)
    sent = sum(d.sent for d in done) / seconds
    return [str(hosts), str(jobs), str(live), f"{per_s:.1f}", f"{sent:.1f}",
            f"{sent * 60 / hosts:.2f}", f"{db_cpu:.2f}",
            f"{percentile(late, 0.99) * 1000:.0f}" if late else "-",
            f"{late[-1] * 1000:.0f}" if late else "-", str(sum(d.failed for d in done)),
            "yes" if per_s < GOAL_PER_S else "NO"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="1,1000")
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--pooler", choices=("transaction", "session"))
    ap.add_argument("--workers", type=int, default=4,
                    help="threads per process (at most the pool's 5 kept connections: "
                         "more and the pool opens and closes a connection per step)")
    ap.add_argument("--procs", type=int, default=4, help="simulator processes")
    args = ap.parse_args()
    table = Table(["hosts", "jobs", "live", "DB stmts/s", "sent/s", "sent/host/min",
                   "DB CPU s/min", "p99 late ms", "max late ms", "failed", "< 100/s"])
    for n in (int(x) for x in args.hosts.split(",")):
        row = measure(n, args.jobs, args.seconds, args.pooler, args.workers,
                      min(args.procs, n))
        table.add(row)
        print(" ".join(row), flush=True)
    via = f"through PgBouncer ({args.pooler})" if args.pooler else "direct"
    print(f"idle hosts simulated on one PostgreSQL, {via} ({code_version()}; {load()}; "
          f"{args.seconds:g} s; heartbeat {HEARTBEAT:g} s)")
    table.print()


if __name__ == "__main__":
    main()
