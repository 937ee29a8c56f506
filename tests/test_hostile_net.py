"""Hostile input, round 2 (issue 25): a flood on the metrics port, a token
edited to the BIGINT maximum, a NOTIFY flood, and smaller crashes and leaks.

Each test starts real `dblockrun` processes against real SQLite, PostgreSQL
and MariaDB (where the item concerns them) and checks that nothing was lost,
no other job was disturbed and no secret was printed.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest
from helpers import TestDb, wait_for
from test_security import Daemon, cli, daemon_args, lock_row, runs_of, write_jobs

from dblockrun.store import Store
from dblockrun.store import models as m

EVERY_SECOND = '"* * * * * *"'
SECRET = "h0stile-Pw"
TOKEN_MAX = 2**63 - 1  # BIGINT


def on(db: TestDb, *args: str) -> subprocess.CompletedProcess[str]:
    return cli("--db", db.url, "--table-prefix", db.prefix, *args)


def ok_runs(db: TestDb, name: str) -> list[m.RunRecord]:
    return [r for r in runs_of(db, name) if r.result == m.OK]


def runs_at_least(db: TestDb, name: str, count: int) -> bool:
    return len(ok_runs(db, name)) >= count


# -- 6. a token at the BIGINT maximum -----------------------------------------------


@pytest.mark.parametrize("bad", [TOKEN_MAX, -5], ids=["max", "negative"])
def test_a_bad_token_fails_only_its_job_and_unlock_repairs_it_without_reuse(
        db: TestDb, tmp_path: Path, bad: int) -> None:
    healthy = [f"fine{i}" for i in range(5)]
    # The edited job has run before: its runs were given tokens up to 41.
    lock_row(db, "edited", token=41)
    with Store(db.url, db.prefix) as store:
        store.start_run("edited", "earlier-host", token=41, result=m.OK, output="")
    lock_row(db, "edited", token=bad)
    jobs = write_jobs(tmp_path / "jobs.yaml", "jobs:\n" + "".join(
        f"  {n}: {{cron: {EVERY_SECOND}, command: 'true'}}\n" for n in [*healthy, "edited"]))
    d = Daemon(daemon_args(db.url, db.prefix, jobs), tmp_path / "d.log")
    try:
        # Every job is due on every second (one batch claim): the edited row
        # must fail only its own job, not the batch as an outage.
        for name in healthy:
            wait_for(functools.partial(runs_at_least, db, name, 4), 40, what=f"runs of {name}")
        for name in healthy:
            runs = runs_of(db, name)
            assert {r.result for r in runs} <= {m.OK, m.RUNNING}, (name, runs, d.text())
            done = sorted(r.slot or 0.0 for r in runs if r.result == m.OK)
            # Every slot since the first ran, none late by more than a second.
            assert [b - a for a, b in zip(done, done[1:], strict=False)] == \
                [1.0] * (len(done) - 1), (name, done)
            assert all(r.started - (r.slot or 0.0) < 1.0 for r in runs), (name, runs)
        log = d.text()
        why = "negative" if bad < 0 else "at the BIGINT maximum"
        assert log.count(f"job edited: its fencing token is {why}") == 1, log
        assert "repair it with `dblockrun unlock edited`" in log
        assert "database error" not in log and "database back" not in log, log
        assert "went backwards" not in log, log
        assert [r.token for r in runs_of(db, "edited")] == [41]  # not run
        # The repair: the token after the newest handed out, never one reused.
        proc = on(db, "unlock", "edited")
        assert proc.returncode == 0, proc.stderr
        assert "token now 42" in proc.stdout, proc.stdout
        wait_for(lambda: len(ok_runs(db, "edited")) >= 2, 30, what="edited runs again")
        assert runs_of(db, "edited")[-2].token == 43
        assert "went backwards" not in d.text()
        assert "Traceback" not in d.text()
    finally:
        assert d.stop() == 0


def test_unlock_refuses_when_the_maximum_was_handed_out(db: TestDb) -> None:
    with Store(db.url, db.prefix) as store:
        store.ensure_jobs(["spent"])
        store.start_run("spent", "earlier-host", token=TOKEN_MAX, result=m.OK, output="")
    lock_row(db, "spent", token=TOKEN_MAX)
    proc = on(db, "unlock", "spent")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "no newer token exists" in proc.stderr and "Traceback" not in proc.stderr
    with Store(db.url, db.prefix) as store:
        assert store.lock_state("spent").token == TOKEN_MAX  # type: ignore[union-attr]
