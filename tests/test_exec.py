"""`dblockrun exec` as real processes on every backend: exit status, busy, env,
signals, lock-at-most and lock-at-least."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import pytest
from harness import pid_alive, track
from helpers import REPO, TestDb, clean_env, dblockrun_cmd, fail_next_run_inserts, wait_for

from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.status import report


def exec_args(db: TestDb, *args: str) -> list[str]:
    return [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "exec", *args]


def run_exec(db: TestDb, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(exec_args(db, *args), capture_output=True, text=True,
                          env=clean_env(), cwd=REPO, timeout=timeout)


class Background:
    """A `dblockrun exec` running in the background, its stdout collected by lines."""

    def __init__(self, args: Sequence[str]) -> None:
        self.proc = track(subprocess.Popen(list(args), stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True, env=clean_env(),
                                           cwd=REPO))
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.errors), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str] | None, into: list[str]) -> None:
        assert stream is not None
        for line in stream:
            into.append(line.rstrip("\n"))

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def wait_running(store: Store, name: str, timeout: float = 30) -> m.JobStatus:
    def running() -> m.JobStatus | None:
        rows = report(store, [name]).jobs
        return rows[0] if rows and rows[0].state == "running" else None

    return wait_for(running, timeout, what=f"job {name} running")


def test_exit_status_and_stdout_pass_through(db: TestDb) -> None:
    proc = run_exec(db, "--name", "x", "--", "sh", "-c", "echo hello; echo world; exit 7")
    assert proc.returncode == 7
    assert proc.stdout == "hello\nworld\n"


def test_output_with_nul_bytes_is_recorded(db: TestDb, store: Store) -> None:
    # PostgreSQL text cannot hold NUL: the stored tail shows U+FFFD instead,
    # and the result is recorded at once (no retrying as if the database were down).
    proc = run_exec(db, "--name", "x", "--", "printf", "a\\000b\\n", timeout=30)
    assert proc.returncode == 0
    assert proc.stdout == "a\x00b\n"
    (run,) = store.history("x")
    assert (run.result, run.output) == ("ok", "a\ufffdb\n")


def test_success_is_quiet(db: TestDb) -> None:
    proc = run_exec(db, "--name", "x", "--", "true")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_command_not_found_exits_127(db: TestDb) -> None:
    proc = run_exec(db, "--name", "x", "--", "/nonexistent/command")
    assert proc.returncode == 127
    assert "Traceback" not in proc.stderr


def test_busy_is_silent_exit_0_or_the_chosen_code(db: TestDb, store: Store) -> None:
    store.ensure_jobs(["x"])
    assert store.claim("x", "other", 30) is not None

    proc = run_exec(db, "--name", "x", "--", "echo", "ran")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")

    proc = run_exec(db, "-v", "--name", "x", "--", "echo", "ran")
    assert proc.returncode == 0
    assert proc.stdout == ""
    assert "busy" in proc.stderr
    assert "other" in proc.stderr  # names who holds it

    proc = run_exec(db, "--busy-exit-code", "75", "--name", "x", "--", "echo", "ran")
    assert (proc.returncode, proc.stdout, proc.stderr) == (75, "", "")
    assert store.history("x") == []  # nothing ran


def test_a_negative_token_is_named_with_its_repair_not_called_busy(
    db: TestDb, store: Store
) -> None:
    # A hand-edited row: no claim takes it (issue 15 item 4); `exec -v` says
    # why and how to repair it, instead of "busy (holder None)".
    store.ensure_jobs(["edited"])
    locks = store.t.locks
    with store.engine.connect() as conn:
        conn.execute(locks.update().where(locks.c.name == "edited").values(token=-5))
    proc = run_exec(db, "-v", "--name", "edited", "--", "echo", "ran")
    assert (proc.returncode, proc.stdout) == (0, "")
    assert "fencing token is negative" in proc.stderr
    assert "dblockrun unlock edited" in proc.stderr
    assert "busy" not in proc.stderr
    assert store.history("edited") == []


def test_command_environment(db: TestDb, store: Store) -> None:
    script = ('echo "$DBLOCKRUN_JOB|$DBLOCKRUN_FENCING_TOKEN|$DBLOCKRUN_RUN_ID|'
              '$DBLOCKRUN_HOST_ID"')
    seen = []
    for _ in range(2):
        proc = run_exec(db, "--name", "envjob", "--", "sh", "-c", script)
        assert proc.returncode == 0, proc.stderr
        seen.append(proc.stdout.rstrip("\n").split("|"))
    (job1, token1, run1, host1), (job2, token2, run2, host2) = seen
    assert job1 == job2 == "envjob"
    assert (token1, token2) == ("1", "2")
    runs = store.history("envjob")
    assert [str(r.id) for r in runs] == [run2, run1]
    assert [r.host for r in runs] == [host2, host1]
    assert host1 and host2 and host1 != host2  # one holder id per exec process


def test_sigterm_is_forwarded_and_the_run_recorded(db: TestDb, store: Store) -> None:
    bg = Background(exec_args(
        db, "--name", "x", "--", "sh", "-c",
        'trap "echo got-term; exit 3" TERM; echo ready; while :; do sleep 0.1; done'))
    try:
        wait_for(lambda: "ready" in bg.lines, 30, what="ready on stdout")
        bg.proc.send_signal(signal.SIGTERM)
        assert bg.finish(timeout=15) == 3
    finally:
        bg.kill()
    # (the shell may also report its killed `sleep` as "Terminated")
    assert [line for line in bg.lines if line != "Terminated"] == ["ready", "got-term"]
    runs = store.history("x")
    assert len(runs) == 1
    assert (runs[0].result, runs[0].exit_code) == (m.FAILED, 3)
    assert runs[0].output is not None
    assert runs[0].output.replace("Terminated\n", "") == "ready\ngot-term\n"
    # The lock is free again: the next exec runs.
    assert run_exec(db, "--name", "x", "--", "true").returncode == 0
    assert len(store.history("x")) == 2


def test_lock_is_shared_between_execs(db: TestDb, store: Store) -> None:
    bg = Background(exec_args(db, "--name", "shared", "--", "sleep", "60"))
    try:
        status = wait_running(store, "shared")
        assert status.running is not None
        holder = status.lock.holder
        assert holder is not None

        proc = run_exec(db, "--busy-exit-code", "75", "--name", "shared", "--", "echo", "ran")
        assert (proc.returncode, proc.stdout) == (75, "")
        proc = run_exec(db, "-v", "--name", "shared", "--", "echo", "ran")
        assert proc.returncode == 0
        assert "busy" in proc.stderr
        assert holder in proc.stderr

        bg.proc.send_signal(signal.SIGTERM)
        assert bg.finish(timeout=15) == 128 + signal.SIGTERM
    finally:
        bg.kill()
    assert [r.result for r in store.history("shared")] == [m.FAILED]


def test_lock_at_most_stops_the_command(db: TestDb, store: Store) -> None:
    started = time.monotonic()
    proc = run_exec(db, "--lock-at-most", "1s", "--name", "slow", "--", "sleep", "300")
    took = time.monotonic() - started
    assert proc.returncode == 128 + signal.SIGTERM
    # Stopped long before the command's own end: the wall time includes the
    # process's start and the claim, which took 14-16 s under pytest -n 4 on
    # 2 shared cores (the run's recorded duration below is the tight bound).
    assert took < 60
    runs = store.history("slow")
    assert len(runs) == 1
    assert runs[0].result == m.TIMEOUT
    assert runs[0].exit_code == 128 + signal.SIGTERM
    assert runs[0].duration is not None and 0.9 <= runs[0].duration < 8


def test_lock_at_least_keeps_the_lock_after_the_command(db: TestDb, store: Store) -> None:
    proc = run_exec(db, "--lock-at-least", "1h", "--name", "once", "--", "echo", "ran")
    assert (proc.returncode, proc.stdout) == (0, "ran\n")

    proc = run_exec(db, "--busy-exit-code", "75", "--lock-at-least", "1h", "--name", "once",
                    "--", "echo", "ran")
    assert (proc.returncode, proc.stdout) == (75, "")
    assert [r.result for r in store.history("once")] == [m.OK]
    lock = store.lock_state("once")
    assert lock is not None and lock.lock_until is not None
    assert lock.lock_until - store.db_now() > 3500


def test_lock_at_least_over_lock_at_most_is_a_usage_error(db: TestDb) -> None:
    proc = run_exec(db, "--lock-at-most", "1m", "--lock-at-least", "1h", "--name", "x",
                    "--", "echo", "ran")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == "dblockrun: --lock-at-least is longer than --lock-at-most\n"


def test_options_after_the_command_belong_to_the_command(db: TestDb, store: Store) -> None:
    # Without `--`: `-v` and `-n` after the command's first word are the command's.
    proc = run_exec(db, "--name", "x", "printf", "%s|", "-v", "a", "-n", "b", "--name", "c")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "-v|a|-n|b|--name|c|"
    assert proc.stderr == ""  # -v was not taken as exec's --verbose
    assert [r.job for r in store.history()] == ["x"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_command_dies_with_a_killed_exec(db: TestDb, store: Store) -> None:
    bg = Background(exec_args(db, "--name", "x", "--", "sh", "-c", "echo $$; exec sleep 60"))
    try:
        wait_for(lambda: len(bg.lines) > 0, 30, what="the command's pid")
        child = int(bg.lines[0])
        assert pid_alive(child)
        bg.proc.send_signal(signal.SIGKILL)
        assert bg.finish(timeout=10) == -signal.SIGKILL
        wait_for(lambda: not pid_alive(child), 10, what=f"command {child} to die with exec")
    finally:
        bg.kill()


def test_stderr_stays_apart_from_stdout(db: TestDb, store: Store) -> None:
    script = "echo out; echo err >&2; echo out2; echo err2 >&2; exit 3"
    proc = run_exec(db, "--name", "x", "--", "sh", "-c", script)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out\nout2\n", "err\nerr2\n")
    # `2>/dev/null` leaves exactly the command's stdout.
    quiet = subprocess.run(exec_args(db, "--name", "x", "--", "sh", "-c", script),
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           env=clean_env(), cwd=REPO, timeout=60)
    assert (quiet.returncode, quiet.stdout) == (3, "out\nout2\n")
    # The stored tail holds both streams, each in its order (interleaved as read).
    run = store.history("x")[0]
    assert run.output is not None
    lines = run.output.splitlines()
    assert sorted(lines) == ["err", "err2", "out", "out2"]
    assert lines.index("out") < lines.index("out2") and lines.index("err") < lines.index("err2")


def test_an_unknown_command_is_reported_on_stderr(db: TestDb) -> None:
    proc = run_exec(db, "--name", "x", "--", "/nonexistent/command")
    assert (proc.returncode, proc.stdout) == (127, "")
    assert "/nonexistent/command" in proc.stderr


def test_exec_says_when_it_stopped_the_command(db: TestDb, store: Store) -> None:
    proc = run_exec(db, "--lock-at-most", "1s", "--name", "slow", "--",
                    "sh", "-c", "echo working; exec sleep 30")
    assert proc.returncode == 128 + signal.SIGTERM
    assert proc.stdout == "working\n"
    assert proc.stderr == "dblockrun: stopped the command: it reached --lock-at-most 1s\n"
    assert [r.result for r in store.history("slow")] == [m.TIMEOUT]


def test_exec_is_silent_when_the_command_fails_by_itself(db: TestDb) -> None:
    # The same status as a stopped command, but its own doing: no word from exec.
    proc = run_exec(db, "--lock-at-most", "1m", "--name", "x", "--",
                    "sh", "-c", "kill -TERM $$")
    assert (proc.returncode, proc.stdout, proc.stderr) == (128 + signal.SIGTERM, "", "")
    proc = run_exec(db, "--name", "x", "--", "sh", "-c", "exit 1")
    assert (proc.returncode, proc.stderr) == (1, "")


def test_a_claim_whose_run_record_deadlocks_still_runs_the_command(db: TestDb,
                                                                   store: Store) -> None:
    """Issue 15 item 2, on exec's path: the claim's UPDATE is committed when
    its run record fails; the record is written on its own, the command runs."""
    if db.backend != "mariadb":
        pytest.skip("the claim and its record are two statements of one round trip on MariaDB")
    store.ensure_schema()
    fail_next_run_inserts(store, 1)
    proc = run_exec(db, "--name", "x", "--", "echo", "ran")
    assert (proc.returncode, proc.stdout) == (0, "ran\n"), proc.stderr
    with store.engine.connect() as conn:
        left = conn.exec_driver_sql(f"SELECT n FROM `{store.t.runs.name}_fail`").scalar()
    assert left == 0  # the forced deadlock happened
    assert [(r.result, r.token) for r in store.history("x")] == [(m.OK, 1)]
    lock = store.lock_state("x")
    assert lock is not None and lock.lock_until is not None
    assert lock.lock_until <= store.db_now()  # released


# -- issue 36 item 7: a lock kept by lock-at-least is not called busy ----------------------


def test_verbose_says_a_finished_run_s_lock_at_least_holds_the_lock_and_until_when(
        db: TestDb, store: Store) -> None:
    """``exec -v`` said ``lock ... is busy (holder ...)`` when the holder had
    finished and only ``lock-at-least`` kept the lock: it says so now, with
    the run that ended and until when the lock stays held."""
    import re

    from dblockrun.timetext import iso

    proc = run_exec(db, "--lock-at-least", "1h", "--name", "once", "--", "echo", "ran")
    assert (proc.returncode, proc.stdout) == (0, "ran\n")
    (run,) = store.history("once")
    lock = store.lock_state("once")
    assert lock is not None and lock.lock_until is not None and run.finished is not None
    proc = run_exec(db, "-v", "--name", "once", "--", "echo", "again")
    assert (proc.returncode, proc.stdout) == (0, "")
    said = re.sub(r"^\S+ WARNING ", "", proc.stderr)
    assert said == (f"lock once is held until {iso(lock.lock_until)} by lock-at-least: run "
                    f"{run.id} on {run.host} ended ok at {iso(run.finished)}; not running\n")
    # A run still going is busy, with its id, host and start.
    going = Background(exec_args(db, "--name", "going", "--", "sh", "-c",
                                 "echo started; exec sleep 30"))
    try:
        wait_for(lambda: going.lines == ["started"], 20, what="the first command")
        (first,) = store.control.running("going")
        proc = run_exec(db, "-v", "--name", "going", "--", "true")
        assert re.sub(r"^\S+ WARNING ", "", proc.stderr) == (
            f"lock going is busy: run {first.id} on {first.host} has run since "
            f"{iso(first.started)}; not running\n")
    finally:
        going.kill()
