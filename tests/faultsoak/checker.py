"""The checker: every run record and the commands' own log, against the
guarantees (DESIGN.md, README "Guarantees"). Each broken one is a
:class:`Violation` naming the lock row (``JOB``, ``JOB@HOST``, ``JOB/ITEM``),
the slot and what happened.

Kinds:

- ``twice``: a slot started (or was claimed) under two fencing tokens, or
  more often than its attempts allow;
- ``overlap``: two commands of one lock row, or of one group of one seat,
  ran at the same time;
- ``at-least`` / ``rate``: a job claimed again sooner than its
  ``lock-at-least`` / ``rate`` allows (database clock, 0.1 s tolerance);
- ``coverage``: a slot in the window with no record, or with more than one
  (a slot inside a summary row's ``N slots from A to B`` counts as recorded
  by it), or a record at an instant that is not a slot of the job; a slot
  while the job was disabled or the fleet paused (give or take
  :data:`QUIET_SLACK`) is not due: no record is right, one is too;
- ``lease``: a command still running after the next holder's claim, or
  after its own lost lease ran out (last renewal + lease);
- ``record``: a command with no record of its run id, a record that
  disagrees with the command (row, slot, token, ``ok`` for a failed
  command), a run still ``running`` after the fleet stopped, a command
  with no end line;
- ``crash``: a traceback in a daemon's log, a daemon that exited on its
  own, or not with 0 on the final SIGTERM.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from dblockrun.jobs import Schedule
from dblockrun.scheduling.cron import next_slot_at
from dblockrun.store import models as m
from faultsoak.workload import LEASE, SPEC, SPECS, Command, JobSpec

#: Two readings of this machine's clock (a command's `$EPOCHREALTIME`, the
#: local database server's clock) may differ by this much.
CLOCK_SLACK = 0.05
#: A slot this close to a pause or disable, or in it, may or may not be due.
QUIET_SLACK = 0.5
#: The claim's own tolerance on `rate` and `lock-at-least` (README: 100 ms).
CLAIM_TOLERANCE = 0.1
SUMMARY = re.compile(r"(\d+) slots from (\S+) to (\S+): ")
RESULTS_WITH_COMMAND = (m.OK,)
#: The results a summary record has (its plan's: dblockrun/scheduling/planner.py).
SUMMARIZED = (m.MISSED, m.SKIPPED)


def iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


@dataclass(frozen=True)
class Violation:
    kind: str
    row: str
    slot: float | None
    what: str

    def __str__(self) -> str:
        slot = f" slot {iso(self.slot)}" if self.slot is not None else ""
        return f"{self.kind}: job {self.row}{slot}: {self.what}"


@dataclass(frozen=True)
class Window:
    """The slots the checker holds to "exactly one record": from ``first``
    to ``last`` (database clock)."""

    first: float
    last: float


@dataclass(frozen=True)
class Quiet:
    """A time its ``job`` was disabled (None: the fleet was paused)."""

    job: str | None
    first: float
    last: float

    def holds(self, job: str, slot: float) -> bool:
        return (self.job in (None, job)
                and self.first - QUIET_SLACK <= slot <= self.last + QUIET_SLACK)


def row_of(record: m.RunRecord) -> str:
    return record.job if record.item is None else f"{record.job}/{record.item}"


def spec_of(row: str) -> JobSpec:
    return SPEC[row.split("@")[0].split("/")[0]]


def key(slot: float | None) -> float | None:
    return None if slot is None else round(slot, 3)


def describe(c: Command) -> str:
    return f"token {c.token} (run {c.run_id} on {c.host})"


def cron_slots(cron: str, first: float, last: float) -> list[float]:
    slots = []
    schedule = Schedule((cron,), "UTC")
    slot = next_slot_at(schedule, first - 0.001)
    while slot <= last:
        slots.append(slot)
        slot = next_slot_at(schedule, slot)
    return slots


class Checker:
    def __init__(self, records: Sequence[m.RunRecord], commands: Sequence[Command],
                 window: Window, hosts: Sequence[str], quiet: Sequence[Quiet] = ()) -> None:
        self.records = records
        self.quiet = quiet
        self.commands = commands
        self.window = window
        self.hosts = hosts
        self.violations: list[Violation] = []
        self.slots_checked = 0

    def add(self, kind: str, row: str, slot: float | None, what: str) -> None:
        self.violations.append(Violation(kind, row, slot, what))

    def check(self, problems: Iterable[Violation] = ()) -> list[Violation]:
        self.violations.extend(problems)
        self.twice()
        self.overlaps()
        self.spacing()
        self.coverage()
        self.leases()
        self.agreement()
        self.violations = ordered(self.violations)
        return self.violations

    # -- one start per slot ---------------------------------------------------

    def twice(self) -> None:
        """A slot's commands: one token, and no more than its attempts (one
        plus ``retries``)."""
        started: dict[tuple[str, float], list[Command]] = defaultdict(list)
        for c in self.commands:
            if c.slot is not None:
                started[(c.row, round(c.slot, 3))].append(c)
        for (row, slot), cs in sorted(started.items()):
            tokens = Counter(c.token for c in cs)
            if len(tokens) > 1 or max(tokens.values()) > 1 + spec_of(row).retries:
                self.add("twice", row, slot, "started by " + ", ".join(
                    describe(c) for c in cs))
        claimed: dict[tuple[str, float], set[int]] = defaultdict(set)
        for r in self.records:
            if r.slot is not None and r.token is not None:
                claimed[(row_of(r), round(r.slot, 3))].add(r.token)
        for (row, slot), claims in sorted(claimed.items()):
            if len(claims) > 1 and len({c.token for c in started.get((row, slot), [])}) <= 1:
                self.add("twice", row, slot, f"claimed under tokens {sorted(claims)}")

    # -- never two at once ----------------------------------------------------

    def overlaps(self) -> None:
        by_row: dict[str, list[Command]] = defaultdict(list)
        by_group: dict[str, list[Command]] = defaultdict(list)
        for c in self.commands:
            if c.end is None:
                self.add("record", c.row, c.slot,
                         f"{describe(c)} started at {iso(c.start)} and never logged its end")
                continue
            by_row[c.row].append(c)
            group = SPEC[c.job].group
            if group is not None:
                by_group[f"group {group}"].append(c)
        for row, cs in by_row.items():
            self._overlap(row, cs, f"job {row}")
        for group, cs in by_group.items():
            self._overlap(cs[0].row, cs, group)

    def _overlap(self, row: str, commands: list[Command], scope: str) -> None:
        latest: Command | None = None
        for c in sorted(commands, key=lambda c: c.start):
            assert c.end is not None
            if latest is not None and latest.end is not None and c.start < latest.end:
                self.add("overlap", c.row, c.slot,
                         f"{describe(c)} started at {iso(c.start)} while {latest.row} "
                         f"{describe(latest)} (slot {iso(latest.slot)}) ran until "
                         f"{iso(latest.end)}: {latest.end - c.start:.3f}s at once in {scope}")
            if latest is None or (latest.end is not None and c.end > latest.end):
                latest = c

    def spacing(self) -> None:
        """``lock-at-least`` and ``rate``: the claims of a row, a token
        after another, by the database clock."""
        for row, runs in self._claims().items():
            spec = spec_of(row)
            for before, after in zip(runs, runs[1:], strict=False):
                gap = after.started - before.started
                if spec.lock_at_least and gap < spec.lock_at_least - CLAIM_TOLERANCE:
                    self.add("at-least", row, after.slot,
                             f"token {after.token} claimed {gap:.3f}s after token "
                             f"{before.token} (slot {iso(before.slot)}, {before.result}) "
                             f"started; lock-at-least {spec.lock_at_least:g}s")
                if spec.rate and gap < spec.rate - CLAIM_TOLERANCE:
                    self.add("rate", row, after.slot,
                             f"token {after.token} started {gap:.3f}s after token "
                             f"{before.token}; rate {spec.rate:g}s")

    def _claims(self) -> dict[str, list[m.RunRecord]]:
        """Per lock row, the first record of each token, in token order."""
        first: dict[tuple[str, int], m.RunRecord] = {}
        for r in self.records:
            if r.token is not None:
                k = (row_of(r), r.token)
                if k not in first or r.attempt < first[k].attempt:
                    first[k] = r
        rows: dict[str, list[m.RunRecord]] = defaultdict(list)
        for (row, _token), r in sorted(first.items()):
            rows[row].append(r)
        return rows

    # -- every passed slot: exactly one record --------------------------------

    def rows(self) -> list[tuple[str, JobSpec]]:
        out = []
        for spec in SPECS:
            if not spec.every_slot:
                continue
            if spec.every_host:
                out += [(f"{spec.name}@{h}", spec) for h in self.hosts]
            else:
                out.append((spec.name, spec))
        return out

    def coverage(self) -> None:
        by_row: dict[str, list[m.RunRecord]] = defaultdict(list)
        for r in self.records:
            if r.item is None and r.slot is not None:
                by_row[r.job].append(r)
        for row, spec in self.rows():
            assert spec.cron is not None
            expected = cron_slots(spec.cron, self.window.first, self.window.last)
            self.slots_checked += len(expected)
            units: dict[float, list[str]] = defaultdict(list)
            tokens: dict[float, set[int]] = defaultdict(set)
            for r in by_row.get(row, []):
                assert r.slot is not None
                summary = (SUMMARY.search(r.output or "") if r.result in SUMMARIZED
                           else None)
                if summary is not None:
                    first = datetime.fromisoformat(summary.group(2)).timestamp()
                    last = datetime.fromisoformat(summary.group(3)).timestamp()
                    covered = cron_slots(spec.cron, first, last)
                    if len(covered) != int(summary.group(1)):
                        self.add("coverage", row, r.slot,
                                 f"summary record {r.id} counts {summary.group(1)} slots "
                                 f"from {summary.group(2)} to {summary.group(3)}, the "
                                 f"schedule has {len(covered)}")
                    for s in covered:
                        units[round(s, 3)].append(f"summary record {r.id}")
                    continue
                if r.token is not None:
                    if r.token in tokens[round(r.slot, 3)]:
                        continue  # another attempt of the same run
                    tokens[round(r.slot, 3)].add(r.token)
                units[round(r.slot, 3)].append(
                    f"record {r.id} {r.result}" + (f" token {r.token}" if r.token else "")
                    + f" by {r.host}")
            schedule = {round(s, 3) for s in cron_slots(
                spec.cron, self.window.first - 60, self.window.last + 60)}
            for slot in sorted(units):
                if slot not in schedule and self.window.first <= slot <= self.window.last:
                    self.add("coverage", row, slot,
                             f"a record at an instant that is not a slot: {units[slot]}")
            for slot in expected:
                found = units.get(round(slot, 3), [])
                if not found and not any(q.holds(spec.name, slot) for q in self.quiet):
                    self.add("coverage", row, slot,
                             "passed with no record"
                             + self._before(by_row.get(row, []), slot, spec))
                elif len(found) > 1:
                    self.add("coverage", row, slot,
                             f"{len(found)} records: {'; '.join(found)}")

    @staticmethod
    def _before(records: list[m.RunRecord], slot: float, spec: JobSpec) -> str:
        """What the row's records say just before ``slot``, to place a gap."""
        earlier = [r for r in records if r.slot is not None and r.slot < slot]
        if not earlier:
            return ""
        r = max(earlier, key=lambda r: (r.slot, r.id))
        held = ""
        if spec.lock_at_least and r.token is not None and r.started + spec.lock_at_least > slot:
            held = f"; the lock-at-least ({spec.lock_at_least:g}s) of that run held the lock"
        return (f" (the slot before: {iso(r.slot)} record {r.id} {r.result}"
                + (f" token {r.token}" if r.token is not None else "") + f" by {r.host}, "
                f"started {iso(r.started)}, ended {iso(r.finished)}{held})")

    # -- no command outlives its holder's lease -------------------------------

    def leases(self) -> None:
        claims = self._claims()
        by_id = {r.id: r for r in self.records}
        for c in self.commands:
            # A command that never logged its end (reported as such) ran at
            # least until its start.
            end, until = (c.end, "ran until") if c.end is not None else (c.start, "started at")
            later = [r for r in claims.get(c.row, []) if r.token > c.token]  # type: ignore[operator]
            if later and end > later[0].started + CLOCK_SLACK:
                nxt = later[0]
                self.add("lease", c.row, c.slot,
                         f"{describe(c)} {until} {iso(end)}, "
                         f"{end - nxt.started:.3f}s after token {nxt.token} was claimed "
                         f"by {nxt.host} at {iso(nxt.started)}")
            own = by_id.get(c.run_id)
            if own is not None and own.result == m.LOST and own.finished is not None \
                    and end > own.finished + LEASE + CLOCK_SLACK:
                self.add("lease", c.row, c.slot,
                         f"{describe(c)} {until} {iso(end)}, "
                         f"{end - own.finished - LEASE:.3f}s after its lost lease ran out "
                         f"(last renewal {iso(own.finished)} + {LEASE:g}s)")

    # -- the records say what the commands did --------------------------------

    def agreement(self) -> None:
        by_id = {r.id: r for r in self.records}
        ran = {c.run_id: c for c in self.commands}
        for c in self.commands:
            r = by_id.get(c.run_id)
            if r is None:
                self.add("record", c.row, c.slot, f"{describe(c)} ran with no record of run "
                                                  f"{c.run_id}")
                continue
            wrong = []
            if row_of(r) != c.row:
                wrong.append(f"row {row_of(r)}")
            if key(r.slot) != key(c.slot):
                wrong.append(f"slot {iso(r.slot)}")
            if r.token != c.token:
                wrong.append(f"token {r.token}")
            if r.result == m.OK and c.status not in (None, "0"):
                wrong.append(f"result ok, the command ended with {c.status}")
            if wrong:
                self.add("record", c.row, c.slot,
                         f"run {c.run_id}: the record has {', '.join(wrong)}")
        for r in self.records:
            if r.result == m.RUNNING:
                self.add("record", row_of(r), r.slot,
                         f"run {r.id} (token {r.token}, {r.host}) still running after "
                         "every daemon stopped")
            elif r.result in RESULTS_WITH_COMMAND and r.id not in ran:
                self.add("record", row_of(r), r.slot,
                         f"run {r.id} recorded {r.result}, its command never logged a start")


def daemon_problems(logs: dict[str, str], exits: dict[str, list[int]],
                    final: dict[str, int | None]) -> list[Violation]:
    """Tracebacks in the daemons' logs, daemons that ended on their own, and
    final exit statuses other than 0."""
    out = []
    for name, text in logs.items():
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if "Traceback" in line or line.startswith("Exception in thread"):
                tail = next((ln for ln in lines[i + 1:i + 60] if ln and not ln[0].isspace()
                             and not ln.startswith("Traceback")), "")
                out.append(Violation("crash", f"(daemon {name})", None,
                                     f"log line {i + 1}: {line.strip()} ... {tail.strip()}"))
    for name, codes in exits.items():
        for code in codes:
            out.append(Violation("crash", f"(daemon {name})", None,
                                 f"exited by itself with status {code}"))
    for name, status in final.items():
        if status != 0:
            out.append(Violation("crash", f"(daemon {name})", None,
                                 f"exit status {status} on the final SIGTERM"))
    return out


#: The order violations are listed in: the worst first.
KINDS = ("twice", "overlap", "lease", "at-least", "rate", "crash", "record", "coverage")


def ordered(violations: Iterable[Violation]) -> list[Violation]:
    """By kind (the worst first), then job and slot."""
    return sorted(violations, key=lambda v: (KINDS.index(v.kind), v.row, v.slot or 0.0))


def count(violations: Iterable[Violation]) -> Counter[str]:
    return Counter(v.kind for v in violations)
