"""The daemon's fleet bookkeeping has its own timer: a slow round (a sweep
over many runs, a slow host read) never delays the lease renewals."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from helpers import daemon_state, wait_for

from dblockrun.daemon.fleet import FleetBooks
from dblockrun.jobs import JobsFile
from dblockrun.running.heartbeat import Renewer
from dblockrun.running.runner import LeaseWatch
from dblockrun.store import Store
from dblockrun.store.memory import MemoryRunStore
from dblockrun.store.outage import Outage


def test_a_stuck_bookkeeping_round_does_not_delay_renewals(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.ensure_jobs(["job"])
    token = store.claim("job", "me", 30)
    assert token is not None
    stuck, entered = threading.Event(), threading.Event()
    real_round = store.books_round

    def slow_round(*args: Any, **kwargs: Any) -> object:
        entered.set()
        stuck.wait(30)  # a round that takes far longer than a heartbeat
        return real_round(*args, **kwargs)

    monkeypatch.setattr(store, "books_round", slow_round)
    outage = Outage()
    books = FleetBooks(daemon_state(store, "me", JobsFile("jobs.yaml", None, ()),
                                    heartbeat=0.1, outage=outage))
    renewer = Renewer(store, 0.1, outage)
    watch = LeaseWatch("job", "me", token, 30)
    renewer.add(watch)
    books.start()
    renewer.start()
    try:
        wait_for(entered.is_set, 10, what="the bookkeeping round to get stuck")
        renewed: set[float] = set()

        def renewals() -> bool:
            renewed.add(watch.last_ok)
            return len(renewed) >= 4  # the claim's time and three renewals

        wait_for(renewals, 10, what="renewals while the bookkeeping is stuck")
        assert not watch.lost
    finally:
        stuck.set()
        renewer.stop()
        books.stop()


def test_a_renewal_asked_for_soon_after_another_comes_when_the_gap_ends(
        memory_store: MemoryRunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """MySQL's wake-ups renew at once, at most every 0.5 s (a kill request
    is read by the renewal). A kill filed 0.3 s after a run's wake-up was
    dropped, and read only at the next heartbeat (30 s here): `kill
    --timeout 2s` failed. The second renewal now comes when the gap ends.

    The renewer's timing on the memory store and its manual clock (the
    renewer schedules on its outage's clock): no real seconds pass. A
    renewal's statement is the role's contract on every database
    (tests/test_runstore_contract.py)."""
    store, clock = memory_store, memory_store.clock
    store.ensure_jobs(["job"])
    won = store.claim("job", "me", 60)
    assert won is not None
    token = won.token
    at: list[float] = []  # when (the manual clock) each renewal came
    real = store.renew_many

    def renew_many(*args: Any, **kwargs: Any) -> dict[str, str | None]:
        at.append(clock.now())
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "renew_many", renew_many)
    renewer = Renewer(store, 30.0, Outage(clock.now, clock.advance))
    watch = LeaseWatch("job", "me", token, 60)
    renewer.add(watch)
    renewer.start()
    try:
        renewer.renew_now(0.5)  # the run's wake-up
        wait_for(lambda: len(at) == 1, 5, interval=0.01, what="the first renewal")
        renewer.renew_now(0.5)  # the kill's, within the gap
        for _ in range(2):  # the gap's first half, then its end
            clock.advance(0.25)
            renewer.wake()
        wait_for(lambda: len(at) == 2, 5, interval=0.01,
                 what="the second renewal, when the gap ended (not after a 30 s heartbeat)")
        assert at[1] - at[0] >= 0.5, at  # not before the gap's end
    finally:
        renewer.stop()
