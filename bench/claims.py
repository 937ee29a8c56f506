"""Claim throughput of the store against the floor: the same conditional
UPDATE sent from a bare driver loop, in the same run.

    python bench/claims.py [--seconds 3] [--backends postgresql,mariadb,sqlite]

Prints claims per second (claim + release) for dblockrun's Store and for the
bare driver, the ratio, and statements per won and per lost claim.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import psycopg
import pymysql

from dblockrun.store import Store

URLS = {
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mariadb": "mysql://root@127.0.0.1:3306/test",
    "sqlite": f"sqlite:///{tempfile.gettempdir()}/dblockrun-bench-{os.getpid()}.db",
}


def rate(fn: Callable[[], None], seconds: float) -> float:
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()
        n += 1
    return n / seconds


def bare_loop(backend: str, table: str) -> Callable[[], None]:
    """claim + release with the driver alone: the floor."""
    if backend == "postgresql":
        pg = psycopg.connect("host=127.0.0.1 user=postgres dbname=test", autocommit=True)
        claim = (
            f"UPDATE {table} SET holder=%s, lock_until=extract(epoch from clock_timestamp())+30,"
            f" token=token+1 WHERE name=%s AND (lock_until IS NULL OR lock_until <="
            f" extract(epoch from clock_timestamp())) RETURNING token"
        )
        release = (
            f"UPDATE {table} SET lock_until=extract(epoch from clock_timestamp())"
            f" WHERE name=%s AND token=%s"
        )

        def go_pg() -> None:
            row = pg.execute(claim, ("bare", "bench")).fetchone()
            assert row is not None
            pg.execute(release, ("bench", row[0]))

        return go_pg
    if backend == "mariadb":
        my = pymysql.connect(host="127.0.0.1", user="root", database="test", autocommit=True)
        cur = my.cursor()
        claim_my = (
            f"UPDATE {table} SET holder=%s, lock_until=UNIX_TIMESTAMP(NOW(6))+30,"
            f" token=LAST_INSERT_ID(token+1) WHERE name=%s AND (lock_until IS NULL OR"
            f" lock_until <= UNIX_TIMESTAMP(NOW(6)))"
        )
        release_my = (
            f"UPDATE {table} SET lock_until=UNIX_TIMESTAMP(NOW(6)) WHERE name=%s AND token=%s"
        )

        def go_my() -> None:
            cur.execute(claim_my, ("bare", "bench"))
            cur.execute(release_my, ("bench", cur.lastrowid))

        return go_my
    raise SystemExit(f"no bare loop for {backend}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backends", default="postgresql,mariadb")
    args = ap.parse_args()
    print(f"{'backend':<12}{'store/s':>10}{'bare/s':>10}{'ratio':>8}{'stmts/win':>11}"
          f"{'stmts/loss':>11}")
    for backend in args.backends.split(","):
        store = Store(URLS[backend], "bench_")
        store.ensure_jobs(["bench"])

        def store_once(s: Store = store) -> None:
            token = s.claim("bench", "me", 30)
            assert token is not None
            s.release("bench", "me", token)

        store_once()
        bare = bare_loop(backend, "bench_locks")
        ours, floor = [], []
        for _ in range(args.repeats):
            ours.append(rate(store_once, args.seconds))
            floor.append(rate(bare, args.seconds))
        before = store.statements
        token = store.claim("bench", "me", 30)
        won = store.statements - before
        before = store.statements
        assert store.claim("bench", "other", 30) is None
        lost = store.statements - before
        assert token is not None
        store.release("bench", "me", token)
        o, f = statistics.median(ours), statistics.median(floor)
        print(f"{backend:<12}{o:>10.0f}{f:>10.0f}{o / f:>8.2f}{won:>11}{lost:>11}")
        store.drop_schema()
        store.close()


if __name__ == "__main__":
    main()
