"""The dashboard in a real browser (issue 22 item 6): Debian's chromium,
driven by Playwright, over a real ``dblockrun web`` and two real daemons on
PostgreSQL. One browser, one server and one fleet for the whole module.

The screenshots in the README (docs/images/) are taken here, with
DBLOCKRUN_SCREENSHOTS=1."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ServerDatabases, strict
from harness import Fleet
from helpers import (
    REPO,
    TestDb,
    clean_env,
    free_port,
    http_get,
    new_prefix,
    wait_for,
)
from webtools import PASSWORD, users_file

from dblockrun.store import Store
from dblockrun.store import models as m

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
#: Where the screenshots go: the README's images with DBLOCKRUN_SCREENSHOTS=1
#: (``DBLOCKRUN_SCREENSHOTS=1 ./scripts/test tests/test_web_browser.py``), else a
#: temporary folder, so a test run leaves the checkout as it was.
IMAGES = (REPO / "docs" / "images" if os.environ.get("DBLOCKRUN_SCREENSHOTS", "") not in ("", "0")
          else Path(tempfile.gettempdir()) / "dblockrun-screenshots")
#: How long the page's script takes to show a change: it polls every 2 s.
SHOWN = 20.0
#: The daemons' --heartbeat: a running run's output reaches the database with it.
HEARTBEAT = 1.0
#: A line a running command prints shows on its Run page within a heartbeat,
#: plus the page's 2 s poll, plus slack for a machine shared by test runs.
LIVE_SHOWN = HEARTBEAT + 2.0 + 7.0

JOBS = """\
jobs:
  tick:
    rate: 3s
    command: 'sleep 0.5; echo tick'
  once:
    cron: '0 0 1 1 *'
    command: 'echo ran >> {dir}/once.log'
  long:
    cron: '0 0 1 1 *'
    command: 'echo started; exec sleep 300'
  chatty:
    cron: '0 0 1 1 *'
    command: >-
      echo first line; while [ ! -e {dir}/chatty.go ]; do sleep 0.1; done;
      echo second line; while [ ! -e {dir}/chatty.end ]; do sleep 0.1; done
  flaky:
    cron: '*/10 * * * * *'
    command: 'echo trying; exit 3'
  evil:
    cron: '0 0 1 1 *'
    command: >-
      printf '<script>window.pwned=1</script><img src=x onerror="window.pwned=1">'
      && printf '\\033]0;owned\\007\\033[2J\\033[31mred\\377 end\\n'
"""


@dataclass(frozen=True)
class Dashboard:
    """``dblockrun web`` at ``url`` over two daemons, on ``db``."""

    db: TestDb
    store: Store
    url: str
    dir: Path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory,
          server_databases: ServerDatabases) -> Iterator[Dashboard]:
    if not CHROMIUM.exists():
        why = "no /usr/bin/chromium (apt-get install chromium; scripts/test does)"
        if strict():
            pytest.fail(f"{why} (CI/DBLOCKRUN_TEST_STRICT: not skipping)", pytrace=False)
        pytest.skip(why)
    work = tmp_path_factory.mktemp("web")
    db = TestDb("postgresql", server_databases.url("postgresql"), new_prefix())
    daemons = Fleet(db, work, heartbeat=f"{HEARTBEAT:g}s", grace=None)
    jobs = daemons.jobs_file(JOBS.format(dir=work))
    for i in (1, 2):
        daemons.start(jobs, "--label", f"hostname=host{i}", name=f"daemon{i}", cwd=REPO,
                      stdout_to_log=True, env=clean_env())
    store = daemons.store
    try:
        wait_for(lambda: len(store.job_names()) == 6 and len(store.live_hosts()) == 2, 60,
                 what="two live daemons with the jobs")
        port = free_port()
        web = daemons.command("web", "--listen", f"127.0.0.1:{port}", "--users",
                              str(users_file(work / "users.yaml")), name="web", cwd=REPO,
                              env=clean_env())
        web.wait(lambda: http_get(port, "/login")[0] == 200, 60, what="dblockrun web")
        yield Dashboard(db, store, f"http://127.0.0.1:{port}", work)
    finally:
        daemons.stop()
        daemons.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield chromium
        chromium.close()


def page_as(browser: object, fleet: Dashboard, user: str | None):  # type: ignore[no-untyped-def]
    """A new page in a browser context of its own (its own cookies), signed in as ``user``."""
    context = browser.new_context(viewport={"width": 1100, "height": 650})  # type: ignore[attr-defined]
    page = context.new_page()
    page.set_default_timeout(30_000)
    if user is not None:
        page.goto(f"{fleet.url}/login")
        page.fill("input[name=name]", user)
        page.fill("input[name=password]", PASSWORD)
        page.click("#sign-in")
        page.wait_for_selector("#user")
    return page


def run_of(store: Store, job: str) -> m.RunRecord | None:
    runs = store.history(job, 5, output=False)
    return runs[0] if runs else None


def test_the_fleet_page_shows_the_daemons_jobs_and_updates_when_a_run_ends(
        browser: object, fleet: Dashboard) -> None:
    page = page_as(browser, fleet, "vera")
    page.goto(fleet.url + "/")
    for job in ("tick", "once", "long", "evil"):
        page.wait_for_selector(f"tr[data-job={job}]")
    assert page.locator("#hosts tbody tr").count() == 2
    cell = page.locator("tr[data-job=tick] td.last")

    def last_run() -> str | None:  # the run's link (its time, "3s ago", changes anyway)
        link = cell.locator("a")
        return link.get_attribute("href") if link.count() else None

    first = wait_for(last_run, SHOWN, what="tick's last run on the page")
    # No reload: the page's script brings the next run's end.
    wait_for(lambda: (href := last_run()) != first and href, SHOWN,
             what="the next run of tick on the page")
    assert cell.inner_text().startswith("ok")
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / "web-fleet.png"))
    page.context.close()


def test_actions_need_sign_in_and_the_operator_role(browser: object, fleet: Dashboard) -> None:
    anonymous = page_as(browser, fleet, None)
    anonymous.goto(f"{fleet.url}/confirm/run?job=once")
    assert "/login" in anonymous.url
    anonymous.context.close()

    viewer = page_as(browser, fleet, "vera")
    viewer.goto(f"{fleet.url}/jobs/once")
    assert viewer.locator("#act-run").count() == 0
    viewer.goto(f"{fleet.url}/confirm/run?job=once")
    assert "needs the operator role" in viewer.inner_text("#denied")
    # The form posted anyway, with the viewer's own CSRF token: refused.
    status = viewer.evaluate(
        """async () => {
            const csrf = document.querySelector('input[name=csrf]').value;
            const r = await fetch('/act/run', {method: 'POST', body: new URLSearchParams(
                {csrf, job: 'once'})});
            return r.status;
        }""")
    assert status == 403
    viewer.context.close()
    assert [e for e in fleet.store.control.entries() if e.action == "run"] == []


def test_a_form_without_its_csrf_token_is_refused(browser: object, fleet: Dashboard) -> None:
    page = page_as(browser, fleet, "olga")
    page.goto(f"{fleet.url}/confirm/disable?job=once")
    page.evaluate("document.querySelector('#confirm-form input[name=csrf]').remove()")
    page.fill("input[name=reason]", "no token")
    page.click("#confirm")
    assert "CSRF token is missing or wrong" in page.inner_text("#error")
    state = fleet.store.lock_state("once")
    assert state is not None and state.disabled_until is None
    page.context.close()


def test_a_run_started_from_the_page_runs_once(browser: object, fleet: Dashboard) -> None:
    page = page_as(browser, fleet, "olga")
    page.goto(f"{fleet.url}/jobs/once")
    page.click("#act-run")
    page.fill("input[name=reason]", "from the browser")
    page.click("#confirm")
    assert "run requested" in page.inner_text("#flash")
    ended = wait_for(lambda: (r := run_of(fleet.store, "once")) and r.result != m.RUNNING and r,
                     60, what="the requested run's end")
    assert ended.result == m.OK
    assert [r.id for r in fleet.store.history("once", 10)] == [ended.id]
    assert (fleet.dir / "once.log").read_text() == "ran\n"
    state = fleet.store.lock_state("once")
    assert state is not None and state.run_requested is None  # claimed: no second run
    (entry,) = [e for e in fleet.store.control.entries("once") if e.action == "run"]
    assert (entry.who, entry.reason) == ("web:olga", "from the browser")
    page.goto(f"{fleet.url}/jobs/once")
    page.wait_for_selector("#chart rect.r-ok")  # the run in the chart
    page.context.close()


def test_kill_from_the_page_ends_a_running_run(browser: object, fleet: Dashboard) -> None:
    page = page_as(browser, fleet, "olga")
    page.goto(f"{fleet.url}/confirm/run?job=long")
    page.click("#confirm")
    run = wait_for(lambda: (r := run_of(fleet.store, "long")) and r.result == m.RUNNING and r,
                   60, what="long's run")
    page.goto(f"{fleet.url}/runs/{run.id}")
    assert page.inner_text("#result") == "running"
    page.click("#act-kill")
    page.fill("input[name=reason]", "stuck")
    page.click("#confirm")
    # The run page follows the run to its end without a reload.
    # (Polled from here: the page's CSP forbids the eval of wait_for_function.)
    wait_for(lambda: page.inner_text("#result") == "killed", SHOWN, what="killed on the page")
    assert "started" in page.inner_text("#output")
    ended = fleet.store.run(run.id)
    assert ended is not None and ended.result == m.KILLED
    assert "web:olga" in (ended.output or "")
    page.context.close()


def test_a_hostile_output_is_inert(browser: object, fleet: Dashboard) -> None:
    page = page_as(browser, fleet, "olga")
    page.goto(f"{fleet.url}/confirm/run?job=evil")
    page.click("#confirm")
    ended = wait_for(lambda: (r := run_of(fleet.store, "evil")) and r.result != m.RUNNING and r,
                     60, what="evil's run")
    page.goto(f"{fleet.url}/runs/{ended.id}")
    text = page.inner_text("#output")
    assert "<script>window.pwned=1</script>" in text  # shown as text
    assert "\\x1b]0;owned\\x07" in text and "\x1b" not in text
    assert page.evaluate("window.pwned === undefined")
    assert page.locator("main script, main img").count() == 0
    assert page.title().startswith("run ")
    page.screenshot(path=str(IMAGES / "web-run.png"))
    # The README's job page: tick has run every 3 s since the module began.
    page.goto(f"{fleet.url}/jobs/tick")
    page.wait_for_selector("#chart rect.r-ok")
    page.screenshot(path=str(IMAGES / "web-job.png"))
    page.context.close()


def test_a_running_runs_output_shows_live_within_a_heartbeat(browser: object,
                                                              fleet: Dashboard) -> None:
    page = page_as(browser, fleet, "olga")
    page.goto(f"{fleet.url}/confirm/run?job=chatty")
    page.click("#confirm")
    # The command prints a line, then waits (for a file the test makes) before the next.
    run = wait_for(lambda: (r := run_of(fleet.store, "chatty")) and r.result == m.RUNNING and r,
                   60, what="chatty's run")
    page.goto(f"{fleet.url}/runs/{run.id}")
    assert page.is_visible("#partial")  # said to be partial
    wait_for(lambda: "first line" in page.inner_text("#output"), LIVE_SHOWN,
             what="the first line on the page")
    assert page.inner_text("#result") == "running" and "second" not in page.inner_text("#output")
    (fleet.dir / "chatty.go").touch()  # the command prints its second line
    wait_for(lambda: "second line" in page.inner_text("#output"), LIVE_SHOWN,
             what="the second line on the page, without a reload")
    assert page.inner_text("#result") == "running" and page.is_visible("#partial")
    (fleet.dir / "chatty.end").touch()
    wait_for(lambda: page.inner_text("#result") == "ok", SHOWN, what="the run's end on the page")
    assert not page.is_visible("#partial")  # the stored output now, no longer partial
    assert page.inner_text("#output").split("\n")[:2] == ["first line", "second line"]
    page.context.close()


# -- the console at a phone's width and a desktop's (issue 31 item 2) -----------------

#: A phone's width (on call) and a desktop's.
WIDTHS = (390, 1440)

#: In the page: each word of a table cell that the layout broke (its text on
#: two lines) or that is wider than its cell; and how far the page is wider
#: than the viewport (0: no horizontal scrolling).
LAYOUT = """() => {
  const bad = [];
  for (const cell of document.querySelectorAll("main td, main th")) {
    if (cell.getClientRects().length === 0) continue;  // not shown at this width
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.textContent.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set([...range.getClientRects()].filter((r) => r.width > 0)
                                .map((r) => Math.round(r.top)));
        if (lines.size > 1) bad.push(`${m[0]}: broken`);
        if (range.getBoundingClientRect().width > cell.clientWidth + 1)
          bad.push(`${m[0]}: wider than its cell`);
      }
    }
  }
  return {bad, overflow: document.documentElement.scrollWidth - window.innerWidth};
}"""


def at_width(browser: object, fleet: Dashboard, width: int):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": width, "height": 900})  # type: ignore[attr-defined]
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{fleet.url}/login")
    page.fill("input[name=name]", "olga")
    page.fill("input[name=password]", PASSWORD)
    page.click("#sign-in")
    page.wait_for_selector("#user")
    return page


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_the_screen_and_breaks_no_word(browser: object, fleet: Dashboard,
                                                       width: int) -> None:
    wait_for(lambda: run_of(fleet.store, "tick"), 60, what="a run of tick")
    run = run_of(fleet.store, "tick")
    assert run is not None
    page = at_width(browser, fleet, width)
    pages = {"fleet": "/", "fleet-filtered": "/?state=running&sort=duration&desc=1",
             "job": "/jobs/tick", "run": f"/runs/{run.id}", "hosts": "/hosts",
             "audit": "/audit", "confirm": "/confirm/kill?job=long", "timeline": "/timeline"}
    for name, path in pages.items():
        page.goto(fleet.url + path)
        page.wait_for_selector("main")
        got = page.evaluate(LAYOUT)
        assert got["bad"] == [], f"{path} at {width} px: {got['bad']}"
        assert got["overflow"] <= 0, f"{path} at {width} px is {got['overflow']} px too wide"
        if name in ("fleet", "job"):
            page.screenshot(path=str(IMAGES / f"web-{name}-{width}.png"), full_page=True)
    page.context.close()


def test_the_counts_filter_and_the_filters_live_in_the_url(browser: object,
                                                          fleet: Dashboard) -> None:
    page = page_as(browser, fleet, "olga")
    page.goto(f"{fleet.url}/confirm/run?job=long")
    page.click("#confirm")
    wait_for(lambda: (r := run_of(fleet.store, "long")) and r.result == m.RUNNING, 60,
             what="long's run")
    page.goto(fleet.url + "/")
    wait_for(lambda: page.inner_text("a[data-kind=running] b") != "0", SHOWN,
             what="a running job counted")
    page.click("a[data-kind=running]")
    page.wait_for_url("**/?state=running")
    assert "long" in page.locator("tr[data-job]").evaluate_all(
        "rows => rows.map((r) => r.dataset.job)")
    assert all(cls.startswith("state-running") for cls in page.locator(
        "tr[data-job]").evaluate_all("rows => rows.map((r) => r.className)"))
    # The filters' form: name and sort added to the state, all in the URL.
    page.fill("input[name=q]", "lon")
    page.select_option("select[name=sort]", "started")
    page.click("#apply")
    page.wait_for_url("**/?*q=lon*")
    assert "state=running" in page.url and "sort=started" in page.url
    assert page.locator("tr[data-job]").evaluate_all(
        "rows => rows.map((r) => r.dataset.job)") == ["long"]
    # Shared as a link, the same page; and its script refreshes the same query.
    other = page_as(browser, fleet, "vera")
    other.goto(page.url)
    assert other.locator("tr[data-job]").count() == 1
    assert "state=running" in (other.get_attribute("#live", "data-live") or "")
    # A time says how long from now, and its exact UTC time on hover.
    when = other.locator("tr[data-job=long] td.holder time")
    assert when.inner_text().startswith("in ")
    assert (when.get_attribute("title") or "").endswith(" UTC")
    # Kill is offered for the running job, styled as destructive.
    other.context.close()
    page.goto(f"{fleet.url}/jobs/long")
    assert "danger" in (page.get_attribute("#act-kill", "class") or "")
    assert page.locator("#act-enable").count() == 0
    page.click("#act-kill")
    page.click("#confirm")
    wait_for(lambda: (r := run_of(fleet.store, "long")) and r.result == m.KILLED, 60,
             what="long killed")
# -- issue 31 items 4, 5, 7: the Job and Run pages live, the timeline --------------------


def test_the_job_page_brings_new_runs_without_a_reload(browser: object,
                                                       fleet: Dashboard) -> None:
    page = page_as(browser, fleet, "vera")
    page.goto(f"{fleet.url}/jobs/tick")
    newest = page.locator("#history tbody tr").first.locator("td").first
    first = wait_for(lambda: (text := newest.inner_text()).isdigit() and text, SHOWN,
                     what="a run of tick in the history")
    # tick runs every 3 s: the page's script brings the next one, chart and table.
    wait_for(lambda: newest.inner_text() != first, SHOWN, what="tick's next run on the page")
    assert page.locator(f"#chart rect[data-run='{newest.inner_text()}']").count() == 1
    ticks = page.locator("#chart text.tick").all_text_contents()
    assert ticks[0] == "0.0s" and ticks[-1].endswith("ago")  # axes with units
    assert (page.locator("#chart text.legend").first.text_content() or "").startswith("ok ")
    for width in (390, 1440):
        page.set_viewport_size({"width": width, "height": 900})
        frame = page.locator("#chart").locator("xpath=..").bounding_box()
        assert frame is not None and frame["x"] + frame["width"] <= width  # scrolls in it
        chart = page.locator("#chart").bounding_box()
        assert chart is not None and chart["width"] >= 560  # its words readable
    page.context.close()


def test_a_run_page_polls_its_own_run_and_stops_once_it_ended(browser: object,
                                                              fleet: Dashboard) -> None:
    page = page_as(browser, fleet, "vera")
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    run = wait_for(lambda: (r := run_of(fleet.store, "tick")) and r.result == m.OK and r,
                   SHOWN, what="an ended run of tick")
    page.goto(f"{fleet.url}/runs/{run.id}")
    assert page.inner_text("#result") == "ok"
    # An ended run's page has nothing to poll: two poll periods and more, and
    # not one request (the bug: GET /runs/undefined every 2 s, forever).
    with page.expect_request(lambda r: r.url.endswith("/jobs/tick/live"),
                             timeout=SHOWN * 1000):
        page.goto(f"{fleet.url}/jobs/tick")  # (a page that does poll, for contrast)
    asked.clear()
    page.goto(f"{fleet.url}/runs/{run.id}")
    page.wait_for_timeout(5000)  # absence can only be seen over time
    assert [u for u in asked if "/live" in u or "undefined" in u] == []
    page.context.close()


def test_the_timeline_shows_what_ran_on_each_host(browser: object, fleet: Dashboard) -> None:
    page = page_as(browser, fleet, "vera")
    page.goto(f"{fleet.url}/")
    page.click("nav a[href='/timeline']")
    page.wait_for_selector("#timeline path.bar.r-ok")
    hosts = page.locator("#timeline g.host").evaluate_all(
        "rows => rows.map(r => r.dataset.host)")
    assert hosts == ["host1", "host2"]  # the daemons' hostname labels
    # Hovering a bar says what ran; a click opens the run.
    runs = json.loads(page.locator("#timeline-runs").text_content() or "[]")
    # An ok run's bar that no later-drawn bar covers at its middle (runs
    # seconds apart share a pixel at this window: the last drawn is on top).
    def on_top(i: int) -> bool:
        middle = runs[i][1] + runs[i][2] / 2
        return not any(r[3] == runs[i][3] and r[1] - 1 <= middle <= r[1] + r[2] + 1
                       for r in runs[i + 1:])
    run_id, x, width, y, said = next(
        r for i, r in enumerate(runs) if ", ok, " in r[4] and on_top(i))
    assert re.fullmatch(r"\w+: run \d+, ok, \d+\.\d\ds, from \d\d:\d\d:\d\dZ", said), said
    at = page.evaluate(
        """([x, y]) => { const m = document.getElementById("timeline").getScreenCTM();
                        const p = new DOMPoint(x, y).matrixTransform(m);
                        return [p.x, p.y]; }""", [x + width / 2, y + 4])
    page.mouse.move(at[0], at[1])
    page.wait_for_selector("#tip:not([hidden])")
    assert page.inner_text("#tip") == said
    page.mouse.click(at[0], at[1])
    page.wait_for_url(f"**/runs/{run_id}")
    page.go_back()
    page.wait_for_selector("#timeline path.bar")
    page.click("#window a:text('15m')")
    page.wait_for_selector("#window strong:text('15m')")
    assert "window=15m" in page.url
    for width in (390, 1440):
        page.set_viewport_size({"width": width, "height": 900})
        page.reload()  # (its frame shows the right end, now, from the start)
        page.wait_for_selector("#timeline path.bar")
        frame = page.locator("#timeline").locator("xpath=..")
        box = frame.bounding_box()
        assert box is not None and box["x"] + box["width"] <= width
        assert frame.evaluate("f => f.scrollWidth - f.scrollLeft - f.clientWidth") <= 1
        page.screenshot(path=str(IMAGES / f"web-timeline-{width}.png"), full_page=True)
    page.context.close()
