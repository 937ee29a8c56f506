"""The values of a job's ``limits:`` (``memory: 512M``, ``io: idle`` ...),
read and checked: each parser returns the :class:`~dblockrun.jobs.Limits`
field's value or raises ValueError saying why, which the loader
(dblockrun/config/load.py) reports with the file, line, job and key."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from dblockrun.durations import parse_duration
from dblockrun.jobs import IO_CLASSES, SIZE_UNITS, format_size

#: The least and most ``memory:``: 1M (no command starts in less), 1024T.
MIN_MEMORY = 1 << 20
MAX_MEMORY = 1 << 50
#: ``open-files:``: a command needs its stdin, stdout and stderr; Linux
#: allows no more than ``fs.nr_open`` (1,048,576 by default).
MIN_OPEN_FILES = 3
MAX_OPEN_FILES = 1 << 20
#: ``tasks:``: Linux's most processes (PID_MAX_LIMIT).
MAX_TASKS = 1 << 22
#: ``cpu:``: 1% (cgroup v2's least quota, 1 ms in each 100 ms) to 1,000 CPUs.
MAX_CPU = 100_000
#: ``cpu-time:``: RLIMIT_CPU counts whole seconds; at most 100 years.
MAX_CPU_TIME = 36_500 * 86_400
NICE_RANGE = (-20, 19)
#: ``io: best-effort 7``: the levels of the realtime and best-effort classes.
IO_LEVELS = range(8)

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?", re.IGNORECASE)
_FACTOR = dict(SIZE_UNITS)
_CPU = re.compile(r"(\d+)\s*%")


class WrongKind(ValueError):
    """The value is not of the kind the limit takes; the loader adds what
    it got: ``must be {what}, got a list``."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def _whole(value: Any, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WrongKind(f"a whole number ({what})")
    if not low <= value <= high:
        raise ValueError(f"must be from {low:,} to {high:,}, got {value:,}")
    return value


def memory(value: Any) -> int:
    """``512M``, ``1.5G``, ``2GiB``, or a number of bytes: K, M, G and T
    are powers of 1024 (as systemd's ``MemoryMax=`` and ``ulimit``)."""
    forms = "a size like 512M or 2G (K, M, G, T: powers of 1024)"
    match = (None if isinstance(value, bool) or not isinstance(value, str | int)
             else _SIZE.fullmatch(str(value).strip()))
    if match is None:
        raise WrongKind(forms)
    number, unit, suffix = match.groups()
    if suffix and suffix.upper() == "B" and unit:
        raise ValueError(f"{unit.upper()}B is ambiguous (1000 or 1024?): write {number}"
                         f"{unit.upper()} or {number}{unit.upper()}iB (powers of 1024)")
    size = int(float(number) * _FACTOR.get(unit.upper(), 1)) if unit else None
    if size is None:
        if "." in number:
            raise ValueError(f"a number of bytes must be whole, got {number}")
        size = int(number)
    if not MIN_MEMORY <= size <= MAX_MEMORY:
        raise ValueError(f"must be from {format_size(MIN_MEMORY)} to "
                         f"{format_size(MAX_MEMORY)}, got {str(value).strip()}")
    return size


def cpu(value: Any) -> int:
    """``50%`` of one CPU; ``200%``: two."""
    text = value.strip() if isinstance(value, str) else None
    match = _CPU.fullmatch(text) if text is not None else None
    if match is None:
        raise WrongKind("a percentage of one CPU like 50% (200%: two CPUs)")
    percent = int(match.group(1))
    if not 1 <= percent <= MAX_CPU:
        raise ValueError(f"must be from 1% to {MAX_CPU:,}%, got {text}")
    return percent


def cpu_time(value: Any) -> int:
    """A duration of whole seconds: ``10m``, ``90s``."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise WrongKind("a duration like 90s, 10m or 1h")
    seconds = parse_duration(value)
    if seconds < 1:
        raise ValueError(f"must be at least 1s, got {str(value).strip()}")
    if seconds != int(seconds):
        raise ValueError(f"must be whole seconds (the kernel counts CPU time limits in "
                         f"seconds), got {str(value).strip()}")
    if seconds > MAX_CPU_TIME:
        raise ValueError(f"must be at most 36500d, got {str(value).strip()}")
    return int(seconds)


def tasks(value: Any) -> int:
    return _whole(value, 1, MAX_TASKS, "processes and threads")


def open_files(value: Any) -> int:
    return _whole(value, MIN_OPEN_FILES, MAX_OPEN_FILES, "descriptors each process may hold")


def nice(value: Any) -> int:
    return _whole(value, *NICE_RANGE, "a niceness: 19 is the lowest priority")


def io(value: Any) -> str:
    """``idle``, ``best-effort``, ``realtime``, the last two with a level
    from 0 (first) to 7 (``best-effort 7``); kept as written, spaces tidied."""
    words = value.split() if isinstance(value, str) else []
    if not words or words[0] not in IO_CLASSES or len(words) > 2:
        raise WrongKind("idle, best-effort or realtime, the last two with an optional "
                        "level 0-7 (best-effort 7)")
    if len(words) == 2:
        if words[0] == "idle":
            raise ValueError("idle takes no level (it has one: it gets the disk only when "
                             "no one else wants it)")
        if not words[1].isdigit() or int(words[1]) not in IO_LEVELS:
            raise ValueError(f"the level must be 0 (first) to 7 (last), got {words[1]!r}")
        return f"{words[0]} {int(words[1])}"
    return words[0]


#: ``limits:`` key -> (Limits field, parser).
PARSERS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "memory": ("memory", memory),
    "cpu": ("cpu", cpu),
    "cpu-time": ("cpu_time", cpu_time),
    "tasks": ("tasks", tasks),
    "open-files": ("open_files", open_files),
    "nice": ("nice", nice),
    "io": ("io", io),
}
