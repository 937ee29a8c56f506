"""What the daemon's parts share: one object the loop (dblockrun/daemon/loop.py)
builds once and hands to its attempts (firing.py), bookkeeping (fleet.py),
job chains (chains.py) and, through the callables it offers, to the parts
below the daemon layer. Each reads the current value from it when it needs
it, so a reload that swaps the jobs (:meth:`LocalJobs.load`) is seen by
everyone at once.

``running/`` and ``notify/`` sit below ``daemon/`` and cannot import this
module: they take the bound methods :meth:`DaemonState.jobs` and
:meth:`DaemonState.file` (a ``Callable[[], JobsFile]`` each), and the
run context takes the stop flags' :meth:`Signals.grace_ends` and
:meth:`Signals.stop_why`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from dblockrun.daemon.drain import DrainWatch
from dblockrun.daemon.registry import Runs
from dblockrun.daemon.sdnotify import SystemdNotifier
from dblockrun.daemon.wakeup import Signals
from dblockrun.events import Events
from dblockrun.jobs import JobsFile
from dblockrun.metrics import Metrics
from dblockrun.running.heartbeat import DbClock
from dblockrun.running.slotbook import SlotBook
from dblockrun.scheduling.targeting import LocalJobs
from dblockrun.store import Store
from dblockrun.store.outage import Outage
from dblockrun.supervise import Threads


@dataclass(frozen=True)
class Settings:
    holder: str
    lease: float
    heartbeat: float


@dataclass
class DaemonState:
    """One daemon's shared state (see the module)."""

    store: Store
    settings: Settings
    #: The jobs file and the part of it this host runs, swapped at each reload.
    local: LocalJobs
    #: The runs this daemon has going (its --max-running room).
    runs: Runs
    #: Records passed slots and claimed slots that end without a run.
    book: SlotBook
    clock: DbClock = field(default_factory=DbClock)
    outage: Outage = field(default_factory=Outage)
    metrics: Metrics = field(default_factory=Metrics)
    #: Where runs and slots are told (the log, metrics, notifications hear).
    events: Events = field(default_factory=Events)
    #: The background threads' supervision (dblockrun/supervise.py).
    threads: Threads = field(default_factory=Threads)
    #: The stop flags the signal handlers set, and the main loop's wake-up.
    signals: Signals = field(default_factory=Signals)
    #: Set once the daemon stops: the run threads read it.
    stop: threading.Event = field(default_factory=threading.Event)
    #: systemd's notify socket (a no-op when not started by it).
    systemd: SystemdNotifier = field(default_factory=lambda: SystemdNotifier({}))
    #: Seconds the running jobs get to finish after a stop request.
    grace: float = 30.0
    #: This host's drain (None: not watched, as in tests of one part).
    drain: DrainWatch | None = None

    def jobs(self) -> JobsFile:
        """The jobs this host runs, as the last load left them."""
        return self.local.jobs

    def file(self) -> JobsFile:
        """The whole jobs file, as the last load left it (run-on aside)."""
        return self.local.file

    def request_stop(self) -> None:
        """SIGTERM: stop claiming; running jobs get ``grace`` to finish."""
        if self.signals.deadline is None:
            self.signals.deadline = time.monotonic() + self.grace
        self.signals.stop_requested = True
        self.signals.wake.set()

    def stopping(self) -> bool:
        """Whether to stop; passes a requested stop on to the run threads."""
        if self.threads.fatal is not None and not self.signals.stop_requested:
            self.request_stop()  # a thread gave up (dblockrun/supervise.py): exit status 1
        if self.signals.stop_requested and not self.stop.is_set():
            self.stop.set()
        return self.stop.is_set()

    def pause(self, seconds: float) -> None:
        """Sleep on the main thread; a stop request cuts it short."""
        deadline = time.monotonic() + seconds
        while not self.stopping() and (left := deadline - time.monotonic()) > 0:
            self.systemd.watchdog()
            self.signals.wake.wait(min(left, self.systemd.sleep_cap() or left))
