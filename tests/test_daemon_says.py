"""Issue 23, item 11: a daemon says what it sees. It logs the fleet's pause
and resume and the disable and enable of its own jobs (read from the audit
trail by its bookkeeping round; not another file's jobs), and a reload logs
the jobs added, removed and changed. With ``--watch-file`` it reloads when
the jobs file changes, a ConfigMap's symlink swap included.

(Kill requests are logged by the run's holder: tests/test_kill.py.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from harness import Fleet
from helpers import TestDb, wait_for

from dblockrun.cli import cli
from dblockrun.config.load import load_jobs_text
from dblockrun.daemon.reload import job_changes
from dblockrun.ops.who import operator_id
from dblockrun.store import Store

YEARLY = "cron: '0 0 1 1 *'"
BEFORE = f"""\
jobs:
  tick: {{{YEARLY}, command: 'echo one'}}
  gone: {{{YEARLY}, command: 'true'}}
  same: {{{YEARLY}, command: 'true'}}
"""
AFTER = f"""\
jobs:
  tick: {{{YEARLY}, command: 'echo two'}}
  same: {{{YEARLY}, command: 'true'}}
  new: {{{YEARLY}, command: 'true'}}
"""


def test_job_changes_names_the_jobs_added_removed_and_changed() -> None:
    before, after = load_jobs_text(BEFORE, "a.yaml"), load_jobs_text(AFTER, "b.yaml")
    assert job_changes(before, after) == "added: new; removed: gone; changed: tick"
    assert job_changes(before, before) == "no job changed"


def swap(link: Path, folder: Path, text: str) -> None:
    """What the kubelet does to a ConfigMap volume: the new file in a new
    folder, then the link renamed over the old one (atomic)."""
    folder.mkdir()
    (folder / "jobs.yaml").write_text(text)
    tmp = link.parent / "..data_tmp"
    tmp.symlink_to(folder.name)
    os.replace(tmp, link)


def operator(db: TestDb, *args: str) -> None:
    result = CliRunner().invoke(cli, ["--db", db.url, "--table-prefix", db.prefix, *args],
                                prog_name="dblockrun")
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_a_daemon_logs_operator_actions_and_what_a_watched_file_reload_changed(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    # A ConfigMap volume: jobs.yaml -> ..data/jobs.yaml, ..data -> a folder.
    data = tmp_path / "..data"
    swap(data, tmp_path / "..v1", BEFORE)
    (tmp_path / "jobs.yaml").symlink_to("..data/jobs.yaml")
    proc = fleet.start(tmp_path / "jobs.yaml", "--watch-file", grace=None, name="daemon")
    log = proc.log
    me = operator_id()

    def logged(text: str) -> None:
        proc.wait_log(text, 30)

    try:
        with Store(db.url, db.prefix) as store:
            wait_for(lambda: store.live_hosts() or None, 30, what="the daemon's host row")
        operator(db, "pause", "--for", "1h", "--reason", "db upgrade")
        logged(f"WARNING fleet paused by {me} (for 1h): db upgrade")
        operator(db, "resume")
        logged(f"INFO fleet resumed by {me}")
        operator(db, "disable", "elsewhere", "--create")  # not this daemon's job
        operator(db, "disable", "tick", "--for", "2h", "--reason", "noisy")
        logged(f"WARNING job tick: disabled by {me} (for 2h): noisy")
        operator(db, "enable", "tick")
        logged(f"INFO job tick: enabled by {me}")
        assert "elsewhere" not in log.read_text()

        swap(data, tmp_path / "..v2", AFTER)  # no SIGHUP: --watch-file sees it
        logged("reloaded")
        assert "(added: new; removed: gone; changed: tick)" in log.read_text(), log.read_text()
    finally:
        assert proc.stop() == 0
