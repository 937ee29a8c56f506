"""Helpers shared by the tests: polling with a deadline, the database
handle, the CLI, reading run records. (Processes: tests/harness.py.)"""

from __future__ import annotations

import math
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from dblockrun.daemon.state import DaemonState
    from dblockrun.jobs import JobsFile
    from dblockrun.store import Store
    from dblockrun.store import models as m
    from dblockrun.store.memory import MemoryRunStore
    from dblockrun.store.outage import Outage

T = TypeVar("T")

#: The checkout: tests start dblockrun processes from here.
REPO = Path(__file__).resolve().parent.parent

#: How long a test waits for a daemon it just started to run its first
#: command, when that happens is not what the test measures: its imports,
#: the schema and the first claim. Under `-n 4` on 2 shared cores (load 19-26)
#: that took over 20 s (MariaDB most often); a quiet machine takes ~1 s,
#: so the figure costs nothing when all is well.
FIRST_RUN = 60.0


@dataclass(frozen=True)
class TestDb:
    """A database for one test.

    `url` is what dblockrun takes (`sqlite:////abs/file.db`,
    `postgresql://postgres@127.0.0.1:5432/<db>`, `mysql://root@127.0.0.1:3306/<db>`).
    The server databases are shared by the whole test session, so every table a
    test creates must start with `prefix` (`t<8 hex>_`), unique per test.
    """

    __test__: ClassVar[bool] = False  # not a test class, despite the name

    backend: str
    url: str
    prefix: str


def new_prefix() -> str:
    """A table prefix of its own (``t<8 hex>_``)."""
    return f"t{secrets.token_hex(4)}_"


def daemon_state(store: Store, holder: str, jobs: JobsFile, *, heartbeat: float = 1.0,
                 lease: float = 30.0, outage: Outage | None = None) -> DaemonState:
    """The shared state of a daemon (dblockrun/daemon/state.py) for a test
    of one of its parts alone: no --max-running, no drain watched."""
    from dblockrun.daemon.registry import Runs
    from dblockrun.daemon.state import DaemonState, Settings
    from dblockrun.events import Events
    from dblockrun.running.slotbook import SlotBook
    from dblockrun.scheduling.targeting import LocalJobs
    from dblockrun.store.outage import Outage

    return DaemonState(store, Settings(holder, lease, heartbeat), LocalJobs(jobs, {}),
                       Runs(None, lambda: None), SlotBook(store, holder, Events()),
                       outage=outage or Outage())


#: The name every thread of the test harness's own servers starts with (a
#: test's HTTP hooks and their request threads, the database proxy's pumps, the
#: notify socket's reader): :func:`invoke` tells them from the command's. A
#: daemon process may send to a hook while a command runs in this process; the
#: thread that serves it is the test's, not the command's. dblockrun names no
#: thread so.
HARNESS_THREAD = "test harness: "


def harness_thread(target: Callable[..., object], *args: object, what: str) -> threading.Thread:
    """Start a daemon thread of the test harness (``target(*args)``), named
    :data:`HARNESS_THREAD` + ``what`` from its creation on."""
    thread = threading.Thread(target=target, args=args, name=HARNESS_THREAD + what, daemon=True)
    thread.start()
    return thread


#: The prefix of a command that only builds (an image, a wheel, the docs
#: site): it takes the CPU a daemon of another test's worker does not need
#: now, so the daemons measured against one-second slots are not starved
#: by it on a two-core machine.
NICENESS = 10
LOW_PRIORITY = ["nice", "-n", str(NICENESS)]


def at_low_priority(work: Callable[[], T]) -> T:
    """``work()`` in a thread at :data:`NICENESS`, as :data:`LOW_PRIORITY` does
    for one command: every process it starts inherits it (on Linux a
    nice value belongs to a thread, and a child takes its forking
    thread's); the calling thread's own stays as it was."""
    done: list[T] = []
    failed: list[BaseException] = []

    def low() -> None:
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, max(NICENESS, os.getpriority(os.PRIO_PROCESS, me)))
        try:
            done.append(work())
        except BaseException as e:  # re-raised in the caller's thread
            failed.append(e)

    harness_thread(low, what="low priority work").join()
    if failed:
        raise failed[0]
    return done[0]


def wait_for(
    predicate: Callable[[], T | None | bool],
    timeout: float,
    interval: float = 0.05,
    what: str = "",
) -> T:
    """Call `predicate` until it returns something other than None or False.

    Returns that value (so `0` from `Popen.poll` counts as done). Raises
    AssertionError naming `what` if the deadline passes first. Exceptions from
    the predicate propagate. Use this instead of sleeping in tests.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result is not None and result is not False:
            return result  # type: ignore[return-value]  # True is returned as T=bool
        if time.monotonic() >= deadline:
            name = what or getattr(predicate, "__name__", repr(predicate))
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {name} (last result: {result!r})"
            )
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))


def imported_modules(stderr: str, after: str | None = None) -> set[str]:
    """Every module a process started with ``python -X importtime`` imported
    in its life, read from its ``stderr``: Python names each there as it is
    first imported (at start-up, later in a function, in any thread), a
    package after the modules it imports. ``after``: only those named after
    that one (``runpy``: what ``python -m`` runs imports, not the
    interpreter's start-up, which differs between installs)."""
    names = [line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
             if line.startswith("import time:") and "|" in line]
    if after is not None and after in names:
        names = names[names.index(after) + 1:]
    return set(names) - {"imported package"}


def pass_time(seconds: float, check: Callable[[], None] = lambda: None) -> None:
    """Let ``seconds`` pass (to show that something does NOT happen), calling
    ``check`` meanwhile so a violation fails at once."""
    end = time.monotonic() + seconds

    def done() -> bool:
        check()
        return time.monotonic() >= end

    wait_for(done, seconds + 5, interval=0.1, what=f"{seconds}s to pass")


def runs_of(store: Store, job: str, *results: str) -> list[m.RunRecord]:
    """The job's run records (with one of ``results``), oldest first."""
    return sorted((r for r in store.history(job, 1000) if not results or r.result in results),
                  key=lambda r: r.id)


def first_with(store: Store, job: str, *results: str) -> m.RunRecord | None:
    """The job's oldest record with one of ``results``."""
    found = runs_of(store, job, *results)
    return found[0] if found else None


def slots_done(store: Store, names: set[str], first: float, count: int
               ) -> dict[float, dict[str, m.RunRecord]] | None:
    """The first ``count`` slots from ``first`` once every job of ``names``
    has a finished record for each of them."""
    per_slot: dict[float, dict[str, m.RunRecord]] = {}
    for run in store.history(limit=1000):
        if run.slot is not None and run.slot >= first and run.job in names:
            per_slot.setdefault(run.slot, {})[run.job] = run
    done = sorted(s for s, runs in per_slot.items()
                  if set(runs) == names and all(r.finished is not None for r in runs.values()))
    return {s: per_slot[s] for s in done[:count]} if len(done) >= count else None


def overlaps(runs: list[m.RunRecord]) -> list[tuple[int, int]]:
    """Pairs of runs (ids) whose start-to-finish intervals overlap."""
    spans = sorted((r.started, r.finished or float("inf"), r.id) for r in runs)
    return [(a[2], b[2]) for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]


def lock_row(db: TestDb, name: str, **values: Any) -> None:
    """Set ``values`` on the job's lock row (made if missing), as a hand
    editing the table would."""
    from dblockrun.store import Store

    with Store(db.url, db.prefix) as store:
        store.ensure_jobs([name])
        locks = store.t.locks
        with store.engine.connect() as conn:
            conn.execute(locks.update().where(locks.c.name == name).values(**values))


def history_of(db: TestDb, name: str) -> list[m.RunRecord]:
    """The job's runs, newest first (as `dblockrun history` lists them)."""
    from dblockrun.store import Store

    with Store(db.url, db.prefix) as store:
        return store.history(name, 1000)


def dblockrun_cmd() -> list[str]:
    """The command line that starts dblockrun as a real process."""
    return [sys.executable, "-m", "dblockrun"]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the settings that would point a
    dblockrun process at another database, table prefix or jobs file, and
    without the test run's own (``DBLOCKRUN_TEST_*``), plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DBLOCKRUN_DB", "DBLOCKRUN_DB_FILE", "DBLOCKRUN_TABLE_PREFIX",
                        "DBLOCKRUN_JOBS") and not k.startswith("DBLOCKRUN_TEST_")}
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``dblockrun ARGS`` as a real process (from the checkout, this
    environment without dblockrun's settings, or ``env``)."""
    return subprocess.run([*dblockrun_cmd(), *args], capture_output=True, text=True,
                          env=env or clean_env(), cwd=REPO, timeout=timeout)


@dataclass(frozen=True)
class Ran:
    """What a command run in-process by :func:`invoke` did, with the
    attributes of ``subprocess.CompletedProcess`` a test reads."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


#: Signals whose handlers an in-process command must leave as it found them.
_WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD,
                    signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE)


def _sockets() -> set[str]:
    """The inodes of the sockets this process has open, but those a server
    of this process (a test's HTTP hooks, its notify socket) accepted from
    another process meanwhile: a TCP connection whose local port this
    process listens on."""
    found = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[len("socket:["):-1])
    tcp: dict[str, tuple[int, str]] = {}  # inode -> (local port, state)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[9] in found:
                    tcp[fields[9]] = (int(fields[1].rpartition(":")[2], 16), fields[3])
    listening = {port for port, state in tcp.values() if state == "0A"}
    return {i for i in found if i not in tcp or tcp[i][0] not in listening}


def invoke(*args: str, env: dict[str, str] | None = None,
           cwd: Path | str | None = None) -> Ran:
    """``dblockrun ARGS`` run in this process, as :func:`cli` runs it in a
    real one, without the ~0.15-0.5 CPU-seconds of a process's imports: the
    same entry point (``dblockrun.cli.main``'s ``cli(prog_name="dblockrun")``,
    whose click main maps errors to statuses), the same environment
    (``env``, else :func:`clean_env`: exactly that, nothing of this process's
    more), in ``cwd`` (else the checkout), and an uncaught exception's
    traceback on stderr with status 1, as Python prints it. For commands
    that are not about the process: ``exec`` (its fast start in
    ``dblockrun/__main__.py``), ``daemon``, ``web``, ``run --wait``, signals,
    what a real stderr shows at exit: :func:`cli`.

    Fails if the command left state behind in this process: a socket open
    (a pool not disposed), a signal handler changed, a thread running (but
    the harness's own, :data:`HARNESS_THREAD`: a hook serving a daemon
    process's request that came meanwhile). The
    root logger's handlers and level (``backfill`` and ``rerun`` set their
    own) are put back: a real process ends with them."""
    import logging
    import traceback

    from click.testing import CliRunner

    from dblockrun.__main__ import plain_exec
    from dblockrun.cli import cli as click_cli

    assert plain_exec(list(args)) is None, (
        "a plain exec starts in dblockrun/__main__.py's fast path: run it with cli()")
    wanted = clean_env() if env is None else env
    # CliRunner sets these for the call and puts the old values back after;
    # None removes one: the command sees exactly `wanted`.
    changes: dict[str, str | None] = {k: None for k in os.environ if k not in wanted}
    changes.update({k: v for k, v in wanted.items() if os.environ.get(k) != v})
    assert "TZ" not in changes, "TZ is read at process start: run it with cli()"
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    signals = {s: signal.getsignal(s) for s in _WATCHED_SIGNALS}
    threads = set(threading.enumerate())
    sockets = _sockets()
    here = os.getcwd()
    os.chdir(REPO if cwd is None else cwd)
    try:
        result = CliRunner().invoke(click_cli, list(args), env=changes, prog_name="dblockrun")
    finally:
        os.chdir(here)
        root.handlers[:] = handlers
        root.setLevel(level)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
    left = [f"signal {s.name}" for s, h in signals.items() if signal.getsignal(s) != h]
    left += [f"thread {t.name}" for t in set(threading.enumerate()) - threads
             if t.is_alive() and not t.name.startswith(HARNESS_THREAD)]
    if _sockets() - sockets:
        import gc

        gc.collect()  # what only the collector closes goes with it: no leak
        if _sockets() - sockets:
            left.append(f"{len(_sockets() - sockets)} socket(s) open")
    assert not left, f"dblockrun {' '.join(args)} left behind: {', '.join(left)}\n{stderr}"
    return Ran(list(args), result.exit_code, result.stdout, stderr)


def fail_next_run_inserts(store: Store, times: int) -> None:
    """MariaDB: the next ``times`` run INSERTs fail as deadlock victims (a
    MEMORY table counts them down: it is not rolled back with the INSERT)."""
    runs = store.t.runs.name
    with store.engine.connect() as conn:
        conn.exec_driver_sql(f"CREATE TABLE `{runs}_fail` (n INT) ENGINE=MEMORY")
        conn.exec_driver_sql(f"INSERT INTO `{runs}_fail` VALUES ({int(times)})")
        conn.exec_driver_sql(
            f"CREATE TRIGGER `{runs}_fail_t` BEFORE INSERT ON `{runs}` FOR EACH ROW BEGIN "
            f"IF (SELECT n FROM `{runs}_fail`) > 0 THEN "
            f"UPDATE `{runs}_fail` SET n = n - 1; "
            f"SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, "
            f"MESSAGE_TEXT = 'Deadlock found (forced by the test)'; END IF; END")


def stop_across_slots(send: Callable[[signal.Signals], None]) -> tuple[float, float]:
    """Stop a daemon (``send`` signals its process) mid-second, with no
    run of a per-second job going, and let it go on 2.3 s later, 0.7 s
    past a slot, so slots pass while it sleeps; (stop, resume) times.
    The local servers share this host's clock."""
    now = time.time()
    stop_at = math.floor(now) + (0.4 if now % 1 < 0.3 else 1.4)
    resume_at = stop_at + 2.3
    wait_for(lambda: time.time() >= stop_at, 3, interval=0.01, what="pause time")
    send(signal.SIGSTOP)
    try:
        wait_for(lambda: time.time() >= resume_at, 5, interval=0.01, what="resume time")
    finally:
        send(signal.SIGCONT)
    return stop_at, resume_at


def set_last_slot(store: Store, name: str, slot: float) -> None:
    """The job's lock row as a fleet would have left it: its last slot
    ``slot`` (made if missing), with no run record."""
    store.ensure_jobs([name])
    locks = store.t.locks
    with store.engine.begin() as conn:
        conn.execute(locks.update().where(locks.c.name == name).values(last_slot=slot))


#: A summary record's output: ``missed: 19 slots from A to B: why``.
SUMMARY = re.compile(r"^\w+: (?:more than )?(\d+) slots from (\S+) to (\S+):")


def output_of(store: Store | MemoryRunStore, record: m.RunRecord) -> str:
    full = store.run(record.id)
    return (full.output if full is not None else None) or ""


def coverage(records: list[m.RunRecord], store: Store | MemoryRunStore,
             step: float) -> Counter[float]:
    """How many records stand for each slot of a job every ``step`` seconds:
    one each, a summary record for every slot of its range."""
    count: Counter[float] = Counter()
    for r in records:
        if r.slot is None:
            continue
        found = SUMMARY.match(output_of(store, r)) if r.result in ("missed", "skipped") else None
        if found is None:
            count[r.slot] += 1
            continue
        first = datetime.fromisoformat(found.group(2)).timestamp()
        last = datetime.fromisoformat(found.group(3)).timestamp()
        assert last == r.slot, found.group(0)
        slot = first
        while slot <= last:
            count[slot] += 1
            slot += step
    return count


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` of 127.0.0.1:``port``: (status, body); (0, "") if nothing answers."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def connections_to(pid: int, port: int) -> int:
    """How many established TCP connections process ``pid`` has to ``port``
    on this host (its sockets, matched in /proc/net/tcp by inode)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                remote, state, inode = fields[2], fields[3], fields[9]
                if state == "01" and inode in inodes and int(remote.rpartition(":")[2], 16) == port:
                    count += 1
    return count


def sigint_default() -> None:
    """``preexec_fn`` of a process a test interrupts with SIGINT: SIGINT back
    to its default, so Python turns it into KeyboardInterrupt. A test run
    started in the background of a non-interactive shell (a CI runner)
    inherits SIGINT ignored, and Python keeps an ignored SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def count_statements(db: TestDb) -> None:
    """From now, count the UPDATE statements on the locks table, those that
    match no row too (a trigger per statement; PostgreSQL)."""
    import psycopg

    locks = f"{db.prefix}locks"
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {db.prefix}updates (n bigint NOT NULL)")
        conn.execute(f"INSERT INTO {db.prefix}updates VALUES (0)")
        conn.execute(f"CREATE FUNCTION {db.prefix}count() RETURNS trigger LANGUAGE plpgsql AS "
                     f"$$ BEGIN UPDATE {db.prefix}updates SET n = n + 1; RETURN NULL; END $$")
        conn.execute(f"CREATE TRIGGER {db.prefix}count AFTER UPDATE ON {locks} "
                     f"FOR EACH STATEMENT EXECUTE FUNCTION {db.prefix}count()")


def updates(db: TestDb) -> int:
    """What :func:`count_statements` (or a trigger like it) counted so far."""
    import psycopg

    with psycopg.connect(db.url, autocommit=True) as conn:
        row = conn.execute(f"SELECT n FROM {db.prefix}updates").fetchone()
        assert row is not None
        return int(row[0])
