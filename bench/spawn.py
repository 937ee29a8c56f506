"""CPU and wall time per 100 command starts: dblockrun's runner against the floor.

    python bench/spawn.py [--runs 100] [--rounds 5] [--threads 0,200] [--parallel 1,4]

Each row starts ``true`` ``--runs`` times per round and reports, per 100
starts, the CPU-seconds of this process and all its (waited-for)
descendants, and the wall time. Rows:

* ``subprocess.run(["true"])``: the floor (one fork+exec, one wait);
* ``run_process, guard``: what the daemon does for a job (its spawn service,
  a small process started once, starts the command with ``posix_spawn`` and
  watches the lease; output read by the one reactor thread);
* ``run_process, no guard``: what it does for an on-failure command;
* ``run_process, guard, limits``: a job with ``limits: {open-files: 1024,
  nice: 5, cpu-time: 1h}`` (a fork of the service sets them, where the rows
  above are started with ``posix_spawn``);
* ``run_process, guard, limits + io``: and ``io: idle`` (ionice runs first).

The CPU counted includes the spawn service's and its commands' (from
``/proc``), though they are not this process's waited-for children.

The rows run round-robin, one round of each then again, so a busy machine
slows them alike; the figure is the median round. ``--threads`` repeats the
table with that many extra idle threads in this process (a busy daemon has
two per running command: the run and its output pump), since a fork's cost
grows with the threads' stacks; ``--parallel`` starts from that many threads
at once, as a daemon does when many jobs share a slot. Target: the guard
within about 2x of the floor's CPU.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from common import Table

import dblockrun.daemon.loop  # noqa: F401  (the daemon's modules: a daemon-sized process)
from dblockrun.jobs import Limits
from dblockrun.running import spawn
from dblockrun.running.runner import LeaseWatch, run_process

Starter = Callable[[], None]


def floor() -> None:
    subprocess.run(["true"], check=True)


def _run(watch: LeaseWatch | None, limits: Limits | None = None) -> None:
    outcome = run_process(["true"], env=dict(os.environ), cwd=None, on_line=lambda _l: None,
                          deadline=None, watch=watch, stop=threading.Event(), limits=limits)
    assert outcome.exit_code == 0, outcome


def guarded() -> None:
    _run(LeaseWatch("bench", "bench", 1, 30.0))


def unguarded() -> None:
    _run(None)


RLIMITS = Limits(open_files=1024, nice=5, cpu_time=3600)


def limited() -> None:
    _run(LeaseWatch("bench", "bench", 1, 30.0), RLIMITS)


def limited_io() -> None:
    _run(LeaseWatch("bench", "bench", 1, 30.0), replace(RLIMITS, io="idle"))


ROWS: dict[str, Starter] = {
    'subprocess.run(["true"])': floor,
    "run_process, guard": guarded,
    "run_process, no guard": unguarded,
    "run_process, guard, limits": limited,
    "run_process, guard, limits + io": limited_io,
}


def cpu() -> float:
    """CPU-seconds of this process, its waited-for descendants and the spawn
    service with the commands it waited for."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + service_cpu()


def service_cpu() -> float:
    """utime, stime, cutime and cstime of the spawn service (/proc/PID/stat)."""
    stat = open(f"/proc/{spawn.start().pid}/stat", "rb").read()
    fields = stat[stat.rfind(b")") + 2 :].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def one_round(start: Starter, runs: int, parallel: int) -> tuple[float, float]:
    """CPU-seconds and wall seconds for ``runs`` starts."""
    c0, w0 = cpu(), time.perf_counter()
    if parallel == 1:
        for _ in range(runs):
            start()
    else:
        with ThreadPoolExecutor(parallel) as pool:
            for f in [pool.submit(start) for _ in range(runs)]:
                f.result()
    return cpu() - c0, time.perf_counter() - w0


def table(runs: int, rounds: int, parallel: int, threads: int) -> None:
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ROWS}
    for start in ROWS.values():  # warm up
        one_round(start, 5, 1)
    for _ in range(rounds):
        for name, start in ROWS.items():
            results[name].append(one_round(start, runs, parallel))
    per = 100 / runs
    floor_cpu = statistics.median(c for c, _ in results[next(iter(ROWS))]) * per
    print(f"{runs} starts x {rounds} rounds, {parallel} at once, {threads} extra idle threads "
          f"(threads now: {threading.active_count()}), per 100 starts, median round:")
    t = Table(["starter", "CPU s", "wall s", "CPU / floor"])
    for name, rs in results.items():
        c = statistics.median(c for c, _ in rs) * per
        w = statistics.median(w for _, w in rs) * per
        t.add([name, f"{c:.3f}", f"{w:.3f}", f"{c / floor_cpu:.2f}x"])
    t.print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=100, help="starts per row per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="0,200", help="extra idle threads, comma-separated")
    ap.add_argument("--parallel", default="1,4", help="starting threads, comma-separated")
    args = ap.parse_args()
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    idle = threading.Event()
    started = 0
    for threads in (int(x) for x in args.threads.split(",")):
        for _ in range(threads - started):
            threading.Thread(target=idle.wait, daemon=True).start()
        started = max(started, threads)
        for parallel in (int(x) for x in args.parallel.split(",")):
            table(args.runs, args.rounds, parallel, threads)
    idle.set()


if __name__ == "__main__":
    main()
