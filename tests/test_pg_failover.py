"""A PostgreSQL primary and a streaming hot standby (scripts/pg-standby)
under real daemons, which use libpq's multi-host URL
(``postgresql://postgres@127.0.0.1:5441,127.0.0.1:5442/test?target_session_attrs=read-write``).

The primary crashes (``pg_ctl stop -m immediate``) and the standby is
promoted: what happens to a running command (self-fencing), how long until
the next start, and duplicates, with synchronous (``remote_apply``) and
asynchronous replication; committed claims lost in a failover (the standby
detached first), which a daemon must notice; a daemon given only the standby.
The pair runs on ports 5441-5442 under /tmp/dblockrun-pg-standby
(``PG_STANDBY_DIR``); when it cannot start the module is skipped, or fails
under CI=true.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from conftest import selected_backends, strict
from harness import Fleet, Process
from helpers import REPO, clean_env, dblockrun_cmd, new_prefix, wait_for

from dblockrun.store import Store

#: Ports 5441-5442 and one folder: its tests run on one xdist worker, in turn.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pg-failover")]

SCRIPT = REPO / "scripts" / "pg-standby"
PRIMARY, STANDBY = 5441, 5442
#: Every line of an outage (dblockrun/store/outage.py) starts with one of these.
OUTAGE = re.compile(r"database (unreachable|refused|is read-only|deadlock|schema|error) \(")

LONG_JOB = """\
jobs:
  long:
    cron: "* * * * * *"
    lock-at-most: 60s
    env: {{LOG: {log}}}
    command: |
      line="$DBLOCKRUN_JOB $DBLOCKRUN_SLOT $DBLOCKRUN_FENCING_TOKEN $DBLOCKRUN_HOST_ID $$"
      echo "start $line $(date +%s.%N)" >> "$LOG"
      trap 'echo "end $line $(date +%s.%N)" >> "$LOG"; exit 143' TERM
      sleep 30 & wait
"""

TICK_JOB = """\
jobs:
  tick:
    cron: "* * * * * *"
    lock-at-most: 10s
    env: {{LOG: {log}}}
    command: |
      line="$DBLOCKRUN_JOB $DBLOCKRUN_SLOT $DBLOCKRUN_FENCING_TOKEN $DBLOCKRUN_HOST_ID $$"
      echo "start $line $(date +%s.%N)" >> "$LOG"
"""


def url(*ports: int) -> str:
    """The URL of one node, or libpq's multi-host URL of several."""
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    query = "?target_session_attrs=read-write" if len(ports) > 1 else ""
    return f"postgresql://postgres@{hosts}/test{query}"


MULTI = url(PRIMARY, STANDBY)


@dataclass
class Pair:
    """scripts/pg-standby on one folder: a fresh pair per test."""

    dir: str

    def run(self, *args: str) -> str:
        done = subprocess.run([str(SCRIPT), args[0], self.dir, *args[1:]], capture_output=True,
                              text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"scripts/pg-standby {' '.join(args)}: "
                               f"{done.stderr.strip()[-2000:]}")
        return done.stdout

    def start(self, *, sync: bool) -> None:
        self.run("start", "--sync" if sync else "--async")

    def stop_primary(self) -> float:
        self.run("stop-primary")
        return time.time()

    def promote(self) -> float:
        self.run("promote")
        return time.time()


@pytest.fixture(scope="module")
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    if "postgresql" not in selected_backends(request.config):
        pytest.skip("postgresql is not among the selected backends")
    # One fixed folder: a pair left running by an interrupted run is stopped
    # by the next start, instead of holding the ports.
    folder = os.environ.get("PG_STANDBY_DIR", "/tmp/dblockrun-pg-standby")
    p = Pair(folder)
    try:
        p.start(sync=False)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        reason = f"cannot start a PostgreSQL primary and standby: {exc}"
        subprocess.run([str(SCRIPT), "stop", folder], capture_output=True, timeout=60)
        if strict():
            pytest.fail(f"{reason} (CI/DBLOCKRUN_TEST_STRICT: not skipping)", pytrace=False)
        pytest.skip(reason)
    yield p
    p.run("stop")


@dataclass
class Line:
    kind: str
    job: str
    slot: str
    token: int
    host: str
    pid: int
    at: float



def new_fleet(tmp_path: Path, db: str = MULTI) -> Fleet:
    """Daemons on ``db`` (the pair's multi-host URL), a table prefix of their own."""
    return Fleet(None, tmp_path, url=db, grace="2s")


def start_on(fleet: Fleet, jobs: str, n: int) -> None:
    """``n`` daemons on ``jobs`` (its ``{log}``: the fleet's runs.log), each
    with its metrics port."""
    fleet.start_n(n, fleet.jobs_file(jobs.format(log=fleet.workdir / "runs.log")),
                  metrics=True)


def log_lines(fleet: Fleet) -> list[Line]:
    log = fleet.workdir / "runs.log"
    if not log.exists():
        return []
    out = []
    for raw in log.read_text().splitlines():
        kind, job, slot, token, host, pid, at = raw.split()
        out.append(Line(kind, job, slot, int(token), host, int(pid), float(at)))
    return out


def started(fleet: Fleet) -> list[Line]:
    return [ln for ln in log_lines(fleet) if ln.kind == "start"]


def metric(daemon: Process, name: str) -> float:
    code, text = daemon.get("/metrics")
    assert code == 200, (code, text)
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def store_of(fleet: Fleet) -> Store:
    """A store on whichever node takes writes now (a new pool: the old
    one's connections may lead to the crashed primary)."""
    assert fleet.url is not None
    return Store(fleet.url, fleet.prefix)


def started_after(fleet: Fleet, at: float) -> Line | None:
    return next((s for s in started(fleet) if s.at > at), None)


def duplicates(starts: list[Line]) -> dict[tuple[str, str], int]:
    """(job, slot) started more than once, with how often."""
    counts = Counter((s.job, s.slot) for s in starts)
    return {key: n for key, n in counts.items() if n > 1}


def reused_tokens(starts: list[Line]) -> int:
    """Fencing tokens handed to more than one run (a lost claim's token given again)."""
    by_token: dict[tuple[str, int], set[str]] = {}
    for s in starts:
        by_token.setdefault((s.job, s.token), set()).add(s.slot)
    return sum(1 for slots in by_token.values() if len(slots) > 1)


def slot_of(line: Line) -> float:
    """DBLOCKRUN_SLOT (``2026-11-25T05:30:01Z``) as the run records hold it."""
    return datetime.fromisoformat(line.slot.replace("Z", "+00:00")).timestamp()


def forgotten(fleet: Fleet, crash: float) -> int:
    """Runs started before the crash that the promoted node has no record of."""
    with store_of(fleet) as store:
        kept = {(r.slot, r.token) for r in store.history("tick", 1000)}
    return sum(1 for s in started(fleet) if s.at < crash and (slot_of(s), s.token) not in kept)


def outage_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if OUTAGE.search(line)]


def tick_failover(pair: Pair, tmp_path: Path, *, sync: bool, detach: bool = False,
                  before: float = 4.0, after: float = 5.0) -> tuple[Fleet, dict[str, float]]:
    """Two daemons, a job every second; the primary crashes, the standby is
    promoted a second later. ``detach``: the standby stopped receiving WAL
    ``before`` seconds before the crash (every claim of those seconds is lost)."""
    pair.start(sync=sync)
    fleet = new_fleet(tmp_path)
    try:
        start_on(fleet, TICK_JOB, 2)
        wait_for(lambda: len(started(fleet)) >= 2, 30, what="the job to run")
        if detach:
            pair.run("detach")
        since = time.time()
        wait_for(lambda: time.time() - since >= before, before + 1, what="runs on the primary")
        crash = pair.stop_primary()
        wait_for(lambda: time.time() - crash >= 1.0, 2, what="a second without a primary")
        promoted = pair.promote()
        first = wait_for(lambda: started_after(fleet, promoted), 20,
                         what="a start on the new primary")
        wait_for(lambda: time.time() - promoted >= after, after + 1,
                 what="runs on the new primary")
    except BaseException:
        fleet.stop()
        raise
    figures = {"crash": crash, "promoted": promoted,
               "crash_to_start": first.at - crash, "promote_to_start": first.at - promoted}
    return fleet, figures


def test_promote_while_a_long_job_runs_fences_the_command(pair: Pair, tmp_path: Path) -> None:
    # Synchronous replication: the lease on the promoted node is exactly the
    # last renewal the old primary acknowledged.
    pair.start(sync=True)
    fleet = new_fleet(tmp_path)
    try:
        start_on(fleet, LONG_JOB, 2)
        first = wait_for(lambda: started(fleet) or None, 30, what="the command's start")[0]
        crash = pair.stop_primary()
        # Renewals fail (5441 refuses, 5442 is read-only): the command is
        # stopped before the lease could expire; only then is the standby promoted.
        end = wait_for(lambda: next((ln for ln in log_lines(fleet) if ln.kind == "end"
                                     and ln.token == first.token), None), 10,
                       what="the command to be stopped")
        # The standby holds the holder's lease (it applied every renewal the
        # primary acknowledged), read before the promotion: the lease runs
        # out 2 s after the stop, sooner than a promotion on a busy machine.
        with Store(url(STANDBY), fleet.prefix) as standby:
            lock = standby.lock_state("long")
        assert lock is not None and lock.lock_until is not None
        assert lock.token == first.token
        promoted = pair.promote()
        with store_of(fleet) as store:
            # The promoted node has that lease, or a claim made once it ran out.
            now = store.lock_state("long")
            assert now is not None and now.locked_at is not None
            assert now.token == first.token or now.locked_at >= lock.lock_until - 0.1, now
            nxt = wait_for(lambda: next((s for s in started(fleet) if s.token > first.token),
                                        None), 30, what="the next start on the new primary")
            runs = store.history("long", 100)
        print(f"\nprimary crashed: command stopped {end.at - crash:.2f}s after, "
              f"{lock.lock_until - end.at:.2f}s before its lease could expire; "
              f"standby promoted {promoted - crash:.2f}s after the crash; next start "
              f"{nxt.at - promoted:.2f}s after the promotion "
              f"({nxt.at - crash:.2f}s after the crash)")
        assert end.at < lock.lock_until
        assert nxt.at >= lock.lock_until - 0.1  # nobody started while the lease held
        assert not duplicates(started(fleet))
        slots = [r.slot for r in runs if r.slot is not None and r.result != "skipped"]
        assert len(slots) == len(set(slots))
        assert all(d.alive() for d in fleet), "the daemons keep serving"
    finally:
        fleet.stop()


def test_synchronous_replication_no_duplicate_across_failover(pair: Pair, tmp_path: Path) -> None:
    fleet, figures = tick_failover(pair, tmp_path, sync=True)
    try:
        starts = started(fleet)
        dup, reused = duplicates(starts), reused_tokens(starts)
        print(f"\nsynchronous (remote_apply): {len(starts)} starts, {len(dup)} duplicate slots, "
              f"{reused} fencing tokens given twice; first start "
              f"{figures['promote_to_start']:.2f}s after the promotion "
              f"({figures['crash_to_start']:.2f}s after the crash)")
        assert not dup, dup
        assert reused == 0
        for i in range(2):
            assert "went backwards" not in fleet[i].text()
        assert all(d.alive() for d in fleet)
    finally:
        fleet.stop()


def test_asynchronous_replication_failover_measured(pair: Pair, tmp_path: Path) -> None:
    # Measured, not asserted: whether a crash loses the newest claims depends
    # on the replication lag at that instant (milliseconds here).
    fleet, figures = tick_failover(pair, tmp_path, sync=False)
    try:
        starts = started(fleet)
        lost = forgotten(fleet, figures["crash"])
        backwards = sum(fleet[i].text().count("went backwards") for i in range(2))
        print(f"\nasynchronous: {len(starts)} starts, {len(duplicates(starts))} duplicate slots, "
              f"{reused_tokens(starts)} fencing tokens given twice, {lost} runs the new "
              f"primary does not know, {backwards} went-backwards lines; first start "
              f"{figures['promote_to_start']:.2f}s after the promotion "
              f"({figures['crash_to_start']:.2f}s after the crash)")
        assert started_after(fleet, time.time() - 3), "the fleet runs the job again"
        assert all(d.alive() for d in fleet)
    finally:
        fleet.stop()


def test_lost_claims_are_noticed_and_no_daemon_runs_a_slot_twice(
    pair: Pair, tmp_path: Path,
) -> None:
    # The standby stops receiving WAL 4 s before the crash: the claims of
    # those seconds are committed on the old primary only, and lost.
    fleet, figures = tick_failover(pair, tmp_path, sync=False, detach=True)
    try:
        starts = started(fleet)
        logs = [fleet[i].text() for i in range(2)]
        lines = [sum(1 for ln in text.splitlines() if "went backwards" in ln) for text in logs]
        counted = [metric(fleet[i], "dblockrun_database_went_backwards_total") for i in range(2)]
        mine = {host: Counter(s.slot for s in starts if s.host == host)
                for host in {s.host for s in starts}}
        again = {host: [slot for slot, n in slots.items() if n > 1]
                 for host, slots in mine.items()}
        print(f"\nlost claims (standby detached 4 s before the crash): {len(starts)} starts, "
              f"{forgotten(fleet, figures['crash'])} runs the new primary does not know, "
              f"{reused_tokens(starts)} fencing tokens given twice, "
              f"{len(duplicates(starts))} duplicate slots; went-backwards lines per daemon "
              f"{lines}, metric {counted}; first start {figures['promote_to_start']:.2f}s "
              f"after the promotion")
        assert reused_tokens(starts) > 0, "the failover should have lost claims"
        assert sum(lines) >= 1 and max(lines) <= 1, logs
        assert counted == [float(n) for n in lines]
        assert all(not slots for slots in again.values()), again
        assert all(d.alive() for d in fleet)
    finally:
        fleet.stop()


def test_a_daemon_on_the_standby_says_read_only_once_then_runs_when_promoted(
    pair: Pair, tmp_path: Path,
) -> None:
    pair.start(sync=False)
    fleet = new_fleet(tmp_path, url(STANDBY))
    with Store(url(PRIMARY), fleet.prefix) as store:
        store.ensure_schema()
        store.ensure_jobs(["tick"])
    table = f"{fleet.prefix}locks"

    def replicated() -> bool:
        with psycopg.connect(url(STANDBY), connect_timeout=5) as conn:
            return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone() \
                == (True,)

    wait_for(replicated, 10, what="the schema on the standby")
    try:
        start_on(fleet, TICK_JOB, 1)
        wait_for(lambda: "read-only" in fleet[0].text(), 20, what="the read-only line")
        since = time.time()  # several retries (backoff 0.5, 1, 2 s): still one line
        wait_for(lambda: time.time() - since >= 4, 5, what="four seconds of retries")
        log = fleet[0].text()
        assert fleet[0].alive(), "it keeps trying"
        assert not started(fleet)
        outages = outage_lines(log)
        assert len(outages) == 1, log
        assert "database is read-only (a standby, or read_only set)" in outages[0]
        pair.run("stop-primary")
        promoted = pair.promote()
        first = wait_for(lambda: started(fleet) or None, 20, what="a run once promoted")[0]
        log = fleet[0].text()
        print(f"\nread-only standby: one line, then the first start "
              f"{first.at - promoted:.2f}s after the promotion")
        assert "database back" in log
        assert len(outage_lines(log)) == 1, log
    finally:
        fleet.stop()


def test_the_multi_host_url_reaches_the_primary_directly_and_pooled(
    pair: Pair, tmp_path: Path,
) -> None:
    # exec's direct psycopg connection and the daemon's pooled engine both
    # pass over the standby (first in the list here) to the node that writes.
    from dblockrun.store.drivers import direct_driver

    pair.start(sync=False)
    standby_first = url(STANDBY, PRIMARY)
    driver = direct_driver(standby_first)
    assert driver is not None
    conn = driver.connect()
    try:
        assert conn.info.port == PRIMARY
    finally:
        conn.close()
    prefix = new_prefix()
    with Store(standby_first, prefix) as store:
        store.ensure_jobs(["j"])
        assert store.claim("j", "h", 30) is not None
    done = subprocess.run([*dblockrun_cmd(), "--db", standby_first, "--table-prefix", prefix,
                           "exec", "--name", "j2", "--", "true"], env=clean_env(),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
