"""Running one command: its own process group, output tail, timeouts, fencing.

The command is stopped (SIGTERM to its process group, SIGKILL after a grace)
when it reaches lock-at-most, when its lease could not be renewed for long
enough that it might expire, when its lease was taken over, or on shutdown.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pwd
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dblockrun.guard import GuardPipe, guard_argv
from dblockrun.jobs import Command

log = logging.getLogger("dblockrun")

OUTPUT_TAIL = 64 * 1024
_MAX_LINE = 64 * 1024

# Resolved before any fork: the child calls only this C function.
_prctl: Callable[..., int] | None
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # The command gets SIGKILL if the thread that started it dies (daemon
    # killed with -9), so a dead host's command does not keep running.
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class LeaseWatch:
    """A held lock, renewed by the heartbeat, watched by the run."""

    name: str
    holder: str
    token: int
    lease: float
    last_ok: float = field(default_factory=time.monotonic)  # monotonic send time
    lost: bool = False
    pipe: GuardPipe | None = None
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

    def spec(self) -> str:
        """For the guard: ``uid:gid:g1,g2``."""
        return f"{self.uid}:{self.gid}:{','.join(map(str, self.groups))}"


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


def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    on_line: Callable[[bytes], None],
    deadline: float | None,
    watch: LeaseWatch | None,
    stop: threading.Event,
    kill_grace: float = 5.0,
    stop_grace: Callable[[], float | None] = lambda: None,
    on_start: Callable[[int], None] | None = None,
    user: str | None = None,
) -> Outcome:
    """Run ``argv`` in a new process group until it ends or must be stopped.

    ``deadline`` is monotonic (lock-at-most). ``stop`` asks for a shutdown:
    the command then gets until ``stop_grace()`` (monotonic) before it is
    stopped. ``user``: run the command as that user (its groups, HOME, USER,
    LOGNAME); the guard stays with the daemon's user, so the command cannot
    kill its own watchdog.
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
    pipe: GuardPipe | None = None
    full_argv = list(argv)
    if watch is not None:
        # The guard stops the group a little after we would, from its own
        # clock: the backstop for a frozen or dead daemon.
        pipe = GuardPipe()
        full_argv = guard_argv(pipe.read_fd, watch.lease - fence_margin + 0.5, term_grace,
                               full_argv, run_as.spec() if run_as else None)
        watch.pipe = pipe
    direct = run_as if pipe is None else None  # with the guard, the guard switches
    try:
        proc = subprocess.Popen(
            full_argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if pipe else _die_with_parent,
            pass_fds=(pipe.read_fd,) if pipe else (),
            user=direct.uid if direct else None,
            group=direct.gid if direct else None,
            extra_groups=list(direct.groups) if direct else None,
        )
    except OSError as exc:
        if pipe is not None:
            pipe.close()
        return Outcome(None, "error", b"", f"cannot start command: {exc}")
    if pipe is not None:
        pipe.child_started()
    pgid = proc.pid
    if on_start is not None:
        on_start(pgid)
    tail = Tail()
    assert proc.stdout is not None
    stdout = proc.stdout

    def pump() -> None:
        try:
            while True:
                line = stdout.readline(_MAX_LINE)
                if not line:
                    break
                tail.add(line)
                on_line(line)
        except (OSError, ValueError):
            pass

    reader = threading.Thread(target=pump, name=f"output-{pgid}", daemon=True)
    reader.start()
    reason = "exit"
    detail = ""
    try:
        while True:
            try:
                proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pass
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
            stop_group(pgid, term_grace if reason == "fenced" else kill_grace,
                       lambda: proc.poll() is not None)
            proc.wait()
            break
    finally:
        if proc.poll() is None:
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()
        # Background children left in the group go with the run.
        if _signal_group(pgid, 0):
            stop_group(pgid, 1.0, lambda: not _signal_group(pgid, 0))
        reader.join(timeout=2.0)
        stdout.close()
        if pipe is not None:
            pipe.close()
    code = proc.returncode
    return Outcome(code, reason, tail.value(), detail)
