"""One soak: start the fleet, play the nemesis's schedule, heal, let the
fleet settle, stop it, check everything."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from faketime import find_faketime
from helpers import wait_for

from dblockrun.errors import DatabaseError
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.control import Audit
from faultsoak.checker import (
    Checker,
    Quiet,
    Violation,
    Window,
    count,
    daemon_problems,
    iso,
)
from faultsoak.fleet import Host, Hosts
from faultsoak.nemesis import Action, Fault, play, schedule
from faultsoak.workload import LEASE, SCRIPT, jobs_yaml, read_commands

#: Who the nemesis's pauses and disables are by, in the audit trail.
WHO = "nemesis@soak"
#: Daemons in the fleet.
SIZE = 3
#: After the last fault is healed, the fleet runs this long before it stops:
#: a dead holder's lease runs out and its run is recorded, and the
#: checker's window ends on a fleet that has been healthy for a while.
SETTLE = 3 * LEASE
#: The window of "every slot has exactly one record": from this long after
#: the fleet is up to this long before it is told to stop.
EDGE_START = 5.0
EDGE_END = 3.0


#: How long the nemesis keeps trying one of its own database writes (a
#: pause, a disable, their end) when the database does not answer in time.
INSIST = 60.0


def insist(what: str, write: Callable[[], object], log: Callable[[str], None]) -> None:
    """The nemesis's own write, tried again while it fails (every write it
    makes may be made twice: a pause replaces a pause, an enable of an
    enabled job does nothing). On a machine under load a statement of the
    audited transaction can outlast the driver's read timeout; the soak is
    not to end there."""
    deadline = time.monotonic() + INSIST
    while True:
        try:
            write()
            return
        except DatabaseError as exc:
            if time.monotonic() >= deadline:
                raise
            log(f"nemesis: {what} failed ({exc}); trying again")
            time.sleep(0.5)


class Unavailable(Exception):
    """The soak cannot run here (libfaketime missing)."""


@dataclass
class Report:
    backend: str
    seed: int
    seconds: float
    faults: list[Fault]
    injected: Counter[str] = field(default_factory=Counter)
    slots: int = 0
    records: int = 0
    runs: int = 0
    violations: list[Violation] = field(default_factory=list)
    #: For the first coverage violations: what the daemons logged and the
    #: database recorded of that job around its slot, and the faults then,
    #: so that a failure seen once under CI's load carries its own story.
    evidence: list[str] = field(default_factory=list)

    def figures(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.injected.items()))
        by_kind = ", ".join(f"{k} {n}" for k, n in sorted(count(self.violations).items()))
        return (f"soak [{self.backend}] seed {self.seed}, {self.seconds:g}s: faults injected "
                f"{sum(self.injected.values())} ({kinds}); slots checked {self.slots}; "
                f"records {self.records}; runs {self.runs}; violations "
                f"{len(self.violations)}" + (f" ({by_kind})" if by_kind else ""))

    def replay(self) -> str:
        return (f"python bench/soak.py --backend {self.backend} --seed {self.seed} "
                f"--seconds {self.seconds:g}")


#: Around a coverage violation's slot: the seconds of records and log lines shown.
AROUND = 6.0


def evidence(violations: list[Violation], records: list[m.RunRecord], faults: list[Fault],
             wall_begin: float, names: list[str], logs: dict[str, Path],
             most: int = 3) -> list[str]:
    """What happened around the slot of each of the first ``most`` coverage
    violations: the faults, the job's records, its daemons' log lines."""
    out: list[str] = []
    for v in [v for v in violations if v.kind == "coverage" and v.slot is not None][:most]:
        assert v.slot is not None
        first, last = v.slot - AROUND, v.slot + AROUND
        out.append(f"-- around {v}")
        out += [f"  fault {f.describe(names)}" for f in faults
                if wall_begin + f.at <= last and wall_begin + f.end >= first]
        out += [f"  record {r.id} slot {iso(r.slot)} {r.result} by {r.host} token {r.token} "
                f"at {iso(r.started)}: {(r.output or '').strip()[:160]}"
                for r in records if r.job == v.row and r.slot is not None
                and first <= r.slot <= last]
        job = f"job {v.row}:"
        for name, path in logs.items():
            for line in path.read_text(errors="replace").splitlines():
                stamp = line[:24]
                try:
                    at = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp()
                except ValueError:
                    continue
                if first <= at <= last + 1 and (job in line or "database" in line
                                                or "fleet " in line):
                    out.append(f"  {name}: {line[:240]}")
    return out


def print_schedule(faults: list[Fault], names: list[str], seed: int,
                   log: Callable[[str], None]) -> None:
    log(f"nemesis schedule from seed {seed}: {len(faults)} faults")
    for f in faults:
        log("  " + f.describe(names))


def actions_for(faults: list[Fault], fleet: Hosts, injected: Counter[str],
                reload: Callable[[], None], store: Store,
                quiet: list[Quiet], log: Callable[[str], None] = print) -> list[Action]:
    """The playback of ``faults``; each pause and disable, once over, is
    added to ``quiet`` (from before its start to after its end, this
    machine's clock: the database's)."""
    out: list[Action] = []

    def one(f: Fault, d: Host) -> None:
        def begin() -> None:
            injected[f.kind] += 1
            if f.kind == "kill":
                fleet.kill(d)
            elif f.kind == "stop":
                d.signal(signal.SIGSTOP)
            elif f.kind == "cut":
                d.proxy.cut()
            elif f.kind == "clock":
                d.shift_clock(f.shift)

        def end() -> None:
            if f.kind == "kill":
                fleet.start(d)
            elif f.kind == "stop":
                d.signal(signal.SIGCONT)
            elif f.kind == "cut":
                d.proxy.restore()
            elif f.kind == "clock":
                d.shift_clock(0)

        shift = f" {f.shift:+g}s" if f.kind == "clock" else ""
        out.append(Action(f.at, f"{f.kind}{shift} {d.name}", begin))
        out.append(Action(f.end, f"end of {f.kind} {d.name}", end))

    def cut_all(f: Fault) -> None:
        def begin() -> None:
            injected[f.kind] += 1
            for d in fleet.hosts:
                d.proxy.cut()

        def end() -> None:
            for d in fleet.hosts:
                d.proxy.restore()

        out.append(Action(f.at, "cut-all", begin))
        out.append(Action(f.end, "end of cut-all", end))

    def reload_at(f: Fault) -> None:
        def do() -> None:
            injected[f.kind] += 1
            reload()

        out.append(Action(f.at, "reload", do))

    def hold(f: Fault) -> None:
        since = 0.0
        audit = Audit(WHO, f.kind, f.job)

        def begin() -> None:
            nonlocal since
            injected[f.kind] += 1
            since = time.time()
            job = f.job
            if job is None:
                insist("pause", lambda: store.control.pause(audit, None), log)
            else:
                insist(f"disable {job}", lambda: store.disable(
                    job, reason="soak nemesis", audit=audit), log)

        def end() -> None:
            job = f.job
            if job is None:
                insist("resume", lambda: store.control.resume(Audit(WHO, "resume")), log)
            else:
                insist(f"enable {job}", lambda: store.enable(
                    job, audit=Audit(WHO, "enable", job)), log)
            quiet.append(Quiet(job, since, time.time()))

        what = "pause" if f.job is None else f"disable {f.job}"
        out.append(Action(f.at, what, begin))
        out.append(Action(f.end, f"end of {what}", end))

    for f in faults:
        if f.kind == "cut-all":
            cut_all(f)
        elif f.kind == "reload":
            reload_at(f)
        elif f.kind in ("pause", "disable"):
            hold(f)
        else:
            assert f.target is not None
            one(f, fleet.hosts[f.target])
    return out


def run_soak(url: str, prefix: str, backend: str, seconds: float, seed: int, workdir: Path,
             log: Callable[[str], None] = print) -> Report:
    faketime = find_faketime()
    if faketime is None:
        raise Unavailable("the fault soak needs libfaketime (apt-get install faketime; "
                          "scripts/test installs it)")
    script = workdir / "soak-cmd.sh"
    script.write_text(SCRIPT)
    jobs = workdir / "jobs.yaml"
    jobs.write_text(jobs_yaml(script))
    command_log = workdir / "commands.log"
    faults = schedule(seed, seconds, SIZE)
    report = Report(backend, seed, seconds, faults)
    store = Store(url, prefix)
    fleet = Hosts(url, prefix, workdir, SIZE, jobs, command_log, faketime)
    names = [d.name for d in fleet.hosts]
    print_schedule(faults, names, seed, log)
    generation = 0
    quiet: list[Quiet] = []

    def reload() -> None:
        nonlocal generation
        generation += 1
        jobs.write_text(jobs_yaml(script, generation))
        fleet.reload()

    try:
        for d in fleet.hosts:
            fleet.start(d)
        wait_for(lambda: len(store.hosts(seen_within=30)) >= SIZE, 60, interval=0.2,
                 what=f"{SIZE} daemons to register")
        begin, wall_begin = time.monotonic(), time.time()
        play(actions_for(faults, fleet, report.injected, reload, store, quiet, log), begin,
             log)
        wait_for(lambda: time.monotonic() >= begin + seconds, seconds + 5, interval=0.2,
                 what="the end of the soak")
        fleet.heal()
        wait_for(lambda: all(d.ready() for d in fleet.hosts), 60, interval=0.2,
                 what="every daemon up again")
        log(f"t+{time.monotonic() - begin:6.1f}s healed; settling {SETTLE:g}s")
        healed = time.monotonic()
        wait_for(lambda: time.monotonic() >= healed + SETTLE, SETTLE + 5, interval=0.2,
                 what="the fleet to settle")
        stop_at = time.time()
        final = fleet.stop()
        records = store.history(None, 10**9)
        commands, bad = read_commands(command_log)
        problems = [Violation("record", "(command log)", None, b) for b in bad]
        problems += daemon_problems({d.name: d.log.read_text(errors="replace")
                                     for d in fleet.hosts},
                                    {d.name: d.exits for d in fleet.hosts}, final)
        checker = Checker(records, commands,
                          Window(wall_begin + EDGE_START, stop_at - EDGE_END), names, quiet)
        report.violations = checker.check(problems)
        report.evidence = evidence(report.violations, records, faults, wall_begin, names,
                                   {d.name: d.log for d in fleet.hosts})
        report.slots = checker.slots_checked
        report.records = len(records)
        report.runs = len(commands)
        return report
    finally:
        fleet.close()
        store.close()
