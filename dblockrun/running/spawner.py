"""The spawn service: the small single-threaded process that starts every command.

The daemon (and ``exec``) starts it once, before it has any thread of its own
(:mod:`dblockrun.running.spawn` is the other end), and asks it over a Unix socket to
start each command. The service starts it with ``posix_spawn`` (glibc's
clones without copying the service, and sets the child up in C): the command
leads a new session (so its process group), with the signals the service
ignores back to their default, stdin ``/dev/null``, stdout and stderr the
daemon's pipes (the descriptors come with the request), the job's
``workdir`` (the service's own for the call: it has no thread) and
environment. Every descriptor the service holds is close-on-exec, so a
command gets only those three. A job with a ``user:`` or ``limits:`` is
started by a fork of the service instead, which sets what ``posix_spawn``
cannot, in this order, and executes the command: the run's cgroup v2 (it
joins it), its niceness, its I/O class (util-linux's ``ionice -p`` on
itself), its rlimits, its user and groups, and last its address-space
limit (the child itself must still allocate until then). Its end is then
reported with the CPU time the command and the processes it waited for
used (``wait4``): the daemon tells a run ended by ``cpu-time`` by it.

The service stays with the daemon's user (root for ``user:`` jobs, so a job
cannot kill its watchdog) and watches every command it started:

* its end, through a pidfd: the exit status goes back to the daemon;
* its daemon's lifeline, a pipe per run: the daemon writes a beat to it after
  each successful renewal of the run's lease (the renewal's send time on the
  machine's monotonic clock, :data:`BEAT`), with the seconds after it by
  which the command must then be gone (the fence) given at the start. No byte within
  the fence (a frozen daemon, a database it cannot reach), or the pipe
  closing (the daemon killed, OOM), and the service stops the command's
  group: SIGTERM, then SIGKILL after the grace, with a line in its output;
* the control socket: the daemon gone, it stops every group and exits.

If the service itself dies, its daemon sees the socket close and stops every
group the service watched (no parent-death signal: ``posix_spawn`` cannot set
one, and the daemon is the one left to act).

It ignores the signals a stop, ``exec``'s forwarding or a terminal send
(SIGTERM, SIGINT, SIGHUP...): only its daemon's end stops it. Run as a
script (``python -I -S spawner.py FD``), or imported from its folder as the
daemon starts it (:data:`dblockrun.running.spawn._SERVE`: from its compiled
file), it imports only the standard library.

Requests (one datagram each, JSON, descriptors attached):
``{"id", "argv", "env", "cwd", "ids", "fence", "since", "grace"[, "limits"]}`` with descriptors
stdout, stderr and, when ``fence`` is set, the lifeline's read end; ``since``
(optional) is the send time of the lease's last renewal, from which the fence
counts: a request whose fence passed before it arrived is refused
(``{"id", "errno", "step": "lease"}``), its command never started. Replies:
``{"id", "pid"}`` once the command is executed, ``{"id", "errno", "step"}``
if it could not be, ``{"id", "status"}`` (a wait status) when it ended
(``{"id", "status", "cpu"}`` with ``limits``). ``limits`` (optional):
``{"rlimits": [[key, resource, soft, hard], ...], "nice": N|null, "io":
[ionice, class, level|null]|null, "cgroup": path|null}`` (dblockrun/running/resources.py);
a step that fails names its key (``nice``, ``io``, ``memory`` ...).
Under a lease (``fence`` set), a command that cannot be executed is
reported as one that ran and exited 127 (a shell's status), with the reason
on its stderr: the service writes the line and starts, in the command's
place, a fork of itself that exits 127 at once. A request the service
cannot act on (cut short, over :data:`MAX_REQUEST`, malformed, without its
descriptors) fails alone: ``{"id", "errno", "step": "request"}`` if its id
can be read, else it is dropped; nothing a request carries ends the service
(the daemon refuses to send one over the limit: :func:`dblockrun.running.spawn._request`).
"""

from __future__ import annotations

import array
import errno
import heapq
import json
import math
import mmap
import os
import re
import select
import signal
import socket
import struct
import sys
import time

#: typing is for the type checker only: importing it would cost the service
#: 0.6 MB of its memory (it imports nothing it does not use; issue 21).
TYPE_CHECKING = False
if TYPE_CHECKING:
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
#: The step a refused start names when its lease's fence had passed.
LEASE_STEP = "lease"
#: Room for the descriptors a request carries (stdout, stderr, lifeline) and one more.
_FDS_ROOM = socket.CMSG_SPACE(4 * array.array("i").itemsize)


class _Run:
    """A command the service started, until its end is reported."""

    __slots__ = ("id", "pid", "setup", "setup_report", "pidfd", "beat", "err", "fence",
                 "grace", "deadline", "stopping", "kill_at", "queued", "usage")

    def __init__(self, rid: int, pid: int, setup: int, beat: int, err: int, fence: float | None,
                 grace: float, since: float, usage: bool = False) -> None:
        self.id = rid
        self.pid = pid
        self.setup = setup  # report pipe from a forked child until it executes, else -1
        self.setup_report = b""
        self.pidfd = os.pidfd_open(pid)
        self.beat = beat  # the lifeline, -1 without a lease to watch
        self.err = err  # a copy of the command's stderr, for the service's one line
        self.fence = fence
        self.grace = grace
        self.deadline = since + fence if fence is not None else None
        self.stopping = False
        self.kill_at: float | None = None
        #: The time of this run's live entry in the timer heap (None: none).
        self.queued: float | None = None
        #: Its end is reported with the CPU time used (a command with limits).
        self.usage = usage

    def due(self) -> float | None:
        """When the next timer of this run is due: the SIGKILL once
        stopping, else the fence."""
        return self.kill_at if self.kill_at is not None else self.deadline


class _StartError(Exception):
    """The command could not be started: ``errno`` at ``step``."""

    def __init__(self, num: int | None, step: str) -> None:
        super().__init__(num, step)
        self.errno = num or errno.EIO
        self.step = step


class Service:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock_fd = sock.fileno()
        self.runs: dict[int, _Run] = {}  # by id
        self.by_fd: dict[int, tuple[_Run, str]] = {}
        #: (due, run id) of the runs' fences and kills; an entry is live while
        #: the run's ``queued`` holds its time (a later beat moves a fence
        #: without a push: the entry, once due, is pushed again for the new time).
        self.timers: list[tuple[float, int]] = []
        self.poll = select.poll()
        self.poll.register(sock, select.POLLIN)
        self.daemon_gone = False
        self.null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        #: The service's working directory, back to after a command's ``workdir``.
        self.home = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        #: Anonymous memory: a page is resident once a request reached it
        #: (a bytearray's megabyte was, zeroed, from the start).
        self.buf = mmap.mmap(-1, MAX_REQUEST)
        # posix_spawnp searches the PATH of the service's environment: the
        # command's, set before each search (None: unset, as at the start).
        os.unsetenv("PATH")
        self.path: str | None = None

    # -- the loop --------------------------------------------------------------

    def serve(self) -> None:
        poll, by_fd, sock_fd, timers = self.poll.poll, self.by_fd, self.sock_fd, self.timers
        while not (self.daemon_gone and not self.runs):
            timeout = max(0.0, (timers[0][0] - time.monotonic()) * 1000) if timers else None
            for fd, _event in poll(timeout):
                if fd == sock_fd:
                    self._request()
                elif fd in by_fd:
                    run, what = by_fd[fd]
                    if what == "end":
                        self._ended(run)
                    elif what == "beat":
                        self._beat(run)
                    else:
                        self._setup(run)
            if timers and timers[0][0] <= time.monotonic():
                self._timers()

    def _timers(self) -> None:
        now = time.monotonic()
        timers = self.timers
        while timers and timers[0][0] <= now:
            at, rid = heapq.heappop(timers)
            run = self.runs.get(rid)
            if run is None or run.queued != at:  # ended, or moved earlier since
                continue
            run.queued = None
            if run.kill_at is not None:
                if now >= run.kill_at:
                    _killpg(run.pid, signal.SIGKILL)
                    run.kill_at = None
            elif run.deadline is not None and now >= run.deadline:
                self._stop(run, f"lease not renewed for {run.fence:g}s")
            self._arm(run)

    def _arm(self, run: _Run) -> None:
        """Make sure the heap wakes the loop when ``run``'s next timer is due."""
        due = run.due()
        if due is not None and (run.queued is None or due < run.queued):
            run.queued = due
            heapq.heappush(self.timers, (due, run.id))

    def _send(self, msg: Mapping[str, Any]) -> None:
        self._send_raw(json.dumps(msg).encode())

    def _send_raw(self, data: bytes) -> None:
        if self.daemon_gone:
            return
        try:
            self.sock.send(data)
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
        self._arm(run)

    # -- requests --------------------------------------------------------------

    def _request(self) -> None:
        fds: list[int] = []
        try:
            # Close-on-exec descriptors: no command inherits another's.
            size, anc, flags, _addr = self.sock.recvmsg_into(
                [self.buf], _FDS_ROOM, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            size, anc, flags = 0, [], 0
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(data[: len(data) - len(data) % got.itemsize])
                fds += got
        if not size:
            for fd in fds:
                os.close(fd)
            self._gone()
            return
        # Nothing a request carries ends the service: one it cannot read
        # (cut short, too large, malformed) fails only its own run.
        rid = _request_id(self.buf, size)
        try:
            if flags & socket.MSG_TRUNC:
                raise _StartError(errno.E2BIG, "request")
            req = _checked(self.buf[:size], len(fds))
        except _StartError as exc:
            for fd in fds:
                os.close(fd)
            if rid is not None:
                self._send({"id": rid, "errno": exc.errno, "step": exc.step})
            return
        self._start(req, fds)

    def _start(self, req: Mapping[str, Any], fds: list[int]) -> None:
        """Start a checked request's command, with its descriptors ``fds``."""
        rid = req["id"]
        fence: float | None = req["fence"]
        out, err = fds[0], fds[1]
        beat = fds[2] if fence is not None else -1
        now = time.monotonic()
        since = now if req.get("since") is None else min(req["since"], now)
        try:
            if fence is not None and now >= since + fence:
                raise _StartError(errno.ETIME, LEASE_STEP)
            if req["ids"] is not None or req.get("limits") is not None:
                pid, setup = self._fork(req, out, err, guarded=fence is not None)
            else:
                pid, setup = self._spawn(req["argv"], req["env"], req["cwd"], out, err,
                                         guarded=fence is not None), -1
        except _StartError as exc:
            for fd in fds:
                os.close(fd)
            self._send({"id": rid, "errno": exc.errno, "step": exc.step})
            return
        os.close(out)
        err_copy = err if fence is not None else -1
        if err_copy < 0:
            os.close(err)
        run = _Run(rid, pid, setup, beat, err_copy, fence, float(req["grace"]), since,
                   usage=req.get("limits") is not None)
        self.runs[rid] = run
        self._arm(run)
        if setup >= 0:
            self._watch(setup, run, "setup")
        else:
            self._started(run)

    def _watch(self, fd: int, run: _Run, what: str) -> None:
        self.by_fd[fd] = (run, what)
        self.poll.register(fd, select.POLLIN)

    def _unwatch(self, fd: int) -> None:
        if fd >= 0 and fd in self.by_fd:
            del self.by_fd[fd]
            self.poll.unregister(fd)
        if fd >= 0:
            os.close(fd)

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: str | None, out: int, err: int,
               guarded: bool) -> int:
        """Start the command (``posix_spawn``); its pid. Under a guard a
        command that cannot be executed is a child that exits 127."""
        if cwd is not None:
            try:
                os.chdir(cwd)
            except OSError as exc:
                raise _StartError(exc.errno, "cwd") from None
        try:
            return self._posix_spawn(argv, env, out, err)
        except OSError as exc:
            if not guarded:
                raise _StartError(exc.errno, "exec") from None
            # Under a lease, as a shell does: a message and status 127.
            _say(err, f"dblockrun: cannot run {argv[0]}: {exc.strerror}\n")
        finally:
            if cwd is not None:
                os.fchdir(self.home)
        try:
            pid = os.fork()
        except OSError as exc:
            raise _StartError(exc.errno, "fork") from None
        if pid == 0:
            try:
                os.setsid()
            finally:
                os._exit(127)
        return pid

    def _posix_spawn(self, argv: list[str], env: dict[str, str], out: int, err: int) -> int:
        dup2 = os.POSIX_SPAWN_DUP2
        actions = [(dup2, self.null, 0), (dup2, out, 1), (dup2, err, 2)]
        file = argv[0]
        try:
            if "/" in file:
                return os.posix_spawn(file, argv, env, file_actions=actions, setsid=True,
                                      setsigdef=_RESET)
            path = env.get("PATH")
            if path != self.path:
                if path is None:
                    os.unsetenv("PATH")
                else:
                    os.putenv("PATH", path)
                self.path = path
            try:
                return os.posix_spawnp(file, argv, env, file_actions=actions, setsid=True,
                                       setsigdef=_RESET)
            except OSError:
                pass
            # Down the PATH one entry at a time, for the error execvp would
            # give (glibc's search stops at some errors an entry later mends).
            return _first_path(_exec_paths(file, env), lambda p: os.posix_spawn(
                p, argv, env, file_actions=actions, setsid=True, setsigdef=_RESET))
        except ValueError:  # a NUL or '=' in the arguments or environment
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL)) from None

    def _fork(self, req: Mapping[str, Any], out: int, err: int, guarded: bool) -> tuple[int, int]:
        """Start a command with a ``user:`` or ``limits:``: a fork that sets
        them and executes the command; its pid and the pipe its setup
        reports on."""
        argv: list[str] = req["argv"]
        env: dict[str, str] = req["env"]
        paths = _exec_paths(argv[0], env)
        ids = req["ids"]
        limits = req.get("limits")
        if limits is not None:
            _resource()  # in the service, once: not in each child
        try:
            setup_r, setup_w = os.pipe2(os.O_CLOEXEC)
            try:
                pid = os.fork()
            except OSError:
                os.close(setup_r)
                os.close(setup_w)
                raise
        except OSError as exc:
            raise _StartError(exc.errno, "fork") from None
        if pid == 0:
            self._child(argv, paths, env, req["cwd"], ids, limits, out, err, setup_w, guarded)
        os.close(setup_w)
        os.set_blocking(setup_r, False)
        return pid, setup_r

    def _child(self, argv: list[str], paths: list[bytes], env: dict[str, str], cwd: str | None,
               ids: Sequence[Any] | None, limits: Mapping[str, Any] | None, out: int, err: int,
               report: int, guarded: bool) -> NoReturn:
        step = "setup"
        try:
            os.setsid()
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
            address_space = None
            if limits is not None:
                step = "limits"
                address_space = _limit(limits)
            try:
                if ids is not None:
                    step = "user"
                    uid, gid, groups = ids
                    os.setgroups(list(groups))
                    os.setgid(gid)
                    os.setuid(uid)
                if address_space is not None:  # a failure is a setup's, never "cannot run"
                    try:
                        _setrlimit(address_space)
                    except OSError as exc:
                        raise _StartError(exc.errno, "memory") from None
                step = "exec"
                _first_path(paths, lambda path: os.execve(path, argv, env))
            except OSError as exc:
                if not guarded:
                    raise
                # Under a lease, as a shell does: a message and status 127.
                _say(2, f"dblockrun: cannot run {argv[0]}: {exc.strerror}\n")
        except BaseException as exc:
            num = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
            if isinstance(exc, _StartError):
                num, step = exc.errno, exc.step
            elif isinstance(exc, MemoryError):  # under the address-space limit
                num = errno.ENOMEM
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
        self._started(run)

    def _started(self, run: _Run) -> None:
        """The command is executed: tell the daemon, watch its end and lifeline."""
        self._send_raw(b'{"id": %d, "pid": %d}' % (run.id, run.pid))
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
                # From the renewal's send time (never later than now): the
                # database counted the lease from then. A later fence's heap
                # entry follows when due; an earlier one (the first beat may
                # count from before the command's start) is pushed.
                now = time.monotonic()
                run.deadline = min(_newest_beat(data, now), now) + run.fence
                self._arm(run)
            return
        self._unwatch(run.beat)
        run.beat = -1
        self._stop(run, "daemon gone")

    def _ended(self, run: _Run) -> None:
        if run.stopping:
            # Stopping: whatever is left of the group goes too (the leader, a
            # zombie until waited for, still holds the group's id).
            _killpg(run.pid, signal.SIGKILL)
        if run.usage:
            _, status, usage = os.wait4(run.pid, 0)
            cpu = b', "cpu": %.3f' % (usage.ru_utime + usage.ru_stime)
        else:
            _, status = os.waitpid(run.pid, 0)
            cpu = b""
        self._unwatch(run.pidfd)
        self._unwatch(run.beat)
        self._forget(run)
        self._send_raw(b'{"id": %d, "status": %d%s}' % (run.id, status, cpu))

    def _forget(self, run: _Run) -> None:
        if run.err >= 0:
            os.close(run.err)
            run.err = -1
        self.runs.pop(run.id, None)


#: A beat on a lifeline: the renewal's send time (``time.monotonic()``),
#: a native double; a pipe write this small is never split.
BEAT = struct.Struct("=d")


def _newest_beat(data: bytes, default: float) -> float:
    """The newest send time of the beats in ``data`` (``default``: none)."""
    whole = len(data) - len(data) % BEAT.size
    stamps = [s for (s,) in BEAT.iter_unpack(data[:whole]) if math.isfinite(s)]
    return max(stamps) if stamps else default


_ID = re.compile(rb'\{"id": (\d{1,18}),')


def _request_id(buf: bytes | bytearray | mmap.mmap, size: int) -> int | None:
    """The id a request starts with, even one cut short; None if none."""
    match = _ID.match(buf, 0, min(size, 40))
    return int(match.group(1)) if match else None


def _checked(data: bytes | bytearray, fds: int) -> dict[str, Any]:
    """The request in ``data``, if it is one the service can act on, with
    ``fds`` descriptors as it needs (stdout, stderr, and a lifeline under a
    fence); else _StartError (EINVAL) at step ``request``."""
    try:
        req = json.loads(data)
    except (ValueError, RecursionError):
        req = None

    def path(value: Any) -> bool:
        return value is None or (isinstance(value, str) and "\0" not in value)

    def number(value: Any, none: bool) -> bool:
        """A duration (a fence, a grace): a number of seconds, 0 to 10**9."""
        return ((value is None and none) or (isinstance(value, int | float)
                and not isinstance(value, bool) and 0 <= value < 1e9))

    def reading(value: Any) -> bool:
        """A reading of the monotonic clock (``since``), or none: any finite
        number. Its size says nothing (a time namespace's offset, libfaketime
        with an absolute date: 10**9 s and more); it only counts the fence
        from it, and a reading after the service's own is taken as now."""
        return value is None or (isinstance(value, int | float) and not isinstance(value, bool)
                                 and math.isfinite(value))

    def user(ids: Any) -> bool:  # None, or [uid, gid, [group, ...]]
        if ids is None:
            return True
        if not (isinstance(ids, list) and len(ids) == 3 and isinstance(ids[2], list)):
            return False
        return all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 32
                   for i in (ids[0], ids[1], *ids[2]))

    def whole(*values: Any) -> bool:
        return all(isinstance(v, int) and not isinstance(v, bool) for v in values)

    def limits(value: Any) -> bool:  # None, or what _limit sets
        if value is None:
            return True
        if not (isinstance(value, dict) and set(value) == {"rlimits", "nice", "io", "cgroup"}
                and isinstance(value["rlimits"], list)):
            return False
        io = value["io"]
        return (all(isinstance(e, list) and len(e) == 4 and isinstance(e[0], str)
                    and whole(*e[1:]) and 0 <= e[2] <= e[3] for e in value["rlimits"])
                and (value["nice"] is None or whole(value["nice"]))
                and (io is None or (isinstance(io, list) and len(io) == 3 and path(io[0])
                                    and io[0] is not None and whole(io[1])
                                    and (io[2] is None or whole(io[2]))))
                and path(value["cgroup"]))

    ok = (isinstance(req, dict) and isinstance(req.get("id"), int)
          and isinstance(req.get("argv"), list) and bool(req["argv"])
          and all(isinstance(a, str) for a in req["argv"])
          and isinstance(req.get("env"), dict)
          and all(isinstance(v, str) for v in req["env"].values())
          and path(req.get("cwd"))
          and number(req.get("fence"), True) and number(req.get("grace"), False)
          and reading(req.get("since"))
          and user(req.get("ids"))
          and limits(req.get("limits"))
          and fds == (3 if req.get("fence") is not None else 2))
    if not ok:
        raise _StartError(errno.EINVAL, "request")
    return req  # type: ignore[no-any-return]


def _limit(limits: Mapping[str, Any]) -> list[Any] | None:
    """In a command's child, before its user is switched: join its cgroup,
    set its niceness, I/O class and rlimits (_StartError naming the limit
    that could not be set); the address-space limit, to set last, is
    returned (None: none)."""
    step = "cgroup"
    try:
        if limits["cgroup"] is not None:
            with open(os.path.join(limits["cgroup"], "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        if limits["nice"] is not None:
            step = "nice"
            os.setpriority(os.PRIO_PROCESS, 0, limits["nice"])
        if limits["io"] is not None:
            step = "io"
            _ionice(*limits["io"])
        address_space = None
        for entry in limits["rlimits"]:
            step = entry[0]
            if entry[0] == "memory":
                address_space = entry
            else:
                _setrlimit(entry)
    except OSError as exc:
        raise _StartError(exc.errno, step) from None
    return address_space


def _resource() -> Any:
    """The resource module, imported by the first command with limits (the
    service imports nothing it does not use)."""
    import resource

    return resource


def _setrlimit(entry: Sequence[Any]) -> None:
    """``[key, resource, soft, hard]``; raises OSError (a hard limit above
    the service's cannot be set without privilege: EPERM)."""
    try:
        _resource().setrlimit(entry[1], (entry[2], entry[3]))
    except ValueError:  # Python's word for EPERM here
        raise OSError(errno.EPERM, os.strerror(errno.EPERM)) from None


def _ionice(ionice: str, klass: int, level: int | None) -> None:
    """This process's I/O scheduling class, set by util-linux's ionice (the
    kernel's ioprio_set has no Python binding); its message, if it fails,
    goes to the command's stderr. Raises OSError (EPERM) if it fails."""
    args = [ionice, "-c", str(klass), *(["-n", str(level)] if level is not None else []),
            "-p", str(os.getpid())]
    pid = os.fork()
    if pid == 0:
        try:
            os.execv(ionice, args)
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise OSError(errno.EPERM, f"ionice exited {os.waitstatus_to_exitcode(status)}")


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
    # Descriptors 0-2 open (/dev/null where one is not): a request's then come
    # above them, where a command's dup2 onto 0-2 cannot overwrite one.
    while (spare := os.open(os.devnull, os.O_RDWR)) <= 2:
        pass
    os.close(spare)
    os.set_inheritable(fd, False)  # as everything else the service holds
    Service(socket.socket(fileno=fd)).serve()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
