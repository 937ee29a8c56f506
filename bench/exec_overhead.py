"""Wall time of ``dblockrun exec --name x -- true`` against the floor, in one run.

    python bench/exec_overhead.py [--runs 20] [--backends sqlite,postgresql,mariadb]

The commands run round-robin (one of each, then again) so that a busy
machine slows them alike. Rows: ``python -c pass`` (the interpreter alone),
``flock -n FILE true`` (cron's usual lock), importing each driver (the floor
of a Python exec on that database: exec sends the lock engine's statements
with sqlite3, psycopg or PyMySQL directly), then dblockrun exec on
each backend: the ``dblockrun`` console script, ``python -m dblockrun``
(whose main() parses a plain exec without click; the console script does
the same once its entry point is ``dblockrun.__main__:main``, the table's
title says which it is) and, for comparison, the SQLAlchemy path
(``DBLOCKRUN_EXEC_DIRECT=0``). The lock is free each time (exec releases it).
The target is the floor of the same run plus a margin: ``python -c pass``
+ 100 ms on SQLite, + 150 ms on PostgreSQL and MariaDB.

As on a real install, the dblockrun package is byte-compiled first
(compileall, into its usual ``__pycache__``) and the timed commands run
without ``PYTHONDONTWRITEBYTECODE``: with it set (as in some shells and CI)
and no ``.pyc`` files, every start would recompile dblockrun's modules
(about 40 ms).
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import URLS, Table, bench_prefix, make_schema

import dblockrun

#: exec's target: ``python -c pass`` of the same run plus this much.
TARGET_OVER_MS = {"sqlite": 100.0, "postgresql": 150.0, "mariadb": 150.0}
#: What exec loads to reach each database (label, Python source).
DRIVER = {
    "sqlite": [("import sqlite3", "import sqlite3")],
    "postgresql": [("import psycopg", "import psycopg")],
    "mariadb": [("import pymysql", "import pymysql")],
}


MODULE = [sys.executable, "-m", "dblockrun"]


def dblockrun_argv() -> list[str]:
    script = Path(sys.executable).with_name("dblockrun")
    if script.exists():
        return [str(script)]
    return MODULE


def entry_point(argv: list[str]) -> str:
    """The function the console script calls (``module:main``)."""
    if argv == MODULE:
        return "dblockrun.__main__:main"
    found = re.search(r"^from (\S+) import (\w+)", Path(argv[0]).read_text(), re.M)
    return f"{found.group(1)}:{found.group(2)}" if found else "?"


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, check=False)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: "
                         f"{proc.stderr.decode(errors='replace')[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--backends", default="sqlite,postgresql,mariadb")
    args = ap.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    prefix = bench_prefix()
    tmp = tempfile.mkdtemp(prefix="dblockrun-bench-")
    lockfile = os.path.join(tmp, "flock")
    compileall.compile_dir(Path(dblockrun.__file__).parent, quiet=1)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DBLOCKRUN_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["DBLOCKRUN_TABLE_PREFIX"] = prefix
    cases: list[tuple[str, list[str], dict[str, str], str | None]] = [
        ("python -c pass", [sys.executable, "-c", "pass"], env, None),
    ]
    flock = shutil.which("flock")
    if flock:
        cases.append(("flock -n FILE true", [flock, "-n", lockfile, "true"], env, None))
    stores = []
    for backend in backends:
        url = URLS[backend](tmp)
        stores.append(make_schema(url, prefix))
        for label, source in DRIVER[backend]:
            cases.append((f"python -c '{label}'", [sys.executable, "-c", source], env, None))
        exec_args = ["--db", url, "exec", "--name", "x", "--", "true"]
        exec_argv = [*dblockrun_argv(), *exec_args]
        cases.append((f"dblockrun exec, {backend}", exec_argv, env, backend))
        if dblockrun_argv() != MODULE:
            cases.append((f"python -m dblockrun exec, {backend}", [*MODULE, *exec_args], env,
                          backend))
        cases.append((f"dblockrun exec, {backend}, SQLAlchemy path", exec_argv,
                      {**env, "DBLOCKRUN_EXEC_DIRECT": "0"}, None))
    times: dict[str, list[float]] = {name: [] for name, *_ in cases}
    try:
        for _name, argv, e, _ in cases:  # warm the page cache and .pyc files
            timed(argv, e)
        for _ in range(args.runs):
            for name, argv, e, _ in cases:
                times[name].append(timed(argv, e))
    finally:
        for store in stores:
            store.drop_schema()
            store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    floor = statistics.median(times["python -c pass"])
    flock_ms = statistics.median(times["flock -n FILE true"]) if flock else None
    table = Table(["command", "median ms", "p90 ms", "x python", "target ms", "met"])
    for name, _, _, target_of in cases:
        ts = sorted(times[name])
        med = statistics.median(ts)
        p90 = ts[min(len(ts) - 1, int(len(ts) * 0.9))]
        over = TARGET_OVER_MS.get(target_of or "")
        target = None if over is None else floor * 1000 + over
        table.add([name, f"{med * 1000:.1f}", f"{p90 * 1000:.1f}", f"{med / floor:.1f}",
                   f"{target:.0f}" if target else "",
                   ("yes" if med * 1000 < target else "NO") if target else ""])
    print(f"exec overhead: medians of {args.runs} runs each, round-robin"
          + (f"; flock {flock_ms * 1000:.1f} ms" if flock_ms else "")
          + f"; dblockrun = {entry_point(dblockrun_argv())}")
    table.print()


if __name__ == "__main__":
    main()
