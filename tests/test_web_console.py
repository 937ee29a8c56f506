"""The dashboard as a console (issue 31 items 4-7): the Job and Run pages'
live parts, the duration chart's axes and results, the fleet timeline, the
jobs file read again on SIGHUP and when it changes, what the server logs,
and ``dblockrun web`` without its extra. (What a person sees in a browser:
test_web_browser.py.)"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import TestDb, http_get, wait_for
from starlette.testclient import TestClient
from webtools import PASSWORD, app_for, csrf_of, start_web, users_file

from dblockrun.cli import cli
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.web.chart import duration_chart
from dblockrun.web.timeline import draw


def record(store: Store, job: str, host: str, started: float, finished: float | None,
           result: str, slot: float | None = None) -> int:
    """A run row as a daemon leaves it (times chosen by the test); its id."""
    store.ensure_jobs([job])
    runs = store.t.runs
    with store.engine.begin() as conn:
        got = conn.execute(runs.insert().values(
            job=job, item=None, host=host, slot=slot if slot is not None else started,
            token=1, attempt=1, started=started, finished=finished,
            exit_code=None if finished is None else (0 if result == m.OK else 1),
            result=result, output="done\n"))
        key = got.inserted_primary_key
        assert key is not None
        return int(key[0])


def signed_in(store: Store, tmp_path: Path) -> TestClient:
    client = TestClient(app_for(store, users_file(tmp_path / "users.yaml")))
    client.post("/login", data={"name": "vera", "password": PASSWORD, "next": "/",
                                "csrf": csrf_of(client.get("/login").text)})
    return client


# -- item 7: without the extra ---------------------------------------------------------


@pytest.mark.parametrize("args", [["web"], ["web", "hash-password"]])
@pytest.mark.parametrize("module", ["uvicorn", "argon2"])
def test_web_without_its_extra_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch, sqlite_db: TestDb, args: list[str],
        module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    result = CliRunner().invoke(cli, ["--db", sqlite_db.url, *args], input="pw\n")
    assert result.exit_code == 2
    assert result.output == (f"dblockrun: dblockrun web needs the web extra ({module} is "
                             f"missing): pip install 'dblockrun[web]', or in a checkout: "
                             f"pipx install --force '.[web]'\n")


# -- item 4: the chart -----------------------------------------------------------------


def run(run_id: int, started: float, took: float | None, result: str,
        host: str = "h1") -> m.RunRecord:
    return m.RunRecord(id=run_id, job="j", item=None, host=host, slot=started, token=1,
                       attempt=1, started=started,
                       finished=None if took is None else started + took, exit_code=None,
                       result=result)


def test_the_duration_chart_has_axes_with_units_and_each_runs_result() -> None:
    now = 1_800_000_000.0
    runs = [run(4, now - 60, None, m.RUNNING), run(3, now - 600, 40.0, m.FAILED),
            run(2, now - 1200, 12.5, m.OK), run(1, now - 1800, 0.25, m.OK)]  # newest first
    svg = str(duration_chart(runs, now))
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', svg)
    # y: 0, half and the top (the first step over the longest, 60 s so far);
    # x: when the first and the last run started, as the CLI words it.
    assert ticks == ["0.0s", "30.0s", "1m", "30m ago", "1m ago"]
    bars = re.findall(r'<rect class="bar r-(\w+)" data-run="(\d+)"', svg)
    assert bars == [("ok", "1"), ("ok", "2"), ("failed", "3"), ("running", "4")]
    assert "run 3: failed, 40.00s, on h1, started 10m ago" in svg
    assert "run 4: running, 1m so far" in svg
    assert len(re.findall(r'<text class="mark r-failed"', svg)) == 1  # not by colour alone
    legend = re.findall(r'<text class="legend"[^>]*>([^<]*)</text>', svg)
    assert legend == ["ok 2", "failed 1", "running 1"]
    assert '<a href="/runs/3">' in svg
    assert str(duration_chart([], now)) == ""


def test_the_chart_escapes_what_comes_from_the_database() -> None:
    svg = str(duration_chart([run(1, 0.0, 1.0, m.OK, host="<script>x</script>")], 10.0))
    assert "<script>" not in svg and "&lt;script&gt;" in svg


# -- item 4: the live parts of the Job and Run pages ------------------------------------


def test_the_job_and_run_pages_live_parts_bring_new_runs_and_a_runs_end(
        store: Store, tmp_path: Path) -> None:
    now = store.db_now()
    record(store, "backup", "h1", now - 100, now - 90, m.OK)
    client = signed_in(store, tmp_path)
    page = client.get("/jobs/backup").text
    bars = r'class="bar r-\w+" data-run'
    assert 'data-live="/jobs/backup/live"' in page and len(re.findall(bars, page)) == 1
    token = store.claim("backup", "h2", 300)  # a daemon's run, as it starts one
    assert token is not None
    running = store.start_run("backup", "h2", token=token)
    live = client.get("/jobs/backup/live")
    assert live.status_code == 200 and "<html" not in live.text
    assert len(re.findall(bars, live.text)) == 2 and f'href="/runs/{running}"' in live.text
    assert re.search(r'<time datetime="[^"]+" title="[^"]+">\d+(\.\d)?s ago</time>', live.text)
    # The Run page: polled while the run runs, its part marked final once it ended.
    assert f'data-live="/runs/{running}/live"' in client.get(f"/runs/{running}").text
    part = client.get(f"/runs/{running}/live").text
    assert "data-final" not in part and 'id="partial"' in part and "running for" in part
    assert store.finish_run(running, "backup", token, m.FAILED, 1, "boom\n")
    part = client.get(f"/runs/{running}/live").text
    assert "data-final" in part and "boom" in part and 'r-failed' in part
    assert 'id="partial"' not in part
    # Signed out: nothing; an unknown job or run: 404.
    assert TestClient(client.app).get("/jobs/backup/live").status_code == 401
    assert TestClient(client.app).get(f"/runs/{running}/live").status_code == 401
    assert client.get("/jobs/nope/live").status_code == 404
    assert client.get("/runs/999999/live").status_code == 404


# -- item 5: the timeline --------------------------------------------------------------


def test_the_timeline_draws_each_run_on_its_hosts_row_with_overlaps_in_lanes(
        store: Store, tmp_path: Path) -> None:
    now = store.db_now()
    a = record(store, "a", "web-1:100:x1", now - 1800, now - 1200, m.OK)
    b = record(store, "b", "web-1:100:x1", now - 1500, now - 1400, m.FAILED)  # overlaps a
    store.ensure_jobs(["c"])
    token = store.claim("c", "web-2:200:x2", 300)  # running, as a daemon runs it ...
    assert token is not None
    c = store.start_run("c", "web-2:200:x2", token=token)
    with store.engine.begin() as conn:  # ... for a minute now
        conn.execute(store.t.runs.update().where(store.t.runs.c.id == c).values(
            started=now - 60))
    old = record(store, "a", "web-1:100:x1", now - 7200, now - 7100, m.OK)  # before the hour
    missed = record(store, "d", "web-2:200:x2", now, now, m.MISSED, slot=now - 900)
    client = signed_in(store, tmp_path)
    page = client.get("/timeline").text
    assert 'href="/timeline"' in page  # in the nav
    assert "3 run(s) and 1 missed or skipped slot(s) on 2 host(s)" in page
    rows: dict[str, tuple[int, int]] = {
        host: (int(top), int(top) + int(height)) for host, top, height in re.findall(
        r'<g class="host" data-host="([^"]+)"><rect class="row" x="0" y="(\d+)" '
        r'width="\d+" height="(\d+)"/>', page)}
    assert list(rows) == ["web-1", "web-2"]
    bars = {run[0]: run for run in shown_runs(page)}  # (id, x, width, y, said)
    assert set(bars) == {a, b, c}  # not the run of two hours ago

    def row_of(run_id: int) -> str:
        return next(h for h, (top, bottom) in rows.items() if top <= bars[run_id][3] < bottom)

    assert (row_of(a), row_of(b), row_of(c)) == ("web-1", "web-1", "web-2")
    assert bars[a][3] != bars[b][3]  # a and b overlap: two lanes
    # Lengths in proportion: a took 600 s, b 100 s; c runs to now.
    assert bars[a][2] == pytest.approx(6 * bars[b][2], rel=0.05)
    assert bars[a][1] < bars[b][1] < bars[c][1]
    assert bars[b][4].startswith(f"b: run {b}, failed, 1m40s, from ")  # what hovering says
    assert re.match(rf"c: run {c}, running, 1m(\d+s)? so far, from ", bars[c][4])
    # Each bar a rectangle of its result's path.
    paths = dict(re.findall(r'<path class="bar r-(\w+)" d="([^"]+)"/>', page))
    assert f"M{bars[b][1]:.1f} {bars[b][3]}h{bars[b][2]:.1f}v" in paths["failed"]
    assert f"M{bars[a][1]:.1f} {bars[a][3]}h" in paths["ok"]
    assert f"M{bars[c][1]:.1f} {bars[c][3]}h" in paths["running"]
    assert f'class="passed r-missed" data-run="{missed}"' in page
    assert rows["web-2"][0] < int(re.search(  # type: ignore[union-attr]
        rf'class="passed r-missed" data-run="{missed}" d="M[\d.]+ (\d+)', page).group(1)) \
        < rows["web-2"][1]
    assert old not in bars
    # Another window, in the URL: the older run, and nothing of now.
    older = client.get("/timeline", params={"window": "15m", "end": _iso(now - 6900)}).text
    assert {run[0] for run in shown_runs(older)} == {old}
    assert "<strong>15m</strong>" in older
    assert client.get("/timeline?window=8d").status_code == 400
    assert client.get("/timeline?window=soon").status_code == 400
    assert client.get("/timeline?end=yesterday").status_code == 400


def shown_runs(page: str) -> list[tuple[int, float, float, int, str]]:
    """The timeline's data: each bar's run, x, width, y and what hovering says."""
    found = re.search(r'<script type="application/json" id="timeline-runs">(.*?)</script>',
                      page)
    assert found is not None
    shown: list[tuple[int, float, float, int, str]] = [
        (int(i), float(x), float(w), int(y), str(said))
        for i, x, w, y, said in json.loads(found.group(1))]
    return shown


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat()


def test_the_timeline_stacks_at_most_its_lanes_and_escapes_names() -> None:
    now = 1_800_000_000.0
    runs = [m.Span(id=i, job=f"<b>{i}</b>", item=None, host="h<1>", slot=now - 100,
                   started=now - 100, finished=now - 10, result=m.OK) for i in range(1, 21)]
    drawn = draw(runs, now - 3600, now, now, ["idle-host"])
    assert (drawn.runs, drawn.passed, drawn.hosts) == (20, 0, 2)
    svg = str(drawn.svg)
    assert "<b>" not in svg and "&lt;b&gt;" not in svg  # in JSON, < is \u003c
    assert "h\\u003c1\\u003e" not in svg and 'data-host="h&lt;1&gt;"' in svg
    said = [run[4] for run in shown_runs(svg)]
    assert said[0].startswith("<b>1</b>: run 1, ok, 1m30s, from ")  # as text, by the script
    lanes = {run[3] for run in shown_runs(svg)}
    assert len(lanes) == 8  # twenty runs at once: eight lanes, shared
    assert 'data-host="idle-host"' in str(drawn.svg)  # a live host with no run has its row


# -- items 6 and 7: a real server: its log, its jobs file --------------------------------


JOB = "jobs:\n  report:\n    cron: '0 6 * * *'\n    command: echo {word}\n"


def _with_password(db: TestDb) -> str:
    """The test database's URL with a password in it, on PostgreSQL (its
    test server trusts the test's connections: any password works)."""
    if db.backend != "postgresql":
        return db.url
    return re.sub(r"://(\w+)@", r"://\1:hunter2secret@", db.url)


def test_the_server_logs_its_database_without_the_password_and_no_polls(
        db: TestDb, store: Store, tmp_path: Path) -> None:
    store.ensure_jobs(["report"])  # the schema, before a read-only server
    url = _with_password(db)
    quiet = start_web(TestDb(db.backend, url, db.prefix), tmp_path / "quiet.log")
    try:
        for _ in range(3):
            assert http_get(quiet.port, "/fleet/live")[0] == 200
    finally:
        quiet.stop()
    said = quiet.log_text()
    assert "serving " in said and "read-only for anyone" in said
    assert "hunter2secret" not in said
    if db.backend == "postgresql":
        assert ":***@127.0.0.1" in said
    assert "GET /fleet/live" not in said
    loud = start_web(db, tmp_path / "loud.log", "--access-log")
    try:
        assert http_get(loud.port, "/fleet/live")[0] == 200
    finally:
        loud.stop()
    assert "GET /fleet/live" in loud.log_text()


def test_the_jobs_file_is_read_again_when_it_changes_and_on_sighup(
        sqlite_db: TestDb, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOB.format(word="first"))
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        store.ensure_jobs(["report"])
    web = start_web(sqlite_db, tmp_path / "web.log", "-f", str(jobs), "--show-commands")

    def shown(word: str) -> bool:
        return f"echo {word}" in http_get(web.port, "/jobs/report")[1]

    try:
        assert shown("first")
        jobs.write_text(JOB.format(word="second"))  # the watch
        wait_for(lambda: shown("second"), 30, what="the changed command on the Job page")
        assert "reloaded " in web.log_text() and "changed: report" in web.log_text()

        # A file with an error, then SIGHUP: said in the log, the old file kept,
        # the server still up.
        jobs.write_text("jobs:\n  report:\n    cron: 'not a cron'\n    command: echo third\n")
        os.kill(web.proc.pid, signal.SIGHUP)
        wait_for(lambda: "reload failed, keeping the 1 jobs loaded before" in web.log_text(),
                 30, what="the reload's error in the log")
        assert "jobs.yaml:3" in web.log_text() and shown("second")
        assert web.proc.poll() is None

        # SIGHUP alone: a change the watch cannot see (same size, inode and time).
        jobs.write_text(JOB.format(word="fourth"))
        wait_for(lambda: shown("fourth"), 30, what="the fixed file on the Job page")
        before = jobs.stat()
        jobs.write_text(JOB.format(word="fifth!"))  # as long as "fourth"
        os.utime(jobs, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert not shown("fifth!")
        os.kill(web.proc.pid, signal.SIGHUP)
        wait_for(lambda: shown("fifth!"), 30, what="the file read on SIGHUP")
        assert web.proc.poll() is None
    finally:
        web.stop()
    assert "Traceback" not in web.log_text()
