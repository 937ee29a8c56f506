"""The daemon's fleet bookkeeping has its own timer: a slow round (a sweep
over many runs, a slow host read) never delays the lease renewals."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from helpers import wait_for

from dblockrun.config.jobs import JobsFile
from dblockrun.daemon.fleet import FleetBooks
from dblockrun.metrics import Metrics
from dblockrun.running.heartbeat import DbClock, Renewer
from dblockrun.running.runner import LeaseWatch
from dblockrun.store import Store
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
    books = FleetBooks(store, "me", 0.1, DbClock(), outage, Metrics(),
                       lambda: JobsFile("jobs.yaml", None, ()), lambda: 1)
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
