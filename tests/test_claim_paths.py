"""Every claim path wins exactly when the contract says a claim wins.

:func:`reference_claimable` is the contract (DESIGN.md, README "Guarantees")
written as plain Python: the lock is free, the job is not disabled, a slot is
newer than the last one claimed and not in the future, the last start is at
least a rate old, a run-now request is filed, a fan-out item is not retired.
Hypothesis writes a lock row (times relative to the database's clock, never
within 5 s of a boundary, so the outcome does not depend on how long a
statement takes), asks each public claim path for it, and compares: the
single claim, the claim with its run record, the batch claim of jobs due
together, the run-now claim, ``exec``, :func:`dblockrun.lock` and the claim
of fan-out items. A path that forgets a condition (a batch that ignores the
rate) fails here with the row and the request. Also through PgBouncer, in
transaction and session pooling (the ``pgbouncer`` marker, tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dblockrun
from dblockrun.running.execlock import ExecOptions, ExecTarget, exec_locked
from dblockrun.store import Store
from dblockrun.store.items import item_key

pytestmark = pytest.mark.pgbouncer

#: How far in the database's future a slot may be and still be claimed
#: (the claim's default tolerance for clock estimates).
TOLERANCE = 0.1

#: Times relative to the database's now: at least 5 s from every boundary the
#: rates below make (a start 65 s ago is one rate of 60 s old, 55 s is not).
OFFSETS = [-7200.0, -600.0, -120.0, -65.0, -55.0, -10.0, 10.0, 60.0, 7200.0]
RATES = [30.0, 60.0, 3600.0]

OTHER_HOLDER = "other-host:1:abcdef"
LEASE = 30.0
BUSY = 75  # exec's exit status when it did not get the lock


@dataclass(frozen=True)
class Row:
    """A lock row (or a fan-out item's row with its job's ``disabled_until``);
    times are epoch seconds on the database clock."""

    token: int  # in a generated row: how far the token moved on since (tokens never go back)
    lock_until: float | None = None
    disabled_until: float | None = None
    last_slot: float | None = None
    last_start: float | None = None
    run_requested: float | None = None
    retired: bool = False  # items only

    def at(self, db_now: float) -> Row:
        """This row with its times taken as offsets from ``db_now``."""
        def shift(value: float | None) -> float | None:
            return None if value is None else db_now + value

        return replace(self, lock_until=shift(self.lock_until),
                       disabled_until=shift(self.disabled_until),
                       last_slot=shift(self.last_slot), last_start=shift(self.last_start),
                       run_requested=shift(self.run_requested))


@dataclass(frozen=True)
class Request:
    """What a claim asks for; a path without a parameter leaves it out."""

    slot: float | None = None  # a cron slot (epoch seconds)
    rate: float | None = None  # seconds since the last start, at least
    requested: bool = False  # a run-now claim (`dblockrun run`)
    item: bool = False  # a fan-out item

    def at(self, db_now: float) -> Request:
        return replace(self, slot=None if self.slot is None else db_now + self.slot)


def reference_claimable(row: Row, request: Request, db_now: float) -> bool:
    """Whether a claim of ``row`` for ``request`` must win at ``db_now``."""
    # Never two at once: the lease of the last holder has run out (or none).
    if row.lock_until is not None and row.lock_until > db_now:
        return False
    # `disable` pauses the job on every host, whatever the path.
    if row.disabled_until is not None and row.disabled_until > db_now:
        return False
    if request.slot is not None:
        # One start per slot: newer than the last slot claimed ...
        if row.last_slot is not None and not row.last_slot < request.slot:
            return False
        # ... and not in the database's future (a fast clock does not run early).
        if request.slot > db_now + TOLERANCE:
            return False
    # A rate: the last start is at least that old, by the database clock.
    if request.rate is not None and row.last_start is not None \
            and row.last_start > db_now - request.rate:
        return False
    # Run now: only while an operator's request is filed.
    if request.requested and row.run_requested is None:
        return False
    # A retired item (gone from the item list) is never claimed.
    return not (request.item and row.retired)


# -- strategies -----------------------------------------------------------------------

def offsets(*, past_only: bool = False) -> st.SearchStrategy[float | None]:
    values = [o for o in OFFSETS if o < 0] if past_only else OFFSETS
    return st.none() | st.sampled_from(values)


rows = st.builds(
    Row,
    token=st.integers(0, 10**6),
    lock_until=offsets(),
    disabled_until=offsets(),
    last_slot=offsets(),
    last_start=offsets(),
    run_requested=offsets(past_only=True),
    retired=st.booleans(),
)
slots = st.sampled_from(OFFSETS)
rates = st.none() | st.sampled_from(RATES)

#: Each path's requests: only the parameters it has.
REQUESTS: dict[str, st.SearchStrategy[Request]] = {
    "claim": st.builds(Request, slot=st.none() | slots, rate=rates),
    "claim_and_record": st.builds(Request, slot=st.none() | slots, rate=rates),
    "claim_batch": st.builds(Request, slot=slots, rate=rates),
    "claim_requested": st.just(Request(requested=True)),
    "exec": st.just(Request()),
    "api": st.just(Request()),
    "items": st.builds(Request, slot=st.none() | slots, rate=rates, item=st.just(True)),
}


# -- the rows, written and read back ----------------------------------------------------

def write_lock(store: Store, name: str, row: Row) -> None:
    locks = store.t.locks
    held = row.lock_until is not None
    stmt = locks.update().where(locks.c.name == name).values(
        holder=OTHER_HOLDER if held else None, lock_until=row.lock_until,
        locked_at=None if row.lock_until is None else row.lock_until - LEASE,
        token=row.token, last_slot=row.last_slot, last_start=row.last_start,
        next_due=None, disabled_until=row.disabled_until, disabled_reason=None,
        run_requested=row.run_requested)
    with store.engine.connect() as conn:
        assert conn.execute(stmt).rowcount == 1


def write_item(store: Store, job: str, item: str, row: Row) -> None:
    """The item's row, and its job's lock row (only ``disabled_until`` counts)."""
    write_lock(store, job, Row(token=lock_token(store, job), disabled_until=row.disabled_until))
    items = store.t.items
    stmt = items.update().where(items.c.job == job, items.c.item_key == item_key(item)).values(
        holder=OTHER_HOLDER if row.lock_until is not None else None,
        lock_until=row.lock_until,
        locked_at=None if row.lock_until is None else row.lock_until - LEASE,
        token=row.token, last_slot=row.last_slot, last_start=row.last_start,
        retired=row.retired, last_result=None)
    with store.engine.connect() as conn:
        assert conn.execute(stmt).rowcount == 1


def lock_token(store: Store, name: str) -> int:
    lock = store.lock_state(name)
    assert lock is not None
    return lock.token


def item_token(store: Store, job: str, item: str) -> int:
    items = store.t.items
    stmt = items.select().where(items.c.job == job, items.c.item_key == item_key(item))
    with store.engine.connect() as conn:
        return int(conn.execute(stmt).one().token)


# -- the paths -----------------------------------------------------------------------------

JOB = "job"
COMPANION = "companion"  # a free row claimed in the same batch
FAN = "fan"
ITEM = "item-1"


class Paths:
    """Each path: write the row, claim through the public method, and return
    {row name: won} (and check the fencing token moved exactly on a win)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.holder = 0
        store.ensure_jobs([JOB, COMPANION, FAN])
        store.items.sync(FAN, [ITEM])
        self._exec: ExecTarget | None = None

    def close(self) -> None:
        if self._exec is not None:
            self._exec.close()

    def next_holder(self) -> str:
        self.holder += 1
        return f"test-host:{self.holder}:000000"

    def token_now(self, path: str) -> int:
        """The current token of the row ``path`` claims."""
        if path == "items":
            return item_token(self.store, FAN, ITEM)
        return lock_token(self.store, JOB)

    def run(self, path: str, row: Row, request: Request) -> dict[str, bool]:
        claim: Callable[[Row, Request], dict[str, bool]] = getattr(self, path)
        return claim(row, request)

    def _single(self, row: Row, won: Callable[[], bool]) -> dict[str, bool]:
        write_lock(self.store, JOB, row)
        got = won()
        assert lock_token(self.store, JOB) == row.token + got, "the token moved iff it won"
        return {JOB: got}

    def claim(self, row: Row, request: Request) -> dict[str, bool]:
        def go() -> bool:
            token = self.store.claim(JOB, self.next_holder(), LEASE, slot=request.slot,
                                     rate=request.rate)
            assert token in (None, row.token + 1)
            return token is not None

        return self._single(row, go)

    def claim_and_record(self, row: Row, request: Request) -> dict[str, bool]:
        def go() -> bool:
            won = self.store.claim_and_record(JOB, self.next_holder(), LEASE,
                                              slot=request.slot, rate=request.rate)
            assert won is None or (won.token == row.token + 1 and won.run_id is not None)
            return won is not None

        return self._single(row, go)

    def claim_requested(self, row: Row, request: Request) -> dict[str, bool]:
        def go() -> bool:
            token = self.store.claim_requested(JOB, self.next_holder(), LEASE)
            assert token in (None, row.token + 1)
            return token is not None

        return self._single(row, go)

    def exec(self, row: Row, request: Request) -> dict[str, bool]:
        if self._exec is None:
            self._exec = ExecTarget(self.store.url, self.store.prefix)
        target = self._exec

        def go() -> bool:
            opts = ExecOptions(name=JOB, argv=("true",), lease=LEASE, busy_exit_code=BUSY)
            status = exec_locked(target, opts)
            assert status in (0, BUSY)
            return status == 0

        return self._single(row, go)

    def api(self, row: Row, request: Request) -> dict[str, bool]:
        def go() -> bool:
            with dblockrun.lock(JOB, db=self.store, lease=LEASE, raise_on_busy=False) as lease:
                assert lease is None or lease.token == row.token + 1
                return lease is not None

        return self._single(row, go)

    def claim_batch(self, row: Row, request: Request) -> dict[str, bool]:
        assert request.slot is not None
        write_lock(self.store, JOB, row)
        companion = lock_token(self.store, COMPANION)
        write_lock(self.store, COMPANION, Row(token=companion))
        won = self.store.claim_batch([JOB, COMPANION], self.next_holder(), LEASE,
                                     slot=request.slot, next_due=request.slot + 60, limit=2,
                                     rate=request.rate)
        got = {c.name: c for c in won}
        assert set(got) <= {JOB, COMPANION}
        for name, before in ((JOB, row.token), (COMPANION, companion)):
            expected = before + (name in got)
            assert lock_token(self.store, name) == expected, f"{name}: token vs win"
            assert name not in got or got[name].token == expected
        return {JOB: JOB in got, COMPANION: COMPANION in got}

    def items(self, row: Row, request: Request) -> dict[str, bool]:
        write_item(self.store, FAN, ITEM, row)
        won = self.store.items.claim(FAN, self.next_holder(), LEASE, slot=request.slot,
                                     rate=request.rate, limit=5)
        assert [c.item for c in won] in ([], [ITEM])
        got = bool(won)
        assert item_token(self.store, FAN, ITEM) == row.token + got, "the token moved iff it won"
        assert not won or won[0].token == row.token + 1
        return {ITEM: got}


@pytest.fixture
def paths(store: Store) -> Iterator[Paths]:
    p = Paths(store)
    yield p
    p.close()


@pytest.mark.parametrize("path", list(REQUESTS))
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_each_claim_path_wins_exactly_when_the_reference_says(
    path: str, paths: Paths, store: Store, data: st.DataObject
) -> None:
    row_offsets = data.draw(rows, label="row (offsets from the database's now)")
    request_offsets = data.draw(REQUESTS[path], label="request (slot offset)")
    token = paths.token_now(path) + row_offsets.token
    db_now = store.db_now()
    row, request = replace(row_offsets.at(db_now), token=token), request_offsets.at(db_now)
    got = paths.run(path, row, request)
    expected = {name: reference_claimable(row, request, db_now) for name in got}
    if COMPANION in got:
        expected[COMPANION] = reference_claimable(Row(token=1), request, db_now)
    assert got == expected, (
        f"{path} on {store.dialect.name}: won {got}, the reference says {expected}; "
        f"row {row_offsets}, request {request_offsets} (times relative to the database's now)")


#: A claimable row, and the requests each path makes of it (offsets from now).
BASE = Row(token=1, last_slot=-600.0, last_start=-7200.0, run_requested=-10.0)
BASE_REQUESTS: dict[str, list[Request]] = {
    "claim": [Request(slot=-10.0, rate=60.0), Request(slot=-10.0), Request(rate=60.0)],
    "claim_and_record": [Request(slot=-10.0, rate=60.0), Request(slot=-10.0),
                         Request(rate=60.0)],
    "claim_batch": [Request(slot=-10.0, rate=60.0), Request(slot=-10.0)],
    "claim_requested": [Request(requested=True)],
    "exec": [Request()],
    "api": [Request()],
    "items": [Request(slot=-10.0, rate=60.0, item=True), Request(slot=-10.0, item=True),
              Request(rate=60.0, item=True)],
}
#: One condition at a time, each way: (what, row change, request change).
NEAR_MISSES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("claimable", {}, {}),
    ("lease expired 10 s ago", {"lock_until": -10.0}, {}),
    ("held for 60 s more", {"lock_until": 60.0}, {}),
    ("disabled until 10 s ago", {"disabled_until": -10.0}, {}),
    ("disabled for 60 s more", {"disabled_until": 60.0}, {}),
    ("slot already claimed", {"last_slot": -10.0}, {}),
    ("a later slot already claimed", {"last_slot": 10.0}, {}),
    ("slot 10 s in the future", {}, {"slot": 10.0}),
    ("started 10 s ago", {"last_start": -10.0}, {}),
    ("started 65 s ago", {"last_start": -65.0}, {}),
    ("no run-now request", {"run_requested": None}, {}),
    ("retired", {"retired": True}, {}),
]


@pytest.mark.parametrize("path", list(REQUESTS))
def test_each_claim_path_against_each_condition_alone(path: str, paths: Paths,
                                                      store: Store) -> None:
    """The examples above, made certain: a claimable row, and each condition
    broken (or just met) on its own, for every request the path makes."""
    wrong: list[str] = []
    for base_request in BASE_REQUESTS[path]:
        for what, row_change, request_change in NEAR_MISSES:
            if "slot" in request_change and base_request.slot is None:
                continue  # no slot to move
            row_offsets = replace(BASE, **row_change)
            request_offsets = replace(base_request, **request_change)
            token = paths.token_now(path) + row_offsets.token
            db_now = store.db_now()
            row = replace(row_offsets.at(db_now), token=token)
            request = request_offsets.at(db_now)
            expected = reference_claimable(row, request, db_now)
            got = paths.run(path, row, request)
            if got[ITEM if path == "items" else JOB] != expected:
                wrong.append(f"{what}: expected {'win' if expected else 'loss'}, got "
                             f"{'win' if not expected else 'loss'} (row {row_offsets}, "
                             f"request {request_offsets})")
    assert not wrong, f"{path} on {store.dialect.name}:\n" + "\n".join(wrong)


def test_the_reference_itself() -> None:
    """A few rows read against the contract by hand."""
    now = 1000.0
    free = Row(token=1)
    assert reference_claimable(free, Request(), now)
    assert not reference_claimable(replace(free, lock_until=now + 5), Request(), now)
    assert reference_claimable(replace(free, lock_until=now - 5), Request(), now)
    assert not reference_claimable(replace(free, disabled_until=now + 5), Request(), now)
    assert reference_claimable(replace(free, disabled_until=now - 5), Request(), now)
    slot = Request(slot=now - 10)
    assert reference_claimable(replace(free, last_slot=now - 20), slot, now)
    assert not reference_claimable(replace(free, last_slot=now - 10), slot, now)  # same slot
    assert not reference_claimable(free, Request(slot=now + 5), now)  # in the future
    assert reference_claimable(free, Request(slot=now + TOLERANCE / 2), now)
    rate = Request(rate=60)
    assert reference_claimable(replace(free, last_start=now - 65), rate, now)
    assert not reference_claimable(replace(free, last_start=now - 55), rate, now)
    cron_and_rate = Request(slot=now - 1, rate=60)
    assert not reference_claimable(replace(free, last_start=now - 55), cron_and_rate, now)
    assert not reference_claimable(free, Request(requested=True), now)
    assert reference_claimable(replace(free, run_requested=now - 10), Request(requested=True),
                               now)
    assert not reference_claimable(replace(free, retired=True), Request(item=True), now)
    assert reference_claimable(replace(free, retired=True), Request(), now)
