"""The frozen model of a jobs file, shared by the loader, scheduler and store."""

from __future__ import annotations

import re
import weakref
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import date
from functools import cached_property
from typing import Any

from dblockrun.durations import format_duration

#: The seat rows of a limit group (dblockrun/scheduling/limits.py) in the locks table
#: are named ``group:NAME:N``; no job can be (a job name has no ``:``).
SEAT_PREFIX = "group:"
#: The lane rows of an ``overlap: allow N`` job (dblockrun/scheduling/limits.py),
#: ``lane:JOB:1`` ... ``lane:JOB:N``: each running run holds one, with the
#: job's fencing token of its claim. Neither kind of row is a job.
LANE_PREFIX = "lane:"

#: What a job (and an exec lock) may be called.
JOB_NAME = re.compile(r"[A-Za-z0-9._-]+")

#: What a daemon does with the slots that came while no daemon ran the job
#: (``catch-up:``; dblockrun/catchup.py): the newest runs, none, or up to
#: ``catch-up-limit`` of them, oldest first.
CATCH_UP = ("latest", "none", "all")
#: What a slot due while the job's run is still going becomes (``overlap:``;
#: dblockrun/scheduling/planner.py): skipped, the one slot waiting for the
#: run's end, the run stopped and the slot started once it has ended, or
#: (``allow N``) started alongside while fewer than N runs of the job go on
#: across the fleet (dblockrun/scheduling/limits.py: its lanes).
OVERLAP = ("forbid", "queue", "replace", "allow")
#: What a full group (or a host at ``--max-running``) does with a slot.
WHEN_FULL = ("skip", "queue")
#: ``when-full: queue`` without a bound: at most this many slots wait.
DEFAULT_QUEUE = 10

#: A command: a string runs through the job's shell (``sh -c``), a tuple is exec'd.
Command = str | tuple[str, ...]

#: ``run-on:``: label -> the values it accepts, sorted by label (dblockrun/scheduling/targeting.py).
RunOn = tuple[tuple[str, tuple[str, ...]], ...]

#: The most bytes (its NUL included) of one argument, or environment entry
#: ``NAME=value``, of a command: Linux executes none over MAX_ARG_STRLEN
#: (32 pages); a byte less, for margin.
MAX_ARG = 32 * 4096 - 1
#: The most a job's command line and ``env:`` may hold together, in bytes:
#: a quarter of what the spawn service takes in one request (1 MiB,
#: dblockrun/running/spawner.py MAX_REQUEST), the rest left for the environment
#: the command inherits and the request's encoding.
MAX_COMMAND_BYTES = 256 * 1024

#: The longest fan-out item, in characters: a run's record holds its item
#: in a column this wide (dblockrun/store/schema.py). A longer one is
#: refused at load (``items:``), or fails alone (a line of ``items-command``).
MAX_ITEM = 1000


def item_too_long(item: str) -> str | None:
    """Why ``item`` cannot be a fan-out item (its length), else None."""
    if len(item) <= MAX_ITEM:
        return None
    return (f"item {item[:40]!r}... is {len(item):,} characters long: at most {MAX_ITEM:,} "
            "(a run's record holds its item)")


#: Joins an every-host job's name and a host's name into its lock row's name
#: (``rotate-logs@web-1``); job names cannot contain it.
EVERY_HOST_SEP = "@"


@dataclass(frozen=True, slots=True)
class OnFailure:
    disable_for: float | None = None  # seconds
    command: Command | None = None

    @property
    def wanted(self) -> bool:
        """Whether a failure has anything to do."""
        return bool(self.disable_for) or self.command is not None


#: Where a secret URL (``notify:``, ``ping:``) comes from: written in the
#: jobs file, ``{env: VAR}`` or ``{file: PATH}`` (read by dblockrun/config/secreturl.py).
LITERAL, ENV, FILE = "literal", "env", "file"


@dataclass(frozen=True, slots=True)
class SecretUrl:
    """A URL and where it comes from; ``value`` is empty until resolved
    (a literal's is its text)."""

    source: str  # LITERAL, ENV or FILE
    #: The variable's name, or the file's path (relative to the jobs file's folder).
    ref: str = ""
    value: str = field(default="", repr=False)
    #: Where it was written, for messages.
    line: int = field(default=0, compare=False)
    key: str = field(default="", compare=False)

    def describe(self) -> str:
        """Where the URL comes from, for messages and the definition hash:
        never its value."""
        if self.source == ENV:
            return f"env {self.ref}"
        if self.source == FILE:
            return f"file {self.ref}"
        return "literal"

    def definition(self) -> str:
        """What defines it across hosts: a variable's or file's name (each
        host may hold its own value), a literal's text (hashed, never shown)."""
        return self.value if self.source == LITERAL else self.describe()


#: What ``notify: {on: [...]}`` is when left out.
NOTIFY_EVENTS = ("failure", "recovery", "timeout", "missed")
#: The run-end events (the others: ``missed``).
RUN_END_EVENTS = ("failure", "recovery", "timeout")
#: ``on: change``: a run's end is sent only when its result differs from the
#: previous run's (with no run-end event named: each of them, so).
CHANGE = "change"
#: The alerts of a job's ``expect:`` (dblockrun/notify/alerts.py): a slot
#: not started within ``start-within`` or a run not finished by
#: ``finish-by`` (late), a run past ``max`` (slow), one that ended under
#: ``min`` (fast). With ``on:`` left out they are sent too.
ALERT_EVENTS = ("late", "slow", "fast")
#: What ``notify: {on: [...]}`` may name.
NOTIFY_ON = (*NOTIFY_EVENTS, *ALERT_EVENTS, CHANGE)


@dataclass(frozen=True, slots=True)
class Notify:
    """``notify:``: apprise URLs, and the events sent to them."""

    urls: tuple[SecretUrl, ...]
    on: tuple[str, ...] = NOTIFY_EVENTS
    #: ``after: N``: failure notifications only from the Nth failure in a row.
    after: int = 1

    @property
    def on_change(self) -> bool:
        """Whether a run's end is sent only when its result changed."""
        return CHANGE in self.on

    def sends(self, event: str) -> bool:
        """Whether ``event`` is sent (a run-end one: when it happens, or with
        ``change``, when it changes the job's result)."""
        if event in self.on:
            return True
        if event in ALERT_EVENTS:  # `on:` left out: every event, the alerts too
            return self.on == NOTIFY_EVENTS
        return (self.on_change and event in RUN_END_EVENTS
                and not any(e in self.on for e in RUN_END_EVENTS))

    def definition(self) -> dict[str, object]:
        data: dict[str, object] = {"urls": [url.definition() for url in self.urls],
                                   "on": list(self.on)}
        if self.after != 1:  # hashes stay those of versions without `after:`
            data["after"] = self.after
        return data


@dataclass(frozen=True)
class Expect:
    """``expect:``: how long a job's runs should take and when they should
    start and end (seconds; None: not expected). Checked by every daemon
    that has the job, each alert claimed once across the fleet
    (dblockrun/notify/alerts.py)."""

    #: ``max:``: a run still going after this long is ``slow``.
    max: float | None = None
    #: ``min:``: a run that ended sooner is ``fast``.
    min: float | None = None
    #: ``finish-by: "06:00"``: a slot's run not finished by this time of day
    #: (the job's time zone; the first such time at or after the slot) is ``late``.
    finish_by: str | None = None
    #: ``start-within:``: a slot not started this long after it is ``late``.
    start_within: float | None = None

    @property
    def watched(self) -> bool:
        """Whether the daemons look at the job's state each bookkeeping round
        (``min`` alone is checked when a run ends)."""
        return (self.max is not None or self.finish_by is not None
                or self.start_within is not None)

    def text(self) -> str:
        """``max 2h, min 30s, finish-by 06:00, start-within 5m``."""
        parts = [("max", _seconds_text(self.max)), ("min", _seconds_text(self.min)),
                 ("finish-by", self.finish_by),
                 ("start-within", _seconds_text(self.start_within))]
        return ", ".join(f"{key} {value}" for key, value in parts if value is not None)


@dataclass(frozen=True)
class Storm:
    """``notify-storm:`` (top level): when more than ``threshold`` jobs pass
    slots for one cause within ``window`` seconds, one notification names
    the cause and up to ``max_names`` of the jobs instead of one per job
    (dblockrun/notify/storm.py). A passed slot's notification waits
    ``wait`` seconds for the others of its cause."""

    threshold: int = 10
    window: float = 60.0
    max_names: int = 20
    wait: float = 5.0


#: ``limits: {io: ...}``: the I/O scheduling classes, as ionice(1) and
#: systemd's ``IOSchedulingClass=`` name them, each with its ioprio class
#: number; the first two take a level from 0 (first) to 7.
IO_CLASSES = {"realtime": 1, "best-effort": 2, "idle": 3}
#: ``limits:``'s keys, in the order the file reference and ``status`` show them.
LIMIT_KEYS = ("memory", "cpu", "cpu-time", "tasks", "open-files", "nice", "io")
#: Size suffixes (``512M``): powers of 1024, as systemd's ``MemoryMax=``.
SIZE_UNITS = (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))


def format_size(size: int) -> str:
    """``size`` bytes in the largest unit it is a whole number of (``512M``)."""
    for unit, factor in SIZE_UNITS:
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


@dataclass(frozen=True, slots=True)
class Limits:
    """``limits:``: what each command of the job may use, set before it
    starts on everything it starts (dblockrun/running/resources.py); None:
    no limit of that kind."""

    #: Bytes: the run's cgroup's ``memory.max``, else an address-space limit.
    memory: int | None = None
    #: Percent of one CPU (``cpu: 50%``; 200: two CPUs): cgroup v2's ``cpu.max`` only.
    cpu: int | None = None
    #: Whole seconds of CPU each process may use (RLIMIT_CPU).
    cpu_time: int | None = None
    #: Processes (threads count): the run's cgroup's ``pids.max``, else
    #: RLIMIT_NPROC, which counts every process of the job's user.
    tasks: int | None = None
    #: Descriptors each process may hold open (RLIMIT_NOFILE).
    open_files: int | None = None
    #: The command's niceness, -20 to 19.
    nice: int | None = None
    #: The I/O scheduling class, with its level: ``idle``, ``best-effort 7``.
    io: str | None = None

    @property
    def any(self) -> bool:
        """Whether any limit is set (asked at every start: a comparison with
        the default, not a walk over the fields)."""
        return self is not NO_LIMITS and self != NO_LIMITS

    def items(self) -> list[tuple[str, str]]:
        """(key, value) of each limit set, as the jobs file writes them."""
        shown = {"memory": format_size(self.memory) if self.memory is not None else None,
                 "cpu": f"{self.cpu}%" if self.cpu is not None else None,
                 "cpu-time": _seconds_text(self.cpu_time), "tasks": self.tasks,
                 "open-files": self.open_files, "nice": self.nice, "io": self.io}
        return [(key, str(shown[key])) for key in LIMIT_KEYS if shown[key] is not None]

    def text(self) -> str:
        """``memory 512M, cpu-time 10m, nice 10``; empty without limits."""
        return ", ".join(f"{key} {value}" for key, value in self.items())


#: No limit of any kind: what a job without ``limits:`` shares.
NO_LIMITS = Limits()


def _seconds_text(seconds: float | None) -> str | None:
    return None if seconds is None else format_duration(seconds)


#: ``after: {on: ...}``: which upstream results start a run (dblockrun/daemon/chains.py).
AFTER_ON = {"success": ("ok",), "failure": ("failed", "timeout", "lost"),
            "any": ("ok", "failed", "timeout", "lost")}


@dataclass(frozen=True, slots=True)
class After:
    """``after:``: each finished run of one of ``jobs`` whose result ``on``
    takes starts one run of the job, once across the fleet."""

    jobs: tuple[str, ...]
    on: str = "success"

    @property
    def results(self) -> tuple[str, ...]:
        """The upstream results (``ok``, ``failed``, ``timeout``, ``lost``) that start a run."""
        return AFTER_ON[self.on]

    def text(self) -> str:
        """``after extract``, ``after load, rebuild (on failure)``: as ``status`` shows it."""
        on = "" if self.on == "success" else f" (on {self.on})"
        return f"after {', '.join(self.jobs)}{on}"


@dataclass(frozen=True, slots=True)
class Calendar:
    """A named calendar (``calendars:`` at the top): days on which the jobs
    that exclude it have no slot, each day read in the job's time zone
    (dblockrun/scheduling/calendars.py)."""

    name: str
    days: frozenset[date]
    #: ``file:`` as written (relative to the jobs file's folder); None: ``dates:`` only.
    file: str | None = None

    def text(self) -> str:
        """``nl-holidays: 3 days, 2026-12-25 to 2027-01-01 (#1a2b3c4d)``: as the
        Job page shows it and the definition hash reads it (the digest of
        the days: two hosts whose files differ differ here)."""
        if not self.days:
            return f"{self.name}: no days"
        first, last = min(self.days), max(self.days)
        days = ",".join(day.isoformat() for day in sorted(self.days))
        return (f"{self.name}: {len(self.days)} day{'s' if len(self.days) > 1 else ''}, "
                f"{first} to {last} (#{_digest(days, 8, None)})")


@dataclass(frozen=True, slots=True)
class Window:
    """A blackout window (``blackout:``), in the job's time zone: weekly
    (``sat 22:00/6h``: each Saturday from 22:00, 6 hours) or dated
    (``2026-12-31 18:00/12h``)."""

    #: As written (spaces collapsed): the reason a slot in it is skipped.
    text: str
    #: Its start, seconds after midnight (wall time).
    start: int
    #: How long it lasts, seconds (elapsed time, as every duration of the file).
    length: float
    #: Weekly: the weekday it starts on (0 Monday ... 6 Sunday).
    weekday: int | None = None
    #: Dated: the day it starts on.
    day: date | None = None


@dataclass(frozen=True, slots=True)
class Active:
    """``active:``: the first and last day (in the job's time zone) with
    slots; None: open on that side."""

    first: date | None = None
    last: date | None = None

    def text(self) -> str:
        parts = ([f"from {self.first}"] if self.first else []) + (
            [f"until {self.last}"] if self.last else [])
        return " ".join(parts)


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Schedule:
    """When a cron job has slots: those of any of its expressions (a slot two
    share is one), read in its time zone; ``hash_id``, the job's name in the
    file, gives ``H`` its values (empty when no expression has one, so jobs
    that share a schedule share its computation: dblockrun/scheduling/cron.py)."""

    crons: tuple[str, ...]
    timezone: str
    hash_id: str = ""


#: The Schedules of the jobs alive, by value: jobs that share one share the object.
_SCHEDULES: weakref.WeakValueDictionary[Schedule, Schedule] = weakref.WeakValueDictionary()


@dataclass(frozen=True, slots=True)
class Job:
    """One job of the jobs file. Durations are in seconds.

    Slotted, as each object a job holds (a daemon keeps every job of its
    file: a dict per Job was 1.5 KB, 1.2 MB of a 1,000-job daemon's memory)."""

    name: str
    command: Command
    #: One cron expression, or several (``cron: [...]``: the union of their slots).
    cron: str | tuple[str, ...] | None = None
    rate: float | None = None
    lock_at_most: float = 3600.0
    lock_at_least: float = 0.0
    timezone: str = "UTC"
    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    shell: str = "/bin/sh"
    starting_deadline: float | None = None
    retries: int = 0
    retry_delay: float = 10.0
    #: ``backoff:``: each retry's delay is this many times the one before
    #: (1: the same each time); a growing delay is jittered
    #: (dblockrun/running/runjob.py retry_wait).
    backoff: float = 1.0
    #: ``max-delay:``: the longest a growing retry delay gets (None: no cap).
    max_delay: float | None = None
    #: Frozen: the jobs that set nothing share one (as they share the default
    #: limits; 1,000 jobs held 136 KB of copies, issue 33 item 4).
    on_failure: OnFailure = OnFailure()
    jitter: float = 0.0
    description: str = ""
    enabled: bool = True
    items: tuple[str, ...] | None = None
    items_command: Command | None = None
    parallel: int = 1
    batch: int = 1
    history_limit: int = 1000
    #: Run the command as this user (the daemon must be root); None: as the daemon.
    user: str | None = None
    #: ``env-inherit:``: what the command takes of the daemon's environment:
    #: ``all``, ``none`` or the names (``LC_*`` a prefix) in a tuple; None:
    #: ``all``, or ``none`` for a ``user:`` job (dblockrun/running/runjob.py inherited_env).
    env_inherit: str | tuple[str, ...] | None = None
    #: ``run-on:``: only hosts whose labels match claim it (empty: every host may).
    run_on: RunOn = ()
    #: ``on: every-host``: each matching host runs each slot, under its own lock row.
    every_host: bool = False
    #: Notifications (apprise) and heartbeat pings (dblockrun/notify/notifier.py).
    notify: Notify | None = None
    ping: SecretUrl | None = None
    #: After downtime (dblockrun/catchup.py): ``latest``, ``none`` or ``all``.
    catch_up: str = "latest"
    #: ``catch-up: all``: at most this many missed slots run (None: the default).
    catch_up_limit: int | None = None
    #: The fleet-wide limit group (``groups:`` at the top) the job runs in.
    group: str | None = None
    #: ``overlap:``: one of :data:`OVERLAP`; ``allow N`` with its bound.
    overlap: str = "forbid"
    #: ``limits:``: what its commands may use (none set: no limit).
    limits: Limits = NO_LIMITS
    #: ``after:``: the upstream jobs whose runs start one of this job's.
    after: After | None = None
    #: ``expect:``: its deadlines and durations (dblockrun/notify/alerts.py).
    expect: Expect | None = None
    #: ``exclude:``: the calendars whose days have no slot of the job.
    exclude: tuple[Calendar, ...] = ()
    #: ``blackout:``: the windows with no slot of the job.
    blackout: tuple[Window, ...] = ()
    #: ``active:``: the days with slots (None: every day).
    active: Active | None = None
    line: int = 0  # line of the job's name in the file; not part of the definition
    #: :attr:`schedule`, made once (None: no cron); not part of the definition.
    _schedule: Schedule | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.cron is not None:
            crons = self.crons
            hashed = any("H" in cron for cron in crons)
            made = Schedule(crons, self.timezone, self.file_name if hashed else "")
            # Jobs that share a schedule share its object (10,000 jobs on one
            # cron expression hold one).
            object.__setattr__(self, "_schedule", _SCHEDULES.setdefault(made, made))

    @property
    def allow(self) -> int | None:
        """``overlap: allow N``: at most N runs of the job at once across the
        fleet, each holding one of its N lanes; None: one run at a time."""
        kind, _, bound = self.overlap.partition(" ")
        return int(bound) if kind == "allow" else None

    @property
    def calendared(self) -> bool:
        """Whether some of its slots may be excluded (``exclude``,
        ``blackout``, ``active``): only such a job's slots are looked up
        (dblockrun/scheduling/calendars.py); the others pay nothing (three
        fields read: a slotted Job keeps nothing more)."""
        return bool(self.exclude or self.blackout or self.active is not None)

    @property
    def scheduled(self) -> bool:
        """Whether it has slots or a rate (else it runs only ``after:`` others)."""
        return self.cron is not None or self.rate is not None

    @property
    def fan_out(self) -> bool:
        """One row per work item (``items`` or ``items-command``)."""
        return self.items is not None or self.items_command is not None

    @property
    def crons(self) -> tuple[str, ...]:
        """The job's cron expressions (none for a rate-only job)."""
        if self.cron is None:
            return ()
        return (self.cron,) if isinstance(self.cron, str) else self.cron

    @property
    def schedule(self) -> Schedule:
        """The job's slots, for dblockrun/scheduling/cron.py (a cron job's
        only): made with the job (the planner asks for it several times per
        attempt: 10,000 jobs due at once were 30,000 Schedules made), a key by
        its value, so cron.py's remembered slots serve every job that shares it."""
        if self._schedule is None:
            raise ValueError(f"job {self.file_name} has no cron schedule")
        return self._schedule

    @property
    def file_name(self) -> str:
        """The name in the jobs file (an every-host job's row adds ``@HOST``)."""
        return self.name.split(EVERY_HOST_SEP, 1)[0]

    @property
    def claim_spacing(self) -> float | None:
        """The least time between two starts that its claim enforces (the
        claim's rate condition, on the row's last start): its ``rate``, and
        its ``lock-at-least``, which then holds even when the holder died
        before its release could keep the lock that long; None: neither."""
        spacing = max(self.rate or 0.0, self.lock_at_least)
        return spacing or None

    def definition_data(self) -> dict[str, Any]:
        """Everything that defines the job (not its line), as hashed: keys
        added since a version leave the data (and hash) as before when unset.
        The same data as ``asdict`` (a job's only nested dataclass is its
        ``on_failure``), read field by field: ``asdict`` deep-copies every
        tuple, 0.13 ms a job, the bulk of a 1,000-job daemon's start-up."""
        data = {name: getattr(self, name) for name in _DEFINITION_FIELDS}
        data["on_failure"] = {name: getattr(self.on_failure, name) for name in _ON_FAILURE_FIELDS}
        if data["user"] is None:
            del data["user"]  # hashes stay those of versions without `user:`
        for key in ("run_on", "every_host"):  # ... and without targeting
            if not data[key]:
                del data[key]
        for key in ("notify", "ping"):  # the same; a secret's source, not its value
            secret = getattr(self, key)
            if secret is None:
                del data[key]
            else:
                data[key] = secret.definition()
        if data["catch_up"] == "latest" and data["catch_up_limit"] is None:
            del data["catch_up"], data["catch_up_limit"]  # likewise without `catch-up:`
        if data["group"] is None:
            del data["group"]  # nor `group:`
        if data["overlap"] == "forbid":
            del data["overlap"]  # nor `overlap:`
        if data["env_inherit"] is None:
            del data["env_inherit"]  # nor `env-inherit:`
        if data["backoff"] == 1.0 and data["max_delay"] is None:
            del data["backoff"], data["max_delay"]  # nor `backoff:`
        if self.after is None:
            del data["after"]  # nor `after:`
        else:
            data["after"] = {"jobs": list(self.after.jobs), "on": self.after.on}
        if self.expect is None:
            del data["expect"]  # nor `expect:`
        else:
            data["expect"] = self.expect.text()
        for key in ("exclude", "blackout", "active"):  # nor calendars
            if not data[key]:
                del data[key]
        if self.exclude:  # a calendar's days by their digest (a file may hold hundreds)
            data["exclude"] = [calendar.text() for calendar in self.exclude]
        if self.blackout:
            data["blackout"] = [window.text for window in self.blackout]
        if self.active is not None:
            data["active"] = self.active.text()
        if self.limits.any:  # as the file writes them: the Job page shows this text
            data["limits"] = self.limits.text()
        else:
            del data["limits"]  # nor `limits:`
        return data

    def definition_hash(self, key: bytes | None = None) -> str:
        """A short hash of everything that defines the job (not its line),
        keyed (HMAC-SHA256) with ``key``, the fleet's secret
        (:meth:`Store.fleet_key <dblockrun.store.store.Store.fleet_key>`), as
        daemons publish it: hosts compare, and a reader without the key
        cannot test guesses of the job's values. None: unkeyed, for
        comparing two definitions in this process."""
        return _digest(self.definition_data(), 12, key)

    def set_fields(self) -> dict[str, Any]:
        """The fields the job sets to other than their default, as
        :meth:`definition_data` holds them (field name -> value, sorted; not
        its name): what :meth:`field_digests` digests and the dashboard shows."""
        return _set_fields(self.definition_data())

    def field_digests(self, key: bytes | None = None) -> dict[str, str]:
        """A short digest of each field the job sets to other than its
        default (field name -> 8 hex digits; the job's and the field's
        names salt it, ``key`` keys it as :meth:`definition_hash`): two
        hosts' digests name the fields their definitions differ in
        (:func:`differing_fields`) without either storing the values."""
        return self.digests(key)[1]

    def digests(self, key: bytes | None = None) -> tuple[str, dict[str, str]]:
        """:meth:`definition_hash` and :meth:`field_digests` from one reading
        of the definition (a daemon writes both for each of its jobs)."""
        data = self.definition_data()
        return _digest(data, 12, key), {name: _digest([self.name, name, value], 8, key)
                                        for name, value in _set_fields(data).items()}


def _set_fields(data: dict[str, Any]) -> dict[str, Any]:
    """:meth:`Job.set_fields` of a job's :meth:`Job.definition_data`."""
    return {name: value for name, value in sorted(data.items())
            if name != "name" and not (name in _DEFAULTS and _DEFAULTS[name] == value)}


def _digest(data: object, size: int, key: bytes | None) -> str:
    """``size`` hex digits of the SHA-256 (HMAC with ``key``) of ``data``'s JSON."""
    import json  # here: exec never hashes, and starts faster without them

    blob = json.dumps(data, sort_keys=True, default=str).encode()
    if key is None:
        import hashlib

        return hashlib.sha256(blob).hexdigest()[:size]
    import hmac

    return hmac.digest(key, blob, "sha256").hex()[:size]


def differing_fields(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The fields (as :meth:`Job.field_digests` names them) in which two
    hosts' definitions of a job differ: a digest that differs, or a field
    one sets and the other leaves at its default."""
    return sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))


def loads_fields(text: str | None) -> dict[str, dict[str, str]] | None:
    """A host row's ``fields`` (per job, :meth:`Job.field_digests`); None:
    not written (an older daemon) or not readable."""
    import json

    try:
        data = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return {str(job): {str(k): str(v) for k, v in fields.items()}
            for job, fields in data.items() if isinstance(fields, dict)}


@dataclass(frozen=True)
class JobsFile:
    path: str
    database: str | None
    jobs: tuple[Job, ...]
    #: ``database-file:``, relative to the jobs file's folder.
    database_file: str | None = None
    #: ``groups:``: (group, at most this many of its jobs at once in the fleet).
    groups: tuple[tuple[str, int], ...] = ()
    #: The groups whose slots wait for a seat when it is full (``when-full:
    #: queue``), each with its queue's bound: at most that many slots wait.
    group_queues: tuple[tuple[str, int], ...] = ()
    #: ``notify-storm:``: when passed slots' notifications collapse into one.
    storm: Storm = field(default_factory=Storm)

    def job(self, name: str) -> Job | None:
        return self._by_name.get(name)

    @cached_property
    def _by_name(self) -> dict[str, Job]:
        # A daemon looks a job up for each attempt: 2,000 jobs due at once
        # were 4 million name comparisons with a scan.
        return {job.name: job for job in self.jobs}


#: The fields :meth:`Job.definition_data` reads (all but the line), and OnFailure's.
_DEFINITION_FIELDS = tuple(f.name for f in fields(Job) if f.name != "line" and f.init)
_ON_FAILURE_FIELDS = tuple(f.name for f in fields(OnFailure))
#: Each Job field's default, as :meth:`Job.definition_data` holds it.
_DEFAULTS: dict[str, Any] = {
    name: value for name, value in asdict(Job("x", "x")).items()
    if (f := Job.__dataclass_fields__[name]).init and f.default is not MISSING
    or f.default_factory is not MISSING}
