"""What a reload says, and ``--watch-file``: a reload (SIGHUP, or the jobs
file changed under a daemon that watches it) logs the jobs it added,
removed and changed (:func:`job_changes`); :class:`FileWatch` asks for one
when the file changes.

The watch polls: ``stat`` of the path (following symlinks) and where it
resolves to, once a second. A Kubernetes ConfigMap mounted as a volume
changes by a symlink swap (``..data`` points to a new folder), which
inotify on the file would miss; an editor that writes a new file and
renames it over the old one changes the inode; an edit in place changes
the modification time or size. Each of these is a change.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from dblockrun.errors import ConfigError
from dblockrun.jobs import JobsFile
from dblockrun.supervise import Loop, Policy, Threads

log = logging.getLogger("dblockrun")

#: How often a watched jobs file is looked at (seconds).
WATCH_EVERY = 1.0
#: The most job names a reload's log line lists per kind (then "and N more").
NAMES_SHOWN = 20


def job_changes(before: JobsFile, after: JobsFile) -> str:
    """``added: a, b; removed: c; changed: d`` (changed: its definition
    hash differs), or ``no job changed``."""
    old = {j.name: j.definition_hash() for j in before.jobs}
    new = {j.name: j.definition_hash() for j in after.jobs}
    kinds = (("added", [n for n in new if n not in old]),
             ("removed", [n for n in old if n not in new]),
             ("changed", [n for n in new if n in old and new[n] != old[n]]))
    parts = [f"{kind}: {_names(names)}" for kind, names in kinds if names]
    return "; ".join(parts) if parts else "no job changed"


def reread(before: JobsFile, read: Callable[[str], JobsFile]) -> JobsFile | None:
    """The jobs file at ``before.path`` read and validated again (``read``:
    the daemon's resolves its secret URLs too), or None when it has an
    error: logged, and ``before`` stays in use (a reload never leaves a
    process with no jobs, or half of a file)."""
    try:
        return read(before.path)
    except ConfigError as exc:
        log.error("reload failed, keeping the %d jobs loaded before: %s",
                  len(before.jobs), exc.message)
        return None


def reloaded(before: JobsFile, after: JobsFile) -> None:
    """Log a reload that worked, and what it changed."""
    log.info("reloaded %s: %d %s (%s)", after.path, len(after.jobs),
             "job" if len(after.jobs) == 1 else "jobs", job_changes(before, after))


def _names(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


Signature = tuple[str, int, int, int, int] | None


def signature(path: str) -> Signature:
    """What changes when the file does: where it resolves to, its device,
    inode, modification time and size (None: it cannot be read now)."""
    try:
        st = os.stat(path)
        return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    except OSError:
        return None


class FileWatch:
    """``--watch-file``: a supervised thread that calls ``changed`` when the
    jobs file at ``path()`` changes (the daemon then reloads it)."""

    def __init__(self, path: Callable[[], str], changed: Callable[[], None],
                 threads: Threads | None = None, every: float = WATCH_EVERY) -> None:
        self._path = path
        self._changed = changed
        self._every = every
        self._worker = Loop(threads, "file-watch", Policy(max_delay=every), self._loop)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _loop(self) -> None:
        seen = signature(self._path())
        while not self._worker.wait(self._every):
            now = signature(self._path())
            if now != seen and now is not None:  # (gone for a moment: wait for it)
                log.info("jobs file %s changed: reloading", self._path())
                self._changed()
            seen = now if now is not None else seen
            self._worker.ok()
