"""The one harness for the real processes a test starts.

:class:`Fleet` starts real ``dblockrun daemon`` processes on one database
(URL and table prefix) with the options a test gives (and other long-running
commands: ``web``...), each logging to a file in the test's folder. Each is
a :class:`Process`: read its log, wait for a line or a condition with a
deadline (failing at once, with the log, if it exits meanwhile), signal it,
freeze and thaw it (SIGSTOP, SIGCONT), kill it (SIGKILL), stop it (SIGTERM)
for its exit status, read its metrics server. The ``fleet`` fixture
(conftest) gives a test a Fleet on its database and kills what is left at
its end; a Fleet also reads the records (:meth:`Fleet.runs`) and runs the
CLI on the same database (:meth:`Fleet.cli`).

Every process started here, or handed to :func:`track`, is tracked until it
is reaped. Nothing is left behind when the test run itself is stopped:
:func:`stop_on_signals` (conftest) turns SIGTERM into the same interruption
as SIGINT, so the fixtures tear down, and :func:`reap_all` (at the end of
the session, and at exit) continues and stops every process still running:
a frozen daemon would otherwise never act on the signal its process group
got, and stay behind stopped (state ``T``).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from helpers import (
    Ran,
    TestDb,
    clean_env,
    dblockrun_cmd,
    free_port,
    harness_thread,
    http_get,
    invoke,
    new_prefix,
    wait_for,
)

from dblockrun.store import Store
from dblockrun.store import models as m

T = TypeVar("T")
P = TypeVar("P", bound="subprocess.Popen[Any]")

#: Every process started through this module (or tracked) and not yet reaped, by pid.
_LIVE: dict[int, subprocess.Popen[Any]] = {}

#: How long :func:`reap_all` lets the processes it stopped end before SIGKILL.
REAP_GRACE = 10.0


def track(proc: P) -> P:
    """Keep ``proc`` on the list of processes stopped if the run is interrupted."""
    _LIVE[proc.pid] = proc
    return proc


def spawn(argv: Sequence[str], log: Path, *, env: dict[str, str] | None = None,
          cwd: Path | None = None, stdout_to_log: bool = False,
          append: bool = False) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stderr (and stdout, else /dev/null) into ``log``
    (truncated, or appended to); tracked."""
    with log.open("ab" if append else "wb") as out:
        return track(subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL,
            stdout=out if stdout_to_log else subprocess.DEVNULL, stderr=out,
            env=env if env is not None else clean_env(PYTHONUNBUFFERED="1"), cwd=cwd))


def _reaped(proc: subprocess.Popen[Any]) -> bool:
    if proc.poll() is None:
        return False
    _LIVE.pop(proc.pid, None)
    return True


def end(proc: subprocess.Popen[Any], timeout: float, *, signalled: bool = False) -> int | None:
    """SIGCONT and SIGTERM to ``proc`` if it still runs (unless ``signalled``
    already: a daemon that has restored its handlers on the way out would die
    of a second SIGTERM), and its exit status within ``timeout``; None if it
    had to be killed then (SIGKILL)."""
    if proc.poll() is None and not signalled:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None
    finally:
        _reaped(proc)


def reap_all(grace: float = REAP_GRACE) -> list[int]:
    """Stop every tracked process still running: SIGCONT (a frozen one acts
    on no other signal) and SIGTERM, SIGKILL after ``grace``; reap them.
    Returns the pids that were still running."""
    left = [p for p in list(_LIVE.values()) if not _reaped(p)]
    for proc in left:
        try:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for proc in left:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _reaped(proc)
    return [p.pid for p in left]


atexit.register(reap_all)


class Interrupted(KeyboardInterrupt):
    """The test run got SIGTERM: it ends as on SIGINT, its fixtures torn down."""


def _terminated(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the run is ending already
    raise Interrupted(f"signal {signal.Signals(signum).name}")


def stop_on_signals() -> None:
    """SIGTERM interrupts this process as SIGINT does (pytest then tears the
    fixtures down and ends the session; :func:`reap_all` runs at its end)."""
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _terminated)


class Process:
    """One process a test started, its output in a log file: mostly a
    ``dblockrun daemon`` (:meth:`Fleet.start`)."""

    def __init__(self, argv: Sequence[str], log: Path, *, env: dict[str, str] | None = None,
                 cwd: Path | None = None, stdout_to_log: bool = False,
                 append: bool = False) -> None:
        self.argv = list(argv)
        self.log = log
        self._jobs: Path | None = None
        #: Its ``--metrics`` port (a daemon a Fleet started with ``metrics=True``).
        self.port: int | None = None
        self.proc = spawn(self.argv, log, env=env, cwd=cwd, stdout_to_log=stdout_to_log,
                          append=append)

    def __repr__(self) -> str:
        return f"<Process pid {self.pid} log {self.log}>"

    @property
    def jobs(self) -> Path:
        """Its jobs file (a daemon a Fleet started)."""
        assert self._jobs is not None, f"{self} was not started on a jobs file"
        return self._jobs

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def text(self) -> str:
        """Its log so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, sig: signal.Signals) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def freeze(self) -> None:
        """SIGSTOP: it runs no more (nor renews a lease) until :meth:`thaw`."""
        self.send(signal.SIGSTOP)

    def thaw(self) -> None:
        self.send(signal.SIGCONT)

    def wait(self, predicate: Callable[[], T | None | bool], timeout: float, what: str,
             interval: float = 0.05) -> T:
        """:func:`helpers.wait_for` that fails at once, with the log, if the
        process exits meanwhile."""

        def check() -> T | None | bool:
            if not self.alive():
                raise AssertionError(f"daemon exited {self.proc.returncode} while waiting "
                                     f"for {what}; log:\n{self.text()}")
            return predicate()

        return wait_for(check, timeout, interval=interval, what=what)

    def wait_log(self, pattern: str | re.Pattern[str], timeout: float = 20,
                 what: str = "") -> re.Match[str]:
        """The first match of ``pattern`` (a substring, or a regular
        expression) in its log, waited for."""
        regex = re.compile(re.escape(pattern)) if isinstance(pattern, str) else pattern
        return self.wait(lambda: regex.search(self.text()), timeout,
                         what=what or f"{regex.pattern!r} in {self.log.name}")

    def get(self, path: str) -> tuple[int, str]:
        """GET ``path`` of its metrics server (``/metrics``, ``/healthz``):
        (status, body); (0, "") if nothing answers."""
        assert self.port is not None, f"{self} has no --metrics port"
        return http_get(self.port, path)

    def exited(self, timeout: float) -> int:
        """Its exit status, waited for (no signal sent)."""
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            _reaped(self.proc)

    def stop(self, timeout: float = 30, *, signalled: bool = False) -> int | None:
        """SIGCONT and SIGTERM (unless ``signalled`` so already); its exit
        status, None if it had to be killed after ``timeout``."""
        return end(self.proc, timeout, signalled=signalled)

    def kill(self) -> int:
        """SIGKILL (kill -9), reaped."""
        if self.alive():
            self.proc.kill()
        return self.exited(10)


def database_options(url: str | None, prefix: str | None) -> list[str]:
    """``--db URL --table-prefix PREFIX``, each only if given."""
    return [*(["--db", url] if url is not None else []),
            *(["--table-prefix", prefix] if prefix is not None else [])]


def daemon_argv(database: Sequence[str], jobs: Path | str, *options: str,
                before: Sequence[str] = (), program: Sequence[str] | None = None) -> list[str]:
    """``python -m dblockrun`` (or ``program``), the global options
    ``database`` and ``before``, ``daemon JOBS`` and ``options``."""
    return [*(program if program is not None else dblockrun_cmd()), *database, *before,
            "daemon", str(jobs), *options]


class _Same(Enum):
    SAME = "the fleet's"


SAME = _Same.SAME
Option = str | None | _Same


class Fleet:
    """The daemons of one test on one database (``db``'s URL and table
    prefix, or ``url``/``prefix``: a new prefix if neither gives one; no
    ``--db`` without a URL), each with its log in ``workdir``
    (``<name>.log``; names ``d0``, ``d1``... by default).

    Each daemon gets ``--heartbeat``, ``--lease`` and ``--grace`` (the
    fleet's defaults, changed per daemon; None leaves the option out) and
    the options a test adds; ``before`` goes before the ``daemon`` command
    (global options), ``program`` replaces ``python -m dblockrun`` (a
    wrapper, a prelude). :meth:`close` (the fixture's end) kills whatever
    is still running.
    """

    def __init__(self, db: TestDb | None, workdir: Path, *, url: str | None = None,
                 prefix: str | None = None, heartbeat: str | None = "1s",
                 lease: str | None = "6s", grace: str | None = "5s") -> None:
        self.db = db
        self.workdir = workdir
        self.url = url if url is not None else (db.url if db is not None else None)
        self.prefix = prefix or (db.prefix if db is not None else new_prefix())
        self.timing = {"--heartbeat": heartbeat, "--lease": lease, "--grace": grace}
        self.daemons: list[Process] = []

    def __iter__(self) -> Iterator[Process]:
        return iter(self.daemons)

    def __len__(self) -> int:
        return len(self.daemons)

    def __getitem__(self, i: int) -> Process:
        return self.daemons[i]

    def database(self, url: str | None = None) -> list[str]:
        """The global options that point dblockrun at the fleet's database."""
        return database_options(url if url is not None else self.url, self.prefix)

    def jobs_file(self, text: str, name: str = "jobs.yaml") -> Path:
        """Write ``text`` (a whole jobs file: lines, not a path) to ``name`` in the folder."""
        if "\n" not in text:
            raise ValueError(f"the text of a jobs file, not a path: {text!r} (give a Path)")
        path = self.workdir / name
        path.write_text(text)
        return path

    def argv(self, jobs: Path | str, *options: str, url: str | None = None,
             heartbeat: Option = SAME, lease: Option = SAME, grace: Option = SAME,
             before: Sequence[str] = (), program: Sequence[str] | None = None) -> list[str]:
        """The command line of a daemon (:meth:`start` takes the same arguments)."""
        timing: list[str] = []
        for option, value in (("--heartbeat", heartbeat), ("--lease", lease),
                              ("--grace", grace)):
            chosen = self.timing[option] if value is SAME else value
            if chosen is not None:
                assert isinstance(chosen, str)
                timing += [option, chosen]
        return daemon_argv(self.database(url), jobs, *timing, *options, before=before,
                           program=program)

    def start(self, jobs: Path | str, *options: str, name: str | None = None,
              log: Path | None = None, url: str | None = None, heartbeat: Option = SAME,
              lease: Option = SAME, grace: Option = SAME, before: Sequence[str] = (),
              program: Sequence[str] | None = None, env: dict[str, str] | None = None,
              cwd: Path | None = None, stdout_to_log: bool = False,
              metrics: bool = False, append: bool = False) -> Process:
        """Start one daemon on ``jobs`` (a file, or the text of one, written
        to ``jobs.yaml`` in the folder); its environment this one's without
        dblockrun's settings (:func:`helpers.clean_env`), or ``env``; it
        runs in the folder, or ``cwd``. ``metrics``: with ``--metrics`` on
        a free port of 127.0.0.1 (:meth:`Process.get`). ``append``: to
        the log (a daemon started again), not over it."""
        if isinstance(jobs, str):
            jobs = self.jobs_file(jobs)
        name = name or f"d{len(self.daemons)}"
        port = free_port() if metrics else None
        if port is not None:
            options = ("--metrics", f"127.0.0.1:{port}", *options)
        daemon = Process(
            self.argv(jobs, *options, url=url, heartbeat=heartbeat, lease=lease, grace=grace,
                      before=before, program=program),
            log or self.workdir / f"{name}.log", env=env,
            cwd=cwd if cwd is not None else self.workdir, stdout_to_log=stdout_to_log,
            append=append)
        daemon._jobs = jobs
        daemon.port = port
        self.daemons.append(daemon)
        return daemon

    @contextlib.contextmanager
    def running(self, jobs: Path | str, *options: str, **kwargs: Any) -> Iterator[Process]:
        """:meth:`start` for a ``with`` block: the daemon is stopped (SIGTERM)
        when the block ends."""
        daemon = self.start(jobs, *options, **kwargs)
        try:
            yield daemon
        finally:
            daemon.stop()

    def command(self, *args: str, name: str, env: dict[str, str] | None = None,
                cwd: Path | None = None, stdout_to_log: bool = True) -> Process:
        """Another long-running dblockrun command on the fleet's database
        (``web``, ``tail``...), logging to ``<name>.log``; one of the
        fleet's processes from then on (stopped and killed with them)."""
        process = Process([*dblockrun_cmd(), *self.database(), *args],
                         self.workdir / f"{name}.log", env=env,
                         cwd=cwd if cwd is not None else self.workdir,
                         stdout_to_log=stdout_to_log)
        self.daemons.append(process)
        return process

    def start_n(self, n: int, jobs: Path | str, *options: str, **kwargs: Any) -> list[Process]:
        """``n`` daemons alike (:meth:`start`'s arguments), named by their index."""
        if isinstance(jobs, str):
            jobs = self.jobs_file(jobs)
        return [self.start(jobs, *options, **kwargs) for _ in range(n)]

    def of(self, holder: str) -> Process:
        """The daemon a host id (``host:pid:hex``) names."""
        pid = int(holder.split(":")[1])
        return next(d for d in self.daemons if d.pid == pid)

    @functools.cached_property
    def store(self) -> Store:
        """A store on the fleet's database, directly (not through ``url``, a
        proxy's); closed by :meth:`close`."""
        assert self.url is not None
        return Store(self.url if self.db is None else self.db.url, self.prefix)

    def runs(self, job: str, *results: str) -> list[m.RunRecord]:
        """The job's records (with one of ``results``), oldest first."""
        return sorted((r for r in self.store.history(job, 1000)
                       if not results or r.result in results), key=lambda r: r.id)

    def cli(self, *args: str, timeout: float = 60, env: dict[str, str] | None = None,
            process: bool = False) -> subprocess.CompletedProcess[str] | Ran:
        """``dblockrun ARGS`` on the fleet's database, as an operator runs it:
        in this process (helpers.invoke: the daemons are the processes, the
        operator's command need not be one), or with ``process`` a real
        process (its exit status, its stderr at exit, ``exec``, ``run
        --wait``: what a test says of the process; ``timeout`` is its)."""
        if not process:
            return invoke(*self.database(), *args,
                          env=env if env is not None else clean_env(), cwd=self.workdir)
        return subprocess.run([*dblockrun_cmd(), *self.database(), *args], capture_output=True,
                              text=True, timeout=timeout,
                              env=env if env is not None else clean_env(), cwd=self.workdir)

    def stop(self, timeout: float = 30) -> list[int | None]:
        """SIGTERM every daemon at once (continued first, if frozen); their
        exit statuses in start order, None for one killed after ``timeout``."""
        for d in self.daemons:
            d.thaw()
            d.send(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        return [end(d.proc, max(0.0, deadline - time.monotonic()), signalled=True)
                for d in self.daemons]

    def close(self) -> None:
        """Kill what still runs; close the store."""
        for d in self.daemons:
            d.kill()
        if "store" in self.__dict__:
            self.store.close()


class NotifySocket:
    """The socket systemd listens on for a daemon's ``NOTIFY_SOCKET``
    messages, read all the time as systemd does (a full queue would block
    the daemon's next message), and read to the end whenever a test looks:
    each message with when it came (the kernel's receive time, on the
    ``time.time()`` scale: a test process slow to read does not move it)."""

    _TIMEVAL = struct.Struct("@ll")
    #: Linux's SO_TIMESTAMP (and SCM_TIMESTAMP), which Python's socket module
    #: does not name: a struct timeval of each datagram's arrival.
    _SO_TIMESTAMP = 29

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setsockopt(socket.SOL_SOCKET, self._SO_TIMESTAMP, 1)
        self._messages: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._closed = False
        harness_thread(self._read, what=f"notify socket {path.name}")

    def _drain(self) -> None:
        """Every message waiting in the socket (under the lock)."""
        while True:
            try:
                data, ancillary, _flags, _addr = self.sock.recvmsg(
                    4096, socket.CMSG_SPACE(self._TIMEVAL.size), socket.MSG_DONTWAIT)
            except (BlockingIOError, OSError):
                return
            at = time.time()
            for level, kind, value in ancillary:
                if (level, kind) == (socket.SOL_SOCKET, self._SO_TIMESTAMP):
                    seconds, micros = self._TIMEVAL.unpack(value[:self._TIMEVAL.size])
                    at = seconds + micros / 1e6
            self._messages.append((at, data.decode()))

    def _read(self) -> None:
        while not self._closed:
            with self._lock:
                self._drain()
            time.sleep(0.05)

    @property
    def messages(self) -> list[tuple[float, str]]:
        """(when, text) of each message so far."""
        with self._lock:
            self._drain()
            return list(self._messages)

    def texts(self) -> list[str]:
        return [text for _at, text in self.messages]

    def has(self, line: str) -> bool:
        """Whether a message so far has ``line`` as one of its lines."""
        return any(line in text.split("\n") for text in self.texts())

    def count(self, text: str) -> int:
        """How many messages so far were exactly ``text``."""
        return self.texts().count(text)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self.sock.close()


#: Python code that makes its process a child subreaper (the attribute
#: survives execve): the orphans of what it starts come to it, as to an init
#: or a container's PID 1.
SUBREAPER_PRELUDE = (
    "import ctypes, os, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:\n"
    "    raise OSError(ctypes.get_errno(), 'PR_SET_CHILD_SUBREAPER')\n")


def as_subreaper(argv: list[str]) -> list[str]:
    """``argv`` (``python ...``) run as a child subreaper."""
    assert argv[0] == sys.executable
    return [sys.executable, "-c",
            SUBREAPER_PRELUDE + "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n",
            *argv[1:]]


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after ``pid (comm)`` (comm may hold
    spaces): state, ppid, pgrp, session...; None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def state(pid: int) -> str | None:
    """The process's state letter (``R``, ``S``, ``T`` stopped, ``Z``...), None if gone."""
    fields = _stat(pid)
    return fields[0] if fields else None


def parent_of(pid: int) -> int:
    fields = _stat(pid)
    assert fields is not None, f"no process {pid}"
    return int(fields[1])


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid``."""
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None
            and int(fields[1]) == pid]


def descendants(pid: int) -> list[int]:
    """``pid``'s children, theirs, and so on."""
    found: list[int] = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return found


def comm(pid: int) -> str:
    """The process's command name, "" if gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a process (a zombie counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left for its parent to reap counts as gone)."""
    return state(pid) not in (None, "Z", "X")
