"""The daemon's end of its spawn service (:mod:`dblockrun.running.spawner`).

Nothing forks the daemon: its commands are started by the spawn service, a
small single-threaded process started once per daemon process, before the
daemon starts a thread of its own (:func:`start`; a fresh ``python -I -S``,
or for ``exec``, single-threaded until then, a fork of itself). The service
leads nothing: each command leads its own session and process group, and the
service watches it (its end, the daemon's lifeline, the fence).

Here one thread, the reactor, serves every run of the process: it reads the
service's replies (started, could not start, ended with a status) and every
command's output pipes, line by line, to each run's sinks, and tells a run
its command ended (``on_end``). No thread waits per command: a daemon's run
loop (:mod:`dblockrun.running.runloop`) decides when to stop each one.

If the service dies (kill -9), the reactor sees its socket close and every
run it watched ends as orphaned: the runner stops the command's whole group
(there is no parent-death signal: the service starts commands with
``posix_spawn``, which cannot set one), since no command runs without a
watchdog. The next start starts a new service.
"""

from __future__ import annotations

import collections
import errno
import gc
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dblockrun.jobs import MAX_ARG
from dblockrun.latch import Latch
from dblockrun.running import spawner

log = logging.getLogger("dblockrun")

LineSink = Callable[[bytes], None]
#: The longest line read: a longer one comes in pieces of this size.
MAX_LINE = 64 * 1024
#: The user to switch the command to: uid, gid, supplementary groups.
Ids = tuple[int, int, Sequence[int]]


#: The spawn service's start in a fresh ``python -I -S``: spawner.py imported
#: from its folder, put last on the path (the standard library's names
#: first), so that its compiled file is read. Run as a script instead, its
#: source would be compiled at every start, and the memory the compiler took
#: stays with the process (1.6 MB of a service's 6; bench/idle.py).
_SERVE = ("import sys; sys.path.append(sys.argv[1]); import spawner; "
          "spawner.serve(int(sys.argv[2]))")


class Lifeline:
    """A run's pipe to the service: ``beat()`` after each renewal of its
    lease, ``close()`` at the end (or the daemon's death closes it).

    Its descriptors are closed once, under :attr:`lock`: a run stopped by
    the run watcher (its lease lost) may close it while a worker is sending
    the spawn request that carries its read end; the worker holds the lock
    from the request to :meth:`handed_over` (the fault soak saw the read end
    closed twice, which could close a descriptor reused meanwhile)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.lock = threading.RLock()

    def handed_over(self) -> None:
        """The read end is the service's now."""
        with self.lock:
            if self.read_fd >= 0:
                os.close(self.read_fd)
            self.read_fd = -1

    def beat(self, sent: float | None = None) -> None:
        """The lease was renewed by a statement sent at ``sent``
        (``time.monotonic()``, the whole machine's clock; default now): the
        service counts the fence from there, as the database counts the
        lease from when it got the statement, not from when this beat
        arrives (a renewal can wait seconds behind another transaction's
        row lock)."""
        stamp = time.monotonic() if sent is None else sent
        with self.lock:
            if self.write_fd < 0:
                return
            try:
                os.write(self.write_fd, spawner.BEAT.pack(stamp))
            except OSError:
                pass

    def close(self) -> None:
        with self.lock:
            fds, self.read_fd, self.write_fd = (self.read_fd, self.write_fd), -1, -1
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


class LeaseRanOut(OSError):
    """The service refused to start a command under a lease whose fence had
    passed (its daemon froze between its last look at the lease and the
    request): another host may hold the job by now."""


class LimitRefused(OSError):
    """A job's limit could not be set in its command's process (a niceness
    below the daemon's without privilege, a hard limit above its own, a
    cgroup it cannot join): :attr:`key` names it (``nice``, ``cgroup`` ...)."""

    key = ""


#: The steps of the service's child that set limits (spawner._limit).
LIMIT_STEPS = ("limits", "cgroup", "nice", "io", "memory", "tasks", "cpu-time", "open-files")


class Spawned:
    """A command the service started: its pid (its process group's id), its
    end, its output."""

    def __init__(self, service: SpawnService, streams: Sequence[tuple[int, LineSink]],
                 on_end: Callable[[], None] | None = None) -> None:
        self.service = service
        #: Called by the reactor once the command ended (or can no longer be
        #: watched); it must not block.
        self.on_end = on_end
        self.id = 0
        self.pid = 0
        self.returncode: int | None = None
        #: CPU seconds the command (and what it waited for) used: with limits only.
        self.cpu: float | None = None
        #: The service died while the command ran: its end is unknown.
        self.orphaned = False
        self.error: OSError | None = None
        self.streams = list(streams)
        self._started = Latch()
        self._ended = Latch()
        self._output_done = Latch()

    def _set_ended(self) -> None:
        self._ended.set()
        if self.on_end is not None:
            try:
                self.on_end()
            except Exception:  # the reactor serves every run: it must not die
                log.exception("spawn reactor: a run's end failed")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: for ever); whether it has
        ended (or can no longer be watched)."""
        return self._ended.wait(timeout)

    def signal(self, sig: int) -> None:
        """Signal the command's group (gone already: nothing)."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """SIGKILL the group and wait for the command's end."""
        self.signal(signal.SIGKILL)
        self.wait()

    def finish_output(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the output pipes to end (a background
        child that got away may hold one open), then stop reading them."""
        if not self._output_done.wait(timeout):
            self.service.post(("drop", self))
            self._output_done.wait()


class SpawnService:
    """One spawn service and this process's reactor thread for it."""

    def __init__(self, *, fork: bool) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                ours.setsockopt(socket.SOL_SOCKET, opt, spawner.MAX_REQUEST)
                theirs.setsockopt(socket.SOL_SOCKET, opt, spawner.MAX_REQUEST)
            except OSError:
                pass
        self._proc: subprocess.Popen[bytes] | None = None
        if fork:
            pid = os.fork()
            if pid == 0:
                _serve_forked(theirs)
            self.pid = pid
        else:
            fd = theirs.fileno()
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _SERVE, os.path.dirname(spawner.__file__),
                 str(fd)], pass_fds=(fd,),
                stdin=subprocess.DEVNULL, start_new_session=True)
            self.pid = self._proc.pid
        theirs.close()
        self._sock = ours
        self.alive = True
        #: Set by stop(): the service's end is ours, not a death.
        self._stopping = False
        self._lock = threading.Lock()  # _runs, alive
        self._send_lock = threading.Lock()
        self._next_id = 0
        self._runs: dict[int, Spawned] = {}
        self._todo: collections.deque[tuple[str, Spawned]] = collections.deque()
        #: Set by the reactor as it ends (under _lock): a todo posted after
        #: it is settled by its poster, never left for a reactor that is gone.
        self._reactor_ended = False
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread = threading.Thread(target=self._react, name="spawn-reactor", daemon=True)
        self._thread.start()

    # -- from run threads ------------------------------------------------------

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None,
              out_fd: int, err_fd: int, beat_fd: int | None, fence: float | None, grace: float,
              ids: Ids | None, streams: Sequence[tuple[int, LineSink]],
              on_end: Callable[[], None] | None = None, since: float | None = None,
              limits: Mapping[str, object] | None = None) -> Spawned:
        """Start ``argv``; its output pipes' read ends ``streams`` are read
        from then on, and ``on_end`` is called once it ended. Under a
        ``fence``, ``since`` is the send time of the lease's last renewal
        (``time.monotonic()``; default: the service's receipt): the fence
        counts from it, and :class:`LeaseRanOut` is raised if it passed
        already. ``limits``: what the service's child sets before the command
        starts (:func:`dblockrun.running.resources.apply`). Raises OSError if
        it cannot be started (a bad ``cwd``, a limit it cannot set:
        :class:`LimitRefused`, or without a ``fence`` a command that cannot
        be executed)."""
        request = _request(argv, env, cwd, ids, fence, grace, since, limits)
        run = Spawned(self, streams, on_end)
        fds = [out_fd, err_fd] + ([beat_fd] if fence is not None and beat_fd is not None else [])
        with self._lock:
            if not self.alive:
                raise OSError(errno.EPIPE, "the spawn service died")
            self._next_id += 1
            run.id = self._next_id
            self._runs[run.id] = run
        request = b'{"id": %d, %s' % (run.id, request)
        # Not under _lock: the reactor, which takes it for each reply, must
        # keep reading while a send waits for room.
        try:
            with self._send_lock:
                socket.send_fds(self._sock, [request], fds)
        except OSError:
            with self._lock:
                self._runs.pop(run.id, None)
            raise
        run._started.wait()
        if run.error is not None:
            raise _start_error(run.error, argv[0], cwd)
        self.post(("add", run))
        return run

    def post(self, todo: tuple[str, Spawned]) -> None:
        """Hand ``todo`` to the reactor; once it has ended (the service died
        and nothing was left to read), settle it here: a run whose start
        raced the service's death has no output to read any more."""
        with self._lock:
            ended = self._reactor_ended
            if not ended:
                self._todo.append(todo)
        if ended:
            what, run = todo
            if what == "add":
                for fd, _sink in run.streams:
                    os.close(fd)
            run._output_done.set()
            return
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass

    def stop(self, timeout: float = 10.0) -> None:
        """The end of this process's use of the service (a command that ran
        commands, at its end: a daemon's ends with its process): the service
        ends once the commands it started have, then the reactor, which
        closes the socket."""
        global _current
        with _current_lock:
            if _current is self:
                _current = None
        self._stopping = True
        try:
            self._sock.shutdown(socket.SHUT_WR)  # the service reads its end
        except OSError:
            pass
        self._thread.join(timeout)
        if not self._thread.is_alive():
            os.close(self._wake_r)
            os.close(self._wake_w)

    # -- the reactor thread ----------------------------------------------------

    def _react(self) -> None:
        poll = select.poll()
        poll.register(self._sock, select.POLLIN)
        poll.register(self._wake_r, select.POLLIN)
        streams: dict[int, tuple[Spawned, LineSink, bytearray]] = {}
        while True:
            if not (self.alive or streams):
                # The service is gone and every pipe read: end, unless a run
                # started just before the death has posted its pipes since.
                with self._lock:
                    self._reactor_ended = not self._todo
                if self._reactor_ended:
                    break
                self._do_todo(poll, streams)
                continue
            for fd, _event in poll.poll():
                try:
                    if fd == self._sock.fileno() and self.alive:
                        if not self._reply(self._sock.recv(65536)):
                            poll.unregister(self._sock)
                    elif fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                        self._do_todo(poll, streams)
                    elif fd in streams:
                        self._read(poll, streams, fd)
                except Exception:  # the reactor serves every run: it must not die
                    log.exception("spawn reactor: unexpected error")
        self._sock.close()

    def _do_todo(self, poll: select.poll, streams: dict[int, tuple[Spawned, LineSink, bytearray]],
                 ) -> None:
        while self._todo:
            what, run = self._todo.popleft()
            if what == "add":
                for fd, sink in run.streams:
                    streams[fd] = (run, sink, bytearray())
                    poll.register(fd, select.POLLIN)
                if not run.streams:
                    run._output_done.set()
            else:  # drop
                for fd, _sink in run.streams:
                    if fd in streams:
                        self._close_stream(poll, streams, fd)
                run._output_done.set()

    def _read(self, poll: select.poll, streams: dict[int, tuple[Spawned, LineSink, bytearray]],
              fd: int) -> None:
        run, sink, pending = streams[fd]
        try:
            data = os.read(fd, MAX_LINE)
        except OSError:
            data = b""
        if data:
            _lines(pending, data, sink)
            return
        self._close_stream(poll, streams, fd)
        if not any(s in streams for s, _sink in run.streams):
            run._output_done.set()

    @staticmethod
    def _close_stream(poll: select.poll,
                      streams: dict[int, tuple[Spawned, LineSink, bytearray]], fd: int) -> None:
        _run, sink, pending = streams.pop(fd)
        poll.unregister(fd)
        os.close(fd)
        if pending:
            sink(bytes(pending))

    def _reply(self, data: bytes) -> bool:
        """Act on one message from the service; False once it is gone."""
        if not data:
            self._died()
            return False
        msg: dict[str, Any] = json.loads(data)
        with self._lock:
            run = self._runs.get(msg["id"])
            if run is None:
                return True
            if "pid" in msg:
                run.pid = msg["pid"]
                run._started.set()
                return True
            del self._runs[run.id]
        if "status" in msg:
            run.returncode = os.waitstatus_to_exitcode(msg["status"])
            run.cpu = msg.get("cpu")
            run._set_ended()
        else:
            num = msg["errno"]
            run.error = OSError(num, os.strerror(num), msg["step"])
            run._started.set()
        return True

    def _died(self) -> None:
        with self._lock:
            self.alive = False
            runs, self._runs = list(self._runs.values()), {}
        if self._proc is not None:
            code = self._proc.wait()
        else:
            code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        running = [run for run in runs if run._started.is_set()]
        if self._stopping and not running:
            return
        log.error("the spawn service (pid %d) died (status %d); stopping the %d command(s) "
                  "it watched", self.pid, code, len(running))
        for run in runs:
            if run._started.is_set():
                run.orphaned = True
                run._set_ended()
            else:
                run.error = OSError(errno.EPIPE, "the spawn service died", None)
                run._started.set()


def _request(argv: Sequence[str], env: Mapping[str, str], cwd: str | None, ids: Ids | None,
             fence: float | None, grace: float, since: float | None = None,
             limits: Mapping[str, object] | None = None) -> bytes:
    """A start request for the service, less its opening ``{"id": N, ``.
    Raises OSError (E2BIG) naming what is too large for the kernel to
    execute, or for one request (the run fails with that reason, its
    command never started; the service and every other run go on)."""
    fields: dict[str, object] = {"argv": list(argv), "env": dict(env), "cwd": cwd,
                                 "ids": list(ids) if ids is not None else None, "fence": fence,
                                 "since": since, "grace": grace}
    if limits is not None:
        fields["limits"] = limits
    body = json.dumps(fields).encode()[1:]
    # Four bytes a character at most, and the request holds every character
    # (JSON escapes only lengthen it): only a request this long can hold a
    # string over the limit, and only a long string is encoded to measure it.
    if len(body) * 4 >= MAX_ARG:
        long = [("an argument", a) for a in argv if len(a) * 4 >= MAX_ARG]
        long += [(f"variable {k[:80]}", f"{k}={v}") for k, v in env.items()
                 if (len(k) + len(v) + 1) * 4 >= MAX_ARG]
        for what, text in long:
            size = len(os.fsencode(text)) + 1  # with its NUL
            if size > MAX_ARG:
                raise OSError(errno.E2BIG, f"{what} is {size:,} bytes: at most {MAX_ARG:,} "
                              "(Linux's limit for one argument or variable)")
    if len(body) + 32 > spawner.MAX_REQUEST:
        raise OSError(errno.E2BIG, f"the command and its environment are {len(body):,} bytes: "
                      f"at most {spawner.MAX_REQUEST:,} (the spawn service's limit)")
    return body


def _start_error(error: OSError, command: str, cwd: str | None) -> OSError:
    """The service's report (``filename``: the step that failed) as the
    error starting the command raises."""
    step = error.filename
    if step == spawner.LEASE_STEP:
        return LeaseRanOut(error.errno, "the lease ran out before the command could start")
    if step == "exec":
        return OSError(error.errno, error.strerror, command)
    if step == "cwd":
        return OSError(error.errno, error.strerror, cwd)
    if step in LIMIT_STEPS:
        refused = LimitRefused(error.errno, error.strerror)
        refused.key = step
        return refused
    if step is None:
        return error
    return OSError(error.errno, f"{error.strerror} ({step})")


def _lines(buf: bytearray, data: bytes, sink: LineSink) -> None:
    """Each whole line of ``buf + data`` to ``sink``; a line longer than 64 KiB
    in 64 KiB pieces; the rest stays in ``buf``."""
    buf += data
    start = 0
    while (end := buf.find(b"\n", start) + 1) > 0:
        while end - start > MAX_LINE:
            sink(bytes(buf[start : start + MAX_LINE]))
            start += MAX_LINE
        sink(bytes(buf[start:end]))
        start = end
    while len(buf) - start >= MAX_LINE:
        sink(bytes(buf[start : start + MAX_LINE]))
        start += MAX_LINE
    del buf[:start]


def _serve_forked(sock: socket.socket) -> None:
    """In the forked child: become the service. The parent was single-threaded,
    so nothing it held is locked here; its objects are left alone (frozen out
    of the collector's way, never finalized: the child ends in ``os._exit``).
    The daemon may fork it while holding collections back: they resume here."""
    try:
        gc.freeze()
        gc.enable()
        signal.set_wakeup_fd(-1)
        os.setsid()
        keep = sock.fileno()
        os.closerange(3, keep)  # the database connection and the rest
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        spawner.serve(keep)
    finally:
        os._exit(0)


_current: SpawnService | None = None
_current_lock = threading.Lock()


def start(*, fork: bool = False) -> SpawnService:
    """This process's spawn service, started if there is none or it died.

    Call it before starting any thread. ``fork``: become the service by a
    fork of this process, if it has a single thread (``exec``: no new
    interpreter to start); else a fresh ``python -I -S``.
    """
    global _current
    with _current_lock:
        if _current is None or not _current.alive:
            if _current is not None:
                log.warning("starting a new spawn service")
            _current = SpawnService(fork=fork and _single_threaded())
        return _current


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _forget() -> None:
    """In a forked child: the parent's service is not this process's."""
    global _current, _current_lock
    _current = None
    _current_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget)
