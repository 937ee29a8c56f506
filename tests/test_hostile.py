"""Hostile input, round 2 (issue 25): what a command inherits (the daemon's
secrets never), requests too large for the spawn service, and control
characters on terminals and in text logs.

Real `dblockrun` daemons and exec processes against a real SQLite database
(what is tested here does not depend on the backend); other commands in-process
(helpers.invoke), but `history --raw`'s bytes on a real stdout.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import Fleet, track
from helpers import REPO, Ran, TestDb, clean_env, cli, dblockrun_cmd, invoke, wait_for
from jobfiles import write_jobs

from dblockrun.running import spawner
from dblockrun.store import Store

#: The daemon's secrets: its database URL (another one than it uses: still
#: a secret) and the variable behind a notification URL.
DB_SECRET = "postgresql://sec_pwuser:S3cretDbPw@127.0.0.1:1/ops"
SLACK_SECRET = "json://hooks.internal/T0K3N-SlackSecret"


def finished_runs(db: TestDb, job: str) -> list[Any]:
    """``job``'s ended runs, each with its stored output, oldest first."""
    with Store(db.url, db.prefix) as store:
        ended = [r for r in store.history(job, 100) if r.result != "running"]
        return [store.run(r.id) for r in reversed(ended)]


def first_run(db: TestDb, job: str, timeout: float = 30) -> Any:
    return wait_for(lambda: (finished_runs(db, job) or [None])[0], timeout,
                    what=f"a run of {job}")


def env_names(output: str) -> dict[str, str]:
    """The variables ``env`` printed (none of these values has a newline)."""
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def daemon_env(**extra: str) -> dict[str, str]:
    return clean_env(DBLOCKRUN_DB=DB_SECRET, DBLOCKRUN_DB_FILE="/run/secrets/db-url",
                     SLACK_URL=SLACK_SECRET, KEEP_ME="kept", LC_PROBE="lc", **extra)


def secrets_absent(*texts: str) -> None:
    for text in texts:
        for secret in ("S3cretDbPw", "SlackSecret", "/run/secrets/db-url"):
            assert secret not in text, (secret, text[-2000:])


# -- 1. the environment of a command ------------------------------------------------


def test_commands_never_get_the_daemons_secrets(
        sqlite_db: TestDb, system_user: str, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    """Each kind of job prints its environment (to the stored output): none
    has the database URL or a notification URL's variable; each has what its
    env-inherit says; the user: job a login environment."""
    pw = pwd.getpwnam(system_user)
    jobs = write_jobs(tmp_path / "jobs.yaml", f"""\
defaults:
  command: env
  rate: 1h
jobs:
  plain:
    env: {{OWN: mine}}
    notify: {{urls: [{{env: SLACK_URL}}], on: [failure]}}
  named:
    env-inherit: [KEEP_ME, LC_*, DBLOCKRUN_*]
  nothing:
    env-inherit: none
  as-user:
    user: {system_user}
    env: {{OWN: theirs}}
  as-user-all:
    user: {system_user}
    env-inherit: all
""")
    d = sqlite_fleet.start(jobs, env=daemon_env())
    try:
        runs = {name: first_run(sqlite_db, name)
                for name in ("plain", "named", "nothing", "as-user", "as-user-all")}
    finally:
        assert d.stop() == 0
    for name, run in runs.items():
        assert run.result == "ok", (name, run.output)
    env = {name: env_names(run.output) for name, run in runs.items()}
    for name, got in env.items():
        assert not {"DBLOCKRUN_DB", "DBLOCKRUN_DB_FILE", "SLACK_URL"} & set(got), (name, got)
        assert got["DBLOCKRUN_JOB"] == name
        assert got["DBLOCKRUN_RUN_ID"] == str(runs[name].id)
    secrets_absent(d.text(), *(run.output for run in runs.values()))
    # The daemon's environment, less its secrets, with the job's env on top.
    assert env["plain"]["KEEP_ME"] == "kept" and env["plain"]["OWN"] == "mine"
    assert env["plain"]["PATH"] == os.environ["PATH"]
    # Only the names listed (a prefix for LC_*; DBLOCKRUN_* never yields the database's).
    dblockrun_vars = {"DBLOCKRUN_JOB", "DBLOCKRUN_RUN_ID", "DBLOCKRUN_FENCING_TOKEN",
                      "DBLOCKRUN_HOST_ID"}
    assert set(env["named"]) - {"PWD"} == {"KEEP_ME", "LC_PROBE", "PATH"} | dblockrun_vars
    assert env["named"]["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert set(env["nothing"]) - {"PWD"} == {"PATH"} | dblockrun_vars
    # user: a login environment and its own env, nothing of the daemon's.
    assert set(env["as-user"]) - {"PWD"} == (
        {"HOME", "USER", "LOGNAME", "SHELL", "PATH", "OWN"} | dblockrun_vars), env["as-user"]
    assert (env["as-user"]["HOME"], env["as-user"]["USER"], env["as-user"]["SHELL"],
            env["as-user"]["OWN"]) == (pw.pw_dir, system_user, pw.pw_shell, "theirs")
    # ... unless it asks for the daemon's: still its own login variables.
    assert env["as-user-all"]["KEEP_ME"] == "kept"
    assert env["as-user-all"]["HOME"] == pw.pw_dir
    assert env["as-user-all"]["USER"] == env["as-user-all"]["LOGNAME"] == system_user


def test_a_secret_named_by_a_reload_leaves_the_next_commands_environment() -> None:
    """The daemon filters its environment once per env-inherit (not at
    every start); a variable a reload names as a notification URL's is
    withheld from the next command on, and a command's changes to its own
    environment reach no other."""
    from types import MappingProxyType

    from dblockrun import withheld
    from dblockrun.jobs import Job
    from dblockrun.running.runjob import base_env

    name = f"TEST_RELOADED_SECRET_{os.getpid()}"
    environ = MappingProxyType({"PATH": "/bin", name: "hook-url", "KEEP_ME": "kept"})
    job = Job(name="j", rate=60.0, command="env")
    first = base_env(job, environ)
    assert first[name] == "hook-url" and first["KEEP_ME"] == "kept"
    first["KEEP_ME"] = "changed by one run"
    assert base_env(job, environ)["KEEP_ME"] == "kept"
    withheld.add(name)  # a reload's `notify: {urls: [{env: NAME}]}`
    after = base_env(job, environ)
    assert name not in after and after["KEEP_ME"] == "kept"


def test_env_inherit_is_checked_at_load(tmp_path: Path) -> None:
    cases = [
        ("env-inherit: some", "must be all, none or a list of variable names, got a string"),
        ("env-inherit: [KEEP, 'A B']", "each name must be a variable name"),
        ("env-inherit: [DBLOCKRUN_DB]", "DBLOCKRUN_DB would pass on the daemon's database URL"),
        ("env-inherit: ['*']", "write env-inherit: all"),
    ]
    for line, why in cases:
        jobs = write_jobs(tmp_path / "jobs.yaml",
                          f"jobs:\n  j:\n    rate: 1h\n    command: 'true'\n    {line}\n")
        proc = invoke("validate", str(jobs))
        assert proc.returncode == 2, proc.stdout
        assert proc.stderr.startswith(f"dblockrun: {jobs}:5: job 'j': env-inherit: "), proc.stderr
        assert why in proc.stderr
    ok = write_jobs(tmp_path / "ok.yaml", "defaults:\n  env-inherit: [LANG, LC_*]\n"
                    "jobs:\n  j: {rate: 1h, command: 'true'}\n")
    assert invoke("validate", str(ok)).returncode == 0


def run_cli(db: TestDb, *args: str) -> Ran:
    """In-process (helpers.invoke): what the command prints is tested, not
    its process (0.15-0.5 CPU-s of imports each)."""
    return invoke("--db", db.url, "--table-prefix", db.prefix, *args)


def test_history_output_hides_passwords(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    """A password a command printed is hidden as it is read, before its tail
    is stored (issue 32 item 7): `history --output` shows it as the daemon's
    log does (``user:***@``), --raw too."""
    jobs = write_jobs(tmp_path / "jobs.yaml", """\
jobs:
  leaky:
    rate: 1h
    command: echo connecting to mysql://app:Hunter2Pw@db.internal/app now
""")
    d = sqlite_fleet.start(jobs)
    try:
        run = first_run(sqlite_db, "leaky")
    finally:
        assert d.stop() == 0
    assert "Hunter2Pw" not in run.output  # redacted before it was stored
    for raw in ([], ["--raw"]):
        shown = run_cli(sqlite_db, "history", "--output", str(run.id), *raw)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == "connecting to mysql://app:***@db.internal/app now\n"
    assert "Hunter2Pw" not in d.text()


# -- 2. requests too large for the spawn service --------------------------------------


def test_oversize_jobs_are_refused_at_load(tmp_path: Path) -> None:
    """What the kernel could not execute, or more than a job may hand its
    command, is a load error naming the limit (nothing starts)."""
    # Items as long as a run's record holds (1,000 characters): 150 of them overflow one variable.
    items = ", ".join(f"i{i:03d}{'w' * 996}" for i in range(150))
    many = "".join(f"      V{i}: {'z' * 100_000}\n" for i in range(3))
    limit = "at most 131,071 (Linux's limit for one argument or variable)"
    cases = [
        (f"command: echo {'x' * 1_100_000}", 4,
         f"command: an argument is 1,100,006 bytes: {limit}"),
        (f"command: 'true'\n    env:\n      BIG: {'y' * 200_000}", 5,
         f"env.BIG: the variable is 200,005 bytes: {limit}"),
        (f"command: 'true'\n    env:\n{many}".rstrip("\n"), 4,
         "command: the command and env: are 300,017 bytes together: at most 262,144"),
        (f"command: 'true'\n    batch: 150\n    items: [{items}]", 5,
         "batch: 150 of the items make a DBLOCKRUN_ITEMS of 150,166 bytes: at most 131,071 "
         "(Linux's limit for one variable); lower batch"),
    ]
    for body, line, why in cases:
        jobs = write_jobs(tmp_path / "jobs.yaml", f"jobs:\n  j:\n    rate: 1h\n    {body}\n")
        proc = invoke("validate", str(jobs))
        assert proc.returncode == 2, proc.stdout
        assert proc.stderr == f"dblockrun: {jobs}:{line}: job 'j': {why}\n"
    # Up to the limits: fine.
    ok = write_jobs(tmp_path / "ok.yaml", f"jobs:\n  j:\n    rate: 1h\n    command: echo "
                    f"{'x' * 100_000}\n    batch: 2\n    items: [{'a' * 1_000}, {'b' * 1_000}]\n")
    assert invoke("validate", str(ok)).returncode == 0


def test_a_request_too_large_fails_only_its_own_run(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    """A 1.2 MB fan-out batch and a command whose inherited environment makes
    its request 1.1 MB each fail alone, with the reason; the spawn service
    lives on: an unrelated `sleep` keeps running, other jobs keep starting."""
    marker = tmp_path / "sleeping"
    small = write_jobs(tmp_path / "jobs.yaml", f"""\
defaults:
  env-inherit: none
jobs:
  unrelated:
    rate: 1h
    command: touch {marker}; exec sleep 100
  tick:
    rate: 1s
    command: 'true'
""")
    # Eleven variables of 100 KB: each fine, together over 1 MiB.
    bulky = {f"BULK_{i}": "b" * 100_000 for i in range(11)}
    # A lease long enough that a loaded machine does not fence the sleep.
    d = sqlite_fleet.start(small, heartbeat="1s", lease="10s", grace="2s",
                           env=daemon_env(**bulky))
    try:
        wait_for(marker.exists, 30, what="the unrelated sleep to start")
        (sleeping,) = [r for r in finished_or_running(sqlite_db, "unrelated")]
        (small.parent / "big.yaml").write_text(small.read_text() + """\
  fan:
    rate: 1h
    batch: 200
    items-command: "for i in $(seq 200); do printf \\"%04d%0996d\\\\n\\" $i 0; done"
    command: 'true'
  bulky:
    rate: 1h
    env-inherit: all
    command: 'true'
""")
        os.replace(small.parent / "big.yaml", small)
        d.send(signal.SIGHUP)  # reload
        fan = first_run(sqlite_db, "fan")
        bulky_run = first_run(sqlite_db, "bulky")
        ticks = len(finished_runs(sqlite_db, "tick"))
        wait_for(lambda: len(finished_runs(sqlite_db, "tick")) >= ticks + 2, 30,
                 what="tick to go on running")
        still = finished_or_running(sqlite_db, "unrelated")
        log = d.text()  # before the stop, which stops the sleep
    finally:
        assert d.stop() == 0
    assert fan.result == "failed", fan.output
    assert ("cannot start command: [Errno 7] variable DBLOCKRUN_ITEMS is 200," in fan.output
            and "at most 131,071 (Linux's limit for one argument or variable)" in fan.output)
    assert bulky_run.result == "failed", bulky_run.output
    assert "at most 1,048,576 (the spawn service's limit)" in bulky_run.output
    assert [(r.id, r.result) for r in still] == [(sleeping.id, "running")], (
        still[0].output, [line for line in log.splitlines() if "unrelated" in line])
    assert "spawn service died" not in log and "killed" not in log, log[-3000:]
    secrets_absent(log, fan.output, bulky_run.output)


def finished_or_running(db: TestDb, job: str) -> list[Any]:
    with Store(db.url, db.prefix) as store:
        return list(reversed(store.history(job, 100)))


class Service:
    """A spawn service (`python -I -S spawner.py FD`) on a socket of the test's own."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self.proc = track(subprocess.Popen(
            [sys.executable, "-I", "-S", spawner.__file__, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL))
        theirs.close()
        self.sock = ours
        self.sock.settimeout(10)

    def send(self, data: bytes, fds: Sequence[int] = ()) -> None:
        socket.send_fds(self.sock, [data], list(fds))

    def request(self, rid: int, argv: list[str]) -> bytes:
        return json.dumps({"id": rid, "argv": argv, "env": {"PATH": os.environ["PATH"]},
                           "cwd": None, "ids": None, "fence": None, "grace": 1}).encode()

    def reply(self) -> dict[str, Any]:
        return json.loads(self.sock.recv(65536))  # type: ignore[no-any-return]


def test_nothing_a_request_carries_ends_the_spawn_service(tmp_path: Path) -> None:
    """Requests cut short, over the limit, malformed, with the wrong
    descriptors: each is answered as failed (or dropped, without an id);
    the command the service already runs goes on, and the next starts."""
    service = Service()
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        service.send(service.request(1, ["sleep", "100"]), [out, out])
        sleeping = service.reply()
        assert set(sleeping) == {"id", "pid"} and sleeping["id"] == 1
        good = service.request(2, ["true"])
        hostile: list[tuple[bytes, list[int], int | None]] = [
            (good[: len(good) // 2], [out, out], errno.EINVAL),  # cut short
            (good[:-1] + b", " + b'"pad": "' + b"x" * (1_100_000) + b'"}', [out, out],
             errno.E2BIG),  # over 1 MiB
            (b'{"id": 2, "argv": "true"}', [out, out], errno.EINVAL),  # wrong types
            (good.replace(b'"grace": 1', b'"grace": NaN'), [out, out], errno.EINVAL),
            (good.replace(b'"ids": null', b'"ids": [0, 0, ["x"]]'), [out, out], errno.EINVAL),
            (good.replace(b'"cwd": null', b'"cwd": "/tmp\\u0000x"'), [out, out], errno.EINVAL),
            (good.replace(b'"argv": ["true"]', b'"argv": []'), [out, out], errno.EINVAL),
            (good, [], errno.EINVAL),  # without its descriptors
            (good.replace(b'"fence": null', b'"fence": 5'), [out, out], errno.EINVAL),
            (b"\xff\xfe not json", [out], None),  # no id: dropped
            (b"[" * 100_000, [], None),
        ]
        for n, (data, fds, expect) in enumerate(hostile, start=10):
            data = data.replace(b'{"id": 2,', b'{"id": %d,' % n, 1)
            service.send(data, fds)
            if expect is not None:
                assert service.reply() == {"id": n, "errno": expect, "step": "request"}, data[:80]
            assert service.proc.poll() is None
        service.send(good, [out, out])
        assert service.reply()["id"] == 2  # started
        assert service.reply() == {"id": 2, "status": 0}
        os.killpg(sleeping["pid"], 0)  # the sleep still runs
        assert service.proc.poll() is None
    finally:
        os.close(out)
        service.sock.close()  # the daemon gone: the service stops the sleep and exits
        assert service.proc.wait(10) == 0


# -- 4. control characters on terminals and in text logs -----------------------------

#: What a hostile command prints: a window title, a screen clear, a fake
#: hyperlink, a line erased and forged (and a tab, kept).
ANSI = ("\x1b]0;pwned\x07\x1b[2J\x1b]8;;http://evil.example/\x1b\\click me\x1b]8;;\x1b\\"
        "\r\x1b[2Kforged line\nsecond\tline\n")
ANSI_SHOWN = (r"\x1b]0;pwned\x07\x1b[2J\x1b]8;;http://evil.example/\x1b\click me"
              r"\x1b]8;;\x1b\\r\x1b[2Kforged line" "\nsecond\tline\n")
#: An operator name (from SUDO_USER) and a reason that try the same.
EVIL_USER = "ev\x1b[2Jil"
FORGED = "2026-01-01T00:00:00+0000 INFO job tick: run 1 ok"
EVIL_REASON = f"stuck\x1b]0;pwned\x07\n{FORGED}"


def raw_free(text: str) -> None:
    """No control character but newlines and tabs reached ``text``."""
    assert all(c.isprintable() or c in "\n\t" for c in text), repr(text[-2000:])


def test_control_characters_are_escaped_everywhere(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    hostile = tmp_path / "hostile.txt"
    hostile.write_text(ANSI)
    marker = tmp_path / "sleeping"
    jobs = write_jobs(tmp_path / "jobs.yaml", f"""\
jobs:
  hostile: {{rate: 1h, command: cat {hostile}}}
  slow: {{rate: 1h, command: touch {marker}; exec sleep 100}}
""")
    evil = clean_env(SUDO_USER=EVIL_USER)
    d = sqlite_fleet.start(jobs)
    try:
        run = first_run(sqlite_db, "hostile")
        wait_for(marker.exists, 30, what="the slow job to start")
        kill = invoke("--db", sqlite_db.url, "--table-prefix", sqlite_db.prefix, "kill", "slow",
                      "--reason", EVIL_REASON, env=evil)
        killed = first_run(sqlite_db, "slow")
        log = d.text()
    finally:
        assert d.stop() == 0
    assert run.output == ANSI and killed.result == "killed"  # stored as written
    # history --output: escaped, lines kept; --raw: as written.
    shown = run_cli(sqlite_db, "history", "--output", str(run.id))
    assert (shown.returncode, shown.stdout) == (0, ANSI_SHOWN)
    raw = subprocess.run([*dblockrun_cmd(), "--db", sqlite_db.url, "--table-prefix",
                          sqlite_db.prefix, "history", "--output", str(run.id), "--raw"],
                         capture_output=True, env=clean_env(), cwd=REPO, timeout=60)
    assert (raw.returncode, raw.stdout) == (0, ANSI.encode())
    # The daemon's text log: the output lines and the kill's reason escaped, one line each.
    raw_free(log)
    assert r"[hostile] \x1b]0;pwned\x07\x1b[2J" in log
    assert "killed by ev\\x1b[2Jil@" in log and f"stuck\\x1b]0;pwned\\x07\\n{FORGED}" in log
    assert not any(line.startswith(FORGED) for line in log.splitlines())
    assert kill.returncode == 0, kill.stderr
    raw_free(kill.stdout + kill.stderr)
    # pause, then exec -v and resume print the pauser and the reason.
    paused = run_cli_env(sqlite_db, evil, "pause", "--reason", EVIL_REASON)
    assert paused.returncode == 0, paused.stderr
    busy = cli("--db", sqlite_db.url, "--table-prefix", sqlite_db.prefix,  # exec: a process
               "exec", "-v", "-n", "ex", "--", "true")
    assert busy.returncode == 0 and busy.stderr.count("\n") == 1, busy.stderr
    assert "paused (by ev\\x1b[2Jil@" in busy.stderr
    assert f"stuck\\x1b]0;pwned\\x07\\n{FORGED}); not running" in busy.stderr
    resumed = run_cli(sqlite_db, "resume")
    assert resumed.stdout.count("\n") == 1 and "(paused by ev\\x1b[2Jil@" in resumed.stdout
    for proc in (busy, resumed):
        raw_free(proc.stdout + proc.stderr)
    # validate: a job name with escape characters and NUL.
    bad = write_jobs(tmp_path / "bad.yaml",
                     'jobs:\n  "bad\\e[2Jname\\0x":\n    rate: 1h\n    command: "true"\n')
    proc = invoke("validate", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"dblockrun: {bad}:2: job 'bad\\x1b[2Jname\\x00x': ")
    raw_free(proc.stderr)


def run_cli_env(db: TestDb, env: dict[str, str], *args: str) -> Ran:
    return invoke("--db", db.url, "--table-prefix", db.prefix, *args, env=env)
