"""The guard: a tiny process between the daemon and each command.

It leads the command's process group and stops the whole group (SIGTERM,
then SIGKILL after a grace) when

* the daemon dies (kill -9, OOM): its end of the guard's pipe closes; or
* the daemon stops confirming renewals (frozen by SIGSTOP, database
  unreachable, lock lost) for ``fence`` seconds: the daemon writes one byte
  to the pipe after every successful lease renewal.

So a command never outlives its lease, whatever happens to its daemon. It
runs as ``python -I -S -c GUARD_SOURCE FD FENCE GRACE USER CMD...`` and imports
only built-in modules (about 15 ms to start). ``USER`` is ``-`` or
``uid:gid:groups`` (a job's ``user:``): the guard keeps the daemon's user and
switches only the command, so the command cannot kill its watchdog.
"""

from __future__ import annotations

import os
import sys

GUARD_SOURCE = r"""
import os, select, signal, sys, time
fd, fence, grace = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
user = sys.argv[4]
argv = sys.argv[5:]
# Signals reach the command directly (same process group); the guard only
# waits for it and keeps watch.
# SIGPIPE too: the output pipe's reader is the daemon, which may be dead.
WATCHED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE)
for s in WATCHED:
    signal.signal(s, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    for s in WATCHED:
        signal.signal(s, signal.SIG_DFL)
    os.close(fd)
    try:
        if user != "-":
            uid, gid, groups = user.split(":")
            os.setgroups([int(g) for g in groups.split(",") if g])
            os.setgid(int(gid))
            os.setuid(int(uid))
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, ("dblockrun: cannot run %s: %s\n" % (argv[0], exc.strerror)).encode())
        os._exit(127)
pidfd = os.pidfd_open(pid)
last = time.monotonic()
why = None
while why is None:
    timeout = max(0.0, last + fence - time.monotonic())
    ready, _, _ = select.select([fd, pidfd], [], [], timeout)
    if pidfd in ready:
        break
    if fd in ready:
        if os.read(fd, 64):
            last = time.monotonic()
        else:
            why = "daemon gone"
    elif time.monotonic() >= last + fence:
        why = "lease not renewed for %gs" % fence
if why is not None:
    try:
        os.write(2, ("dblockrun guard: %s; stopping the command\n" % why).encode())
    except OSError:
        pass
    try:
        os.killpg(0, signal.SIGTERM)
    except OSError:
        pass
    end = time.monotonic() + grace
    while time.monotonic() < end:
        if select.select([pidfd], [], [], max(0.0, end - time.monotonic()))[0]:
            break
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.killpg(0, signal.SIGKILL)
_, status = os.waitpid(pid, 0)
if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
os._exit(os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 1)
"""


def guard_argv(read_fd: int, fence: float, grace: float, argv: list[str],
               user: str | None = None) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", GUARD_SOURCE, str(read_fd), repr(fence),
            repr(grace), user or "-", *argv]


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
