"""Every slot a daemon passes ends in exactly one record, whatever passed
it: two real daemons, a job every 2 s, the database out of reach for 20 s
(a cut TCP proxy; on SQLite, another process holding the file's write
lock), on every backend. Before the slot planner, 8 of 20 slots of this
case had no record at all."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import cast

import pytest
from harness import Fleet
from helpers import TestDb, coverage, daemon_state, output_of, runs_of, wait_for
from proxy import Proxy

from dblockrun.daemon.firing import Firing
from dblockrun.daemon.fleet import FleetBooks, unrecorded_runs
from dblockrun.events import Events
from dblockrun.jobs import Job, JobsFile
from dblockrun.running.slotbook import SlotBook
from dblockrun.scheduling.planner import Act, Cause, Due, Outcome, Planner, Row, passed, single
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.engine import Claim, in_transaction
from dblockrun.store.memory import MemoryRunStore

JOB = 'jobs:\n  tick:\n    cron: "*/2 * * * * *"\n    command: "true"\n'
STEP = 2.0
OUTAGE = 20.0


@contextmanager
def outage_switch(db: TestDb) -> Iterator[tuple[TestDb, Callable[[], None],
                                                Callable[[], None]]]:
    """The database the daemons use, and how to cut and restore it."""
    if db.backend == "sqlite":
        path = db.url.removeprefix("sqlite:///")
        holder: list[sqlite3.Connection] = []

        def cut() -> None:
            conn = sqlite3.connect(path, isolation_level=None, timeout=30)
            conn.execute("BEGIN EXCLUSIVE")  # every other statement: "database is locked"
            holder.append(conn)

        def restore() -> None:
            while holder:
                conn = holder.pop()
                conn.execute("ROLLBACK")
                conn.close()

        try:
            yield db, cut, restore
        finally:
            restore()
        return
    proxy = Proxy(5432 if db.backend == "postgresql" else 3306)
    try:
        yield TestDb(db.backend, proxy.url_for(db.url), db.prefix), proxy.cut, proxy.restore
    finally:
        proxy.restore()
        proxy.close()


@pytest.mark.slow
def test_every_slot_of_a_database_outage_has_exactly_one_record(
        db: TestDb, store: Store, fleet: Fleet) -> None:
    store.ensure_schema()
    with outage_switch(db) as (reach, cut, restore):
        daemons = fleet.start_n(2, JOB, url=reach.url)
        try:
            # Both daemons past their start (its resync of the job done: a slot
            # decided after both registered), so the outage's slots are the
            # outage's, not a start-up's: a daemon still starting under load
            # when the database went away recorded them "no daemon was running
            # the job", which was its own view.
            wait_for(lambda: len(store.hosts(seen_within=30)) == 2, 60,
                     what="both daemons registered")
            both = time.time()
            daemons[0].wait(lambda: any(r.result == m.OK and (r.slot or 0) > both + STEP
                                        for r in runs_of(store, "tick")), 30,
                            what="a run after both started")
            cut()
            cut_at = time.time()
            wait_for(lambda: time.time() >= cut_at + OUTAGE, OUTAGE + 5, interval=0.2,
                     what="the outage's end")
            restore()
            back = time.time()
            daemons[0].wait(lambda: any(r.result == m.OK and (r.slot or 0) > back + 2 * STEP
                                        for r in runs_of(store, "tick")), 40,
                            what="runs again after the outage")
        finally:
            restore()
            for d in daemons:
                assert d.stop() == 0, d.text()
    records = runs_of(store, "tick")
    count = coverage(records, store, STEP)
    first, last = min(count), max(count)
    expected = [first + k * STEP for k in range(int((last - first) / STEP) + 1)]
    missing = [s for s in expected if count[s] == 0]
    twice = {s: n for s, n in count.items() if n > 1}
    assert not missing and not twice, (
        f"slots with no record: {missing}; with more than one: {twice}\n"
        + "\n".join(f"{r.slot} {r.result} {r.host}" for r in records))
    # The outage's slots were recorded, not run late.
    during = [s for s in expected if cut_at + 1 < s < cut_at + OUTAGE - 1]
    assert during and all(count[s] == 1 for s in during)
    passed_over = [r for r in records if r.result == m.MISSED]
    assert passed_over, "the outage's slots are recorded missed"
    reasons = {output_of(store, r).split(";")[0] for r in passed_over}
    assert any("the database could not be reached" in text for text in reasons), reasons


# -- a claim that moves a job on over slots a held lock kept ---------------------

EVERY_SECOND = Job(name="held", cron="* * * * * *", command="true")


def books_of(store: Store | MemoryRunStore, host: str, job: Job) -> FleetBooks:
    # (the memory store plays the roles the held gaps' part of the
    # bookkeeping uses: held_slots of a job with no lock-at-least nor
    # retries reads nothing else)
    state = daemon_state(cast(Store, store), host, JobsFile("jobs.yaml", None, (job,)))
    if isinstance(store, MemoryRunStore):
        state.clock.add(store.clock_sample())  # the clock read from it
    return FleetBooks(state)


def test_slots_a_dead_holders_lock_kept_are_recorded_once_after_the_next_claim(
        memory_store: MemoryRunStore) -> None:
    """A holder claims slot P and dies; its lease keeps the job from every
    host for a while; another host claims a later slot before any host's
    bookkeeping recorded the slots between (the race the fault soak found
    behind frozen and killed holders). Those slots, and only those, get one
    `skipped` record each, from one of the hosts that look.

    The bookkeeping's logic on the memory store and its clock; the gap's
    SQL (the claim that leaves it, the slot book's record that marks it
    seen, the records it is looked up in) is tests/test_heldgaps_contract.py's,
    on every database."""
    store, clock = memory_store, memory_store.clock
    store.ensure_jobs(["held"])
    prev = float(int(clock.now())) - 4.0  # a slot 4 s back: 4 slots after it are kept
    assert store.claim("held", "dead-host", 0.6, Claim(slot=prev)) is not None
    row = store.lock_row("held")
    held_until = row.lock_until if row is not None else None
    assert held_until is not None
    clock.advance(1.0)  # the dead holder's lease ran out
    nxt = store.claim("held", "h2", 30, Claim(slot=float(int(clock.now()))))
    assert nxt is not None
    # Another claim before any host looked: the gap is kept, not overwritten.
    assert store.release("held", "h2", nxt.token, 0.0)
    clock.advance(1.0)
    again = store.claim("held", "h3", 30, Claim(slot=float(int(clock.now()))))
    assert again is not None
    hosts = [books_of(store, host, EVERY_SECOND) for host in ("h2", "h3")]
    for books in hosts * 2:  # each host looks twice: each slot is recorded once
        books.held_slots()
    kept = [prev + k for k in range(1, 10) if prev + k < held_until]
    assert len(kept) == 4
    records = store.runs_of("held")
    assert sorted(r.slot or 0.0 for r in records if r.result == m.SKIPPED) == kept
    assert all("the lock was held until" in (r.output or "") for r in records
               if r.result == m.SKIPPED)
    assert store.held_gaps() == []  # looked at: no host reads it again
    assert (nxt.token, again.token) == (2, 3)


def test_the_unrecorded_slots_of_a_gap_come_in_runs() -> None:
    job = Job(name="j", cron="* * * * * *", command="true")
    assert unrecorded_runs(job, 100.0, 108.0, {102.0, 103.0, 106.0}) == [
        (100.0, 101.0), (103.0, 105.0), (106.0, 108.0)]
    assert unrecorded_runs(job, 100.0, 102.5, {101.0, 102.0}) == []
    # A summary record's range counts as recorded.
    assert unrecorded_runs(job, 100.0, 108.0, {106.0}, [(101.0, 104.0)]) == [
        (104.0, 105.0), (106.0, 108.0)]


def test_status_shows_the_next_slot_once_a_slot_is_recorded_passed(store: Store) -> None:
    """Seen trying it as an operator: a slot skipped while the job's run was
    still going left `status` at "due 4.7s ago" until the next claim: the
    slot book moved the job's last slot on, not the next slot it shows."""
    store.ensure_jobs(["held"])
    now = float(int(store.db_now()))
    store.set_next_due({"held": now})  # as the last claim published it
    plan = single(now, Cause.BUSY, "previous run still going")
    assert SlotBook(store, "h1", Events()).record(EVERY_SECOND, plan, now + 0.2)
    locks, _db_now = store.lock_states()
    assert locks["held"].last_slot == now
    assert locks["held"].next_due == now + 1.0


def test_a_recording_cut_short_leaves_its_slots_to_be_recorded_again(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault soak (MariaDB): the connection died between the advance of
    a job's last slot and the insert of the slots' records, two statements
    that each committed alone. The advance stayed, every host then read the
    slots as recorded by another, and one slot never got a record. The two
    are one transaction now: a recording cut short leaves the slots to be
    recorded again."""
    store.ensure_jobs(["held"])
    prev = float(int(store.db_now())) - 4.0
    won = store.claim("held", "h1", 30, slot=prev)
    assert won is not None and store.release("held", "h1", won, 0.0)
    now = store.db_now()
    plan = passed(EVERY_SECOND, prev, now, Cause.OUTAGE)
    assert plan is not None and plan.records
    book = SlotBook(store, "h1", Events())
    executor = store.lock_engine().x
    send = executor.send

    def cut_at_the_insert(cur: object, sql: str, params: dict[str, object] | None = None) -> object:
        if sql.lstrip().upper().startswith("INSERT"):
            raise RuntimeError("connection lost")
        return send(cur, sql, params)

    monkeypatch.setattr(executor, "send", cut_at_the_insert)
    with pytest.raises(RuntimeError):
        book.record(EVERY_SECOND, plan, now)
    monkeypatch.undo()
    assert store.lock_state("held").last_slot == prev  # type: ignore[union-attr]
    assert book.record(EVERY_SECOND, plan, now), "the slots were read as recorded elsewhere"
    recorded = sorted(r.slot or 0.0 for r in runs_of(store, "held") if r.result == m.MISSED)
    assert recorded == list(plan.records)


# -- a late resync that moves a job on over a starved holder's busy slot ---------


def resyncs_of(store: MemoryRunStore, planner: Planner, host: str, job: Job, due: Due,
               now: float) -> None:
    """What the daemon does with a resync due at ``now`` (firing.Firing.resync):
    read the row, record the plan; and again while the planner asks for one."""
    book = SlotBook(store, host, Events())
    while due.resync is not None:
        lock = store.lock_row(job.name)
        assert lock is not None
        row = Row(lock.last_slot, lock.last_start, lock.lock_until)
        plan = planner.resynced(job, row, now, due.resync, due.slot, 0.0)
        if plan is not None:
            assert book.record(job, plan, now), "another host recorded one of its slots"
        nxt = planner.agenda.pop_due(now)
        if nxt is None or nxt.resync is None:
            return
        due = nxt


def test_a_late_resync_does_not_jump_over_a_starved_holders_busy_slot(
        memory_store: MemoryRunStore) -> None:
    """The fault soak (one `coverage` slot, at load 70): host A runs slot P
    and holds the job's lock; it is starved past P+1, the slot it records
    `skipped` (busy) when it comes. Host B lost its claim of P+1 to A's lock,
    planned P+2, and woke late for it. Its resync planned the passed slots
    from P+2 (the slot it was about to try), and its record moved the job's
    last slot past P+1; A's record of P+1, conditional on the last slot being
    before it, was then refused, and A's own late resync planned from its
    last slot: P+1 had no record. The late resync now records the slots the
    held lock kept before the one it was about to try, first.

    The planners' logic on the memory store: the claim it loses and the slot
    book's conditional advance are the role's contract on every database
    (tests/test_runstore_contract.py)."""
    store, clock = memory_store, memory_store.clock
    job = EVERY_SECOND
    store.ensure_jobs([job.name])
    p = float(int(clock.now())) - 4.0
    assert store.claim(job.name, "a", 30, Claim(slot=p)) is not None  # A's run of P, still going
    a, b = Planner(1.0, 0.1), Planner(1.0, 0.1)
    for planner in (a, b):
        planner.regular(job, p, 0.0)  # both: next, P+1
    due = b.agenda.pop_due(p + 1.0)
    assert due is not None
    decision = b.decide(job, due, p + 1.0, busy=False, full=False)
    assert (decision.act, decision.slot) == (Act.CLAIM, p + 1)
    assert store.claim(job.name, "b", 30, Claim(slot=p + 1)) is None  # A holds the lock
    assert not b.after(job, p + 1, Outcome.LOST, p + 1.01, 0.0)
    now = clock.now()  # B wakes late for P+2, after P+3; A, starved, too
    for planner, host, busy in ((b, "b", False), (a, "a", True)):
        due = planner.agenda.pop_due(now)
        assert due is not None
        decision = planner.decide(job, due, now, busy=busy, full=False)
        assert decision.act is Act.RESYNC and decision.cause is Cause.LATE
        resyncs_of(store, planner, host, job,
                   Due(now, 0, job.name, decision.slot, decision.cause), now)
    records = [r for r in store.runs_of(job.name) if r.token is None]
    slots = [r.slot for r in records]
    for slot in (p + 1, p + 2, p + 3):
        assert slots.count(slot) == 1, f"slot {slot - p:+g}: {slots.count(slot)} records"
    (kept,) = [r for r in records if r.slot == p + 1]
    assert kept.result == m.SKIPPED and "lock was held" in (kept.output or "")


def test_a_lost_holders_unrecorded_busy_slots_are_recorded_by_the_bookkeeping(
        store: Store) -> None:
    """The fault soak (MariaDB, at load 150): a holder claims slot P and
    renews its lease past P+1 and P+2 but, starved, records neither busy;
    then it is cut off, and another host's sweep records its run lost. The
    bookkeeping recorded the slots from the run's last renewal on (taking
    those before it as recorded by the live holder), and its conditional
    write moved the job on over P+1 and P+2: no record. It now records every
    slot the lock kept after the job's last slot."""
    job = EVERY_SECOND
    store.ensure_jobs([job.name])
    p = float(int(store.db_now())) - 3.0
    won = store.claim_and_record(job.name, "starved", 30, slot=p)
    assert won is not None and won.run_id is not None
    assert store.renew(job.name, "starved", won.token, 0.5)  # its last renewal, after P+2
    until = store.lock_state(job.name).lock_until  # type: ignore[union-attr]
    assert until is not None
    wait_for(lambda: store.db_now() > until, 10, what="the lease to run out")
    books_of(store, "h2", job).round()
    records = [r for r in runs_of(store, job.name) if r.id != won.run_id]
    kept = [p + k for k in range(1, 10) if p + k <= until]
    assert sorted(r.slot or 0.0 for r in records) == kept
    assert all(r.result == m.SKIPPED for r in records)
    assert store.run(won.run_id).result == m.LOST  # type: ignore[union-attr]


@pytest.mark.parametrize("claimed_first", [False, True], ids=["run-out", "claimed-first"])
def test_slots_a_lost_runs_lock_at_least_kept_after_its_lease_are_recorded(
        store: Store, claimed_first: bool) -> None:
    """The fault soak (PostgreSQL, seed 24153): a holder with a 3 s lease
    and lock-at-least 4 s was cut off; once its lease ran out another
    host's sweep recorded its run lost, and the next slot, inside the
    lock-at-least, was refused by every host's claim and recorded by none:
    the lock's end the bookkeeping went by was the lease's. The lost run's
    lock is now held until its lock-at-least is over, as its end would
    have held it, so the slots it keeps get one ``skipped`` record each:
    from the bookkeeping once it has run out, or through the gap of the
    claim that moved the job on first."""
    job = Job(name="spaced", cron="* * * * * *", command="true", lock_at_least=3.0)
    store.ensure_jobs([job.name])
    p = float(int(store.db_now()))
    won = store.claim_and_record(job.name, "dead", 0.5, slot=p, rate=job.claim_spacing)
    assert won is not None and won.run_id is not None
    claimed = store.lock_state(job.name)
    assert claimed is not None and claimed.locked_at is not None
    assert claimed.lock_until is not None
    start, lease_end = claimed.locked_at, claimed.lock_until
    wait_for(lambda: store.db_now() > lease_end, 10, what="the lease to run out")
    books = books_of(store, "h2", job)
    books.round()  # its sweep records the run lost
    assert store.run(won.run_id).result == m.LOST  # type: ignore[union-attr]
    held = store.lock_state(job.name).lock_until  # type: ignore[union-attr]
    assert held == pytest.approx(start + job.lock_at_least, abs=0.01)
    end = held
    if claimed_first:  # another host moves the job on before any bookkeeping looks
        wait_for(lambda: store.db_now() > held, 10, what="the lock-at-least to end")
        end = float(int(store.db_now()))
        assert store.claim_and_record(job.name, "h3", 30, slot=end,
                                      rate=job.claim_spacing) is not None
    else:
        wait_for(lambda: store.db_now() > held + 1.0, 10, what="the lock to have run out")
    books.held_slots()
    books_of(store, "h3", job).held_slots()  # a second host looks too: recorded once
    kept = [p + k for k in range(1, 10) if p + k < min(held, end)]
    assert len(kept) >= 2  # the slots after the lease's end the lock-at-least kept
    skipped = sorted(r.slot or 0.0 for r in runs_of(store, job.name) if r.result == m.SKIPPED)
    assert skipped == kept


# -- a batch claim another host was making when it died -----------------------


def test_a_batch_claim_that_another_host_died_making_is_made_here(
        db: TestDb, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault soak (MariaDB): a host killed inside its batch claim's
    transaction, the job's row picked (locked), the claim not committed.
    The other hosts' batch claims skipped the row (SKIP LOCKED: another
    host is claiming it) and moved on; the dead host's claim rolled back;
    the slot had no claim and no record. A batch's second look, for what no
    other host took, now waits for such a claim to end."""
    if db.backend == "sqlite":
        pytest.skip("SQLite has no row locks: its claims wait for the one writer")
    jobs = (Job(name="a", cron="* * * * * *", command="true"),
            Job(name="b", cron="* * * * * *", command="true"))
    store.ensure_jobs([j.name for j in jobs])
    dying = Store(db.url, db.prefix)
    engine = dying.lock_engine()
    locked, killed = threading.Event(), threading.Event()

    def claim_cut_short(cur: object) -> None:
        def steps() -> None:
            engine.x.send(cur, f"SELECT name FROM {engine.q.locks} WHERE name = "
                               f"{engine.q.p('name')} FOR UPDATE", {"name": "a"})
            locked.set()
            killed.wait(10)
            raise ConnectionAbortedError("killed before its commit")

        in_transaction(engine.dialect, lambda sql: engine.x.send(cur, sql), steps)

    def other_host() -> None:
        with contextlib.suppress(ConnectionAbortedError):
            engine.x.run(claim_cut_short)

    thread = threading.Thread(target=other_host)
    thread.start()
    try:
        assert locked.wait(10)
        slot = float(int(store.db_now())) + 1.0
        wait_for(lambda: store.db_now() >= slot + 0.01, 3, what="the slot")
        planner = Planner(1.0, 0.1)
        for job in jobs:
            planner.agenda.push(slot, job.name, slot)
        state = daemon_state(store, "h2", JobsFile("jobs.yaml", None, jobs))
        firing = Firing(state, planner, None,  # type: ignore[arg-type]
                        books_of(store, "h2", jobs[0]))
        started: list[str] = []

        def start(job: Job, token: int, slot: float | None, sent: float,
                  run_id: int | None = None) -> Outcome:
            started.append(job.name)
            return Outcome.STARTED

        monkeypatch.setattr(firing, "_start", start)
        threading.Timer(2.0, killed.set).start()  # its host dies; the claim rolls back
        firing.fire_due()
    finally:
        killed.set()
        thread.join()
        dying.close()
    assert sorted(started) == ["a", "b"]
    claimed = [r for r in runs_of(store, "a") if r.slot == slot]
    assert [(r.host, r.token) for r in claimed] == [("h2", 1)]
