"""The spawn service: the small single-threaded process that starts every command.

The daemon (and ``exec``) starts it once, before it has any thread of its own
(:mod:`dblockrun.spawn` is the other end), and asks it over a Unix socket to
start each command. The service forks itself for each one, a single-threaded
process of a few megabytes, never the daemon; the child leads a new session
(so the command's process group), gets a parent-death signal, stdin
``/dev/null``, stdout and stderr the daemon's pipes (the descriptors come with
the request), the job's ``workdir``, user and environment, and executes the
command.

The service stays with the daemon's user (root for ``user:`` jobs, so a job
cannot kill its watchdog) and watches every command it started:

* its end, through a pidfd: the exit status goes back to the daemon;
* its daemon's lifeline, a pipe per run: the daemon writes a byte to it after
  each successful renewal of the run's lease, with the seconds by which the
  command must then be gone (the fence) given at the start. No byte within
  the fence (a frozen daemon, a database it cannot reach), or the pipe
  closing (the daemon killed, OOM), and the service stops the command's
  group: SIGTERM, then SIGKILL after the grace, with a line in its output;
* the control socket: the daemon gone, it stops every group and exits.

It ignores the signals a stop, ``exec``'s forwarding or a terminal send
(SIGTERM, SIGINT, SIGHUP...): only its daemon's end stops it. Run as a
script (``python -I -S spawner.py FD``) it imports only the standard library.

Requests (one datagram each, JSON, descriptors attached):
``{"id", "argv", "env", "cwd", "ids", "fence", "grace"}`` with descriptors
stdout, stderr and, when ``fence`` is set, the lifeline's read end. Replies:
``{"id", "pid"}`` once the command is executed, ``{"id", "errno", "step"}``
if it could not be, ``{"id", "status"}`` (a wait status) when it ended.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

#: Ignored by the service; back to default in the command, with what Python
#: ignores at start.
WATCHED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE,
           signal.SIGUSR1, signal.SIGUSR2)
_RESET = (*WATCHED, signal.SIGXFSZ)
#: Largest request: the command line and its environment (a datagram).
MAX_REQUEST = 1 << 20
_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    try:
        import ctypes

        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (ImportError, OSError, AttributeError):  # not Linux
        return None


class _Run:
    """A command the service started, until its end is reported."""

    def __init__(self, rid: int, pid: int, setup: int, beat: int, err: int, fence: float | None,
                 grace: float) -> None:
        self.id = rid
        self.pid = pid
        self.setup = setup  # report pipe from the child until it executes the command
        self.setup_report = b""
        self.pidfd = os.pidfd_open(pid)
        self.beat = beat  # the lifeline, -1 without a lease to watch
        self.err = err  # a copy of the command's stderr, for the service's one line
        self.fence = fence
        self.grace = grace
        self.deadline = time.monotonic() + fence if fence is not None else None
        self.stopping = False
        self.kill_at: float | None = None


class Service:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.runs: dict[int, _Run] = {}  # by id
        self.by_fd: dict[int, tuple[_Run, str]] = {}
        self.poll = select.poll()
        self.poll.register(sock, select.POLLIN)
        self.daemon_gone = False
        self.prctl = _prctl()
        self.null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)

    # -- the loop --------------------------------------------------------------

    def serve(self) -> None:
        while not (self.daemon_gone and not self.runs):
            timeout = self._timeout()
            for fd, _event in self.poll.poll(None if timeout is None else timeout * 1000):
                if fd == self.sock.fileno():
                    self._request()
                elif fd in self.by_fd:
                    run, what = self.by_fd[fd]
                    if what == "setup":
                        self._setup(run)
                    elif what == "beat":
                        self._beat(run)
                    else:
                        self._ended(run)
            self._timers()

    def _timeout(self) -> float | None:
        at = [t for run in self.runs.values() for t in (run.deadline, run.kill_at)
              if t is not None]
        return max(0.0, min(at) - time.monotonic()) if at else None

    def _timers(self) -> None:
        now = time.monotonic()
        for run in list(self.runs.values()):
            if run.kill_at is not None and now >= run.kill_at:
                _killpg(run.pid, signal.SIGKILL)
                run.kill_at = None
            elif run.deadline is not None and now >= run.deadline:
                self._stop(run, f"lease not renewed for {run.fence:g}s")

    def _send(self, msg: Mapping[str, Any]) -> None:
        if self.daemon_gone:
            return
        try:
            self.sock.send(json.dumps(msg).encode())
        except OSError:
            self._gone()

    def _gone(self) -> None:
        """The daemon's end closed: it died. Every command goes."""
        if not self.daemon_gone:
            self.daemon_gone = True
            self.poll.unregister(self.sock)
            for run in self.runs.values():
                self._stop(run, "daemon gone")

    def _stop(self, run: _Run, why: str) -> None:
        if run.stopping:
            return
        run.stopping = True
        run.deadline = None
        _say(run.err, f"dblockrun guard: {why}; stopping the command\n")
        _killpg(run.pid, signal.SIGTERM)
        run.kill_at = time.monotonic() + run.grace

    # -- requests --------------------------------------------------------------

    def _request(self) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_REQUEST, 4)
        except OSError:
            data, fds = b"", []
        if not data:
            for fd in fds:
                os.close(fd)
            self._gone()
            return
        req = json.loads(data)
        rid = req["id"]
        fence: float | None = req["fence"]
        out, err = fds[0], fds[1]
        beat = fds[2] if fence is not None else -1
        try:
            pid, setup = self._fork(req, out, err, guarded=fence is not None)
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            self._send({"id": rid, "errno": exc.errno or errno.EIO, "step": "fork"})
            return
        os.close(out)
        err_copy = err if fence is not None else -1
        if err_copy < 0:
            os.close(err)
        else:
            os.set_inheritable(err, False)
        run = _Run(rid, pid, setup, beat, err_copy, fence, float(req["grace"]))
        self.runs[rid] = run
        self._watch(run.setup, run, "setup")

    def _watch(self, fd: int, run: _Run, what: str) -> None:
        self.by_fd[fd] = (run, what)
        self.poll.register(fd, select.POLLIN)

    def _unwatch(self, fd: int) -> None:
        if fd >= 0 and fd in self.by_fd:
            del self.by_fd[fd]
            self.poll.unregister(fd)
        if fd >= 0:
            os.close(fd)

    def _fork(self, req: Mapping[str, Any], out: int, err: int, guarded: bool) -> tuple[int, int]:
        argv: list[str] = req["argv"]
        env: dict[str, str] = req["env"]
        paths = _exec_paths(argv[0], env)
        ids = req["ids"]
        setup_r, setup_w = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
        except OSError:
            os.close(setup_r)
            os.close(setup_w)
            raise
        if pid == 0:
            self._child(argv, paths, env, req["cwd"], ids, out, err, setup_w, guarded)
        os.close(setup_w)
        os.set_blocking(setup_r, False)
        return pid, setup_r

    def _child(self, argv: list[str], paths: list[bytes], env: dict[str, str], cwd: str | None,
               ids: Sequence[Any] | None, out: int, err: int, report: int,
               guarded: bool) -> NoReturn:
        step = "setup"
        try:
            os.setsid()
            if self.prctl is not None:
                # The command's leader gets SIGKILL if the service dies; the
                # daemon, seeing the service go, stops the rest of the group.
                self.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            for s in _RESET:
                signal.signal(s, signal.SIG_DFL)
            os.dup2(self.null, 0)
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.closerange(3, report)
            os.closerange(report + 1, os.sysconf("SC_OPEN_MAX"))
            if cwd is not None:
                step = "cwd"
                os.chdir(cwd)
            try:
                step = "user"
                if ids is not None:
                    uid, gid, groups = ids
                    os.setgroups(list(groups))
                    os.setgid(gid)
                    os.setuid(uid)
                step = "exec"
                _first_path(paths, lambda path: os.execve(path, argv, env))
            except OSError as exc:
                if not guarded:
                    raise
                # Under a lease, as a shell does: a message and status 127.
                _say(2, f"dblockrun: cannot run {argv[0]}: {exc.strerror}\n")
        except BaseException as exc:
            num = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
            try:
                os.write(report, b"%d:%s" % (num, step.encode()))
            except OSError:
                pass
        finally:
            os._exit(127)

    # -- events ----------------------------------------------------------------

    def _setup(self, run: _Run) -> None:
        try:
            chunk = os.read(run.setup, 128)
        except BlockingIOError:
            return
        if chunk:
            run.setup_report += chunk
            return
        self._unwatch(run.setup)
        run.setup = -1
        if run.setup_report:  # the child could not execute the command: it exits 127
            code, _, step = run.setup_report.partition(b":")
            os.waitpid(run.pid, 0)
            os.close(run.pidfd)
            self._forget(run)
            self._send({"id": run.id, "errno": int(code) if code.isdigit() else errno.EIO,
                        "step": step.decode(errors="replace")})
            return
        self._send({"id": run.id, "pid": run.pid})
        self._watch(run.pidfd, run, "end")
        if run.beat >= 0:
            self._watch(run.beat, run, "beat")
        if self.daemon_gone:
            self._stop(run, "daemon gone")

    def _beat(self, run: _Run) -> None:
        try:
            data = os.read(run.beat, 4096)
        except OSError:
            data = b""
        if data:
            if not run.stopping and run.fence is not None:
                run.deadline = time.monotonic() + run.fence
            return
        self._unwatch(run.beat)
        run.beat = -1
        self._stop(run, "daemon gone")

    def _ended(self, run: _Run) -> None:
        if run.stopping:
            # Stopping: whatever is left of the group goes too (the leader, a
            # zombie until waited for, still holds the group's id).
            _killpg(run.pid, signal.SIGKILL)
        _, status = os.waitpid(run.pid, 0)
        self._unwatch(run.pidfd)
        self._unwatch(run.beat)
        self._forget(run)
        self._send({"id": run.id, "status": status})

    def _forget(self, run: _Run) -> None:
        if run.err >= 0:
            os.close(run.err)
            run.err = -1
        self.runs.pop(run.id, None)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _say(fd: int, text: str) -> None:
    """One line to ``fd`` if it takes it now (its reader may be dead or slow)."""
    if fd < 0:
        return
    try:
        p = select.poll()
        p.register(fd, select.POLLOUT)
        if p.poll(0):
            os.write(fd, text.encode())
    except OSError:
        pass


def _exec_paths(file: str, env: Mapping[str, str]) -> list[bytes]:
    """Where to look for ``file``, as ``os.execvpe`` would with ``env``'s PATH."""
    name = os.fsencode(file)
    if b"/" in name:
        return [name]
    return [os.path.join(os.fsencode(d), name) for d in os.get_exec_path(dict(env))]


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


def serve(fd: int) -> None:
    """Serve the daemon at the other end of socket ``fd`` until it is gone
    and every command it started has ended."""
    for s in WATCHED:
        signal.signal(s, signal.SIG_IGN)
    Service(socket.socket(fileno=fd)).serve()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
