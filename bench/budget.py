"""The budget gate: what the daemon's path costs in statements, round trips,
bytes and imported modules, against the budgets in bench/budgets.toml.

    python bench/budget.py [--backends postgresql,mariadb] [--runs N]
                           [--only burst,idle,one_run,commands] [--keep DIR]

Times vary threefold between days on this machine; counts do not. Every
figure is counted on the wire by a proxy of bench/wirecount.py in front of
the database (one per measured fleet or process, so that nothing else is
counted), on a fresh database per scenario, with real `dblockrun` processes.
The scenarios run side by side, both backends at once (about 110 s):

* **burst**: 2,000 jobs due on one instant (a cron slot), 4 daemons: the
  statements they send from 1 s before the slot until 1 s after the last
  run's release, per start; and the connections their pools opened
  meanwhile. Every job must start exactly once (the commands append a line
  each, bench/fleet.py).
* **idle**: one daemon with 1,000 jobs, none due, once it has started:
  statements, round trips and bytes (both ways) in 60 s. The minute is
  picked among 66 s of samples so that neither of its ends is near a
  statement: the daemon's loops (its bookkeeping every 12 s, the held
  slots every 5th round, MySQL's request wait every 10 s) then each fall in
  it as often as a minute holds, or once less when a loop ran late; never more.
* **one run**: a daemon with ``--heartbeat 1s`` is asked to run a job
  (`dblockrun run JOB --no-wait`) whose command is ``sleep 3``. Counted:
  what the daemon sent from the request to the release, less what its
  loops send anyway (statements of a shape it sent in 12 s idle before),
  with the renewals counted as three (a 3 s run has 3 or 4, by the phase
  of the heartbeat; a renewal's statements are those the daemon sent for
  an earlier run, the victim below, between its claim and its kill).
* **commands**: everything each process sends, connecting included:
  `status` with 10,000 jobs (bench/status_scale.py's data, one finished run
  each), a second `exec` of one name (`-- true`), `run JOB --no-wait` (the
  one run's request) and `kill JOB --no-wait` (of the victim, a running
  job). Without ``--no-wait``, run and kill poll ten times a second until the
  daemon answers: that count follows the daemon's speed, not the code; the
  daemon's side of a request is in "one run".
* **imports**: the modules `exec` (above) and the one-run daemon import in
  their life (``python -X importtime``, after the interpreter's start-up):
  each top-level name must be on the budget's list (a new one fails, named
  with its modules), their number at most the budget's.

The SET statements a new connection opens with (MariaDB: PyMySQL's and
SQLAlchemy's session settings) are left out of the burst, the idle minute
and the one run: a pool opens a connection when more threads need one at
once than it keeps, which is timing (an idle daemon's pool, trimmed to one
connection after two statements overlapped on a loaded machine, opens one
again: five SETs in a CI run's idle minute). The connections opened are
counted instead.

Each figure is compared with its budget; the table shows both. The exit
status is 1 when any figure is over its budget (each is named: backend,
figure, budget), 0 otherwise. ``--runs N`` measures N times (the spread:
median, least, most; checked is the most). tests/test_budget.py runs the
same measurements in the test suite (marker ``budget``).

A change that needs more raises the budget in bench/budgets.toml in the
same commit, and says why in its commit message.
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from common import Table
from fleet import (
    Fleet,
    clean_env,
    dblockrun,
    fresh_database,
    read_starts,
    sleep_until,
    slot_stats,
)
from many_jobs import jobs_yaml
from status_scale import fill, keep_hosts_live
from wirecount import CountingProxy, Sent, counting

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# This checkout's dblockrun (status_scale.fill writes its data in-process),
# and the tests' helpers: the reading of -X importtime, waiting.
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from helpers import imported_modules, wait_for  # noqa: E402

BUDGETS = HERE / "budgets.toml"
BACKENDS = ("postgresql", "mariadb")
SCENARIOS = ("burst", "idle", "one_run", "commands")

# -- the scenarios' sizes (the budgets hold for these) ---------------------------------
BURST_JOBS = 2000
BURST_DAEMONS = 4
BURST_PERIOD = 30  # seconds between the burst job's slots (the first one is measured)
BURST_LEAD = 35.0  # from writing the jobs file to the first slot (4 daemons start in 5-25 s)
BURST_WAIT = 60.0  # the most seconds after the slot to wait for every run to end
IDLE_JOBS = 1000
#: Seconds after the daemon is up (its host row): its start-up and the
#: first round interval's early rounds (one every 2 s) are over.
IDLE_SETTLE = 14.0
MINUTE = 60.0
IDLE_SLACK = 6.0  # seconds of samples beyond the minute, to pick its quiet ends in
SAMPLE_EVERY = 0.1
RUN_HEARTBEAT = 1.0  # seconds, the one-run daemon's --heartbeat
RUN_SECONDS = 3.0  # the run's command: sleep this long
RUN_RENEWALS = 3  # the renewals the one-run figure counts (RUN_SECONDS / RUN_HEARTBEAT)
LEARN = 12.0  # seconds the one-run daemon is watched idle: its loops' shapes
STATUS_JOBS = 10_000
NEVER = "0 0 1 1 *"  # a cron slot none of these runs lives to see

# -- figures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One count: ``scenario.name`` on ``backend``."""

    backend: str
    scenario: str
    name: str
    value: float
    note: str = ""  # what else the run saw
    modules: frozenset[str] = frozenset()  # imports: the modules' names

    @property
    def key(self) -> str:
        return f"{self.scenario}.{self.name}"


#: Figures whose budget is not a matter of choice: correctness, not cost.
FIXED = {"burst.starts_not_once": 0.0}


@dataclass(frozen=True)
class Over:
    """A figure over its budget, and why (named in the gate's failure)."""

    figure: Figure
    budget: float | None
    why: str

    def __str__(self) -> str:
        f = self.figure
        return f"{f.backend} {f.key}: {self.why}"


def load_budgets(path: Path = BUDGETS) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def budget_of(budgets: dict[str, Any], figure: Figure) -> Any:
    """The budget's entry for ``figure`` (None: none): a number, or for
    imports a table with ``modules`` and ``packages``."""
    if figure.key in FIXED:
        return FIXED[figure.key]
    entry: Any = budgets.get(figure.backend, {}).get(figure.scenario, {})
    return entry.get(figure.name) if isinstance(entry, dict) else None


def over_budget(figures: Sequence[Figure], budgets: dict[str, Any]) -> list[Over]:
    """Every figure over its budget (or with none), each with its reason."""
    out = []
    for figure in figures:
        budget = budget_of(budgets, figure)
        if figure.scenario == "imports":
            out += _over_imports(figure, budget)
        elif not isinstance(budget, int | float):
            out.append(Over(figure, None, f"{_shown(figure.value)}, and no budget in "
                            f"{BUDGETS.name} ([{figure.backend}.{figure.scenario}] "
                            f"{figure.name})"))
        elif figure.value > budget:
            out.append(Over(figure, float(budget),
                            f"{_shown(figure.value)} over its budget of {_shown(budget)}"))
    return out


def _over_imports(figure: Figure, budget: Any) -> list[Over]:
    if not isinstance(budget, dict) or not isinstance(budget.get("modules"), int) \
            or not isinstance(budget.get("packages"), list):
        return [Over(figure, None, f"{len(figure.modules)} modules, and no budget in "
                     f"{BUDGETS.name} ([{figure.backend}.imports.{figure.name}] modules "
                     "and packages)")]
    out = []
    allowed = set(budget["packages"])
    new: dict[str, list[str]] = {}
    for module in sorted(figure.modules):
        top = module.split(".", 1)[0]
        # A private name (_json, _ssl ...) comes with a public module that is checked.
        if top not in allowed and not top.startswith("_"):
            new.setdefault(top, []).append(module)
    for top, modules in sorted(new.items()):
        shown = ", ".join(modules[:8]) + (f" and {len(modules) - 8} more"
                                          if len(modules) > 8 else "")
        out.append(Over(figure, None, f"imports {top}, not on its list of packages "
                        f"({len(modules)} module(s): {shown})"))
    if figure.value > budget["modules"]:
        out.append(Over(figure, float(budget["modules"]),
                        f"{_shown(figure.value)} modules, over its budget of "
                        f"{budget['modules']}"))
    return out


def _shown(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3f}"


# -- helpers shared by the scenarios ------------------------------------------------------


class Sample(NamedTuple):
    at: float  # time.monotonic()
    statements: int
    trips: int
    bytes: int  # both ways


def sample(proxy: CountingProxy) -> Sample:
    sent, received = proxy.bytes()
    return Sample(time.monotonic(), proxy.statements(), proxy.round_trips(), sent + received)


def working(log: Sequence[Sent], start: float, end: float) -> tuple[list[Sent], int]:
    """The statements of ``log`` (in order of time) sent in [start, end)
    that do work: not the SET statements a connection opens with (MariaDB:
    PyMySQL's and SQLAlchemy's session settings, five with each connection
    a pool opens, and how often a pool opens one is timing: when more
    threads need one at once than it keeps). And how many connections
    opened then."""
    settled: set[int] = set()
    before: set[int] = set()
    inside: set[int] = set()
    out = []
    for sent in log:
        setup = sent.conn not in settled and sent.kind == "SET"
        if not setup:
            settled.add(sent.conn)
        if sent.at < start:
            before.add(sent.conn)
        elif sent.at < end:
            inside.add(sent.conn)
            if not setup:
                out.append(sent)
    return out, len(inside - before)


def alive(fleet: Fleet, check: Callable[[], bool]) -> Callable[[], bool]:
    """``check``, after making sure that no daemon of ``fleet`` exited."""
    def checked() -> bool:
        fleet.check_alive()
        return check()
    return checked


def cli(db_url: str, backend: str, *args: str,
        python: Sequence[str] = ()) -> tuple[CountingProxy, subprocess.CompletedProcess[str]]:
    """Run ``dblockrun --db URL ARGS`` through a proxy of its own; exit 0 or raise."""
    with counting(backend, db_url) as (proxy, url):
        done = subprocess.run(dblockrun("--db", url, *args, python=python),
                              env=clean_env(LC_ALL="C"),
                              capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"budget: dblockrun {' '.join(args)}: exit {done.returncode}:"
                               f" {done.stderr[-2000:]}")
        time.sleep(0.2)  # the proxy's threads have passed the last packets on
    return proxy, done


def by_kind(sent: Sequence[Sent]) -> str:
    return ", ".join(f"{k} {n}" for k, n in Counter(s.kind for s in sent).most_common())


def workdir(folder: Path, name: str) -> Path:
    path = folder / name
    path.mkdir(parents=True)
    return path


# -- burst --------------------------------------------------------------------------------


def burst(backend: str, folder: Path) -> list[Figure]:
    with fresh_database(backend, str(folder)) as db, counting(backend, db.url) as (proxy, url):
        work = workdir(folder, f"burst-{backend}")
        record = work / "starts.log"
        jobs_file = work / "jobs.yaml"
        phase = int(time.time() + BURST_LEAD) % BURST_PERIOD
        jobs_file.write_text(jobs_yaml(BURST_JOBS, BURST_PERIOD, phase, record))
        fleet = Fleet(db, jobs_file, BURST_DAEMONS, url=url)
        began = time.monotonic()
        try:
            fleet.start(ready_timeout=120)
            ready = time.monotonic() - began
            # A slot at least 3 s after every daemon is up (their start-up's
            # last statements are done by then): the first, or one period on.
            slot = float((int(time.time() + 3.0 - phase) // BURST_PERIOD + 1) * BURST_PERIOD
                         + phase)
            sleep_until(slot - 1.0)
            before = time.monotonic()
            wait_for(alive(fleet, lambda: db.count(
                "dblockrun_runs", f"slot = {slot:.0f} AND finished IS NOT NULL") >= BURST_JOBS),
                BURST_WAIT, 0.25, f"the end of {BURST_JOBS} runs")
            time.sleep(1.0)
            after = time.monotonic()
        finally:
            fleet.stop()
        log = proxy.log()
    st = slot_stats(read_starts(record), {(f"many-{i}", slot) for i in range(BURST_JOBS)})
    sent, opened = working(log, before, after)
    last = max(st.latencies) if st.latencies else float("nan")
    seen = (f"{by_kind(sent)} for {st.started} starts; daemons up in {ready:.0f} s, last "
            f"start {last:.1f} s after the slot")
    return [
        Figure(backend, "burst", "statements_per_start", round(len(sent) / BURST_JOBS, 3), seen),
        Figure(backend, "burst", "connections", opened,
               "opened by the daemons' pools meanwhile (on MariaDB their SETs aside above)"),
        Figure(backend, "burst", "starts_not_once", st.missing + st.duplicates,
               f"{st.missing} missing, {st.duplicates} twice"),
        Figure(backend, "burst", "busiest_share", busiest_share(st.per_host, BURST_DAEMONS),
               "starts per daemon " + "/".join(
                   str(n) for n in sorted(st.per_host.values(), reverse=True))),
    ]


def busiest_share(per_host: Mapping[str, int], daemons: int) -> float:
    """The busiest daemon's starts over the mean (1.0: spread evenly; a
    daemon that started none counts in the mean)."""
    started = sum(per_host.values())
    if not started:
        return float("inf")
    return round(max(per_host.values()) / (started / daemons), 2)


# -- idle ---------------------------------------------------------------------------------


def never_due(count: int) -> str:
    return "".join(f"  idle-{i}:\n    cron: '{NEVER}'\n    command: 'true'\n"
                   for i in range(count))


def quiet_minute(samples: Sequence[Sample], arrivals: Sequence[float],
                 length: float = MINUTE) -> tuple[Sample, Sample, float]:
    """The two samples ``length`` seconds apart (or up to half a second
    more) whose moments are farthest from any statement's, and that distance."""
    def clear(t: float) -> float:
        i = bisect.bisect_left(arrivals, t)
        near = arrivals[max(0, i - 1):i + 1]
        return min((abs(t - a) for a in near), default=float("inf"))

    best: tuple[Sample, Sample, float] | None = None
    j = 0
    for a in samples:
        while j < len(samples) and samples[j].at < a.at + length:
            j += 1
        if j == len(samples):
            break
        b = samples[j]
        if b.at - a.at <= length + 0.5:
            score = min(clear(a.at), clear(b.at))
            if best is None or score > best[2]:
                best = (a, b, score)
    if best is None:
        raise RuntimeError("budget: no minute among the idle samples")
    return best


def idle(backend: str, folder: Path) -> list[Figure]:
    with fresh_database(backend, str(folder)) as db, counting(backend, db.url) as (proxy, url):
        work = workdir(folder, f"idle-{backend}")
        jobs_file = work / "jobs.yaml"
        jobs_file.write_text("jobs:\n" + never_due(IDLE_JOBS))
        fleet = Fleet(db, jobs_file, 1, url=url)
        try:
            fleet.start()
            time.sleep(IDLE_SETTLE)
            samples = []
            end = time.monotonic() + MINUTE + IDLE_SLACK
            while time.monotonic() < end:
                samples.append(sample(proxy))
                time.sleep(SAMPLE_EVERY)
            fleet.check_alive()
        finally:
            fleet.stop()
        log = proxy.log()
    a, b, clear = quiet_minute(samples, [s.at for s in log])
    minute, opened = working(log, a.at, b.at)
    setup = sum(1 for s in log if a.at <= s.at < b.at) - len(minute)
    seen = (f"{by_kind(minute)}; the minute's ends {clear:.1f} s from any statement; "
            f"{opened} connection(s) opened, their SETs aside")
    return [
        Figure(backend, "idle", "statements_per_minute", len(minute), seen),
        # (a SET a connection opens with is a round trip of its own)
        Figure(backend, "idle", "round_trips_per_minute", b.trips - a.trips - setup),
        Figure(backend, "idle", "bytes_per_minute", b.bytes - a.bytes),
        Figure(backend, "idle", "connections", opened,
               "opened by the daemon meanwhile (a pool trimmed after two statements "
               "overlapped opens one again: timing)"),
    ]


# -- one run, run, kill, the daemon's imports ------------------------------------------


def one_run(backend: str, folder: Path) -> list[Figure]:
    with fresh_database(backend, str(folder)) as db, counting(backend, db.url) as (proxy, url):
        jobs_file = workdir(folder, f"run-{backend}") / "jobs.yaml"
        jobs_file.write_text(
            "jobs:\n"
            f"  one:\n    cron: '{NEVER}'\n    command: 'sleep {RUN_SECONDS:g}'\n"
            f"  victim:\n    cron: '{NEVER}'\n    command: 'sleep 300'\n")
        fleet = Fleet(db, jobs_file, 1, url=url, extra=("--heartbeat", f"{RUN_HEARTBEAT:g}s"),
                      python=("-X", "importtime"))

        def ended(job: str) -> Callable[[], bool]:
            return lambda: db.count("dblockrun_runs", f"job = '{job}' AND finished IS NOT NULL") > 0

        try:
            fleet.start()
            time.sleep(2.0)  # its start-up's last statements
            learned = time.monotonic()
            time.sleep(LEARN)
            # The victim's lease: what a renewal sends; then the kill.
            cli(db.url, backend, "run", "victim", "--no-wait")
            wait_for(alive(fleet, lambda: db.count("dblockrun_runs", "job = 'victim'") > 0), 30,
                     what="the victim's start")
            held = time.monotonic() + RUN_HEARTBEAT / 2  # past the claim
            time.sleep(2.5 * RUN_HEARTBEAT)
            renewed = time.monotonic()
            kill_cli, _ = cli(db.url, backend, "kill", "victim", "--no-wait")
            wait_for(alive(fleet, ended("victim")), 30, what="the victim's end")
            time.sleep(1.0)
            asked = time.monotonic()
            run_cli, _ = cli(db.url, backend, "run", "one", "--no-wait")
            wait_for(alive(fleet, ended("one")), 30 + RUN_SECONDS, what="the run's end")
            time.sleep(0.5)
            done = time.monotonic()
        finally:
            fleet.stop()
        log = proxy.log()
        daemon_log = jobs_file.with_name("daemon-0.log").read_text(errors="replace")
    loops = {s.shape for s in working(log, learned, learned + LEARN)[0]}
    renewal = {s.shape for s in working(log, held, renewed)[0]} - loops
    if not renewal:
        raise RuntimeError(f"budget: {backend}: no renewal of a lease in two heartbeats")
    window, opened = working(log, asked, done)
    run = [s for s in window if s.shape not in loops]
    renewals = [s for s in run if s.shape in renewal]
    ticks = len(rounds(renewals, RUN_HEARTBEAT / 2))
    per_tick = len(renewals) / ticks if ticks else 0.0
    figure = len(run) - len(renewals) + RUN_RENEWALS * per_tick
    seen = (f"{by_kind(run)}, in {ticks} renewals, counted as {RUN_RENEWALS}; "
            f"{opened} connection(s) opened, their SETs aside")
    return [
        Figure(backend, "one_run", "statements", round(figure, 3), seen),
        Figure(backend, "commands", "run", run_cli.statements(),
               f"run JOB --no-wait: {by_kind(run_cli.log())}"),
        Figure(backend, "commands", "kill", kill_cli.statements(),
               f"kill JOB --no-wait: {by_kind(kill_cli.log())}"),
        imports_figure(backend, "daemon", daemon_log),
    ]


def rounds(sent: Sequence[Sent], gap: float) -> list[list[Sent]]:
    """``sent`` (in order of time) cut where two statements are more than
    ``gap`` seconds apart: a loop's rounds."""
    out: list[list[Sent]] = []
    for s in sent:
        if out and s.at - out[-1][-1].at <= gap:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def imports_figure(backend: str, process: str, stderr: str) -> Figure:
    modules = frozenset(imported_modules(stderr, after="runpy"))
    if not modules:
        raise RuntimeError(f"budget: no -X importtime lines from {process}")
    tops = Counter(m.split(".", 1)[0] for m in modules)
    return Figure(backend, "imports", process, len(modules),
                  f"{len(tops)} packages; most modules: "
                  + ", ".join(f"{t} {n}" for t, n in tops.most_common(4)), modules)


# -- status, exec -------------------------------------------------------------------------


def commands(backend: str, folder: Path) -> list[Figure]:
    with fresh_database(backend, str(folder)) as db:
        prefix = "dblockrun_"
        fill(db.url, prefix, STATUS_JOBS, 1)
        keep_hosts_live(db.url, prefix)
        status, done = cli(db.url, backend, "status")
        if done.stdout.count("\n") <= STATUS_JOBS:
            raise RuntimeError(f"budget: status showed {done.stdout.count(chr(10))} lines")
        argv = ("exec", "--name", "budget-exec", "--", "true")
        cli(db.url, backend, *argv)  # the first: the name's row
        execed, done = cli(db.url, backend, *argv, python=("-X", "importtime"))
    return [
        Figure(backend, "commands", "status", status.statements(),
               f"status, {STATUS_JOBS} jobs: {by_kind(status.log())}"),
        Figure(backend, "commands", "exec", execed.statements(),
               f"exec, the name's second: {by_kind(execed.log())}"),
        imports_figure(backend, "exec", done.stderr),
    ]


# -- all of it ------------------------------------------------------------------------------


#: Each scenario's function.
RUNS: dict[str, Callable[[str, Path], list[Figure]]] = {
    "burst": burst, "idle": idle, "one_run": one_run, "commands": commands,
}


def measure(backends: Sequence[str], scenarios: Sequence[str] = SCENARIOS,
            folder: Path | None = None, took: dict[str, float] | None = None) -> list[Figure]:
    """Every figure of ``scenarios`` on ``backends``, all side by side (the
    idle minute is the longest: about 110 s in all): each has its own
    database and proxies, so nothing one does is counted in another's
    figures. ``took``: filled with each one's seconds ("backend scenario")."""
    with tempfile.TemporaryDirectory(prefix="dblockrun-budget-") as tmp:
        root = folder or Path(tmp)
        with ThreadPoolExecutor(max_workers=len(scenarios) * len(backends)) as pool:
            futures: list[Future[list[Figure]]] = [
                pool.submit(_timed, backend, name, root, {} if took is None else took)
                for backend in backends for name in scenarios]
            return [f for future in futures for f in future.result()]


def _timed(backend: str, scenario: str, folder: Path, took: dict[str, float]) -> list[Figure]:
    began = time.monotonic()
    try:
        return RUNS[scenario](backend, folder)
    finally:
        took[f"{backend} {scenario}"] = time.monotonic() - began


# -- the table ------------------------------------------------------------------------------


@dataclass
class Row:
    """One figure over several runs."""

    first: Figure
    values: list[float] = field(default_factory=list)
    modules: frozenset[str] = frozenset()  # imports: those of every run

    @property
    def worst(self) -> Figure:
        """The figure checked: the most of every run."""
        return replace(self.first, value=max(self.values), modules=self.modules)


def rows(runs: Sequence[Sequence[Figure]]) -> list[Row]:
    """Figures by (backend, key), in the order of the first run."""
    out: dict[tuple[str, str], Row] = {}
    for figures in runs:
        for f in figures:
            row = out.setdefault((f.backend, f.key), Row(f))
            row.values.append(f.value)
            row.modules |= f.modules
    return list(out.values())


def table(all_rows: Sequence[Row], budgets: dict[str, Any]) -> Table:
    multi = any(len(r.values) > 1 for r in all_rows)
    t = Table(["backend", "figure", "measured", *(["least", "most"] if multi else []),
               "budget", "ok", "seen"])
    for row in all_rows:
        worst = row.worst
        budget = budget_of(budgets, worst)
        shown = (budget.get("modules") if isinstance(budget, dict) else budget)
        ok = "yes" if not over_budget([worst], budgets) else "NO"
        spread = [_shown(min(row.values)), _shown(max(row.values))] if multi else []
        t.add([worst.backend, worst.key, _shown(statistics.median(row.values)), *spread,
               "-" if shown is None else _shown(shown), ok, row.first.note])
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--runs", type=int, default=1, help="measure this many times (the spread)")
    ap.add_argument("--only", default=",".join(SCENARIOS),
                    help=f"scenarios, of {', '.join(SCENARIOS)}")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="leave the jobs files, daemons' logs and start records in DIR")
    args = ap.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    scenarios = [s for s in args.only.split(",") if s]
    unknown = [b for b in backends if b not in BACKENDS] + [s for s in scenarios
                                                             if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown: {', '.join(unknown)}")
    budgets = load_budgets()
    # The dblockrun processes import this checkout (unless the caller names
    # one, as bench/compare.py does).
    os.environ.setdefault("PYTHONPATH", str(REPO))
    runs = []
    for i in range(args.runs):
        began = time.monotonic()
        took: dict[str, float] = {}
        runs.append(measure(backends, scenarios,
                            args.keep / f"run-{i + 1}" if args.keep else None, took))
        one, five, _ = os.getloadavg()
        print(f"run {i + 1}/{args.runs}: {time.monotonic() - began:.0f} s ("
              + ", ".join(f"{k} {v:.0f}" for k, v in took.items())
              + f"), load {one:.1f} / {five:.1f} (1 / 5 min)", flush=True)
    all_rows = rows(runs)
    print(f"budget gate: {', '.join(scenarios)} on {', '.join(backends)}; budgets from "
          f"{BUDGETS.relative_to(REPO)}")
    table(all_rows, budgets).print()
    over = over_budget([r.worst for r in all_rows], budgets)
    for o in over:
        print(f"OVER BUDGET: {o}")
    if over:
        print("A change that needs more raises the budget in bench/budgets.toml in the same "
              "commit, and says why in its message.")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
