"""The runs going on a daemon's host, by job: what ``busy`` and
``--max-running`` count, and the jobs whose run just ended (to plan again)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from dblockrun.jobs import Job


class Run(Protocol):
    """A run the registry holds (dblockrun/running/runjob.py, dblockrun/running/fanout.py)."""

    @property
    def job(self) -> Job: ...

    @property
    def commands(self) -> int:
        """The commands it has going (a fan-out counts each of its own)."""
        ...

    def is_alive(self) -> bool: ...

    def winding_up(self) -> bool:
        """Whether only its record and release are left (its command is over)."""
        ...

    #: Its slot waits (``when-full: queue``; dblockrun/scheduling/limits.py):
    #: it counts no command while ``queued``; ``wants_room``: it waits for
    #: room here (not for a group's seat); ``order``: older first.
    queued: bool
    wants_room: bool
    order: tuple[float, int]


class Queued(Protocol):
    """A run as :meth:`Runs.admit` sees it (dblockrun/scheduling/limits.py Waiter)."""

    queued: bool
    wants_room: bool
    order: tuple[float, int]


class Runs:
    def __init__(self, cap: int | None, ended: Callable[[], None]) -> None:
        #: ``--max-running`` (None: no limit).
        self.cap = cap
        #: Called (from a run's thread) when a run ends: wakes the main loop.
        self._ended = ended
        #: Per job, its runs here, oldest first (several only with ``overlap: allow N``).
        self._running: dict[str, list[Run]] = {}
        self._finished: set[str] = set()
        #: (job, its last attempt's record) of the runs ended since :meth:`ended_runs`.
        self._ended_runs: list[tuple[str, int | None]] = []
        #: How many runs are here (what :meth:`left` tells without a scan).
        self._here = 0
        self._lock = threading.Lock()

    def add(self, run: Run) -> None:
        with self._lock:
            self._running.setdefault(run.job.name, []).append(run)
            self._here += 1

    def done(self, run: Run) -> None:
        """``run`` is over (its lifecycle's last step, any thread)."""
        with self._lock:
            self._forget(run)
            self._finished.add(run.job.name)
            self._ended_runs.append((run.job.name, getattr(run, "last_run_id", None)))
        self._ended()

    def _forget(self, run: Run) -> None:
        runs = self._running.get(run.job.name, [])
        if run in runs:
            runs.remove(run)
            self._here -= 1
            if not runs:
                del self._running[run.job.name]

    def busy(self, name: str) -> bool:
        with self._lock:
            return name in self._running

    def winding_up(self, name: str) -> bool:
        """Whether the job's run here has only its record and release left
        (its command is over): its next slot waits for it, not skipped."""
        with self._lock:
            runs = list(self._running.get(name, ()))
        return bool(runs) and all(run.winding_up() for run in runs)

    def drop(self, run: Run) -> None:
        """Forget ``run``, which never started (its slot recorded skipped)."""
        with self._lock:
            self._forget(run)

    def admit(self, run: Queued) -> bool:
        """Whether the waiting ``run`` may start now: room for one more
        command and no older slot waiting here for room. From then on it
        counts (checked and counted at once)."""
        with self._lock:
            room = self.cap is None or self._count() < self.cap
            older = any(r.wants_room and r.queued and r.order < run.order
                        for r in self._all() if r is not run)
            if room and not older:
                run.queued = run.wants_room = False
                return True
            run.wants_room = True
            return False

    def unadmit(self, run: Queued) -> None:
        """``run`` waits again (for a group's seat): it counts no command."""
        with self._lock:
            run.queued = True

    def ahead(self, run: Queued) -> int:
        """How many older slots wait here for room."""
        with self._lock:
            return sum(1 for r in self._all()
                       if r is not run and r.wants_room and r.queued and r.order < run.order)

    def count(self) -> int:
        """Commands running here (what --max-running counts)."""
        with self._lock:
            return self._count()

    def _count(self) -> int:
        return sum(run.commands for run in self._all())

    def _all(self) -> list[Run]:
        return [run for runs in self._running.values() for run in runs]

    def free(self) -> int | None:
        """How many more runs this host may start (None: no limit)."""
        return None if self.cap is None else max(0, self.cap - self.count())

    def full(self) -> bool:
        return self.free() == 0

    def finished(self) -> set[str]:
        """The jobs whose run ended since the last call."""
        with self._lock:
            names, self._finished = self._finished, set()
        return names

    def ended_runs(self) -> list[tuple[str, int | None]]:
        """(job, the record of its last attempt; None: none) of each run
        ended since the last call (job chains, dblockrun/daemon/chains.py)."""
        with self._lock:
            ended, self._ended_runs = self._ended_runs, []
        return ended

    def left(self) -> int:
        """How many runs are here, not yet over (a shutdown waits for 0: each
        run's end asks, so a count, not a scan of thousands)."""
        return self._here

    def all(self) -> list[Run]:
        with self._lock:
            return [run for runs in self._running.values() for run in runs]
