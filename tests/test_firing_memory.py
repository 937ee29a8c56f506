"""A daemon's attempts on the memory store (tests/firingmem.py): the logic
of limits that queue, seats and overlap, one daemon, its clock moved by
the test. Each test names the tests on the real databases that still cover
its SQL (and what only processes and a fleet show)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from firingmem import MemoryDaemon

from dblockrun.store import models as m
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
