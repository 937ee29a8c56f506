"""Claim throughput of the store against the floor: the same conditional
UPDATE sent from a bare driver loop, in the same run.

    python bench/claims.py [--seconds 3] [--repeats 3] [--procs 1,4]
                           [--backends postgresql,mariadb]

Each process claims and releases its own job in a loop (claim + release, no
command) for ``--seconds``; the rate is the sum over processes. Store and
bare loop alternate, ``--repeats`` times, and the table shows medians. Then
round trips per won and per lost claim are counted (Store.statements), and
per won run as the daemon sends it (claim with its run record, result with
the release: target 2).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pymysql
from common import MY_DB, MY_HOST, MY_PORT, MY_USER, PG_DSN, URLS, Table, bench_prefix, make_schema

from dblockrun.store import Store
from dblockrun.store import models as m

TARGET_RATIO = 0.80


def loop_rate(fn: Callable[[], None], seconds: float, start_at: float) -> float:
    while time.time() < start_at:
        time.sleep(0.001)
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()
        n += 1
    return n / seconds


def bare_loop(backend: str, table: str, name: str) -> Callable[[], None]:
    """claim + release with the driver alone: the floor (the same WHERE, the
    same database clock, the token returned in the same round trip)."""
    if backend == "postgresql":
        now = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
        pg = psycopg.connect(PG_DSN, autocommit=True)
        claim = (
            f"UPDATE {table} SET holder=%s, lock_until={now}+%s, locked_at={now},"
            f" token=token+1, last_start={now}, run_requested=NULL WHERE name=%s AND"
            f" (lock_until IS NULL OR lock_until <= {now}) AND (disabled_until IS NULL OR"
            f" disabled_until <= {now}) RETURNING token"
        )
        release = (f"UPDATE {table} SET lock_until=greatest({now}, locked_at+%s)"
                   f" WHERE name=%s AND holder=%s AND token=%s")

        def go_pg() -> None:
            row = pg.execute(claim, ("bare", 30.0, name)).fetchone()
            assert row is not None
            pg.execute(release, (0.0, name, "bare", row[0]))

        return go_pg
    now = "CAST(UNIX_TIMESTAMP(NOW(6)) AS DOUBLE)"
    my = pymysql.connect(host=MY_HOST, port=MY_PORT, user=MY_USER, database=MY_DB,
                         autocommit=True, client_flag=2,  # FOUND_ROWS, as SQLAlchemy
                         init_command="SET time_zone = '+00:00'")
    cur = my.cursor()
    claim_my = (
        f"UPDATE {table} SET holder=%s, lock_until={now}+%s, locked_at={now},"
        f" token=LAST_INSERT_ID(token+1), last_start={now}, run_requested=NULL WHERE name=%s"
        f" AND (lock_until IS NULL OR lock_until <= {now}) AND (disabled_until IS NULL OR"
        f" disabled_until <= {now})"
    )
    release_my = (f"UPDATE {table} SET lock_until=greatest({now}, locked_at+%s)"
                  f" WHERE name=%s AND holder=%s AND token=%s")

    def go_my() -> None:
        cur.execute(claim_my, ("bare", 30.0, name))
        assert cur.rowcount == 1
        cur.execute(release_my, (0.0, name, "bare", cur.lastrowid))

    return go_my


def worker(kind: str, backend: str, url: str, prefix: str, name: str, seconds: float,
           start_at: float, out: Any) -> None:
    if kind == "store":
        store = Store(url, prefix)

        def once() -> None:
            token = store.claim(name, "me", 30)
            assert token is not None
            store.release(name, "me", token)

        once()
        out.put(loop_rate(once, seconds, start_at))
        store.close()
    else:
        fn = bare_loop(backend, f"{prefix}locks", name)
        fn()
        out.put(loop_rate(fn, seconds, start_at))


def measure(kind: str, backend: str, url: str, prefix: str, procs: int,
            seconds: float) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 1.5  # after every process has connected
    ps = [ctx.Process(target=worker, args=(kind, backend, url, prefix, f"job{i}", seconds,
                                           start_at, out)) for i in range(procs)]
    for p in ps:
        p.start()
    rates = [float(out.get(timeout=seconds + 60)) for _ in ps]
    for p in ps:
        p.join()
    return sum(rates)


def count_statements(store: Store) -> tuple[int, int, int]:
    """Statements per won claim (+ release), per lost claim, per won run."""
    store.ensure_jobs(["count"])
    before = store.statements
    token = store.claim("count", "me", 30)
    assert token is not None
    store.release("count", "me", token)
    won = store.statements - before
    token = store.claim("count", "me", 30)
    assert token is not None
    before = store.statements
    assert store.claim("count", "other", 30) is None
    lost = store.statements - before
    store.release("count", "me", token)
    before = store.statements
    # What the daemon sends for a won run: the claim with its run record,
    # then the result with the release.
    claimed = store.claim_and_record("count", "me", 30)
    assert claimed is not None and claimed.run_id is not None
    store.finish_and_release(claimed.run_id, "count", "me", claimed.token, m.OK, 0, "")
    run = store.statements - before
    return won, lost, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--procs", default="1,4")
    ap.add_argument("--backends", default="postgresql,mariadb")
    args = ap.parse_args()
    procs = [int(p) for p in args.procs.split(",")]
    table = Table(["backend", "procs", "store/s", "bare/s", "ratio", "target", "met",
                   "trips/claim+release", "trips/loss", "trips/won run"])
    for backend in args.backends.split(","):
        prefix = bench_prefix()
        url = URLS[backend](tempfile.gettempdir())
        store = make_schema(url, prefix)
        try:
            store.ensure_jobs([f"job{i}" for i in range(max(procs))])
            won, lost, run = count_statements(store)
            for n in procs:
                ours, floor = [], []
                for _ in range(args.repeats):
                    ours.append(measure("store", backend, url, prefix, n, args.seconds))
                    floor.append(measure("bare", backend, url, prefix, n, args.seconds))
                o, f = statistics.median(ours), statistics.median(floor)
                table.add([backend, n, f"{o:.0f}", f"{f:.0f}", f"{o / f:.2f}",
                           f"{TARGET_RATIO:.2f}", "yes" if o / f >= TARGET_RATIO else "NO",
                           won, lost, run])
        finally:
            store.drop_schema()
            store.close()
    print(f"claim throughput (claim + release per second, {args.seconds:g} s x "
          f"{args.repeats}, medians; each process its own job)")
    table.print()


if __name__ == "__main__":
    main()
