"""Fan-out scaling: items per second with 1, 2 and 4 daemons sharing one job.

    python bench/fanout.py [--items 120] [--sleep 0.2] [--parallel 2] [--backend postgresql]

Each round starts N real `dblockrun daemon` processes on a fresh table prefix
with one rate job of ITEMS items (each `sleep SLEEP`, `parallel` at a time
per daemon) and measures items/s from the first item's start to the last
item's end, by the database's run records. Scaling efficiency is
items/s with 4 daemons divided by 4 x items/s with 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import URLS, bench_prefix, make_schema

JOBS = """\
jobs:
  work:
    rate: 1h
    parallel: {parallel}
    items-command: seq 1 {items}
    command: sleep {sleep}
"""


def one_round(url: str, daemons: int, items: int, sleep: float, parallel: int,
              tmp: Path) -> tuple[float, dict[str, int]]:
    prefix = bench_prefix()
    store = make_schema(url, prefix)
    jobs = tmp / f"jobs-{prefix}.yaml"
    jobs.write_text(JOBS.format(parallel=parallel, items=items, sleep=sleep))
    cmd = [sys.executable, "-m", "dblockrun", "--db", url, "--table-prefix", prefix, "daemon",
           str(jobs), "--heartbeat", "2s", "--lease", "6s"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(daemons)]
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            runs = [r for r in store.history("work", items * 2)
                    if r.item is not None and r.finished is not None]
            if len(runs) >= items:
                break
            time.sleep(0.25)
        else:
            raise SystemExit(f"{daemons} daemons did not finish {items} items in 300 s")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
    first = min(r.started for r in runs)
    last = max(r.finished or r.started for r in runs)
    hosts: dict[str, int] = {}
    for r in runs:
        hosts[r.host] = hosts.get(r.host, 0) + 1
    store.drop_schema()
    store.close()
    return items / (last - first), hosts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=120)
    ap.add_argument("--sleep", type=float, default=0.2)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--backend", default="postgresql", choices=sorted(URLS))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = URLS[args.backend](tmp)
        ideal = args.parallel / args.sleep
        print(f"fan-out on {args.backend}: {args.items} items of {args.sleep}s, "
              f"parallel {args.parallel} per daemon ({os.cpu_count()} cores)")
        print(f"{'daemons':>8}{'items/s':>10}{'ideal/s':>10}{'items per daemon':>28}")
        rates: dict[int, float] = {}
        for n in (1, 2, 4):
            rate, hosts = one_round(url, n, args.items, args.sleep, args.parallel, Path(tmp))
            rates[n] = rate
            spread = "/".join(str(v) for v in sorted(hosts.values()))
            print(f"{n:>8}{rate:>10.1f}{ideal * n:>10.1f}{spread:>28}")
        print(f"scaling efficiency (4 daemons / 4 x 1 daemon): {rates[4] / (4 * rates[1]):.2f}")


if __name__ == "__main__":
    main()
