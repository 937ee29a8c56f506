"""A job's ``limits:`` (issue 35 item 2): read and checked from the jobs file,
set in the command's process before it starts (so on everything it starts),
and a run a limit ended recorded with the limit, while the daemon and its
other jobs go on. Real commands through the spawn service; real daemons on
every database where a run is recorded.

This machine is a cgroup v1 hybrid: the cgroup v2 path (``memory.max``,
``pids.max`` per run) is tested where the test process's cgroup v2 is
delegated and skipped with the reason elsewhere; the rlimit fallback is what
the daemon tests exercise here. (tests/test_limits.py is about
``--max-running`` and groups.)"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import REPO, TestDb, clean_env, dblockrun_cmd, wait_for

from dblockrun.cli import cli
from dblockrun.config.load import load_jobs_text
from dblockrun.errors import ConfigError
from dblockrun.jobs import JobsFile, Limits
from dblockrun.running import cgroups, resources, spawn
from dblockrun.running.runner import LeaseWatch, ProcessEnd, run_process
from dblockrun.store import Store
from dblockrun.store import models as m

FILE = "jobs.yaml"
PY = sys.executable
#: A Python that asks for 256 MiB at once and writes it: past a 64M limit
#: however counted (address space, or memory used).
HOG = f"{PY} -c 'b = b\"x\" * (256 * 2**20); print(\"got it\")'"


def load(text: str) -> JobsFile:
    return load_jobs_text(textwrap.dedent(text), FILE)


def error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(text)
    return info.value.render()


# --- the jobs file -----------------------------------------------------------------


def test_limits_are_read_into_the_job_and_merged_over_defaults_limit_by_limit() -> None:
    jobs = load("""\
        defaults:
          limits: {memory: 1G, nice: 5, open-files: 4096}
        jobs:
          export:
            cron: "@daily"
            command: x
            limits:
              memory: 512M
              cpu: 150%
              cpu-time: 1h30m
              tasks: 200
              io: best-effort  7
          lifted:
            cron: "@daily"
            command: x
            limits: {memory: null}
          none:
            cron: "@daily"
            command: x
            limits: null
          plain:
            cron: "@daily"
            command: x
        """)
    by = {job.name: job.limits for job in jobs.jobs}
    assert by["export"] == Limits(memory=512 << 20, cpu=150, cpu_time=5400, tasks=200,
                                  open_files=4096, nice=5, io="best-effort 7")
    assert by["lifted"] == Limits(nice=5, open_files=4096)
    assert by["none"] == Limits() and not by["none"].any
    assert by["plain"] == Limits(memory=1 << 30, nice=5, open_files=4096)
    assert by["export"].text() == ("memory 512M, cpu 150%, cpu-time 1h30m, tasks 200, "
                                   "open-files 4096, nice 5, io best-effort 7")


def test_a_job_without_limits_keeps_its_definition_hash() -> None:
    """Daemons of the version before compare hashes with this one's: a job
    that sets no limits must not look changed to them."""
    (plain, limited) = load("""\
        jobs:
          a: {cron: "@daily", command: x}
          b: {cron: "@daily", command: x, limits: {nice: 10}}
        """).jobs
    assert "limits" not in plain.definition_data()
    assert limited.definition_data()["limits"] == "nice 10"
    assert limited.set_fields()["limits"] == "nice 10"


def _bad(limits: str) -> str:
    return error(f"""\
        jobs:
          j:
            cron: "@daily"
            command: x
            limits:
              {limits}
        """)


@pytest.mark.parametrize(("limits", "message"), [
    ("memory: 512MB", "limits.memory: MB is ambiguous (1000 or 1024?): write 512M or 512MiB "
                      "(powers of 1024)"),
    ("memory: lots", "limits.memory: must be a size like 512M or 2G (K, M, G, T: powers of "
                     "1024), got a string ('lots')"),
    ("memory: 512K", "limits.memory: must be from 1M to 1024T, got 512K"),
    ("memory: 2048T", "limits.memory: must be from 1M to 1024T, got 2048T"),
    ("memory: 1000.5", "limits.memory: must be a size like 512M or 2G (K, M, G, T: powers of "
                       "1024), got a number (1000.5)"),
    ("cpu: 50", "limits.cpu: must be a percentage of one CPU like 50% (200%: two CPUs), "
                "got a number (50)"),
    ("cpu: 0%", "limits.cpu: must be from 1% to 100,000%, got 0%"),
    ("cpu-time: 1.5s", "limits.cpu-time: must be whole seconds (the kernel counts CPU time "
                       "limits in seconds), got 1.5s"),
    ("cpu-time: 500ms", "limits.cpu-time: must be at least 1s, got 500ms"),
    ("cpu-time: soon", "limits.cpu-time: 'soon' is not a duration (use e.g. 250ms, 90s, 5m, "
                       "1h30m, 2d)"),
    ("tasks: 0", "limits.tasks: must be from 1 to 4,194,304, got 0"),
    ("tasks: yes", "limits.tasks: must be a whole number (processes and threads), got a "
                   "boolean (true)"),
    ("open-files: 2", "limits.open-files: must be from 3 to 1,048,576, got 2"),
    ("open-files: 2000000", "limits.open-files: must be from 3 to 1,048,576, got 2,000,000"),
    ("nice: 20", "limits.nice: must be from -20 to 19, got 20"),
    ("nice: -21", "limits.nice: must be from -20 to 19, got -21"),
    ("io: fast", "limits.io: must be idle, best-effort or realtime, the last two with an "
                 "optional level 0-7 (best-effort 7), got a string ('fast')"),
    ("io: idle 3", "limits.io: idle takes no level (it has one: it gets the disk only when "
                   "no one else wants it)"),
    ("io: best-effort 8", "limits.io: the level must be 0 (first) to 7 (last), got '8'"),
    ("memroy: 1G", "limits.memroy: unknown key (did you mean 'memory'?)"),
])
def test_a_bad_limit_is_refused_with_file_line_job_and_key(limits: str, message: str) -> None:
    assert _bad(limits) == f"jobs.yaml:6: job 'j': {message}"


def test_limits_must_be_a_mapping_and_defaults_are_checked_too() -> None:
    assert error("jobs:\n  j: {cron: '@daily', command: x, limits: [1G]}\n") == (
        "jobs.yaml:2: job 'j': limits: must be a mapping, got a list")
    assert error("defaults:\n  limits:\n    nice: 40\njobs: {}\n") == (
        "jobs.yaml:3: defaults.limits.nice: must be from -20 to 19, got 40")


def test_validate_exits_2_on_a_bad_limit(tmp_path: Path) -> None:
    path = tmp_path / FILE
    path.write_text("jobs:\n  j:\n    rate: 1h\n    command: x\n    limits: {memory: 1TB}\n")
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2
    assert f"{path}:5: job 'j': limits.memory: TB is ambiguous" in result.output
    assert "Traceback" not in result.output


# --- the command's process ---------------------------------------------------------


def run(command: str, limits: Limits, *, user: str | None = None) -> tuple[ProcessEnd, str]:
    """``command`` through the spawn service under a lease, as a daemon runs it."""
    lines: list[bytes] = []
    outcome = run_process(["sh", "-c", command], env=dict(os.environ), cwd="/",
                          on_line=lines.append, deadline=time.monotonic() + 60,
                          watch=LeaseWatch("j", "h", 1, 30.0), stop=threading.Event(),
                          limits=limits, name="j", user=user)
    return outcome, b"".join(lines).decode()


def test_open_files_is_what_ulimit_n_prints_in_the_command_and_what_it_starts() -> None:
    outcome, out = run("ulimit -n; sh -c 'ulimit -n'", Limits(open_files=64))
    assert (outcome.exit_code, out) == (0, "64\n64\n")
    # Without the limit: the daemon's own (it raises its soft limit to the hard one).
    outcome, out = run("ulimit -n", Limits())
    assert out == f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}\n"


def niceness(stat: str) -> int:
    """Field 19 of /proc/PID/stat (after the command's name in parentheses)."""
    return int(stat[stat.rfind(")") + 2:].split()[16])


def test_nice_is_the_commands_niceness_and_io_its_io_class() -> None:
    outcome, out = run("cat /proc/self/stat; ionice -p $$; sh -c 'ionice -p $$'",
                       Limits(nice=10, io="idle"))
    stat, io, child_io = out.splitlines()
    assert outcome.exit_code == 0
    assert niceness(stat) == 10
    assert (io, child_io) == ("idle", "idle")
    outcome, out = run("ionice -p $$", Limits(io="best-effort 7"))
    assert out == "best-effort: prio 7\n"
    outcome, out = run("cat /proc/self/stat", Limits())
    assert niceness(out) == os.getpriority(os.PRIO_PROCESS, 0)


def test_cpu_time_ends_a_spinning_command_and_says_so() -> None:
    spin = f"{PY} -c 'while True: pass'"
    started = time.monotonic()
    outcome, _out = run(spin, Limits(cpu_time=1))
    assert (outcome.reason, outcome.detail) == ("limit", "out of CPU time (limit 1s)")
    assert outcome.exit_code == 152  # the shell's report of its child's SIGXCPU
    assert time.monotonic() - started < 30
    # The command itself (exec'd by the shell) is killed by SIGXCPU.
    outcome, _out = run(f"exec {spin}", Limits(cpu_time=1))
    assert (outcome.exit_code, outcome.detail) == (-signal.SIGXCPU, "out of CPU time (limit 1s)")


def test_a_run_that_fails_on_its_own_is_not_blamed_on_its_limits() -> None:
    outcome, _out = run("echo no; exit 3", Limits(memory=64 << 20, cpu_time=5, tasks=50))
    assert (outcome.reason, outcome.exit_code, outcome.detail) == ("exit", 3, "")
    # Killed, but not for its CPU time: it used next to none.
    for sig in ("KILL", "XCPU"):
        outcome, _out = run(f"kill -{sig} $$", Limits(cpu_time=5))
        assert (outcome.reason, outcome.detail) == ("exit", "")
        assert outcome.exit_code == -getattr(signal, f"SIG{sig}")
    # Out of memory but exiting 0: nothing to blame.
    outcome, _out = run("echo MemoryError", Limits(memory=64 << 20))
    assert (outcome.reason, outcome.exit_code) == ("exit", 0)


def test_memory_past_the_limit_fails_the_run_with_the_reason() -> None:
    outcome, out = run(HOG, Limits(memory=64 << 20))
    assert "got it" not in out
    assert outcome.exit_code != 0
    assert (outcome.reason, outcome.detail) == ("limit", "out of memory (limit 64M)")
    outcome, out = run(HOG, Limits())
    assert (outcome.exit_code, out) == (0, "got it\n")


def has_capability(bit: int) -> bool:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    return False


CAP_SYS_RESOURCE = 24


def test_a_limit_the_host_cannot_set_fails_the_run_at_its_start() -> None:
    if has_capability(CAP_SYS_RESOURCE):
        pytest.skip("this process may raise any hard limit (CAP_SYS_RESOURCE)")
    spawn.start()  # the service has this process's limits
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard >= 1 << 20:
        pytest.skip(f"the hard limit of open files is {hard}: none above it to ask for")
    outcome, out = run("echo ran", Limits(open_files=hard + 1))
    assert (outcome.reason, outcome.exit_code, out) == ("error", None, "")
    assert outcome.detail == (f"cannot start command: limits: open-files {hard + 1}: above "
                              f"the daemon's own hard limit ({hard}), which only a privileged "
                              "daemon (CAP_SYS_RESOURCE) may raise")


# --- real daemons --------------------------------------------------------------------


@pytest.fixture
def daemons() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_daemon(db: TestDb, jobs: Path, log: Path, *, prefix: list[str] | None = None
                 ) -> subprocess.Popen[bytes]:
    argv = [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "daemon", str(jobs),
            "--heartbeat", "1s", "--lease", "6s", "--grace", "2s"]
    with log.open("wb") as out:
        return subprocess.Popen([*(prefix or []), *argv], stdout=out, stderr=subprocess.STDOUT,
                                env=clean_env(PYTHONUNBUFFERED="1"), cwd=REPO)


def finished_runs(db: TestDb, job: str) -> list[m.RunRecord]:
    with Store(db.url, db.prefix) as store:
        return [r for r in (store.run(x.id) for x in store.history(job, 100))
                if r is not None and r.result not in m.UNFINISHED]


def limit_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if " limits: " in line]


def test_a_command_past_its_memory_limit_fails_alone_and_the_daemon_goes_on(
        db: TestDb, tmp_path: Path, daemons: list[subprocess.Popen[bytes]]) -> None:
    jobs, log = tmp_path / FILE, tmp_path / "daemon.log"
    jobs.write_text(textwrap.dedent(f"""\
        jobs:
          hog:
            rate: 1h
            command: {HOG}
            limits: {{memory: 64M}}
          steady:
            rate: 1s
            command: echo steady
        """))
    daemon = start_daemon(db, jobs, log)
    daemons.append(daemon)
    (hog,) = wait_for(lambda: finished_runs(db, "hog") or None, 60, what="the hog's run")
    assert hog.result == m.FAILED
    assert hog.output is not None and "got it" not in hog.output
    assert hog.output.endswith("out of memory (limit 64M)\n"), hog.output
    assert hog.finished is not None
    end = hog.finished
    # The daemon and its other job go on: a run of steady started after it ended ok.
    later = wait_for(lambda: [r for r in finished_runs(db, "steady") if r.started > end + 0.5]
                     or None, 30, what="a steady run after the hog's end")
    assert later[0].result == m.OK
    assert daemon.poll() is None
    # One line at start-up says how the limits are enforced here.
    said = limit_lines(log)
    assert len(said) == 1, log.read_text()
    delegated = cgroups.find(("memory",))
    if isinstance(delegated, str):
        assert "WARNING limits: no delegated cgroup v2" in said[0]
        assert "memory is an address-space limit (RLIMIT_AS" in said[0]
    assert "job hog: run" in log.read_text() and "(out of memory (limit 64M))" in log.read_text()


def test_a_fork_loop_under_tasks_fails_alone(
        db: TestDb, tmp_path: Path, daemons: list[subprocess.Popen[bytes]]) -> None:
    """RLIMIT_NPROC counts every process of the command's user, and the
    kernel does not apply it to root: without a cgroup v2 the fork loop runs
    as a user of its own (``user: nobody``), which needs a root daemon."""
    delegated = cgroups.find(("pids",))
    if isinstance(delegated, str) and os.geteuid() != 0:
        pytest.skip("without a cgroup v2, tasks is RLIMIT_NPROC, which counts every "
                    "process of the daemon's user: the fork loop needs a user: of its own, "
                    "and so a root daemon")
    user = "    user: nobody\n" if isinstance(delegated, str) else ""
    # RLIMIT_NPROC counts nobody's other processes (a pgbouncer of the tests...).
    tasks = 20 + (len(sleeping("nobody", "")) if user else 0)
    jobs, log = tmp_path / FILE, tmp_path / "daemon.log"
    jobs.write_text("jobs:\n"
                    "  forks:\n"
                    "    rate: 1h\n"
                    f"{user}"
                    '    command: "for i in $(seq 200); do sleep 30 & done; echo all started"\n'
                    f"    limits: {{tasks: {tasks}}}\n"
                    "  steady:\n"
                    "    rate: 1s\n"
                    "    command: echo steady\n")
    daemon = start_daemon(db, jobs, log)
    daemons.append(daemon)
    (forks,) = wait_for(lambda: finished_runs(db, "forks") or None, 60,
                        what="the fork loop's run")
    assert forks.result == m.FAILED
    assert forks.output is not None and "all started" not in forks.output
    assert forks.output.endswith(f"out of tasks (limit {tasks})\n"), forks.output
    assert forks.finished is not None
    end = forks.finished
    later = wait_for(lambda: [r for r in finished_runs(db, "steady") if r.started > end + 0.5]
                     or None, 30, what="a steady run after the fork loop's end")
    assert later[0].result == m.OK and daemon.poll() is None
    # Its background sleeps went with the run (zombies wait for init to reap them).
    if user:
        assert sleeping("nobody", "sleep") == []


def sleeping(user: str, name: str) -> list[str]:
    """The processes of ``user`` (called ``name``; empty: any) not yet ended."""
    ps = subprocess.run(["ps", "-u", user, "-o", "stat=,comm="], capture_output=True, text=True)
    return [line for line in ps.stdout.splitlines()
            if not line.startswith("Z") and (not name or line.split()[-1] == name)]


def test_status_wide_shows_the_jobs_files_limits(db: TestDb, store: Store,
                                                 tmp_path: Path) -> None:
    jobs = tmp_path / FILE
    jobs.write_text("jobs:\n"
                    "  export: {rate: 1h, command: x, limits: {memory: 2G, io: idle}}\n"
                    "  plain: {rate: 1h, command: x}\n")
    store.ensure_jobs(["export", "plain"])
    result = CliRunner().invoke(cli, ["-f", str(jobs), "--db", db.url, "--table-prefix",
                                      db.prefix, "status", "--wide"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.startswith("job "))
    assert header.split()[-1] == "limits"
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.strip()}
    assert rows["export"].endswith("memory 2G, io idle")
    assert rows["plain"].endswith(" -")
    narrow = CliRunner().invoke(cli, ["-f", str(jobs), "--db", db.url, "--table-prefix",
                                      db.prefix, "status"], env={"COLUMNS": "250"})
    assert "memory 2G" not in narrow.output


def test_the_web_job_page_shows_the_limits(store: Store, tmp_path: Path) -> None:
    starlette = pytest.importorskip("starlette.testclient")
    from dblockrun.config.load import load_jobs
    from dblockrun.web.app import create_app
    from dblockrun.web.context import WebConfig

    path = tmp_path / FILE
    path.write_text("jobs:\n  export: {rate: 1h, command: x, limits: {memory: 2G, nice: 10}}\n")
    store.ensure_jobs(["export"])
    client = starlette.TestClient(create_app(WebConfig(store=store, users=None,
                                                       jobs=load_jobs(str(path)))))
    html = client.get("/jobs/export").text
    assert "<code>limits</code></td><td><code>memory 2G, nice 10</code>" in html


def test_the_example_unit_delegates_its_cgroup() -> None:
    """Jobs' memory, cpu and tasks need the unit's cgroup delegated, and
    writable: ProtectControlGroups=yes would make it read-only."""
    lines = [line.strip() for line in (REPO / "examples" / "dblockrun.service").read_text()
             .splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert "Delegate=yes" in lines
    assert not any(line.startswith("ProtectControlGroups=") for line in lines)


# --- cgroup v2 --------------------------------------------------------------------------


def writable_cgroup2() -> str:
    """A new cgroup v2 directory under this process's, or skip saying why not."""
    found = cgroups.find(())
    if isinstance(found, str):
        pytest.skip(found)
    path = os.path.join(found.base, f"dblockrun-test-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.mkdir(path)
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup under {found.base}: {exc.strerror}")
    return path


def test_a_command_joins_its_cgroup_before_it_starts_and_nothing_in_it_outlives_the_run(
        tmp_path: Path) -> None:
    """Without controllers (this machine's cgroup v2 has none worth having),
    the mechanics the limits rely on: the spawn service's child joins the
    run's group before the command starts, so what it starts is in it too,
    even a process that left its session and process group; the run's end
    kills all of them and removes the group."""
    base = writable_cgroup2()
    try:
        group = cgroups.RunGroup(base, "j", memory=None, cpu=None, tasks=None)
        escaped = tmp_path / "escaped.pid"
        lines: list[bytes] = []
        request: dict[str, object] = {"rlimits": [], "nice": None, "io": None, "cgroup": group.path}
        r, w = os.pipe()
        proc = spawn.start().spawn(
            ["sh", "-c", "cat /proc/self/cgroup; "
                   f"setsid sh -c 'echo $$ > {escaped}; exec sleep 300' &"],
            env=dict(os.environ), cwd=None, out_fd=w, err_fd=w, beat_fd=None, fence=None,
            grace=1.0, ids=None, streams=[(r, lines.append)], limits=request)
        os.close(w)
        assert proc.wait(30)
        pid = int(wait_for(lambda: escaped.exists() and escaped.read_text().strip(), 10,
                           what="the escaped sleep's pid"))
        mount = cgroups.cgroup2_mount(Path("/proc/self/mountinfo").read_text())
        assert mount is not None
        leaf = "/" + os.path.relpath(group.path, mount[0])
        assert proc.returncode == 0
        assert Path(f"/proc/{pid}/cgroup").read_text().count(f"0::{leaf}") == 1
        # Left its session, still in the group: the end of the run kills it.
        assert os.getsid(pid) != proc.pid
        group.kill()
        proc.finish_output(10)
        assert f"0::{leaf}\n".encode() in b"".join(lines)
        group.remove()
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or
                 Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z", 10,
                 what="the escaped sleep to die")
        assert not os.path.exists(group.path)
    finally:
        for name in os.listdir(base) if os.path.isdir(base) else ():
            if os.path.isdir(os.path.join(base, name)):
                os.rmdir(os.path.join(base, name))
        os.rmdir(base)


def delegated_cgroup() -> cgroups.Delegation:
    """This process's cgroup v2 with the memory and pids controllers, or skip
    saying why not (a cgroup v1 or hybrid host, a cgroup not delegated)."""
    found = cgroups.find(("memory", "pids"))
    if isinstance(found, str):
        pytest.skip(f"no delegated cgroup v2 with memory and pids: {found}")
    if not {"memory", "pids"} <= found.controllers:
        pytest.skip(f"the cgroup v2 {found.base} offers {sorted(found.controllers)}: "
                    "not both memory and pids")
    return found


def test_memory_and_tasks_bind_the_run_through_its_cgroup_v2(
        db: TestDb, tmp_path: Path, daemons: list[subprocess.Popen[bytes]]) -> None:
    """Where this process's cgroup v2 is delegated with memory and pids: a
    daemon started in a cgroup of its own below it takes it over (moves to
    its leaf, enables the controllers) and gives each run a group: the OOM
    killer ends the hog with the limit named, pids.max stops the fork loop,
    a command's memory.max is its limit."""
    found = delegated_cgroup()
    base = found.base
    # cgroup v2 keeps processes in leaves once controllers are enabled below:
    # this process moves to a leaf of its own, the daemon gets a sibling.
    mine = os.path.join(base, f"pytest-{os.getpid()}")
    os.makedirs(mine, exist_ok=True)
    for pid in Path(base, "cgroup.procs").read_text().split():
        try:
            Path(mine, "cgroup.procs").write_text(pid)
        except OSError:
            pass  # gone, or a kernel thread
    Path(base, "cgroup.subtree_control").write_text("+memory +pids")
    home = os.path.join(base, f"dblockrun-{os.getpid()}")
    os.makedirs(home, exist_ok=True)
    jobs, log = tmp_path / FILE, tmp_path / "daemon.log"
    jobs.write_text(textwrap.dedent(f"""\
        jobs:
          hog:
            rate: 1h
            command: "cat /proc/self/cgroup; {HOG}"
            limits: {{memory: 64M}}
          forks:
            rate: 1h
            command: "for i in $(seq 200); do sleep 30 & done; echo all started"
            limits: {{tasks: 20}}
          steady:
            rate: 1s
            command: echo steady
        """))
    into = f'echo $$ > {home}/cgroup.procs && exec "$@"'
    daemons.append(start_daemon(db, jobs, log, prefix=["sh", "-c", into, "sh"]))
    (hog,) = wait_for(lambda: finished_runs(db, "hog") or None, 60, what="the hog's run")
    (forks,) = wait_for(lambda: finished_runs(db, "forks") or None, 60, what="the forks' run")
    said = limit_lines(log)
    assert len(said) == 1 and f"by a cgroup v2 per run under {home}" in said[0], said
    assert hog.result == m.FAILED and hog.output is not None
    assert hog.output.endswith("out of memory (limit 64M)\n"), hog.output
    assert "/run-" in hog.output.splitlines()[0]
    assert forks.result == m.FAILED and forks.output is not None
    assert forks.output.endswith("out of tasks (limit 20)\n"), forks.output
    assert [r.result for r in finished_runs(db, "steady")][:1] == [m.OK]
    # Each run's group is gone with it.
    wait_for(lambda: not any(n.startswith("run-") for n in os.listdir(home)), 10,
             what="the runs' groups removed")


def test_the_enforcement_is_said_once_naming_what_falls_short() -> None:
    jobs = load("""\
        jobs:
          a: {cron: "@daily", command: x, limits: {memory: 1G, cpu: 50%}}
          b: {cron: "@daily", command: x, limits: {nice: 5}}
        """).jobs
    fallback = resources.Enforcement(None, "this host has no cgroup v2 (cgroup v1 only)",
                                     "/usr/bin/ionice")
    text, short = resources.describe(fallback, jobs)
    assert short
    assert text == ("limits: no delegated cgroup v2 (this host has no cgroup v2 (cgroup v1 "
                    "only)); memory is an address-space limit (RLIMIT_AS: memory a program "
                    "reserves counts too); cpu is not enforced (job a)")
    text, short = resources.describe(fallback, jobs[1:])
    assert (text, short) == ("limits: set in each command's process before it starts", False)
    delegated = resources.Enforcement(
        cgroups.Delegation("/sys/fs/cgroup/x", frozenset({"memory", "pids", "cpu"})), "", None)
    text, short = resources.describe(delegated, jobs)
    assert (text, short) == ("limits: memory and cpu by a cgroup v2 per run under "
                             "/sys/fs/cgroup/x", False)
    # Delegate=memory: cpu falls short.
    partly = resources.Enforcement(
        cgroups.Delegation("/sys/fs/cgroup/x", frozenset({"memory"})), "", "/usr/bin/ionice")
    text, short = resources.describe(partly, jobs)
    assert short
    assert text == ("limits: memory by a cgroup v2 per run under /sys/fs/cgroup/x; its cgroup "
                    "v2 offers only these controllers: memory; cpu is not enforced (job a)")


def test_the_cgroup_of_this_process_is_found_from_proc() -> None:
    assert cgroups.own_cgroup("4:memory:/x\n0::/system.slice/dblockrun.service\n") == (
        "/system.slice/dblockrun.service")
    assert cgroups.own_cgroup("4:memory:/x\n1:cpu:/\n") is None
    mountinfo = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw\n"
                 "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    assert cgroups.cgroup2_mount(mountinfo) == ("/sys/fs/cgroup/unified", "/")
    assert cgroups.cgroup2_mount(mountinfo.splitlines()[0]) is None


def test_a_reload_that_brings_a_new_kind_of_limit_says_how_it_is_enforced(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Said once at the start; again only when a reload brings a limit the
    first decision did not cover (nice at the start, memory later)."""
    monkeypatch.setattr(resources, "_current", None)
    monkeypatch.setattr(resources, "_decided_for", frozenset())
    monkeypatch.setattr(cgroups, "find", lambda wanted: "this host has no cgroup v2")
    first = load("jobs:\n  a: {cron: '@daily', command: x, limits: {nice: 5}}\n").jobs
    later = load("jobs:\n  a: {cron: '@daily', command: x, limits: {nice: 5}}\n"
                 "  b: {cron: '@daily', command: x, limits: {memory: 1G}}\n").jobs
    with caplog.at_level("INFO", logger="dblockrun"):
        resources.start(first, 0)
        resources.start(first, 0)  # a reload that changes nothing of it
        resources.start(later, 0)
        resources.start(later, 0)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        ("INFO", "limits: set in each command's process before it starts"),
        ("WARNING", "limits: no delegated cgroup v2 (this host has no cgroup v2); memory is "
                    "an address-space limit (RLIMIT_AS: memory a program reserves counts too)"),
    ]
    assert resources.current().cgroups is None
