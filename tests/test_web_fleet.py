"""The Fleet page as a console (issue 31 items 1 and 3): the counts by state
atop it, each a link that filters; filters by state, group, label, host and
name that combine and live in the URL; sorts; times worded as the CLI words
them, the exact UTC time on hover; and actions that follow the job's state,
the destructive ones styled so. On every backend, through the application."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from webtools import PASSWORD, app_for, csrf_of, users_file

from dblockrun.scheduling.limits import seat_names
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.control import Audit
from dblockrun.web.app import WebApp

H1, H2 = "web-1:7:ab", "web-2:8:cd"
JOBS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf"]


def ran(store: Store, job: str, host: str, result: str, code: int, took: float) -> None:
    won = store.claim_and_record(job, host, 30)
    assert won is not None and won.run_id is not None
    store.finish_and_release(won.run_id, job, host, won.token, result, code, None, 0.0, took=took)


@pytest.fixture
def console(store: Store, tmp_path: Path) -> Iterator[tuple[TestClient, WebApp]]:
    """Seven jobs, one of each kind: alpha ran ok (0.5 s, web-1), bravo
    failed (exit 3, 2 s, web-2), charlie runs (holding a seat of group
    backups), delta is disabled, echo's slot was recorded missed (by
    web-2), foxtrot's next run is in 90 s, golf is defined differently by
    the two live hosts and runs on env=prod."""
    seats = seat_names("backups", 2)
    store.ensure_jobs(JOBS + seats)
    ran(store, "alpha", H1, m.OK, 0, 0.5)
    ran(store, "bravo", H2, m.FAILED, 3, 2.0)
    assert store.claim_and_record("charlie", H1, 300) is not None
    assert store.claim_seat(seats, H1, 300, "charlie") is not None
    store.disable("delta", reason="maintenance")
    now = store.db_now()
    assert store.lock.record_slots("echo", H2, m.MISSED, [(now - 60, "missed: down", None)],
                                   first=None)
    store.set_next_due({"foxtrot": now + 90})
    targets = json.dumps({"golf": {"run_on": {"env": ["prod"]}, "every_host": False}})
    for host, digest in ((H1, "aaaa"), (H2, "bbbb")):
        defs = dict.fromkeys(JOBS, "same")
        defs["golf"] = digest
        store.heartbeat_host(host, hostname=host[:5], pid=int(host[4]), version="t",
                             clock_offset=0.0, running=0, jobs=json.dumps(defs),
                             targets=targets)
    app = app_for(store, users_file(tmp_path / "users.yaml"))
    client = TestClient(app)
    client.post("/login", data={"name": "adam", "password": PASSWORD, "next": "/",
                                "csrf": csrf_of(client.get("/login").text)})
    yield client, app


def shown(page: str) -> list[str]:
    """The jobs of the page's table, in its order."""
    return re.findall(r'<tr data-job="([^"]+)"', page)


def counts(page: str) -> dict[str, int]:
    return {kind: int(n) for kind, n in re.findall(
        r'data-kind="(\w+)"><b>(\d+)</b>', page)}


def test_the_counts_atop_the_page_each_link_to_their_jobs(
        console: tuple[TestClient, WebApp]) -> None:
    client, _app = console
    page = client.get("/").text
    assert shown(page) == JOBS
    assert counts(page) == {"running": 1, "failed": 1, "late": 1, "disabled": 1, "paused": 0,
                            "drifting": 1, "waiting": 0}
    assert 'href="/?state=failed" class="count k-failed some" data-kind="failed"' in page
    for kind, jobs in (("running", ["charlie"]), ("failed", ["bravo"]), ("late", ["echo"]),
                       ("disabled", ["delta"]), ("drifting", ["golf"]), ("paused", []),
                       ("waiting", [])):
        assert shown(client.get(f"/?state={kind}").text) == jobs, kind
    # Two states: the jobs of either.
    assert shown(client.get("/?state=failed&state=late").text) == ["bravo", "echo"]


def test_filters_combine_and_live_in_the_url(console: tuple[TestClient, WebApp]) -> None:
    client, _app = console
    assert shown(client.get("/?host=web-2").text) == ["bravo", "echo"]
    assert shown(client.get(f"/?host={H1}").text) == ["alpha", "charlie"]
    assert shown(client.get("/?group=backups").text) == ["charlie"]
    assert shown(client.get("/?label=env=prod").text) == ["golf"]
    assert shown(client.get("/?label=env").text) == ["golf"]
    assert shown(client.get("/?q=ALP").text) == ["alpha"]
    page = client.get("/?host=web-2&state=failed").text
    assert shown(page) == ["bravo"]
    # The counts are of the jobs the other filters match; their links keep them.
    assert counts(page)["failed"] == 1 and counts(page)["running"] == 0
    assert 'href="/?state=late&amp;host=web-2"' in page
    # The page's script refreshes the same query; the form shows it.
    assert 'data-live="/fleet/live?state=failed&amp;host=web-2"' in page
    assert '<option value="failed" selected>' in page and "<option selected>web-2</option>" in page
    assert shown(client.get("/fleet/live?state=failed&host=web-2").text) == ["bravo"]
    assert shown(client.get("/?host=web-2&state=running").text) == []
    assert "no job matches" in client.get("/?q=nothing").text
    # What the page does not know is left out, not an error.
    assert shown(client.get("/?state=bogus&sort=bogus&page=x").text) == JOBS
    # What it shows back of the URL is text, never markup.
    hostile = client.get('/?host=<script>x</script>&q="><img src=x>&label=<i>y</i>').text
    assert "<script>x" not in hostile and "<img" not in hostile and "<i>y" not in hostile
    assert "&lt;script&gt;x&lt;/script&gt;" in hostile


def test_sorts_and_the_problems_first(console: tuple[TestClient, WebApp]) -> None:
    client, _app = console
    # The bad results first; the jobs without a run last, by name.
    by_result = shown(client.get("/?sort=result").text)
    assert by_result[:2] == ["bravo", "echo"] and by_result[-3:] == ["delta", "foxtrot", "golf"]
    assert shown(client.get("/?sort=duration&desc=1").text)[:2] == ["bravo", "alpha"]
    assert shown(client.get("/?sort=duration").text)[:2] == ["alpha", "bravo"]
    assert shown(client.get("/?sort=next").text)[0] == "foxtrot"
    assert shown(client.get("/?sort=name&desc=1").text) == JOBS[::-1]
    assert shown(client.get("/?problems=first").text) == [
        "bravo", "echo", "alpha", "charlie", "delta", "foxtrot", "golf"]
    # A column's head sorts by it; again, the other way.
    page = client.get("/?sort=result&host=web-2").text
    assert 'href="/?host=web-2&amp;sort=result&amp;desc=1" class="sorted"' in page


def test_times_are_relative_with_the_exact_time_on_hover(
        console: tuple[TestClient, WebApp]) -> None:
    client, app = console
    page = client.get("/").text
    alpha = page.split('<tr data-job="alpha"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r'in <span class="dur">0\.50s</span>, <time datetime="\d{4}-\d\d-\d\dT'
                     r'\d\d:\d\d:\d\dZ" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC">\d+\.\ds ago'
                     r'</time> on <span class="host" title="web-1:7:ab">web-1</span>', alpha), alpha
    foxtrot = page.split('<tr data-job="foxtrot"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r">in (1m|1m\d+s|\d+\.\ds)</time>", foxtrot), foxtrot
    bravo = page.split('<tr data-job="bravo"', 1)[1].split("</tr>", 1)[0]
    assert "exit 3 in" in bravo and "2.00s" in bravo
    delta = page.split('<tr data-job="delta"', 1)[1].split("</tr>", 1)[0]
    assert "until enabled" in html.unescape(delta) and "maintenance" in delta
    assert "T" not in re.sub(r"<[^>]*>", "", alpha)  # no ISO timestamp as text
    # A disable's end and a lease as the CLI's narrow table says them.
    app.state.web.store.disable("golf", for_seconds=7200)
    app.state.web.status.forget()
    page = client.get("/").text
    golf = page.split('<tr data-job="golf"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r'disabled</span> for <time [^>]+>(2h|1h59m\d+s)</time>', golf), golf
    charlie = page.split('<tr data-job="charlie"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r'>web-1</span>, lease <time [^>]+>in (5m|4m\d+s)</time>', charlie), charlie


def test_actions_follow_the_jobs_state(console: tuple[TestClient, WebApp]) -> None:
    client, app = console

    def actions(job: str) -> dict[str, str]:
        page = client.get(f"/jobs/{job}").text
        return dict((a, cls) for cls, a in re.findall(
            r'<a class="(action[^"]*)" id="act-(\w+)"', page))

    assert actions("alpha") == {"run": "action", "disable": "action"}
    assert actions("delta") == {"run": "action", "enable": "action"}
    assert actions("charlie") == {"run": "action", "disable": "action",
                                  "kill": "action danger", "unlock": "action danger"}
    fleet = client.get("/").text
    assert '<a class="action danger" id="act-pause"' in fleet and "act-resume" not in fleet
    confirm = client.get("/confirm/kill?job=charlie").text
    assert '<button id="confirm" class="action danger">' in confirm
    app.state.web.store.control.pause(Audit("test", "pause"), None)
    app.state.web.status.forget()
    fleet = client.get("/").text
    assert 'id="act-resume"' in fleet and "act-pause" not in fleet
    assert "PAUSED until resumed, by test since <time" in fleet
    assert counts(fleet)["paused"] == 6  # every job but the disabled one
    assert shown(client.get("/?state=paused").text) == [j for j in JOBS if j != "delta"]


def test_a_time_on_a_page_is_worded_as_the_cli_words_it() -> None:
    from dblockrun.store import FOREVER
    from dblockrun.timetext import iso, relative
    from dblockrun.web.timehtml import duration, when

    now = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
    for ts in (now - 3.25, now + 9, now - 190, now + 5400, now - 2 * 86400):
        shown = when(iso(ts), now)  # as the status document writes it
        assert f">{relative(ts, now)}</time>" in shown  # the CLI's own wording
    assert str(when(now - 190, now)) == (
        '<time datetime="2026-11-18T11:03:30Z" title="2026-11-18 11:03:30 UTC">3m10s ago</time>')
    assert str(when(now + 9, now)).endswith(">in 9.0s</time>")
    assert str(when(None, now)) == "-" and ">never<" in str(when(iso(FOREVER), now))
    assert str(when("<b>", now)) == "&lt;b&gt;"  # not a time: escaped as text
    assert (duration(0.024), duration(12.5), duration(90), duration(None)) == (
        "0.02s", "12.50s", "1m30s", "-")
