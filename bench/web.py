"""`dblockrun web` with 10,000 jobs: the Fleet page ready in a browser, and
`GET /api/v1/status` latency, against `dblockrun status --json` measured in
the same run.

    python bench/web.py [--jobs 10000] [--requests 100] [--loads 9] [--no-live]
    python bench/web.py --live-only [--heartbeats 1,2] [--lines 9]
    python bench/web.py --hostile-only [--code DIR]
    python bench/web.py --console-only [--requests 20] [--loads 5]

For each backend: the data of bench/status_scale.py (10,000 jobs with five
runs each, one in ten running, four live hosts), then a real `dblockrun
web` process on 127.0.0.1 (read-only: no users file). Measured:

- `GET /api/v1/status` (every job, the shape of `status --json`), sequential
  requests over one keep-alive connection after two warm-ups: median and p99;
- the same request's baseline: `dblockrun status --json` as a process (the
  same reads and serializer, plus the interpreter's start), median;
- what each refresh of that document costs (read and serialize every job,
  in-process: the work behind the requests, once a second while asked);
- `GET /` (the Fleet page's counts and first 100 jobs, rendered): median
  and p99;
- `GET /?state=running&sort=duration&desc=1&problems=first` (the filtered
  Fleet page: the 1,000 running jobs, the longest last run first): median
  and p99;
- each of these pages ready in Debian's chromium (Playwright): from `goto` to the
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
- against an anonymous client (``--hostile``, issue 32): a real `dblockrun
  web` (a users file, ``--proxy-headers``, under ``ulimit -n 1024``) on
  PostgreSQL: its RSS idle (the baseline), its peak RSS while a 1 GB body
  is sent to ``/logout`` and while 40 sign-ins from 40 addresses arrive at
  once, and the time to answer the Fleet page with 1,100 idle sockets open
  against the time without them, in the same run. ``--code DIR`` serves
  another checkout's dblockrun (``--code /work/main``: the figures before
  the fix).
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
#: The filtered Fleet page measured: the running jobs (one in ten of
#: status_scale's), by their last run's duration, longest first.
FILTERED = "/?state=running&sort=duration&desc=1&problems=first"


def machine() -> str:
    """Which machine and day the figures are of."""
    import platform

    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
            f"{platform.node()}: {os.cpu_count()} cores ({model}), Python "
            f"{platform.python_version()}, load {load:.1f}")


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


def page_loads(port: int, loads: int, path: str = "/") -> list[float]:
    from playwright.sync_api import sync_playwright

    took = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for i in range(loads + 1):
            page = browser.new_page()
            start = time.perf_counter()
            page.goto(f"http://127.0.0.1:{port}{path}", wait_until="load")
            page.wait_for_selector("tr[data-job]")
            if i:  # the first: the browser's own start
                took.append(time.perf_counter() - start)
            page.close()
        browser.close()
    return took


def read_whole(url: str, prefix: str, repeats: int) -> float:
    """Median time of one refresh of the status document, in-process."""
    from dblockrun.store import Store
    from dblockrun.web.fleetview import read

    took = []
    with Store(url, prefix, create=False) as store:
        read(store)
        for _ in range(repeats):
            start = time.perf_counter()
            read(store)
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


# -- against an anonymous client (issue 32) ----------------------------------------------


def status_kib(pid: int, field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (its peak) of process ``pid``, KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise SystemExit(f"no {field} for {pid}")


def _open_1024() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def _session(port: int) -> tuple[str, str]:
    """A sign-in form's cookie and CSRF token."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/login")
    answer = conn.getresponse()
    page = answer.read().decode()
    cookie = (answer.getheader("set-cookie") or "").split(";", 1)[0]
    conn.close()
    token = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    return cookie, token


#: The admin's API token in the hostile bench's users file.
TOKEN = "bench-token-" + "t" * 40


def _fleet_page(port: int, timeout: float) -> float:
    """Seconds to a whole answer to ``GET /`` (signed in with the API token)
    on a new connection (``timeout``: none came)."""
    start = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
    except OSError:
        return timeout
    if not answer.startswith(b"HTTP/1.1 200"):
        return timeout
    return time.perf_counter() - start


def _gigabyte(port: int) -> tuple[float, int]:
    """A 1 GB urlencoded body (chunked; fields of 1 MB, under the form
    parser's limit of 1 MiB a field) to ``/logout``: (seconds until the
    server stopped it, bytes it took)."""
    value = b"x" * 1_000_000
    sent = 0
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(b"POST /logout HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                  b"Content-Type: application/x-www-form-urlencoded\r\n\r\n")
        try:
            while sent < 1 << 30:
                field = b"f%d=%s&" % (sent, value)
                s.sendall(b"%x\r\n%s\r\n" % (len(field), field))
                sent += len(field)
            s.sendall(b"0\r\n\r\n")
            s.recv(1024)
        except OSError:
            pass
    return time.perf_counter() - start, sent


def _guesses(port: int, count: int) -> list[int]:
    """``count`` sign-ins at once, each from its own address for its own name."""
    import threading

    cookie, token = _session(port)
    go = threading.Barrier(count)
    codes = [0] * count

    def guess(i: int) -> None:
        body = f"name=name{i}&password=guess&next=/&csrf={token}"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        go.wait()
        conn.request("POST", "/login", body, {
            "Cookie": cookie, "X-Forwarded-For": f"10.9.0.{i}",
            "Content-Type": "application/x-www-form-urlencoded"})
        codes[i] = conn.getresponse().status
        conn.close()

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def hostile(code: str) -> None:
    from dblockrun.store import Store
    from dblockrun.web.users import hash_password, token_hash

    url, prefix = URLS["postgresql"](""), bench_prefix()
    work = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    users = work / "users.yaml"
    users.write_text(f"users:\n  - name: adam\n    role: admin\n"
                     f"    password: '{hash_password('right password')}'\n"
                     f"    token-sha256: {token_hash(TOKEN)}\n")
    with Store(url, prefix) as store:
        store.ensure_schema()
        store.ensure_jobs([f"job{i:03d}" for i in range(100)])
    port = free_port()
    log = work / "web.log"
    env = {**env_for(), "PYTHONPATH": code, "TMPDIR": str(work)}
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dblockrun", "--db", url, "--table-prefix", prefix, "web",
             "--listen", f"127.0.0.1:{port}", "--users", str(users), "--proxy-headers"],
            stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=code, preexec_fn=_open_1024)
    table = Table(["what", "figure", "× baseline", "goal"])
    try:
        until("dblockrun web", lambda: _fleet_page(port, 5) < 5 or None)
        for _ in range(3):
            _fleet_page(port, 30)
        idle = status_kib(proc.pid, "VmRSS")
        table.add(["RSS idle (baseline)", f"{idle / 1024:.0f} MiB", "1.00", ""])
        took, sent = _gigabyte(port)
        peak = status_kib(proc.pid, "VmHWM")
        spooled = sum(f.stat().st_size for f in work.iterdir() if f.is_file()) \
            - log.stat().st_size - users.stat().st_size
        table.add(["peak RSS, a 1 GB body to /logout", f"{peak / 1024:.0f} MiB",
                   f"{peak / idle:.2f}",
                   "growth < 20 MB: " + ("met" if peak - idle < 20 * 1024 else "not met")])
        table.add(["  taken before it stopped / on disk",
                   f"{sent / (1 << 20):.1f} MiB in {took:.2f} s / {spooled >> 20} MiB", "", ""])
        codes = _guesses(port, 40)
        peak = status_kib(proc.pid, "VmHWM")
        table.add(["peak RSS, 40 sign-ins at once", f"{peak / 1024:.0f} MiB",
                   f"{peak / idle:.2f}",
                   "< idle + 2 × 64 MiB: " + ("met" if peak - idle < 2 * 64 * 1024 + 48 * 1024
                                             else "not met")])
        table.add(["  their answers", ", ".join(f"{codes.count(c)} × {c}"
                                               for c in sorted(set(codes))), "", ""])
        quiet = [_fleet_page(port, 30) for _ in range(5)]
        before = log.stat().st_size
        socks = []
        for _ in range(1100):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            except OSError:
                break
        busy = [_fleet_page(port, 30) for _ in range(5)]
        grown = log.stat().st_size - before
        for s in socks:
            s.close()
        base = statistics.median(quiet)
        table.add(["Fleet page, no idle socket (baseline)", f"{base * 1000:.0f} ms", "1.00", ""])
        table.add([f"Fleet page, {len(socks)} idle sockets open (median of 5)",
                   f"{statistics.median(busy) * 1000:.0f} ms (max {max(busy) * 1000:.0f})",
                   f"{statistics.median(busy) / base:.2f}",
                   "< 5 s: " + ("met" if max(busy) < 5 else "not met")])
        table.add(["  the log grew by", f"{grown / 1e6:.2f} MB", "",
                   "< 1 MB: " + ("met" if grown < 1e6 else "not met")])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        drop(url, prefix)
    print(f"dblockrun web of {code}, under ulimit -n 1024, PostgreSQL:")
    table.print()


def ready_in_chromium(port: int, path: str, selector: str, loads: int) -> list[float]:
    """From ``goto`` to ``selector`` shown with the page's CSS and script
    loaded, a new page each time: ``loads`` times (after one for the
    browser's own start)."""
    from playwright.sync_api import sync_playwright

    took = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for i in range(loads + 1):
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            start = time.perf_counter()
            page.goto(f"http://127.0.0.1:{port}{path}", wait_until="load")
            page.wait_for_selector(selector)
            if i:
                took.append(time.perf_counter() - start)
            page.close()
        browser.close()
    return took


def console(backends: list[str], jobs: int, runs: int, count: int, loads: int) -> None:
    """Issue 31 items 4 and 5: the timeline with 10,000 runs in its window
    (the data's runs start every 300 s, a job's runs each: a 5-minute window
    holds one run of each job), ready in chromium; and what each 2-second
    poll of a Job page and a Run page costs the server."""
    from datetime import UTC, datetime

    from dblockrun.store import Store

    table = Table(["backend", "what", "median ms", "p99 / max ms", "bytes", "goal"])
    for backend in backends:
        url = URLS[backend]("")
        prefix = bench_prefix()
        print(f"{backend}: {jobs} jobs, {runs} runs each ...", flush=True)
        fill(url, prefix, jobs, runs)
        port = free_port()
        web = start_web(url, prefix, port)
        try:
            keep_hosts_live(url, prefix)
            with Store(url, prefix) as store:
                now = store.db_now()
                run_id = store.history("job-00001", 1, output=False)[0].id
            end = datetime.fromtimestamp(now - 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            path = f"/timeline?window=5m&end={end}"
            took, html = requests(port, path, count)
            data = html.split(b'id="timeline-runs">', 1)[1].split(b"</script>", 1)[0]
            drawn = len(json.loads(data))
            if drawn != jobs:
                raise SystemExit(f"the timeline drew {drawn} runs, not {jobs}")
            table.add([backend, f"GET {path.split('&')[0]} ({drawn} runs)",
                       f"{statistics.median(took) * 1000:.0f}",
                       f"{percentile(took, 0.99) * 1000:.0f}", str(len(html)), ""])
            ready = ready_in_chromium(port, path, "#timeline path.bar", loads)
            table.add([backend, "  timeline ready in chromium",
                       f"{statistics.median(ready) * 1000:.0f}", f"{max(ready) * 1000:.0f}",
                       "", "met" if statistics.median(ready) < GOAL_PAGE else "not met"])
            for what, live in (("Job page poll (/jobs/J/live, 5 runs)", "/jobs/job-00001/live"),
                               ("Run page poll (/runs/ID/live)", f"/runs/{run_id}/live")):
                took, html = requests(port, live, count)
                table.add([backend, what, f"{statistics.median(took) * 1000:.1f}",
                           f"{percentile(took, 0.99) * 1000:.1f}", str(len(html)), ""])
        finally:
            web.send_signal(signal.SIGTERM)
            web.wait(timeout=30)
            drop(url, prefix)
    print(f"(goal: the timeline ready under {GOAL_PAGE:g} s with {jobs} runs in its window; "
          "a poll every 2 s per open Job or Run page)")
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
    ap.add_argument("--no-live", action="store_true", help="without the live output figures")
    ap.add_argument("--hostile-only", action="store_true",
                    help="only the figures against an anonymous client (issue 32)")
    ap.add_argument("--console-only", action="store_true",
                    help="only the timeline and the Job and Run pages' polls (issue 31)")
    ap.add_argument("--code", default=ROOT,
                    help="--hostile-only: the checkout whose dblockrun serves (default: this)")
    args = ap.parse_args()
    if args.hostile_only:
        hostile(os.path.abspath(args.code))
        return
    if args.console_only:
        console(args.backends.split(","), args.jobs, args.runs, args.requests, args.loads)
        return
    if not args.no_live:
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
            filtered, html = requests(port, FILTERED, args.requests)
            if html.count(b"<tr data-job=") != 100 or b'data-kind="running"><b>' not in html:
                raise SystemExit("the filtered Fleet page did not show 100 jobs")
            loads = page_loads(port, args.loads)
            filtered_loads = page_loads(port, args.loads, FILTERED)
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
            table.add([backend, "GET /?state=running&sort=duration... (filtered)",
                       f"{statistics.median(filtered) * 1000:.0f}",
                       f"{percentile(filtered, 0.99) * 1000:.0f}",
                       f"{statistics.median(filtered) / base:.2f}", ""])
            for what, took in (("Fleet page", loads), ("filtered Fleet page", filtered_loads)):
                ready = statistics.median(took)
                table.add([backend, f"{what} ready in chromium", f"{ready * 1000:.0f}",
                           f"{max(took) * 1000:.0f} (max)", f"{ready / base:.2f}",
                           "met" if ready < GOAL_PAGE else "not met"])
        finally:
            web.send_signal(signal.SIGTERM)
            web.wait(timeout=30)
            drop(url, prefix)
    print(f"(goals: Fleet page and filtered Fleet page ready under {GOAL_PAGE:g} s, "
          f"GET /api/v1/status p99 under {GOAL_P99 * 1000:.0f} ms, with {args.jobs} jobs and "
          f"{args.jobs * args.runs} runs)")
    print(machine())
    table.print()


if __name__ == "__main__":
    main()
