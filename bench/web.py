"""`dblockrun web` with 10,000 jobs: the Fleet page ready in a browser, and
`GET /api/v1/status` latency, against `dblockrun status --json` measured in
the same run.

    python bench/web.py [--jobs 10000] [--requests 100] [--loads 9]
    python bench/web.py --live-only [--heartbeats 1,2] [--lines 9]

For each backend: the data of bench/status_scale.py (10,000 jobs with five
runs each, one in ten running, four live hosts), then a real `dblockrun
web` process on 127.0.0.1 (read-only: no users file). Measured:

- `GET /api/v1/status` (every job, the shape of `status --json`), sequential
  requests over one keep-alive connection after two warm-ups: median and p99;
- the same request's baseline: `dblockrun status --json` as a process (the
  same reads and serializer, plus the interpreter's start), median;
- what each refresh of that document costs (read and serialize every job,
  in-process: the work behind the requests, once a second while asked);
- `GET /` (the Fleet page's first 100 jobs, rendered): median and p99;
- the Fleet page ready in Debian's chromium (Playwright): from `goto` to the
  jobs table on screen, with its CSS and script loaded (`load` event), a
  new page each time: median of ``--loads``;
- live output (``--heartbeats``): a real daemon (``--heartbeat H``) runs a
  command that prints ``--lines`` lines, each when the bench says so (a
  file), stamped with the time it is printed; a client polls
  ``GET /api/v1/runs/ID/output`` every 20 ms: the time from a line's print
  to its showing there, median and max, as a ratio to H. A line is asked
  for at a random moment of the heartbeat (after the previous one showed),
  so the phase is uniform: the wait is about H/2 on average, H at most,
  plus the write and the poll.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

from common import URLS, Table, bench_prefix, percentile
from status_scale import drop, env_for, fill, keep_hosts_live, timed

if TYPE_CHECKING:
    from dblockrun.store import Store

T = TypeVar("T")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GOAL_PAGE, GOAL_P99 = 1.0, 0.2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_web(url: str, prefix: str, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dblockrun", "--db", url, "--table-prefix", prefix, "web",
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_for(), cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("dblockrun web did not start")


def requests(port: int, path: str, count: int) -> tuple[list[float], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    took: list[float] = []
    body = b""
    for i in range(count + 2):
        start = time.perf_counter()
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise SystemExit(f"GET {path}: {response.status}")
        if i >= 2:  # two warm-ups: the pool's connection, the templates
            took.append(time.perf_counter() - start)
    conn.close()
    return took, body


def page_loads(port: int, loads: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    took = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for i in range(loads + 1):
            page = browser.new_page()
            start = time.perf_counter()
            page.goto(f"http://127.0.0.1:{port}/", wait_until="load")
            page.wait_for_selector("tr[data-job]")
            if i:  # the first: the browser's own start
                took.append(time.perf_counter() - start)
            page.close()
        browser.close()
    return took


def read_whole(url: str, prefix: str, repeats: int) -> float:
    """Median time of one refresh of the status document, in-process."""
    from dblockrun.store import Store
    from dblockrun.web.context import whole_status

    took = []
    with Store(url, prefix, create=False) as store:
        whole_status(store)
        for _ in range(repeats):
            start = time.perf_counter()
            whole_status(store)
            took.append(time.perf_counter() - start)
    return statistics.median(took)


TALK = """\
jobs:
  talk:
    cron: '0 0 1 1 *'
    command: >-
      for i in $(seq {lines}); do while [ ! -e {dir}/go$i ]; do sleep 0.01; done;
      echo "line $i $(date +%s.%N)"; done
"""


def get_json(conn: http.client.HTTPConnection, path: str) -> dict[str, object]:
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise SystemExit(f"GET {path}: {response.status}")
    doc: dict[str, object] = json.loads(body)
    return doc


def until(what: str, check: Callable[[], T | None], timeout: float = 60) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (got := check()) is not None:
            return got
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def _defined(store: Store) -> bool | None:
    try:
        return "talk" in store.job_names() or None
    except Exception:  # no tables yet
        return None


def live_output(url: str, heartbeat: float, lines: int) -> list[float]:
    """Seconds from each line's print to its showing in the API, with a
    daemon at ``--heartbeat heartbeat``."""
    prefix = bench_prefix()
    work = Path(tempfile.mkdtemp(prefix="bench-live-"))
    jobs = work / "jobs.yaml"
    jobs.write_text(TALK.format(lines=lines, dir=work))
    base = [sys.executable, "-m", "dblockrun", "--db", url, "--table-prefix", prefix]
    daemon = subprocess.Popen(
        [*base, "daemon", str(jobs), "--heartbeat", f"{heartbeat:g}s",
         "--lease", f"{max(10, 5 * heartbeat):g}s"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_for(), cwd=ROOT)
    port = free_port()
    web = None
    took: list[float] = []
    try:
        from dblockrun.store import Store

        with Store(url, prefix, create=False) as store:  # the daemon makes the tables
            until("the daemon", lambda: _defined(store))
        web = start_web(url, prefix, port)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        subprocess.run([*base, "run", "talk", "--no-wait"], check=True, env=env_for(),
                       cwd=ROOT, stdout=subprocess.DEVNULL)

        def running() -> int | None:
            runs = cast(list[dict[str, object]], get_json(conn, "/api/v1/history?job=talk")["runs"])
            return next((int(str(r["id"])) for r in runs if r["result"] == "running"), None)

        run_id = until("talk's run", running)
        for i in range(1, lines + 1):
            time.sleep(random.uniform(0, heartbeat))  # a random phase of the heartbeat
            (work / f"go{i}").touch()

            def shown(i: int = i) -> float | None:
                doc = get_json(conn, f"/api/v1/runs/{run_id}/output")
                for line in str(doc["output"]).splitlines():
                    if line.startswith(f"line {i} "):
                        if i < lines and doc["live"] is not True:
                            raise SystemExit("a running run's output not marked live")
                        return time.time() - float(line.split()[2])
                return None

            took.append(until(f"line {i}", shown))
        conn.close()
    finally:
        for proc in (daemon, web):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
        drop(url, prefix)
    return took


def live_table(backends: list[str], heartbeats: list[float], lines: int) -> None:
    table = Table(["backend", "--heartbeat", "lines", "print to API, median s", "max s",
                   "median × heartbeat", "max × heartbeat", "goal (≤ 1 heartbeat)"])
    for backend in backends:
        for heartbeat in heartbeats:
            print(f"{backend}: live output, --heartbeat {heartbeat:g}s ...", flush=True)
            took = live_output(URLS[backend](""), heartbeat, lines)
            med = statistics.median(took)
            table.add([backend, f"{heartbeat:g}s", str(lines), f"{med:.2f}",
                       f"{max(took):.2f}", f"{med / heartbeat:.2f}",
                       f"{max(took) / heartbeat:.2f}",
                       "met" if max(took) <= heartbeat else "median met" if med <= heartbeat
                       else "not met"])
    table.print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5, help="finished runs per job")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--loads", type=int, default=9)
    ap.add_argument("--repeats", type=int, default=7, help="status --json processes")
    ap.add_argument("--backends", default="postgresql,mariadb")
    ap.add_argument("--heartbeats", default="1,2", help="live output: daemons' --heartbeat, s")
    ap.add_argument("--lines", type=int, default=9, help="live output: lines per heartbeat")
    ap.add_argument("--live-only", action="store_true", help="only the live output figures")
    args = ap.parse_args()
    live_table(args.backends.split(","), [float(h) for h in args.heartbeats.split(",")],
               args.lines)
    if args.live_only:
        return
    table = Table(["backend", "what", "median ms", "p99 ms", "× status --json", "goal"])
    for backend in args.backends.split(","):
        url = URLS[backend]("")
        prefix = bench_prefix()
        print(f"{backend}: {args.jobs} jobs, {args.runs} runs each ...", flush=True)
        fill(url, prefix, args.jobs, args.runs)
        port = free_port()
        web = start_web(url, prefix, port)
        try:
            keep_hosts_live(url, prefix)
            cli = [sys.executable, "-m", "dblockrun", "--db", url, "--table-prefix", prefix,
                   "status", "--json"]
            base = statistics.median(timed(cli, env_for())[0] for _ in range(args.repeats))
            api, body = requests(port, "/api/v1/status", args.requests)
            if len(json.loads(body)["jobs"]) != args.jobs:
                raise SystemExit("the API did not return every job")
            fleet, html = requests(port, "/", args.requests)
            if html.count(b"<tr data-job=") != 100:
                raise SystemExit("the Fleet page did not show 100 jobs")
            loads = page_loads(port, args.loads)
            refresh = read_whole(url, prefix, args.repeats)
            p99 = percentile(api, 0.99)
            table.add([backend, "status --json (process, baseline)", f"{base * 1000:.0f}", "",
                       "1.00", ""])
            table.add([backend, "GET /api/v1/status", f"{statistics.median(api) * 1000:.0f}",
                       f"{p99 * 1000:.0f}", f"{statistics.median(api) / base:.2f}",
                       "met" if p99 < GOAL_P99 else "not met"])
            table.add([backend, "  its refresh, behind the requests",
                       f"{refresh * 1000:.0f}", "", f"{refresh / base:.2f}", ""])
            table.add([backend, "GET / (Fleet page, 100 jobs)",
                       f"{statistics.median(fleet) * 1000:.0f}",
                       f"{percentile(fleet, 0.99) * 1000:.0f}",
                       f"{statistics.median(fleet) / base:.2f}", ""])
            ready = statistics.median(loads)
            table.add([backend, "Fleet page ready in chromium", f"{ready * 1000:.0f}",
                       f"{max(loads) * 1000:.0f} (max)", f"{ready / base:.2f}",
                       "met" if ready < GOAL_PAGE else "not met"])
        finally:
            web.send_signal(signal.SIGTERM)
            web.wait(timeout=30)
            drop(url, prefix)
    print(f"(goals: Fleet page ready under {GOAL_PAGE:g} s, GET /api/v1/status p99 under "
          f"{GOAL_P99 * 1000:.0f} ms, with {args.jobs} jobs)")
    table.print()


if __name__ == "__main__":
    main()
