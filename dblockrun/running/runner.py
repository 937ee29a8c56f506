"""Running one command: its own process group, output tail, timeouts, fencing.

The command is stopped (SIGTERM to its process group, SIGKILL after a grace)
when it reaches lock-at-most, when its lease could not be renewed for long
enough that it might expire, when its lease was taken over, when an operator
killed it (``dblockrun kill``, learnt with a renewal), or on shutdown.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dblockrun.durations import fence_margin
from dblockrun.jobs import Command, Limits
from dblockrun.redact import Pieces
from dblockrun.running import spawn
from dblockrun.running.spawn import MAX_LINE, Lifeline, LineSink

if TYPE_CHECKING:
    from dblockrun.running.resources import Applied

log = logging.getLogger("dblockrun")

OUTPUT_TAIL = 64 * 1024
#: The longest the run's wait sleeps between looks at its lease and a stop
#: request; lock-at-most and the fence are waited for to the instant.
#: Why a shutdown stopped a command (its record's output ends with it).
GRACE_RAN_OUT = "shutdown grace ran out"
#: ... when a second SIGINT (Ctrl-C again) ended the grace.
SECOND_INTERRUPT = "stopped by a second interrupt"

LOOK_EVERY = 0.1

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
    #: A string: renewed, and an operator asked to kill the run (who and why).
    renew: Callable[[], bool | str] | None = None
    #: ``dblockrun kill``: who asked and why, learnt with a renewal.
    killed: str | None = None
    #: A group's seat held with the lock (dblockrun/scheduling/limits.py): (row, token),
    #: renewed with it; the lease is lost if either is.
    seat: tuple[str, int] | None = None
    #: The running attempt's output, written with the renewals (None: none yet).
    output: LiveOutput | None = None
    #: Why the last renewal failed (None: it did not): said if the lease runs out.
    failing: str | None = None

    def rows(self) -> list[tuple[str, int]]:
        """The lock rows this lease renews: (name, token) each."""
        return [(self.name, self.token)] + ([self.seat] if self.seat is not None else [])

    def renewed(self, sent: float) -> None:
        self.last_ok = sent
        self.failing = None
        if self.pipe is not None:
            self.pipe.beat(sent)

    def fence_at(self, margin: float) -> float:
        """Monotonic time by which the command must be gone."""
        return self.last_ok + self.lease - margin


@dataclass(frozen=True)
class ProcessEnd:
    exit_code: int | None
    #: "exit", "timeout", "fenced", "stopped", "killed", "error", or "limit"
    #: (ended by one of the job's limits: ``detail`` says which).
    reason: str
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
    shell: str = "/bin/sh"

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
        return cls(name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir, pw.pw_shell or "/bin/sh")

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` (runjob.base_env's: the daemon's user's HOME, USER, LOGNAME
        and SHELL left out) on top of the user's login variables."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name, "SHELL": self.shell,
                **env}

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
    """The last ``limit`` bytes of a stream, cut at a character's start
    (a UTF-8 sequence split by the cut is left out, not decoded into
    U+FFFD). Thread-safe: the spawn reactor adds, the heartbeat reads
    (:class:`LiveOutput`)."""

    def __init__(self, limit: int = OUTPUT_TAIL) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._lock = threading.Lock()
        #: Bytes added so far: the tail changed when this did.
        self.total = 0

    def add(self, data: bytes) -> None:
        with self._lock:
            self.total += len(data)
            self._buf += data
            if len(self._buf) > 2 * self.limit:
                del self._buf[: len(self._buf) - self.limit]

    def value(self) -> bytes:
        return self.read()[1]

    def read(self) -> tuple[int, bytes]:
        """(:attr:`total`, the tail) as of one instant."""
        with self._lock:
            total, tail = self.total, bytes(self._buf[-self.limit :])
        if total > len(tail):  # cut: skip a split character's continuation bytes
            start = 0
            while start < min(3, len(tail)) and tail[start] & 0xC0 == 0x80:
                start += 1
            tail = tail[start:]
        return total, tail


def stored_text(data: bytes) -> str:
    """Command output as the runs table keeps it: UTF-8 with bad bytes
    replaced, and NUL (which PostgreSQL text cannot hold) as U+FFFD."""
    return data.decode("utf-8", "replace").replace("\x00", "\ufffd")


class LiveOutput:
    """A running attempt's output tail, as its run record shows it while it
    runs (``runs.output`` of a ``running`` run): the heartbeat writes it
    with the lease's renewal (:class:`~dblockrun.running.heartbeat.Renewer`)
    when it grew since the last write, and the run's result then replaces it."""

    def __init__(self, run_ids: Sequence[int], tail: Tail) -> None:
        #: Its run records: one, or a fan-out batch's (one per item).
        self.run_ids = tuple(run_ids)
        self._tail = tail
        #: The tail's total as last written (0: nothing yet), and when (monotonic).
        self._written = 0
        self.written_at = 0.0
        self._given_up = False

    def fresh(self) -> tuple[int, str] | None:
        """(its total, the tail's text) if it changed since it was last
        :meth:`written`, else None: an unchanged tail is not copied."""
        if self._tail.total == self._written or self._given_up:
            return None
        total, data = self._tail.read()
        return total, stored_text(data)

    def give_up(self) -> None:
        """Write it no more (its write failed a renewal)."""
        self._given_up = True

    def written(self, total: int) -> None:
        self._written = max(self._written, total)
        self.written_at = time.monotonic()


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
    the order read, to the tail, its credentials hidden first
    (dblockrun/redact.py ``Pieces``: before the tail cuts it, so no cut
    leaves half a password unrecognised). A sink that fails (a closed
    stdout) is dropped; the pipe is still read, so the command is never
    blocked on a full one."""

    def __init__(self) -> None:
        self.tail = Tail()

    def sink(self, to: LineSink) -> LineSink:
        live = [to]
        redacted = Pieces(MAX_LINE)

        def emit(line: bytes) -> None:
            self.tail.add(redacted(line))
            if live:
                try:
                    live[0](line)
                except (OSError, ValueError):
                    live.clear()

        return emit


class Process:
    """One command from its start to its outcome, waiting for nothing:
    :meth:`start` starts it, :meth:`check` applies the stops due at a time
    and says when to look again, :meth:`finish` collects the outcome once it
    ended. :func:`run_process` drives one on the caller's thread; a daemon's
    :class:`~dblockrun.running.runloop.RunLoop` drives all its runs from one thread.

    ``on_line`` gets each line the command writes, stdout and stderr in the
    order written; with ``on_err_line`` stderr has its own pipe and its lines
    go there (the tail holds both, as read). ``deadline`` is monotonic
    (lock-at-most): the command is stopped at that instant. ``stop`` asks
    for a shutdown: the command then gets until ``stop_grace()`` (monotonic)
    before it is stopped, the record then saying ``stop_why()``. ``user``:
    run the command as that user (its groups, HOME, USER, LOGNAME); the spawn
    service that starts and watches it
    (:mod:`dblockrun.running.spawner`) stays with the daemon's user, so the command
    cannot kill its own watchdog. The command leads its own process group;
    with a ``watch`` the service also stops it once the lease is not
    confirmed for the fence (``lifeline`` beats), and a command that cannot
    be executed exits 127 with a message in its output; without, that is
    an error here. Either way it stops when the daemon dies. ``limits``:
    the job's (``name``), set in the command's process before it starts
    (dblockrun/running/resources.py); a run one of them ended says which.
    """

    def __init__(
        self,
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
        stop_why: Callable[[], str] = lambda: GRACE_RAN_OUT,
        on_start: Callable[[int], None] | None = None,
        user: str | None = None,
        on_err_line: LineSink | None = None,
        limits: Limits | None = None,
        name: str = "command",
    ) -> None:
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.on_line = on_line
        self.on_err_line = on_err_line
        self.deadline = deadline
        self.watch = watch
        self.stop = stop
        self.kill_grace = kill_grace
        self.stop_grace = stop_grace
        self.stop_why = stop_why
        self.on_start = on_start
        self.user = user
        self.limits = limits
        self.name = name
        #: Its limits as set, and its cgroup (None: no limits).
        self.applied: Applied | None = None
        self.fence_margin = fence_margin(watch.lease, kill_grace) if watch else kill_grace + 1.0
        self.term_grace = self.fence_margin - 1.0
        self.reason = "exit"
        self.detail = ""
        self.proc: spawn.Spawned | None = None
        self.output = _Output()
        self.lifeline: Lifeline | None = None
        #: Stopping: SIGTERM sent, SIGKILL due at this monotonic time.
        self._kill_at: float | None = None
        self._stopping = False
        self._lock = threading.Lock()

    def start(self, on_end: Callable[[], None] | None = None) -> ProcessEnd | None:
        """Start the command; None, or the outcome if it could not start.
        ``on_end`` is called (by the spawn reactor: it must not block) once
        the command ended."""
        env, cwd = self.env, self.cwd
        run_as: RunAs | None = None
        if self.user is not None:
            try:
                run_as = RunAs.lookup(self.user)
            except OSError as exc:
                return ProcessEnd(None, "error", b"", f"cannot start command: {exc}")
            env, cwd = run_as.env(env), run_as.cwd(cwd)
        if self.limits is not None and self.limits.any:
            from dblockrun.running import resources  # not for a job without (nor exec)

            try:
                self.applied = resources.apply(self.limits, self.name)
            except OSError as exc:
                return ProcessEnd(None, "error", b"", "cannot start command: limits: cannot make "
                               f"its cgroup: {exc.strerror or exc}")
        watch = self.watch
        if watch is not None:
            # The service stops the group a little after we would, from its own
            # clock: the backstop for a frozen or dead daemon.
            self.lifeline = Lifeline()
            watch.pipe = self.lifeline
        streams: list[tuple[int, LineSink]] = []
        writers: list[int] = []
        sinks = (self.on_line,) if self.on_err_line is None else (self.on_line, self.on_err_line)
        for sink in sinks:
            r, w = os.pipe()
            streams.append((r, self.output.sink(sink)))
            writers.append(w)
        # The command may end before spawn() returns: its end is passed on
        # once self.proc is set.
        ended_early: list[bool] = []

        def end() -> None:
            with self._lock:
                if self.proc is None:
                    ended_early.append(True)
                    return
            if on_end is not None:
                on_end()

        # The lifeline's read end stays open from the request to its handover.
        with self.lifeline.lock if self.lifeline is not None else contextlib.nullcontext():
            try:
                if self.lifeline is not None and self.lifeline.read_fd < 0:
                    raise OSError(errno.EBADF, "the run was stopped before its command started")
                proc = spawn.start().spawn(
                    self.argv, env=env, cwd=cwd, out_fd=writers[0], err_fd=writers[-1],
                    beat_fd=self.lifeline.read_fd if self.lifeline else None,
                    fence=watch.lease - self.fence_margin + 0.5 if watch else None,
                    since=watch.last_ok if watch else None,
                    grace=self.term_grace, ids=run_as.ids() if run_as else None,
                    streams=streams, on_end=end,
                    limits=self.applied.request if self.applied is not None else None)
            except OSError as exc:
                for r, _sink in streams:
                    os.close(r)
                if self.lifeline is not None:
                    self.lifeline.close()
                if self.applied is not None:
                    self.applied.close()
                if isinstance(exc, spawn.LeaseRanOut):
                    return ProcessEnd(None, "fenced", b"", str(exc.strerror))
                if isinstance(exc, spawn.LimitRefused) and self.applied is not None:
                    return ProcessEnd(None, "error", b"", "cannot start command: limits: "
                                   + self.applied.refused(exc.key, exc))
                return ProcessEnd(None, "error", b"", f"cannot start command: {exc}")
            finally:
                for w in writers:
                    os.close(w)
            with self._lock:
                self.proc = proc
            if self.lifeline is not None:
                self.lifeline.handed_over()
        if self.on_start is not None:
            self.on_start(proc.pid)
        if ended_early and on_end is not None:
            on_end()
        return None

    def wait(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: until it ends); whether the command ended."""
        assert self.proc is not None
        return self.proc.wait(timeout)

    def check(self, now: float) -> float | None:
        """Apply the stops due at monotonic ``now``: lock-at-most, a kill, a lease
        taken over, the fence, the shutdown grace. Seconds until the next look
        (None: the command ended)."""
        proc, watch, deadline = self.proc, self.watch, self.deadline
        assert proc is not None
        with self._lock:
            if proc.wait(0):
                return None
            if self._stopping:
                if self._kill_at is not None and now >= self._kill_at:
                    proc.signal(signal.SIGKILL)
                    self._kill_at = None
                return LOOK_EVERY if self._kill_at is None else self._kill_at - now
            if deadline is not None and now >= deadline:
                self.reason, self.detail = "timeout", "reached lock-at-most"
            elif watch is not None and watch.killed is not None:
                self.reason, self.detail = "killed", f"killed by {watch.killed}"
            elif watch is not None and watch.lost:
                self.reason, self.detail = "fenced", "lock was taken over (fencing token changed)"
                self.term_grace = 0.0
            elif watch is not None and now >= watch.fence_at(self.fence_margin):
                self.reason, self.detail = "fenced", "lease could not be renewed before it expired"
                if watch.failing:  # a database outage, rows another session holds ...
                    self.detail += f" ({watch.failing})"
            elif self.stop.is_set() and ((until := self.stop_grace()) is None or now >= until):
                self.reason, self.detail = "stopped", self.stop_why()
            else:
                return _wait_time(deadline, watch, self.fence_margin)
            self._stopping = True
            grace = self.term_grace if self.reason == "fenced" else self.kill_grace
            proc.signal(signal.SIGTERM)
            self._kill_at = now + grace
            return grace

    def finish(self) -> ProcessEnd:
        """The outcome, once the command ended (else it is killed now); what
        is left of its group goes, and its output is read to the end."""
        proc = self.proc
        assert proc is not None
        with self._lock:
            stopped = self._stopping
        if not proc.wait(0) or stopped:
            proc.kill()  # a stopped command's group goes whole, at once
        pgid = proc.pid
        if proc.orphaned:
            # The service died: no watchdog, so no command: its whole group
            # goes now.
            self.reason = "stopped"
            self.detail = "the spawn service died; the command cannot run unwatched"
            stop_group(pgid, self.term_grace, lambda: not group_running(pgid))
        # Background children left in the group go with the run (SIGTERM,
        # SIGKILL once none runs or after 1 s; zombies are not waited for).
        if _signal_group(pgid, 0):
            stop_group(pgid, 1.0, lambda: not group_running(pgid))
        applied = self.applied
        if applied is not None and applied.group is not None:
            applied.group.kill()  # and those that left it: its cgroup holds them all
        proc.finish_output(timeout=2.0)
        if self.lifeline is not None:
            self.lifeline.close()
        tail = self.output.tail.value()
        if applied is not None:
            if self.reason == "exit":
                limit = applied.ended_by(proc.returncode, proc.cpu, tail)
                if limit is not None:
                    self.reason, self.detail = "limit", limit
            applied.close()
        return ProcessEnd(proc.returncode, self.reason, tail, self.detail)



def run_process(argv: Sequence[str], **options: Any) -> ProcessEnd:
    """Run ``argv`` in a new process group until it ends or must be stopped,
    on this thread (:class:`Process` says what the options mean)."""
    command = Process(argv, **options)
    failed = command.start()
    if failed is not None:
        return failed
    try:
        while not command.wait(command.check(time.monotonic())):
            pass
    except BaseException:
        command.finish()
        raise
    return command.finish()


def _wait_time(deadline: float | None, watch: LeaseWatch | None, fence_margin: float) -> float:
    """How long the run's wait may sleep: until lock-at-most or the fence if
    one comes first, else a look at the lease and a stop request."""
    now = time.monotonic()
    wait = LOOK_EVERY
    if deadline is not None:
        wait = min(wait, deadline - now)
    if watch is not None:
        wait = min(wait, watch.fence_at(fence_margin) - now)
    return max(0.0, wait)
