"""The contract of the held gaps (dblockrun/store/roles.py: ``HeldGaps``,
the part of the fleet bookkeeping that finds the slots a held lock kept
from every host): a slot claim that moves a job on over a lock held a
second or more past the slot before leaves a gap, one host's slot book
records its slots and marks it seen, and the records a gap's slots are
looked up in. Held the same on the in-memory store (its clock moved by the
test) and on every selected database (its own clock, waited for).

The bookkeeping's logic tests on the memory store (tests/test_passed_slots.py:
a dead holder's kept slots) rely on this suite for the SQL.
"""

from __future__ import annotations

import pytest
from runstores import RoleUnderTest

from dblockrun.daemon.fleet import unrecorded_runs
from dblockrun.events import Events
from dblockrun.jobs import Job
from dblockrun.running.slotbook import SlotBook
from dblockrun.scheduling.planner import Cause, passed
from dblockrun.store import models as m
from dblockrun.store.engine import Claim

EVERY_SECOND = Job(name="held", cron="* * * * * *", command="true")


def held_gap(run_store: RoleUnderTest) -> tuple[float, float, float]:
    """A holder claims a slot and dies (no renewal, no release); once its
    lease ran out another host claims a later slot. (the slot before, the
    dead holder's lease's end, the later slot)."""
    run_store.ensure("held")
    before = float(int(run_store.now())) - 2.0
    assert run_store.claim("held", "dead", 1.0, Claim(slot=before)) is not None
    held = run_store.row("held").lock_until
    assert held is not None and held >= before + 1.0
    run_store.pass_until(held)
    slot = float(int(run_store.now()))
    assert run_store.claim("held", "h2", 30, Claim(slot=slot)) is not None
    return before, held, slot


def test_a_claim_over_a_lock_held_past_its_slot_leaves_a_gap_until_seen(
        run_store: RoleUnderTest) -> None:
    before, held, slot = held_gap(run_store)
    (gap,) = run_store.gaps.held_gaps()
    assert (gap.name, gap.token, gap.after, gap.last_slot) == ("held", 2, before, slot)
    assert gap.until == pytest.approx(held)
    # Another claim before any host looked keeps the gap (its slot before, its end).
    assert run_store.store.release("held", "h2", 2)
    run_store.pass_until(slot + 1.0)
    assert run_store.claim("held", "h3", 30, Claim(slot=slot + 1.0)) is not None
    (kept,) = run_store.gaps.held_gaps()
    assert (kept.token, kept.after, kept.last_slot) == (3, before, slot + 1.0)
    assert kept.until == pytest.approx(held)
    # Seen under a token that is no longer the row's: still there; under its own: gone.
    run_store.gaps.held_gaps_seen([gap])
    assert run_store.gaps.held_gaps() == [kept]
    run_store.gaps.held_gaps_seen([kept])
    assert run_store.gaps.held_gaps() == []


def test_a_claim_after_a_lock_released_in_time_leaves_no_gap(run_store: RoleUnderTest) -> None:
    run_store.ensure("held")
    slot = run_store.now() - 0.1  # released within the second after its slot, as runs are
    won = run_store.claim("held", "h1", 30, Claim(slot=slot))
    assert won is not None and run_store.store.release("held", "h1", won.token, 0.0)
    assert run_store.claim("held", "h2", 30, Claim(slot=slot + 0.05)) is not None
    assert run_store.gaps.held_gaps() == []


def test_a_gaps_slots_are_recorded_once_by_the_host_that_marks_it_seen(
        run_store: RoleUnderTest) -> None:
    """A lock held a second or more past its slot (here released at once, 5 s
    after it: a lock-at-least window or a retry's delay is the same), then a
    claim of a later slot: the slots between are recorded by one host."""
    run_store.ensure("held")
    before = float(int(run_store.now())) - 5.0
    won = run_store.claim("held", "h1", 30, Claim(slot=before))
    assert won is not None and run_store.store.release("held", "h1", won.token, 0.0)
    assert run_store.claim("held", "h2", 30, Claim(slot=before + 3.0)) is not None
    (gap,) = run_store.gaps.held_gaps()
    assert (gap.token, gap.after, gap.last_slot) == (2, before, before + 3.0)
    upto = min(gap.until, gap.last_slot) - 0.001
    now = run_store.now()
    plan = passed(EVERY_SECOND, gap.after, now, Cause.LOCK_HELD, upto=upto, reason="held")
    assert plan is not None and plan.records
    books = [SlotBook(run_store.store, host, Events()) for host in ("h2", "h3")]
    assert [book.record(EVERY_SECOND, plan, now, gap_of=gap.token) for book in books] == [
        True, False]
    assert run_store.gaps.held_gaps() == []
    kept = [before + 1.0, before + 2.0]
    assert sorted(r.slot or 0.0 for r in run_store.records("held")
                  if r.result == m.SKIPPED) == kept
    slots, ranges = run_store.gaps.record_slots_in("held", gap.after, upto)
    assert slots == set(kept) and ranges == []
    # (after, upto]: the slot before is not in it, nor a later one.
    assert run_store.gaps.record_slots_in("held", kept[0], kept[0]) == (set(), [])


def test_a_summary_records_range_is_known_to_the_held_gap_bookkeeping(
        run_store: RoleUnderTest) -> None:
    """The fault soak on a loaded machine: every daemon stalled for 40 s;
    one, back first, recorded the 20 slots it found passed (ten records and
    a summary of the older ten); then the held-gap bookkeeping recorded the
    summarized slots once more, as it saw only the summary's own slot. The
    summary's range is stored with it and read back with the records."""
    run_store.ensure("held")
    prev = float(int(run_store.now())) - 30.0
    plan = passed(EVERY_SECOND, prev, prev + 25.5, Cause.DOWN)
    assert plan is not None and plan.summary is not None
    assert SlotBook(run_store.store, "h1", Events()).record(EVERY_SECOND, plan, prev + 25.5)
    slots, ranges = run_store.gaps.record_slots_in("held", prev, prev + 25.5)
    assert ranges == [(plan.summary.first, plan.summary.last)]
    assert slots == {plan.summary.last, *plan.records}
    assert unrecorded_runs(EVERY_SECOND, prev, prev + 24.0, slots, ranges) == []
