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
* **memory** of the daemon and its spawn service together, RSS, USS and PSS
  (``/proc/PID/smaps_rollup`` of each: ``Rss``; ``Private_Clean`` +
  ``Private_Dirty``; ``Pss``), the median of ``--samples`` samples spread
  over the idle seconds; beside it **the floor** measured in the same run
  (before the daemon, alone): a process that imports the mandated driver
  and SQLAlchemy and opens one connection through ``create_engine``, with a
  bare ``python -I -S`` beside it as the spawn service is; and **ours**,
  the daemon's less the floor's, against issue 33's goal (6 MB, 61 MB in
  all on PostgreSQL). USS is the figure to compare: PSS shares the pages
  of the interpreter and the libraries among every process that maps them
  (other Python processes on the host lower it), RSS counts them whole.

The daemon is idle once it has said ``READY=1`` (it has planned every job;
the bench listens as systemd would, ``$NOTIFY_SOCKET``) and its first
claim's command has run; ``--settle`` seconds later the measured seconds begin.

Run it against an earlier commit in the same run with
``bench/compare.py --baseline REF -- idle.py ...``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import psycopg
import pymysql
from common import MY_HOST, MY_PORT, MY_USER, PG_DSN, Table
from psycopg import sql
from wirecount import MyCountingProxy

TARGET_CORE_PCT = 0.5
TARGET_RSS_MB = 40.0  # daemon + spawn service (issue 21)
TARGET_OURS_MB = 6.0  # USS of daemon + spawn service over the floor's (issue 33 item 4)
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


class Memory(NamedTuple):
    """MB of one or more processes: resident, unique (private), proportional."""

    rss: float
    uss: float
    pss: float

    def __add__(self, other: object) -> Memory:
        assert isinstance(other, Memory)
        return Memory(self.rss + other.rss, self.uss + other.uss, self.pss + other.pss)

    def __sub__(self, other: Memory) -> Memory:
        return Memory(self.rss - other.rss, self.uss - other.uss, self.pss - other.pss)

    def cells(self) -> list[str]:
        return [f"{self.rss:.1f}", f"{self.uss:.1f}", f"{self.pss:.1f}"]


def memory(*pids: int) -> Memory:
    """The processes' memory together, from ``/proc/PID/smaps_rollup``."""
    total = Memory(0.0, 0.0, 0.0)
    for pid in pids:
        kb: dict[str, int] = {}
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            key, _, value = line.partition(":")
            kb[key] = int(value.split()[0])
        total += Memory(kb["Rss"] / 1024,
                        (kb["Private_Clean"] + kb["Private_Dirty"]) / 1024, kb["Pss"] / 1024)
    return total


def median_memory(samples: Sequence[Memory]) -> Memory:
    return Memory(*(statistics.median(s[i] for s in samples) for i in range(3)))


#: The floor's process: the mandated driver and SQLAlchemy, one connection
#: through create_engine (held), and a bare interpreter beside it as the
#: daemon's spawn service is (``python -I -S``, blocked on its stdin). It
#: prints its child's pid once both are ready, and ends when its stdin closes.
FLOOR = """
import subprocess, sys
import {driver}, sqlalchemy
connection = sqlalchemy.create_engine(sys.argv[1]).connect()
connection.exec_driver_sql("SELECT 1").all()
bare = subprocess.Popen([sys.executable, "-I", "-S", "-c", "import os; os.read(0, 1)"],
                        stdin=subprocess.PIPE)
print(bare.pid, flush=True)
sys.stdin.read()
bare.stdin.close()
bare.wait()
"""

#: SQLAlchemy's URL of a backend's database for the floor (the mandated driver).
FLOOR_DIALECT = {"postgresql": ("psycopg", "postgresql+psycopg://"),
                 "mariadb": ("pymysql", "mysql+pymysql://")}


def floor(backend: str, url: str, args: argparse.Namespace, env: dict[str, str]) -> Memory:
    """The median memory of the floor's two processes (:data:`FLOOR`)."""
    driver, scheme = FLOOR_DIALECT[backend]
    proc = subprocess.Popen(
        [sys.executable, "-c", FLOOR.format(driver=driver), scheme + url.split("://", 1)[1]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout is not None
        bare = int(proc.stdout.readline())
        samples = []
        for _ in range(args.samples):
            time.sleep(0.5)
            samples.append(memory(proc.pid, bare))
    finally:
        proc.communicate(timeout=30)
    return median_memory(samples)


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


def wait_ready(notify: socket.socket, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Until the daemon says ``READY=1`` (it has planned every job), as it
    would to systemd (dblockrun/daemon/sdnotify.py)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        notify.settimeout(min(left, 0.5))
        try:
            if b"READY=1" in notify.recv(4096).split(b"\n"):
                return
        except TimeoutError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited ({proc.returncode}) before it was ready")
    raise SystemExit("the daemon was not ready within the timeout")


def measure(backend: str, n: int, tmp: str, args: argparse.Namespace,
            env: dict[str, str], memory_table: Table) -> list[str]:
    db = Database(backend, tmp)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_path = os.path.join(tmp, f"notify-{secrets.token_hex(3)}")
    notify.bind(notify_path)
    try:
        base = floor(backend, db.url, args, env) if backend in FLOOR_DIALECT else None
        path, marks = jobs_file(tmp, n)
        proc = subprocess.Popen(
            [sys.executable, "-m", "dblockrun", "--db", db.url, "daemon", path],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**env, "NOTIFY_SOCKET": notify_path})
        try:
            wait_ready(notify, proc, 120)
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
            samples = []
            for k in range(args.samples):  # spread over the measured seconds
                time.sleep(max(0.0, t0 + (k + 1) * args.seconds / args.samples
                               - time.monotonic()))
                samples.append(memory(proc.pid, spawn_pid))
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
        notify.close()
        os.unlink(notify_path)
        db.drop()
    ours = median_memory(samples)
    if base is not None:
        memory_table.add([backend, str(n), "floor", *base.cells(), ""])
        memory_table.add([backend, str(n), "daemon + spawn", *ours.cells(), ""])
        mine = ours - base
        memory_table.add([backend, str(n), "ours", *mine.cells(),
                          "yes" if mine.uss <= TARGET_OURS_MB else "NO"])
    else:
        memory_table.add([backend, str(n), "daemon + spawn", *ours.cells(), ""])
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
    ap.add_argument("--samples", type=int, default=5,
                    help="memory samples (their median is shown)")
    args = ap.parse_args()
    table = Table(["backend", "jobs", "start CPU s", "spawn start s", "idle CPU s/h",
                   "% core", "stmts/min", "RSS daemon", "RSS spawn", "RSS MB", "met"])
    memory_table = Table(["backend", "jobs", "processes", "RSS MB", "USS MB", "PSS MB",
                          "met"])
    tmp = tempfile.mkdtemp(prefix="dblockrun-bench-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBLOCKRUN_")}
    # The checkout's .pyc files first (a fresh baseline worktree has none),
    # so that no daemon's start-up compiles them.
    subprocess.run([sys.executable, "-c", "import compileall, os, dblockrun; "
                    "compileall.compile_dir(os.path.dirname(dblockrun.__file__), quiet=1)"],
                   env=env, check=True)
    for backend in args.backends.split(","):
        for n in [int(x) for x in args.jobs.split(",")]:
            table.add(measure(backend, n, tmp, args, env, memory_table))
    print(f"daemon with N jobs, one due at start-up (targets: start-up to the first claim "
          f"<= {TARGET_START_CPU:g} s of the daemon's CPU, fresh database; idle "
          f"< {TARGET_CORE_PCT:g} % of a core over {args.seconds:g} s after {args.settle:g} s;"
          f" RSS daemon + spawn service <= {TARGET_RSS_MB:g} MB)")
    table.print()
    print(f"memory, daemon + spawn service against the floor (the driver, SQLAlchemy and a "
          f"connection, + a bare interpreter), median of {args.samples} samples over the "
          f"idle seconds (target: ours <= {TARGET_OURS_MB:g} MB USS)")
    memory_table.print()


if __name__ == "__main__":
    main()
