"""Running one command: its own process group, output tail, timeouts, fencing.

The command is stopped (SIGTERM to its process group, SIGKILL after a grace)
when it reaches lock-at-most, when its lease could not be renewed for long
enough that it might expire, when its lease was taken over, or on shutdown.
"""

from __future__ import annotations

import logging
import os
import pwd
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dblockrun import spawn
from dblockrun.jobs import Command
from dblockrun.spawn import Lifeline, LineSink

log = logging.getLogger("dblockrun")

OUTPUT_TAIL = 64 * 1024
#: The longest the run's wait sleeps between looks at its lease and a stop
#: request; lock-at-most and the fence are waited for to the instant.
_LOOK_EVERY = 0.1

@dataclass
class LeaseWatch:
    """A held lock, renewed by the heartbeat, watched by the run."""

    name: str
    holder: str
    token: int
    lease: float
    last_ok: float = field(default_factory=time.monotonic)  # monotonic send time
    lost: bool = False
    pipe: Lifeline | None = None
    #: Renews the lease (True) or finds it lost (False); default: the job's lock row.
    renew: Callable[[], bool] | None = None

    def renewed(self, sent: float) -> None:
        self.last_ok = sent
        if self.pipe is not None:
            self.pipe.beat()

    def fence_at(self, margin: float) -> float:
        """Monotonic time by which the command must be gone."""
        return self.last_ok + self.lease - margin


@dataclass(frozen=True)
class Outcome:
    exit_code: int | None
    reason: str  # "exit", "timeout", "fenced", "stopped", "error"
    tail: bytes
    detail: str = ""


@dataclass(frozen=True)
class RunAs:
    """The user a job's ``user:`` key names, looked up when the command starts."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def lookup(cls, name: str) -> RunAs:
        """Raises OSError (shown as "cannot start command") if it cannot be used."""
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise OSError(f"unknown user {name!r}") from None
        if os.geteuid() != 0 and pw.pw_uid != os.geteuid():
            raise OSError(f"cannot run as user {name!r}: the daemon is not root")
        groups = tuple(os.getgrouplist(name, pw.pw_gid))
        return cls(name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {**env, "HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def cwd(self, cwd: str | None) -> str | None:
        """Like cron: in the user's home unless the job has a workdir."""
        return cwd if cwd is not None or not os.path.isdir(self.home) else self.home

    def ids(self) -> tuple[int, int, tuple[int, ...]]:
        return self.uid, self.gid, self.groups


def argv_for(command: Command, shell: str) -> list[str]:
    if isinstance(command, str):
        return [shell, "-c", command]
    return list(command)


class Tail:
    """The last ``limit`` bytes of a stream."""

    def __init__(self, limit: int = OUTPUT_TAIL) -> None:
        self.limit = limit
        self._buf = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self._buf += data
        if len(self._buf) > 2 * self.limit:
            del self._buf[: len(self._buf) - self.limit]

    def value(self) -> bytes:
        return bytes(self._buf[-self.limit :])


def group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running.

    A zombie (ended, not yet reaped) does not count: the orphans of a stopped
    command (the ``sleep`` of ``sh -c 'sleep 30; true'``) are reaped by
    init, or by whatever subreaper they are handed to, in its own time; a
    container's init may take a second, and a ``dblockrun daemon`` running
    as PID 1 never does. Waiting for them kept every such run a second
    past its end (and past lock-at-most).
    """
    if not _signal_group(pgid, 0):
        return False
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: the signal's answer, zombies and all
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold anything, ")" too.
        state, _ppid, pgrp = stat[stat.rfind(b")") + 2 :].split(b" ", 3)[:3]
        if int(pgrp) == pgid and state not in (b"Z", b"X"):
            return True
    return False


def stop_group(pgid: int, grace: float, exited: Callable[[], bool]) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace`` unless ``exited()``."""
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if exited():
            break
        time.sleep(0.02)
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


class _Output:
    """A command's output as read: each line to its stream's sink and, in
    the order read, to the tail. A sink that fails (a closed stdout) is
    dropped; the pipe is still read, so the command is never blocked on a
    full one."""

    def __init__(self) -> None:
        self.tail = Tail()

    def sink(self, to: LineSink) -> LineSink:
        live = [to]

        def emit(line: bytes) -> None:
            self.tail.add(line)
            if live:
                try:
                    live[0](line)
                except (OSError, ValueError):
                    live.clear()

        return emit


def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    on_line: LineSink,
    deadline: float | None,
    watch: LeaseWatch | None,
    stop: threading.Event,
    kill_grace: float = 5.0,
    stop_grace: Callable[[], float | None] = lambda: None,
    on_start: Callable[[int], None] | None = None,
    user: str | None = None,
    on_err_line: LineSink | None = None,
) -> Outcome:
    """Run ``argv`` in a new process group until it ends or must be stopped.

    ``on_line`` gets each line the command writes, stdout and stderr in the
    order written; with ``on_err_line`` stderr has its own pipe and its lines
    go there (the tail holds both, as read). ``deadline`` is monotonic
    (lock-at-most): the command is stopped at that instant. ``stop`` asks
    for a shutdown: the command then gets until ``stop_grace()`` (monotonic)
    before it is stopped. ``user``: run the command as that user (its groups,
    HOME, USER, LOGNAME); the spawn service that starts and watches it
    (:mod:`dblockrun.spawner`) stays with the daemon's user, so the command
    cannot kill its own watchdog. The command leads its own process group;
    with a ``watch`` the service also stops it once the lease is not
    confirmed for the fence (``lifeline`` beats), and a command that cannot
    be executed exits 127 with a message in its output; without, that is
    an error here. Either way it stops when the daemon dies.
    """
    run_as: RunAs | None = None
    if user is not None:
        try:
            run_as = RunAs.lookup(user)
        except OSError as exc:
            return Outcome(None, "error", b"", f"cannot start command: {exc}")
        env, cwd = run_as.env(env), run_as.cwd(cwd)
    fence_margin = min(kill_grace, (watch.lease / 6) if watch else kill_grace) + 1.0
    term_grace = fence_margin - 1.0
    lifeline: Lifeline | None = None
    if watch is not None:
        # The service stops the group a little after we would, from its own
        # clock: the backstop for a frozen or dead daemon.
        lifeline = Lifeline()
        watch.pipe = lifeline
    output = _Output()
    streams: list[tuple[int, LineSink]] = []
    writers: list[int] = []
    for sink in (on_line, on_err_line) if on_err_line is not None else (on_line,):
        r, w = os.pipe()
        streams.append((r, output.sink(sink)))
        writers.append(w)
    try:
        proc = spawn.start().spawn(
            argv, env=env, cwd=cwd, out_fd=writers[0], err_fd=writers[-1],
            beat_fd=lifeline.read_fd if lifeline else None,
            fence=watch.lease - fence_margin + 0.5 if watch else None, grace=term_grace,
            ids=run_as.ids() if run_as else None, streams=streams)
    except OSError as exc:
        for r, _sink in streams:
            os.close(r)
        if lifeline is not None:
            lifeline.close()
        return Outcome(None, "error", b"", f"cannot start command: {exc}")
    finally:
        for w in writers:
            os.close(w)
    if lifeline is not None:
        lifeline.handed_over()
    pgid = proc.pid
    if on_start is not None:
        on_start(pgid)
    reason = "exit"
    detail = ""
    try:
        while not proc.wait(_wait_time(deadline, watch, fence_margin)):
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                reason, detail = "timeout", "reached lock-at-most"
            elif watch is not None and watch.lost:
                reason, detail = "fenced", "lock was taken over (fencing token changed)"
                term_grace = 0.0
            elif watch is not None and now >= watch.fence_at(fence_margin):
                reason, detail = "fenced", "lease could not be renewed before it expired"
            elif stop.is_set():
                until = stop_grace()
                if until is None or now < until:
                    continue
                reason, detail = "stopped", "shutdown grace ran out"
            else:
                continue
            proc.stop(term_grace if reason == "fenced" else kill_grace)
            break
    finally:
        if not proc.wait(0):
            proc.kill()
        if proc.orphaned:
            # The service died: no watchdog, so no command (its leader died
            # with the service; the rest of its group goes now).
            reason, detail = "stopped", "the spawn service died; the command cannot run unwatched"
            stop_group(pgid, term_grace, lambda: not group_running(pgid))
        # Background children left in the group go with the run (SIGTERM,
        # SIGKILL once none runs or after 1 s; zombies are not waited for).
        if _signal_group(pgid, 0):
            stop_group(pgid, 1.0, lambda: not group_running(pgid))
        proc.finish_output(timeout=2.0)
        if lifeline is not None:
            lifeline.close()
    return Outcome(proc.returncode, reason, output.tail.value(), detail)


def _wait_time(deadline: float | None, watch: LeaseWatch | None, fence_margin: float) -> float:
    """How long the run's wait may sleep: until lock-at-most or the fence if
    one comes first, else a look at the lease and a stop request."""
    now = time.monotonic()
    wait = _LOOK_EVERY
    if deadline is not None:
        wait = min(wait, deadline - now)
    if watch is not None:
        wait = min(wait, watch.fence_at(fence_margin) - now)
    return max(0.0, wait)
