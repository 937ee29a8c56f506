"""A job's ``limits:`` on its commands: how this process enforces them, what
the spawn service sets in the command's process before it starts
(dblockrun/running/spawner.py), and which limit ended a run.

Set in the spawn service's child, before the command is executed, so they
hold for everything the command starts:

* ``open-files`` (RLIMIT_NOFILE) and ``cpu-time`` (RLIMIT_CPU: each process
  gets SIGXCPU at it, SIGKILL a second later);
* ``nice`` (``setpriority``) and ``io``: the I/O scheduling class, set by
  util-linux's ``ionice -p`` on the child (Python has no ``ioprio_set``,
  and the project binds no C function by hand);
* ``memory``, ``cpu`` and ``tasks``: where the daemon's cgroup v2 is
  delegated to it (dblockrun/running/cgroups.py), the run's own cgroup with
  ``memory.max``, ``cpu.max`` and ``pids.max``, which the child joins; elsewhere
  ``memory`` is an address-space limit (RLIMIT_AS), ``tasks`` RLIMIT_NPROC
  (every process of the job's user counts, and root's are never limited)
  and ``cpu`` is not enforced. The daemon says which, once, at its start
  (:func:`start`).

A run the kernel ended at a limit is told by the limit: its cgroup's OOM
kills (``memory.events``) or refused forks (``pids.events``); for
``cpu-time``, a command killed by SIGXCPU (or SIGKILL) with the CPU time
its process used at the limit. Under RLIMIT_AS and RLIMIT_NPROC nothing kills
the command: an allocation or a fork fails inside it, and a failed run
whose last output says so (``MemoryError``, ``Cannot allocate memory``,
``Cannot fork`` ...) is told by the limit.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import shutil
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from dblockrun.durations import format_duration
from dblockrun.jobs import IO_CLASSES, Job, Limits, format_size
from dblockrun.running import cgroups
from dblockrun.running.cgroups import Delegation, RunGroup

log = logging.getLogger("dblockrun")

#: Where ionice is looked for besides the daemon's PATH.
_SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
#: The last bytes of a failed run's output that are searched for an
#: allocation or fork the command was refused.
_LOOK_BACK = 4096
#: What commands print when an allocation fails (Python, C and its strerror,
#: C++, Java, Go, Node, Rust, Ruby, Perl, bash), lower case.
_OUT_OF_MEMORY = ("memoryerror", "cannot allocate memory", "out of memory", "bad_alloc",
                  "outofmemoryerror", "failed to allocate memory", "memory allocation of",
                  "xmalloc: cannot allocate")
#: ... and when a fork fails (dash, bash, busybox, perl).
_NO_FORK = ("cannot fork", "can't fork", "fork: resource temporarily unavailable",
            "fork: retry")


#: The limits a cgroup v2 enforces, each with its controller.
CGROUP_LIMITS = {"memory": "memory", "cpu": "cpu", "tasks": "pids"}


@dataclass(frozen=True)
class Enforcement:
    """How this process enforces limits."""

    #: The delegated cgroup v2 runs get groups under; None: rlimits only.
    cgroups: Delegation | None = None
    #: Why there is none (a sentence), for the start-up warning.
    why_not: str = "no daemon set it up"
    #: util-linux's ionice; None: not found (``io`` not set).
    ionice: str | None = None

    def by_cgroup(self, limit: str) -> bool:
        """Whether ``limit`` (``memory``, ``cpu``, ``tasks``) is the run's cgroup's."""
        return self.cgroups is not None and CGROUP_LIMITS[limit] in self.cgroups.controllers


_current: Enforcement | None = None
#: The cgroup limits the jobs had when it was decided.
_decided_for: frozenset[str] = frozenset()


def current() -> Enforcement:
    """How limits are enforced here: as the daemon's start decided, else
    (``exec``, the Python API, tests) rlimits, nice and ionice only."""
    global _current
    if _current is None:
        _current = Enforcement(ionice=_find_ionice())
    return _current


def _find_ionice() -> str | None:
    return shutil.which("ionice") or shutil.which("ionice", path=_SYSTEM_PATH)


def _cgroup_limits(jobs: Iterable[Job]) -> frozenset[str]:
    """The limits of ``jobs`` a cgroup would enforce (``memory``, ``cpu``, ``tasks``)."""
    return frozenset(name for job in jobs for name in CGROUP_LIMITS
                     if getattr(job.limits, name) is not None)


def start(jobs: Iterable[Job], spawn_pid: int) -> None:
    """The daemon, once a job has limits (at its start, or the reload that
    brings the first): decide how they are enforced (a delegated cgroup v2,
    or rlimits) and say so, once; again only after a reload that brings a
    kind of limit the decision did not cover. ``spawn_pid``: its spawn
    service, which moves with it to the cgroup's leaf."""
    global _current, _decided_for
    jobs = list(jobs)
    wanted = _cgroup_limits(jobs)
    if not any(job.limits.any for job in jobs) or (
            _current is not None and wanted <= _decided_for):
        return
    ionice = _find_ionice()
    if _current is not None and _current.cgroups is not None:
        how = _current  # taken already: the daemon is in its leaf now
    elif wanted:
        controllers = tuple(CGROUP_LIMITS[name] for name in sorted(wanted))
        found = cgroups.find(controllers)
        if isinstance(found, Delegation):
            found = cgroups.take(found, os.getpid(), spawn_pid) or found
        how = (Enforcement(found, "", ionice) if isinstance(found, Delegation)
               else Enforcement(None, found, ionice))
    else:
        how = Enforcement(None, "no job's limits need one", ionice)
    _current, _decided_for = how, wanted
    text, short = describe(how, jobs)
    log.log(logging.WARNING if short else logging.INFO, "%s", text)


def describe(how: Enforcement, jobs: Iterable[Job]) -> tuple[str, bool]:
    """One line: how the jobs' limits are enforced on this host; and
    whether any falls short of what the jobs file asks (a warning)."""
    jobs = list(jobs)

    def having(attr: str) -> list[str]:
        return [job.name for job in jobs if getattr(job.limits, attr) is not None]

    def named(names: list[str]) -> str:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return f"job{'s' if len(names) > 1 else ''} {shown}"

    wanted = _cgroup_limits(jobs)
    grouped = [name for name in CGROUP_LIMITS if name in wanted and how.by_cgroup(name)]
    if grouped and how.cgroups is not None:
        kinds = (", ".join(grouped[:-1]) + " and " if len(grouped) > 1 else "") + grouped[-1]
        head = f"limits: {kinds} by a cgroup v2 per run under {how.cgroups.base}"
    elif not wanted or how.cgroups is not None:
        head = "limits: set in each command's process before it starts"
    else:
        head = f"limits: no delegated cgroup v2 ({how.why_not})"
    parts: list[str] = []
    if how.cgroups is not None and len(grouped) < len(wanted):
        has = ", ".join(sorted(how.cgroups.controllers)) or "none"
        parts.append(f"its cgroup v2 offers only these controllers: {has}")
    if having("memory") and not how.by_cgroup("memory"):
        parts.append("memory is an address-space limit (RLIMIT_AS: memory a program "
                     "reserves counts too)")
    if having("tasks") and not how.by_cgroup("tasks"):
        root = [job.name for job in jobs
                if job.limits.tasks is not None and job.user is None and os.geteuid() == 0]
        note = (f"; none for {named(root)}: run as root, whose processes the kernel "
                "does not count") if root else ""
        parts.append(f"tasks counts every process of the job's user (RLIMIT_NPROC){note}")
    if having("cpu") and not how.by_cgroup("cpu"):
        parts.append(f"cpu is not enforced ({named(having('cpu'))})")
    if having("io") and how.ionice is None:
        parts.append(f"io is not enforced: no ionice (util-linux) found ({named(having('io'))})")
    return "; ".join([head, *parts]), bool(parts)


@dataclass
class Applied:
    """A command's limits as its spawn request carries them, and its cgroup."""

    limits: Limits
    #: The spawn request's ``limits`` (dblockrun/running/spawner.py).
    request: dict[str, object]
    group: RunGroup | None = None

    def ended_by(self, exit_code: int | None, cpu: float | None, tail: bytes) -> str | None:
        """The limit that ended a command that failed (``exit_code``:
        negative for a signal; ``cpu``: the CPU seconds it used; ``tail``:
        its output), as its record says it (``out of memory (limit
        512M)``); None: none did, as far as can be told. Before :meth:`close`."""
        return _ended_by(self, exit_code, cpu, tail)

    def refused(self, key: str, error: OSError) -> str:
        """Why limit ``key`` could not be set (``nice -5: Operation not
        permitted``), for the run's record."""
        if key == "cgroup":
            return f"cannot join its cgroup {self.request['cgroup']}: {error.strerror}"
        shown = next((f"{k} {v}" for k, v in self.limits.items() if k == key), key)
        rlimit = next((e[1] for e in self.request["rlimits"]  # type: ignore[attr-defined]
                       if e[0] == key), None)
        if error.errno == errno.EPERM and rlimit is not None:
            hard = resource.getrlimit(rlimit)[1]
            return (f"{shown}: above the daemon's own hard limit "
                    f"({'unlimited' if hard == resource.RLIM_INFINITY else hard}), which "
                    "only a privileged daemon (CAP_SYS_RESOURCE) may raise")
        return f"{shown}: {error.strerror}"

    def close(self) -> None:
        """Remove the run's cgroup (what is left in it is killed)."""
        if self.group is not None:
            self.group.remove()
            self.group = None


def apply(limits: Limits, job: str) -> Applied | None:
    """What the spawn service sets for a command with ``limits`` (None:
    none), its cgroup made if it gets one. Raises OSError if that cannot
    be made."""
    if not limits.any:
        return None
    how = current()
    grouped = {name: getattr(limits, name) for name in CGROUP_LIMITS
               if getattr(limits, name) is not None and how.by_cgroup(name)}
    group = None
    if grouped and how.cgroups is not None:
        group = RunGroup(how.cgroups.base, job, memory=grouped.get("memory"),
                         cpu=grouped.get("cpu"), tasks=grouped.get("tasks"))
    rlimits: list[tuple[str, int, int, int]] = []
    if limits.memory is not None and "memory" not in grouped:
        rlimits.append(("memory", resource.RLIMIT_AS, limits.memory, limits.memory))
    if limits.tasks is not None and "tasks" not in grouped:
        rlimits.append(("tasks", resource.RLIMIT_NPROC, limits.tasks, limits.tasks))
    if limits.cpu_time is not None:  # SIGXCPU at the limit, SIGKILL a second later
        rlimits.append(("cpu-time", resource.RLIMIT_CPU, limits.cpu_time, limits.cpu_time + 1))
    if limits.open_files is not None:
        rlimits.append(("open-files", resource.RLIMIT_NOFILE, limits.open_files,
                        limits.open_files))
    io = None
    if limits.io is not None and how.ionice is not None:
        kind, _, level = limits.io.partition(" ")
        io = [how.ionice, IO_CLASSES[kind], int(level) if level else None]
    request: dict[str, object] = {"rlimits": rlimits, "nice": limits.nice, "io": io,
                                  "cgroup": group.path if group is not None else None}
    return Applied(limits, request, group)


def _ended_by(applied: Applied, exit_code: int | None, cpu: float | None,
              tail: bytes) -> str | None:
    """:meth:`Applied.ended_by`."""
    if exit_code == 0 or exit_code is None:
        return None
    limits, group = applied.limits, applied.group
    said = tail[-_LOOK_BACK:].decode("utf-8", "replace").lower()
    if limits.memory is not None:
        if group is not None and group.memory is not None:
            events = group.events("memory.events")
            hit = events.get("oom_kill", 0) > 0 or events.get("oom_group_kill", 0) > 0
        else:
            hit = any(words in said for words in _OUT_OF_MEMORY)
        if hit:
            return f"out of memory (limit {format_size(limits.memory)})"
    if limits.cpu_time is not None and cpu is not None:
        # Killed by (or a shell's child killed by) SIGXCPU at the limit or SIGKILL
        # a second later, having used about that much CPU: wait4's rusage
        # comes from sampled ticks and reads up to an eighth less than the
        # kernel's exact count the limit is checked against (0.875s for 1s).
        died = {-exit_code, exit_code - 128}
        if (signal.SIGXCPU in died and cpu >= 0.5 * limits.cpu_time) or (
                signal.SIGKILL in died and cpu >= 0.8 * limits.cpu_time):
            return f"out of CPU time (limit {format_duration(limits.cpu_time)})"
    if limits.tasks is not None:
        if group is not None and group.tasks is not None:
            hit = group.events("pids.events").get("max", 0) > 0
        else:
            hit = any(words in said for words in _NO_FORK)
        if hit:
            return f"out of tasks (limit {limits.tasks})"
    return None
