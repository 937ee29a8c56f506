"""Calendars, blackout windows and the active range (issue 37, item 1).

The slot logic is pure (dblockrun/scheduling/calendars.py): a slot's day
or time in the job's zone, daylight saving included. The planner records
an excluded slot ``skipped`` with its reason through the slot book, and
never runs it; three real daemons record each once. ``validate`` names
file, line, job and key of a bad calendar; ``next`` shows the excluded
slots among the real ones, with their reason."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner, Result
from harness import Fleet
from helpers import TestDb, clean_env, output_of, runs_of, wait_for
from jobfiles import load

from dblockrun.cli import cli
from dblockrun.events import Events, SlotPassed
from dblockrun.jobs import Active, Calendar, Job
from dblockrun.ops.check import problems
from dblockrun.ops.output import next_lines
from dblockrun.running.slotbook import SlotBook
from dblockrun.scheduling.calendars import (
    excluded,
    next_real_slot,
    parse_window,
    read_ics,
    upcoming,
)
from dblockrun.scheduling.planner import Act, Cause, Due, Planner, next_due, passed
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.status import passed_since, report

AMS = "Europe/Amsterdam"


def ams(text: str) -> float:
    """A wall time in Amsterdam (the first of a repeated one) as epoch seconds."""
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(AMS)).timestamp()


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


HOLIDAYS = Calendar("nl-holidays", frozenset({date(2026, 12, 25), date(2026, 12, 26),
                                              date(2027, 1, 1)}))


def payroll(cron: str = "0 6 * * 1-5", *windows: str, active: Active | None = None,
            calendars: tuple[Calendar, ...] = (HOLIDAYS,), timezone: str = AMS) -> Job:
    return Job("payroll", "true", cron=cron, timezone=timezone, exclude=calendars,
               blackout=tuple(parse_window(w) for w in windows), active=active)


def why(job: Job, slot: float) -> str | None:
    found = excluded(job, slot)
    return None if found is None else found.reason


# --- which slots, and why -------------------------------------------------------------


def test_a_calendar_day_is_a_day_in_the_jobs_zone() -> None:
    job = payroll()
    assert why(job, ams("2026-12-24T06:00")) is None
    assert why(job, ams("2026-12-25T06:00")) == "calendar nl-holidays"
    # 00:30 on Christmas in Amsterdam is still the 24th in UTC: excluded all the same.
    assert why(job, ams("2026-12-25T00:30")) == "calendar nl-holidays"
    assert why(job, ams("2026-12-24T23:59:59")) is None
    found = excluded(job, ams("2026-12-26T06:00"))
    assert found is not None and found.until == ams("2026-12-27T00:00")


def test_a_weekly_window_crosses_midnight() -> None:
    job = payroll("* * * * *", "sat 22:00/6h", calendars=())
    assert why(job, ams("2026-12-05T21:59")) is None
    assert why(job, ams("2026-12-05T22:00")) == "blackout sat 22:00/6h"
    assert why(job, ams("2026-12-06T03:59")) == "blackout sat 22:00/6h"  # Sunday
    assert why(job, ams("2026-12-06T04:00")) is None
    assert why(job, ams("2026-12-12T23:00")) == "blackout sat 22:00/6h"  # every week
    assert why(job, ams("2026-12-09T23:00")) is None  # a Wednesday


def test_a_window_lasts_its_length_across_daylight_saving() -> None:
    """Amsterdam's clocks go back at 03:00 on 25 October 2026: ``sat
    22:00/6h`` from 22:00 (CEST) lasts six hours, to 03:00 (CET). They go
    forward at 02:00 on 29 March 2026: a window at 02:30 that night starts
    at 03:30, moved on by the gap as iCalendar reads such a time."""
    job = payroll("*/15 * * * *", "sat 22:00/6h", calendars=())
    start = utc("2026-10-24T20:00")  # 22:00 CEST
    assert why(job, start - 1) is None and why(job, start) == "blackout sat 22:00/6h"
    found = excluded(job, start)
    assert found is not None and found.until == start + 6 * 3600
    assert datetime.fromtimestamp(start + 6 * 3600, ZoneInfo(AMS)).hour == 3
    assert why(job, utc("2026-10-25T01:45")) == "blackout sat 22:00/6h"  # 02:45 CET
    assert why(job, utc("2026-10-25T02:00")) is None  # 03:00 CET
    spring = payroll("*/15 * * * *", "sun 02:30/1h", calendars=())
    assert why(spring, utc("2026-03-29T01:15")) is None  # 03:15 CEST
    assert why(spring, utc("2026-03-29T01:30")) == "blackout sun 02:30/1h"  # 03:30 CEST
    assert why(spring, utc("2026-03-29T02:29")) == "blackout sun 02:30/1h"
    assert why(spring, utc("2026-03-29T02:30")) is None
    # A calendar day holds its 23 hours in spring (and 25 in autumn).
    day = payroll("0 * * * *", calendars=(Calendar("c", frozenset({date(2026, 3, 29)})),))
    assert why(day, utc("2026-03-28T22:59")) is None
    assert why(day, utc("2026-03-28T23:00")) == "calendar c"  # 00:00 CET
    assert why(day, utc("2026-03-29T21:59")) == "calendar c"  # 23:59 CEST
    assert why(day, utc("2026-03-29T22:00")) is None


def test_a_dated_window() -> None:
    job = payroll("* * * * *", "2026-12-31 18:00/12h", calendars=())
    assert why(job, ams("2026-12-31T17:59")) is None
    assert why(job, ams("2026-12-31T18:00")) == "blackout 2026-12-31 18:00/12h"
    assert why(job, ams("2027-01-01T05:59")) == "blackout 2026-12-31 18:00/12h"
    assert why(job, ams("2027-01-01T06:00")) is None
    assert why(job, ams("2027-12-31T18:00")) is None  # that year only


def test_the_active_range_holds_its_first_and_last_day() -> None:
    job = payroll(calendars=(), active=Active(date(2026, 12, 1), date(2027, 6, 30)))
    found = excluded(job, ams("2026-11-30T06:00"))
    assert found is not None and found.reason == "not active until 2026-12-01"
    assert found.until == ams("2026-12-01T00:00")
    assert why(job, ams("2026-12-01T06:00")) is None
    assert why(job, ams("2027-06-30T06:00")) is None
    ended = excluded(job, ams("2027-07-01T06:00"))
    assert ended is not None and ended.reason == "not active after 2027-06-30"
    assert ended.until is None  # never again


def test_a_job_without_calendars_pays_nothing() -> None:
    plain = Job("plain", "true", cron="* * * * * *")
    assert not plain.calendared
    assert excluded(plain, utc("2026-12-25T06:00")) is None
    assert next_real_slot(plain, 100.5) == 101.0


def test_the_next_real_slot_jumps_over_an_exclusion() -> None:
    """A job every second through a six-hour window: one jump, not 21,600 looks."""
    job = payroll("* * * * * *", "sat 22:00/6h", calendars=())
    started = time.perf_counter()
    assert next_real_slot(job, ams("2026-12-05T21:59:58")) == ams("2026-12-05T21:59:59")
    assert next_real_slot(job, ams("2026-12-05T21:59:59")) == ams("2026-12-06T04:00")
    assert time.perf_counter() - started < 0.5
    over = payroll(calendars=(), active=Active(None, date(2027, 6, 30)))
    assert next_real_slot(over, ams("2027-06-30T07:00")) is None


def test_next_shows_the_real_slots_and_the_excluded_ones_with_their_reason() -> None:
    job = payroll("0 6 * * 1-5", "2026-12-31 05:00/2h", calendars=(HOLIDAYS,))
    lines = next_lines([job], ams("2026-12-23T12:00"), 5)
    assert lines == [
        "payroll:",
        "  2026-12-24T06:00:00+01:00",
        "  2026-12-25T06:00:00+01:00  skipped: calendar nl-holidays",
        "  2026-12-28T06:00:00+01:00",
        "  2026-12-29T06:00:00+01:00",
        "  2026-12-30T06:00:00+01:00",
        "  2026-12-31T06:00:00+01:00  skipped: blackout 2026-12-31 05:00/2h",
        "  2027-01-01T06:00:00+01:00  skipped: calendar nl-holidays",
        "  2027-01-04T06:00:00+01:00",
    ]
    # A job every minute in a window: one entry for its slots; a job with none
    # excluded keeps its one line.
    dense = payroll("* * * * *", "sat 22:00/6h", calendars=())
    shown = upcoming(dense, ams("2026-12-05T21:58:30"), 2)
    assert [(s.slot, s.reason, s.through) for s in shown] == [
        (ams("2026-12-05T21:59"), None, None),
        (ams("2026-12-05T22:00"), "blackout sat 22:00/6h", ams("2026-12-06T04:00")),
        (ams("2026-12-06T04:00"), None, None)]
    assert next_lines([Job("plain", "true", cron="0 6 * * *")], utc("2026-12-01T00:00"), 2) == [
        "plain: 2026-12-01T06:00:00+00:00, 2026-12-02T06:00:00+00:00"]
    over = payroll(calendars=(), active=Active(None, date(2026, 12, 24)))
    assert next_lines([over], ams("2026-12-23T12:00"), 5) == [
        "payroll:",
        "  2026-12-24T06:00:00+01:00",
        "  2026-12-25T06:00:00+01:00  skipped: not active after 2026-12-24 (and every slot "
        "after it)"]


# --- the planner ----------------------------------------------------------------------


def test_an_excluded_slot_is_recorded_skipped_with_its_reason_and_not_claimed() -> None:
    job = payroll("* * * * * *", "2026-12-05 10:00:02/2s", calendars=())
    planner = Planner(heartbeat=1.0, tolerance=0.5)
    start = ams("2026-12-05T10:00:02")
    decision = planner.decide(job, Due(start, 1, job.name, start), start + 0.01, busy=False,
                              full=False)
    assert decision.act is Act.RECORD and decision.plan is not None
    assert decision.plan.cause is Cause.EXCLUDED and decision.plan.result == "skipped"
    assert decision.plan.reason == "blackout 2026-12-05 10:00:02/2s"
    before = start - 1
    claim = planner.decide(job, Due(before, 2, job.name, before), before + 0.01, busy=False,
                           full=False)
    # Claimed, and `status` shows the next slot to run: after the window.
    assert claim.act is Act.CLAIM and claim.due_next == start + 2
    assert next_due(job, before, 0.5) == start + 2


def test_passed_slots_in_an_exclusion_are_recorded_skipped_and_never_run() -> None:
    """After downtime: the newest slot is in a blackout, so catch-up runs the
    newest real one; the excluded ones get their own reason."""
    job = payroll("* * * * * *", "2026-12-05 10:00:07/3s", calendars=())
    base = ams("2026-12-05T10:00:00")
    plan = passed(job, base, base + 9.5, Cause.DOWN)
    assert plan is not None
    assert plan.run == (base + 6,)
    assert plan.records == (base + 1, base + 2, base + 3, base + 4, base + 5, base + 7,
                            base + 8, base + 9)
    fates = {slot: plan.of(slot)[:2] for slot in plan.records}
    assert fates[base + 5] == ("missed", plan.reason)
    assert fates[base + 7] == fates[base + 9] == ("skipped", "blackout 2026-12-05 10:00:07/3s")


def test_a_recorded_excluded_slot_says_why_once_and_status_shows_the_next_real_slot(
        store: Store) -> None:
    """Through the slot book, as a daemon records it: ``skipped`` with the
    reason, the job's last slot moved past it (a second host's write is
    refused), and ``status``'s next run after the window, not in it."""
    store.ensure_jobs(["tick"])
    slot = float(int(store.db_now()))
    text = f"{datetime.fromtimestamp(slot, UTC):%Y-%m-%d %H:%M:%S}/30s"
    job = Job("tick", "true", cron="* * * * * *", blackout=(parse_window(text),))
    plan = Planner(1.0, 0.5).decide(job, Due(slot, 1, "tick", slot), slot + 0.01, busy=False,
                                    full=False).plan
    assert plan is not None
    heard: list[object] = []
    events = Events()
    events.subscribe(heard.append)
    assert SlotBook(store, "h1", events).record(job, plan, slot + 0.2)
    assert not SlotBook(store, "h2", Events()).record(job, plan, slot + 0.3)
    (record,) = runs_of(store, "tick")
    assert (record.result, record.host, record.slot) == (m.SKIPPED, "h1", slot)
    assert output_of(store, record) == f"skipped: blackout {text}\n"
    locks, _now = store.lock_states()
    assert locks["tick"].last_slot == slot and locks["tick"].next_due == slot + 30
    (passed_event,) = heard
    assert isinstance(passed_event, SlotPassed)
    assert (passed_event.result, passed_event.cause) == (m.SKIPPED, "excluded")


# --- the jobs file --------------------------------------------------------------------


ICS = """\
BEGIN:VCALENDAR
VERSION:2.0
PRODID:-//test//EN
BEGIN:VEVENT
UID:1
DTSTART;VALUE=DATE:20261225
DTEND;VALUE=DATE:20261227
SUMMARY:Kerstmis
END:VEVENT
BEGIN:VEVENT
UID:2
DTSTART;VALUE=DATE:20270427
SUMMARY:Koningsdag
RRULE:FREQ=YEARLY;COUNT=3
EXDATE;VALUE=DATE:20280427
END:VEVENT
BEGIN:VEVENT
UID:3
DTSTART;VALUE=DATE:20270101
SUMMARY:Cancelled
STATUS:CANCELLED
END:VEVENT
END:VCALENDAR
"""


def test_an_icalendar_files_all_day_events() -> None:
    assert read_ics(ICS.replace("\n", "\r\n")) == {
        date(2026, 12, 25), date(2026, 12, 26),  # DTEND is exclusive
        date(2027, 4, 27), date(2029, 4, 27)}  # yearly, but for its EXDATE


def test_an_icalendar_file_with_a_timed_event_or_not_one_at_all_is_refused() -> None:
    timed = ICS.replace("DTSTART;VALUE=DATE:20261225", "DTSTART:20261225T100000Z")
    with pytest.raises(ValueError, match="'Kerstmis' starts at 2026-12-25 10:00:00"):
        read_ics(timed)
    with pytest.raises(ValueError, match="not an iCalendar file"):
        read_ics("hello\n")


def test_the_issues_example_loads(tmp_path: Path) -> None:
    (tmp_path / "holidays-nl.ics").write_text(ICS)
    path = tmp_path / "jobs.yaml"
    path.write_text(textwrap.dedent("""\
        calendars:
          nl-holidays: {dates: [2026-12-25, 2026-12-26, 2027-01-01], file: holidays-nl.ics}
        defaults:
          blackout: ["2026-12-31 18:00/12h"]
        jobs:
          payroll:
            cron: "0 6 * * 1-5"
            timezone: Europe/Amsterdam
            command: ./payroll
            exclude: [nl-holidays]
            blackout: ["sat 22:00/6h", "2026-12-31 18:00/12h"]
            active: {from: 2026-12-01, until: 2027-06-30}
          sweep:
            rate: 1h
            command: ./sweep
        """))
    result = invoke("validate", str(path))
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    jobs = load(path.read_text(), str(path))
    job, sweep = jobs.jobs
    (calendar,) = job.exclude
    assert calendar.days == {date(2026, 12, 25), date(2026, 12, 26), date(2027, 1, 1),
                             date(2027, 4, 27), date(2029, 4, 27)}
    assert [w.text for w in job.blackout] == ["sat 22:00/6h", "2026-12-31 18:00/12h"]
    assert job.active == Active(date(2026, 12, 1), date(2027, 6, 30))
    # A rate job has no slots: the defaults' blackout is not its.
    assert not sweep.calendared
    # Shown on the Job page as the file writes them, the calendar by its days.
    fields = job.set_fields()
    assert fields["active"] == "from 2026-12-01 until 2027-06-30"
    assert fields["exclude"][0].startswith("nl-holidays: 5 days, 2026-12-25 to 2029-04-27 (#")


def test_icalendar_is_imported_only_for_a_file_that_names_a_calendar_file(
        tmp_path: Path) -> None:
    """The daemon's imports (tests/test_budget.py) gain nothing from calendars
    of dates; a calendar file brings the iCalendar parser in."""
    (tmp_path / "h.ics").write_text(ICS)
    probe = ("import sys; from dblockrun.config.load import load_jobs; "
             "load_jobs(sys.argv[1]); print('icalendar' in sys.modules)")
    for calendar, imported in (("{dates: [2026-12-25]}", "False"),
                               ("{file: h.ics}", "True")):
        path = tmp_path / "jobs.yaml"
        path.write_text(f"calendars: {{c: {calendar}}}\n"
                        'jobs: {j: {cron: "@daily", command: x, exclude: [c]}}\n')
        proc = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True,
                              text=True, timeout=60, env=clean_env())
        assert (proc.returncode, proc.stdout.strip()) == (0, imported), proc.stderr


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="dblockrun")


@pytest.mark.parametrize(("body", "message"), [
    ("""\
     calendars:
       c: {dates: [2026-12-25]}
     jobs:
       j:
         cron: "@daily"
         command: x
         exclude: [c]
         active: {from: 2027-07-01, until: 2027-06-30}
     """, "jobs.yaml:8: job 'j': active.until: an empty range: from 2027-07-01 is after until "
          "2027-06-30 (no day has a slot)"),
    ("""\
     calendars:
       c: {dates: [2026-12-25, "2026-13-01"]}
     jobs: {}
     """, "jobs.yaml:2: calendars.c.dates[1]: must be a day like 2026-12-25, got a string "
          "('2026-13-01')"),
    ("""\
     calendars:
       c: {file: missing.ics}
     jobs: {}
     """, "jobs.yaml:2: calendars.c.file: missing.ics: cannot read: No such file or "
          "directory"),
    ("""\
     calendars:
       c: {dates: [2026-02-30]}
     jobs: {}
     """, "jobs.yaml:2: invalid YAML: cannot read '2026-02-30': day is out of range for "
          "month"),
    ("""\
     calendars:
       c: {file: timed.ics}
     jobs: {}
     """, "jobs.yaml:2: calendars.c.file: timed.ics: 'Kerstmis' starts at 2026-12-25 "
          "10:00:00+00:00: only all-day events exclude days (DTSTART;VALUE=DATE)"),
    ("""\
     calendars:
       c: {dates: [2026-12-25]}
     jobs:
       j:
         cron: "@daily"
         command: x
         exclude: [c, d]
     """, "jobs.yaml:7: job 'j': exclude: unknown calendar 'd' (calendars: c)"),
    ("""\
     jobs:
       j:
         cron: "@daily"
         command: x
         blackout: ["sat 22:00/6h", "fri 25:00/1h"]
     """, "jobs.yaml:5: job 'j': blackout: [1]: 'fri 25:00/1h': 25:00 is not a time of day "
          "(00:00 to 23:59)"),
    ("""\
     jobs:
       j:
         cron: "@daily"
         command: x
         blackout: "sat 22:00/8d"
     """, "jobs.yaml:5: job 'j': blackout: [0]: 'sat 22:00/8d': a weekly window lasts at most "
          "7d (longer, it would cover every slot)"),
    ("""\
     jobs:
       j:
         rate: 1h
         command: x
         active: {until: 2027-06-30}
     """, "jobs.yaml:5: job 'j': active: only for a cron job without items (a rate job has no "
          "slots; a fan-out job's items have their own)"),
    ("""\
     defaults:
       exclude: [nope]
     jobs:
       j: {cron: "@daily", command: x}
     """, "jobs.yaml:2: defaults.exclude: unknown calendar 'nope': define it under calendars: "
          "at the top (calendars: {nope: {dates: [2026-12-25]}})"),
])
def test_validate_names_file_line_job_and_key_exit_2(tmp_path: Path, body: str,
                                                     message: str) -> None:
    (tmp_path / "timed.ics").write_text(
        ICS.replace("DTSTART;VALUE=DATE:20261225", "DTSTART:20261225T100000Z"))
    path = tmp_path / "jobs.yaml"
    path.write_text(textwrap.dedent(body))
    result = invoke("validate", str(path))
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"dblockrun: {tmp_path}/{message}"), result.stderr


def test_next_for_one_job_of_the_file(tmp_path: Path) -> None:
    """``dblockrun -f FILE next JOB``: the job's next five real slots and,
    marked, the excluded ones (tomorrow and the day after, by a calendar)."""
    today = datetime.now(UTC).date()
    days = [today + timedelta(days=n) for n in (1, 2)]
    path = tmp_path / "jobs.yaml"
    path.write_text(textwrap.dedent(f"""\
        calendars:
          closed: {{dates: [{days[0]}, {days[1]}]}}
        jobs:
          nightly: {{cron: "30 12 * * *", command: x, exclude: [closed]}}
          other: {{cron: "@daily", command: x}}
        """))
    result = invoke("-f", str(path), "next", "nightly")
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "nightly:"
    assert f"  {days[0]}T12:30:00+00:00  skipped: calendar closed" in lines
    assert f"  {days[1]}T12:30:00+00:00  skipped: calendar closed" in lines
    assert sum("skipped" not in line for line in lines[1:]) == 5  # five real slots
    assert not any(line.startswith("other") for line in lines)
    unknown = invoke("-f", str(path), "next", "nightlyy")
    assert (unknown.exit_code, unknown.stderr) == (2, f"dblockrun: no job 'nightlyy' in {path}\n")
    # The file named first, as before.
    both = invoke("next", str(path), "--count", "1")
    assert both.exit_code == 0 and "other: " in both.stdout


def test_status_check_does_not_page_about_excluded_slots(store: Store) -> None:
    """A holiday's skipped slot is what the file asks for; a full group's is
    a problem (``status --check``)."""
    store.ensure_jobs(["payroll", "report"])
    assert store.lock.record_slots("payroll", "web-1:7:ab", m.SKIPPED,
                                   [(100.0, "skipped: calendar nl-holidays\n", None)],
                                   first=None)
    assert store.lock.record_slots("report", "web-1:7:ab", m.SKIPPED,
                                   [(100.0, "skipped: group nightly full\n", None)], first=None)
    got = report(store, ["payroll", "report"])
    found = problems(got, passed=passed_since(store, got.jobs))
    assert [p for p in found if p.startswith("job ")] == [
        p for p in found if p.startswith("job report: its slots are recorded skipped")]
    assert any(p.startswith("job report: ") for p in found)


# --- real daemons ---------------------------------------------------------------------


BLACKOUT = 4  # seconds
TICK = """\
jobs:
  tick:
    cron: "* * * * * *"
    command: "true"
"""


@pytest.mark.slow
def test_three_daemons_record_each_blacked_out_slot_once_and_run_none(
        db: TestDb, store: Store, fleet: Fleet) -> None:
    """A job every second, on three daemons; a dated window of 4 s a few
    seconds ahead (UTC, from the database's clock) added to the file and
    read on SIGHUP: each slot in it is recorded ``skipped: blackout ...``
    exactly once across the three, none runs, and the slots after it run."""
    daemons = fleet.start_n(3, TICK, lease="6s")
    wait_for(lambda: len(store.hosts(seen_within=30)) == 3, 60, what="3 daemons registered")
    daemons[0].wait(lambda: fleet.runs("tick", m.OK), 30, what="a first run")
    start = int(store.db_now()) + 6
    text = f"{datetime.fromtimestamp(start, UTC):%Y-%m-%d %H:%M:%S}/{BLACKOUT}s"
    daemons[0].jobs.write_text(TICK + f'    blackout: ["{text}"]\n')
    for daemon in daemons:
        daemon.send(signal.SIGHUP)
    for daemon in daemons:
        daemon.wait_log("reloaded", 10)
    assert store.db_now() < start, "the reloads took longer than the lead given them"
    window = {float(start + n) for n in range(BLACKOUT)}
    after = start + BLACKOUT + 2

    def ran_after() -> bool:
        return any(r.slot is not None and r.slot >= after and r.result == m.OK
                   for r in fleet.runs("tick"))

    daemons[0].wait(ran_after, 40, what="a run after the window")
    records = [r for r in fleet.runs("tick") if r.slot in window]
    assert sorted(r.slot for r in records if r.slot is not None) == sorted(window), records
    for r in records:
        assert r.result == m.SKIPPED and r.token is None, r
        assert output_of(store, r) == f"skipped: blackout {text}\n"
    # The slots just before and after it ran.
    ran = {r.slot for r in fleet.runs("tick", m.OK) if r.slot is not None}
    assert {start - 1.0, start + float(BLACKOUT)} <= ran, sorted(ran)
    assert fleet.stop() == [0, 0, 0], [d.text() for d in daemons]
