"""Shared by the fleet benchmarks (latency, many_jobs, peer): a fresh
database per run, real `dblockrun daemon` processes, the start records the
commands append, CPU seconds from /proc.

Every command of these benchmarks appends one line to a file with a single
small ``write`` (O_APPEND: lines from concurrent writers never interleave):

    <epoch seconds at the command's first instruction> <job> <slot> <host>

``<slot>`` is ``DBLOCKRUN_SLOT`` (ISO 8601 UTC) for dblockrun, a Unix
timestamp for procrastinate; ``read_starts`` accepts both.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pymysql
from common import MY_HOST, MY_PORT, MY_USER, PG_DSN, percentile
from psycopg import sql

CLK_TCK = os.sysconf("SC_CLK_TCK")
BASH = "/bin/bash"

#: The record line, written by bash's printf builtin at the command's first
#: instruction: ``$EPOCHREALTIME`` is expanded before anything else runs.
RECORD = ('printf "%s %s %s %s\\n" "$EPOCHREALTIME" "$DBLOCKRUN_JOB" "$DBLOCKRUN_SLOT"'
          ' "$DBLOCKRUN_HOST_ID" >> {path}')

CLOCK_NOTE = ("clocks: the databases are local, so the database clock that fires a slot is"
              " this machine's clock, the one the command reads; latency = command's"
              " first-instruction wall time - slot")


@dataclass(frozen=True)
class Db:
    """A database made for one run: ``url`` for dblockrun, ``name`` of the
    database (PostgreSQL, MariaDB) or the SQLite file."""

    backend: str
    name: str
    url: str

    def count(self, table: str, where: str = "") -> int:
        """Rows of ``table`` (0 if it does not exist yet) ``where`` a condition
        holds (SQL), on a connection of our own (never through a counting proxy)."""
        try:
            with self.reader() as fetch:
                rows = fetch(f"SELECT count(*) FROM {table}" + (f" WHERE {where}" if where else ""))
                return int(rows[0][0]) if rows else 0
        except (psycopg.Error, pymysql.MySQLError, sqlite3.Error):
            return 0

    @contextlib.contextmanager
    def reader(self) -> Iterator[Callable[[str], list[tuple[Any, ...]]]]:
        """``fetch(query) -> rows`` over one autocommit connection of our own
        (each query sees what is committed when it runs)."""
        if self.backend == "postgresql":
            with psycopg.connect(pg_dsn(self.name), autocommit=True, connect_timeout=5) as conn:
                yield lambda query: conn.execute(query).fetchall()
            return
        if self.backend == "mariadb":
            my = pymysql.connect(host=MY_HOST, port=MY_PORT, user=MY_USER, password="",
                                 database=self.name, connect_timeout=5, autocommit=True)
            try:
                def fetch(query: str) -> list[tuple[Any, ...]]:
                    with my.cursor() as cur:
                        cur.execute(query)
                        return list(cur.fetchall())
                yield fetch
            finally:
                my.close()
            return
        with contextlib.closing(sqlite3.connect(self.name, timeout=5,
                                                isolation_level=None)) as lite:
            yield lambda query: lite.execute(query).fetchall()


def pg_dsn(dbname: str) -> str:
    return PG_DSN.replace("dbname=test", f"dbname={dbname}")


@contextlib.contextmanager
def fresh_database(backend: str, folder: str) -> Iterator[Db]:
    """A new, empty database (or SQLite file) dropped at the end, so that
    nothing of another run or another engineer's test is in it."""
    name = f"bench_{os.getpid()}_{secrets.token_hex(3)}"
    if backend == "sqlite":
        path = os.path.join(folder, f"{name}.db")
        yield Db(backend, path, f"sqlite:///{path}")
        return
    if backend == "postgresql":
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield Db(backend, name, f"postgresql://postgres@127.0.0.1:5432/{name}")
        finally:
            with psycopg.connect(PG_DSN, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)))
        return
    if backend != "mariadb":
        raise ValueError(f"unknown backend {backend!r}")
    def my_admin(statement: str) -> None:  # a connection each: a run may outlast one
        my = pymysql.connect(host=MY_HOST, port=MY_PORT, user=MY_USER, password="",
                             autocommit=True)
        try:
            with my.cursor() as cur:
                cur.execute(statement)
        finally:
            my.close()

    my_admin(f"CREATE DATABASE `{name}`")
    try:
        yield Db(backend, name, f"mysql://{MY_USER}@{MY_HOST}:{MY_PORT}/{name}")
    finally:
        my_admin(f"DROP DATABASE IF EXISTS `{name}`")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without settings that would point dblockrun elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBLOCKRUN_")}
    env.update(extra)
    return env


def dblockrun(*args: str, python: Sequence[str] = ()) -> list[str]:
    """The command line of a dblockrun process (``python``: interpreter
    options, such as ``-X importtime``)."""
    return [sys.executable, *python, "-m", "dblockrun", *args]


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process, of its children it has waited for and,
    the same way, of its live children (a daemon's spawn service, whose
    waited-for children are the commands of finished runs): /proc/PID/stat
    fields 14-17."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return float("nan")
    live = (cpu_seconds(int(child)) for child in children)
    return (sum(int(f) for f in fields[11:15]) / CLK_TCK
            + sum(c for c in live if not math.isnan(c)))


@dataclass
class Fleet:
    """``n`` real `dblockrun daemon` processes on one jobs file and database.

    Their output goes to ``daemon-N.log`` beside the jobs file (shown when a
    daemon exits early)."""

    db: Db
    jobs_file: Path
    n: int
    url: str = ""  # the URL the daemons use, if not db.url (a proxy)
    extra: Sequence[str] = ()
    python: Sequence[str] = ()  # the daemons' interpreter options
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, ready_timeout: float = 120.0) -> None:
        url = self.url or self.db.url
        env = clean_env(LC_ALL="C")
        subprocess.run(dblockrun("--db", url, "init-db"), env=env, check=True,
                       stdout=subprocess.DEVNULL)
        for i in range(self.n):
            log = open(self.jobs_file.with_name(f"daemon-{i}.log"), "wb")
            self.procs.append(subprocess.Popen(
                dblockrun("--db", url, "daemon", str(self.jobs_file), "--grace", "5s",
                          *self.extra, python=self.python),
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            log.close()
        deadline = time.monotonic() + ready_timeout
        while self.db.count("dblockrun_hosts") < self.n:
            self.check_alive()
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.n} daemons not ready after {ready_timeout:g} s")
            time.sleep(0.2)

    def check_alive(self) -> None:
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                log = self.jobs_file.with_name(f"daemon-{i}.log").read_text(errors="replace")
                raise SystemExit(f"daemon {i} exited with {p.returncode}:\n{log[-3000:]}")

    def cpu(self) -> list[float]:
        return [cpu_seconds(p.pid) for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@dataclass(frozen=True)
class Start:
    t: float  # the command's first instruction, epoch seconds
    job: str
    slot: float  # the scheduled instant, epoch seconds
    host: str


def parse_slot(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text).timestamp()


def read_starts(path: Path) -> list[Start]:
    starts: list[Start] = []
    if not path.exists():
        return starts
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            starts.append(Start(float(parts[0].replace(",", ".")), parts[1],
                                parse_slot(parts[2]), parts[3]))
    return starts


@dataclass(frozen=True)
class SlotStats:
    """Starts of the expected (job, slot) pairs: each should start exactly once."""

    expected: int
    started: int  # distinct expected pairs that started
    duplicates: int  # extra starts of a pair
    missing: int
    latencies: list[float]  # seconds, first start of each pair
    per_host: Counter[str]

    def ms(self, q: float) -> str:
        return f"{percentile(self.latencies, q) * 1000:.0f}" if self.latencies else "-"


def slot_stats(starts: Iterable[Start], expected: set[tuple[str, float]]) -> SlotStats:
    seen: dict[tuple[str, float], list[Start]] = {}
    for s in starts:
        key = (s.job, s.slot)
        if key in expected:
            seen.setdefault(key, []).append(s)
    firsts = [min(v, key=lambda s: s.t) for v in seen.values()]
    return SlotStats(
        expected=len(expected),
        started=len(seen),
        duplicates=sum(len(v) - 1 for v in seen.values()),
        missing=len(expected) - len(seen),
        latencies=[s.t - s.slot for s in firsts],
        per_host=Counter(s.host for v in seen.values() for s in v),
    )


def bash_floor(runs: int = 30) -> list[float]:
    """Seconds from just before spawning ``bash -c`` to its first builtin
    reading ``$EPOCHREALTIME``: the share of every latency that is the
    command's own start-up, not dblockrun's."""
    out = []
    for _ in range(runs):
        t0 = time.time()
        got = subprocess.run([BASH, "-c", 'printf %s "$EPOCHREALTIME"'], capture_output=True,
                             env={"LC_ALL": "C"}, check=True).stdout
        out.append(float(got) - t0)
    return out


def code_version() -> str:
    """The dblockrun being measured: the checkout's commit, and whether the
    tree has uncommitted changes under dblockrun/ (the daemons run from it)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                                "dblockrun"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "dblockrun (not a git checkout)"
    return f"dblockrun {head}" + (" + uncommitted changes" if dirty else "")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.5))
