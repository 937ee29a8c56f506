"""A daemon's attempts on the memory store (tests/firingmem.py): the logic
of limits that queue, seats, overlap and job chains, one daemon, its clock moved by
the test. Each test names the tests on the real databases that still cover
its SQL (and what only processes and a fleet show)."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from firingmem import DEADLINE, ClockedRunStore, CutStore, MemoryDaemon
from helpers import coverage, overlaps, wait_for

from dblockrun.scheduling.planner import FRESH, RECORDED
from dblockrun.store import models as m
from dblockrun.store.memory import MemoryRunStore, RunRow
from dblockrun.timetext import utc


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[MemoryDaemon]]:
    made: list[MemoryDaemon] = []
    yield made
    for daemon in made:
        daemon.close()


QUEUE_OF_ONE = """\
    groups:
      backups: {{seats: 1, when-full: queue, queue: 1}}
    jobs:
      a: {{cron: "*/4 * * * * *", group: backups, command: '{held}'}}
      b: {{cron: "*/4 * * * * *", group: backups, command: '{held}'}}
      c: {{cron: "*/4 * * * * *", group: backups, command: '{held}'}}
    """


def test_a_full_queue_records_the_slot_skipped_with_the_reason(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """A group of one seat whose queue holds one slot, three jobs due
    together: one runs, one waits and runs once the seat is free, the third
    is recorded skipped, saying why; twice, never two at once.

    Moved from tests/test_queue.py (a real daemon on every database, 9 to 11 s
    a backend). Its SQL stays covered: tests/test_firing_contract.py (the
    claims, seats, waiting runs on every database) and, with processes and
    a fleet, test_queue.py's ``test_a_full_group_that_queues_runs_every_slot_one_after_the_other``
    and ``test_the_oldest_waiting_slot_gets_the_seat_first_across_the_fleet``."""
    daemon = MemoryDaemon(QUEUE_OF_ONE, tmp_path)
    daemons.append(daemon)
    one_runs_one_waits_one_skips(daemon, m.WAITING, (
        "skipped: group backups full and 1 slot(s) already waiting for a seat (queue: 1)\n"),
        "a seat of group backups at its limit (1)")


QUEUED_HOST = """\
    jobs:
      a: {{cron: "*/4 * * * * *", command: '{held}'}}
      b: {{cron: "*/4 * * * * *", command: '{held}'}}
      c: {{cron: "*/4 * * * * *", command: '{held}'}}
    """


def test_a_full_host_queue_records_the_slot_skipped_with_the_reason(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """``--max-running 1 --when-full queue --queue 1``, three jobs due
    together: one runs, one waits for room and runs after it, the third is
    recorded skipped, saying why; twice.

    Moved from tests/test_queue.py (a real daemon on every database, 8.5 to
    11.5 s a backend). Its SQL stays covered by tests/test_firing_contract.py
    (claims, waiting runs)
    and, with a real daemon, test_queue.py's
    ``test_a_full_host_that_queues_runs_every_slot_one_after_the_other``."""
    daemon = MemoryDaemon(QUEUED_HOST, tmp_path, max_running=1, host_queue=1)
    daemons.append(daemon)
    one_runs_one_waits_one_skips(daemon, m.WAITING, (
        "skipped: host-1:1:t at its --max-running limit (1) and 1 slot(s) already waiting "
        "there (--queue 1)\n"), "room on host-1:1:t (--max-running 1)")


def one_runs_one_waits_one_skips(daemon: MemoryDaemon, waits: str, skipped: str,
                                 waiting_for: str) -> None:
    """Two slots of the jobs a, b and c, due together where one may run and
    one wait: each time one runs, one waits (for ``waiting_for``) and runs
    after it, never alongside, and one is recorded ``skipped``."""
    store = daemon.store
    slots = []
    for _ in range(2):
        # (a host at its limit defers a slot a moment, for another host)
        daemon.until(daemon.next_at() + 0.5)
        slot = max(r.slot or 0.0 for name in "abc" for r in store.runs_of(name))
        slots.append(slot)
        runs = {name: [r for r in store.runs_of(name) if r.slot == slot] for name in "abc"}
        assert all(len(of) == 1 for of in runs.values()), runs
        by_result = {of[0].result: of[0] for of in runs.values()}
        assert set(by_result) == {m.RUNNING, waits, m.SKIPPED}, runs
        assert by_result[m.SKIPPED].output == skipped
        waiting = by_result[waits]
        assert waiting.output is not None and waiting.output.startswith(waiting_for), (
            waiting.output)
        daemon.clock.advance(1.0)
        first = daemon.finish(by_result[m.RUNNING].id)
        assert first.result == m.OK and first.finished is not None
        # The waiting slot starts (its try comes every QUEUE_POLL).
        started = daemon.when(waiting.id, m.RUNNING, "the waiting slot to start")
        assert started.started >= first.finished  # never two at once
        daemon.clock.advance(1.0)
        second = daemon.finish(waiting.id)
        assert second.result == m.OK and second.slot == slot
        daemon.step()  # the ends are seen: the next slots are planned
    assert slots[1] - slots[0] == 4.0 and slots[0] % 4 == 0


HELD_SEAT = """\
    groups:
      backups: {{seats: 1, when-full: queue}}
    jobs:
      hold: {{cron: "0-59/6 * * * * *", group: backups, command: '{held}'}}
      late: {{cron: "1-59/6 * * * * *", group: backups, starting-deadline: 1s,
              command: "true"}}
    """


def test_a_slot_that_waits_past_its_starting_deadline_is_recorded_missed(
        tmp_path: Path, daemons: list[MemoryDaemon], caplog: pytest.LogCaptureFixture) -> None:
    """A slot that waits for a seat longer than its starting deadline is
    not run: recorded ``missed`` through the slot book (its log line too).

    Moved from tests/test_queue.py (a real daemon on every database, 5.5 to
    7.5 s a backend). Its SQL stays covered by tests/test_firing_contract.py
    (claims, seats, waiting runs) and test_runstore_contract.py (the slot book's records)."""
    daemon = MemoryDaemon(HELD_SEAT, tmp_path)
    daemons.append(daemon)
    store = daemon.store
    daemon.at(daemon.next_at())  # late's first slot, the seat free: it runs
    [first] = store.runs_of("late")
    daemon.when(first.id, m.OK, "late's first run to end")
    daemon.at(daemon.next_at())  # hold's slot takes the seat and keeps it
    [hold] = store.runs_of("hold")
    assert hold.result == m.RUNNING and hold.slot is not None, hold
    daemon.at(daemon.next_at())  # late's next slot, a second later
    [late] = [r for r in store.runs_of("late") if r.id != first.id]
    assert (late.slot, late.result) == (hold.slot + 1, m.WAITING), late
    daemon.clock.advance(1.5)  # past its starting deadline while the seat is held
    missed = daemon.when(late.id, m.MISSED, "the waiting slot recorded missed")
    assert missed.output is not None and missed.output.startswith("missed: waited: ")
    assert missed.output.endswith("s late, starting-deadline 1s\n"), missed.output
    assert f"job late: slot {utc(hold.slot + 1)} missed: waited: " in caplog.text
    # The seat's holder runs on.
    assert [r.result for r in store.runs_of("hold")] == [m.RUNNING]
    assert store.seat_holders(["group:backups:1"]) == [("hold", "host-1:1:t")]


# --- catch-up after downtime (moved from tests/test_catchup.py) ------------------------
#
# The fleet stopped ``seconds`` ago: the job's lock row keeps its last slot
# then (MemoryRunStore.set_last_slot, as helpers.set_last_slot does in SQL),
# and a daemon starts now. The SQL these tests rely on (reading the lock row
# when a plan is in doubt, recording the passed slots in one statement, the
# slot claims of the backlog) stays covered on every database by
# tests/test_firing_contract.py (test_the_lock_rows_read_as_claimed_with_the_stores_time,
# test_a_slot_is_claimed_once_with_its_record_and_its_next_due_time),
# tests/test_runstore_contract.py (the slot book's records) and, end to end
# with real daemons after a real outage, test_catchup.py's
# test_two_daemons_after_downtime_run_each_missed_slot_once.

TICK = """\
    jobs:
      tick:
        cron: "* * * * * *"
        command: '{held}'
    """


def down_since(seconds: int) -> tuple[MemoryRunStore, float]:
    """A store whose fleet stopped ``seconds`` whole seconds ago, the
    daemon starting now, mid-second: (the store, the job tick's last slot)."""
    store = ClockedRunStore()
    store.clock.advance(0.4)
    last = float(math.floor(store.clock.now()) - seconds)
    store.set_last_slot("tick", last)
    return store, last


def _slots(runs: list[RunRow]) -> Counter[float]:
    return Counter(r.slot for r in runs if r.slot is not None)


def _oks(store: MemoryRunStore, job: str = "tick") -> list[RunRow]:
    return [r for r in store.runs_of(job) if r.result == m.OK]


def test_latest_runs_the_newest_missed_slot_and_records_the_older(
        tmp_path: Path, daemons: list[MemoryDaemon], caplog: pytest.LogCaptureFixture) -> None:
    """Moved from tests/test_catchup.py (a real daemon on every database,
    2.1 to 2.7 s a backend); its SQL: see the section's comment."""
    store, last = down_since(15)
    daemon = MemoryDaemon(TICK, tmp_path, store=store)
    daemons.append(daemon)
    daemon.go_on(lambda: bool(_oks(store)))
    first_ok = _oks(store)[0]
    assert first_ok.slot is not None
    runs = store.runs_of("tick")
    before = [r for r in runs if r.slot is not None and r.slot < first_ok.slot]
    assert {r.result for r in before} == {m.MISSED}
    # Every slot of the outage before the newest is recorded missed once, why
    # included: the newest RECORDED one by one, the older ones in one record.
    older, *each = sorted(before, key=lambda r: r.slot or 0)
    assert [r.slot for r in each] == [first_ok.slot - k for k in range(RECORDED, 0, -1)]
    assert all((r.output or "") == "missed: no daemon was running the job; "
               "catch-up: latest runs only the newest missed slot\n" for r in each)
    assert older.slot == first_ok.slot - RECORDED - 1
    assert (older.output or "") == (
        f"missed: {int(older.slot - last)} slots from {_iso(last + 1)} to {_iso(older.slot)}: "
        "no daemon was running the job; catch-up: latest runs only the newest missed slot\n")
    assert older.slot - last >= 3  # the outage was 15 s, and the daemon started after it
    assert ("missed: no daemon was running the job; catch-up: latest runs only the newest "
            "missed slot; running the newest") in caplog.text
    daemon.go_on(lambda: len(_oks(store)) >= 3)  # the regular schedule after the catch-up
    assert max(_slots(store.runs_of("tick")).values()) == 1


def test_none_runs_no_missed_slot(tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """Moved from tests/test_catchup.py (a real daemon on every database,
    0.4 to 1.6 s a backend); its SQL: see the section's comment."""
    store, last = down_since(8)
    t0 = store.clock.now()
    daemon = MemoryDaemon(TICK.replace("command:", "catch-up: none\n        command:"),
                          tmp_path, store=store)
    daemons.append(daemon)
    daemon.go_on(lambda: bool(_oks(store)))
    first_ok = _oks(store)[0]
    assert first_ok.slot is not None and first_ok.slot > t0 - FRESH
    runs = store.runs_of("tick")
    before = [r for r in runs if r.slot is not None and r.slot < first_ok.slot]
    # Each slot of the downtime has one record (a slow start may put the
    # oldest in one summary record).
    count = coverage([r.record() for r in before], store, 1.0)
    assert sorted(count) == [last + k for k in range(1, int(first_ok.slot - last))]
    assert set(count.values()) == {1}
    assert {r.result for r in before} == {m.MISSED}
    assert any("catch-up: none runs no missed slot" in (r.output or "") for r in before)
    assert len(count) >= 6
    assert max(_slots(runs).values()) == 1


def _catch_up_runs(store: MemoryRunStore, last: float, limit: int) -> tuple[list[RunRow],
                                                                            list[RunRow]]:
    """(the missed records of the start, the catch-up runs): the slots after
    ``last`` recorded missed with the catch-up's reason, then the ``limit``
    slots after them."""
    runs = store.runs_of("tick")
    missed = [r for r in runs if r.result == m.MISSED and "catch-up: all" in (r.output or "")]
    newest_missed = max((r.slot or 0.0 for r in missed), default=last)
    ran = sorted((r for r in runs if r.slot is not None
                  and newest_missed < r.slot <= newest_missed + limit), key=lambda r: r.slot or 0)
    return missed, ran


def test_all_runs_the_newest_missed_slots_one_at_a_time_oldest_first(
        tmp_path: Path, daemons: list[MemoryDaemon], caplog: pytest.LogCaptureFixture) -> None:
    """Moved from tests/test_catchup.py (a real daemon on every database,
    1.3 to 1.6 s a backend); its SQL: see the section's comment. Each run
    takes 0.3 s of the clock (the real test's ``sleep 0.3``)."""
    store, last = down_since(8)
    daemon = MemoryDaemon(TICK.replace(
        "command:", "catch-up: all\n        catch-up-limit: 3\n        command:"),
        tmp_path, store=store)
    daemons.append(daemon)

    def caught_up() -> bool:
        _missed, ran = _catch_up_runs(store, last, 3)
        return len(ran) == 3 and all(r.result == m.OK for r in ran)

    daemon.go_on(caught_up, took=0.3)
    missed, ran = _catch_up_runs(store, last, 3)
    # The older ones: each slot after the last one recorded missed, once.
    count = coverage([r.record() for r in missed], store, 1.0)
    assert sorted(count) == [last + k for k in range(1, len(count) + 1)]
    assert set(count.values()) == {1} and len(count) >= 5
    # The newest three: each run, oldest first, one at a time.
    assert [r.result for r in ran] == [m.OK] * 3
    for a, b in zip(ran, ran[1:], strict=False):
        assert a.finished is not None and a.finished <= b.started
    assert ran[0].started - (ran[0].slot or 0) > 1.0  # run late: a catch-up
    assert "running the newest 3, oldest first" in caplog.text
    assert max(_slots(store.runs_of("tick")).values()) == 1


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


# --- a full host (moved from tests/test_limits.py) ---------------------------------------
#
# --max-running 1 on one host. The SQL these rely on (the single and batch
# claims with their records, the slot book's skipped records) stays covered
# on every database by tests/test_firing_contract.py
# (test_a_slot_is_claimed_once_with_its_record_and_its_next_due_time,
# test_a_batch_claims_up_to_its_limit_by_the_single_claims_predicate) and
# tests/test_runstore_contract.py, and end to end by test_limits.py's
# test_a_full_host_leaves_the_slot_to_another_host (a full host beside a
# free one, real daemons) and test_queue.py's
# test_a_full_host_that_queues_runs_every_slot_one_after_the_other.

TWO_JOBS = """\
    jobs:
      left: {{cron: "*/2 * * * * *", command: '{held}'}}
      right: {{cron: "*/2 * * * * *", command: '{held}'}}
    """


def slots_done(store: MemoryRunStore, names: set[str], first: float, count: int
               ) -> dict[float, dict[str, m.RunRecord]] | None:
    """As helpers.slots_done, on the memory store: the first ``count``
    slots from ``first`` once every job of ``names`` has a finished record
    for each of them."""
    per_slot: dict[float, dict[str, m.RunRecord]] = {}
    for name in names:
        for run in store.runs_of(name):
            if run.slot is not None and run.slot >= first:
                per_slot.setdefault(run.slot, {})[name] = run.record()
    done = sorted(s for s, runs in per_slot.items()
                  if set(runs) == names and all(r.finished is not None for r in runs.values()))
    return {s: per_slot[s] for s in done[:count]} if len(done) >= count else None


def test_a_full_host_alone_records_the_slot_skipped_with_the_reason(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """Two jobs due together every 2 s, each run 0.8 s, one host with
    --max-running 1: of each slot, one job runs and the other is recorded
    skipped, saying why; never two at once.

    Moved from tests/test_limits.py (a real daemon on every database, 7.5
    to 8.5 s a backend); its SQL: see the section's comment."""
    daemon = MemoryDaemon(TWO_JOBS, tmp_path, max_running=1)
    daemons.append(daemon)
    store = daemon.store
    first = store.clock.now() + 1
    daemon.go_on(lambda: slots_done(store, {"left", "right"}, first, 3) is not None, took=0.8)
    slots = slots_done(store, {"left", "right"}, first, 3)
    assert slots is not None
    for runs in slots.values():
        assert sorted(r.result for r in runs.values()) == ["ok", "skipped"], runs
        skipped = next(r for r in runs.values() if r.result == "skipped")
        assert skipped.output is not None
        assert "at its --max-running limit (1) and no other host took the slot" in skipped.output
    assert overlaps([r for runs in slots.values() for r in runs.values()
                     if r.result == "ok"]) == []


BUSY_AND_TICK = """\
    jobs:
      busy: {{cron: "*/4 * * * * *", command: '{held}'}}
      tick: {{cron: "1-59/2 * * * * *", command: '{held}'}}
    """


def test_a_slot_due_while_the_host_is_full_is_skipped_not_run_late(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """A job due alone while the host's one run goes on (the single claim,
    not a batch): recorded skipped with the reason, never started late; the
    slots after the run ends run. (busy's runs take 2.5 s, tick's none.)

    Moved from tests/test_limits.py (a real daemon on every database, 8 to
    11 s a backend); its SQL: see the section's comment."""
    daemon = MemoryDaemon(BUSY_AND_TICK, tmp_path, max_running=1)
    daemons.append(daemon)
    store = daemon.store
    first = store.clock.now() + 1

    def ticks() -> list[RunRow] | None:
        runs = [r for r in store.runs_of("tick") if r.slot and r.slot >= first
                and r.result != "running"]  # (the newest may still run)
        return runs if {r.result for r in runs} >= {"ok", "skipped"} and len(runs) >= 4 \
            else None

    daemon.go_on(lambda: ticks() is not None, took={"busy": 2.5, "tick": 0.0})
    runs = ticks()
    assert runs is not None
    assert len({r.slot for r in runs}) == len(runs)  # one record per slot
    for run in runs:
        assert run.result in ("ok", "skipped")
        if run.result == "skipped":
            assert run.output is not None
            assert "at its --max-running limit (1)" in run.output
        else:  # started on time, not when the busy run ended
            assert run.slot is not None and run.started - run.slot < 0.5
    assert all(r.result == "ok" for r in store.runs_of("busy") if r.finished)


# --- rates and overlap of one job (moved from tests/test_daemon.py) -----------------------
#
# The SQL these rely on stays covered on every database by
# tests/test_firing_contract.py: a slot claim's rate and its tolerance
# (test_a_slot_is_claimed_once_with_its_record_and_its_next_due_time,
# test_a_slot_claim_a_little_short_of_the_rate_still_counts), a batch held to
# the rate (test_a_batch_claims_up_to_its_limit_by_the_single_claims_predicate),
# a held job's slot not claimed (the same first test); and end to end by
# test_daemon.py's real daemons (test_retries_share_one_token: a rate-only
# job; test_starting_deadline_records_a_late_slot_as_missed: a per-second
# cron job) and test_overlap.py's overlap tests (two daemons).


def _ok(store: MemoryRunStore, name: str) -> list[RunRow]:
    return [r for r in store.runs_of(name) if r.result == m.OK]


def test_a_cron_and_rate_job_keeps_its_rate_among_jobs_due_at_once(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """Four jobs share every instant, so the daemon claims them in a batch;
    the batch claim must hold ``limited`` to its rate like a single claim.

    Moved from tests/test_daemon.py (a real daemon on every database, 7.7
    to 8 s a backend); its SQL: see the section's comment."""
    others = "".join(f"      other{i}: {{{{cron: '*/2 * * * * *', command: '{{held}}'}}}}\n"
                     for i in range(3))
    daemon = MemoryDaemon("    jobs:\n"
                          "      limited: {{cron: '*/2 * * * * *', rate: 30s, command: '{held}'}}\n"
                          + others, tmp_path)
    daemons.append(daemon)
    store = daemon.store
    daemon.go_on(lambda: all(len(_ok(store, f"other{i}")) >= 4 for i in range(3)), took=0.1)
    runs = store.runs_of("limited")
    assert runs and all(r.result == m.OK for r in runs), runs
    starts = [r.slot or 0.0 for r in runs]
    assert all(b - a >= 30 for a, b in zip(starts, starts[1:], strict=False)), starts


def test_a_cron_and_rate_job_runs_every_period_without_drift(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """A start one rate later is a few milliseconds short of the rate by the
    database clock (here: the first turn 10 ms later past its slot than the
    next): it must still count, so the job runs every 4 s, not 6.

    Moved from tests/test_daemon.py (a real daemon on every database, 14 s
    a backend); its SQL: see the section's comment."""
    daemon = MemoryDaemon(
        "jobs:\n  paced: {{cron: '*/2 * * * * *', rate: 4s, command: '{held}'}}\n", tmp_path)
    daemons.append(daemon)
    store = daemon.store
    daemon.at(daemon.next_at() + 0.01)  # the daemon woke a little late
    daemon.go_on(lambda: len(_ok(store, "paced")) >= 4, took=0.1)
    slots = [r.slot or 0.0 for r in _ok(store, "paced")[:4]]
    gaps = [b - a for a, b in zip(slots, slots[1:], strict=False)]
    assert gaps == [4.0, 4.0, 4.0], gaps


def test_a_cron_and_rate_job_publishes_its_next_start_after_the_rate(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """``status`` shows next_due: for */2s + rate 6s the next start is 6 s
    after a run's slot, not the next cron slot 2 s later.

    Moved from tests/test_daemon.py (a real daemon on every database, 1.5
    to 2 s a backend); its SQL: see the section's comment."""
    daemon = MemoryDaemon(
        "jobs:\n  paced: {{cron: '*/2 * * * * *', rate: 6s, command: '{held}'}}\n", tmp_path)
    daemons.append(daemon)
    store = daemon.store
    daemon.go_on(lambda: len(_ok(store, "paced")) >= 1, took=0.1)
    run = _ok(store, "paced")[0]
    lock = store.lock_state("paced")
    assert run.slot is not None and lock is not None
    assert lock.next_due == run.slot + 6.0


def test_overlapping_slots_are_skipped(tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """A job every second whose run takes 2.5 s: the slots due while it runs
    are recorded skipped (no token), by the host that runs it; never two
    runs at once.

    Moved from tests/test_daemon.py (a real daemon on every database, 3.6
    to 4 s a backend); its SQL: see the section's comment."""
    daemon = MemoryDaemon("jobs:\n  slow:\n    cron: '* * * * * *'\n    command: '{held}'\n",
                          tmp_path)
    daemons.append(daemon)
    store = daemon.store

    def at_most_one_running() -> list[RunRow]:
        runs = store.runs_of("slow")
        assert len([r for r in runs if r.result == m.RUNNING]) <= 1, runs
        return runs

    def enough() -> bool:
        runs = at_most_one_running()
        return (len([r for r in runs if r.result == m.OK]) >= 1
                and len([r for r in runs if r.result == m.SKIPPED]) >= 2)

    daemon.go_on(enough, took=2.5)
    daemon.close()
    runs = store.runs_of("slow")
    assert {r.result for r in runs} <= {m.OK, m.SKIPPED, m.KILLED}
    slots = [r.slot for r in runs]
    assert None not in slots and len(set(slots)) == len(slots), "a slot recorded twice"
    ran = [r for r in runs if r.result != m.SKIPPED]
    for a, b in zip(ran, ran[1:], strict=False):
        assert a.finished is not None and b.started >= a.finished, "two runs overlapped"
    for skip in (r for r in runs if r.result == m.SKIPPED):
        assert skip.token is None
        holders = [r for r in ran if r.started <= skip.started
                   and (r.finished is None or skip.started <= r.finished)]
        assert holders, f"slot {skip.slot} skipped while nothing ran"
        assert skip.host == holders[0].host
        assert holders[0].slot is not None and skip.slot is not None
        assert skip.slot > holders[0].slot


def test_on_failure_disables_the_job(tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """``on-failure: {disable-for: 3h}``: the failed run disables its job
    for 3 h, saying which run failed how; no run after it.

    Moved from tests/test_daemon.py (a real daemon on every database, 3.5 s
    a backend). Its SQL stays covered on every database by
    tests/test_firing_contract.py's
    test_a_disable_for_a_while_keeps_its_reason_and_refuses_claims_until_it_ends
    (what on-failure writes, and the claims it refuses); the status a user
    reads of a disabled job by test_cli.py's status tests."""
    daemon = MemoryDaemon("jobs:\n  broken:\n    cron: '* * * * * *'\n"
                          "    on-failure: {{disable-for: 3h}}\n    command: echo boom; exit 1\n",
                          tmp_path)
    daemons.append(daemon)
    store = daemon.store
    daemon.go_on(lambda: any(r.result == m.FAILED for r in store.runs_of("broken")), took=0.0)
    failed = next(r for r in store.runs_of("broken") if r.result == m.FAILED)
    assert failed.exit_code == 1

    def disabled() -> m.LockState | None:
        lock = store.lock_state("broken")
        return lock if lock is not None and lock.disabled_until is not None else None

    lock = wait_for(disabled, DEADLINE, what="job disabled")
    assert lock.disabled_until is not None
    assert lock.disabled_until - store.clock.now() == pytest.approx(3 * 3600, abs=30)
    reason = lock.disabled_reason or ""
    assert "exited 1" in reason and f"run {failed.id}" in reason, reason

    def one_run() -> None:
        # A slot that came due while the failed run was still being recorded
        # is recorded skipped: a record, not a run.
        runs = [r for r in store.runs_of("broken") if r.result != m.SKIPPED]
        assert [r.id for r in runs] == [failed.id], runs

    end = store.clock.now() + 2.2
    while (nxt := daemon.next_at()) <= end:  # 2.2 s of the clock, each due turn taken
        daemon.at(nxt)
        one_run()
    daemon.at(end)
    one_run()



def test_a_daemon_that_starts_while_its_job_is_disabled_records_what_passed_before_it(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """No daemon ran the job for a while, then an operator disabled it, then
    a daemon starts: the slots of the downtime before the disable began were
    due, and each gets one ``missed`` record saying so; the slots of the
    disable get none (not due); once enabled, it runs again.

    The fault soak's seed 169457 (PostgreSQL, CI): the every-host row of a
    daemon the nemesis cut off and killed before its outage's resync, which
    came back while its job was disabled. Only its own host records an
    every-host row's slots, so 7 slots before the disable had no record.
    Its SQL: test_firing_contract.py (the lock rows, audited disables'
    starts) and test_runstore_contract.py (the slot book's records)."""
    store = ClockedRunStore()
    store.clock.advance(0.4)
    last = float(math.floor(store.clock.now()))
    store.set_last_slot("tick", last)  # the fleet stopped just after this slot
    store.clock.advance(6.0)  # slots last + 1 .. last + 6 pass with no daemon
    store.disable("tick", reason="maintenance", audited=True)  # dblockrun disable tick
    began = store.clock.now()
    store.clock.advance(3.0)
    daemon = MemoryDaemon(TICK, tmp_path, store=store)
    daemons.append(daemon)
    daemon.until(store.clock.now() + 2.0)  # still disabled: its claims lose
    store.enable("tick")  # dblockrun enable tick
    enabled = store.clock.now()
    daemon.go_on(lambda: len(_oks(store)) >= 2)
    runs = store.runs_of("tick")
    count = coverage([r.record() for r in runs], store, 1.0)
    before = [last + k for k in range(1, 7)]
    assert [count[s] for s in before] == [1] * 6, sorted(count.items())
    assert {r.result for r in runs if r.slot is not None and r.slot < began} == {m.MISSED}
    assert all("no daemon was running the job; then the job was disabled" in (r.output or "")
               for r in runs if r.slot is not None and r.slot < began)
    assert not [s for s in count if began < s < enabled]  # disabled: not due
    assert min(r.slot or 0.0 for r in _oks(store)) > enabled
    assert max(count.values()) == 1


CUT_OFF = """\
    jobs:
      tick:
        cron: "* * * * * *"
        command: '{held}'
      long:
        rate: 1h
        command: '{held}'
    """


def test_the_slots_an_outage_passed_are_recorded_as_soon_as_the_database_answers(
        tmp_path: Path, daemons: list[MemoryDaemon], caplog: pytest.LogCaptureFixture) -> None:
    """A daemon cut off from the database for 20 s: its attempts back off
    while it fails (0.5 s, doubling up to 10 s), and once a statement gets
    through again (here the renewal of the run going, a heartbeat after its
    last try; a daemon's bookkeeping round too, every 1.2 heartbeats), the
    slots the outage passed are recorded and the next slot runs at once,
    not when the backoff of the job's last failed attempt is over (up to
    10 s later).

    The fault soak's seed 169457 (MariaDB, loaded): every-host@d1's resync
    came 11 s after "database back", and the fleet stopped before its
    loop decided a slot. Its SQL: test_firing_contract.py (the lock rows,
    the claims) and test_runstore_contract.py (the slot book's records);
    with real daemons and a real cut, test_passed_slots.py."""
    store = CutStore()
    daemon = MemoryDaemon(CUT_OFF, tmp_path, store=store)
    daemons.append(daemon)
    took = {"tick": 0.3, "long": 3600.0}
    daemon.go_on(lambda: len(_oks(store)) >= 2, took=took)
    assert [r.job for r in store.control.running()] == ["long"]
    cut = store.clock.now()
    store.cut = True
    daemon.until(cut + 20.0)
    store.cut = False
    back = store.clock.now()
    # While cut, the attempts backed off: 20 slots passed, a few tries.
    tries = sum(n for name, n in store.refused.items() if name != "renew_many")
    assert 3 <= tries <= 7, store.refused
    assert not [r for r in store.runs_of("tick") if r.slot is not None and r.slot > cut]
    # The renewal (a heartbeat, 1 s, after its last) is the first to get through.
    daemon.at(back + 1.0)
    daemon.renewer.wake()
    wait_for(lambda: not daemon.outage.down, DEADLINE, what="a renewal to get through")
    daemon.step()  # the turn the database's return woke: the resync
    daemon.step()  # and the next, at once: the newest passed slot's claim
    runs = store.runs_of("tick")
    count = coverage([r.record() for r in runs], store, 1.0)
    passed = [float(s) for s in range(math.ceil(cut), math.floor(back + 1.0) + 1)]
    assert [count[s] for s in passed] == [1] * len(passed), sorted(count.items())
    assert {r.result for r in runs if r.slot is not None and cut < r.slot < passed[-1]} == {
        m.MISSED}
    assert any(r.slot is not None and r.slot >= back and r.result in (m.RUNNING, m.OK)
               for r in runs), [(r.slot, r.result) for r in runs]
    assert "database back after" in caplog.text
    # The regular schedule goes on: every slot one record, no gap.
    daemon.go_on(lambda: len([r for r in _oks(store) if (r.slot or 0) > back + 2]) >= 2,
                 took=took)
    count = coverage([r.record() for r in store.runs_of("tick")], store, 1.0)
    first, last = min(count), max(count)
    assert [count[first + k] for k in range(int(last - first) + 1)] == [1] * int(
        last - first + 1), sorted(count.items())


# --- retries (moved from tests/test_daemon.py) --------------------------------------------


def test_retries_share_one_token(tmp_path: Path, daemons: list[MemoryDaemon],
                                 caplog: pytest.LogCaptureFixture) -> None:
    """A job with two retries 200 ms apart whose command fails twice: three
    attempts, one claim (one token), each after the retry delay.

    Moved from tests/test_daemon.py (a real daemon on every database, 1 to
    2 s a backend). Its SQL stays covered on every database by
    tests/test_firing_contract.py's
    test_a_retrys_attempts_are_recorded_under_the_claims_token (the
    attempts under one claim's token, the last one's end releasing the
    job). A real daemon retries on every database in tests/test_notify.py's
    test_pings_start_then_success_or_fail_with_the_run_id_and_the_output
    (two attempts recorded, one ping for the last) and, across two daemons,
    tests/test_fanout.py's test_two_daemons_run_each_item_once_per_slot_with_retries.
    The delay is on the test's clock (the harness's run loop)."""
    caplog.set_level(logging.INFO)
    counter = tmp_path / "count"
    daemon = MemoryDaemon(
        "jobs:\n  flaky:\n    rate: 1h\n    retries: 2\n    retry-delay: 200ms\n"
        f"    command: n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); "
        f"echo $n > {counter}; echo attempt $n; [ $n -ge 3 ]\n", tmp_path)
    daemons.append(daemon)
    store = daemon.store
    daemon.go_on(lambda: any(r.result == m.OK for r in store.runs_of("flaky")), took=0.0)
    runs = store.runs_of("flaky")
    assert [r.attempt for r in runs] == [1, 2, 3]
    assert [r.result for r in runs] == [m.FAILED, m.FAILED, m.OK]
    assert [r.exit_code for r in runs] == [1, 1, 0]
    assert [(r.output or "").strip() for r in runs] == ["attempt 1", "attempt 2", "attempt 3"]
    tokens = {r.token for r in runs}
    assert len(tokens) == 1 and None not in tokens
    for a, b in zip(runs, runs[1:], strict=False):
        assert a.finished is not None and b.started - a.finished >= 0.15, "no retry-delay"
    assert "retrying (attempt 3 of 3)" in caplog.text
    daemon.close()
    assert len(store.runs_of("flaky")) == 3


# --- job chains (after:; moved from tests/test_chains.py) ---------------------------------
#
# One daemon deciding what a trigger of a downstream job gets: a run, or
# one record of why not. The SQL of the triggers (made once, pending, the
# one claim or record, the pause and drain a lost claim reads) stays
# covered on every database by tests/test_chain_contract.py and
# tests/test_chains_store.py (the race of four hosts for the same triggers);
# end to end by test_chains.py's
# test_three_daemons_start_one_downstream_run_per_upstream_run (real
# daemons on every database, the command told its upstream run).


def _unique_upstreams(runs: list[RunRow]) -> bool:
    """One record per upstream run, and every record names one."""
    ups = [r.upstream_run for r in runs if r.upstream_run is not None]
    return len(ups) == len(set(ups)) == len(runs)


#: extract every second, load after it, both held until the test finishes them.
CHAIN_HELD = """\
    jobs:
      extract:
        rate: 1s
        command: '{held}'
      load:
        after: extract
        command: '{held}'
    """


def test_a_trigger_of_a_disabled_job_is_recorded_skipped(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """An operator disabled the downstream job: each trigger gets one
    ``skipped`` record naming its upstream run; enabled, it runs again.

    Moved from tests/test_chains.py (a real daemon on every database).
    Its SQL: test_chain_contract.py's
    test_a_claim_that_loses_leaves_the_trigger_pending_and_says_why (a
    disabled job's claim loses, the trigger stays) and
    test_a_trigger_that_cannot_run_is_recorded_once_and_pruned_when_old
    (the one skipped record); test_chains_store.py's
    test_a_trigger_that_cannot_run_is_recorded_once."""
    store = ClockedRunStore()
    store.ensure_jobs(["load"])
    store.disable("load", reason="maintenance", audited=True)  # dblockrun disable load
    daemon = MemoryDaemon(CHAIN_HELD, tmp_path, store=store)
    daemons.append(daemon)
    daemon.go_on(lambda: any(r.result == m.SKIPPED for r in store.runs_of("load")), took=0.2)
    skipped = next(r for r in store.runs_of("load") if r.result == m.SKIPPED)
    assert skipped.output == "skipped: load is disabled\n"
    assert skipped.upstream_job == "extract" and skipped.upstream_run is not None
    assert [r for r in store.runs_of("load") if r.result == m.OK] == []
    store.enable("load")  # dblockrun enable load
    daemon.go_on(lambda: any(r.result == m.OK for r in store.runs_of("load")), took=0.2)
    daemon.close()
    assert _unique_upstreams(store.runs_of("load"))


CHAIN_PAUSED = """\
    jobs:
      extract:
        rate: 1h
        command: '{held}'
      load:
        after: extract
        command: "true"
    """


def test_a_trigger_while_the_fleet_is_paused_is_recorded_skipped(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """The pause holds every claim: the trigger of an upstream run that ends
    under it gets its record.

    Moved from tests/test_chains.py (a real daemon on every database).
    Its SQL: test_chain_contract.py's
    test_a_claim_that_loses_leaves_the_trigger_pending_and_says_why (a
    claim under the pause loses, the pause reads as in effect) and
    test_a_trigger_that_cannot_run_is_recorded_once_and_pruned_when_old;
    the pause itself on every database by test_firing_contract.py's claims
    and test_pause.py."""
    daemon = MemoryDaemon(CHAIN_PAUSED, tmp_path)
    daemons.append(daemon)
    store = daemon.store
    daemon.go_on(lambda: any(r.result == m.RUNNING for r in store.runs_of("extract")))
    extract, = store.runs_of("extract")
    store.pause(3600)  # dblockrun pause --for 1h
    daemon.finish(extract.id)  # extract ends under the pause
    daemon.step()
    skipped = next(iter(r for r in store.runs_of("load") if r.result == m.SKIPPED), None)
    assert skipped is not None, store.runs_of("load")
    assert skipped.output == "skipped: the fleet is paused\n"
    assert skipped.upstream_run == extract.id
    store.resume()  # dblockrun resume
    daemon.at(store.clock.now() + 1)
    daemon.close()
    assert _unique_upstreams(store.runs_of("load"))


CHAIN_GROUPED = """\
    groups: {{warehouse: 1}}
    jobs:
      hog:
        rate: 1h
        group: warehouse
        command: '{held}'
      extract:
        rate: 1h
        command: '{held}'
      load:
        after: extract
        group: warehouse
        command: '{held}'
    """


def test_a_trigger_whose_group_is_full_is_recorded_skipped(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """The downstream job's group has no free seat (``hog`` holds it): the
    trigger's run is recorded skipped with the group's reason.

    Moved from tests/test_chains.py (a real daemon on every database).
    Its SQL: test_chain_contract.py's
    test_a_trigger_is_claimed_once_with_a_record_naming_its_upstream_run
    (the trigger's claim and record), test_firing_contract.py's group seat
    tests (a full group, its holders)."""
    daemon = MemoryDaemon(CHAIN_GROUPED, tmp_path)
    daemons.append(daemon)
    store = daemon.store
    daemon.go_on(lambda: any(r.result == m.SKIPPED for r in store.runs_of("load")),
                 took={"hog": 3600.0, "extract": 0.2, "load": 0.2})
    skipped = next(r for r in store.runs_of("load") if r.result == m.SKIPPED)
    assert skipped.output is not None and skipped.output.startswith(
        "skipped: group warehouse at its limit (1): held by hog"), skipped.output
    extract, = store.runs_of("extract")
    assert (skipped.upstream_job, skipped.upstream_run) == ("extract", extract.id)
    daemon.close()
    assert len(store.runs_of("load")) == 1


CHAIN_RETRIED = """\
    jobs:
      extract:
        rate: 1h
        retries: 1
        retry-delay: 1s
        # The first attempt fails, the retry succeeds: one run, ok.
        command: |
          echo x >> {dir}/count
          [ "$(wc -l < {dir}/count)" -ge 2 ]
      load:
        after: extract
        command: "true"
      page:
        after: {{jobs: [extract], on: failure}}
        command: "true"
    """


def test_a_run_with_retries_starts_one_run_for_its_last_attempt(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """The failed first attempt (its retry to come) starts nothing; the
    retry's ok starts ``load`` once, and no look after pages anybody.

    Moved from tests/test_chains.py (a real daemon on every database).
    Its SQL: test_chain_contract.py's
    test_a_run_that_is_not_over_makes_no_trigger_from_a_look (an attempt
    holding its lease, or with a later attempt, makes no trigger) and
    test_firing_contract.py's
    test_a_retrys_attempts_are_recorded_under_the_claims_token; end to end,
    a real daemon's chains by test_chains.py's three-daemon test (no
    retries: no real daemon retries on every database any more)."""
    daemon = MemoryDaemon(CHAIN_RETRIED, tmp_path)
    daemons.append(daemon)
    store = daemon.store
    daemon.go_on(lambda: any(r.result == m.OK for r in store.runs_of("load")), took=0.0)
    load = next(r for r in store.runs_of("load") if r.result == m.OK)
    attempts = store.runs_of("extract")
    assert [(r.attempt, r.result) for r in attempts] == [(1, m.FAILED), (2, m.OK)]
    assert load.upstream_run == attempts[1].id
    for _ in range(3):  # looks of the chains: the failed first attempt pages nobody
        daemon.at(store.clock.now() + 1)
    assert store.runs_of("page") == [] and len(store.runs_of("load")) == 1
    daemon.close()



def test_a_trigger_whose_upstream_ended_while_its_job_ran_is_skipped(
        tmp_path: Path, daemons: list[MemoryDaemon]) -> None:
    """overlap: forbid, as for a slot due while the run goes on: one
    record per upstream run, ran or skipped with the reason.

    Moved from tests/test_chains.py (a real daemon on every database).
    Its SQL: test_chain_contract.py's
    test_a_claim_that_loses_leaves_the_trigger_pending_and_says_why (a held
    job's claim loses, the trigger stays) and
    test_a_trigger_that_cannot_run_is_recorded_once_and_pruned_when_old;
    the held runs a lost claim reads by test_firing_contract.py's
    running/waiting tests. Triggers found together waiting for each other
    (not skipped) stay with test_chains.py's
    test_triggers_found_together_run_one_after_the_other (two daemons)."""
    daemon = MemoryDaemon(CHAIN_HELD, tmp_path)
    daemons.append(daemon)
    store = daemon.store
    daemon.go_on(lambda: {m.OK, m.SKIPPED} <= {r.result for r in store.runs_of("load")},
                 took={"extract": 0.1, "load": 2.5})
    daemon.close()
    runs = store.runs_of("load")
    ran = next(r for r in runs if r.result == m.OK)
    skipped = [r for r in runs if r.result == m.SKIPPED]
    assert {r.output for r in skipped} == {
        f"skipped: load was still running on {ran.host} (overlap: forbid)\n"}
    assert _unique_upstreams(runs)


EVERY_HOST_TICK = """\
    jobs:
      tick:
        cron: "* * * * * *"
        on: every-host
        command: "true"
    """
#: The same, beside a one-host job due on the same instants: the two are
#: claimed together, in one batch (Firing._fire_batch).
EVERY_HOST_TICK_IN_A_BATCH = """\
    jobs:
      tick:
        cron: "* * * * * *"
        on: every-host
        command: "true"
      other:
        cron: "* * * * * *"
        command: "true"
    """


class RefusedAtClaim(ClockedRunStore):
    """The fleet paused, or the job disabled, between a slot's decision and
    its claim: once :attr:`late` is set, the next slot's claim (alone or in
    a batch) finds the pause (or disable) begun ``late`` seconds after its
    slot."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what
        self.late: float | None = None
        self.began: float | None = None

    def _halt(self, names: Sequence[str], slot: float | None) -> None:
        if self.late is None or slot is None:
            return
        self.clock.advance(max(0.0, slot + self.late - self.clock.now()))
        self.began, self.late = self.clock.now(), None
        if self.what == "pause":
            self.pause(3600)  # dblockrun pause --for 1h
        else:  # dblockrun disable, of the every-host row
            row, = (name for name in names if name.startswith("tick@"))
            self.disable(row, reason="maintenance", audited=True)

    def claim_and_record(self, name: str, holder: str, lease: float, *,
                         slot: float | None = None, **kwargs: Any) -> m.Claimed | None:
        self._halt([name], slot)
        return super().claim_and_record(name, holder, lease, slot=slot, **kwargs)

    def claim_batch(self, names: Sequence[str], holder: str, lease: float, *, slot: float,
                    **kwargs: Any) -> list[m.Claimed]:
        self._halt(names, slot)
        return super().claim_batch(names, holder, lease, slot=slot, **kwargs)


@pytest.mark.parametrize("claim", ["alone", "batch"])
@pytest.mark.parametrize("what", ["pause", "disable"])
def test_an_every_host_slot_refused_by_a_pause_begun_after_it_came_due_is_recorded(
        tmp_path: Path, daemons: list[MemoryDaemon], what: str, claim: str) -> None:
    """The fleet paused (or the job disabled) 0.6 s after an every-host
    slot came due, before its claim reached the database: the claim is
    refused, and no other host claims or records that row, so the slot gets
    its one ``skipped`` record saying why; the slots that come due while
    paused get none (not due), and once resumed the job runs again. Alike
    whether the row is claimed alone or in a batch with the other jobs due
    on the same instant.

    The fault soak's seed 499718 (MariaDB, CI): the claim of
    ``every-host@d2`` reached the database 0.6 s after its slot, just after
    the nemesis paused the fleet; the daemon took the refusal for a slot
    another host won, and the slot had no record. Seed 83646 (MariaDB, CI,
    after that fix): the same for ``every-host@d3``, woken from SIGSTOP with
    its other jobs due, in a batch claim, which had not read why."""
    store = RefusedAtClaim(what)
    daemon = MemoryDaemon(EVERY_HOST_TICK if claim == "alone" else EVERY_HOST_TICK_IN_A_BATCH,
                          tmp_path, store=store)
    daemons.append(daemon)
    row, = (name for name in store.lock_states()[0] if name.startswith("tick@"))
    daemon.go_on(lambda: len(_oks(store, row)) >= 2)
    store.late = 0.6
    daemon.until(store.clock.now() + 3.0)
    assert store.began is not None
    refused = math.floor(store.began)  # the slot whose claim the pause refused
    runs = store.runs_of(row)
    skipped = [r for r in runs if r.result == m.SKIPPED]
    assert [(r.slot, r.output) for r in skipped] == [(refused, (
        "skipped: the fleet was paused before its claim\n" if what == "pause"
        else f"skipped: {row} was disabled before its claim\n"))], runs
    assert not [r for r in runs if r.slot is not None and r.slot > refused]  # not due
    if what == "pause":
        store.resume()  # dblockrun resume
    else:
        store.enable(row)  # dblockrun enable
    back = store.clock.now()
    daemon.go_on(lambda: any((r.slot or 0.0) > back for r in _oks(store, row)))
    count = coverage([r.record() for r in store.runs_of(row)], store, 1.0)
    assert max(count.values()) == 1
