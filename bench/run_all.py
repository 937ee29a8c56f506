"""Every benchmark in one command, one after the other.

    python bench/run_all.py [--quick]

Full: about 13 minutes on a 2-core machine (latency, many_jobs and peer 6
of them, status_scale 2); --quick: about 8 minutes, with fewer runs and shorter windows
(noisier). Needs PostgreSQL on
127.0.0.1:5432 (user postgres, database test) and MariaDB on 127.0.0.1:3306
(root, database test), as the test suite does. peer.py needs procrastinate:
the `bench` extra is installed first when it is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

FULL = [
    ["exec_overhead.py", "--runs", "20"],
    ["claims.py", "--seconds", "3", "--repeats", "3", "--procs", "1,4"],
    ["idle.py", "--seconds", "60", "--jobs", "1000"],
    ["fanout.py", "--items", "120"],
    ["spawn.py", "--rounds", "5", "--threads", "0,200", "--parallel", "1,4"],
    ["latency.py", "--seconds", "45", "--sqlite-seconds", "20"],
    ["many_jobs.py", "--slots", "2", "--backends", "postgresql,mariadb"],
    ["peer.py", "--seconds", "20"],
    ["status_scale.py", "--jobs", "10000", "--repeats", "7"],
]
QUICK = [
    ["exec_overhead.py", "--runs", "7"],
    ["claims.py", "--seconds", "1", "--repeats", "2", "--procs", "1,4"],
    ["idle.py", "--seconds", "20", "--settle", "5", "--jobs", "1000"],
    ["fanout.py", "--items", "40"],
    ["spawn.py", "--rounds", "3", "--threads", "0,200", "--parallel", "4"],
    ["latency.py", "--seconds", "15", "--sqlite-seconds", "8"],
    ["many_jobs.py", "--slots", "1", "--backends", "postgresql", "--deadline", "15"],
    ["peer.py", "--seconds", "10", "--tasks", "500", "--deadline", "30"],
    ["status_scale.py", "--jobs", "10000", "--repeats", "3"],
]


def machine() -> str:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.system()} {platform.release()}, {os.cpu_count()} cores ({cpu}), "
            f"Python {platform.python_version()}, load {load:.2f} at start")


def ensure_bench_extra() -> None:
    """peer.py compares with procrastinate: install the `bench` extra if missing."""
    if importlib.util.find_spec("procrastinate") is not None:
        return
    print("installing the bench extra (procrastinate): pip install -e '.[bench]'", flush=True)
    code = subprocess.call([sys.executable, "-m", "pip", "install", "-q", "-e",
                            f"{ROOT}[bench]"])
    if code != 0:
        print("could not install it: peer.py will say skipped", flush=True)
    importlib.invalidate_caches()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer runs, shorter windows")
    args = ap.parse_args()
    print(machine(), flush=True)
    print(flush=True)
    ensure_bench_extra()
    failed = []
    for argv in QUICK if args.quick else FULL:
        start = time.monotonic()
        code = subprocess.call([sys.executable, os.path.join(HERE, argv[0]), *argv[1:]])
        print(f"({argv[0]}: {time.monotonic() - start:.0f} s)", flush=True)
        print(flush=True)
        if code != 0:
            failed.append(argv[0])
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
