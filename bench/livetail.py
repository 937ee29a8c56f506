"""What live output costs a heartbeat: statements and bytes per running run.

    python bench/livetail.py [--runs 1,10,100] [--rounds 20] [--backends postgresql,mariadb,sqlite]

A daemon renews the leases of all its runs in one statement per heartbeat
(dblockrun/running/heartbeat.py ``Renewer.renew_all``); with live output,
the runs whose output grew since the last heartbeat have their newest tail
(at most 64 KiB) written in that same statement. This drives the real
``Renewer`` over ``--runs`` claimed runs, one heartbeat after another
(``renew_all``, no waiting), through a TCP proxy that counts the bytes each
way (PostgreSQL, MariaDB; SQLite has no wire: statements only), in these
cases, side by side in one run:

* **no live output**: the renewal as it was before live output (the runs
  have no output to write: the baseline);
* **output unchanged**: live output on, no run printed anything since the
  last heartbeat (the tails are not even copied);
* **a line per heartbeat, 1 KiB tail**: each run printed one 80-byte line
  since the last heartbeat, its tail 1 KiB long;
* **a line per heartbeat, full tail**: the same with the tail at its 64 KiB
  bound (a chatty command: what is written is the whole tail, not the line).

Reported per heartbeat per run: statements (the executor's count of round
trips), bytes sent and received, and the median time of a heartbeat's
renewal, each with its ratio to the baseline measured in the same run. A
heartbeat writes at most 1 MiB of tails (``heartbeat.LIVE_BUDGET``, 16 full
ones): with more full tails growing, the rest wait for the next heartbeats
(those written longest ago first), so the bytes per run are the budget's share.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import URLS, bench_prefix, make_schema, median  # noqa: E402
from wirecount import PgCountingProxy  # noqa: E402

from dblockrun.running.heartbeat import Renewer  # noqa: E402
from dblockrun.running.runner import OUTPUT_TAIL, LeaseWatch, LiveOutput, Tail  # noqa: E402
from dblockrun.store import Store  # noqa: E402
from dblockrun.store.outage import Outage  # noqa: E402

LINE = b"x" * 79 + b"\n"
#: Heartbeats before the measured ones.
WARM = 8
CASES = ("no live output", "output unchanged", "a line per heartbeat, 1 KiB tail",
         "a line per heartbeat, full tail")


def through_proxy(url: str) -> tuple[str, PgCountingProxy | None]:
    parts = urlsplit(url)
    if parts.scheme == "sqlite" or parts.port is None:
        return url, None
    proxy = PgCountingProxy(parts.port, parts.hostname or "127.0.0.1")
    return url.replace(f":{parts.port}/", f":{proxy.port}/", 1), proxy


def measure(url: str, runs: int, rounds: int, case: str) -> dict[str, float]:
    """Per heartbeat per run: statements, bytes up, bytes down; and the ms of a heartbeat."""
    prefix = bench_prefix()
    make_schema(url, prefix).close()
    wired, proxy = through_proxy(url)
    store = Store(wired, prefix)
    try:
        names = [f"job{i}" for i in range(runs)]
        store.ensure_jobs(names)
        renewer = Renewer(store, 10.0, Outage())
        tails: list[Tail] = []
        for name in names:
            won = store.claim_and_record(name, "bench-host", 30.0)
            assert won is not None and won.run_id is not None
            watch = LeaseWatch(name, "bench-host", won.token, 30.0)
            if case != CASES[0]:
                tail = Tail(OUTPUT_TAIL if "full" in case else 1024)  # a tail of constant size
                tail.add(LINE * (tail.limit // len(LINE) + 1))
                tails.append(tail)
                watch.output = LiveOutput([won.run_id], tail)
            renewer.add(watch)
        # The first write of every tail; a warm connection, and each statement
        # past psycopg's prepare threshold (5), in every case alike.
        for _ in range(WARM):
            if "line" in case:
                for tail in tails:
                    tail.add(LINE)
            renewer.renew_all()
        time.sleep(0.2)
        statements = store.statements
        up, down = proxy.bytes() if proxy else (0, 0)
        took = []
        for _ in range(rounds):
            if "line" in case:
                for tail in tails:
                    tail.add(LINE)
            began = time.perf_counter()
            renewer.renew_all()
            took.append((time.perf_counter() - began) * 1000)
        time.sleep(0.2)  # the proxy's threads count the last answers
        up2, down2 = proxy.bytes() if proxy else (0, 0)
        per = rounds * runs
        return {"statements": (store.statements - statements) / rounds,
                "up": (up2 - up) / per, "down": (down2 - down) / per, "ms": median(took)}
    finally:
        store.drop_schema()
        store.close()
        if proxy:
            proxy.close()


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="1,10,100")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--backends", default="postgresql,mariadb,sqlite")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            url = URLS[backend](tmp)
            print(f"\n{backend}: per heartbeat (ratio: to no live output, same run)")
            print("| runs | case | statements per heartbeat | bytes sent per run | "
                  "bytes received per run | heartbeat ms (median) |")
            print("|---|---|---|---|---|---|")
            for runs in (int(n) for n in args.runs.split(",")):
                base: dict[str, float] = {}
                for case in CASES:
                    got = measure(url, runs, args.rounds, case)
                    base = base or got
                    wire = backend != "sqlite"
                    print(f"| {runs} | {case} | {got['statements']:g} | "
                          + (f"{got['up']:.0f} (×{ratio(got['up'], base['up'])}) | "
                             f"{got['down']:.0f} (×{ratio(got['down'], base['down'])}) | "
                             if wire else "- | - | ")
                          + f"{got['ms']:.2f} (×{ratio(got['ms'], base['ms'])}) |", flush=True)
            if os.path.exists(f"{tmp}/bench.db"):
                os.remove(f"{tmp}/bench.db")


if __name__ == "__main__":
    main()
