"""The contract of a daemon's attempts' role (dblockrun/store/runstore.py:
``FiringStore``): the claims a daemon makes (a slot with its record, a
batch of jobs of one slot, an operator's run-now request, a group's seat,
a job's lane), the lock rows it reads when a plan is in doubt, when a
disable began, and the runs that hold or wait for a lease; held the same
on the in-memory store and on every selected database.

The logic tests that drive a daemon's attempts on the memory store
(tests/test_firing_memory.py) rely on this suite for the SQL: what they
assume of the store is asserted here on the real databases too.
"""

from __future__ import annotations

from runstores import RoleUnderTest

from dblockrun.store import models as m
from dblockrun.store.base import Disables
from dblockrun.store.models import CLAIM_TOLERANCE


def base_slot(run_store: RoleUnderTest) -> float:
    """A whole second a little in the past: any slot up to it may be claimed."""
    return float(int(run_store.now())) - 3.0


def test_a_slot_is_claimed_once_with_its_record_and_its_next_due_time(
        run_store: RoleUnderTest) -> None:
    store = run_store.firing
    run_store.ensure("job", "rated")
    slot = base_slot(run_store)
    won = store.claim_and_record("job", "h1", 30, slot=slot, next_due=slot + 60)
    assert won is not None and won.token == 1 and won.run_id is not None
    assert [(r.id, r.slot, r.token, r.result) for r in run_store.records("job")] == [
        (won.run_id, slot, 1, m.RUNNING)]
    row = run_store.row("job")
    assert (row.holder, row.last_slot, row.next_due) == ("h1", slot, slot + 60)
    assert store.claim_and_record("job", "h2", 30, slot=slot + 1) is None  # held
    assert store.release("job", "h1", won.token)
    assert store.claim_and_record("job", "h2", 30, slot=slot) is None  # slot taken
    assert store.claim_and_record("job", "h2", 30, slot=run_store.now() + 5) is None  # future
    assert store.claim_and_record("missing", "h2", 30, slot=slot) is None
    # A rate-only job: its turn, then none until the rate has passed.
    turn = store.claim_and_record("rated", "h1", 30, rate=3600)
    assert turn is not None and turn.run_id is not None
    nxt = run_store.row("rated").next_due
    assert nxt is not None and abs(nxt - (run_store.now() + 3600)) < 5
    assert [(r.slot, r.result) for r in run_store.records("rated")] == [(None, m.RUNNING)]
    assert store.release("rated", "h1", turn.token)
    assert store.claim_and_record("rated", "h2", 30, rate=3600) is None
    assert len(run_store.records("rated")) == 1


def test_a_batch_claims_up_to_its_limit_by_the_single_claims_predicate(
        run_store: RoleUnderTest) -> None:
    store = run_store.firing
    names = ["a", "b", "c", "d", "off", "ahead", "missing"]
    run_store.ensure(*names[:-1])
    slot = base_slot(run_store)
    run_store.disable("off", 60)
    ahead = store.claim_and_record("ahead", "h0", 30, slot=slot + 1)
    assert ahead is not None and store.release("ahead", "h0", ahead.token)
    first = store.claim_batch(names, "h1", 30, slot=slot, next_due=slot + 60, limit=2)
    assert len(first) == 2 and {c.name for c in first} <= {"a", "b", "c", "d"}
    for claimed in first:
        assert claimed.run_id is not None and claimed.token == 1
        assert [(r.id, r.slot, r.token, r.result) for r in run_store.records(claimed.name)] == [
            (claimed.run_id, slot, 1, m.RUNNING)]
        row = run_store.row(claimed.name)
        assert (row.holder, row.last_slot, row.next_due) == ("h1", slot, slot + 60)
    # The second look (waiting for rows being claimed) takes what is left.
    rest = store.claim_batch(names, "h2", 30, slot=slot, next_due=slot + 60, limit=10,
                             wait=True)
    assert {c.name for c in rest} == {"a", "b", "c", "d"} - {c.name for c in first}
    assert all(run_store.row(c.name).holder == "h2" for c in rest)
    for claimed in (*first, *rest):
        holder = run_store.row(claimed.name).holder
        assert holder is not None and store.release(claimed.name, holder, claimed.token)
    # Released, the slot stays taken; a disabled job and one ahead never ran it.
    assert store.claim_batch(names, "h3", 30, slot=slot, next_due=slot + 60, limit=10) == []
    assert run_store.records("off") == [] and len(run_store.records("ahead")) == 1
    # The rate holds a batch too: every row started within the hour.
    assert store.claim_batch(names, "h3", 30, slot=slot + 2, next_due=slot + 60, limit=10,
                             rate=3600) == []
    run_store.pause(60)
    assert store.claim_batch(names, "h3", 30, slot=slot + 2, next_due=slot + 60, limit=10) == []


def test_a_run_now_request_is_claimed_once_and_not_by_a_drained_host(
        run_store: RoleUnderTest) -> None:
    store = run_store.firing
    run_store.ensure("job")
    assert store.claim_requested("job", "h1:1:a", 30) is None  # nobody asked
    run_store.request("job")
    state = store.lock_state("job")
    assert state is not None and state.run_requested is not None
    run_store.drain("hd", 60)
    assert store.claim_requested("job", "hd:1:a", 30) is None
    token = store.claim_requested("job", "h1:1:a", 30)
    assert token == 1
    state = store.lock_state("job")
    assert state is not None and state.run_requested is None and state.holder == "h1:1:a"
    assert run_store.records("job") == []  # the daemon records its run itself
    assert store.release("job", "h1:1:a", token)
    assert store.claim_requested("job", "h2:1:a", 30) is None  # the request was taken


def test_a_groups_seats_are_taken_one_each_until_full(run_store: RoleUnderTest) -> None:
    store = run_store.firing
    seats = ["group:g:1", "group:g:2"]
    run_store.ensure(*seats)
    a = store.claim_seat(seats, "h1", 30, "a")
    b = store.claim_seat(seats, "h2", 30, "b")
    assert a is not None and b is not None and {a[0], b[0]} == set(seats)
    assert a[1] == 1 and b[1] == 1
    assert store.claim_seat(seats, "h3", 30, "c") is None  # full
    assert store.seat_holders(seats) == [held for _, held in sorted(
        [(a[0], ("a", "h1")), (b[0], ("b", "h2"))])]
    assert not store.release_seat(a, "h2")  # not its holder
    assert store.release_seat(a, "h1")
    assert store.seat_holders(seats) == [("b", "h2")]
    assert store.claim_seat(seats, "h3", 30, "c") == (a[0], 2)
    # Rows never made are never free.
    assert store.claim_seat(["group:none:1"], "h1", 30, "a") is None
    assert store.seat_holders(["group:none:1"]) == []
    # A drained host still seats the slot it claimed before; it claims no job.
    run_store.ensure("group:x:1", "x")
    run_store.drain("hd", 60)
    assert store.claim_seat(["group:x:1"], "hd:1:r", 30, "x") == ("group:x:1", 1)
    assert store.claim_and_record("x", "hd:1:r", 30) is None
    # A paused fleet takes no seat.
    assert store.release_seat(("group:x:1", 1), "hd:1:r")
    run_store.pause(60)
    assert store.claim_seat(["group:x:1"], "h1", 30, "x") is None


def test_a_lane_holds_its_run_with_the_jobs_token_after_the_job_row_is_freed(
        run_store: RoleUnderTest) -> None:
    store = run_store.firing
    lanes = ["lane:par:1", "lane:par:2"]
    run_store.ensure("par", *lanes)
    slot = base_slot(run_store)
    first = store.claim_and_record("par", "h1", 30, slot=slot)
    assert first is not None and first.run_id is not None
    lane1 = store.claim_seat(lanes, "h1", 30, "par", first.token)
    assert lane1 is not None and lane1[1] == first.token
    assert store.release("par", "h1", first.token)  # the next slot may be claimed
    assert [r.id for r in store.control.running("par")] == [first.run_id]
    second = store.claim_and_record("par", "h1", 30, slot=slot + 1)
    assert second is not None and second.run_id is not None and second.token == 2
    lane2 = store.claim_seat(lanes, "h1", 30, "par", second.token)
    assert lane2 is not None and lane2 == (next(n for n in lanes if n != lane1[0]), 2)
    assert store.seat_holders(lanes) == [("par", "h1"), ("par", "h1")]
    assert [r.id for r in store.control.running("par")] == [first.run_id, second.run_id]
    assert [r.id for r in store.control.running()] == [first.run_id, second.run_id]
    # A kill reaches the first run's holder through its lane only.
    run = store.control.running("par")[0]
    assert [r.id for r in store.control.kill([run], "op@test", "why")] == [first.run_id]
    assert store.renew_many("h1", [(lane1[0], first.token), (lane2[0], second.token)], 30) == {
        lane1[0]: "op@test: why", lane2[0]: None}
    # Its lane freed, the first run is held no more: not running, not killed.
    assert store.release_seat(lane1, "h1")
    assert [r.id for r in store.control.running("par")] == [second.run_id]
    assert store.control.kill([run], "op@test", None) == []
    assert store.claim_seat(lanes, "h1", 30, "par", 9) == (lane1[0], 9)


def test_waiting_runs_are_listed_oldest_slot_first_while_their_lease_holds(
        run_store: RoleUnderTest) -> None:
    store = run_store.firing
    run_store.ensure("q1", "q2", "q3")
    slot = base_slot(run_store)
    late = store.claim_and_record("q1", "h1", 30, slot=slot + 1)
    early = store.claim_and_record("q2", "h2", 30, slot=slot)
    other = store.claim_and_record("q3", "h1", 30, slot=slot)
    assert late is not None and early is not None and other is not None
    assert late.run_id is not None and early.run_id is not None and other.run_id is not None
    assert store.control.waiting(["q1", "q2"]) == []
    assert store.run_waits(late.run_id, "a seat of group g")
    assert store.run_waits(early.run_id, "a seat of group g")
    assert store.run_waits(other.run_id, "a seat of group h")
    waiting = store.control.waiting(["q1", "q2"])
    assert [(r.id, r.result) for r in waiting] == [(early.run_id, m.WAITING),
                                                   (late.run_id, m.WAITING)]
    assert store.control.waiting([]) == []
    # Waiting runs are running ones too (their holders renew their leases).
    assert {r.id for r in store.control.running()} == {late.run_id, early.run_id, other.run_id}
    assert store.release("q2", "h2", early.token)  # its holder gave it up
    assert [r.id for r in store.control.waiting(["q1", "q2"])] == [late.run_id]
    assert store.run_admitted(late.run_id)
    assert store.control.waiting(["q1", "q2"]) == []
    assert [(r.id, r.result) for r in store.control.running("q1")] == [
        (late.run_id, m.RUNNING)]


def test_the_lock_rows_read_as_claimed_with_the_stores_time(run_store: RoleUnderTest) -> None:
    store = run_store.firing
    run_store.ensure("a", "b")
    slot = base_slot(run_store)
    won = store.claim_and_record("a", "h1", 30, slot=slot, next_due=slot + 60)
    assert won is not None
    state = store.lock_state("a")
    assert state is not None and state.locked_at is not None and state.lock_until is not None
    assert (state.name, state.holder, state.token, state.last_slot, state.next_due) == (
        "a", "h1", 1, slot, slot + 60)
    # (the same instant; a server's timestamps may round a microsecond apart as floats)
    assert state.last_start is not None and abs(state.last_start - state.locked_at) < 1e-5
    assert abs(state.lock_until - state.locked_at - 30) < 0.01
    assert store.lock_state("missing") is None
    run_store.disable("b", 60)
    states, now = store.lock_states()
    assert {"a", "b"} <= set(states) and states["a"] == state
    assert states["b"].holder is None and states["b"].token == 0
    assert states["b"].disabled_until is not None and states["b"].disabled_until > now
    assert state.locked_at <= now < state.lock_until


def test_a_disable_began_at_its_newest_audited_disable(run_store: RoleUnderTest) -> None:
    store = run_store.firing
    run_store.ensure("job", "broken")
    before = run_store.now()
    assert store.disabled_since("job", before) is None
    run_store.disable("job", 60, audited=True)
    after = run_store.now()
    since = store.disabled_since("job", after)
    assert since is not None and before <= since <= after
    # An every-host job's row reads its job's; a time before it, none.
    assert store.disabled_since("job@host-1", after) == since
    assert store.disabled_since("job", since - 1) is None
    # A disable nobody audited (on-failure) has no known start.
    run_store.disable("broken", 60)
    assert store.disabled_since("broken", run_store.now()) is None


def test_a_group_seat_held_for_a_job_is_never_one_of_its_lanes(
        run_store: RoleUnderTest) -> None:
    """A group's seat is taken for a job (``held_for``) like a lane, and its
    token may equal the job's claim's; still it never holds the job's run:
    once the job's row is freed the run is held by nothing (not running,
    not waiting, not killed through the seat)."""
    store = run_store.firing
    run_store.ensure("solo", "group:g:1")
    slot = base_slot(run_store)
    won = store.claim_and_record("solo", "h1", 30, slot=slot)
    assert won is not None and won.run_id is not None
    seat = store.claim_seat(["group:g:1"], "h1", 30, "solo")
    assert seat == ("group:g:1", won.token)  # the same token as the job's claim
    assert store.seat_holders(["group:g:1"]) == [("solo", "h1")]
    assert store.run_waits(won.run_id, "a seat of group g")
    assert [r.id for r in store.control.waiting(["solo"])] == [won.run_id]
    run = store.control.running("solo")[0]
    assert store.release("solo", "h1", won.token)
    # The seat stays held for the job, with the run's token: not a lane.
    assert store.seat_holders(["group:g:1"]) == [("solo", "h1")]
    assert store.control.running("solo") == []
    assert store.control.running() == []
    assert store.control.waiting(["solo"]) == []
    assert store.control.kill([run], "op@test", "why") == []
    assert store.renew_many("h1", [("group:g:1", won.token)], 30) == {"group:g:1": None}


def test_a_slot_claim_a_little_short_of_the_rate_still_counts(run_store: RoleUnderTest) -> None:
    """A job with a cron and a rate: a start one rate later by its slot
    may be a few milliseconds short of the rate by the store's clock (the
    daemon woke a little earlier past the slot than the time before); the
    slot claim's tolerance absorbs that, not more."""
    store = run_store.firing
    run_store.ensure("paced")
    slot = base_slot(run_store)
    first = store.claim_and_record("paced", "h1", 30, slot=slot - 1, rate=3600)
    assert first is not None and store.release("paced", "h1", first.token)
    state = store.lock_state("paced")
    assert state is not None and state.last_start is not None
    elapsed = run_store.now() - state.last_start  # at most this short by the claim
    assert store.claim_and_record("paced", "h1", 30, slot=slot, rate=elapsed + 5) is None
    second = store.claim_and_record("paced", "h1", 30, slot=slot,
                                    rate=elapsed + 0.8 * CLAIM_TOLERANCE)
    assert second is not None and second.token == first.token + 1
    assert [r.slot for r in run_store.records("paced")] == [slot - 1, slot]
    assert run_store.records("paced")[-1].result == m.RUNNING


def test_a_disable_for_a_while_keeps_its_reason_and_refuses_claims_until_it_ends(
        run_store: RoleUnderTest) -> None:
    """What ``on-failure: {disable-for: ...}`` writes (``Disables``, the
    daemon's store): the job's row disabled until then, with the reason;
    no claim of it wins meanwhile."""
    store = run_store.firing
    assert isinstance(store, Disables)
    run_store.ensure("broken")
    slot = base_slot(run_store)
    before = run_store.now()
    # (what it returns differs: the SQL store's a Disabled, the memory one's
    # the end; the daemon reads neither)
    store.disable("broken", for_seconds=3 * 3600, reason="on-failure: run 7 exited 1 on h1:1:a")
    state = run_store.firing.lock_state("broken")
    assert state is not None and state.disabled_until is not None
    assert before + 3 * 3600 - 0.01 < state.disabled_until < run_store.now() + 3 * 3600 + 0.01
    assert state.disabled_reason == "on-failure: run 7 exited 1 on h1:1:a"
    # Nobody audited it: when it began is not known (a resync records nothing for it).
    assert run_store.firing.disabled_since("broken", run_store.now()) is None
    assert run_store.firing.claim_and_record("broken", "h1", 30, slot=slot) is None
    assert run_store.records("broken") == []


def test_a_retrys_attempts_are_recorded_under_the_claims_token(run_store: RoleUnderTest) -> None:
    """A run's retry (``retries:``) records each attempt under the claim's
    token while the lease holds; the last one's end releases the job."""
    store = run_store.firing
    run_store.ensure("flaky")
    won = store.claim_and_record("flaky", "h1", 30, rate=3600)
    assert won is not None and won.run_id is not None
    assert store.finish_run(won.run_id, "flaky", won.token, m.FAILED, 1, "attempt 1\n")
    second = store.start_run("flaky", "h1", token=won.token, attempt=2)
    assert store.finish_run(second, "flaky", won.token, m.FAILED, 1, "attempt 2\n")
    third = store.start_run("flaky", "h1", token=won.token, attempt=3)
    assert [r.id for r in store.control.running("flaky")] == [third]
    assert store.finish_and_release(third, "flaky", "h1", won.token, m.OK, 0,
                                    "attempt 3\n") == (True, True)
    records = run_store.records("flaky")
    assert [(r.id, r.attempt, r.token, r.result) for r in records] == [
        (won.run_id, 1, won.token, m.FAILED), (second, 2, won.token, m.FAILED),
        (third, 3, won.token, m.OK)]
    assert store.control.running("flaky") == []
    assert store.claim_and_record("flaky", "h2", 30, rate=3600) is None  # the rate holds
