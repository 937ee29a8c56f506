"""The spawn service that starts and watches every command, with real processes.

Nothing forks the daemon: the service (a small single-threaded process)
starts each command in its own session and process group and watches it. A
command must hold no descriptor but its own: one that kept another run's
lifeline open would keep that run's daemon looking alive. A command's end is
reported at once, so a wait returns when the command ends, not at a tick.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from harness import group_alive
from helpers import TestDb, clean_env, dblockrun_cmd, wait_for

from dblockrun.running import spawn
from dblockrun.running.runner import LeaseWatch, ProcessEnd, run_process
from dblockrun.store import Store


class Run:
    """``run_process`` in a thread, as a daemon's job thread calls it."""

    def __init__(self, argv: Sequence[str], *, guarded: bool = True, cwd: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.watch = LeaseWatch("job", "host", 1, 30.0) if guarded else None
        self.stop = threading.Event()
        self.lines: list[bytes] = []
        self.pgids: list[int] = []
        self.outcome: ProcessEnd | None = None
        self._thread = threading.Thread(target=self._run, args=(list(argv), cwd, env),
                                        daemon=True)
        self._thread.start()

    def _run(self, argv: list[str], cwd: str | None, env: dict[str, str] | None) -> None:
        self.outcome = run_process(argv, env=env if env is not None else dict(os.environ),
                                   cwd=cwd, on_line=self.lines.append, deadline=None,
                                   watch=self.watch, stop=self.stop, kill_grace=2.0,
                                   stop_grace=lambda: 0.0, on_start=self.pgids.append)

    @property
    def pgid(self) -> int:
        return wait_for(lambda: self.pgids[0] if self.pgids else None, 10,
                        what="the command to start")

    def wait_started(self, marker: Path) -> None:
        wait_for(marker.exists, 10, what=f"{marker.name} from the command")

    def finished(self, timeout: float = 10) -> ProcessEnd:
        return wait_for(lambda: self.outcome, timeout, what="run_process to return")

    def stop_now(self) -> ProcessEnd:
        self.stop.set()
        return self.finished()

    @property
    def output(self) -> str:
        return b"".join(self.lines).decode()




def fd_targets(pid: int) -> dict[int, str]:
    base = f"/proc/{pid}/fd"
    out = {}
    for name in os.listdir(base):
        try:
            out[int(name)] = os.readlink(f"{base}/{name}")
        except FileNotFoundError:
            pass
    return out


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        if run.outcome is None:
            run.stop_now()


@pytest.fixture
def busy_fds() -> Iterator[None]:
    """Low descriptor numbers taken, as in a daemon: the runs' pipes get numbers
    above those a guard sets up for itself (0-4)."""
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(10)]
    yield
    for fd in fds:
        os.close(fd)


@pytest.mark.usefixtures("busy_fds")
def test_a_command_started_later_does_not_keep_an_earlier_runs_daemon_alive(
        tmp_path: Path, runs: list[Run]) -> None:
    first = Run(["sh", "-c", f"touch {tmp_path}/a; exec sleep 60"])
    runs.append(first)
    first.wait_started(tmp_path / "a")
    # The second command is started while the first run's lifeline is open here.
    second = Run(["sh", "-c", f"touch {tmp_path}/b; exec sleep 60"])
    runs.append(second)
    second.wait_started(tmp_path / "b")
    # The first run's daemon side goes (as if its daemon died); the second's stays.
    assert first.pgid and second.pgid  # both started: their lifelines are set up
    assert first.watch is not None and first.watch.pipe is not None
    first.watch.pipe.close()

    outcome = first.finished(timeout=10)
    assert "dblockrun guard: daemon gone; stopping the command" in first.output
    # The service stopped it: SIGTERM to the group (`sleep` dies of it).
    assert outcome.reason == "exit" and outcome.exit_code == -signal.SIGTERM
    wait_for(lambda: not group_alive(first.pgid), 10, what="the first run's group to go")
    assert group_alive(second.pgid) and second.outcome is None
    assert second.stop_now().reason == "stopped"


def test_the_service_and_the_command_hold_only_their_own_descriptors(
        tmp_path: Path, runs: list[Run]) -> None:
    with tempfile.TemporaryFile(dir=tmp_path) as daemons_file:
        secret = os.readlink(f"/proc/self/fd/{daemons_file.fileno()}")
        run = Run(["sleep", "60"])
        runs.append(run)
        command_pid = run.pgid
        service_pid = spawn.start().pid
        command, service = fd_targets(command_pid), fd_targets(service_pid)
    assert command.keys() == {0, 1, 2}
    assert command[0] == "/dev/null"
    assert command[1] == command[2] and command[1].startswith("pipe:")
    # The service holds this run's lifeline and a copy of its output, not the
    # daemon's other descriptors.
    assert command[1] in service.values()
    assert secret not in service.values()
    assert run.stop_now().reason == "stopped"


def test_the_command_leads_its_session_and_group_and_is_not_the_daemons_child(
        runs: list[Run]) -> None:
    run = Run(["sh", "-c", "echo $$ $PPID $(ps -o pgid= -p $$) $(ps -o sid= -p $$)"])
    runs.append(run)
    assert run.finished().exit_code == 0
    pid, ppid, pgid, sid = (int(x) for x in run.output.split())
    assert pid == pgid == sid == run.pgid
    # Started by the spawn service, not by a fork of this (threaded) process.
    assert ppid == spawn.start().pid != os.getpid()


def test_signals_sent_to_the_group_reach_the_command_not_the_guard(
        tmp_path: Path, runs: list[Run]) -> None:
    # As `dblockrun exec` forwards them: the guard ignores them and stays.
    script = (f"trap 'echo usr1' USR1; trap 'echo usr2; exit 7' USR2; touch {tmp_path}/go; "
              "while :; do sleep 0.05; done")
    run = Run(["sh", "-c", script])
    runs.append(run)
    run.wait_started(tmp_path / "go")
    os.killpg(run.pgid, signal.SIGUSR1)
    wait_for(lambda: "usr1" in run.output, 10, what="the command to see SIGUSR1")
    os.killpg(run.pgid, signal.SIGUSR2)
    outcome = run.finished()
    assert (outcome.reason, outcome.exit_code) == ("exit", 7)


@pytest.mark.parametrize("guarded", [True, False], ids=["guard", "no-guard"])
def test_exit_status_and_signal_pass_through(guarded: bool, runs: list[Run]) -> None:
    exited = Run(["sh", "-c", "echo out; echo err >&2; exit 3"], guarded=guarded)
    killed = Run(["sh", "-c", "kill -SEGV $$"], guarded=guarded)
    runs += [exited, killed]
    assert exited.finished().exit_code == 3
    assert exited.output == "out\nerr\n"
    assert killed.finished().exit_code == -signal.SIGSEGV


def test_cannot_start(tmp_path: Path, runs: list[Run]) -> None:
    missing = str(tmp_path / "missing")
    # Under a guard a command that cannot be executed exits 127, as a shell's does.
    guarded = Run([missing])
    direct = Run([missing], guarded=False)
    bad_cwd = Run(["true"], cwd=missing)
    runs += [guarded, direct, bad_cwd]
    assert guarded.finished().exit_code == 127
    assert guarded.output == f"dblockrun: cannot run {missing}: No such file or directory\n"
    assert direct.finished() == ProcessEnd(
        None, "error", b"",
        f"cannot start command: [Errno 2] No such file or directory: '{missing}'")
    assert bad_cwd.finished() == ProcessEnd(
        None, "error", b"",
        f"cannot start command: [Errno 2] No such file or directory: '{missing}'")


def test_the_command_is_found_on_the_jobs_path(tmp_path: Path, runs: list[Run]) -> None:
    tool = tmp_path / "bin" / "mytool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho found\n")
    tool.chmod(0o755)
    env = {"PATH": f"{tmp_path}/nothing:{tool.parent}:/usr/bin:/bin"}
    for guarded in (True, False):
        run = Run(["mytool"], guarded=guarded, env=env)
        runs.append(run)
        assert (run.finished().exit_code, run.output) == (0, "found\n")


def test_a_broken_file_earlier_on_the_path_is_passed_over(tmp_path: Path,
                                                          runs: list[Run]) -> None:
    # As execvp goes down PATH: an entry that cannot be executed (no #!, so
    # ENOEXEC, where glibc's own search stops) gives way to a later one.
    broken, tool = tmp_path / "broken" / "mytool", tmp_path / "bin" / "mytool"
    for path, text in ((broken, "not a program\n"), (tool, "#!/bin/sh\necho found\n")):
        path.parent.mkdir()
        path.write_text(text)
        path.chmod(0o755)
    env = {"PATH": f"{broken.parent}:{tool.parent}:/usr/bin:/bin"}
    for guarded in (True, False):
        run = Run(["mytool"], guarded=guarded, env=env)
        runs.append(run)
        assert (run.finished().exit_code, run.output) == (0, "found\n")
    # Nowhere but there: the error is that entry's, as execvp's.
    alone = Run(["mytool"], guarded=False, env={"PATH": str(broken.parent)})
    runs.append(alone)
    assert alone.finished() == ProcessEnd(
        None, "error", b"", "cannot start command: [Errno 8] Exec format error: 'mytool'")


def test_a_workdir_is_the_commands_only(tmp_path: Path, runs: list[Run]) -> None:
    # The service enters a command's workdir to start it, and goes back.
    service_cwd = os.readlink(f"/proc/{spawn.start().pid}/cwd")
    inside = Run(["pwd"], cwd=str(tmp_path))
    runs.append(inside)
    assert inside.finished().exit_code == 0
    after = Run(["pwd"])
    runs.append(after)
    assert after.finished().exit_code == 0
    assert (inside.output, after.output) == (f"{tmp_path}\n", f"{service_cwd}\n")


def test_a_killed_service_leaves_no_command_running(tmp_path: Path, runs: list[Run]) -> None:
    # No parent-death signal: the daemon's side, seeing its service die,
    # stops every group the service watched, background children too.
    run = Run(["sh", "-c", f"sleep 60 & touch {tmp_path}/go; wait"])
    runs.append(run)
    run.wait_started(tmp_path / "go")
    service = spawn.start().pid
    os.kill(service, signal.SIGKILL)
    outcome = run.finished(timeout=20)
    assert outcome.reason == "stopped" and "the spawn service died" in (outcome.detail or "")
    wait_for(lambda: not group_alive(run.pgid), 10, what="the group to go")
    # The next command has a new service.
    again = Run(["true"])
    runs.append(again)
    assert again.finished().exit_code == 0
    assert spawn.start().pid != service


def test_a_service_killed_as_its_command_starts_leaves_no_run_waiting(
        tmp_path: Path, runs: list[Run], monkeypatch: pytest.MonkeyPatch) -> None:
    # The command has started, but its run thread has not yet handed its
    # pipes to the reactor when the service dies; the reactor, with nothing
    # to read, ends. The run still ends (a CI run on a loaded machine waited
    # for ever on its output).
    posting, release = threading.Event(), threading.Event()
    post = spawn.SpawnService.post

    def held_post(self: spawn.SpawnService, todo: tuple[str, spawn.Spawned]) -> None:
        if todo[0] == "add":
            posting.set()
            release.wait(10)
        post(self, todo)

    monkeypatch.setattr(spawn.SpawnService, "post", held_post)
    service = spawn.start()
    run = Run(["sh", "-c", f"touch {tmp_path}/go; sleep 60"])
    runs.append(run)
    assert posting.wait(10)
    run.wait_started(tmp_path / "go")
    os.kill(service.pid, signal.SIGKILL)
    wait_for(lambda: not service._thread.is_alive(), 10, what="the reactor to end")
    release.set()
    outcome = run.finished(timeout=10)
    assert outcome.reason == "stopped" and "the spawn service died" in (outcome.detail or "")
    wait_for(lambda: not group_alive(run.pgid), 10, what="the group to go")


def test_a_stopped_service_ends_quietly_and_the_next_start_is_a_new_one(
        runs: list[Run], caplog: pytest.LogCaptureFixture) -> None:
    """A backfill's or rerun's end (dblockrun/ops/again.py): the service
    process ends and is reaped, the reactor thread ends and closes its
    socket, and that is no 'service died' error."""
    run = Run(["true"])
    runs.append(run)
    assert run.finished().exit_code == 0
    service = spawn.start()
    reactor = service._thread
    service.stop()
    assert not reactor.is_alive() and service._sock.fileno() == -1
    with pytest.raises(ChildProcessError):
        os.waitpid(service.pid, os.WNOHANG)  # reaped, not a zombie
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    again = Run(["true"])
    runs.append(again)
    assert again.finished().exit_code == 0
    assert spawn.start() is not service


def test_the_service_imports_spawner_and_is_not_run_as_a_script() -> None:
    """Issue 33 item 4: a script's source is compiled at each start, and the
    compiler's memory stayed with the service (1.6 MB of its 6, bench/idle.py);
    imported, spawner comes from its compiled file."""
    argv = Path(f"/proc/{spawn.start().pid}/cmdline").read_bytes().split(b"\0")[:-1]
    assert argv[1:5] == [b"-I", b"-S", b"-c", spawn._SERVE.encode()]
    assert [a for a in argv if a.endswith(b".py")] == []


def test_fences_and_kills_come_due_for_many_runs_at_once(tmp_path: Path) -> None:
    # The service's timers: a lifeline's beats move a fence later; silence
    # past it stops the command (SIGTERM), and one that ignores SIGTERM gets
    # SIGKILL after the grace, each run on its own times.
    service = spawn.start()
    fence, grace = 0.6, 0.4
    lines: dict[int, list[bytes]] = {}

    def start(argv: list[str]) -> tuple[spawn.Spawned, spawn.Lifeline]:
        line = spawn.Lifeline()
        r, w = os.pipe()
        sink: list[bytes] = []
        try:
            child = service.spawn(argv, env=dict(os.environ), cwd=None, out_fd=w, err_fd=w,
                                  beat_fd=line.read_fd, fence=fence, grace=grace, ids=None,
                                  streams=[(r, sink.append)])
        finally:
            os.close(w)
            line.handed_over()
        lines[child.pid] = sink
        return child, line

    beaten = [start(["sleep", "60"]) for _ in range(20)]
    silent = [start(["sh", "-c", f"trap '' TERM; touch {tmp_path}/go$$; "
                     "while :; do sleep 0.05; done"]) for _ in range(20)]
    try:
        started = time.monotonic()
        while time.monotonic() - started < 3 * fence:  # past the first fence
            for _child, line in beaten:
                line.beat()
            time.sleep(fence / 4)
        assert not any(child.wait(0) for child, _line in beaten)
        for child, _line in silent:
            assert child.wait(10) and child.returncode == -signal.SIGKILL
        # Silent from now: each beaten one stops within its fence.
        for child, _line in beaten:
            assert child.wait(10) and child.returncode == -signal.SIGTERM
        for child, _line in beaten + silent:
            child.finish_output(2.0)
            assert lines[child.pid] == [
                f"dblockrun guard: lease not renewed for {fence:g}s; stopping the command\n"
                .encode()]
    finally:
        for child, line in beaten + silent:
            child.kill()
            line.close()


def test_a_wait_returns_when_the_child_ends_not_at_its_timeout() -> None:
    service = spawn.start()
    r, w = os.pipe()
    try:
        child = service.spawn(["sleep", "0.2"], env=dict(os.environ), cwd=None, out_fd=w,
                              err_fd=w, beat_fd=None, fence=None, grace=1.0, ids=None,
                              streams=[(r, lambda _line: None)])
    finally:
        os.close(w)
    assert child.wait(0) is False
    returned: list[bool] = []
    waiter = threading.Thread(target=lambda: returned.append(child.wait(600)), daemon=True)
    waiter.start()
    # Far below the 600 s timeout: the service's report wakes the wait.
    wait_for(lambda: returned or None, 30, what="the wait to return once sleep 0.2 ended")
    assert returned == [True] and child.returncode == 0
    child.finish_output(2.0)


def test_a_command_that_ignores_sigterm_is_still_stopped(tmp_path: Path,
                                                         runs: list[Run]) -> None:
    run = Run(["sh", "-c", f"trap '' TERM; touch {tmp_path}/go; while :; do sleep 0.05; done"])
    runs.append(run)
    run.wait_started(tmp_path / "go")
    stopper = threading.Thread(target=run.stop_now, daemon=True)
    stopper.start()
    stopper.join(timeout=30)
    if stopper.is_alive():
        os.killpg(run.pgid, signal.SIGKILL)
        pytest.fail("stopping a command that ignores SIGTERM hung")
    assert run.finished() == ProcessEnd(-signal.SIGKILL, "stopped", b"", "shutdown grace ran out")
    wait_for(lambda: not group_alive(run.pgid), 10, what="the group to go")


STUCK_FORK = """\
import logging, os, sys, threading
from dblockrun.running.runner import LeaseWatch, run_process

logging.basicConfig(level=logging.INFO)
held = threading.Lock()  # held by this process at any fork
forks = []

def after_in_child():
    held.acquire()  # every forked child of this process waits for ever

os.register_at_fork(before=lambda: forks.append(1), after_in_child=after_in_child)
held.acquire()
lines = []
for watch in (LeaseWatch("job", "host", 1, 30.0), None):
    forks.clear()
    out = run_process(["echo", "ran"], env=dict(os.environ), cwd=None, on_line=lines.append,
                      deadline=None, watch=watch, stop=threading.Event())
    print(out.exit_code, out.reason, len(forks), flush=True)
sys.stdout.write(b"".join(lines).decode())
"""


def test_a_lock_held_at_a_fork_cannot_stop_a_command_from_starting() -> None:
    # A forked child can inherit a lock that another thread held at the fork
    # (the SIGTERM-hang CI failure: libfaketime's lock, taken in CPython's
    # after-fork code) and wait for ever, and the run with it, holding its
    # lease. Here every forked child of the process waits for such a lock:
    # the commands still run, since nothing forks it (the spawn service is
    # a new interpreter, and it forks only itself).
    try:
        res = subprocess.run([sys.executable, "-c", STUCK_FORK], capture_output=True,
                             text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("run_process waited for ever for a child stuck in the fork")
    assert res.returncode == 0, res.stderr
    # Guarded and unguarded: the command ran once, and this process never forked.
    assert res.stdout.splitlines() == ["0 exit 0", "0 exit 0", "ran", "ran"], res.stdout


def test_the_fence_counts_from_the_renewals_send_time_not_the_beats_arrival() -> None:
    # A renewal that waited behind another transaction's row lock: the
    # database counted the lease from when it got the statement, so the
    # service counts the fence from the send time the beat carries.
    service = spawn.start()
    fence = 2.0
    line = spawn.Lifeline()
    r, w = os.pipe()
    try:
        child = service.spawn(["sleep", "60"], env=dict(os.environ), cwd=None, out_fd=w,
                              err_fd=w, beat_fd=line.read_fd, fence=fence, grace=0.5, ids=None,
                              streams=[(r, lambda _b: None)])
    finally:
        os.close(w)
        line.handed_over()
    try:
        beat = time.monotonic()
        line.beat(beat - 1.8)  # sent 1.8 s ago: 0.2 s of the fence are left
        assert child.wait(10) and child.returncode == -signal.SIGTERM
        gone = time.monotonic() - beat
        assert gone < 1.2, f"stopped {gone:.2f}s after the beat (from its arrival: {fence}s)"
    finally:
        child.kill()
        line.close()


def test_a_command_is_never_started_after_its_lease_ran_out(tmp_path: Path) -> None:
    # The fault soak: a daemon stopped (SIGSTOP) between its last look at a
    # retry's lease and the spawn request; on SIGCONT the request went out
    # and the command ran, 2.5 s after another host had claimed the job.
    # The request carries the last renewal's send time: the service counts
    # the fence from it and refuses a start whose fence has passed.
    service = spawn.start()
    marker = tmp_path / "ran"
    for since, starts in ((time.monotonic() - 2.5, False), (time.monotonic() - 0.5, True)):
        line = spawn.Lifeline()
        r, w = os.pipe()
        try:
            try:
                child = service.spawn(["touch", str(marker)], env=dict(os.environ), cwd=None,
                                      out_fd=w, err_fd=w, beat_fd=line.read_fd, fence=2.0,
                                      grace=0.5, ids=None, streams=[(r, lambda _b: None)],
                                      since=since)
            except spawn.LeaseRanOut:
                assert not starts, "refused a start within its fence"
                os.close(r)
                continue
            finally:
                os.close(w)
                line.handed_over()
            assert starts, "started a command 0.5 s after its fence had passed"
            assert child.wait(10) and child.returncode == 0
        finally:
            line.close()
        assert marker.exists() == starts
    assert marker.exists()


def test_a_run_whose_lease_ran_out_before_its_start_ends_fenced(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    watch = LeaseWatch("j", "h", 1, lease=2.0, last_ok=time.monotonic() - 3.0)
    outcome = run_process(["touch", str(marker)], env=dict(os.environ), cwd=None,
                          on_line=lambda _b: None, deadline=None, watch=watch,
                          stop=threading.Event(), kill_grace=0.5)
    assert outcome.reason == "fenced" and "lease ran out" in outcome.detail
    assert not marker.exists()


def test_a_lifeline_stopped_before_its_handover_closes_each_end_once() -> None:
    # The run watcher stops a run whose lease was lost (closing its
    # lifeline) while a worker starts its command: the handover that follows
    # must not close the read end again (its number may be reused by then),
    # and a beat after the close writes nowhere.
    line = spawn.Lifeline()
    read_fd = line.read_fd
    line.close()
    reused = os.open(os.devnull, os.O_RDONLY)  # the lowest free number: likely read_fd's
    try:
        line.handed_over()
        line.beat()
        line.close()
        os.fstat(reused)  # still open
    finally:
        os.close(reused)
    assert line.read_fd == line.write_fd == -1 and read_fd >= 0


# -- issue 36 item 17: any finite monotonic reading ----------------------------------------


def test_a_send_time_of_any_finite_reading_is_taken() -> None:
    """``since`` is a reading of the sender's monotonic clock: past 10**9 s
    under a time namespace or libfaketime. The service refused any reading
    from 10**9 on (``Invalid argument (request)``); a reading later than its
    own is taken as now, and only a reading that is no number is refused."""
    service = spawn.start()
    for since, ok in ((2e9, True), (time.monotonic() + 5e9, True), (-1.0, None),
                      (float("inf"), False), (float("nan"), False)):
        line = spawn.Lifeline()
        r, w = os.pipe()
        try:
            try:
                child = service.spawn(["true"], env=dict(os.environ), cwd=None, out_fd=w,
                                      err_fd=w, beat_fd=line.read_fd, fence=30.0, grace=0.5,
                                      ids=None, streams=[(r, lambda _b: None)], since=since)
            except spawn.LeaseRanOut:  # a reading 30 s and more before now: the fence passed
                assert ok is None, since
                os.close(r)
                continue
            except OSError as exc:
                assert ok is False and exc.errno == errno.EINVAL, (since, exc)
                os.close(r)
                continue
            finally:
                os.close(w)
                line.handed_over()
            assert ok, since
            assert child.wait(10) and child.returncode == 0
        finally:
            line.close()


def _in_time_namespace(offset: int) -> list[str] | None:
    """The command line prefix that runs a process with its monotonic clock
    ``offset`` seconds ahead (a time namespace; root), None where it cannot."""
    prefix = ["unshare", "--time", "--monotonic", str(offset), "--fork"]
    try:
        probe = subprocess.run([*prefix, sys.executable, "-c",
                                "import time; print(time.monotonic())"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    ok = probe.returncode == 0 and float(probe.stdout or 0) > offset
    return prefix if ok else None


def test_commands_run_with_a_monotonic_clock_past_a_billion_seconds(
        sqlite_db: TestDb, tmp_path: Path) -> None:
    """Every run of every job failed where the monotonic clock reads more
    than 10**9 s (a time namespace's offset, here 2*10**9): ``exec`` and a
    daemon's job, real processes in such a namespace."""
    ahead = _in_time_namespace(2_000_000_000)
    if ahead is None:
        pytest.skip("no time namespace here (unshare --time needs root and Linux 5.6)")
    base = [*ahead, *dblockrun_cmd(), "--db", sqlite_db.url, "--table-prefix", sqlite_db.prefix]
    done = subprocess.run([*base, "exec", "-n", "once", "--", "echo", "ran"],
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ran\n", "")
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  tick: {cron: '* * * * * *', command: 'echo tick'}\n")
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen([*base, "daemon", str(jobs), "--heartbeat", "1s",
                                   "--lease", "3s"], stdout=out, stderr=out, env=clean_env(),
                                  start_new_session=True)
    try:
        with Store(sqlite_db.url, sqlite_db.prefix) as store:
            runs = wait_for(lambda: r if len(r := [x for x in store.history("tick", 10)
                                                   if x.finished]) >= 2 else None,
                            30, what="two ended runs of tick")
        assert {r.result for r in runs} == {"ok"}, log.read_text()
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=30)
    assert "cannot start command" not in log.read_text()
