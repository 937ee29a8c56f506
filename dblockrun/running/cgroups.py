"""cgroup v2 groups for the commands of jobs with ``limits:``, where the
daemon's cgroup is delegated to it (systemd's ``Delegate=yes``).

The daemon's cgroup (its *base*) then holds no process of its own: the
daemon and its spawn service move to a leaf ``daemon`` (cgroup v2 puts
processes only in leaves once controllers are enabled below), and each run
of a job with ``memory``, ``cpu`` or ``tasks`` gets a group of its own,
``run-N-JOB``, with ``memory.max`` (and ``memory.oom.group``: the kernel's
OOM killer ends the whole command), ``cpu.max`` and ``pids.max``. The spawn
service's child joins it before the command starts, so everything the
command starts is in it, whatever session or process group it makes; the
run's end kills what is left of it (``cgroup.kill``) and removes it.

:func:`find` says whether this process's cgroup can be used, or why not
(it reads ``/proc/self/cgroup`` and ``/proc/self/mountinfo``).
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
import time
from dataclasses import dataclass

#: The controllers a job's limits need: ``memory`` for memory, ``pids`` for
#: tasks, ``cpu`` for cpu.
CONTROLLERS = ("memory", "pids", "cpu")
#: The leaf the daemon and its spawn service move to.
LEAF = "daemon"
#: cgroup v2's period for ``cpu.max``, in microseconds (its default).
CPU_PERIOD = 100_000
#: How long a run's group may take to empty after ``cgroup.kill``.
EMPTY_WITHIN = 5.0


@dataclass(frozen=True)
class Delegation:
    """A cgroup v2 this process may make groups under."""

    #: Its directory (``/sys/fs/cgroup/system.slice/dblockrun.service``).
    base: str
    #: The controllers it offers its children (``cgroup.controllers``).
    controllers: frozenset[str]


def own_cgroup(proc_cgroup: str) -> str | None:
    """This process's cgroup v2 path in ``/proc/self/cgroup``'s text (the
    ``0::`` line); None: only cgroup v1."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def cgroup2_mount(mountinfo: str) -> tuple[str, str] | None:
    """(mount point, root within the hierarchy) of the first cgroup2 file
    system in ``/proc/self/mountinfo``'s text; None: none mounted."""
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        if after.split(" ", 1)[0] == "cgroup2":
            fields = before.split()
            return _unescape(fields[4]), _unescape(fields[3])
    return None


def _unescape(path: str) -> str:
    """A mountinfo path: spaces and the like are octal escapes (``\\040``)."""
    return path.encode().decode("unicode_escape") if "\\" in path else path


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def find(wanted: tuple[str, ...] = CONTROLLERS) -> Delegation | str:
    """This process's cgroup v2, if it can make groups under it with one of
    the ``wanted`` controllers at least (its ``controllers`` say which);
    else why not, in a sentence."""
    try:
        path = own_cgroup(_read("/proc/self/cgroup"))
        mount = cgroup2_mount(_read("/proc/self/mountinfo"))
    except OSError as exc:
        return f"cannot read this process's cgroups ({exc.strerror})"
    if path is None or mount is None:
        return "this host has no cgroup v2 (cgroup v1 only)"
    point, root = mount
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root.rstrip("/")):] or "/"
    base = os.path.normpath(point + "/" + path.lstrip("/"))
    try:
        offered = frozenset(_read(os.path.join(base, "cgroup.controllers")).split())
    except OSError as exc:
        return f"cannot read its cgroup v2 {base} ({exc.strerror})"
    if wanted and not offered & set(wanted):
        has = ", ".join(sorted(offered)) or "none"
        return (f"its cgroup v2 {base} offers no {' or '.join(wanted)} controller "
                f"(it has: {has}); on a cgroup v1 or hybrid host they are v1's")
    if not (os.access(base, os.W_OK) and os.access(os.path.join(base, "cgroup.subtree_control"),
                                                   os.W_OK)):
        return (f"its cgroup v2 {base} is not delegated to it (cannot write there; "
                "systemd: Delegate=yes in the unit)")
    return Delegation(base, offered)


def take(found: Delegation, daemon: int, service: int) -> str | None:
    """Make ``found`` the runs' parent: move the ``daemon``, its spawn
    ``service`` and the commands it runs to its leaf and enable the
    controllers it offers for its children; None, or why it cannot be used
    (it holds other processes: it is not the daemon's own). Leftovers of an
    earlier daemon's runs that have ended are removed."""
    base = found.base
    try:
        procs = {int(p) for p in _read(os.path.join(base, "cgroup.procs")).split()}
    except OSError as exc:
        return f"cannot read its cgroup v2 {base} ({exc.strerror})"
    others = {pid for pid in procs - {daemon, service} if not _descends(pid, service)}
    if others:
        return (f"its cgroup v2 {base} holds {len(others)} other process(es): give the daemon "
                "a cgroup of its own (systemd: a service with Delegate=yes)")
    leaf = os.path.join(base, LEAF)
    try:
        os.makedirs(leaf, exist_ok=True)
        for pid in sorted(procs):
            try:
                _write(os.path.join(leaf, "cgroup.procs"), str(pid))
            except ProcessLookupError:
                pass  # a command that ended meanwhile
        _write(os.path.join(base, "cgroup.subtree_control"),
               " ".join(f"+{c}" for c in CONTROLLERS if c in found.controllers))
    except OSError as exc:
        return f"cannot set up its cgroup v2 {base} ({exc.strerror})"
    for name in os.listdir(base):
        if name.startswith("run-"):
            try:
                os.rmdir(os.path.join(base, name))
            except OSError:
                pass  # still holds processes: left as it is
    return None


def _descends(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` descends from ``ancestor`` (a command the
    spawn service started, or what that started and still waits for)."""
    for _ in range(64):
        try:
            stat = _read(f"/proc/{pid}/stat")
        except OSError:
            return False
        pid = int(stat[stat.rfind(")") + 2:].split()[1])
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


_serial = itertools.count(1)


class RunGroup:
    """One run's cgroup: made with its limits before the command starts,
    read and removed after its end."""

    def __init__(self, base: str, job: str, *, memory: int | None, cpu: int | None,
                 tasks: int | None) -> None:
        """Raises OSError if it cannot be made (nothing is left behind)."""
        self.memory, self.cpu, self.tasks = memory, cpu, tasks
        self.path = os.path.join(base, f"run-{os.getpid()}-{next(_serial)}-{job}")
        os.mkdir(self.path)
        try:
            if memory is not None:
                _write(os.path.join(self.path, "memory.max"), str(memory))
                # An OOM kill ends the whole command, not one of its processes.
                _write(os.path.join(self.path, "memory.oom.group"), "1")
                # The limit is all it gets: swapping past it would keep it
                # going slowly instead (Docker's --memory-swap equal to --memory).
                try:
                    _write(os.path.join(self.path, "memory.swap.max"), "0")
                except OSError:
                    pass  # no swap accounting: no swap to keep it from
            if cpu is not None:
                _write(os.path.join(self.path, "cpu.max"),
                       f"{cpu * CPU_PERIOD // 100} {CPU_PERIOD}")
            if tasks is not None:
                _write(os.path.join(self.path, "pids.max"), str(tasks))
        except OSError:
            os.rmdir(self.path)
            raise

    def events(self, name: str) -> dict[str, int]:
        """A ``*.events`` file's counters (``memory.events``: ``oom_kill`` ...);
        empty if it cannot be read."""
        try:
            text = _read(os.path.join(self.path, name))
        except OSError:
            return {}
        pairs = (line.split() for line in text.splitlines())
        return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}

    def remove(self) -> None:
        """Kill what is left in the group and remove it."""
        deadline = time.monotonic() + EMPTY_WITHIN
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                    return  # left for the next daemon's start to remove
            self.kill()
            time.sleep(0.01)

    def kill(self) -> None:
        """SIGKILL every process in the group."""
        try:
            _write(os.path.join(self.path, "cgroup.kill"), "1")
            return
        except OSError:
            pass  # before Linux 5.14: each process
        try:
            pids = _read(os.path.join(self.path, "cgroup.procs")).split()
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
