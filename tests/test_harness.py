"""The test harness itself (tests/harness.py): stopping the test command by
its process group, as a terminal's Ctrl-C or a CI runner's cancel does,
leaves no process behind, a frozen daemon and its command included
(issue 36, item 13); what :func:`helpers.invoke` takes for a thread a
command left behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import click
import pytest
from harness import SUBREAPER_PRELUDE, end, pid_alive, state, track
from helpers import (
    HARNESS_THREAD,
    NICENESS,
    REPO,
    at_low_priority,
    clean_env,
    invoke,
    wait_for,
)
from hooks import Hooks

import dblockrun.cli

#: A test that starts a daemon whose command runs for an hour, freezes the
#: daemon (SIGSTOP), says which processes it has, and waits to be interrupted.
INNER = '''\
import os
import time
from pathlib import Path


def test_waits_with_a_frozen_daemon(sqlite_fleet):
    probe = Path(os.environ["HARNESS_PROBE"])
    command = probe.with_name("command.pid")
    d = sqlite_fleet.start(f"""jobs:
  long:
    rate: 1h
    command: echo $$ > {command}; exec sleep 3600
""")
    d.wait(lambda: command.exists() and command.read_text().strip(), 30, "the command")
    d.freeze()
    probe.write_text(f"{d.pid} {command.read_text().strip()}")
    time.sleep(600)
'''


#: The test command's parent: a child subreaper (as an init, a container's
#: PID 1 or a CI runner is) in the test's session, which starts the test run
#: as a process group of its own (as a shell does a job), says its pid and
#: exit status, then reaps the orphans that come to it until told to end.
#: The run's orphans stay in its session: no kernel continues a frozen one
#: for having lost its parent (as it does an orphaned process group's).
PARENT = SUBREAPER_PRELUDE + """\
import signal, subprocess, time
signal.signal(signal.SIGINT, signal.SIG_DFL)  # as in a terminal, not a background job
log, done = sys.argv[1], sys.argv[2]
with open(log, "wb") as out:
    run = subprocess.Popen(sys.argv[3:], stdout=out, stderr=subprocess.STDOUT,
                           process_group=0)
print(run.pid, flush=True)
print(run.wait(), flush=True)
while not os.path.exists(done):
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        pass
    time.sleep(0.05)
"""


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "workers"), [
    (signal.SIGINT, "0"), (signal.SIGTERM, "0"), (signal.SIGINT, "2"), (signal.SIGTERM, "2"),
], ids=["SIGINT", "SIGTERM", "SIGINT-xdist", "SIGTERM-xdist"])
def test_stopping_the_test_run_by_its_process_group_leaves_no_process(
        tmp_path: Path, sig: signal.Signals, workers: str) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    probe, log, done = tmp_path / "probe", tmp_path / "inner.log", tmp_path / "done"
    # The inner run loads tests/conftest.py as the suite does, in folders of
    # its own (not the options this run was given: its --basetemp would be
    # emptied).
    env = clean_env(HARNESS_PROBE=str(probe),
                    PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]))
    env.pop("PYTEST_ADDOPTS", None)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(log), str(done),
         sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-c", os.devnull, "--basetemp", str(tmp_path / "inner"),
         "--backends", "sqlite", "-n", workers, "-q", str(tmp_path / "test_inner.py")],
        cwd=tmp_path, stdout=subprocess.PIPE, text=True, env=env)
    track(parent)
    assert parent.stdout is not None
    try:
        run = int(parent.stdout.readline())
        wait_for(lambda: probe.exists() and probe.read_text() or parent.poll() is not None, 120,
                 what="the inner test to freeze its daemon")
        assert parent.poll() is None, log.read_text()
        daemon, command = (int(pid) for pid in probe.read_text().split())
        wait_for(lambda: state(daemon) == "T", 10, what="the daemon stopped (SIGSTOP)")
        assert pid_alive(command)
        os.killpg(run, sig)
        signalled = time.monotonic()
        status = parent.stdout.readline()
        print(f"\nthe test run ended {time.monotonic() - signalled:.1f}s after the {sig.name}")
        # Interrupted, as by Ctrl-C: its fixtures torn down, not killed by the signal.
        assert status == f"{pytest.ExitCode.INTERRUPTED:d}\n", (status, log.read_text())
        wait_for(lambda: not pid_alive(daemon) and not pid_alive(command)
                 and not group_members(run), 30,
                 what="the frozen daemon, its command and every process of the run to be gone")
    finally:
        if group_members(run):
            os.killpg(run, signal.SIGCONT)
            os.killpg(run, signal.SIGKILL)
        done.touch()
        end(parent, 10)


def test_invoke_fails_a_thread_the_command_left_not_a_hook_served_meanwhile(
        hooks: Hooks, monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon process may send to the test's hooks while a command runs in
    this process (CI: ``status --json`` failed, "left behind: thread Thread-207
    (process_request_thread)"); the thread serving it is the harness's. A
    thread the command started and left running still fails the call."""
    client = socket.socket()  # made before the call: not a socket the command left open
    release = threading.Event()

    @click.command()
    @click.argument("what")
    def command(what: str) -> None:
        if what == "thread":
            threading.Thread(target=release.wait, args=(30,), name="the command's").start()
            return
        # As a daemon's request arriving now: its body still to come when the call ends.
        before = set(threading.enumerate())
        client.connect(("127.0.0.1", hooks.port))
        client.sendall(b"POST /hook HTTP/1.0\r\nContent-Length: 2\r\n\r\n")
        wait_for(lambda: [t for t in set(threading.enumerate()) - before
                          if t.name.startswith(HARNESS_THREAD)], 10,
                 what="the hooks server's thread for the request")

    monkeypatch.setattr(dblockrun.cli, "cli", command)
    try:
        assert invoke("hook").returncode == 0
        client.sendall(b"{}")
        assert client.recv(100).startswith(b"HTTP/1.0 200")
        assert [h.path for h in hooks.under("/hook")] == ["/hook"]
        with pytest.raises(AssertionError, match="left behind: thread the command's"):
            invoke("thread")
    finally:
        release.set()
        client.close()


def test_builds_at_low_priority_leave_the_callers_priority_alone() -> None:
    def nice_of_a_child() -> int:
        out = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"],
                             capture_output=True, text=True, check=True).stdout
        return int(out)

    before = os.nice(0)
    assert at_low_priority(nice_of_a_child) == max(before, NICENESS)
    assert os.nice(0) == before  # the test's own thread, and so its later daemons
    assert nice_of_a_child() == before
    with pytest.raises(ZeroDivisionError):  # a failure reaches the caller
        at_low_priority(lambda: 1 // 0)
