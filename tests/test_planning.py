"""The daemon's planning, pure: no database, no clock (times are passed in)."""

from __future__ import annotations

from datetime import UTC, datetime

from dblockrun.jobs import Job
from dblockrun.planning import MAX_PASSED, Agenda, catch_up, next_attempt, next_due, too_late


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def job(cron: str | None = None, rate: float | None = None,
        starting_deadline: float | None = None) -> Job:
    return Job(name="j", command="true", cron=cron, rate=rate,
               starting_deadline=starting_deadline)


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


def test_a_job_without_slots_keeps_only_its_newest_plan() -> None:
    agenda = Agenda()
    agenda.push(10.0, "rate", None)
    agenda.push(12.0, "rate", None)  # re-planned: replaces the 10.0 attempt
    assert agenda.next_at() == 12.0
    d = agenda.pop_due(100.0)
    assert d is not None and d.fire_at == 12.0
    assert agenda.pop_due(100.0) is None


def test_clearing_forgets_every_plan() -> None:
    agenda = Agenda()
    agenda.push(10.0, "a", 10.0)
    agenda.push(11.0, "r", None)
    agenda.clear()
    assert agenda.next_at() is None and agenda.pop_due(100.0) is None


def test_the_next_attempt_of_a_cron_job_is_its_next_slot_plus_margin() -> None:
    j = job(cron="*/5 * * * *")
    fire_at, slot = next_attempt(j, at("2026-11-22T10:02:00"), 0.01, 0.5)
    assert slot == at("2026-11-22T10:05:00")
    assert fire_at == slot + 0.51
    # Strictly after: a slot is never planned twice.
    assert next_attempt(j, at("2026-11-22T10:05:00"), 0, 0)[1] == at("2026-11-22T10:10:00")


def test_a_rate_only_job_is_attempted_at_the_time_given() -> None:
    assert next_attempt(job(rate=60.0), 1000.0, 0.01, 0.0) == (1000.01, None)


def test_a_late_wake_up_tries_the_newest_slot_and_keeps_the_passed_ones() -> None:
    j = job(cron="* * * * *")
    slot, passed = catch_up(j, at("2026-11-22T10:00:00"), at("2026-11-22T10:03:30"))
    assert slot == at("2026-11-22T10:03:00")
    assert list(passed) == [at("2026-11-22T10:00:00"), at("2026-11-22T10:01:00"),
                            at("2026-11-22T10:02:00")]
    on_time, none = catch_up(j, at("2026-11-22T10:00:00"), at("2026-11-22T10:00:10"))
    assert on_time == at("2026-11-22T10:00:00") and list(none) == []


def test_a_very_late_wake_up_keeps_only_the_newest_passed_slots() -> None:
    j = job(cron="* * * * *")
    start = at("2026-11-22T00:00:00")
    slot, passed = catch_up(j, start, start + 3 * 3600)
    assert slot == start + 3 * 3600
    assert len(passed) == MAX_PASSED and passed[-1] == slot - 60


def test_the_starting_deadline_decides_what_is_too_late() -> None:
    j = job(cron="* * * * *", starting_deadline=30.0)
    assert not too_late(j, 100.0, 130.0)
    assert too_late(j, 100.0, 130.5)
    assert not too_late(job(cron="* * * * *"), 100.0, 1e9)  # no deadline: never


def test_next_due_of_a_cron_and_rate_job_is_the_first_slot_a_rate_later() -> None:
    every2 = "*/2 * * * * *"
    slot = at("2026-11-22T10:00:00")
    assert next_due(job(cron=every2), slot, 0.1) == slot + 2
    assert next_due(job(cron=every2, rate=6.0), slot, 0.1) == slot + 6
    # A rate between slots: the first slot after it.
    assert next_due(job(cron=every2, rate=5.0), slot, 0.1) == slot + 6
