"""Runs without a thread each: one watcher thread applies every running
command's stops (lock-at-most, the fence, a lost lease, the shutdown grace)
and fires the runs' timers (a retry's delay); a few workers take the
blocking steps of a run (its start, its result's round trip, a retry's
record, on-failure). A command's end comes from the spawn reactor, which
hands the next step to a worker.

A daemon has one loop for all its runs; ``exec`` one for its one run.

Supervised (dblockrun/supervise.py): a command whose check raises, or a step
that raises, is a crash of the watcher or of the workers (a run's step ends
its run first: dblockrun/running/runjob.py); ``/healthz`` is red until a later check
pass or step completes, and the others' checks and steps go on. A crash of
the watcher's loop itself restarts it within a second: it applies the fence.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

from dblockrun.running.runner import LOOK_EVERY
from dblockrun.supervise import Policy, Threads

Step = Callable[[], None]


class Watched(Protocol):
    def check(self, now: float) -> float | None:
        """Apply the stops due at monotonic ``now``; seconds until the next
        look (None: it is over, and looked at no more)."""


class RunLoop:
    def __init__(self, stop: threading.Event, workers: int = 8,
                 threads: Threads | None = None) -> None:
        """``stop``: a shutdown; the runs' timers then fire at once (each
        step looks at ``stop`` itself)."""
        self.stop = stop
        threads = threads or Threads()
        self._watcher = threads.supervise("run-watcher", Policy(max_delay=1.0))
        self._worker = threads.supervise("run-worker", Policy(max_delay=1.0))
        self._workers = workers
        self._steps: queue.SimpleQueue[Step] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._watched: dict[int, Watched] = {}
        self._timers: list[tuple[float, int, Step]] = []
        self._order = itertools.count()
        self._wake = threading.Event()
        self._started = False

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        self._watcher.thread(self._watch_loop).start()
        for i in range(self._workers):
            self._worker.thread(self._work, name=f"run-worker-{i}").start()

    def submit(self, step: Step) -> None:
        """Run ``step`` on a worker."""
        self._start()
        self._steps.put(step)

    def call_later(self, delay: float, step: Step) -> None:
        """Run ``step`` on a worker ``delay`` seconds from now (at once on a stop)."""
        self._start()
        with self._lock:
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._order), step))
        self._wake.set()

    def watch(self, command: Watched) -> None:
        """Check ``command`` from the next look on (within ``LOOK_EVERY``: a
        new command's stops are further away than that; waking the watcher
        for each of 500 commands started at once would check them all 500
        times)."""
        self._start()
        with self._lock:
            self._watched[id(command)] = command

    def unwatch(self, *commands: Watched) -> None:
        with self._lock:
            for command in commands:
                self._watched.pop(id(command), None)

    def _work(self) -> None:
        while True:
            step = self._steps.get()
            try:
                step()
            except Exception as exc:  # a worker serves every run: on to the next step
                self._worker.crashed(exc)
            else:
                self._worker.ok()

    def _watch_loop(self) -> None:
        while True:
            now = time.monotonic()
            with self._lock:
                watched = list(self._watched.values())
            wait = LOOK_EVERY
            failed = False
            over: list[Watched] = []
            for command in watched:
                try:
                    left = command.check(now)
                except Exception as exc:  # the other commands' stops still apply
                    self._watcher.crashed(exc)
                    failed = True
                else:
                    if left is None:
                        over.append(command)
                    else:
                        wait = min(wait, left)
            if over:
                # Ended: not looked at again while its result waits for a
                # worker (thousands ending at once were each looked at every
                # tenth of a second until then).
                self.unwatch(*over)
            if not failed:
                self._watcher.ok()
            stopping = self.stop.is_set()
            with self._lock:
                while self._timers and (stopping or self._timers[0][0] <= now):
                    self._steps.put(heapq.heappop(self._timers)[2])
                if self._timers:
                    wait = min(wait, self._timers[0][0] - now)
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()
