"""Job chains (``after:``) with real daemons on every backend: each finished
upstream run whose result a downstream job's ``on:`` takes starts exactly
one run of it across the fleet (dblockrun/daemon/chains.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from harness import Fleet
from helpers import FIRST_RUN, cli, wait_for
from hooks import Hooks

from dblockrun.notify.pings import run_uuid
from dblockrun.store import models as m

#: How long the fleet runs the chain (the upstream runs every 3 s).
RUN_SECONDS = 27

CHAIN = """\
jobs:
  extract:
    cron: "*/3 * * * * *"
    env: {{COUNT: {count}}}
    # Every third run fails (runs never overlap: one counter for the fleet).
    command: |
      echo x >> "$COUNT"
      n=$(wc -l < "$COUNT")
      sleep 0.3
      [ $((n % 3)) -ne 0 ]
  load:
    after: extract
    env: {{LOG: {log}}}
    command: |
      echo "$DBLOCKRUN_UPSTREAM_JOB $DBLOCKRUN_UPSTREAM_RUN $DBLOCKRUN_UPSTREAM_RESULT \
      $DBLOCKRUN_RUN_ID" >> "$LOG"
  page:
    after: {{jobs: [extract], on: failure}}
    command: "true"
  audit:
    after: {{jobs: [extract], on: any}}
    command: "true"
"""


def upstream_of(runs: list[m.RunRecord]) -> list[int]:
    return sorted(r.upstream_run for r in runs if r.upstream_run is not None)


@pytest.mark.slow
def test_three_daemons_start_one_downstream_run_per_upstream_run(
        fleet: Fleet, tmp_path: Path) -> None:
    log = tmp_path / "load.log"
    fleet.start_n(3, CHAIN.format(count=tmp_path / "count", log=log))
    store = fleet.store
    wait_for(lambda: len(store.hosts(seen_within=30)) == 3, 30, what="3 daemons registered")
    begin = time.monotonic()
    wait_for(lambda: time.monotonic() - begin >= RUN_SECONDS or not all(
        d.alive() for d in fleet), RUN_SECONDS + 5, interval=0.5, what="the run period")
    assert all(d.alive() for d in fleet), "a daemon died"
    # The upstream runs over by now: each gets its downstream runs (within a round).
    ended = [r for r in fleet.runs("extract") if r.result in (m.OK, m.FAILED)]

    def chained() -> bool:
        have = {job: set(upstream_of(fleet.runs(job))) for job in ("load", "page", "audit")}
        return all(r.id in have["audit"] for r in ended) and all(
            r.id in have["load" if r.result == m.OK else "page"] for r in ended)

    wait_for(chained, 15, interval=0.2, what="the downstream runs of the upstream runs")
    status = json.loads(fleet.cli("status", "--json").stdout)
    codes = fleet.stop()
    assert codes == [0, 0, 0], [d.text() for d in fleet]
    extract = {r.id: r for r in fleet.runs("extract")}
    ok = sorted(i for i, r in extract.items() if r.result == m.OK)
    failed = sorted(i for i, r in extract.items() if r.result == m.FAILED)
    assert len(ok) >= 5 and len(failed) >= 2, extract
    # One to one: never two downstream runs for one upstream run, and only
    # for the results their on: takes (a run that ended while the fleet
    # stopped may have none).
    for job, wanted in (("load", ok), ("page", failed), ("audit", sorted(ok + failed))):
        runs = fleet.runs(job)
        assert all(r.result == m.OK for r in runs), runs
        got = upstream_of(runs)
        assert len(got) == len(set(got)) == len(runs), f"{job}: {got}"
        assert set(got) <= set(wanted) and set(got) >= {r.id for r in ended
                                                        if r.id in wanted}, (job, got, wanted)
        for run in runs:  # each started after its upstream run ended
            upstream = extract[run.upstream_run or 0]
            assert run.upstream_job == "extract"
            assert upstream.finished is not None and run.started >= upstream.finished
    # The command was told which run started it.
    told = [line.split() for line in log.read_text().splitlines()]
    by_run = {int(run_id): (job, int(up), result) for job, up, result, run_id in told}
    assert {r.id: ("extract", r.upstream_run, "ok") for r in fleet.runs("load")} == by_run
    # The work spread over the fleet; status says what each job runs after.
    assert len({r.host for r in fleet.runs("load")}) >= 1
    after = {job["name"]: job["after"] for job in status["jobs"]}
    assert after["load"] == "after extract" and after["page"] == "after extract (on failure)"
    assert after["extract"] is None
    history = json.loads(fleet.cli("history", "load", "--json").stdout)["runs"]
    assert history[0]["upstream"] == {"job": "extract", "run": fleet.runs("load")[-1].upstream_run}


SPLIT = """\
jobs:
  extract:
    rate: 2s
    run-on: {{role: a}}
    command: sleep 0.2
{load}"""
LOAD = """\
  load:
    after: extract
    run-on: {role: b}
    command: "true"
"""


def test_an_upstream_host_killed_after_its_run_ended_still_starts_one_run(
        fleet: Fleet) -> None:
    """The upstream's host dies (kill -9) after its run ended and before it
    made the trigger (its file has no downstream job, so it never makes
    one): another host's bookkeeping makes it, and one host runs it once."""
    runners = [fleet.start(fleet.jobs_file(SPLIT.format(load=LOAD), "full.yaml"),
                           "--label", "role=b", name=f"b{i}") for i in range(2)]
    # Up before the first upstream run: a new after: starts nothing for runs before it.
    wait_for(lambda: len(fleet.store.hosts(seen_within=30)) == 2, 30, what="2 daemons up")
    upstream_host = fleet.start(fleet.jobs_file(SPLIT.format(load=""), "extract.yaml"),
                                "--label", "role=a", name="a")
    first = wait_for(lambda: next(iter(fleet.runs("extract", m.OK)), None), 20,
                     what="extract's first run")
    upstream_host.kill()
    ended = {r.id for r in fleet.runs("extract") if r.result == m.OK}
    wait_for(lambda: set(upstream_of(fleet.runs("load"))) >= ended, 15, interval=0.2,
             what="load after each of extract's runs")
    # A few rounds more: still exactly one run per upstream run.
    time.sleep(3)
    loads = fleet.runs("load")
    assert sorted(upstream_of(loads)) == sorted(ended) and first.id in ended
    assert all(fleet.of(r.host) in runners for r in loads)
    assert all(r.result == m.OK for r in loads)
    assert fleet.stop()[:2] == [0, 0]


# test_a_trigger_of_a_disabled_job_is_recorded_skipped
# moved to tests/test_firing_memory.py (one daemon on the memory
# store; its SQL on every database: tests/test_chain_contract.py).


def test_a_cycle_is_refused_at_load(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  a: {after: b, command: x}\n  b: {after: a, command: x}\n")
    # A real process: validate's exit 2, one line and no traceback end to end.
    done = cli("validate", str(jobs))
    assert done.returncode == 2
    assert done.stderr == (f"dblockrun: {jobs}:2: job 'a': after: a cycle: a after b after a "
                           "(a chain must end)\n")
    assert "Traceback" not in done.stderr


# test_a_run_with_retries_starts_one_run_for_its_last_attempt,
# test_a_trigger_while_the_fleet_is_paused_is_recorded_skipped and
# test_a_trigger_whose_group_is_full_is_recorded_skipped
# moved to tests/test_firing_memory.py (one daemon on the memory
# store; its SQL on every database: tests/test_chain_contract.py).


TOLD = """\
jobs:
  extract:
    rate: 1h
    command: "true"
  load:
    after: extract
    command: 'echo out-$DBLOCKRUN_UPSTREAM_RUN; exit 3'
    notify:
      urls: ['{hook}']
    ping: '{ping}'
"""


def test_a_triggered_run_is_notified_and_pinged_as_a_slots_run(
        fleet: Fleet, hooks: Hooks) -> None:
    """Its failure notification names the job, the run, its host and the
    upstream run that started it; its pings carry its run id and output."""
    d = fleet.start(TOLD.format(hook=hooks.url("json", "/hook"), ping=hooks.url("http", "/ping")))
    d.wait(lambda: len(hooks.under("/hook")) == 1 and len(hooks.under("/ping")) == 2,
           FIRST_RUN, "load's notification and pings")
    assert d.stop() == 0
    extract, = fleet.runs("extract")
    load, = fleet.runs("load")
    assert (load.result, load.upstream_run) == (m.FAILED, extract.id)
    hit, = hooks.under("/hook")
    assert hit.json()["title"] == f"dblockrun: job load failed on {load.host.split(':')[0]}"
    assert [(name, hit.field(name)) for name in ("job", "event", "exit status", "host", "run",
                                                 "after")] == [
        ("job", "load"), ("event", "failure"), ("exit status", "3"), ("host", load.host),
        ("run", str(load.id)), ("after", f"extract {extract.id} (ok)")]
    assert hit.json()["message"].endswith(f"out-{extract.id}")
    rid = run_uuid("load", load.id)
    assert [(h.path, h.query, h.body) for h in hooks.under("/ping")] == [
        ("/ping/start", {"rid": [rid]}, b""),
        ("/ping/fail", {"rid": [rid]}, f"out-{extract.id}\n".encode())]


FULL = """\
jobs:
  hog:
    rate: 1h
    run-on: {{role: full}}
    env: {{GO: {go}}}
    command: while [ ! -e "$GO" ]; do sleep 0.1; done
  extract:
    rate: 1s
    run-on: {{role: upstream}}
    command: "true"
{load}"""
FULL_LOAD = """\
  load:
    after: extract
    run-on: {role: [full, free]}
    command: "true"
"""


def start_full_host(fleet: Fleet, go: Path) -> None:
    """A host at its --max-running 1 (hog runs until ``go``) that runs load."""
    fleet.start(fleet.jobs_file(FULL.format(go=go, load=FULL_LOAD), "full.yaml"),
                "--max-running", "1", "--label", "role=full", name="full")
    wait_for(lambda: fleet.runs("hog", m.RUNNING) or None, 20, what="hog running")


def start_upstream_host(fleet: Fleet, go: Path) -> None:
    """The host that runs extract; its file has no load, so it makes no
    trigger: the downstream hosts' looks make them."""
    fleet.start(fleet.jobs_file(FULL.format(go=go, load=""), "extract.yaml"),
                "--label", "role=upstream", name="upstream")


def test_a_host_at_max_running_leaves_a_trigger_to_a_host_with_room(
        fleet: Fleet, tmp_path: Path) -> None:
    go = tmp_path / "go"
    start_full_host(fleet, go)
    fleet.start(fleet.jobs_file(FULL.format(go=go, load=FULL_LOAD), "full.yaml"),
                "--label", "role=free", name="free")
    wait_for(lambda: len(fleet.store.hosts(seen_within=30)) == 2, 30, what="2 daemons up")
    start_upstream_host(fleet, go)
    wait_for(lambda: len(fleet.runs("extract", m.OK)) >= 4, 20, what="4 runs of extract")
    assert fleet[2].stop() == 0  # no more upstream runs
    ended = {r.id for r in fleet.runs("extract", m.OK)}
    wait_for(lambda: set(upstream_of(fleet.runs("load"))) >= ended, 15, interval=0.2,
             what="load after each of extract's runs")
    go.touch()
    assert fleet.stop() == [0, 0, 0]
    loads = fleet.runs("load")
    # Each once, all by the host with room: the full one left every trigger
    # pending (no skipped record), whichever host looked first.
    assert sorted(upstream_of(loads)) == sorted(ended)
    assert {(fleet.of(r.host) is fleet[1], r.result) for r in loads} == {(True, m.OK)}, [
        (r.host, record.output) for r in loads if (record := fleet.store.run(r.id)) is not None
        and r.result != m.OK]


def test_a_host_at_max_running_takes_a_trigger_once_its_run_ends(
        fleet: Fleet, tmp_path: Path) -> None:
    go = tmp_path / "go"
    start_full_host(fleet, go)
    start_upstream_host(fleet, go)
    wait_for(lambda: len(fleet.runs("extract", m.OK)) >= 3, 20, what="3 runs of extract")
    assert fleet[1].stop() == 0  # no more upstream runs
    ended = {r.id for r in fleet.runs("extract", m.OK)}

    def pending() -> set[int]:
        return {t.upstream_run for t in fleet.store.pending_triggers(["load"])}

    # The full host's look makes the triggers (the upstream host makes none)...
    wait_for(lambda: pending() == ended, 15, interval=0.2, what="load's triggers made")
    time.sleep(1.5)  # ...and its next look (1.2 s) leaves them pending, with no record.
    assert pending() == ended and fleet.runs("load") == []
    go.touch()  # hog ends: the host has room, one run at a time
    wait_for(lambda: set(upstream_of(fleet.runs("load"))) >= ended, 15, interval=0.2,
             what="load after each of extract's runs")
    assert fleet.stop()[0] == 0
    loads = fleet.runs("load")
    assert sorted(upstream_of(loads)) == sorted(ended)
    assert {r.result for r in loads} == {m.OK}
    hog, = fleet.runs("hog")
    assert hog.finished is not None and min(r.started for r in loads) >= hog.finished


TOGETHER = """\
jobs:
  a: {{rate: 1h, run-on: {{role: upstream}}, command: "true"}}
  b: {{rate: 1h, run-on: {{role: upstream}}, command: "true"}}
{load}"""
TOGETHER_LOAD = """\
  load:
    after: {jobs: [a, b]}
    command: sleep 0.5
"""


def test_triggers_found_together_run_one_after_the_other(fleet: Fleet) -> None:
    """Two upstream runs end at once; the downstream host's look finds both
    triggers: the first starts, the second waits for it (overlap: forbid
    skips a trigger only for a run that was going on when its upstream run
    ended, as a slot due then would be)."""
    fleet.start(fleet.jobs_file(TOGETHER.format(load=TOGETHER_LOAD), "load.yaml"), name="load")
    wait_for(lambda: len(fleet.store.hosts(seen_within=30)) == 1, 30, what="the daemon up")
    fleet.start(fleet.jobs_file(TOGETHER.format(load=""), "upstream.yaml"),
                "--label", "role=upstream", name="upstream")

    def two_ended() -> list[m.RunRecord] | None:
        runs = fleet.runs("load")
        return runs if len(runs) == 2 and all(r.finished for r in runs) else None

    loads = wait_for(two_ended, FIRST_RUN, interval=0.2, what="two runs of load")
    (a,), (b,) = fleet.runs("a", m.OK), fleet.runs("b", m.OK)
    assert fleet.stop() == [0, 0]
    assert [r.result for r in loads] == [m.OK, m.OK]
    assert sorted(upstream_of(loads)) == sorted([a.id, b.id])
    first, second = loads
    assert first.finished is not None and second.started >= first.finished


# test_a_trigger_whose_upstream_ended_while_its_job_ran_is_skipped
# moved to tests/test_firing_memory.py (one daemon on the memory
# store; its SQL on every database: tests/test_chain_contract.py).
