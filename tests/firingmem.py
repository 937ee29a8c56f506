"""A daemon's attempts (dblockrun/daemon/firing.py: ``Firing``, with its
planner, queues, seats and runs) driven in-process on the memory store
(dblockrun/store/memory.py), its clock moved by the test: logic tests of
queues, seats, overlap and job chains without database servers nor waits for real
slots. The commands run for real (a subprocess each), so that a test holds
a run as long as it likes (:meth:`MemoryDaemon.finish`).

What the store does under these tests is held to the databases' SQL by
tests/test_firing_contract.py, tests/test_chain_contract.py and
tests/test_runstore_contract.py; what
only a real process, a second daemon or a database does stays in the
tests that start them.
"""

from __future__ import annotations

import heapq
import itertools
import textwrap
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from helpers import daemon_state, wait_for

from dblockrun.config.load import load_jobs_text
from dblockrun.daemon.chains import Chains
from dblockrun.daemon.firing import Firing
from dblockrun.daemon.fleet import FleetBooks
from dblockrun.daemon.registry import Runs
from dblockrun.errors import DatabaseError
from dblockrun.running.heartbeat import DbClock, Renewer
from dblockrun.running.runjob import RunContext
from dblockrun.running.runloop import RunLoop, Step
from dblockrun.running.seats import Queues
from dblockrun.scheduling.planner import Planner
from dblockrun.store import Store
from dblockrun.store.memory import ManualClock, MemoryRunStore, RunRow
from dblockrun.store.models import CLAIM_TOLERANCE, RUNNING
from dblockrun.store.outage import Outage
from dblockrun.store.runstore import ChainStore, FiringStore, RunStore

#: The longest a run's real process is waited for.
DEADLINE = 15.0

#: A command that runs until the test lets it end (:meth:`MemoryDaemon.finish`).
HELD = 'until [ -e "{dir}/end-$DBLOCKRUN_RUN_ID" ]; do sleep 0.02; done'


class ManualDbClock(DbClock):
    """The daemon's estimate of the database clock: the memory store's own,
    read without a round trip."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self._manual = clock

    def now(self) -> float:
        return self._manual.now()

    @property
    def known(self) -> bool:
        return True

    @property
    def offset(self) -> float | None:
        return 0.0

    @property
    def uncertainty(self) -> float:
        return 0.0


class ManualRunLoop(RunLoop):
    """The run loop whose timers (a retry's delay) follow the test's clock:
    the daemon releases those due at each turn (:meth:`MemoryDaemon.step`)
    and waits for the steps it gave its workers, so that a turn sees what
    they did (a retry's attempt started)."""

    def __init__(self, stop: threading.Event, clock: ManualClock) -> None:
        super().__init__(stop)
        self._clock = clock
        self._later: list[tuple[float, int, Step]] = []
        self._count = itertools.count()
        self._busy = 0
        self._idle = threading.Condition()

    def call_later(self, delay: float, step: Step) -> None:
        with self._idle:
            heapq.heappush(self._later, (self._clock.now() + delay, next(self._count), step))

    def submit(self, step: Step) -> None:
        with self._idle:
            self._busy += 1

        def counted() -> None:
            try:
                step()
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()

        super().submit(counted)

    def next_at(self) -> float | None:
        with self._idle:
            return self._later[0][0] if self._later else None

    def release(self, every: bool = False) -> None:
        """Start the steps whose time has come (``every``: all, at a stop),
        then wait for the steps on the workers."""
        while True:
            with self._idle:
                if not self._later or not (every or self._later[0][0] <= self._clock.now()):
                    break
                step = heapq.heappop(self._later)[2]
            step()
        with self._idle:
            assert self._idle.wait_for(lambda: self._busy == 0, DEADLINE), "the run steps"


class ClockedRunStore(MemoryRunStore):
    """The memory store whose runs end at its clock: a command ran as long
    as the test moved the clock while it ran. (The daemon measures a
    command's duration on the machine's clock, which the test does not
    move: a held command ends a few real milliseconds after its start,
    whatever the test's clock says.)"""

    def finish_run(self, run_id: int, job: str, token: int | None, result: str,
                   exit_code: int | None, output: str | None, took: float | None = None) -> bool:
        return super().finish_run(run_id, job, token, result, exit_code, output)


def _statements() -> list[str]:
    """What a daemon's attempts, runs and renewals ask of the store: the
    methods of its roles (``RunStore``, ``FiringStore``, ``ChainStore``)."""
    names: set[str] = set()
    for role in (RunStore, FiringStore, ChainStore):
        names.update(name for name, value in vars(role).items()
                     if not name.startswith("_") and callable(value))
    return sorted(names)


class CutStore(ClockedRunStore):
    """A :class:`ClockedRunStore` the test cuts off (:attr:`cut`): while
    cut, each of the roles' statements raises the driver's error for a
    lost connection, as a database the network cut does. (Its operator
    side, ``control``, stays reachable: the test's own reads.)"""

    def __init__(self) -> None:
        super().__init__()
        self.cut = False
        #: The statements refused while cut, by name.
        self.refused: Counter[str] = Counter()
        for name in _statements():
            setattr(self, name, self._unless_cut(getattr(self, name)))

    def _unless_cut(self, statement: Callable[..., Any]) -> Callable[..., Any]:
        def sent(*args: Any, **kwargs: Any) -> Any:
            if self.cut:
                self.refused[statement.__name__] += 1
                raise DatabaseError("Lost connection to server during query (the test's cut)",
                                    kind="unreachable")
            return statement(*args, **kwargs)

        return sent


class MemoryDaemon:
    """One daemon's attempts on a :class:`MemoryRunStore`, as the main loop
    (dblockrun/daemon/loop.py) builds them, without its loop: the test
    moves the clock (:meth:`at`) and the daemon acts on what is due then.
    The jobs file is ``text`` with ``{dir}`` (``tmp``) and ``{held}`` (a
    command the test ends, :data:`HELD`) filled in; ``max_running`` and
    ``host_queue``: ``--max-running`` and ``--when-full queue --queue``;
    ``store``: one the test prepared (a :class:`ClockedRunStore`, e.g. the
    lock rows a fleet stopped a while ago left,
    :meth:`MemoryRunStore.set_last_slot`), for a daemon that starts after
    downtime."""

    def __init__(self, text: str, tmp: Path, *, holder: str = "host-1:1:t",
                 lease: float = 30.0, max_running: int | None = None,
                 host_queue: int | None = None, store: MemoryRunStore | None = None) -> None:
        self.tmp = tmp
        self.store = ClockedRunStore() if store is None else store
        self.clock = self.store.clock
        self.jobs = load_jobs_text(textwrap.dedent(text).format(
            dir=tmp, held=HELD.format(dir=tmp)), "jobs.yaml")
        self.stop = threading.Event()
        self.outage = outage = Outage(self.clock.now, self.clock.advance)
        # (only the parts built here read the state's store: the memory one
        # plays what they ask, FiringStore and RunStore)
        state = daemon_state(cast(Store, self.store), holder, self.jobs, lease=lease,
                             outage=outage)
        state.clock, state.stop = ManualDbClock(self.clock), self.stop
        state.runs = Runs(max_running, lambda: None)
        self.renewer = Renewer(self.store, 1.0, outage)
        self.loop = ManualRunLoop(self.stop, self.clock)
        ctx = RunContext(store=self.store, holder=holder, lease=lease, kill_grace=1.0,
                         renewer=self.renewer, outage=outage, stop=self.stop,
                         stop_grace=lambda: None, loop=self.loop, events=state.events,
                         book=state.book, now=state.clock.now)
        queues = Queues(self.store, state.jobs, state.runs, holder, lease, state.clock.now,
                        host_queue, state.file)
        planner = Planner(1.0, CLAIM_TOLERANCE, host_queue=host_queue is not None)
        # Job chains look for triggers at every turn (a daemon: each
        # bookkeeping round), on the memory store's triggers (ChainStore).
        self.chains = Chains(state, 0.0)
        self.firing = Firing(state, planner, ctx, FleetBooks(state), queues, self.chains)
        # (as loop.py: the file's rows, its seats and lanes, and this host's
        # every-host rows; the memory store keeps no row's file name)
        rows, every_host = state.local.rows()
        self.store.ensure_jobs([*rows, *(name for name, _file_name in every_host)])
        self.renewer.start()
        # (as loop.py: this host's enabled jobs with a schedule, an
        # every-host job under its row's name; a job after others runs only
        # when a trigger starts it)
        self.firing.planner.start([job for job in state.local.jobs.jobs
                                   if job.enabled and job.scheduled], self.clock.now())
        self.step()

    def step(self) -> None:
        """What the main loop does in a turn: the due attempts, then the
        runs that ended (a retry due first starts its attempt), then the
        job chains' triggers."""
        self.loop.release()
        self.firing.fire_due()
        self.firing.finished()
        self.firing.chained()

    def next_at(self) -> float:
        nxt = self._due()
        assert nxt is not None, "nothing planned"
        return nxt

    def _due(self) -> float | None:
        """When something is due next: an attempt or a run's timer."""
        times = [t for t in (self.firing.planner.agenda.next_at(), self.loop.next_at())
                 if t is not None]
        return min(times, default=None)

    def at(self, when: float) -> None:
        """Move the clock to ``when`` and take a turn."""
        self.clock.advance(max(0.0, when - self.clock.now()))
        self.step()

    def until(self, when: float) -> None:
        """Take a turn at each time something is due up to ``when``, then at ``when``."""
        while (nxt := self.next_at()) <= when:
            self.at(nxt)
        self.at(when)

    def go_on(self, done: Callable[[], bool], took: float | Mapping[str, float] = 0.3,
              turns: int = 200) -> None:
        """Go on until ``done()``: each run (a :data:`HELD` command) ends
        ``took`` seconds of the clock after it was first seen running
        (``took``: or by job), and the daemon takes its turn at each time
        something is due or a run ends, soonest first."""
        ends: dict[int, float] = {}
        for _ in range(turns):
            if done():
                return
            now = self.clock.now()
            for run in self.store.control.running():
                if run.result == RUNNING and run.id not in ends:
                    ends[run.id] = now + (took if isinstance(took, float | int)
                                          else took[run.job])
            end = min(ends.values(), default=float("inf"))
            due = self._due()  # (None: all wait for a run's end)
            if due is None or end <= due:
                assert ends, "nothing planned and no run going"
                self.clock.advance(max(0.0, end - now))
                for run_id in [i for i, at in ends.items() if at <= end]:
                    self.finish(run_id)
                    del ends[run_id]
                self.step()
            else:
                self.at(due)
        assert done(), f"not done in {turns} turns"

    def finish(self, run_id: int) -> RunRow:
        """Let the command of the run ``run_id`` end; its record once written."""
        (self.tmp / f"end-{run_id}").touch()
        return wait_for(lambda: self._ended(run_id), DEADLINE,
                        what=f"the end of run {run_id} recorded")

    def when(self, run_id: int, result: str, what: str) -> RunRow:
        """The record of the run ``run_id`` once its result is ``result``;
        meanwhile the clock moves to each timer of the runs (a waiting
        slot's next try, a retry), a turn taken there."""

        def found() -> RunRow | None:
            run = self.store.run(run_id)
            if run is not None and run.result == result:
                return run
            timer = self.loop.next_at()
            if timer is not None:
                self.at(timer)
            return None

        return wait_for(found, DEADLINE, what=what)

    def _ended(self, run_id: int) -> RunRow | None:
        run = self.store.run(run_id)
        return run if run is not None and run.finished is not None else None

    def close(self) -> None:
        """Let every run end (a waiting one once it starts), then stop."""

        def over() -> bool:
            for run in self.store.control.running():
                (self.tmp / f"end-{run.id}").touch()
            self.loop.release(every=True)
            return not self.firing.runs.all()

        try:
            wait_for(over, DEADLINE, what="the runs to end")
        finally:
            self.stop.set()
            self.renewer.stop()
