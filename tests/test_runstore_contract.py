"""The contract of the hot path's role (dblockrun/store/runstore.py): what
a user of dblockrun notices of claims, leases, results, releases and the
slot book, held the same on the in-memory store (its clock moved by the
test) and on every selected database (its own clock, waited for).

The logic tests that run on the memory store alone (the run lifecycle, the
slot book's planning) rely on this suite for the SQL: whatever they assume
of the store is asserted here on the real databases too.
"""

from __future__ import annotations

import threading

from runstores import RoleUnderTest

from dblockrun.events import Events
from dblockrun.jobs import Job
from dblockrun.running.slotbook import SlotBook
from dblockrun.scheduling.planner import Cause, single
from dblockrun.store import models as m
from dblockrun.store.engine import Claim
from dblockrun.store.models import Claimed

EVERY_SECOND = Job(name="tick", cron="* * * * * *", command="true")


def test_of_two_holders_racing_one_slot_one_wins(run_store: RoleUnderTest) -> None:
    run_store.ensure("job")
    slot = float(int(run_store.now())) - 1.0
    won: list[Claimed | None] = []
    start = threading.Barrier(2)

    def race(holder: str) -> None:
        start.wait()
        won.append(run_store.claim("job", holder, 30, Claim(slot=slot, record=True)))

    threads = [threading.Thread(target=race, args=(h,)) for h in ("h1", "h2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [w for w in won if w is not None]
    assert len(winners) == 1 and winners[0].token == 1 and winners[0].run_id is not None
    row = run_store.row("job")
    assert row.token == 1 and row.last_slot == slot
    assert [(r.slot, r.token, r.result) for r in run_store.records("job")] == [
        (slot, 1, m.RUNNING)]
    # Released, the slot is still taken: only a newer one is claimed.
    assert row.holder is not None
    assert run_store.store.release("job", row.holder, 1)
    assert run_store.claim("job", "h3", 30, Claim(slot=slot)) is None
    nxt = run_store.claim("job", "h3", 30, Claim(slot=run_store.now()))
    assert nxt is not None and nxt.token == 2


def test_tokens_grow_and_a_stale_token_writes_nothing(run_store: RoleUnderTest) -> None:
    run_store.ensure("job")
    tokens = []
    for holder in ("h1", "h2", "h3"):
        won = run_store.claim("job", holder, 30, Claim(record=True))
        assert won is not None and won.run_id is not None
        tokens.append(won.token)
        assert run_store.store.finish_and_release(won.run_id, "job", holder, won.token, m.OK,
                                                  0, "done\n") == (True, True)
    assert tokens == [1, 2, 3]
    store = run_store.store
    # The holder of token 1 is long gone: its late writes do not land.
    assert not store.release("job", "h1", 1)
    run_id = store.start_run("job", "h1", token=1)
    assert not store.finish_run(run_id, "job", 1, m.FAILED, 1, "late\n")
    assert store.finish_run(run_id, "job", None, m.FAILED, 1, "unfenced\n")
    ids = [r.id for r in run_store.records("job")]
    assert ids == sorted(ids) and len(set(ids)) == 4


def test_a_lost_lease_cannot_be_renewed_nor_its_result_land(run_store: RoleUnderTest) -> None:
    store = run_store.store
    run_store.ensure("job")
    first = run_store.claim("job", "h1", 1, Claim(record=True))
    assert first is not None and first.run_id is not None
    assert run_store.claim("job", "h2", 30) is None  # held
    until = run_store.row("job").lock_until
    assert until is not None
    run_store.pass_until(until)
    # Ran out but taken by nobody: its holder may still renew it.
    assert store.renew_many("h1", [("job", first.token)], 1) == {"job": None}
    run_store.pass_until(run_store.row("job").lock_until or 0.0)
    taken = run_store.claim("job", "h2", 30)
    assert taken is not None and taken.token == first.token + 1
    assert store.renew_many("h1", [("job", first.token)], 30) == {}
    assert store.finish_and_release(first.run_id, "job", "h1", first.token, m.OK, 0,
                                    "late\n") == (False, False)
    row = run_store.row("job")
    assert (row.holder, row.token) == ("h2", taken.token)
    assert store.renew_many("h2", [("job", taken.token)], 30) == {"job": None}


def test_a_release_keeps_the_lock_until_lock_at_least(run_store: RoleUnderTest) -> None:
    store = run_store.store
    run_store.ensure("job", "quick")
    won = run_store.claim("job", "h1", 30, Claim(record=True))
    assert won is not None and won.run_id is not None
    started = run_store.now()
    assert store.finish_and_release(won.run_id, "job", "h1", won.token, m.OK, 0, "", 2.0) == (
        True, True)
    assert run_store.claim("job", "h2", 30) is None
    until = run_store.row("job").lock_until
    assert until is not None and started + 1.5 < until
    run_store.pass_until(until)
    assert run_store.claim("job", "h2", 30) is not None
    # Without lock-at-least the release frees it at once.
    quick = run_store.claim("quick", "h1", 30)
    assert quick is not None and store.release("quick", "h1", quick.token, 0.0)
    assert run_store.claim("quick", "h2", 30) is not None


def test_the_slot_book_records_a_passed_slot_once_for_two_writers(
        run_store: RoleUnderTest) -> None:
    run_store.ensure(EVERY_SECOND.name)
    prev = float(int(run_store.now())) - 3.0
    won = run_store.claim(EVERY_SECOND.name, "h1", 30, Claim(slot=prev))
    assert won is not None and run_store.store.release(EVERY_SECOND.name, "h1", won.token)
    plan = single(prev + 1.0, Cause.BUSY, "previous run still going")
    books = [SlotBook(run_store.store, host, Events()) for host in ("h1", "h2")]
    done: list[bool] = []
    start = threading.Barrier(2)

    def record(book: SlotBook) -> None:
        start.wait()
        done.append(book.record(EVERY_SECOND, plan, prev + 1.2))

    threads = [threading.Thread(target=record, args=(b,)) for b in books]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(done) == [False, True]
    passed = [r for r in run_store.records(EVERY_SECOND.name) if r.token is None]
    assert [(r.slot, r.result) for r in passed] == [(prev + 1.0, m.SKIPPED)]
    row = run_store.row(EVERY_SECOND.name)
    assert row.last_slot == prev + 1.0 and row.next_due == prev + 2.0
    # The slot is handled: no claim of it wins; the next one does.
    assert run_store.claim(EVERY_SECOND.name, "h2", 30, Claim(slot=prev + 1.0)) is None
    assert run_store.claim(EVERY_SECOND.name, "h2", 30, Claim(slot=prev + 2.0)) is not None


def test_a_claim_waits_for_its_slot_its_rate_and_a_disable(run_store: RoleUnderTest) -> None:
    run_store.ensure("cron", "rated", "off")
    now = run_store.now()
    assert run_store.claim("cron", "h1", 30, Claim(slot=now + 1.0)) is None  # not yet
    run_store.pass_until(now + 1.0)
    assert run_store.claim("cron", "h1", 30, Claim(slot=now + 1.0)) is not None
    rated = run_store.claim("rated", "h1", 30, Claim(rate=1.0))
    assert rated is not None and run_store.store.release("rated", "h1", rated.token)
    began = run_store.now()
    assert run_store.claim("rated", "h2", 30, Claim(rate=1.0)) is None  # started too lately
    run_store.pass_until(began + 1.0)
    assert run_store.claim("rated", "h2", 30, Claim(rate=1.0)) is not None
    run_store.disable("off", 0.5)
    assert run_store.claim("off", "h1", 30) is None
    run_store.pass_until(run_store.now() + 0.5)
    assert run_store.claim("off", "h1", 30) is not None


def test_a_waiting_slot_is_recorded_waiting_then_running(run_store: RoleUnderTest) -> None:
    store = run_store.store
    run_store.ensure("job")
    won = run_store.claim("job", "h1", 30, Claim(record=True))
    assert won is not None and won.run_id is not None
    assert store.run_waits(won.run_id, "a seat of group db")
    assert [(r.result, r.output) for r in run_store.records("job")] == [
        (m.WAITING, "a seat of group db")]
    assert store.run_admitted(won.run_id)
    assert not store.run_admitted(won.run_id)  # running already
    store.write_outputs([(won.run_id, "half way\n")])
    assert [(r.result, r.output) for r in run_store.records("job")] == [(m.RUNNING, "half way\n")]
    assert store.finish_and_release(won.run_id, "job", "h1", won.token, m.OK, 0, "all\n") == (
        True, True)
    store.write_outputs([(won.run_id, "too late\n")])  # a result keeps its output
    assert not store.run_waits(won.run_id, "nothing")
    assert [(r.result, r.output) for r in run_store.records("job")] == [(m.OK, "all\n")]


def test_pruning_keeps_the_newest_records(run_store: RoleUnderTest) -> None:
    store = run_store.store
    ids = [store.start_run("job", "h1", token=None, result=m.OK) for _ in range(5)]
    assert store.prune_runs("job", 2) == 3
    assert [r.id for r in run_store.records("job")] == ids[-2:]


def test_no_claim_wins_while_the_fleet_is_paused_or_its_host_drained(
        run_store: RoleUnderTest) -> None:
    run_store.ensure("job")
    run_store.pause(1.0)
    assert run_store.claim("job", "web-1:1:ab", 30) is None
    run_store.pass_until(run_store.now() + 1.0)
    run_store.drain("web-1", 1.0)
    assert run_store.claim("job", "web-1:1:ab", 30) is None
    assert run_store.claim("job", "web-10:1:ab", 30) is not None  # another host


def test_a_run_now_request_is_claimed_once(run_store: RoleUnderTest) -> None:
    run_store.ensure("job")
    asked = Claim(requested=True)
    assert run_store.claim("job", "h1", 30, asked) is None
    run_store.request("job")
    won = run_store.claim("job", "h1", 30, asked)
    assert won is not None and run_store.store.release("job", "h1", won.token)
    assert run_store.claim("job", "h2", 30, asked) is None  # taken with the claim


def test_a_kill_reaches_the_holder_with_its_renewal(run_store: RoleUnderTest) -> None:
    run_store.ensure("job")
    won = run_store.claim("job", "h1", 30, Claim(record=True))
    assert won is not None and won.run_id is not None
    renew = [("job", won.token)]
    assert run_store.store.renew_many("h1", renew, 30) == {"job": None}
    assert run_store.kill("job", won.run_id, won.token, "alice@web-1")
    assert run_store.store.renew_many("h1", renew, 30) == {"job": "alice@web-1"}
    assert run_store.store.release("job", "h1", won.token)
    nxt = run_store.claim("job", "h2", 30)  # the request was the old run's
    assert nxt is not None
    assert run_store.store.renew_many("h2", [("job", nxt.token)], 30) == {"job": None}


def test_a_result_written_late_ends_the_run_when_its_command_ended(
        run_store: RoleUnderTest) -> None:
    """``took``: the command's duration, measured by the run; the record
    ends that long after its start, however late the write got through
    (tests/test_events.py runs the outage that delays it on the memory
    store). Without it the run ends when the write lands."""
    store = run_store.store
    run_store.ensure("job")
    won = run_store.claim("job", "h1", 30, Claim(record=True))
    assert won is not None and won.run_id is not None
    run_store.pass_until(run_store.now() + 1.0)
    assert store.finish_and_release(won.run_id, "job", "h1", won.token, m.OK, 0, "",
                                    took=0.25) == (True, True)
    other = store.start_run("job", "h1", token=None)
    run_store.pass_until(run_store.now() + 0.5)
    assert store.finish_run(other, "job", None, m.OK, 0, "")
    timed, untimed = run_store.records("job")
    assert timed.duration is not None and abs(timed.duration - 0.25) < 0.01
    assert untimed.duration is not None and untimed.duration >= 0.5
