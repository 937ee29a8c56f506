"""The nemesis: a schedule of faults derived from a seed, and its playback.

The schedule is a pure function of (seed, duration, fleet size): the same
seed gives the same faults, on the same daemons, at the same offsets from the
start of the soak, with the same lengths. It is printed before the soak
starts, so a failing run names what it did and ``bench/soak.py --seed N``
plays it again (the daemons' own timing of course differs run to run).

Fault kinds (each on one daemon unless said otherwise):

- ``kill``: kill -9 the daemon, start a new one after the fault's length;
- ``stop``: SIGSTOP the daemon, SIGCONT after the length (its spawn service
  and commands keep running: a frozen daemon, not a frozen host);
- ``cut``: its database proxy resets every connection and refuses new ones,
  restored after the length;
- ``cut-all``: the same for every daemon at once (the database is gone);
- ``clock``: the daemon's clock (libfaketime) jumps by +/-0.5..3 s, back
  after the length;
- ``reload``: the jobs file is rewritten (a description changes) and every
  daemon gets SIGHUP (an instant);
- ``pause``: the fleet is paused (``dblockrun pause``), resumed after the
  length;
- ``disable``: one job is disabled (``dblockrun disable``), enabled after
  the length.

Their slots are not due while paused or disabled: the checker is told when.

At most ``size - 1`` daemons are under a fault at once, except during a
``cut-all``, and a daemon has one fault at a time.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from faultsoak.workload import SPECS

KINDS = ("kill", "stop", "cut", "cut-all", "clock", "reload", "pause", "disable")
WEIGHTS = (3, 3, 3, 1, 2, 1, 1, 1)
#: Seconds between the starts of two faults.
GAP = (1.0, 5.0)
#: A fault's length, seconds, per kind.
LENGTH = {"kill": (0.5, 6.0), "stop": (0.5, 6.0), "cut": (0.5, 8.0), "cut-all": (1.0, 8.0),
          "clock": (2.0, 10.0), "reload": (0.0, 0.0), "pause": (1.0, 5.0),
          "disable": (1.0, 6.0)}
#: No fault starts in the first and ends in the last seconds of the soak.
QUIET = 3.0


@dataclass(frozen=True)
class Fault:
    at: float  # seconds from the start of the soak
    kind: str
    target: int | None  # daemon index; None: the whole fleet
    length: float
    shift: float = 0.0  # clock faults: seconds
    job: str | None = None  # disable faults: the job

    @property
    def end(self) -> float:
        return self.at + self.length

    def describe(self, names: list[str]) -> str:
        who = "fleet" if self.target is None else names[self.target]
        if self.job is not None:
            who = f"job {self.job}"
        what = f" {self.shift:+.1f}s" if self.kind == "clock" else ""
        length = f" for {self.length:.1f}s" if self.length else ""
        return f"t+{self.at:6.1f}s {self.kind}{what} {who}{length}"


def schedule(seed: int, seconds: float, size: int) -> list[Fault]:
    """The faults of a soak of ``seconds`` with ``size`` daemons."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    busy_until = [0.0] * size
    fleet_busy_until = 0.0
    pause_busy_until = 0.0
    job_busy_until = {s.name: 0.0 for s in SPECS}
    t = QUIET
    while True:
        t += rng.uniform(*GAP)
        kind = rng.choices(KINDS, WEIGHTS)[0]
        length = round(rng.uniform(*LENGTH[kind]), 1)
        target = rng.randrange(size)
        shift = round(rng.choice((-1, 1)) * rng.uniform(0.5, 3.0), 1)
        job = rng.choice(SPECS).name
        if t + length > seconds - QUIET:
            if t > seconds - QUIET:
                return faults
            continue
        if t < fleet_busy_until:
            continue
        if kind == "cut-all":
            if any(b > t for b in busy_until):
                continue
            fleet_busy_until = t + length
            faults.append(Fault(round(t, 1), kind, None, length))
            continue
        if kind == "reload":
            faults.append(Fault(round(t, 1), kind, None, 0.0))
            continue
        if kind == "pause":
            if t >= pause_busy_until:
                pause_busy_until = t + length
                faults.append(Fault(round(t, 1), kind, None, length))
            continue
        if kind == "disable":
            if t >= job_busy_until[job]:
                job_busy_until[job] = t + length
                faults.append(Fault(round(t, 1), kind, None, length, job=job))
            continue
        free = [i for i in range(size) if busy_until[i] <= t]
        if len(free) <= 1 or target not in free:
            continue
        busy_until[target] = t + length
        faults.append(Fault(round(t, 1), kind, target, length,
                            shift if kind == "clock" else 0.0))


@dataclass(frozen=True)
class Action:
    """One step of the playback: at ``at``, ``do``."""

    at: float
    what: str
    do: Callable[[], None]


def play(actions: list[Action], begin: float, log: Callable[[str], None]) -> None:
    """Run the actions at their offsets from ``begin`` (time.monotonic())."""
    for action in sorted(actions, key=lambda a: a.at):
        delay = begin + action.at - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # the schedule's own clock, not a wait for a condition
        log(f"t+{time.monotonic() - begin:6.1f}s {action.what}")
        action.do()
