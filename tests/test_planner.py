"""The slot planner, pure: no database, no clock (times are passed in).

One policy for every passed slot, whatever passed it; one plan per job on
the agenda; each due attempt decided in one place."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from dblockrun.jobs import Job
from dblockrun.scheduling.planner import (
    COUNTED,
    DEFAULT_LIMIT,
    RECORDED,
    Act,
    Agenda,
    Cause,
    Due,
    Outcome,
    Planner,
    Row,
    next_attempt,
    next_due,
    passed,
    rate_due,
    record_texts,
)

NOW = 1_800_000_000.5  # half a second past a whole second


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def job(catch_up: str = "latest", limit: int | None = None, cron: str | None = "* * * * * *",
        rate: float | None = None, deadline: float | None = None) -> Job:
    return Job("j", "true", cron=cron, rate=rate, catch_up=catch_up, catch_up_limit=limit,
               starting_deadline=deadline)


# --- the policy ------------------------------------------------------------------------


def test_latest_runs_the_newest_and_records_the_older() -> None:
    p = passed(job(), NOW - 5.5, NOW, Cause.DOWN)  # slots NOW-4.5 .. NOW-0.5
    assert p is not None
    assert p.run == (NOW - 0.5,)
    assert p.records == (NOW - 4.5, NOW - 3.5, NOW - 2.5, NOW - 1.5)
    assert p.summary is None and p.result == "missed"
    assert p.resume == NOW - 0.5


def test_none_runs_only_a_slot_not_yet_passed() -> None:
    p = passed(job("none"), NOW - 5.5, NOW, Cause.OUTAGE)
    assert p is not None
    # NOW-0.5 is under FRESH old: live daemons may be claiming it; it runs.
    assert p.run == (NOW - 0.5,)
    assert p.records == (NOW - 4.5, NOW - 3.5, NOW - 2.5, NOW - 1.5)
    # Every 10 s: the newest, 3.5 s old, is passed too.
    later = passed(job("none", cron="*/10 * * * * *"), NOW - 40.5, NOW + 3, Cause.LATE)
    assert later is not None and later.run == ()
    assert later.records == (NOW - 30.5, NOW - 20.5, NOW - 10.5, NOW - 0.5)


def test_all_runs_the_newest_limit_oldest_first() -> None:
    p = passed(job("all", 3), NOW - 8.5, NOW, Cause.DOWN)
    assert p is not None
    assert p.run == (NOW - 2.5, NOW - 1.5, NOW - 0.5)
    assert p.records == tuple(NOW - k - 0.5 for k in range(7, 2, -1))
    unlimited = passed(job("all"), NOW - 8.5, NOW, Cause.DOWN)
    assert unlimited is not None
    assert unlimited.run == tuple(NOW - k - 0.5 for k in range(7, -1, -1))
    # A cron + rate job runs one at most: the rate would refuse the others.
    with_rate = passed(job("all", 3, rate=1.0), NOW - 8.5, NOW, Cause.DOWN)
    assert with_rate is not None and with_rate.run == (NOW - 0.5,)


@pytest.mark.parametrize("cause", [Cause.DOWN, Cause.OUTAGE, Cause.LATE])
def test_one_policy_whatever_passed_the_slots(cause: Cause) -> None:
    """An outage and a late wake-up follow catch-up as a downtime does."""
    p = passed(job("all", 2), NOW - 5.5, NOW, cause)
    assert p is not None and p.run == (NOW - 1.5, NOW - 0.5) and len(p.records) == 3
    assert p.result == "missed"


@pytest.mark.parametrize("cause", [Cause.BUSY, Cause.HOST_FULL, Cause.GROUP_FULL,
                                   Cause.DEAD_HOLDER])
def test_causes_that_run_nothing_record_every_slot_skipped(cause: Cause) -> None:
    p = passed(job("all"), NOW - 5.5, NOW, cause, reason="why")
    assert p is not None and p.run == () and p.result == "skipped"
    assert p.records == tuple(NOW - k - 0.5 for k in range(4, -1, -1))
    assert [text for _, text, _ in record_texts(p)] == ["skipped: why\n"] * 5


def test_the_starting_deadline_bounds_every_start() -> None:
    p = passed(job("all", 5, deadline=2.0), NOW - 5.5, NOW, Cause.DOWN)
    assert p is not None
    # Only the slots at most 2 s old may start; the older are recorded missed.
    assert p.run == (NOW - 1.5, NOW - 0.5)
    assert p.records == (NOW - 4.5, NOW - 3.5, NOW - 2.5)
    assert "starting-deadline 2s" in p.reason


def test_a_dead_holders_slots_end_at_its_lease() -> None:
    p = passed(job(), NOW - 10.5, NOW, Cause.DEAD_HOLDER, upto=NOW - 6.5, reason="dead")
    assert p is not None and p.records == (NOW - 9.5, NOW - 8.5, NOW - 7.5, NOW - 6.5)


def test_nothing_passed_no_last_slot_or_no_slots() -> None:
    assert passed(job(), NOW - 0.5, NOW, Cause.DOWN) is None  # last slot is the newest
    assert passed(job(), None, NOW, Cause.DOWN) is None  # never ran: nothing was passed
    assert passed(job(cron=None, rate=60.0), NOW - 100, NOW, Cause.DOWN) is None
    assert passed(job(cron="0 0 1 1 *"), NOW - 3600, NOW, Cause.DOWN) is None
    # A last slot in the future (a row edited by hand) passes nothing, beyond
    # any year a schedule reaches too.
    assert passed(job(), NOW + 60, NOW, Cause.DOWN) is None
    assert passed(job(), 253402300799.0 * 4, NOW, Cause.DOWN) is None


def test_a_week_passed_is_bounded_in_records_and_time() -> None:
    week = 7 * 86400
    started = time.monotonic()
    p = passed(job("all", 5), NOW - week - 0.5, NOW, Cause.OUTAGE)
    took = time.monotonic() - started
    assert p is not None and p.summary is not None
    assert len(p.run) == 5 and len(p.records) == RECORDED
    assert p.summary.first == NOW - week + 0.5 and p.summary.last == p.records[0] - 1
    assert (p.summary.count, p.summary.more) == (COUNTED, True)
    assert took < 1.0, took  # 604,800 slots, looked at from the newest end
    small = passed(job(), NOW - 30.5, NOW, Cause.DOWN)
    assert small is not None and small.summary is not None
    # 30 slots: 1 runs, RECORDED recorded one by one, the rest counted in one record.
    assert (small.summary.count, small.summary.more) == (30 - 1 - RECORDED, False)
    assert small.count == 29 and small.first == NOW - 29.5 and small.last == NOW - 1.5
    texts = record_texts(small)
    assert len(texts) == RECORDED + 1
    iso = [datetime.fromtimestamp(t, UTC).isoformat() for t in (NOW - 29.5, NOW - 11.5)]
    assert texts[0] == (NOW - 11.5, f"missed: 19 slots from {iso[0]} to {iso[1]}: "
                                    f"{small.reason}\n", 19)
    assert DEFAULT_LIMIT == 100


# --- when next --------------------------------------------------------------------------


def test_the_agenda_gives_due_attempts_soonest_first() -> None:
    agenda = Agenda()
    agenda.push(30.0, "c", 30.0)
    agenda.push(10.0, "a", 10.0)
    agenda.push(20.0, "b", 20.0)
    assert agenda.next_at() == 10.0
    assert agenda.pop_due(5.0) is None  # nothing due yet
    due = [agenda.pop_due(25.0), agenda.pop_due(25.0), agenda.pop_due(25.0)]
    assert [(d.name, d.slot) if d else None for d in due] == [("a", 10.0), ("b", 20.0), None]
    assert agenda.next_at() == 30.0


def test_a_job_has_one_plan_at_a_time() -> None:
    agenda = Agenda()
    agenda.push(10.0, "j", 10.0)
    agenda.push(12.0, "j", None)  # re-planned: replaces the 10.0 attempt
    assert agenda.next_at() == 12.0 and agenda.planned("j")
    d = agenda.pop_due(100.0)
    assert d is not None and d.fire_at == 12.0
    assert agenda.pop_due(100.0) is None and not agenda.planned("j")


def test_the_next_attempt_of_a_cron_job_is_its_next_slot_plus_margin() -> None:
    j = job(cron="*/5 * * * *")
    fire_at, slot = next_attempt(j, at("2026-11-22T10:02:00"), 0.01, 0.5)
    assert slot == at("2026-11-22T10:05:00")
    assert fire_at == slot + 0.51
    # Strictly after: a slot is never planned twice.
    assert next_attempt(j, at("2026-11-22T10:05:00"), 0, 0)[1] == at("2026-11-22T10:10:00")
    assert next_attempt(job(cron=None, rate=60.0), 100.0, 0.5, 0) == (100.5, None)


def test_next_due_of_a_cron_and_rate_job_is_the_first_slot_a_rate_later() -> None:
    j = job(cron="*/5 * * * *", rate=1800.0)
    slot = at("2026-11-22T10:05:00")
    assert next_due(j, slot, 0.5) == at("2026-11-22T10:35:00")
    assert next_due(job(cron="*/5 * * * *"), slot, 0.5) == at("2026-11-22T10:10:00")


def test_a_rate_job_is_due_a_rate_after_its_last_start() -> None:
    j = job(cron=None, rate=60.0)
    assert rate_due(j, 1000.0, 990.0, None, False, 10.0) == 1050.0
    assert rate_due(j, 1000.0, 990.0, 1070.0, False, 10.0) == 1070.0  # a lease still held
    assert rate_due(j, 1000.0, 5000.0, None, False, 10.0) == 1060.0  # a start in the future
    assert rate_due(j, 1000.0, 900.0, None, True, 10.0) == 1010.0  # refused: a heartbeat


# --- the decisions ------------------------------------------------------------------------


def due(slot: float | None, resync: Cause | None = None) -> Due:
    return Due(0.0, 0, "j", slot, resync)


def test_a_late_wake_up_reads_the_last_slot_first() -> None:
    planner = Planner(10.0, 0.5)
    d = planner.decide(job(), due(NOW - 5.5), NOW, busy=False, full=False)
    assert (d.act, d.cause, d.slot) == (Act.RESYNC, Cause.LATE, NOW - 5.5)
    # On time: a plain claim of the newest slot, fit for a batch.
    d = planner.decide(job(), due(NOW - 0.5), NOW, busy=False, full=False)
    assert (d.act, d.batch, d.due_next) == (Act.CLAIM, True, NOW + 0.5)


def test_a_slot_of_a_busy_job_is_recorded_skipped() -> None:
    d = Planner(10.0, 0.5).decide(job(), due(NOW - 0.5), NOW, busy=True, full=False)
    assert d.act is Act.RECORD and d.plan is not None
    assert (d.plan.cause, d.plan.records, d.plan.result) == (Cause.BUSY, (NOW - 0.5,), "skipped")


def test_a_full_host_leaves_the_slot_once_then_records_it() -> None:
    planner = Planner(10.0, 0.5)
    first = planner.decide(job(), due(NOW - 0.5), NOW, busy=False, full=True)
    assert first.act is Act.DEFER
    planner.after(job(), NOW - 0.5, Outcome.AT_LIMIT, NOW, 0.01, delay=0.25)
    second = planner.decide(job(), due(NOW - 0.5), NOW + 0.25, busy=False, full=True)
    assert second.act is Act.RECORD and second.plan is not None
    assert second.plan.cause is Cause.HOST_FULL
    # Room again at the second look: a claim of its own, not in a batch.
    planner.after(job(), NOW - 0.5, Outcome.AT_LIMIT, NOW, 0.01, delay=0.25)
    third = planner.decide(job(), due(NOW - 0.5), NOW + 0.25, busy=False, full=False)
    assert (third.act, third.batch) == (Act.CLAIM, False)


def test_a_slot_past_its_deadline_is_recorded_missed() -> None:
    d = Planner(10.0, 0.5).decide(job(deadline=0.2), due(NOW - 0.5), NOW, busy=False,
                                  full=False)
    assert d.act is Act.RECORD and d.plan is not None and d.plan.cause is Cause.DEADLINE
    assert d.plan.reason == "0.5s late, starting-deadline 0.2s"


def test_after_an_outage_the_plan_starts_at_the_slot_it_was_trying() -> None:
    """A job that never ran, its first slot passed in an outage: recorded
    from the slot the daemon was trying, not forgotten."""
    planner = Planner(10.0, 0.5)
    plan = planner.resynced(job(), Row(), NOW, Cause.OUTAGE, since=NOW - 5.5, margin=0.01)
    assert plan is not None
    assert plan.records == (NOW - 5.5, NOW - 4.5, NOW - 3.5, NOW - 2.5, NOW - 1.5)
    assert plan.run == (NOW - 0.5,) and planner.head("j") == NOW - 0.5
    d = planner.agenda.pop_due(NOW)
    assert d is not None and d.slot == NOW - 0.5
    claim = planner.decide(job(), d, NOW, busy=False, full=False)
    assert (claim.act, claim.slot, claim.batch) == (Act.CLAIM, NOW - 0.5, False)
    # The database's newer last slot wins: what others ran is not passed.
    again = Planner(10.0, 0.5)
    assert again.resynced(job(), Row(NOW - 0.5), NOW, Cause.OUTAGE, NOW - 5.5, 0.01) is None
    nxt = again.agenda.pop_due(NOW + 10)
    assert nxt is not None and nxt.slot == NOW + 0.5


def test_a_backlog_runs_one_slot_at_a_time_oldest_first() -> None:
    planner = Planner(10.0, 0.5)
    plan = planner.resynced(job("all", 3), Row(NOW - 5.5), NOW, Cause.DOWN, None, 0.01)
    assert plan is not None and plan.run == (NOW - 2.5, NOW - 1.5, NOW - 0.5)
    d = planner.agenda.pop_due(NOW)
    assert d is not None
    first = planner.decide(job("all", 3), d, NOW, busy=False, full=False)
    assert (first.act, first.slot, first.due_next) == (Act.CLAIM, NOW - 2.5, NOW - 1.5)
    assert not planner.after(job("all", 3), NOW - 2.5, Outcome.STARTED, NOW, 0.01)
    assert not planner.agenda.planned("j")  # the run's end tries the next
    waiting = planner.decide(job("all", 3), d, NOW, busy=True, full=False)
    assert waiting.act is Act.WAIT  # its end tries the next
    nxt = planner.decide(job("all", 3), d, NOW, busy=False, full=False)
    assert (nxt.act, nxt.slot) == (Act.CLAIM, NOW - 1.5)


def test_a_lost_backlog_slot_asks_for_the_row_then_moves_on() -> None:
    planner = Planner(10.0, 0.5)
    planner.resynced(job("all", 3), Row(NOW - 5.5), NOW, Cause.DOWN, None, 0.01)
    assert planner.after(job("all", 3), NOW - 2.5, Outcome.LOST, NOW, 0.01)  # row needed
    # Another host ran it and the next one: on to the newest.
    planner.after(job("all", 3), NOW - 2.5, Outcome.LOST, NOW, 0.01, row=Row(NOW - 1.5))
    assert planner.head("j") == NOW - 0.5
    # Held by another host: tried again within a heartbeat.
    planner.after(job("all", 3), NOW - 0.5, Outcome.LOST, NOW, 0.01,
                  row=Row(NOW - 1.5, None, NOW + 30))
    d = planner.agenda.pop_due(NOW + 10.1)
    assert d is not None and d.slot == NOW - 0.5 and planner.head("j") == NOW - 0.5


def test_a_backlog_refused_by_a_pause_is_recorded_not_dropped() -> None:
    """The fault soak: a daemon restarted, planned to run the slot that
    passed while it was down, and the fleet was paused before its claim.
    The claim was refused, the catch-up given up, and the slot, due before
    the pause began, was left with no record."""
    planner = Planner(10.0, 0.5)
    every = job("all", 3)
    planner.resynced(every, Row(NOW - 5.5), NOW, Cause.DOWN, None, 0.01)
    # Refused though nobody holds it or ran it: the fleet is paused. Claimed
    # once more (the lock may have been released since the claim), refused again.
    for _ in range(2):
        assert planner.head("j") == NOW - 2.5
        d = planner.agenda.pop_due(NOW)
        assert d is not None and d.slot == NOW - 2.5
        claim = planner.decide(every, d, NOW, busy=False, full=False)
        assert (claim.act, claim.slot) == (Act.CLAIM, NOW - 2.5)
        assert planner.after(every, NOW - 2.5, Outcome.LOST, NOW, 0.01)
        planner.after(every, NOW - 2.5, Outcome.LOST, NOW, 0.01, row=Row(NOW - 5.5))
    assert planner.head("j") is None
    d = planner.agenda.pop_due(NOW)
    assert d is not None and d.slot == NOW - 2.5
    record = planner.decide(every, d, NOW, busy=False, full=False)
    assert record.act is Act.RECORD and record.plan is not None
    assert record.plan.records == (NOW - 2.5, NOW - 1.5, NOW - 0.5)
    assert record.plan.result == "skipped" and "could not be claimed" in record.plan.reason
    # Once recorded, the schedule goes on after the newest of them.
    planner.after(every, record.slot, Outcome.RECORDED, NOW, 0.01)
    nxt = planner.agenda.pop_due(NOW + 10)
    assert nxt is not None and nxt.slot == NOW + 0.5


def test_a_backlog_slot_refused_by_a_lock_released_before_the_row_is_read_is_claimed_again(
) -> None:
    """Two daemons after downtime: one runs the backlog's slot, the other's
    claim of the next is refused by its lock; the run ends and releases it
    before the refused daemon reads the row, which shows the lock free and
    the slot not taken. Under load that gave up the backlog: its 3 slots
    left were recorded skipped, "the slot could not be claimed", none run
    (CI: test_catchup's two-daemon test, ['ok', 'skipped', 'skipped', 'skipped'])."""
    planner = Planner(10.0, 0.5)
    every = job("all", 4)
    planner.resynced(every, Row(NOW - 9.5), NOW, Cause.DOWN, None, 0.01)
    assert planner.head("j") == NOW - 3.5
    # The other host claimed NOW - 3.5, ran it and released the lock.
    ran = Row(NOW - 3.5, NOW - 0.4, NOW - 0.1)
    assert planner.after(every, NOW - 3.5, Outcome.LOST, NOW, 0.01)
    planner.after(every, NOW - 3.5, Outcome.LOST, NOW, 0.01, row=ran)
    assert planner.head("j") == NOW - 2.5
    d = planner.agenda.pop_due(NOW)
    assert d is not None and d.slot == NOW - 2.5
    # Refused while it ran; by the read, released and the slot still free.
    assert planner.after(every, NOW - 2.5, Outcome.LOST, NOW, 0.01)
    planner.after(every, NOW - 2.5, Outcome.LOST, NOW, 0.01, row=ran)
    assert planner.head("j") == NOW - 2.5
    d = planner.agenda.pop_due(NOW)
    assert d is not None and d.slot == NOW - 2.5
    claim = planner.decide(every, d, NOW, busy=False, full=False)
    assert (claim.act, claim.slot, claim.due_next) == (Act.CLAIM, NOW - 2.5, NOW - 1.5)
    # Claimed again: won, and the backlog goes on.
    assert not planner.after(every, NOW - 2.5, Outcome.STARTED, NOW, 0.01)
    assert planner.head("j") == NOW - 1.5


def test_a_database_error_reads_the_row_after_the_backoff() -> None:
    planner = Planner(10.0, 0.5)
    planner.after(job(), NOW - 0.5, Outcome.DB_ERROR, NOW, 0.01, delay=2.0)
    assert planner.agenda.pop_due(NOW + 1.9) is None
    d = planner.agenda.pop_due(NOW + 2.0)
    assert d is not None and (d.resync, d.slot) == (Cause.OUTAGE, NOW - 0.5)


def test_the_database_back_brings_the_resyncs_waiting_for_the_backoff_forward() -> None:
    """The fault soak (MariaDB, seed 169457): a job's resync waited the
    backoff of its failed attempt (up to 10 s) after the database was back.
    Once it answers, each resync waiting for the backoff is due now, its
    slot and cause kept; a job's regular plan stays where it was."""
    planner = Planner(10.0, 0.5)
    cut, ok = job(), Job("k", "true", cron="*/5 * * * * *")
    planner.after(cut, NOW - 0.5, Outcome.DB_ERROR, NOW, 0.01, delay=8.0)
    planner.after(ok, NOW - 0.5, Outcome.STARTED, NOW, 0.01)  # next: NOW + 4.5 (+ margin)
    planner.database_back(NOW + 1.0)
    d = planner.agenda.pop_due(NOW + 1.0)
    assert d is not None and (d.name, d.resync, d.slot) == ("j", Cause.OUTAGE, NOW - 0.5)
    assert planner.agenda.pop_due(NOW + 4.4) is None
    d = planner.agenda.pop_due(NOW + 5.0)
    assert d is not None and (d.name, d.resync, d.slot) == ("k", None, NOW + 4.5)
    assert len(planner.agenda) == 0  # the resync moved, not doubled


def test_a_reload_during_an_outage_keeps_the_changed_jobs_resync() -> None:
    """The fault soak: the database cut for every daemon, the jobs file
    reloaded (one job's description changed) as it came back: the changed
    job was planned from now and the outage's slots got no record."""
    planner = Planner(10.0, 0.5)
    old = job()
    planner.after(old, NOW - 0.5, Outcome.DB_ERROR, NOW, 0.01, delay=2.0)
    changed = Job("j", "true", cron=old.cron, catch_up="latest", description="reloaded")
    planner.reload([changed], lambda name: old, NOW + 1.0, 0.01)
    d = planner.agenda.pop_due(NOW + 2.0)
    assert d is not None and (d.resync, d.slot) == (Cause.OUTAGE, NOW - 0.5)
    # A changed job with a regular plan is planned again from its pending slot.
    planner.after(old, NOW + 1.5, Outcome.STARTED, NOW + 1.6, 0.01)
    planner.reload([changed], lambda name: old, NOW + 2.0, 0.01)
    d = planner.agenda.pop_due(NOW + 10)
    assert d is not None and d.resync is None and d.slot == NOW + 2.5


def test_a_slot_due_while_the_file_is_reloaded_is_still_tried() -> None:
    """The fault soak: the jobs file reloaded (one job's command changed)
    0.1 s after the job's slot came due, before this daemon had tried it.
    The changed job was planned from now, its next slot a second later, and
    every daemon did the same: the slot passed with no record."""
    planner = Planner(10.0, 0.5)
    old = job()
    planner.after(old, NOW - 0.5, Outcome.STARTED, NOW - 0.4, 0.01)  # next: NOW + 0.5
    changed = Job("j", "echo new", cron=old.cron, catch_up="latest")
    planner.reload([changed], lambda name: old, NOW + 0.6, 0.01)
    d = planner.agenda.pop_due(NOW + 0.6)
    assert d is not None and d.slot == NOW + 0.5
    # A job whose definition did not change keeps its plan as it was.
    planner.after(old, NOW + 0.5, Outcome.STARTED, NOW + 0.6, 0.01)
    planner.reload([old], lambda name: old, NOW + 0.7, 0.01)
    d = planner.agenda.pop_due(NOW + 10)
    assert d is not None and d.slot == NOW + 1.5


def test_a_resync_that_finds_the_job_disabled_records_what_passed_before_the_disable() -> None:
    """The fault soak: the database cut for the whole fleet, the job
    disabled by the time the outage's resync came. Its slots are not due
    while disabled, but those that passed before the disable began were:
    they are recorded (none run), the rest are not."""
    planner = Planner(10.0, 0.5)
    every = job()  # a slot a second
    row = Row(NOW - 10, NOW - 10, None)
    plan = planner.resynced(every, row, NOW, Cause.OUTAGE, NOW - 9, 0.01, disabled=True,
                            disabled_since=NOW - 4.5)
    assert plan is not None and plan.run == () and plan.result == "missed"
    recorded = set(plan.records)
    if plan.summary is not None:
        recorded |= {plan.summary.first, plan.summary.last}
    assert (min(recorded), plan.last) == (NOW - 8.5, NOW - 5.5)  # NOW is at x.5 s
    assert "then the job was disabled" in plan.reason
    # Not known when it began (an on-failure disable): nothing is recorded.
    assert planner.resynced(every, row, NOW, Cause.OUTAGE, NOW - 9, 0.01,
                            disabled=True) is None


def test_a_rate_job_is_planned_from_its_row_at_its_end() -> None:
    planner = Planner(10.0, 0.5)
    rate = job(cron=None, rate=60.0)
    assert not planner.after(rate, None, Outcome.STARTED, NOW, 0.01)
    assert planner.after(rate, None, Outcome.ENDED, NOW, 0.01)
    planner.after(rate, None, Outcome.ENDED, NOW, 0.01, row=Row(None, NOW - 5, None))
    assert planner.agenda.next_at() == NOW + 55 + 0.01


def test_slots_within_lock_at_least_of_a_start_here_are_recorded_skipped() -> None:
    held = Job("j", "true", cron="*/2 * * * * *", lock_at_least=4.0)
    planner = Planner(10.0, 0.5)
    planner.after(held, 100.0, Outcome.STARTED, 100.05, 0.01)
    d = planner.decide(held, due(102.0), 102.01, busy=False, full=False)
    assert d.act is Act.RECORD and d.plan is not None
    assert (d.plan.cause, d.plan.result) == (Cause.LOCK_AT_LEAST, "skipped")
    assert d.plan.reason.startswith("lock-at-least 4s after the start at ")
    # The lock's own end is at least the claim's answer plus 4 s: 104.01 is in it.
    assert planner.decide(held, due(104.0), 104.01, busy=False, full=False).act is Act.RECORD
    assert planner.decide(held, due(106.0), 106.01, busy=False, full=False).act is Act.CLAIM


# --- overlap: queue and replace --------------------------------------------------------


def overlapping(policy: str) -> Job:
    return Job("j", "true", cron="* * * * * *", overlap=policy)


@pytest.mark.parametrize("policy", ["queue", "replace"])
def test_a_slot_of_a_busy_queueing_job_waits_for_the_run_to_end(policy: str) -> None:
    planner = Planner(10.0, 0.5)
    d = planner.decide(overlapping(policy), due(NOW - 0.5), NOW, busy=True, full=False)
    assert (d.act, d.slot, d.plan) == (Act.QUEUE, NOW - 0.5, None)
    planner.after(overlapping(policy), NOW - 0.5, Outcome.QUEUED, NOW, 0.01)
    # The next slot is still looked at while it waits.
    nxt = planner.agenda.pop_due(NOW + 1)
    assert nxt is not None and nxt.slot == NOW + 0.5
    # The run ends 1.7 s later: the slot that waited is due at once and
    # claimed, though a newer one (NOW+0.5) came meanwhile (it was queued
    # in its place in the next test; here it was not due yet).
    planner.after(overlapping(policy), None, Outcome.ENDED, NOW + 0.3, 0.01)
    waited = planner.agenda.pop_due(NOW + 0.3)
    assert waited is not None and waited.slot == NOW - 0.5
    go = planner.decide(overlapping(policy), waited, NOW + 0.3, busy=False, full=False)
    assert (go.act, go.slot, go.due_next) == (Act.CLAIM, NOW - 0.5, NOW + 0.5)


def test_a_newer_slot_takes_the_waiting_ones_place_and_that_one_is_skipped() -> None:
    planner = Planner(10.0, 0.5)
    queue = overlapping("queue")
    planner.decide(queue, due(NOW - 0.5), NOW, busy=True, full=False)
    planner.after(queue, NOW - 0.5, Outcome.QUEUED, NOW, 0.01)
    d = planner.decide(queue, due(NOW + 0.5), NOW + 1, busy=True, full=False)
    assert (d.act, d.slot) == (Act.QUEUE, NOW + 0.5)
    assert d.plan is not None and d.plan.records == (NOW - 0.5,)
    assert (d.plan.cause, d.plan.result) == (Cause.QUEUE_FULL, "skipped")
    assert "queue holds one slot" in d.plan.reason
    assert planner.queued == {"j": NOW + 0.5}


def test_a_forbidding_job_is_skipped_and_nothing_waits() -> None:
    planner = Planner(10.0, 0.5)
    d = planner.decide(overlapping("forbid"), due(NOW - 0.5), NOW, busy=True, full=False)
    assert d.act is Act.RECORD and planner.queued == {}


def test_a_resync_drops_the_waiting_slot_for_the_catch_up_policy() -> None:
    planner = Planner(10.0, 0.5)
    queue = overlapping("queue")
    planner.decide(queue, due(NOW - 0.5), NOW, busy=True, full=False)
    planner.resync(queue, NOW + 1, Cause.OUTAGE, NOW + 0.5)
    planner.after(queue, None, Outcome.ENDED, NOW + 1, 0.01)
    d = planner.agenda.pop_due(NOW + 1)
    assert d is not None and d.resync is Cause.OUTAGE  # not replaced by the waiting slot


def test_a_host_that_queues_claims_the_slot_none_took_instead_of_skipping_it() -> None:
    """The planner: at --max-running the slot is left to the others once,
    then, with --when-full queue, claimed here (its run waits for room)."""
    planner = Planner(10.0, 0.5, host_queue=True)
    assert planner.decide(job(), due(NOW - 0.5), NOW, busy=False, full=True).act is Act.DEFER
    planner.after(job(), NOW - 0.5, Outcome.AT_LIMIT, NOW, 0.01, delay=0.25)
    second = planner.decide(job(), due(NOW - 0.5), NOW + 0.25, busy=False, full=True)
    assert (second.act, second.slot, second.batch, second.plan) == (
        Act.CLAIM, NOW - 0.5, False, None)
