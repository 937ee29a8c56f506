"""The guard: a tiny process between the daemon and each command.

It leads the command's process group and stops the whole group (SIGTERM,
then SIGKILL after a grace) when

* the daemon dies (kill -9, OOM): its end of the guard's pipe closes; or
* the daemon stops confirming renewals (frozen by SIGSTOP, database
  unreachable, lock lost) for ``fence`` seconds: the daemon writes one byte
  to the pipe after every successful lease renewal.

So a command never outlives its lease, whatever happens to its daemon.

How it runs: :func:`spawn` forks the calling daemon, no new interpreter
(``python bench/spawn.py``: 7-13 ms of CPU per command for a 50 MB daemon on
a 2-core VM, where a guard started as ``python -I -S`` cost 28-32 ms; a
fork's cost grows with the daemon's memory and threads). The forked child is
the guard. It starts a new session, so it leads the command's process
group; keeps only stdin (``/dev/null``), stdout and stderr (the output
pipe, or one pipe each) and its beat pipe, closing every other inherited file descriptor (a guard
holding another run's beat pipe would keep that run's daemon looking alive);
then starts the command in its group with ``posix_spawn`` and watches it
through a pidfd. It ignores the signals a stop or ``exec`` sends the group,
and exits with the command's status (or dies of its signal). With ``user:``
the guard keeps the daemon's user and switches only the command (a fork of
the guard), so the command cannot kill its watchdog. (glibc's
``posix_spawn`` starts the command with its two internal signals, 32 and 33,
ignored; glibc programs set their own handlers for them when they need them.)

The daemon is multi-threaded, so the child must not touch anything another
thread may have held at the fork: it calls only os-level functions of
modules imported before the fork (no logging, no ``print``, no
``sys.stdout``; messages go to fd 2 with ``os.write``), runs with the garbage
collector off (no finalizer of the daemon's objects runs in it), and always
ends in ``os._exit``. Setup errors (``workdir``) reach the daemon through a
close-on-exec pipe, as with :mod:`subprocess`.

Without a lease to watch (``beat_fd=None``) the forked child execs the
command itself, in a new session, with a parent-death signal.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import gc
import logging
import os
import resource
import select
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn, TypeVar

T = TypeVar("T")

#: The guard ignores these: they reach the command (same process group) from
#: a stop or from ``exec``'s forwarding; the guard only waits and keeps watch.
#: SIGPIPE too: the output pipe's reader is the daemon, which may be dead.
WATCHED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE,
           signal.SIGUSR1, signal.SIGUSR2)
#: Default again for the command: the above and what Python ignores at start.
_RESET = (*WATCHED, signal.SIGXFSZ)
_BLOCKABLE = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
_CATCHABLE = tuple(sorted(_BLOCKABLE))

# Resolved before any fork: the child calls only this C function.
_prctl: Callable[..., int] | None
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None
_PR_SET_PDEATHSIG = 1

#: Spawns in progress with the collector paused (several threads may spawn).
_gc_lock = threading.Lock()
_gc_paused = 0
_gc_resume = False

#: A forked child writes this at once (in well under a millisecond); one that
#: has not within the timeout is stuck in the fork, and is killed and forked
#: again with the next, longer timeout (a machine so loaded that a new process
#: waits half a second for its first slice gets more time).
_ALIVE = b"+"
_FORK_ALIVE_TIMEOUTS = (0.5, 2.0, 8.0)

log = logging.getLogger("dblockrun")

#: The user to switch the command to: uid, gid, supplementary groups.
Ids = tuple[int, int, Sequence[int]]


class GuardPipe:
    """The daemon's end: ``beat()`` after each renewal, ``close()`` at the end."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)

    def child_started(self) -> None:
        os.close(self.read_fd)
        self.read_fd = -1

    def beat(self) -> None:
        try:
            os.write(self.write_fd, b".")
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.read_fd = self.write_fd = -1


def spawn(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, out_fd: int,
          err_fd: int | None = None, beat_fd: int | None = None, fence: float = 0.0,
          grace: float = 0.0, ids: Ids | None = None) -> int:
    """Start ``argv`` in a new session; return its process group id (a child's pid).

    stdin is ``/dev/null``, stdout goes to ``out_fd``, stderr to ``err_fd``
    (None: to ``out_fd`` too, in the order written). With
    ``beat_fd`` (the read end of a :class:`GuardPipe`) a guard leads the
    group and stops it as the module docstring says, after ``fence`` seconds
    without a beat and ``grace`` seconds between SIGTERM and SIGKILL; a
    command that cannot be executed then exits 127 with a message in its
    output. Without, the command is the group's leader and an exec error is
    raised here. ``ids``: switch the command (only) to that uid, gid and
    groups. Raises OSError if the command cannot be started (a bad ``cwd``).
    """
    argv = list(argv)
    paths = _exec_paths(argv[0], env)
    env = dict(env)
    for attempt, timeout in enumerate(_FORK_ALIVE_TIMEOUTS, 1):
        pid, err_r = _fork(argv, paths, env, cwd, (out_fd, out_fd if err_fd is None else err_fd),
                           beat_fd, fence, grace, ids)
        try:
            # The child's first act: one byte. Until then it is in the fork's
            # own bookkeeping, which does no I/O and takes microseconds...
            alive = select.poll()
            alive.register(err_r, select.POLLIN)
            if not alive.poll(timeout * 1000):
                # ...unless it inherited a lock that another thread of ours
                # held at the fork (an LD_PRELOADed library's, say): then it
                # waits for ever. It has not started the command: kill it and
                # fork again.
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                log.warning("a forked guard for %s was stuck after the fork for %gs "
                            "(attempt %d of %d); killed it", argv[0], timeout, attempt,
                            len(_FORK_ALIVE_TIMEOUTS))
                continue
            # Then EOF once the command is exec'd (close-on-exec) or the guard
            # is set up; a slow workdir (NFS) may take its time.
            report = b""
            while chunk := os.read(err_r, 128):
                report += chunk
        finally:
            os.close(err_r)
        report = report.removeprefix(_ALIVE)
        if report:
            os.waitpid(pid, 0)
            code, _, what = report.partition(b":")
            num = int(code) if code.isdigit() else errno.EIO
            if what == b"cwd":
                raise OSError(num, os.strerror(num), cwd)
            if what == b"exec":
                raise OSError(num, os.strerror(num), argv[0])
            raise OSError(num, f"{os.strerror(num)} ({what.decode(errors='replace')})")
        return pid
    raise OSError(errno.EAGAIN,
                  f"the forked guard was stuck after the fork {len(_FORK_ALIVE_TIMEOUTS)} times")


def _fork(argv: list[str], paths: list[bytes], env: dict[str, str], cwd: str | None,
          out: tuple[int, int], beat_fd: int | None, fence: float, grace: float,
          ids: Ids | None) -> tuple[int, int]:
    """Fork the child that becomes the guard (or the command), its stdout
    and stderr the descriptors ``out``; its pid and the read end of its
    report pipe."""
    global _gc_paused, _gc_resume
    max_fd = os.sysconf("SC_OPEN_MAX")
    parent = os.getpid()
    err_r, err_w = os.pipe()
    with _gc_lock:
        if _gc_paused == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_paused += 1
    try:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKABLE)
        try:
            pid = os.fork()
            if pid == 0:
                _child(argv, paths, env, cwd, out, beat_fd, fence, grace, ids, err_w,
                       max_fd, parent)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    except BaseException:
        os.close(err_r)
        raise
    finally:
        os.close(err_w)
        with _gc_lock:
            _gc_paused -= 1
            if _gc_paused == 0 and _gc_resume:
                gc.enable()
    return pid, err_r


def _exec_paths(file: str, env: Mapping[str, str]) -> list[bytes]:
    """Where to look for ``file``, as ``os.execvpe`` would with ``env``'s PATH."""
    name = os.fsencode(file)
    if b"/" in name:
        return [name]
    return [os.path.join(os.fsencode(d), name) for d in os.get_exec_path(env)]


# -- in the forked child: nothing below may return into the daemon's code ---


def _child(argv: list[str], paths: list[bytes], env: dict[str, str], cwd: str | None,
           out: tuple[int, int], beat_fd: int | None, fence: float, grace: float, ids: Ids | None,
           err_fd: int, max_fd: int, parent: int) -> NoReturn:
    code = 127
    step = b"setup"
    try:
        os.write(err_fd, _ALIVE)  # past the fork's own bookkeeping
        for s in _CATCHABLE:  # the daemon's Python handlers must not run here
            if callable(signal.getsignal(s)):
                signal.signal(s, signal.SIG_DFL)
        for s in WATCHED if beat_fd is not None else _RESET:
            signal.signal(s, signal.SIG_IGN if beat_fd is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        os.setsid()
        if beat_fd is None and _prctl is not None:
            # The command gets SIGKILL if the thread that started it dies
            # (daemon killed with -9), so a dead host's command does not
            # keep running.
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(127)
        # 0: /dev/null, 1 and 2: the output, 3: the error pipe, 4: the beat
        # pipe. Copies above those numbers first, so that none is overwritten
        # before it is moved; then every other descriptor is closed.
        null = os.open(b"/dev/null", os.O_RDWR | os.O_CLOEXEC)
        keep = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5) for fd in (null, *out, err_fd)]
        if beat_fd is not None:
            beat_fd = fcntl.fcntl(beat_fd, fcntl.F_DUPFD_CLOEXEC, 5)
        os.dup2(keep[0], 0)
        os.dup2(keep[1], 1)
        os.dup2(keep[2], 2)
        err_fd = os.dup2(keep[3], 3, inheritable=False)
        if beat_fd is not None:
            beat_fd = os.dup2(beat_fd, 4, inheritable=False)
        os.closerange(5, max_fd)
        if cwd is not None:
            step = b"cwd"
            os.chdir(cwd)
        if beat_fd is None:
            step = b"user"
            _switch(ids)
            step = b"exec"
            _exec(paths, argv, env)
        os.close(err_fd)  # set up: the daemon goes on
        err_fd = -1
        code = _guard(paths, argv, env, ids, beat_fd, fence, grace)
    except BaseException as exc:  # never let anything unwind into the daemon's code
        if err_fd >= 0:
            num = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
            try:
                os.write(err_fd, b"%d:%s" % (num, step))
            except OSError:
                pass
    finally:
        os._exit(code)


def _switch(ids: Ids | None) -> None:
    if ids is not None:
        uid, gid, groups = ids
        os.setgroups(list(groups))
        os.setgid(gid)
        os.setuid(uid)


def _exec(paths: list[bytes], argv: list[str], env: dict[str, str]) -> NoReturn:
    """``execve`` the first of ``paths`` that works; raise the telling error."""
    _first_path(paths, lambda path: os.execve(path, argv, env))


def _first_path(paths: list[bytes], run: Callable[[bytes], T]) -> T:
    """``run(path)`` for each of ``paths`` until one works, as ``execvp`` goes
    down PATH; raise the telling error (the first that is not "not found")."""
    first: OSError | None = None
    last: OSError = OSError(errno.ENOENT, os.strerror(errno.ENOENT))
    for path in paths:
        try:
            return run(path)
        except ValueError:  # a NUL or '=' in the arguments or environment
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL)) from None
        except OSError as exc:
            last = exc
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR) and first is None:
                first = exc
    raise first or last


def _start(paths: list[bytes], argv: list[str], env: dict[str, str], ids: Ids | None) -> int:
    """The command, in the guard's process group; the guard keeps its own user."""
    if ids is not None:
        pid = os.fork()
        if pid == 0:
            try:
                for s in _RESET:
                    signal.signal(s, signal.SIG_DFL)
                _switch(ids)
                _exec(paths, argv, env)
            except OSError as exc:
                _say(f"dblockrun: cannot run {argv[0]}: {exc.strerror}\n")
            finally:
                os._exit(127)
        return pid

    def spawn_one(path: bytes) -> int:
        if len(paths) > 1:
            os.stat(path)  # one spawn, not one per directory of PATH
        return os.posix_spawn(path, argv, env, setsigdef=_RESET)

    return _first_path(paths, spawn_one)


def _say(text: str) -> None:
    try:
        os.write(2, text.encode())
    except OSError:
        pass


def _guard(paths: list[bytes], argv: list[str], env: dict[str, str], ids: Ids | None,
           beat: int, fence: float, grace: float) -> int:
    """Start the command, watch it and the daemon; the guard's exit status."""
    try:
        pid = _start(paths, argv, env, ids)
    except OSError as exc:
        _say(f"dblockrun: cannot run {argv[0]}: {exc.strerror}\n")
        return 127
    try:
        _watch(pid, beat, fence, grace)
    except BaseException:  # the guard cannot watch: the command cannot run
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.killpg(0, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        # Die of the command's signal, without dumping the daemon's memory.
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 1
    return os.waitstatus_to_exitcode(status)


def _watch(pid: int, beat: int, fence: float, grace: float) -> None:
    """Until the command ends; stop its group if the daemon is gone or silent."""
    pidfd = os.pidfd_open(pid)
    last = time.monotonic()
    why = None
    while why is None:
        timeout = max(0.0, last + fence - time.monotonic())
        ready, _, _ = select.select([beat, pidfd], [], [], timeout)
        if pidfd in ready:
            break
        if beat in ready:
            if os.read(beat, 64):
                last = time.monotonic()
            else:
                why = "daemon gone"
        elif time.monotonic() >= last + fence:
            why = f"lease not renewed for {fence:g}s"
    if why is not None:
        _say(f"dblockrun guard: {why}; stopping the command\n")
        try:
            os.killpg(0, signal.SIGTERM)
        except OSError:
            pass
        end = time.monotonic() + grace
        while time.monotonic() < end:
            if select.select([pidfd], [], [], max(0.0, end - time.monotonic()))[0]:
                break
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.killpg(0, signal.SIGKILL)  # the guard too
