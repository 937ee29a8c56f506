"""The runs going on a daemon's host, by job: what ``busy`` and
``--max-running`` count, and the jobs whose run just ended (to plan again)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from dblockrun.config.jobs import Job


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


class Runs:
    def __init__(self, cap: int | None, ended: Callable[[], None]) -> None:
        #: ``--max-running`` (None: no limit).
        self.cap = cap
        #: Called (from a run's thread) when a run ends: wakes the main loop.
        self._ended = ended
        #: Per job, its runs here, oldest first (several only with ``overlap: allow N``).
        self._running: dict[str, list[Run]] = {}
        self._finished: set[str] = set()
        self._lock = threading.Lock()

    def add(self, run: Run) -> None:
        with self._lock:
            self._running.setdefault(run.job.name, []).append(run)

    def done(self, run: Run) -> None:
        """``run`` is over (its lifecycle's last step, any thread)."""
        with self._lock:
            runs = self._running.get(run.job.name, [])
            if run in runs:
                runs.remove(run)
                if not runs:
                    del self._running[run.job.name]
            self._finished.add(run.job.name)
        self._ended()

    def busy(self, name: str) -> bool:
        with self._lock:
            return name in self._running

    def winding_up(self, name: str) -> bool:
        """Whether the job's run here has only its record and release left
        (its command is over): its next slot waits for it, not skipped."""
        with self._lock:
            runs = list(self._running.get(name, ()))
        return bool(runs) and all(run.winding_up() for run in runs)

    def count(self) -> int:
        """Commands running here (what --max-running counts)."""
        with self._lock:
            return sum(run.commands for runs in self._running.values() for run in runs)

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

    def all(self) -> list[Run]:
        with self._lock:
            return [run for runs in self._running.values() for run in runs]
