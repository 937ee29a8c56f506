"""Start-up cost, idle cost and memory of a daemon with many jobs, per backend.

    python bench/idle.py [--seconds 60] [--jobs 1000] [--backends postgresql,mariadb,sqlite]

For each backend and job count, a real ``dblockrun daemon`` starts on a
database of its own (created and dropped here, so that its statement count
is the daemon's alone) with that many jobs: all but one never due (a yearly
cron), and one ``rate: 365d`` job, due at once, whose command copies
``/proc/PID/stat`` of its spawn service (its parent) and of the daemon (the
service's parent) the moment it starts. Reported:

* **start-up CPU**: the daemon's CPU seconds (utime + stime) from its exec to
  its first claim's command, and the spawn service's; a fresh database, so
  the schema and the 1,000 lock rows are made in that time;
* **idle CPU**: seconds per hour and as a share of one core, ``--seconds``
  measured after ``--settle``;
* **statements per minute** (PostgreSQL: ``xact_commit`` of that database;
  every statement is its own transaction in autocommit; MariaDB: counted on
  the wire by a proxy in front of the server, bench/wirecount.py, with the
  idle minute's statements by first word printed below the table);
* **RSS** of the daemon and of its spawn service at the end (VmRSS of each
  process), and their sum, against the goal of issue 21 (40 MB together).

Run it against an earlier commit in the same run with
``bench/compare.py --baseline REF -- idle.py ...``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pymysql
from common import MY_HOST, MY_PORT, MY_USER, PG_DSN, Table
from psycopg import sql
from wirecount import MyCountingProxy

TARGET_CORE_PCT = 0.5
TARGET_RSS_MB = 40.0  # daemon + spawn service (issue 21)
TARGET_START_CPU = 0.5  # seconds of the daemon's CPU to the first claim (issue 21)
CLK_TCK = os.sysconf("SC_CLK_TCK")
BACKENDS = ("postgresql", "mariadb", "sqlite")


def stat_cpu(text: str) -> tuple[int, float]:
    """(parent pid, utime + stime seconds) of one ``/proc/PID/stat`` text."""
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    return stat_cpu(Path(f"/proc/{pid}/stat").read_text())[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if stat_cpu((entry / "stat").read_text())[0] == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return found


def jobs_file(folder: str, n: int) -> tuple[str, Path]:
    """A jobs file of ``n`` jobs, one due at once; and where its command
    leaves the two stat lines."""
    path = os.path.join(folder, f"jobs-{n}.yaml")
    marks = Path(folder) / f"first-claim-{n}-{secrets.token_hex(3)}"
    with open(path, "w") as out:
        out.write("jobs:\n  first:\n    rate: 365d\n")
        out.write(f"    command: \"cat /proc/$PPID/stat /proc/$(cut -d' ' -f4 /proc/$PPID/stat)"
                  f"/stat > {marks}.part && mv {marks}.part {marks}\"\n")
        for i in range(n - 1):
            out.write(f"  idle-{i}:\n    cron: \"0 0 1 1 *\"\n    command: \"true\"\n")
    return path, marks


class Database:
    """One backend's fresh database: its URL, a statement count if known."""

    def __init__(self, backend: str, tmp: str) -> None:
        self.backend = backend
        self.name = f"bench_idle_{os.getpid()}_{secrets.token_hex(3)}"
        self.count: Callable[[], int] | None = None
        if backend == "postgresql":
            self.admin = psycopg.connect(PG_DSN, autocommit=True)
            self.admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
            self.url = f"postgresql://postgres@127.0.0.1:5432/{self.name}"
            self.count = self._pg_commits
        elif backend == "mariadb":
            self.my = pymysql.connect(host=MY_HOST, port=MY_PORT, user=MY_USER, autocommit=True)
            with self.my.cursor() as cur:
                cur.execute(f"CREATE DATABASE `{self.name}`")
            self.proxy = MyCountingProxy(MY_PORT, MY_HOST)
            self.url = f"mysql://{MY_USER}@127.0.0.1:{self.proxy.port}/{self.name}"
            self.count = self.proxy.statements
        else:
            self.url = f"sqlite:///{tmp}/{self.name}.db"

    def _pg_commits(self) -> int:
        self.admin.execute("SELECT pg_stat_clear_snapshot()")
        row = self.admin.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                                 (self.name,)).fetchone()
        return int(str(row[0])) if row else 0

    def drop(self) -> None:
        if self.backend == "postgresql":
            self.admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(self.name)))
            self.admin.close()
        elif self.backend == "mariadb":
            with self.my.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{self.name}`")
            self.my.close()
            self.proxy.close()


def wait_for(marks: Path, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marks.exists():
            return marks.read_text()
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited ({proc.returncode}) before its first claim")
        time.sleep(0.05)
    raise SystemExit("no claim within the timeout")


def measure(backend: str, n: int, tmp: str, args: argparse.Namespace,
            env: dict[str, str]) -> list[str]:
    db = Database(backend, tmp)
    try:
        path, marks = jobs_file(tmp, n)
        proc = subprocess.Popen(
            [sys.executable, "-m", "dblockrun", "--db", db.url, "daemon", path],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            lines = wait_for(marks, proc, 120).splitlines()
            spawn_pid = int(lines[0].split()[0])
            daemon_ppid, start_daemon = stat_cpu(lines[1])
            _, start_spawn = stat_cpu(lines[0])
            if int(lines[1].split()[0]) != proc.pid or daemon_ppid == proc.pid:
                raise SystemExit("the first claim's command is not the daemon's grandchild")
            time.sleep(args.settle)
            c0, t0 = cpu_seconds(proc.pid), time.monotonic()
            q0 = db.count() if db.count else 0
            w0 = db.proxy.by_word() if backend == "mariadb" else None
            time.sleep(args.seconds)
            c1, t1 = cpu_seconds(proc.pid), time.monotonic()
            q1 = db.count() if db.count else 0
            if w0 is not None:
                words = db.proxy.by_word()
                words.subtract(w0)
                print(f"{backend} {n} jobs, idle statements by first word: "
                      f"{dict(+words)}", flush=True)
            rss_daemon = rss_mb(proc.pid)
            spawned = children(proc.pid)
            if spawned != [spawn_pid]:
                raise SystemExit(f"the daemon's children: {spawned}, not its spawn service")
            rss_spawn = rss_mb(spawn_pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    finally:
        db.drop()
    took = t1 - t0
    pct = (c1 - c0) / took * 100
    rss = rss_daemon + rss_spawn
    ok = pct < TARGET_CORE_PCT and rss <= TARGET_RSS_MB and start_daemon <= TARGET_START_CPU
    return [backend, str(n), f"{start_daemon:.2f}", f"{start_spawn:.2f}",
            f"{(c1 - c0) / took * 3600:.1f}", f"{pct:.2f}",
            f"{(q1 - q0) / took * 60:.0f}" if db.count else "-",
            f"{rss_daemon:.1f}", f"{rss_spawn:.1f}", f"{rss:.1f}", "yes" if ok else "NO"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--jobs", default="1000")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--settle", type=float, default=12.0,
                    help="seconds after the first claim before measuring")
    args = ap.parse_args()
    table = Table(["backend", "jobs", "start CPU s", "spawn start s", "idle CPU s/h",
                   "% core", "stmts/min", "RSS daemon", "RSS spawn", "RSS MB", "met"])
    tmp = tempfile.mkdtemp(prefix="dblockrun-bench-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBLOCKRUN_")}
    # The checkout's .pyc files first (a fresh baseline worktree has none),
    # so that no daemon's start-up compiles them.
    subprocess.run([sys.executable, "-c", "import compileall, os, dblockrun; "
                    "compileall.compile_dir(os.path.dirname(dblockrun.__file__), quiet=1)"],
                   env=env, check=True)
    for backend in args.backends.split(","):
        for n in [int(x) for x in args.jobs.split(",")]:
            table.add(measure(backend, n, tmp, args, env))
    print(f"daemon with N jobs, one due at start-up (targets: start-up to the first claim "
          f"<= {TARGET_START_CPU:g} s of the daemon's CPU, fresh database; idle "
          f"< {TARGET_CORE_PCT:g} % of a core over {args.seconds:g} s after {args.settle:g} s;"
          f" RSS daemon + spawn service <= {TARGET_RSS_MB:g} MB)")
    table.print()


if __name__ == "__main__":
    main()
