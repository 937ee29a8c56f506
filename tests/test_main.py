"""The click-free start of a plain `dblockrun exec` (dblockrun/__main__.py):
it takes exactly the command lines it is sure of, and does what the click
command does with them, message for message."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from helpers import REPO, TestDb, clean_env, dblockrun_cmd

from dblockrun import __main__ as fast
from dblockrun import cli as cli_module
from dblockrun.store import Store

#: The same command line through click alone.
CLICK_CMD = [sys.executable, "-c", "from dblockrun.cli import main; main()"]


# -- which command lines it takes -----------------------------------------------


@pytest.mark.parametrize(("args", "parsed"), [
    (["exec", "-n", "x", "true"], ({}, {"name": "x"}, ("true",))),
    (["exec", "--name", "x", "--", "sh", "-c", "exit 3"],
     ({}, {"name": "x"}, ("sh", "-c", "exit 3"))),
    (["--db", "sqlite:///a b.db", "--table-prefix=p_", "--debug", "exec", "--name=x", "-v",
      "--lock-at-most", "2h", "--lock-at-least=1s", "--lease", "9s",
      "--busy-exit-code", "75", "grep", "-v", "--", "x"],
     ({"db": "sqlite:///a b.db", "prefix": "p_", "debug": True},
      {"name": "x", "verbose": True, "lock_at_most": "2h", "lock_at_least": "1s",
       "lease": "9s", "busy_exit_code": "75"},
      ("grep", "-v", "--", "x"))),
    (["--db-file", "f", "exec", "-n", "x", "-", "y"],
     ({"db_file": "f"}, {"name": "x"}, ("-", "y"))),
    (["--db=", "exec", "--name=", "--", "--"], ({"db": ""}, {"name": ""}, ("--",))),
])
def test_plain_exec_command_lines(args: list[str],
                                  parsed: tuple[object, object, object]) -> None:
    assert fast.plain_exec(args) == parsed


@pytest.mark.parametrize("args", [
    [], ["status"], ["--help"], ["exec", "--help"], ["-h", "exec", "-n", "x", "true"],
    ["--version"], ["exec", "-n", "x", "-h"],  # -h: exec's help, not a command
    ["exec", "true"],  # no --name
    ["exec", "-n", "x"], ["exec", "-n", "x", "--"],  # no command
    ["exec", "-n"], ["exec", "-n", "-x", "true"], ["--db", "exec", "-n", "x", "true"],
    ["exec", "-nx", "true"], ["exec", "-n=x", "true"], ["exec", "-vn", "x", "true"],
    ["exec", "-n", "x", "-n", "y", "true"], ["--debug", "--debug", "exec", "-n", "x", "true"],
    ["exec", "-n", "x", "--verbose=1", "true"], ["--debug=1", "exec", "-n", "x", "true"],
    ["exec", "-n", "x", "-f", "jobs.yaml", "true"], ["exec", "-n", "x", "--file=j", "true"],
    ["exec", "-n", "x", "--unknown", "true"],  # click makes it part of the command
    ["exec", "--db", "u", "-n", "x", "true"], ["--", "exec", "-n", "x", "true"],
    ["--db", "u", "status"], ["exec2", "-n", "x", "true"],
])
def test_anything_else_goes_to_click(args: list[str]) -> None:
    assert fast.plain_exec(args) is None


def test_shell_completion_goes_to_click(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_DBLOCKRUN_COMPLETE", "bash_complete")
    assert fast.plain_exec(["exec", "-n", "x", "true"]) is None


def test_the_options_are_clis() -> None:
    """The fast parser's tables are dblockrun.cli's declarations."""
    group = cli_module.cli
    command = group.commands["exec"]
    for declared, table in ((group, fast.GROUP_OPTIONS), (command, fast.EXEC_OPTIONS)):
        options = [p for p in declared.params if isinstance(p, click.Option)]
        expected = {}
        for option in options:
            if option.name in ("file", "version") or option.name is None:
                continue  # left to click
            if not option.expose_value:
                continue  # a global option after `exec`: left to click
            for flag in option.opts:
                expected[flag] = (option.name, not option.is_flag)
        assert table == expected
    defaults = {p.name: str(p.default) for p in command.params
                if isinstance(p, click.Option) and p.name in fast.EXEC_DEFAULTS}
    assert defaults == fast.EXEC_DEFAULTS
    prefix = next(p for p in group.params if p.name == "prefix")
    assert (prefix.envvar, prefix.default) == (fast.PREFIX_ENV, fast.PREFIX_DEFAULT)
    assert fast.MAX_NAME == cli_module.MAX_NAME
    # What the parser assumes of exec's own parsing.
    assert command.context_settings == {"ignore_unknown_options": True,
                                        "allow_interspersed_args": False}
    assert [p.name for p in command.params if isinstance(p, click.Argument)] == ["command"]


# -- the same result as click ---------------------------------------------------

_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} ", re.M)


def both(args: list[str], **env: str) -> tuple[tuple[int, str, str], tuple[int, str, str],
                                                str]:
    """(fast path's result, click's result, the fast run's import log)."""
    results = []
    imports = ""
    for cmd in ([*dblockrun_cmd()[:1], "-X", "importtime", *dblockrun_cmd()[1:]], CLICK_CMD):
        proc = subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=REPO,
                              env=clean_env(**env), timeout=120)
        err = "".join(line + "\n" for line in proc.stderr.splitlines()
                      if not line.startswith("import time:"))
        if cmd is not CLICK_CMD:
            imports = proc.stderr
        results.append((proc.returncode, proc.stdout, _TIME.sub("<time> ", err)))
    return results[0], results[1], imports


def imported(log: str, module: str) -> bool:
    return any(line.rsplit("|", 1)[-1].strip() == module for line in log.splitlines())


@pytest.fixture
def ready(sqlite_db: TestDb) -> TestDb:
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        store.ensure_schema()
    return sqlite_db


def test_a_run_is_the_same(ready: TestDb) -> None:
    base = ["--db", ready.url, "--table-prefix", ready.prefix, "exec"]
    fast_run, click_run, log = both(
        [*base, "-n", "x", "--", "sh", "-c", 'echo "out $DBLOCKRUN_JOB"; echo err >&2; exit 3'])
    assert fast_run == click_run == (3, "out x\n", "err\n")  # stdout and stderr kept apart
    assert not imported(log, "click")
    fast_run, click_run, log = both(
        [*base, "--name=y", "--lock-at-least=0s", "--lease", "3s", "sh", "-c", "exit 0"])
    assert fast_run == click_run == (0, "", "")
    with Store(ready.url, ready.prefix) as store:
        assert [(r.job, r.exit_code) for r in store.history()] == [
            ("y", 0), ("y", 0), ("x", 3), ("x", 3)]


def test_busy_is_the_same(ready: TestDb) -> None:
    with Store(ready.url, ready.prefix) as store:
        store.ensure_jobs(["held"])
        assert store.claim("held", "elsewhere", 60) is not None
    base = ["--db", ready.url, "--table-prefix", ready.prefix, "exec", "-n", "held"]
    fast_run, click_run, log = both([*base, "--busy-exit-code", "75", "true"])
    assert fast_run == click_run == (75, "", "")
    fast_run, click_run, log = both([*base, "-v", "true"])
    assert fast_run == click_run
    assert fast_run[0] == 0
    assert "lock held is busy (its lock is held by elsewhere until " in fast_run[2]
    assert not imported(log, "click")


@pytest.mark.parametrize("args", [
    ["exec", "-n", "bad name", "true"],  # click's usage errors, exit 2
    ["exec", "-n", "x", "--lease", "1x", "true"],
    ["exec", "-n", "x", "--busy-exit-code", "z", "true"],
    ["exec", "-n", "x", "--lock-at-least", "2h", "true"],
    ["exec", "-n", "x"],
])
def test_what_click_rejects_goes_to_click(ready: TestDb, args: list[str]) -> None:
    fast_run, click_run, log = both(["--db", ready.url, *args])
    assert fast_run == click_run
    assert fast_run[0] == 2 and fast_run[2]
    assert imported(log, "click")


def test_errors_are_the_same(tmp_path: Path) -> None:
    unreachable = ["--db", "postgresql://someone:pw@127.0.0.1:1/x", "exec", "-n", "x", "true"]
    fast_run, click_run, log = both(unreachable)
    assert fast_run == click_run
    # Both warn that --db holds a password, then give the one-line error.
    warning, error = fast_run[2].splitlines()
    assert warning.startswith("dblockrun: warning: --db holds a password")
    assert fast_run[0] == 1 and error.startswith("dblockrun: database error: ")
    assert "pw" not in fast_run[2]
    missing = ["--db-file", str(tmp_path / "none"), "exec", "-n", "x", "true"]
    fast_run, click_run, log = both(missing)
    assert fast_run == click_run
    assert fast_run[0] == 2 and fast_run[2].startswith("dblockrun: cannot read database file")
    assert not imported(log, "sqlalchemy")
    fast_run, click_run, log = both(["--debug", *unreachable])
    assert fast_run[0] == click_run[0] == 1
    assert "Traceback" in fast_run[2] and "Traceback" in click_run[2]


def test_the_table_prefix_comes_from_the_environment(ready: TestDb) -> None:
    fast_run, click_run, _ = both(["--db", ready.url, "exec", "-n", "x", "true"],
                                  DBLOCKRUN_TABLE_PREFIX=ready.prefix)
    assert fast_run == click_run == (0, "", "")
    with Store(ready.url, ready.prefix) as store:
        assert len(store.history("x")) == 2


GC_PROBE = """
import gc, sys
import dblockrun.cli, dblockrun.running.execlock
from dblockrun.__main__ import main

seen = []
real_exec_locked = dblockrun.running.execlock.exec_locked

def exec_locked(store, opts):
    seen.append(("run", gc.isenabled(), gc.get_freeze_count() > 0))
    return real_exec_locked(store, opts)

def click_main():
    seen.append(("click", gc.isenabled(), None))

dblockrun.running.execlock.exec_locked = exec_locked
dblockrun.cli.main = click_main
for args in sys.argv[1].split("|"):
    sys.argv[1:] = args.split()
    try:
        main()
    except SystemExit:
        pass
print(seen)
"""


def test_the_collector_runs_during_the_command_and_for_click(ready: TestDb) -> None:
    """The fast path holds collections back while it starts, never longer."""
    exec_line = f"--db {ready.url} --table-prefix {ready.prefix} exec -n x true"
    bad_name = f"--db {ready.url} exec -n b@d true"
    proc = subprocess.run([sys.executable, "-c", GC_PROBE, f"{exec_line}|{bad_name}|status"],
                          capture_output=True, text=True, cwd=REPO, env=clean_env(),
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str([("run", True, True), ("click", True, None),
                                       ("click", True, None)])


# -- where the fast path steps aside (issue 11) ---------------------------------------


def test_a_url_from_the_jobs_file_is_read_by_click(sqlite_db: TestDb, tmp_path: Path) -> None:
    """DBLOCKRUN_JOBS names a jobs file whose `database:` is the fleet's: exec
    must take its lock there, not in a local SQLite file."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"database: {sqlite_db.url}\njobs: {{}}\n")
    state = tmp_path / "state"
    proc = subprocess.run(
        [*dblockrun_cmd(), "--table-prefix", sqlite_db.prefix, "exec", "-n", "x", "true"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
        env=clean_env(DBLOCKRUN_JOBS=str(jobs), XDG_STATE_HOME=str(state)))
    assert (proc.returncode, proc.stderr) == (0, "")
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        assert [r.job for r in store.history()] == ["x"]
    assert not state.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["exec", "-n", "x", "--lock-at-most", "0s", "true"],
     "--lock-at-most: must be longer than 0s (got '0s')"),
    (["--table-prefix", "a b", "exec", "-n", "x", "true"],
     "bad table prefix 'a b': use lower-case letters, digits and '_', starting with a "
     "letter or '_' (at most 40)"),
    (["--db=", "exec", "-n", "x", "true"], "--db is empty: give a database URL"),
])
def test_what_click_refuses_the_fast_path_refuses_alike(args: list[str], message: str) -> None:
    fast_run, click_run, _log = both(args)
    assert fast_run == click_run == (2, "", f"dblockrun: {message}\n")
