"""`dblockrun drain HOST` and `undrain HOST` (issue 37 item 6), on every
backend: a drained host wins no claim on any path and its daemon starts
nothing new, while the other hosts run every slot once; its running run
finishes and `drain --wait` returns after it; its every-host slots are
recorded `skipped: host drained` through the slot book; `undrain` and
`--for` end it by the database clock; status and the audit trail say so."""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from harness import Fleet
from helpers import Ran, TestDb, clean_env, dblockrun_cmd, invoke, wait_for

from dblockrun.ops.who import operator_id
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.control import Audit
from dblockrun.store.engine import Claim

JOBS = """\
jobs:
  tick:
    cron: '* * * * * *'
    command: 'true'
  long:
    rate: 1h
    command: 'while [ ! -e {flag} ]; do sleep 0.1; done'
  each:
    cron: '*/2 * * * * *'
    on: every-host
    command: 'true'
"""


def on(host: str, runs: list[m.RunRecord]) -> list[m.RunRecord]:
    return [r for r in runs if r.host.startswith(f"{host}:")]


@pytest.mark.slow
def test_a_drained_host_starts_nothing_while_the_others_run_every_slot(
        db: TestDb, store: Store, fleet: Fleet) -> None:
    flag = fleet.workdir / "finish-long"  # the long run ends when it appears
    jobs = fleet.jobs_file(JOBS.format(flag=flag))
    # 10 s leases: nothing here measures failover, and the long run must not
    # lose its lease to a starved renewal under load.
    alpha = fleet.start(jobs, "--label", "hostname=alpha", name="alpha", lease="10s")
    # alpha alone takes `long` first: the run the drain lets finish.
    (long_run,) = wait_for(lambda: on("alpha", store.control.running("long")) or None, 30,
                           what="long running on alpha")
    for name in ("beta", "gamma"):
        fleet.start(jobs, "--label", f"hostname={name}", name=name, lease="10s")
    wait_for(lambda: len(store.live_hosts()) == 3 or None, 30, what="3 live daemons")
    said = fleet.workdir / "drain.out"
    with said.open("w") as out:
        drain = subprocess.Popen(
            [*dblockrun_cmd(), *fleet.database(), "drain", "alpha", "--reason",
             "kernel update", "--wait"], stdout=out, stderr=subprocess.STDOUT, text=True,
            env=clean_env(), cwd=fleet.workdir)
    waiting = f"long: run {long_run.id}, running for "
    wait_for(lambda: waiting in said.read_text(), 30, what="drain --wait naming the long run")
    drained = store.drains.drained("alpha")
    assert drained is not None and drained.who == operator_id()
    since = drained.since
    # The daemon heard of it (NOTIFY, the doorbell, or its bookkeeping round).
    alpha.wait_log("host alpha drained by", 15)
    # Four slots of tick after the drain: each has its record.
    first = math.floor(since) + 1
    slots = [float(first + i) for i in range(4)]

    def ticks() -> list[m.RunRecord]:
        return [r for r in store.history("tick", 1000) if r.slot in slots]

    # (ended: a run of the last slot may still be going when its record is seen)
    wait_for(lambda: {r.slot for r in ticks() if r.finished is not None} == set(slots) or None,
             30, interval=0.2, what="an ended record of each of four tick slots")
    # Nothing started on alpha: its only records since are its every-host skips.
    mine = on("alpha", [r for r in store.history(None, 1000) if r.started > since])
    assert {(r.job, r.result) for r in mine} <= {("each@alpha", m.SKIPPED)}, mine
    recorded = ticks()
    assert all(r.host.split(":")[0] in ("beta", "gamma") for r in recorded), recorded
    per_slot = Counter(r.slot for r in recorded)
    assert set(per_slot.values()) == {1}, per_slot
    assert {r.result for r in recorded} == {m.OK}, recorded
    # alpha's every-host slots: recorded skipped, each once, by alpha.
    skipped = [r for r in store.history("each@alpha", 1000) if r.started > since]
    assert skipped and all(r.result == m.SKIPPED for r in skipped), skipped
    assert {r.output for r in skipped} == {"skipped: host drained\n"}
    assert len({r.slot for r in skipped}) == len(skipped)
    assert any(r.result == m.OK for r in store.history("each@beta", 1000) if r.started > since)
    # --wait still waits for the run, which the drain leaves alone; it
    # returns once the run has ended ok (not killed).
    assert drain.poll() is None, said.read_text()
    going = store.run(long_run.id)
    assert going is not None and going.result == m.RUNNING, going
    flag.touch()
    assert drain.wait(timeout=60) == 0, said.read_text()
    done = store.run(long_run.id)
    assert done is not None and done.result == m.OK, done
    lines = said.read_text().splitlines()
    assert lines[0].startswith("host alpha drained until undrained in ")
    # (a tick or an every-host run of alpha's may be ending too)
    assert re.search(r": it starts nothing new, the other hosts take its slots; "
                     r"\d+ runs? still going there will finish$", lines[0]), lines
    waits = lines[1:-1]
    assert waits and all(w.startswith("waiting for ") for w in waits), lines
    assert waiting in waits[-1], lines
    assert lines[-1].startswith("host alpha: no run going any more (waited "), lines
    # status says so first and marks the host; the audit trail has it.
    status = fleet.cli("status", "--wide")
    assert status.returncode == 0, status.stderr
    assert (f"DRAINED alpha until undrained, by {operator_id()} since "
            in status.stdout), status.stdout
    assert "kernel update; it starts nothing new (`dblockrun undrain alpha` ends it)" in (
        " ".join(status.stdout.split()))
    assert "(drained)" in status.stdout
    doc = json.loads(fleet.cli("status", "--json").stdout)
    (host,) = [h for h in doc["hosts"] if h["labels"]["hostname"] == "alpha"]
    assert host["drained"]["by"] == operator_id()
    assert host["drained"]["reason"] == "kernel update"
    assert host["drained"]["until"] == "forever"
    audit = fleet.cli("audit", "--json")
    entry = json.loads(audit.stdout)["entries"][0]
    assert (entry["action"], entry["detail"], entry["reason"]) == (
        "drain", "host alpha", "kernel update")
    # undrain: alpha claims again (its every-host job runs there).
    undone = fleet.cli("undrain", "alpha")
    assert undone.stdout.startswith("host alpha undrained in "), undone
    back = store.db_now()
    wait_for(lambda: any(r.result == m.OK and r.started > back
                         for r in store.history("each@alpha", 100)), 20,
             what="each@alpha run again after undrain")
    alpha.wait_log("host alpha no longer drained (undrained): claiming again", 10)
    assert fleet.stop() == [0, 0, 0]


@pytest.mark.slow
def test_a_drain_for_a_while_ends_by_itself_and_the_daemon_claims_again(
        store: Store, fleet: Fleet) -> None:
    jobs = fleet.jobs_file("jobs:\n  each:\n    cron: '* * * * * *'\n    on: every-host\n"
                           "    command: 'true'\n")
    alpha = fleet.start(jobs, "--label", "hostname=alpha", name="alpha", lease="6s")
    wait_for(lambda: store.history("each@alpha", 1) or None, 30, what="each@alpha ran")
    drained = fleet.cli("drain", "alpha", "--for", "3s")
    assert drained.returncode == 0, drained.stderr
    drain = store.drains.drained("alpha")
    assert drain is not None and drain.ends == pytest.approx(drain.since + 3)
    alpha.wait_log("host alpha no longer drained (its time ran out): claiming again", 20)
    wait_for(lambda: any(r.result == m.OK and r.slot is not None and r.slot >= drain.ends
                         for r in store.history("each@alpha", 100)), 10,
             what="each@alpha run again after the drain's end")
    during = [r for r in store.history("each@alpha", 100)
              if r.slot is not None and drain.since + 1 <= r.slot < drain.ends]
    assert during and {(r.result, r.output) for r in during} == {
        (m.SKIPPED, "skipped: host drained\n")}, during
    assert store.drains.current() == []
    assert alpha.stop() == 0


def test_every_claim_path_refuses_a_drained_host(store: Store) -> None:
    """Single, batch, run-now, exec's claim, fan-out items: all built from
    Queries.claimable, all refused to a holder on a drained host, and to no
    other host (not even one whose name begins with the drained one's)."""
    store.ensure_jobs(["single", "b1", "b2", "asked", "ex", "fan"])
    store.items.sync("fan", ["x"])
    store.request_run("asked")

    def claims(holder: str) -> list[object]:
        slot = store.db_now() - 0.5
        engine = store.lock_engine()
        return [
            store.claim("single", holder, 30),
            store.claim_batch(["b1", "b2"], holder, 30, slot=slot, next_due=slot + 60,
                              limit=2) or None,
            store.claim_requested("asked", holder, 30),
            engine.claim("ex", holder, 30, Claim(record=True, check=True), ensure=True),
            store.items.claim("fan", holder, 30, slot=slot, rate=None, limit=1) or None,
        ]

    store.drains.drain("web1", Audit("alice@ops-1", "drain", detail="host web1"), None)
    assert claims("web1:77:0b1d2e") == [None] * 5
    assert None not in claims("web10:77:0b1d2e")


def test_drain_for_a_while_ends_by_the_database_clock(store: Store) -> None:
    store.ensure_jobs(["j"])
    drain = store.drains.drain("web1", Audit("alice@ops-1", "drain"), 1.5)
    assert drain.ends == pytest.approx(drain.since + 1.5)
    assert store.claim("j", "web1:1:aa", 30) is None
    assert [d.host for d in store.drains.current()] == ["web1"]
    wait_for(lambda: store.claim("j", "web1:1:aa", 30), 10, what="the claim after the drain")
    lock = store.lock_state("j")
    assert lock is not None and lock.locked_at is not None and lock.locked_at >= drain.ends
    assert store.drains.drained("web1") is None and store.drains.current() == []
    # An undrain now finds none, and audits nothing.
    before = len(store.control.entries())
    assert store.drains.undrain("web1", Audit("alice@ops-1", "undrain")) is None
    assert len(store.control.entries()) == before


def test_draining_an_unknown_host_names_the_live_ones(sqlite_db: TestDb) -> None:
    def cli(*args: str, process: bool = False) -> subprocess.CompletedProcess[str] | Ran:
        """In-process (helpers.invoke) unless ``process``."""
        head = ("--db", sqlite_db.url, "--table-prefix", sqlite_db.prefix)
        if not process:
            return invoke(*head, *args)
        return subprocess.run([*dblockrun_cmd(), *head, *args], capture_output=True,
                              text=True, env=clean_env(), timeout=60)

    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        store.ensure_schema()
        for holder, name in (("alpha:1:a", "alpha"), ("beta:2:b", "beta")):
            store.books_round(holder, hostname="vm", pid=1, version="0.1.0", clock_offset=0.0,
                              running=0, jobs="{}", within=3.0,
                              labels=json.dumps({"hostname": name}), targets=None)
        # A real process: exit 2, one line, no traceback, end to end.
        typo = cli("drain", "alpah", process=True)
        assert (typo.returncode, typo.stdout) == (2, "")
        assert typo.stderr == ("dblockrun: no live host is named 'alpah' (live hosts: alpha, "
                               "beta); --force drains it anyway (a host that is down or not "
                               "started)\n")
        assert store.drains.current() == []
        forced = cli("drain", "gamma", "--force", "--for", "2h")
        assert forced.returncode == 0, forced.stderr
        assert forced.stdout.startswith("host gamma drained until ")
        assert [d.host for d in store.drains.current()] == ["gamma"]
        bad = cli("drain", "no such host")
        assert bad.returncode == 2 and "host name 'no such host'" in bad.stderr
        assert cli("undrain", "alpha").stdout.startswith("host alpha was not drained in ")


def test_the_hosts_page_shows_a_drain_and_drains_behind_the_confirmation(
        store: Store, tmp_path: Path) -> None:
    from starlette.testclient import TestClient
    from webtools import PASSWORD, app_for, bearer, csrf_of, users_file

    for holder, name in (("alpha:1:a", "alpha"), ("beta:2:b", "beta")):
        store.books_round(holder, hostname="vm", pid=1, version="0.1.0", clock_offset=0.0,
                          running=0, jobs="{}", within=3.0,
                          labels=json.dumps({"hostname": name}), targets=None)
    client = TestClient(app_for(store, users_file(tmp_path / "users.yaml")))

    def sign_in(name: str) -> None:
        client.post("/login", data={"name": name, "password": PASSWORD, "next": "/",
                                    "csrf": csrf_of(client.get("/login").text)})

    sign_in("olga")  # an operator: drain needs an admin
    assert 'id="denied"' in client.get("/confirm/drain?host=alpha").text
    assert "/confirm/drain" not in client.get("/hosts").text
    client.cookies.clear()
    sign_in("adam")
    page = client.get("/hosts").text
    assert '<a class="action danger" href="/confirm/drain?host=alpha">Drain</a>' in page
    confirm = client.get("/confirm/drain?host=alpha").text
    assert "Confirm: drain host alpha" in confirm
    assert '<input type="hidden" name="host" value="alpha">' in confirm
    # The form's CSRF token is required.
    refused = client.post("/act/drain", data={"host": "alpha", "csrf": "forged"},
                          follow_redirects=False)
    assert refused.status_code == 403 and store.drains.current() == []
    done = client.post("/act/drain", data={"host": "alpha", "for": "2h", "reason": "disk",
                                           "csrf": csrf_of(confirm)}, follow_redirects=False)
    assert (done.status_code, done.headers["location"]) == (303, "/hosts")
    drained = store.drains.drained("alpha")
    assert drained is not None and (drained.who, drained.reason) == ("web:adam", "disk")
    assert drained.ends == pytest.approx(drained.since + 7200)
    page = client.get("/hosts").text
    assert re.search(r'<p class="banner" id="drained-alpha">DRAINED alpha for <time [^>]+>'
                     r'(2h|1h59m\d+s)</time>, by web:adam since <time [^>]+>[^<]+</time>: disk\.',
                     page), page
    assert '<a class="action" href="/confirm/undrain?host=alpha">Undrain</a>' in page
    assert "drain host alpha for 2h" in " ".join(
        f"{e.action} {e.detail}" for e in store.control.entries())
    # A name no live daemon has is refused, as by the command (no --force here).
    typo = client.post("/act/drain", data={"host": "alpah", "csrf": csrf_of(confirm)})
    assert "no live host is named &#39;alpah&#39; (live hosts: alpha, beta)" in typo.text
    # The API: undrain with an admin's token.
    api = client.post("/api/v1/hosts/alpha/undrain", headers=bearer("adam"))
    assert api.json() == {"ok": True, "message": "host alpha undrained: it claims slots again",
                          "host": "alpha", "undrained": True}
    assert store.drains.current() == []
    assert "/confirm/drain?host=alpha" in client.get("/hosts").text


def test_exec_on_a_drained_host_exits_as_for_a_busy_lock(db: TestDb, store: Store) -> None:
    import os

    host = os.uname().nodename  # exec's holder: this machine's name
    store.drains.drain(host, Audit("alice@ops-1", "drain", reason="disk"), None)

    def exec_(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix,
                               "exec", "--name", "ex", *args, "--", "echo", "ran"],
                              capture_output=True, text=True, env=clean_env(), timeout=60)

    quiet = exec_()
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    loud = exec_("-v", "--busy-exit-code", "75")
    assert (loud.returncode, loud.stdout) == (75, "")
    assert (f"lock ex: this host ({host}) is drained (by alice@ops-1: disk); not running"
            in loud.stderr)
    assert store.history("ex") == []
    store.drains.undrain(host, Audit("alice@ops-1", "undrain"))
    assert exec_().stdout == "ran\n"
