"""Host targeting: labels, run-on, every-host jobs (dblockrun/scheduling/targeting.py)."""

from __future__ import annotations

import json
import signal
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from harness import Fleet, Process
from helpers import TestDb, wait_for

from dblockrun.cli import cli
from dblockrun.config.load import load_jobs_text
from dblockrun.errors import ConfigError
from dblockrun.ops.output import status_json, status_text
from dblockrun.scheduling.targeting import host_labels, local_jobs, matches
from dblockrun.store import Store
from dblockrun.store.models import HostStatus, JobStatus, LockState
from dblockrun.store.status import report

FILE = "jobs.yaml"
HEAD = "jobs:\n  j:\n    cron: '@daily'\n    command: x\n"


def error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_jobs_text(text, FILE)
    return info.value.render()


# -- the jobs file -------------------------------------------------------------------


def test_run_on_and_every_host_are_read_and_defaults_apply() -> None:
    jobs = load_jobs_text(textwrap.dedent("""\
        defaults:
          run-on: {role: db}
        jobs:
          a:
            cron: '@daily'
            command: x
          b:
            rate: 1h
            on: every-host
            run-on: {role: [web, db], zone: eu}
            command: x
          c:
            rate: 1h
            run-on: null
            command: x
        """), FILE)
    a, b, c = jobs.jobs
    assert a.run_on == (("role", ("db",)),) and not a.every_host
    assert b.run_on == (("role", ("db", "web")), ("zone", ("eu",))) and b.every_host
    assert c.run_on == () and not c.every_host


def test_hash_of_an_untargeted_job_is_unchanged() -> None:
    """Hosts still on a version without targeting see no drift."""
    job = load_jobs_text(HEAD, FILE).jobs[0]
    assert job.definition_hash() == load_jobs_text(HEAD + "    on: one-host\n",
                                                   FILE).jobs[0].definition_hash()
    assert job.definition_hash() != load_jobs_text(HEAD + "    on: every-host\n",
                                                   FILE).jobs[0].definition_hash()


@pytest.mark.parametrize(("text", "message"), [
    (HEAD + "    run-on: db\n",
     "jobs.yaml:5: job 'j': run-on: must be a mapping, got a string ('db')"),
    (HEAD + "    run-on: {}\n",
     "jobs.yaml:5: job 'j': run-on: must name at least one label, e.g. run-on: {role: db}"),
    (HEAD + "    run-on:\n      role: yes\n",
     "jobs.yaml:6: job 'j': run-on.role: each value must be a string or number, "
     "got a boolean (true) (quote it)"),
    (HEAD + "    run-on:\n      role: []\n",
     "jobs.yaml:6: job 'j': run-on.role: must list at least one value"),
    (HEAD + "    run-on:\n      role: \"d b\"\n",
     "jobs.yaml:6: job 'j': run-on.role: each value 'd b': use letters, digits, '.', '_' "
     "and '-'"),
    (HEAD + "    run-on:\n      \"ro le\": db\n",
     "jobs.yaml:6: job 'j': run-on.ro le: the label name 'ro le': use letters, digits, "
     "'.', '_' and '-'"),
    (HEAD + "    on: sometimes\n",
     "jobs.yaml:5: job 'j': on: must be every-host (each matching host runs each slot) or "
     "one-host (the default), got a string ('sometimes')"),
    (HEAD + "    items: [a]\n    on: every-host\n",
     "jobs.yaml:6: job 'j': on: every-host cannot be used with items or items-command "
     "(fan-out spreads items over the hosts; every-host runs the whole job on each)"),
    ("defaults:\n  on: every-host\n" + HEAD + "    items-command: ls\n",
     "jobs.yaml:2: job 'j': on: every-host cannot be used with items or items-command "
     "(fan-out spreads items over the hosts; every-host runs the whole job on each)"),
    ("defaults:\n  run-on: {role: [db, {}]}\n" + HEAD,
     "jobs.yaml:2: defaults.run-on.role: each value must be a string or number, "
     "got a mapping (quote it)"),
])
def test_targeting_errors(text: str, message: str) -> None:
    assert error(text) == message


def test_the_key_on_is_the_word_not_yaml_true() -> None:
    """YAML 1.1 reads a bare ``on`` as true; as a key it means ``on:``."""
    assert load_jobs_text(HEAD + "    on: every-host\n", FILE).jobs[0].every_host
    assert error(HEAD + "    ON: every-host\n").startswith(
        "jobs.yaml:5: job 'j': ON: unknown key (")


# -- labels and matching ---------------------------------------------------------------


def test_labels_come_from_the_hostname_the_environment_and_the_options() -> None:
    labels = host_labels(["role=db", "hostname=alpha"], "role=web, zone=eu", "vm")
    assert labels == {"hostname": "alpha", "role": "db", "zone": "eu"}
    assert host_labels([], None, "vm") == {"hostname": "vm"}
    with pytest.raises(ValueError, match="--label: 'role' is not KEY=VALUE"):
        host_labels(["role"], None, "vm")
    with pytest.raises(ValueError, match="DBLOCKRUN_LABELS: label value 'd b'"):
        host_labels([], "role=d b", "vm")


def test_a_host_runs_the_jobs_it_matches_and_its_own_every_host_row() -> None:
    file = load_jobs_text(textwrap.dedent("""\
        jobs:
          db: {rate: 1h, command: x, run-on: {role: [db, cache]}}
          eu-db: {rate: 1h, command: x, run-on: {role: db, zone: eu}}
          rotate: {rate: 1h, command: x, on: every-host}
          plain: {rate: 1h, command: x}
        """), FILE)
    mine = local_jobs(file, {"hostname": "alpha", "role": "cache"})
    assert [j.name for j in mine.jobs] == ["db", "rotate@alpha", "plain"]
    assert mine.job("rotate@alpha") is not None and mine.job("rotate") is None
    assert [j.file_name for j in mine.jobs] == ["db", "rotate", "plain"]
    assert not matches({"role": "db"}, (("role", ("db",)), ("zone", ("eu",))))


@pytest.mark.parametrize("args", [["--label", "nonsense"], ["--label", "role=a b"],
                                  ["--label", "=db"]])
def test_a_bad_label_is_a_usage_error(args: list[str], tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(HEAD)
    result = CliRunner().invoke(cli, ["daemon", str(jobs), *args], prog_name="dblockrun")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("dblockrun: --label: ")


def test_bad_dblockrun_labels_is_a_usage_error(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(HEAD)
    result = CliRunner(env={"DBLOCKRUN_LABELS": "role"}).invoke(
        cli, ["daemon", str(jobs)], prog_name="dblockrun")
    assert result.exit_code == 2
    assert result.output == "dblockrun: DBLOCKRUN_LABELS: 'role' is not KEY=VALUE\n"


# -- status, from host rows ---------------------------------------------------------------

NOW = 1795384397.0


def _host(host_id: str, labels: dict[str, str], targets: Mapping[str, object]) -> HostStatus:
    return HostStatus(id=host_id, hostname="vm", pid=1, version="0.1.0", started=NOW - 60,
                      last_seen=NOW - 1, clock_offset=0.0, running=0, jobs=json.dumps({}),
                      labels=json.dumps(labels), targets=json.dumps(targets))


def _job(name: str) -> JobStatus:
    lock = LockState(name=name, holder=None, lock_until=None, locked_at=None, token=0,
                     last_slot=None, last_start=None, next_due=None, disabled_until=None,
                     disabled_reason=None)
    return JobStatus(lock=lock, last_run=None, running=None, db_now=NOW)


def test_status_shows_labels_and_marks_a_job_no_live_host_matches() -> None:
    targets = {"cache": {"run_on": {"role": ["cache"]}, "every_host": False},
               "db": {"run_on": {"role": ["db"]}, "every_host": False},
               "rotate": {"run_on": {}, "every_host": True}}
    hosts = [_host("a:1:x", {"hostname": "alpha", "role": "db"}, targets),
             _host("b:2:y", {"hostname": "beta", "role": "web"}, targets)]
    jobs = [_job("cache"), _job("db"), _job("rotate"), _job("rotate@alpha")]
    text = status_text(jobs, hosts, NOW, 15.0, None)
    assert "no live host matches run-on role=cache" in text.splitlines()[3]
    assert "on every host: rows rotate@HOST" in text
    assert "hostname=alpha role=db" in text and "hostname=beta role=web" in text
    assert text.endswith("warning: job cache: no live host matches run-on role=cache, so it "
                         "runs nowhere\n")
    doc = json.loads(status_json(jobs, hosts, NOW))
    by_name = {j["name"]: j for j in doc["jobs"]}
    assert by_name["cache"]["next_run_note"] == "no live host matches run-on role=cache"
    assert by_name["cache"]["run_on"] == {"role": ["cache"]}
    assert by_name["db"]["next_run_note"] is None
    assert by_name["rotate@alpha"]["every_host"] is True
    assert doc["hosts"][0]["labels"] == {"hostname": "alpha", "role": "db"}
    assert doc["warnings"] == ["job cache: no live host matches run-on role=cache, so it "
                               "runs nowhere"]


# -- real daemons ------------------------------------------------------------------------

JOBS = """\
jobs:
  dbonly:
    cron: "* * * * * *"
    run-on: {{role: db}}
    env: {{LOG: {log}}}
    command: echo "dbonly $DBLOCKRUN_SLOT $DBLOCKRUN_HOST_ID" >> "$LOG"
  rotate:
    cron: "* * * * * *"
    on: every-host
    env: {{LOG: {log}}}
    command: echo "$DBLOCKRUN_JOB $DBLOCKRUN_SLOT $DBLOCKRUN_HOST_ID" >> "$LOG"
  cacheonly:
    rate: 1s
    run-on: {{role: cache}}
    command: "true"
"""


def start(fleet: Fleet, jobs: Path, name: str, *labels: str) -> Process:
    """A daemon with ``labels`` (``key=value``), logging to ``<name>.log``."""
    return fleet.start(jobs, *(arg for label in labels for arg in ("--label", label)), name=name)


def invoke(db: TestDb, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--db", db.url, "--table-prefix", db.prefix, *args],
                              prog_name="dblockrun")


@pytest.mark.slow
def test_run_on_and_every_host_across_two_daemons(db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    out = tmp_path / "runs.log"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS.format(log=out))
    procs = [start(fleet, jobs, "alpha", "hostname=alpha", "role=db"),
             start(fleet, jobs, "beta", "hostname=beta", "role=web")]
    store = Store(db.url, db.prefix)
    try:
        hosts = wait_for(lambda: h if len(h := store.hosts(seen_within=30)) == 2 else None,
                         30, what="2 daemons registered")
        name = {h.id: json.loads(h.labels or "{}")["hostname"] for h in hosts}
        first = store.db_now() + 1

        def ran(host: str) -> list[float]:
            return [r.slot for r in store.history(f"rotate@{host}", 100)
                    if r.slot is not None and r.slot >= first and r.result == "ok"]

        wait_for(lambda: len(ran("alpha")) >= 3 and len(ran("beta")) >= 3, 30,
                 interval=0.2, what="3 every-host slots on each daemon")
        requested = invoke(db, "run", "dbonly")
        assert requested.exit_code == 0, requested.output
        assert " started on " in requested.output
        status = invoke(db, "status", "--wide")  # (labels: --wide)
        every = invoke(db, "run", "rotate")
        assert all(p.alive() for p in procs), "a daemon died"
    finally:
        codes = fleet.stop()
    assert codes == [0, 0]
    # run-on role=db: every run, scheduled or requested, on the db daemon only.
    dbonly = store.history("dbonly", 1000)
    assert dbonly and {name[r.host] for r in dbonly} == {"alpha"}
    assert requested.output.split(" started on ")[1].startswith(
        next(h for h, n in name.items() if n == "alpha"))
    # every-host: each daemon its own lock row, each slot once per host.
    for host in ("alpha", "beta"):
        runs = [r for r in store.history(f"rotate@{host}", 1000) if r.slot is not None]
        assert {name[r.host] for r in runs} == {host}
        slots = [r.slot for r in runs]
        assert len(slots) == len(set(slots)), f"a slot ran twice on {host}"
    assert set(ran("alpha")) & set(ran("beta")), "the same slots ran on both hosts"
    lines = out.read_text().splitlines()
    assert {line.split()[0] for line in lines} == {"dbonly", "rotate"}  # DBLOCKRUN_JOB
    rows = {s.lock.name: s.lock for s in report(store).jobs}
    assert {"rotate", "rotate@alpha", "rotate@beta"} <= set(rows)
    assert rows["rotate"].token == 0  # the job's own row is never claimed
    assert rows["rotate@alpha"].token > 0 and rows["rotate@beta"].token > 0
    # history JOB of an every-host job: every host's runs.
    assert {r.job for r in store.history("rotate", 1000)} == {"rotate@alpha", "rotate@beta"}
    # run JOB of an every-host job: a run on each live host.
    assert every.exit_code == 0, every.output
    assert [line.split(":")[0] for line in every.output.splitlines()] == [
        "rotate@alpha", "rotate@beta"]
    # status: labels per host, the job no live host matches.
    assert status.exit_code == 0, status.output
    assert "hostname=alpha role=db" in status.output
    assert "hostname=beta role=web" in status.output
    assert ("warning: job cacheonly: no live host matches run-on role=cache, so it runs "
            "nowhere") in status.output
    # The load warning, in each daemon's log.
    for p in procs:
        assert "WARNING job cacheonly: no live host matches run-on role=cache" in p.text()
    store.close()


@pytest.mark.slow
def test_disable_of_an_every_host_job_holds_on_every_host(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """``disable JOB`` pauses every host's row, and a host that joins later
    starts paused too; ``enable JOB`` clears them all."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS.format(log=tmp_path / "runs.log"))
    store = Store(db.url, db.prefix)
    alpha = start(fleet, jobs, "alpha", "hostname=alpha")
    try:
        wait_for(lambda: store.lock_state("rotate@alpha"), 30, what="alpha's row")
        result = invoke(db, "disable", "rotate", "--reason", "maintenance")
        assert result.exit_code == 0, result.output
        beta = start(fleet, jobs, "beta", "hostname=beta")
        try:
            row = wait_for(lambda: store.lock_state("rotate@beta"), 30, what="beta's row")
            assert row.disabled_reason == "maintenance"
            token = row.token
            status = invoke(db, "status", "rotate")
            assert status.output.count("disabled until") == 3, status.output
            assert invoke(db, "enable", "rotate").exit_code == 0
            wait_for(lambda: (s := store.lock_state("rotate@beta")) and s.token > token, 30,
                     what="beta runs once enabled")
        finally:
            assert beta.stop() == 0
    finally:
        assert alpha.stop() == 0
    store.close()


@pytest.mark.slow
def test_reload_warns_of_a_job_no_live_host_matches(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  tick: {rate: 1h, command: 'true'}\n")
    proc = start(sqlite_fleet, jobs, "daemon", "role=web")
    log = proc.log
    try:
        wait_for(lambda: "job tick: run" in log.read_text(), 30, what="the first run")
        assert "no live host matches" not in log.read_text()
        jobs.write_text("jobs:\n  tick: {rate: 1h, command: 'true', run-on: {role: db}}\n")
        proc.send(signal.SIGHUP)
        wait_for(lambda: "WARNING job tick: no live host matches run-on role=db" in
                 log.read_text(), 30, what="the warning")
    finally:
        assert proc.stop() == 0


def test_labels_cost_no_statement_in_the_bookkeeping_round(store: Store) -> None:
    """The labels and targeting go with the host row: a round sends as many
    statements with them as without (one on PostgreSQL)."""

    def round_(host: str, labels: str | None, targets: str | None) -> int:
        before = store.statements
        store.books_round(host, hostname="vm", pid=1, version="0.1.0", clock_offset=0.0,
                          running=0, jobs="{}", within=3.0, labels=labels, targets=targets)
        return store.statements - before

    labels = json.dumps({"hostname": "alpha", "role": "db"})
    targets = json.dumps({"j": {"run_on": {"role": ["db"]}, "every_host": False}})
    for host in ("plain:1:a", "labelled:2:b"):  # the first round inserts the row
        round_(host, None, None)
    plain = round_("plain:1:a", None, None)
    labelled = round_("labelled:2:b", labels, targets)
    assert labelled == plain, (plain, labelled)
    if store.dialect.name == "postgresql":
        assert labelled == 1
    row = {h.id: h for h in store.hosts()}["labelled:2:b"]
    assert json.loads(row.labels or "") == {"hostname": "alpha", "role": "db"}
    assert json.loads(row.targets or "") == {"j": {"run_on": {"role": ["db"]},
                                                   "every_host": False}}


@pytest.mark.slow
def test_the_run_on_warning_waits_for_the_fleet_to_start(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    """A daemon does not warn at start-up of a job no live host matches: the
    host that matches may be starting too. It warns after a few rounds
    (fleet.py SETTLE_ROUNDS) if none has come."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  tick: {rate: 1h, command: 'true'}\n"
                    "  backup: {rate: 1h, command: 'true', run-on: {role: db}}\n")
    proc = start(sqlite_fleet, jobs, "daemon", "role=web")
    log = proc.log
    try:
        # The first run starts after the start-up round: no warning yet.
        wait_for(lambda: "job tick: run" in log.read_text(), 30, what="the first run")
        assert "no live host matches" not in log.read_text()
        wait_for(lambda: "WARNING job backup: no live host matches run-on role=db" in
                 log.read_text(), 30, what="the warning, a few rounds later")
    finally:
        assert proc.stop() == 0
    assert log.read_text().count("no live host matches") == 1
