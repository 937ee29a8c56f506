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
    store = daemon.store
    slots = []
    for _ in range(2):
        daemon.at(daemon.next_at())
        slot = max(r.slot or 0.0 for name in "abc" for r in store.runs_of(name))
        slots.append(slot)
        runs = {name: [r for r in store.runs_of(name) if r.slot == slot] for name in "abc"}
        assert all(len(of) == 1 for of in runs.values()), runs
        by_result = {of[0].result: of[0] for of in runs.values()}
        assert set(by_result) == {m.RUNNING, m.WAITING, m.SKIPPED}, runs
        assert by_result[m.SKIPPED].output == (
            "skipped: group backups full and 1 slot(s) already waiting for a seat (queue: 1)\n")
        waiting = by_result[m.WAITING]
        assert waiting.output is not None and waiting.output.startswith(
            "a seat of group backups at its limit (1)"), waiting.output
        daemon.clock.advance(1.0)
        first = daemon.finish(by_result[m.RUNNING].id)
        assert first.result == m.OK and first.finished is not None
        # The waiting slot takes the seat (its try comes every QUEUE_POLL).
        started = daemon.when(waiting.id, m.RUNNING, "the waiting slot to start")
        assert started.started >= first.finished  # never two at once
        daemon.clock.advance(1.0)
        second = daemon.finish(waiting.id)
        assert second.result == m.OK and second.slot == slot
        daemon.step()  # the ends are seen: the next slots are planned
    assert slots[1] - slots[0] == 4.0 and slots[0] % 4 == 0
