"""`status` and `history` as operators read them: what the table and the JSON
say (and that they agree), how the tables fit a terminal, and how many
statements `status` costs whatever the number of jobs."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from harness import Fleet
from helpers import TestDb, dblockrun_cmd, wait_for

from dblockrun.cli import cli
from dblockrun.ops import output
from dblockrun.store import Store
from dblockrun.store.models import HostStatus, JobStatus, LockState, RunRecord
from dblockrun.store.status import report

NOW = 1795384397.0  # 2026-11-22T21:53:17Z
WEB1, WEB3 = "web-1:4121:9f2c1a", "web-3:77:0b1d2e"
LONG = "scrape-website-and-build-the-nightly-report"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("DBLOCKRUN_DB", "DBLOCKRUN_DB_FILE", "DBLOCKRUN_JOBS",
                 "DBLOCKRUN_TABLE_PREFIX", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def lock(name: str, **kw: Any) -> LockState:
    fields: dict[str, Any] = dict(holder=None, lock_until=None, locked_at=None, token=0,
                                  last_slot=None, last_start=None, next_due=None,
                                  disabled_until=None, disabled_reason=None)
    fields.update(kw)
    return LockState(name=name, **fields)


def run(run_id: int, job: str, **kw: Any) -> RunRecord:
    fields: dict[str, Any] = dict(item=None, host=WEB1, slot=None, token=1, attempt=1,
                                  started=NOW - 300, finished=NOW - 298.48, exit_code=0,
                                  result="ok")
    fields.update(kw)
    return RunRecord(id=run_id, job=job, **fields)


def host(host_id: str, jobs: dict[str, str], **kw: Any) -> HostStatus:
    fields: dict[str, Any] = dict(hostname=host_id.split(":")[0], pid=4121, version="0.1.0",
                                  started=NOW - 3600, last_seen=NOW - 4, clock_offset=0.0021,
                                  running=1)
    fields.update(kw)
    return HostStatus(id=host_id, jobs=json.dumps(jobs), **fields)


def fleet_jobs() -> list[JobStatus]:
    """A running job (and its last run), an idle one a dead host held, a
    disabled one whose next run had been planned."""
    return [
        JobStatus(lock(LONG, holder=WEB3, lock_until=NOW + 25, token=42, next_due=NOW + 60),
                  last_run=run(17, LONG, token=41),
                  running=run(18, LONG, host=WEB3, token=42, started=NOW - 5, finished=None,
                              exit_code=None, result="running"),
                  db_now=NOW),
        JobStatus(lock("backup", holder=WEB3, lock_until=NOW - 100, token=7,
                       next_due=NOW + 3 * 3600),
                  last_run=run(16, "backup", host=WEB3, token=7, exit_code=3, result="failed",
                               started=NOW - 2 * 86400, finished=NOW - 2 * 86400 + 95),
                  running=None, db_now=NOW),
        JobStatus(lock("move-to-cold", token=3, next_due=NOW - 5,
                       disabled_until=NOW + 3 * 3600, disabled_reason="disk full"),
                  last_run=None, running=None, db_now=NOW),
    ]


def invoke(db: TestDb, *args: str, columns: int | None = None) -> Result:
    env = {"COLUMNS": str(columns)} if columns else {}
    return CliRunner(env=env).invoke(
        cli, ["--db", db.url, "--table-prefix", db.prefix, *args], prog_name="dblockrun")


@pytest.fixture
def sqlite_store(sqlite_db: TestDb) -> Iterator[Store]:
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        yield store


def age_host(store: Store, host_id: str, seconds: float) -> None:
    """The host's last heartbeat, moved ``seconds`` into the past (a host killed then)."""
    hosts = store.t.hosts
    with store.engine.connect() as conn:
        conn.execute(hosts.update().where(hosts.c.id == host_id)
                     .values(last_seen=hosts.c.last_seen - seconds))


def beat(store: Store, host_id: str, jobs: list[str], running: int = 0) -> None:
    store.heartbeat_host(host_id, hostname=host_id.split(":")[0], pid=1, version="0.1.0",
                         clock_offset=0.0, running=running,
                         jobs=json.dumps(dict.fromkeys(jobs, "d1")))


# -- the table, at a fixed time -------------------------------------------------------


def test_status_table_at_100_columns() -> None:
    text = output.status_text(fleet_jobs(), [host(WEB1, {LONG: "a", "backup": "b"},
                                                  clock_offset=-0.00004)], NOW, 15.0, 100)
    # 43 + 9 + 15 + 5 + 17 + 9 columns and the gaps: as narrow as it gets
    # without breaking a word, so wider than asked.
    assert text == f"""\
jobs
job                                          state      holder           token  last run           next run
-------------------------------------------- ---------- ---------------- ------ ------------------ ---------
{LONG}  running    web-3:77:0b1d2e  42     ok exit 0 in       21:54:17Z
                                                        until 21:53:42Z         1.52s, 21:48:17Z   (in 1m)
                                                        (in 25.0s)              (5m ago) on
                                                                                web-1:4121:9f2c1a
backup                                       idle       -                7      failed exit 3 in   00:53:17Z
                                                                                1m35s, 2026-11-20  (in 3h)
                                                                                21:53Z (2d ago)
                                                                                on
                                                                                web-3:77:0b1d2e
move-to-cold                                 disabled   -                3      -                  disabled
                                             until
                                             00:53:17Z
                                             (in 3h):
                                             disk full

live hosts (a heartbeat in the last 15s)
host               pid   version  last seen             clock offset  running
------------------ ----- -------- --------------------- ------------- -------
web-1:4121:9f2c1a  4121  0.1.0    21:53:13Z (4.0s ago)  0.0 ms        1
"""  # noqa: E501 (the table as printed)


def test_status_table_fits_160_columns_on_one_line_per_job() -> None:
    text = output.status_text(fleet_jobs()[1:], [], NOW, 15.0, 160)
    assert text.splitlines()[:5] == [
        "jobs",
        "job           state                                        holder  token  "
        "last run                                                               next run",
        "------------- -------------------------------------------- ------- ------ "
        "---------------------------------------------------------------------- --------------",
        "backup        idle                                         -       7      "
        "failed exit 3 in 1m35s, 2026-11-20 21:53Z (2d ago) on web-3:77:0b1d2e  no live daemon",
        "move-to-cold  disabled until 00:53:17Z (in 3h): disk full  -       3      "
        "-                                                                      disabled",
    ]


@pytest.mark.parametrize("width", [20, 40, 80])
def test_status_table_never_breaks_a_word_or_a_header(width: int) -> None:
    """Nor drops a column: rich, asked to fit less than the words need, leaves some out."""
    text = output.status_text(fleet_jobs(), [], NOW, 15.0, width)
    lines = text.splitlines()
    assert lines[1].split() == ["job", "state", "holder", "token", "last", "run", "next", "run"]
    assert lines[1].split("  ")[0] == "job"
    assert [line.split()[0] for line in lines[3:] if line[:1] not in ("", " ")][:3] == [
        LONG, "backup", "move-to-cold"]
    for word in ("web-3:77:0b1d2e", "web-1:4121:9f2c1a", "disabled", "(in 25.0s)"):
        assert word in text


def test_status_table_fits_80_columns_when_its_words_do() -> None:
    """rich narrows the widest columns first, then widens again those below
    their longest word: asked for 80 columns it drew this table 83 wide."""
    hosts = ["web-1:1001:ab12cd", "web-2:1002:ef34ab"]
    jobs = [JobStatus(lock(name, holder=hosts[i % 2] if i % 3 == 0 else None,
                           lock_until=NOW + 25 if i % 3 == 0 else None, token=i,
                           next_due=NOW + 60 * i + 5),
                      last_run=run(i, name, host=hosts[(i + 1) % 2]), running=None, db_now=NOW)
            for i, name in enumerate(["backup-0", "report-daily-1", "cleanup-tmp-2",
                                      "sync-inventory-3"])]
    names = {s.lock.name: "a" for s in jobs}
    text = output.status_text(jobs, [host(h, names) for h in hosts], NOW, 15.0, 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) == 80
    assert lines[1].split() == ["job", "state", "holder", "token", "last", "run", "next", "run"]
    assert [line.split()[0] for line in lines[3:] if line[:1] not in ("", " ")][:4] == [
        "backup-0", "report-daily-1", "cleanup-tmp-2", "sync-inventory-3"]
    # holder, last run (twice), live hosts: never cut
    assert [text.split().count(h) for h in hosts] == [4, 4]


def rich_cell_by_cell(headers: tuple[str, ...], rows: list[list[str]], whole: tuple[str, ...],
                      width: int | None) -> str:
    """The table as rich draws it given a Text a cell and the columns' least
    widths, measuring every cell (what output.py did before: 0.1 ms a cell)."""
    from rich.cells import cell_len
    from rich.text import Text

    page = output._Page(width)
    columns = list(zip(*rows, strict=True))
    least = None if width is None else [
        max(cell_len(h), max(map(cell_len, c)) if h in whole else output._longest_word(c))
        for h, c in zip(headers, columns, strict=True)]
    table = output._new_table(headers, whole, least=least)
    if width is not None:
        proxy = output._new_table(headers, whole, least=least)
        proxy.add_row(*(Text(max(c, key=cell_len)) for c in columns))
        table.width = page._fit(proxy)
    for row in rows:
        table.add_row(*map(Text, row))
    page.console.print(table, crop=False)
    return page.text()


def random_rows(seed: int) -> list[list[str]]:
    """Names that never wrap, cells of one word to a dozen, empty ones, wide characters."""
    rnd = random.Random(seed)

    def words(most: int) -> str:
        return " ".join("".join(rnd.choice("abcxyz-:名") for _ in range(rnd.randint(1, 9)))
                        for _ in range(rnd.randint(0, most)))

    return [[f"job-{rnd.randint(0, 10 ** rnd.randint(1, 12))}", words(3), words(12),
             str(rnd.randint(0, 99)), words(1)] for _ in range(40)]


@pytest.mark.parametrize("width", [None, 30, 50, 80, 120, 200])
@pytest.mark.parametrize("seed", range(4))
def test_tables_are_what_rich_draws_cell_by_cell(seed: int, width: int | None) -> None:
    """The widths rich decides on the longest cells, the wrapped cells and
    the rows drawn a column at a time are rich's table drawn cell by cell."""
    headers, whole = ("job", "state", "last run", "token", "x"), ("job", "token")
    rows = random_rows(seed)
    page = output._Page(width)
    page.table(headers, rows, whole)
    assert page.text() == rich_cell_by_cell(headers, rows, whole, width)


def test_a_table_without_rows_is_its_headers_and_rule() -> None:
    assert output.history_text([], None) == (
        "runs\n"
        "id  job  item  host  slot  token  attempt  started  duration  exit  result\n"
        "--- ---- ----- ----- ----- ------ -------- -------- --------- ----- ------\n")
    assert output.status_text([], [], NOW, 15.0, 80).startswith(
        "jobs\n"
        "job  state  holder  token  last run  next run\n"
        "---- ------ ------- ------ --------- --------\n"
        "\n"
        "live hosts")


def test_rich_lays_out_a_column_at_a_time_not_a_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 jobs took rich 6 s when it laid out each of their 60,000 cells."""
    from rich.text import Text

    drawn = 0
    draw = Text.__rich_console__

    def counted(self: Text, *args: Any) -> Any:
        nonlocal drawn
        drawn += 1
        return draw(self, *args)

    monkeypatch.setattr(Text, "__rich_console__", counted)
    jobs = [JobStatus(lock(f"job-{i}", token=i, next_due=NOW + i), last_run=run(i, f"job-{i}"),
                      running=None, db_now=NOW) for i in range(2000)]
    text = output.status_text(jobs, [host(WEB1, {})], NOW, 15.0, None)
    assert len(text.splitlines()) == 2000 + 8
    assert drawn < 50


def test_markup_emoji_and_control_characters_are_shown_as_typed() -> None:
    name = "[bold]deploy[/bold]:smile:"
    reason = "[red]disk[/red] full\x1b[31m\tsee ops\n"
    jobs = [JobStatus(lock(name, token=1, disabled_until=NOW + 60, disabled_reason=reason),
                      last_run=run(3, name, host="[i]web[/i]:1:aa"), running=None, db_now=NOW)]
    hosts = [host(WEB1, {name: "a"}), host(WEB3, {name: "b"})]
    for text in (output.status_text(jobs, hosts, NOW, 15.0, None),
                 output.status_text(jobs, hosts, NOW, 15.0, 60),
                 output.history_text([run(3, name, host="[i]web[/i]:1:aa", item="[b]x")], 60)):
        assert "\x1b" not in text and "\t" not in text
        assert name in text and "[i]web[/i]:1:aa" in text
    text = output.status_text(jobs, hosts, NOW, 15.0, None)
    assert "[red]disk[/red] full\\x1b[31m\\tsee ops\\n  -" in text
    assert f"warning: job {name} is defined differently: a on {WEB1}; b on {WEB3}" in text


def test_the_width_is_columns_when_piped_else_unbounded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert output.terminal_width() is None  # pytest's stdout is not a terminal
    monkeypatch.setenv("COLUMNS", "123")
    assert output.terminal_width() == 123


def test_history_table_has_item_and_attempt_columns() -> None:
    runs = [run(9, "fan", item="eu-west", attempt=2, slot=NOW - 60, started=NOW - 59.5,
                finished=NOW - 58.25, exit_code=1, result="failed"),
            run(8, "backup", token=None, slot=None, finished=None, exit_code=None,
                result="running")]
    assert output.history_text(runs, 160) == """\
runs
id  job     item     host               slot                  token  attempt  started               duration  exit  result
--- ------- -------- ------------------ --------------------- ------ -------- --------------------- --------- ----- -------
9   fan     eu-west  web-1:4121:9f2c1a  2026-11-22 21:52:17Z  1      2        2026-11-22 21:52:17Z  1.25s     1     failed
8   backup  -        web-1:4121:9f2c1a  -                     -      1        2026-11-22 21:48:17Z  -         -     running
"""  # noqa: E501 (the table as printed)


@pytest.mark.parametrize(("seconds", "shown"), [
    (-0.00004, "0.0 ms"), (0.0, "0.0 ms"), (0.00004, "0.0 ms"), (-0.0021, "-2.1 ms"),
    (0.01234, "+12.3 ms"), (None, "-")])
def test_clock_offset_has_no_negative_zero(seconds: float | None, shown: str) -> None:
    assert output.clock_offset(seconds) == shown


# -- the command, on a database ----------------------------------------------------------


def test_status_says_no_live_daemons_and_shows_no_time_in_the_past(
        sqlite_store: Store, sqlite_db: TestDb) -> None:
    store = sqlite_store
    store.ensure_jobs(["report", "backup"])
    store.set_next_due({"report": store.db_now() - 5})
    store.disable("backup", reason="disk full")
    beat(store, "web-1:1:aa", ["report", "backup"], running=1)
    age_host(store, "web-1:1:aa", 20)  # killed 20 s ago
    result = invoke(sqlite_db, "status", columns=200)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"""\
database: {sqlite_db.url} (table prefix {sqlite_db.prefix})
jobs
job     state                              last run  next run
------- ---------------------------------- --------- --------------
backup  disabled until enabled: disk full  -         disabled
report  idle                               -         no live daemon

live hosts (a heartbeat within 1.5 of its --heartbeat, 15s by default): none

warning: no live daemons: no daemon has sent a heartbeat within 1.5 of its --heartbeat, 15s by \
default, so no job starts on schedule
"""
    doc = json.loads(invoke(sqlite_db, "status", "--json").stdout)
    assert doc["hosts"] == []
    assert doc["warnings"] == ["no live daemons: no daemon has sent a heartbeat within 1.5 of "
                               "its --heartbeat, 15s by default, so no job starts on schedule"]
    assert [(j["name"], j["next_run"], j["next_run_note"]) for j in doc["jobs"]] == [
        ("backup", None, "disabled"), ("report", None, "no live daemon")]


def test_a_longer_live_within_lists_a_host_silent_for_20s(
        sqlite_store: Store, sqlite_db: TestDb) -> None:
    beat(sqlite_store, "web-1:1:aa", [])
    age_host(sqlite_store, "web-1:1:aa", 20)
    beat(sqlite_store, "web-2:1:bb", [])
    ids = [[h["id"] for h in json.loads(invoke(sqlite_db, "status", "--json", *extra).stdout)
            ["hosts"]] for extra in ([], ["--live-within", "30s"])]
    assert ids == [["web-2:1:bb"], ["web-1:1:aa", "web-2:1:bb"]]


def test_json_and_table_agree_on_an_idle_job_a_dead_host_held(
        sqlite_store: Store, sqlite_db: TestDb) -> None:
    store = sqlite_store
    store.ensure_jobs(["backup", "orphan"])
    won = store.claim_and_record("backup", "web-3:9:cc", 30)
    assert won is not None
    locks = store.t.locks
    with store.engine.connect() as conn:  # its lease ran out: the host died
        conn.execute(locks.update().values(lock_until=locks.c.lock_until - 60))
    store.set_next_due({"backup": store.db_now() + 3600, "orphan": store.db_now() + 60})
    beat(store, "web-1:1:aa", ["backup"])
    doc = json.loads(invoke(sqlite_db, "status", "--json").stdout)
    backup, orphan = doc["jobs"]
    assert (backup["state"], backup["holder"], backup["lock_until"], backup["running"]) == (
        "idle", None, None, None)
    assert backup["next_run_note"] is None and backup["next_run"] is not None
    assert (orphan["next_run"], orphan["next_run_note"]) == (None, "no live daemon has this job")
    assert doc["warnings"] == []
    table = invoke(sqlite_db, "status", "--wide", columns=200).stdout.splitlines()
    backup_row = next(line for line in table if line.startswith("backup "))
    assert backup_row.split()[:4] == ["backup", "idle", "-", "1"]
    assert next(line for line in table if line.startswith("orphan ")).endswith(
        "  no live daemon has this job")


def test_last_run_names_its_host(sqlite_store: Store, sqlite_db: TestDb) -> None:
    sqlite_store.ensure_jobs(["backup"])
    won = sqlite_store.claim_and_record("backup", "web-3:9:cc", 30)
    assert won is not None and won.run_id is not None
    sqlite_store.finish_and_release(won.run_id, "backup", "web-3:9:cc", won.token, "ok", 0, "")
    table = invoke(sqlite_db, "status", "--wide", columns=300).stdout.splitlines()
    row = next(line for line in table if line.startswith("backup "))
    assert re.search(r"  ok exit 0 in \d+\.\d\ds, \d\d:\d\d:\d\dZ \(\d+\.\ds ago\) "
                     r"on web-3:9:cc  ", row), row


def test_piped_status_keeps_each_row_on_one_line_and_follows_columns(
        sqlite_store: Store, sqlite_db: TestDb) -> None:
    reason = "the bucket is being migrated to the new region, ask ops before enabling"
    sqlite_store.disable(LONG, reason=reason)
    piped = invoke(sqlite_db, "status", "--wide").stdout.splitlines()
    assert piped[4] == (
        f"{LONG}  disabled until enabled: {reason}  -       0      -         disabled")
    narrow = invoke(sqlite_db, "status", "--wide", columns=100).stdout.splitlines()
    assert max(len(line) for line in narrow[1:]) <= 100  # [0]: the database
    assert narrow[4].split()[0] == LONG


def test_history_shows_item_and_attempt(sqlite_store: Store, sqlite_db: TestDb) -> None:
    run_id = sqlite_store.start_run("fan", "web-1:1:aa", token=None, attempt=2, item="eu-west")
    sqlite_store.finish_run(run_id, "fan", None, "failed", 1, "boom")
    text = invoke(sqlite_db, "history", columns=200).stdout
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", "YYYY-MM-DD HH:MM:SSZ", text)
    text = re.sub(r"\d\.\d\ds ", "D.DDs ", text)
    assert text.splitlines()[1:] == [
        "id  job  item     host        slot  token  attempt  started               duration  "
        "exit  result",
        "--- ---- -------- ----------- ----- ------ -------- --------------------- --------- "
        "----- ------",
        "1   fan  eu-west  web-1:1:aa  -     -      2        YYYY-MM-DD HH:MM:SSZ  D.DDs     "
        "1     failed",
    ]


# -- statements -----------------------------------------------------------------------------


def fill(store: Store, prefix: str, count: int) -> None:
    """``count`` jobs, each with a finished run and a running one; every
    third a fan-out job with items."""
    names = [f"{prefix}{i:04d}" for i in range(count)]
    store.ensure_jobs(names)
    for name in names:
        done = store.claim_and_record(name, "h:1:a", 30)
        assert done is not None and done.run_id is not None
        store.finish_and_release(done.run_id, name, "h:1:a", done.token, "ok", 0, "")
        assert store.claim_and_record(name, "h:1:a", 30) is not None
    for name in names[::3]:
        store.items.sync(name, ["x", "y"])


def statements_of(store: Store, call: Any) -> int:
    before = store.statements
    call()
    return store.statements - before


def test_status_sends_the_same_statements_for_1_job_and_for_60(store: Store) -> None:
    fill(store, "one-", 1)
    report(store)  # the schema is checked once per store, before
    one = statements_of(store, lambda: report(store))
    fill(store, "many-", 59)
    assert len(report(store).jobs) == 60
    many = statements_of(store, lambda: report(store))
    # The jobs with their runs and items (3), the hosts and the pause.
    assert (one, many) == (5, 5)


def test_status_reads_last_and_running_runs_and_item_counts(store: Store) -> None:
    store.ensure_jobs(["a", "b", "fan"])
    first = store.claim_and_record("a", "h:1:a", 30)
    assert first is not None and first.run_id is not None
    store.finish_and_release(first.run_id, "a", "h:1:a", first.token, "failed", 2, "")
    current = store.claim_and_record("a", "h:1:a", 30)
    assert current is not None
    # b: a run left `running` under an old token, then a newer finished one.
    stale = store.claim_and_record("b", "h:2:b", 30)
    assert stale is not None
    store.force_unlock("b")
    store.start_run("b", "h:3:c", token=None, result="ok")
    store.items.sync("fan", ["i1", "i2", "i3", "i4"])
    items, locks = store.t.items, store.t.locks
    now = store.db_now()
    with store.engine.connect() as conn:
        conn.execute(locks.update().where(locks.c.name == "fan").values(last_slot=100.0))
        for item, values in (("i1", {"lock_until": now + 60, "last_result": "running",
                                      "last_slot": 100.0}),
                             ("i2", {"last_result": "failed", "last_slot": 100.0}),
                             ("i3", {"last_result": "ok", "last_slot": 100.0}),
                             ("i4", {"last_result": "ok", "last_slot": 50.0})):
            conn.execute(items.update().where(items.c.job == "fan", items.c.item == item)
                         .values(**values))
        conn.execute(sa.text("SELECT 1"))
    a, b, fan = report(store).jobs
    assert a.last_run is not None and a.running is not None
    assert (a.state, a.last_run.id, a.last_run.result, a.last_run.exit_code) == (
        "running", first.run_id, "failed", 2)
    assert (a.running.id, a.running.token) == (current.run_id, current.token)
    assert b.last_run is not None
    assert (b.state, b.running, b.last_run.host, b.last_run.result) == (
        "idle", None, "h:3:c", "ok")
    assert (a.items, b.items) == (None, None)
    assert fan.items == {"total": 4, "done": 1, "running": 1, "waiting": 1, "failed": 1}
    assert [s.lock.name for s in report(store, ["fan", "a"]).jobs] == ["a", "fan"]


# -- issue 23, item 7: status --check and forget ------------------------------------------


def finished(store: Store, job: str, result: str, exit_code: int | None) -> int:
    """A run of ``job`` that ended ``result`` (exit ``exit_code``); its id."""
    store.ensure_jobs([job])
    won = store.claim_and_record(job, "web-1:7:ab", 30)
    assert won is not None and won.run_id is not None
    store.finish_and_release(won.run_id, job, "web-1:7:ab", won.token, result, exit_code,
                             None, 0.0)
    return won.run_id


def test_status_check_is_a_monitoring_exit_status(db: TestDb, store: Store) -> None:
    store.ensure_schema()
    result = invoke(db, "status", "--check")
    assert (result.exit_code, result.stdout) == (1, (
        "problem: no live daemon: none sent a heartbeat within 1.5 of its --heartbeat, 15s by "
        "default, so no job starts on schedule\n"))
    beat(store, "web-1:7:ab", ["backup", "report", "cleanup"])
    store.ensure_jobs(["cleanup"])
    result = invoke(db, "status", "--check")
    assert (result.exit_code, result.stdout) == (
        0, f"ok: 1 job(s), 1 live daemon(s) in {db.url} (table prefix {db.prefix})\n")

    failed = finished(store, "backup", "failed", 3)
    finished(store, "report", "ok", 0)
    locks = store.t.locks
    with store.engine.connect() as conn:  # started 3h ago, next planned 2h ago: a 1h period
        conn.execute(locks.update().where(locks.c.name == "report").values(
            last_start=store.now - 3 * 3600, next_due=store.now - 2 * 3600))
    result = invoke(db, "status", "--check")
    assert result.exit_code == 1
    # "0s ago" and "3h" when the check runs within half a second (not under load)
    assert re.fullmatch(
        rf"problem: job backup: last run {failed} failed \(exit 3\) on web-1:7:ab, [0-9]s ago\n"
        r"problem: job report: has not started for 3h(?:[0-9]s)?, more than twice its period "
        r"\(1h\)\n", result.stdout), result.stdout
    doc = json.loads(invoke(db, "status", "--check", "--json").stdout)
    assert (doc["ok"], len(doc["problems"])) == (False, 2)
    # Disabled jobs are an operator's choice, not a problem; a paused fleet
    # is one (issue 36 item 1: a forgotten pause is a silent outage) unless
    # the check is told to accept it.
    assert invoke(db, "disable", "backup").exit_code == 0
    assert invoke(db, "pause").exit_code == 0
    result = invoke(db, "status", "--check")
    assert result.exit_code == 1 and result.stdout.startswith("problem: fleet paused by ")
    assert invoke(db, "status", "--check", "--allow", "paused").exit_code == 0


def test_forget_removes_a_job_no_live_daemon_defines(db: TestDb, store: Store) -> None:
    where = f"{db.url} (table prefix {db.prefix})"
    store.heartbeat_host("web-1:7:ab", hostname="web-1", pid=1, version="0.1.0",
                         clock_offset=0.0, running=0, jobs=json.dumps({"backup": "d1",
                                                                      "rotate": "d2"}),
                         labels=json.dumps({"hostname": "web-1"}))
    finished(store, "oneoff", "ok", 0)
    store.ensure_jobs(["backup", "rotate", "rotate@web-1", "rotate@old-host"])

    result = invoke(db, "forget", "backup")
    assert (result.exit_code, result.stderr) == (2, (
        "dblockrun: live daemon web-1:7:ab has backup in its jobs file: forget is for jobs no "
        "live daemon defines (remove it from the file and reload first)\n"))
    assert invoke(db, "forget", "rotate@web-1").exit_code == 2
    assert invoke(db, "forget", "oneof").stderr.endswith(": oneof (did you mean oneoff?)\n")

    won = store.claim_and_record("oneoff", "web-2:8:cd", 30)  # an exec of it, running
    assert won is not None
    result = invoke(db, "forget", "oneoff")
    assert (result.exit_code, result.stderr) == (1, (
        "dblockrun: oneoff is held (a run may be going on): wait for it to end, or "
        "`dblockrun kill oneoff`, then forget it\n"))
    assert won.run_id is not None
    store.finish_and_release(won.run_id, "oneoff", "web-2:8:cd", won.token, "ok", 0, None, 0.0)
    result = invoke(db, "forget", "oneoff")
    assert (result.exit_code, result.stdout) == (
        0, f"oneoff forgotten in {where}: 1 lock row(s) and 2 run(s) deleted\n")
    assert invoke(db, "forget", "rotate@old-host").stdout == (
        f"rotate@old-host forgotten in {where}: 1 lock row(s) and 0 run(s) deleted\n")
    assert [s.lock.name for s in report(store).jobs] == ["backup", "rotate", "rotate@web-1"]
    assert store.history("oneoff") == []
    assert [(e.action, e.job) for e in store.control.entries()] == [
        ("forget", "rotate@old-host"), ("forget", "oneoff")]


# -- issue 23, item 7: 80 columns by default, --wide, colours ----------------------------------


NARROW = """\
jobs
job             state                       last run               next run
--------------- --------------------------- ---------------------- --------
scrape-website  running on web-3            ok, 5m ago             in 1m
backup          idle                        failed exit 3, 2d ago  in 3h
move-to-cold    disabled for 3h: disk full  -                      disabled

live hosts (a heartbeat in the last 15s)
host               last seen  clock offset  running
------------------ ---------- ------------- -------
web-1:4121:9f2c1a  4.0s ago   +2.1 ms       1
"""


@pytest.mark.parametrize("width", [80, 120, None])
def test_the_default_table_fits_80_columns_one_line_a_job(width: int | None) -> None:
    """It was 200 columns piped, and 3 to 4 lines a job at 80 (issue 23,
    item 7): holder, token, absolute times, pid and version are --wide's."""
    jobs = fleet_jobs()
    jobs[0] = JobStatus(
        lock("scrape-website", holder=WEB3, lock_until=NOW + 25, token=42, next_due=NOW + 60),
        last_run=run(17, "scrape-website", token=41),
        running=run(18, "scrape-website", host=WEB3, token=42, started=NOW - 5, finished=None,
                    exit_code=None, result="running"), db_now=NOW)
    text = output.status_text(jobs, [host(WEB1, {"scrape-website": "a", "backup": "b"})], NOW,
                              15.0, width, wide=False)
    assert text == NARROW


def test_status_wide_shows_every_fact(sqlite_store: Store, sqlite_db: TestDb) -> None:
    sqlite_store.ensure_jobs(["backup"])
    narrow = invoke(sqlite_db, "status").stdout.splitlines()
    wide = invoke(sqlite_db, "status", "--wide").stdout.splitlines()
    assert narrow[2].split() == ["job", "state", "last", "run", "next", "run"]
    assert wide[2].split() == ["job", "state", "holder", "token", "last", "run", "next", "run"]


def test_failed_lost_disabled_and_paused_are_coloured_on_a_terminal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    red, yellow, reset = "\x1b[31m", "\x1b[33m", "\x1b[0m"
    assert output.coloured("backup  idle  failed exit 3, 2d ago  disabled\n"
                           "x  lost, 1m ago  fleet paused\nfailed-import  timeout\n") == (
        f"backup  idle  {red}failed{reset} exit 3, 2d ago  {yellow}disabled{reset}\n"
        f"x  {red}lost{reset}, 1m ago  fleet {yellow}paused{reset}\n"
        f"failed-import  {red}timeout{reset}\n")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert output.use_colour()
    monkeypatch.setenv("NO_COLOR", "1")
    assert not output.use_colour()
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert not output.use_colour()  # piped: plain text


def _watch(db: TestDb, stdout: int) -> subprocess.Popen[bytes]:
    from helpers import clean_env, sigint_default

    return subprocess.Popen([*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix,
                             "status", "--watch"],
                            stdout=stdout, stderr=subprocess.PIPE, env=clean_env(),
                            preexec_fn=sigint_default)


def _interrupt(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None and proc.stderr.read() == b""


def test_status_watch_redraws_in_place_until_ctrl_c(sqlite_store: Store,
                                                    sqlite_db: TestDb) -> None:
    """On a terminal (a pty) each table is drawn over the last."""
    import os
    import pty
    import select

    from helpers import wait_for

    sqlite_store.ensure_jobs(["backup"])
    main, child = pty.openpty()
    try:
        proc = _watch(sqlite_db, child)
        os.close(child)
        seen = b""

        def frames() -> list[str] | None:
            nonlocal seen
            if select.select([main], [], [], 0.1)[0]:
                seen += os.read(main, 65536)
            got = seen.decode().replace("\r\n", "\n").split(output.REDRAW)[1:]
            return got if len(got) >= 3 else None

        found = wait_for(frames, 20, what="two frames")
        _interrupt(proc)
    finally:
        os.close(main)
    assert found[0].startswith(f"database: {sqlite_db.url} (table prefix {sqlite_db.prefix})"
                               "\njobs\n")
    assert "\nbackup  idle " in found[0]
    result = invoke(sqlite_db, "status", "--watch", "--json")
    assert (result.exit_code, result.stderr) == (
        2, "dblockrun: --watch draws the table: not with --json or --check\n")


def test_status_watch_piped_writes_no_escape_sequences(sqlite_store: Store,
                                                       sqlite_db: TestDb) -> None:
    """Issue 36 item 8: ``status --watch | cat`` (or into a file) gets one
    table after another, separated by a blank line: no clear-screen codes."""
    from helpers import wait_for

    sqlite_store.ensure_jobs(["backup"])
    out = Path(sqlite_db.url.removeprefix("sqlite:///")).with_name("watch.out")
    with out.open("wb") as stream:
        proc = _watch(sqlite_db, stream.fileno())
    try:
        # A third table begun: the first two are whole (a read can catch one mid-write).
        text = wait_for(lambda: t if (t := out.read_text()).count("database: ") >= 3 else None,
                        30, what="three tables")
    finally:
        _interrupt(proc)
    assert "\x1b" not in out.read_text()
    first, second = text.split("\n\ndatabase: ")[:2]
    assert first.startswith(f"database: {sqlite_db.url} (table prefix {sqlite_db.prefix})"
                            "\njobs\n")
    assert "\nbackup  idle " in first and "\nbackup  idle " in second


def test_a_failed_attempt_waiting_for_its_retry_reads_retrying(store: Store) -> None:
    """Between a failed attempt and its retry the holder keeps the lock and
    no command runs: the job reads `retrying`, not an unexplained `locked`;
    once the retry starts it is `running` again, and after the release `idle`."""
    store.ensure_jobs(["job"])
    token = store.claim("job", "h1", 30)
    assert token is not None
    first = store.start_run("job", "h1", token=token)
    assert store.finish_run(first, "job", token, "failed", 1, "")
    assert report(store, ["job"]).jobs[0].state == "retrying"
    retry = store.start_run("job", "h1", token=token, attempt=2)
    assert report(store, ["job"]).jobs[0].state == "running"
    assert store.finish_run(retry, "job", token, "ok", 0, "")
    assert store.release("job", "h1", token)
    assert report(store, ["job"]).jobs[0].state == "idle"


# -- issue 23, item 12: liveness by each daemon's own heartbeat ------------------------------


def test_a_host_is_live_by_its_own_heartbeat(db: TestDb, store: Store) -> None:
    """A daemon publishes its --heartbeat: one with 1 s heartbeats killed 14 s
    ago is not live (it was, with its `running 1`, under a fixed 15 s); one
    with 1 s heartbeats seen 3 s ago is; a row of an older daemon (no
    heartbeat) is live for 15 s, as before."""
    hosts = {"fast-dead:1:aa": (1.0, 14), "fast:2:bb": (1.0, 3),
             "old:3:cc": (None, 14), "slow:4:dd": (60.0, 80), "slow-dead:5:ee": (60.0, 95)}
    for host_id, (heartbeat, age) in hosts.items():
        store.heartbeat_host(host_id, hostname=host_id.split(":")[0], pid=1, version="0.1.0",
                             clock_offset=0.0, running=1, jobs="{}", heartbeat=heartbeat)
        age_host(store, host_id, age)
    doc = json.loads(invoke(db, "status", "--json").stdout)
    assert [(h["id"], h["heartbeat"], h["live_within"]) for h in doc["hosts"]] == [
        ("fast:2:bb", 1.0, 4.0), ("old:3:cc", None, 15.0), ("slow:4:dd", 60.0, 90.0)]
    assert doc["live_within"] is None
    # --live-within still decides for every host when given.
    doc = json.loads(invoke(db, "status", "--json", "--live-within", "10s").stdout)
    assert [h["id"] for h in doc["hosts"]] == ["fast:2:bb"]


def test_a_killed_daemon_with_1s_heartbeats_leaves_status_within_seconds(
        sqlite_db: TestDb, sqlite_fleet: Fleet) -> None:
    proc = sqlite_fleet.start("jobs:\n  yearly: {cron: '0 0 1 1 *', command: 'true'}\n",
                              grace=None)
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        live = wait_for(lambda: store.live_hosts() or None, 30, what="the daemon's host row")
        assert [h.heartbeat for h in live] == [1.0]
        assert "live hosts (a heartbeat in the last 4s)" in invoke(sqlite_db, "status").stdout
        proc.kill()
        killed = time.monotonic()
        # Gone 4 s after its last round, well before a fixed 15 s.
        wait_for(lambda: not store.live_hosts(), 10, what="the killed daemon not live")
        assert time.monotonic() - killed < 10


# -- a host's running count agrees with the jobs' states ------------------------------------


def test_a_host_runs_what_its_jobs_show_running_not_what_it_last_published(
        db: TestDb, store: Store) -> None:
    """A daemon publishes how many runs it has at each bookkeeping round (a
    heartbeat apart): between two rounds `status` showed `slow running on
    host-b` above `host-b ... running 0`. The hosts' count is read with the
    jobs' runs: a run started since the last round counts (a fan-out's
    items each too), one ended since does not."""
    b, c = "host-b:7:bb", "host-c:8:cc"
    store.ensure_jobs(["slow", "quick", "fan"])
    beat(store, b, ["slow", "quick", "fan"], running=0)  # its last round: nothing running
    beat(store, c, ["slow", "quick", "fan"], running=1)  # its last round: `quick` running
    slow = store.claim_and_record("slow", b, 60)
    quick = store.claim_and_record("quick", c, 60)
    assert slow is not None and quick is not None and quick.run_id is not None
    store.finish_and_release(quick.run_id, "quick", c, quick.token, "ok", 0, None, 0.0)
    store.items.sync("fan", ["i1", "i2"])
    items = store.items.claim("fan", b, 60, slot=store.db_now() - 0.5, rate=None, limit=2)
    assert len(items) == 2  # each with its run record, running

    doc = json.loads(invoke(db, "status", "--json").stdout)
    jobs = {j["name"]: j for j in doc["jobs"]}
    assert (jobs["slow"]["state"], jobs["slow"]["running"]["host"]) == ("running", b)
    assert jobs["quick"]["state"] == "idle"
    assert {h["id"]: h["running"] for h in doc["hosts"]} == {b: 3, c: 0}
    # The table says the same, and so does the status of one job.
    text = invoke(db, "status").stdout
    assert "running on host-b" in text
    assert re.search(rf"^{re.escape(b)} .* 3$", text, re.M), text
    assert re.search(rf"^{re.escape(c)} .* 0$", text, re.M), text
    assert {h.id: h.running for h in report(store, ["quick"]).hosts} == {b: 3, c: 0}


def test_the_hosts_page_counts_a_live_hosts_runs_as_status_does(store: Store) -> None:
    """The dashboard's Hosts page says the same as `status` of a live host
    whose last round is older than its run; a dead host keeps the count it
    last published (the page lists it, not live)."""
    from starlette.testclient import TestClient
    from webtools import app_for

    b, dead = "host-b:7:bb", "host-d:9:dd"
    store.ensure_jobs(["slow"])
    beat(store, b, ["slow"], running=0)
    beat(store, dead, ["slow"], running=2)
    age_host(store, dead, 600)
    assert store.claim_and_record("slow", b, 60) is not None
    page = TestClient(app_for(store, None)).get("/hosts").text  # (no users: open to anyone)
    rows = dict(re.findall(r'<span class="host">([^<]+)</span>.*?'
                           r'<td data-label="running">(\d+)</td>', page))
    assert rows == {b: "1", dead: "2"}
    assert {h.id: h.running for h in report(store).hosts} == {b: 1}
