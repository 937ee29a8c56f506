"""The fault soak (tests/faultsoak/): real daemons under a seeded nemesis,
then a checker over every record and the commands' own log.

The slow test runs the soak for about 100 s per server backend (a fleet of
three daemons; SQLite serves one host and has no connection to cut). The
seed is printed, and a failure lists every violation and the command that
replays the same schedule for longer: `python bench/soak.py --backend B
--seed N --minutes 30`. `DBLOCKRUN_SOAK_SEED` and `DBLOCKRUN_SOAK_SECONDS`
set them here.

The fast tests hold the checker to its word on made-up histories: each kind
of violation is reported, naming the job, the slot and what happened, and a
clean history has none.
"""

from __future__ import annotations

import os
import random
from dataclasses import replace
from pathlib import Path

import pytest
from faultsoak.checker import Checker, Quiet, Violation, Window, daemon_problems, iso
from faultsoak.nemesis import schedule
from faultsoak.soak import Unavailable, run_soak
from faultsoak.workload import LEASE, Command, read_commands
from helpers import TestDb

from dblockrun.store import models as m

SOAK_SECONDS = float(os.environ.get("DBLOCKRUN_SOAK_SECONDS") or 120)
HOSTS = ("d1", "d2", "d3")
T0 = 1_800_000_000.0  # a whole second, so whole seconds are slots of `* * * * * *`


def strict() -> bool:
    """Same rule as conftest: in CI a missing tool fails instead of skipping."""
    return (
        os.environ.get("CI", "").lower() in ("true", "1")
        or os.environ.get("DBLOCKRUN_TEST_STRICT") == "1"
    )


# -- the checker on made-up histories -----------------------------------------


class History:
    """Runs of the `tick` job (a slot a second) and their commands, one per slot
    from T0 to T0 + 9, each 0.2 s long, on host d1; tests then break it."""

    def __init__(self) -> None:
        self.records: list[m.RunRecord] = []
        self.commands: list[Command] = []
        for i in range(10):
            self.run("tick", T0 + i, token=i + 1)

    def run(self, job: str, slot: float | None, token: int, *, start: float | None = None,
            length: float = 0.2, result: str = m.OK, host: str = "d1",
            item: str | None = None) -> None:
        start = (slot if slot is not None else T0) + 0.05 if start is None else start
        rid = len(self.records) + 1
        self.records.append(m.RunRecord(rid, job, item, f"vm:{host}", slot, token, 1, start,
                                        start + length, 0, result))
        self.commands.append(Command(job.split("@")[0], host, slot, item, token, rid,
                                     start + 0.01, start + length - 0.01, "0"))

    def check(self) -> list[Violation]:
        """The violations, but the slots of the jobs other than `tick` left
        without records (this history has none for them)."""
        found = Checker(self.records, self.commands, Window(T0, T0 + 9), HOSTS).check()
        return [v for v in found if v.kind != "coverage" or v.row == "tick"]

    def only(self, kind: str) -> list[str]:
        found = self.check()
        assert {v.kind for v in found} == {kind}, [str(v) for v in found]
        return [str(v) for v in found]


def test_a_clean_history_has_no_violation() -> None:
    assert [v for v in History().check() if v.row == "tick"] == []


def test_a_slot_started_twice_is_reported() -> None:
    h = History()
    h.run("tick", T0 + 3, token=20, start=T0 + 3.5)
    found = [v for v in h.check() if v.kind == "twice"]
    assert [str(v) for v in found] == [
        f"twice: job tick slot {iso(T0 + 3)}: started by token 4 (run 4 on d1), "
        "token 20 (run 11 on d1)"]


def test_two_runs_at_once_are_reported() -> None:
    h = History()
    h.records[4] = replace(h.records[4], finished=T0 + 5.5)
    h.commands[4].end = T0 + 5.5  # slot T0+4 runs past the start of T0+5's command
    found = [v for v in h.check() if v.kind == "overlap"]
    assert len(found) == 1 and found[0].slot == T0 + 5, [str(v) for v in found]
    assert "token 6 (run 6 on d1) started at" in found[0].what
    assert "while tick token 5 (run 5 on d1)" in found[0].what


def test_a_passed_slot_with_no_record_and_one_with_two_are_reported() -> None:
    h = History()
    del h.records[6], h.commands[6]  # slot T0+6 vanished
    h.records.append(m.RunRecord(99, "tick", None, "vm:d2", T0 + 2, None, 1, T0 + 2.5,
                                 T0 + 2.5, None, m.SKIPPED))
    assert h.only("coverage") == [
        f"coverage: job tick slot {iso(T0 + 2)}: 2 records: record 3 ok token 3 by vm:d1; "
        "record 99 skipped by vm:d2",
        f"coverage: job tick slot {iso(T0 + 6)}: passed with no record (the slot before: "
        f"{iso(T0 + 5)} record 6 ok token 6 by vm:d1, started {iso(T0 + 5.05)}, "
        f"ended {iso(T0 + 5.25)})",
    ]


def test_slots_while_disabled_or_paused_are_not_due() -> None:
    h = History()
    for _ in range(3):  # slots T0+2..T0+4 vanish: the job was disabled
        del h.records[2], h.commands[2]
    del h.records[5], h.commands[5]  # T0+8 vanishes too: the fleet was paused
    quiet = [Quiet("tick", T0 + 1.6, T0 + 4.2), Quiet("other", T0 + 5, T0 + 9),
             Quiet(None, T0 + 7.9, T0 + 8.1)]
    found = Checker(h.records, h.commands, Window(T0, T0 + 9), HOSTS, quiet).check()
    assert [v for v in found if v.row == "tick"] == []
    found = Checker(h.records, h.commands, Window(T0, T0 + 9), HOSTS, quiet[:2]).check()
    assert [v.slot for v in found if v.row == "tick"] == [T0 + 8]


def test_a_summary_row_covers_its_range_and_nothing_else() -> None:
    h = History()
    for _ in range(4):  # slots T0+2..T0+5 vanish
        del h.records[2], h.commands[2]
    h.records.append(m.RunRecord(
        50, "tick", None, "vm:d2", T0 + 4, None, 1, T0 + 6.5, T0 + 6.5, None, m.MISSED,
        f"missed: 3 slots from {iso(T0 + 2)} to {iso(T0 + 4)}: no daemon ran the job"))
    assert h.only("coverage") == [
        f"coverage: job tick slot {iso(T0 + 5)}: passed with no record (the slot before: "
        f"{iso(T0 + 4)} record 50 missed by vm:d2, started {iso(T0 + 6.5)}, "
        f"ended {iso(T0 + 6.5)})"]


def test_a_skipped_summary_row_covers_its_range_too() -> None:
    # The held-lock bookkeeping's summary of 7 slots (bench/soak.py, MariaDB):
    # read as one record, it left the 6 older slots "with no record".
    h = History()
    for _ in range(4):  # slots T0+2..T0+5 vanish
        del h.records[2], h.commands[2]
    h.records.append(m.RunRecord(
        50, "tick", None, "vm:d2", T0 + 5, None, 1, T0 + 6.5, T0 + 6.5, None, m.SKIPPED,
        f"skipped: 4 slots from {iso(T0 + 2)} to {iso(T0 + 5)}: the lock was held until "
        f"{iso(T0 + 5.5)} (token 2, vm:d1) with no run"))
    assert [v for v in h.check() if v.row == "tick"] == []


def test_a_command_past_the_next_claim_or_its_lost_lease_is_reported() -> None:
    h = History()
    # Token 3's command (slot T0+2, recorded lost at T0+2.1) ran on until T0+6.
    h.records[2] = replace(h.records[2], result=m.LOST, finished=T0 + 2.1)
    h.commands[2].end = T0 + 6
    found = [str(v) for v in h.check() if v.kind == "lease"]
    assert found == [
        f"lease: job tick slot {iso(T0 + 2)}: token 3 (run 3 on d1) ran until {iso(T0 + 6)}, "
        f"2.950s after token 4 was claimed by vm:d1 at {iso(T0 + 3.05)}",
        f"lease: job tick slot {iso(T0 + 2)}: token 3 (run 3 on d1) ran until {iso(T0 + 6)}, "
        f"{6 - 2.1 - LEASE:.3f}s after its lost lease ran out (last renewal "
        f"{iso(T0 + 2.1)} + {LEASE:g}s)",
    ]


def test_a_command_started_under_a_superseded_token_is_reported() -> None:
    # The retry job's second attempt of token 1 started after token 2 was
    # claimed, and was killed (SIGKILL: it logged no end).
    h = History()
    h.run("retry", T0 + 2, token=1, result=m.FAILED)
    h.run("retry", T0 + 4, token=2)
    h.commands.append(Command("retry", "d2", T0 + 2, None, 1, 40, T0 + 4.5, None, None))
    h.records.append(m.RunRecord(40, "retry", None, "vm:d2", T0 + 2, 1, 2, T0 + 4.49,
                                 T0 + 4.7, 137, m.KILLED))
    found = [str(v) for v in h.check() if v.row == "retry" and v.kind != "coverage"]
    assert found == [
        f"lease: job retry slot {iso(T0 + 2)}: token 1 (run 40 on d2) started at "
        f"{iso(T0 + 4.5)}, 0.450s after token 2 was claimed by vm:d1 at {iso(T0 + 4.05)}",
        f"record: job retry slot {iso(T0 + 2)}: token 1 (run 40 on d2) started at "
        f"{iso(T0 + 4.5)} and never logged its end",
    ]


def test_one_token_started_twice_at_once_is_reported() -> None:
    # A fan-out item run twice for one slot, at once, under one token and
    # one run id (seen: bench/soak.py --seconds 300 --seed 4711, PostgreSQL).
    h = History()
    h.run("fan-out", T0 + 3, token=7, item="i5")
    h.commands.append(Command("fan-out", "d3", T0 + 3, "i5", 7, 1, T0 + 3.07, T0 + 3.3, "0"))
    found = [str(v) for v in h.check() if v.row == "fan-out/i5"]
    assert found == [
        f"twice: job fan-out/i5 slot {iso(T0 + 3)}: started by token 7 (run 11 on d1), "
        "token 7 (run 1 on d3)",
        f"overlap: job fan-out/i5 slot {iso(T0 + 3)}: token 7 (run 1 on d3) started at "
        f"{iso(T0 + 3.07)} while fan-out/i5 token 7 (run 11 on d1) (slot {iso(T0 + 3)}) ran "
        f"until {iso(T0 + 3.24)}: 0.170s at once in job fan-out/i5",
        f"record: job fan-out/i5 slot {iso(T0 + 3)}: run 1: the record has row tick, "
        f"slot {iso(T0)}, token 1",
    ]


def test_a_slot_claimed_under_two_tokens_is_reported_though_one_command_ran() -> None:
    # A record is a claim: a fan-out item's slot recorded under the token of
    # its previous claim (a claim refused after its pick used to write one,
    # "lost" later with no command) and under the claim that ran it.
    h = History()
    h.run("fan-out", T0 + 3, token=8, item="i1")
    h.records.append(m.RunRecord(len(h.records) + 1, "fan-out", "i1", "vm:d2", T0 + 3, 7, 1,
                                 T0 + 3.02, T0 + 6.02, None, m.LOST))
    found = [str(v) for v in h.check() if v.row == "fan-out/i1"]
    assert found == [f"twice: job fan-out/i1 slot {iso(T0 + 3)}: claimed under tokens [7, 8]"]


def test_the_command_log_is_read_whole(tmp_path: Path) -> None:
    log = tmp_path / "commands.log"
    log.write_text(
        "start 10.5 fan-out d3 2026-11-25T15:08:54Z i5 74 1525 -\n"
        "end 10.9 fan-out d3 2026-11-25T15:08:54Z i5 74 1525 0\n"
        "start 13.4 fan-out d3 2026-11-25T15:08:57Z i5 74 1525 -\n"
        "start 13.5 fan-out d3 2026-11-25T15:08:57Z i5 74 1543 -\n"
        "end 13.9 fan-out d3 2026-11-25T15:08:57Z i5 74 1525 0\n"
        "end 14.0 tick d1 2026-11-25T15:08:57Z - 9 1600 0\n"
        "start 14.1 tick d1\n")
    commands, bad = read_commands(log)
    assert [(c.run_id, c.start, c.end) for c in commands] == [
        (1525, 10.5, 10.9), (1525, 13.4, 13.9), (1543, 13.5, None)]
    assert bad == [
        "an end line with no start: 'end 14.0 tick d1 2026-11-25T15:08:57Z - 9 1600 0'",
        "torn command log line 'start 14.1 tick d1'",
        "run id 1525 was given to 2 commands: fan-out/i5 slot 2026-11-25T15:08:54Z on d3, "
        "fan-out/i5 slot 2026-11-25T15:08:57Z on d3",
    ]


def test_lock_at_least_and_group_seats_are_checked() -> None:
    h = History()
    h.run("at-least", T0 + 2, token=1)
    h.run("at-least", T0 + 4, token=2)  # 2 s after a run holding the lock 4 s
    h.run("group-a", T0 + 2, token=1, length=1.5)
    h.run("group-b", T0 + 3, token=1, length=1.5, host="d2")  # while group-a holds the seat
    found = [str(v) for v in h.check() if v.kind in ("at-least", "overlap")]
    assert found == [
        f"overlap: job group-b slot {iso(T0 + 3)}: token 1 (run 14 on d2) started at "
        f"{iso(T0 + 3.06)} while group-a token 1 (run 13 on d1) (slot {iso(T0 + 2)}) ran "
        f"until {iso(T0 + 3.54)}: 0.480s at once in group g",
        f"at-least: job at-least slot {iso(T0 + 4)}: token 2 claimed 2.000s after token 1 "
        f"(slot {iso(T0 + 2)}, ok) started; lock-at-least 4s",
    ]


def test_records_that_disagree_with_the_commands_are_reported() -> None:
    h = History()
    h.commands[1].status = "1"  # the command failed, the record says ok
    h.commands.append(Command("tick", "d3", T0 + 8, None, 9, 77, T0 + 8.1, T0 + 8.2, "0"))
    found = [str(v) for v in h.check() if v.kind == "record"]
    assert found == [
        f"record: job tick slot {iso(T0 + 1)}: run 2: the record has result ok, the command "
        "ended with 1",
        f"record: job tick slot {iso(T0 + 8)}: token 9 (run 77 on d3) ran with no record "
        "of run 77",
    ]


def test_a_daemon_traceback_is_a_crash() -> None:
    log = ("2026 INFO fine\nException in thread renewer:\nTraceback (most recent call last):\n"
           '  File "x.py", line 1\nKeyError: \'tick\'\n')
    found = [str(v) for v in daemon_problems({"d2": log}, {"d1": [-9]}, {"d2": 0, "d3": 1})]
    assert found == [
        "crash: job (daemon d2): log line 2: Exception in thread renewer: ... KeyError: 'tick'",
        "crash: job (daemon d2): log line 3: Traceback (most recent call last): ... "
        "KeyError: 'tick'",
        "crash: job (daemon d1): exited by itself with status -9",
        "crash: job (daemon d3): exit status 1 on the final SIGTERM",
    ]


def test_the_schedule_is_a_function_of_the_seed() -> None:
    a, b = schedule(42, 600, 3), schedule(42, 600, 3)
    assert a == b
    assert schedule(43, 600, 3) != a
    assert {f.kind for f in a} == {"kill", "stop", "cut", "cut-all", "clock", "reload",
                                   "pause", "disable"}
    for f in a:  # one fault per daemon at a time, never two daemons of three
        busy = [g for g in a if g.target is not None and g.at <= f.at < g.end]
        assert len({g.target for g in busy}) == len(busy) <= 2, f


# -- the soak -----------------------------------------------------------------


@pytest.mark.slow
def test_fault_soak(db: TestDb, tmp_path: Path) -> None:
    if db.backend == "sqlite":
        pytest.skip("SQLite serves one host and has no connection to cut: the soak is for "
                    "a fleet on a server database")
    seed = int(os.environ.get("DBLOCKRUN_SOAK_SEED") or random.randrange(10**6))
    print(f"\nfault soak [{db.backend}] seed {seed}")
    try:
        report = run_soak(db.url, db.prefix, db.backend, SOAK_SECONDS, seed, tmp_path)
    except Unavailable as exc:
        if strict():
            pytest.fail(f"{exc} (CI/DBLOCKRUN_TEST_STRICT: not skipping)", pytrace=False)
        pytest.skip(str(exc))
    print(report.figures())
    for v in report.violations:
        print(f"  {v}")
    assert report.runs > SOAK_SECONDS, f"too few runs for a soak: {report.figures()}"
    assert sum(report.injected.values()) >= SOAK_SECONDS / 10, report.figures()
    # Every kind of violation fails, as in bench/soak.py.
    assert not report.violations, (
        f"{report.figures()}\n" + "\n".join(str(v) for v in report.violations[:50])
        + "".join(f"\n{line}" for line in report.evidence)
        + f"\nreplay: {report.replay()}")
