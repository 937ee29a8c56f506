"""Secret files that are not what they should be (issue 25 item 5).

``{file: PATH}`` (a notification or ping URL) and ``--db-file`` (the
database URL) read the first line of a regular file, at most 64 KiB of it
(dblockrun/secretfile.py). A FIFO once froze a daemon's reload (no job ran,
SIGTERM was ignored) and ``validate``; ``/dev/zero`` or a large file without
a newline was read without bound. Real `dblockrun` processes, on SQLite:
nothing here depends on the database.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from harness import Fleet
from helpers import REPO, clean_env, dblockrun_cmd, wait_for

from dblockrun.secretfile import LIMIT, first_line

#: A process that would hang is stopped (and the test failed) after this.
PROMPTLY = 30.0


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "hook-url.fifo"
    os.mkfifo(path)
    return path


@pytest.fixture
def big(tmp_path: Path) -> Path:
    """8 MiB without a newline (the old code read it all, then called it no URL)."""
    path = tmp_path / "big"
    path.write_bytes(b"json://" + b"a" * (8 << 20))
    return path


def hostile(name: str, fifo: Path, big: Path) -> tuple[Path, str]:
    """The file, and what the message says of it."""
    return {"fifo": (fifo, "not a regular file (a named pipe)"),
            "zero": (Path("/dev/zero"), "not a regular file (a character device)"),
            "big": (big, "the first line is longer than 64 KiB")}[name]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*dblockrun_cmd(), *args], capture_output=True, text=True,
                          env=clean_env(), cwd=REPO, timeout=PROMPTLY)


def jobs_text(ping: str, ticks: Path = Path("/dev/null")) -> str:
    return ("jobs:\n"
            "  tick:\n"
            '    cron: "* * * * * *"\n'
            f"    command: echo x >> {ticks}\n"
            f"    ping: {ping}\n")


@pytest.mark.parametrize("name", ["fifo", "zero", "big"])
def test_validate_refuses_a_file_secret_that_is_not_a_plain_small_file(
        name: str, fifo: Path, big: Path, tmp_path: Path) -> None:
    path, why = hostile(name, fifo, big)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(jobs_text(f"{{file: {path}}}"))
    result = run("validate", str(jobs))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"dblockrun: {jobs}:5: job 'tick': ping: file {path}: {why}\n"


@pytest.mark.parametrize("name", ["fifo", "zero", "big"])
def test_db_file_refuses_a_file_that_is_not_a_plain_small_file(
        name: str, fifo: Path, big: Path, tmp_path: Path) -> None:
    path, why = hostile(name, fifo, big)
    expected = f"dblockrun: database file {path}: {why}\n"
    status = run("--db-file", str(path), "status")
    assert (status.returncode, status.stdout, status.stderr) == (2, "", expected)
    # exec's own fast start reads it too, and so does database-file: in a jobs file.
    exec_ = run("--db-file", str(path), "exec", "-n", "j", "--", "true")
    assert (exec_.returncode, exec_.stdout, exec_.stderr) == (2, "", expected)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"database-file: {path}\njobs: {{}}\n")
    from_jobs = run("-f", str(jobs), "status")
    assert (from_jobs.returncode, from_jobs.stderr) == (2, expected)


def test_the_first_line_is_read_up_to_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "url"
    url = "json://hooks.example.com/"
    path.write_bytes((url + "a" * (LIMIT - len(url))).encode() + b"\nsecond line")
    assert first_line(str(path)) == url + "a" * (LIMIT - len(url))
    path.write_bytes((url + "a" * (LIMIT - len(url))).encode())  # no newline: the whole file
    assert len(first_line(str(path))) == LIMIT
    path.write_bytes((url + "a" * (LIMIT + 1 - len(url))).encode())
    with pytest.raises(ValueError, match="longer than 64 KiB"):
        first_line(str(path))


@pytest.mark.parametrize("name", ["fifo", "zero"])
def test_a_reload_with_such_a_file_keeps_the_old_jobs_and_still_stops(
        name: str, fifo: Path, big: Path, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    path, why = hostile(name, fifo, big)
    ticks_file = tmp_path / "ticks"

    def ticks() -> int:
        return len(ticks_file.read_text().splitlines()) if ticks_file.exists() else 0

    d = sqlite_fleet.start(jobs_text("'https://hc.invalid/ping'", ticks_file), grace="2s")
    d.wait(lambda: ticks() >= 1, 20, what="a first run")
    d.jobs.write_text(jobs_text(f"{{file: {path}}}", ticks_file))
    d.send(signal.SIGHUP)
    wait_for(lambda: "reload failed" in d.text(), 10, what="the reload to fail")
    assert (f"reload failed, keeping the 1 jobs loaded before: {d.jobs}:5: job 'tick': "
            f"ping: file {path}: {why}") in d.text()
    ran = ticks()
    wait_for(lambda: ticks() >= ran + 2, 10, what="the old job still running")
    d.send(signal.SIGTERM)
    assert d.exited(15) == 0
    assert "stopped" in d.text()


# -- issue 36 item 16: the jobs file itself -----------------------------------------------


@pytest.mark.parametrize("name", ["fifo", "zero"])
def test_validate_refuses_a_jobs_file_that_is_not_a_regular_file(
        name: str, fifo: Path, big: Path) -> None:
    """A FIFO as the jobs file held ``validate`` until a writer came (a plain
    ``open()``); it is read like a secret file now: refused at once."""
    path, why = hostile(name, fifo, big)
    for args in (["validate", str(path)], ["next", str(path)]):
        result = run(*args)
        assert (result.returncode, result.stdout, result.stderr) == (
            2, "", f"dblockrun: {path}: {why}\n"), args


def test_a_jobs_file_over_the_limit_is_not_read(tmp_path: Path) -> None:
    from dblockrun.config.load import load_jobs
    from dblockrun.errors import ConfigError
    from dblockrun.secretfile import TEXT_LIMIT

    path = tmp_path / "jobs.yaml"
    with path.open("wb") as f:  # sparse: no 64 MiB written
        f.write(b"jobs: {}\n")
        f.truncate(TEXT_LIMIT + 1)
    with pytest.raises(ConfigError) as info:
        load_jobs(str(path))
    assert info.value.render() == f"{path}: larger than 64 MiB: not read"


def test_a_reload_of_a_jobs_file_swapped_for_a_fifo_keeps_the_old_jobs(
        tmp_path: Path, sqlite_fleet: Fleet) -> None:
    ticks_file = tmp_path / "ticks"

    def ticks() -> int:
        return len(ticks_file.read_text().splitlines()) if ticks_file.exists() else 0

    d = sqlite_fleet.start(jobs_text("'https://hc.invalid/ping'", ticks_file), grace="2s")
    d.wait(lambda: ticks() >= 1, 20, what="a first run")
    d.jobs.unlink()
    os.mkfifo(d.jobs)
    d.send(signal.SIGHUP)
    wait_for(lambda: "reload failed" in d.text(), 10, what="the reload to fail")
    assert (f"reload failed, keeping the 1 jobs loaded before: {d.jobs}: not a regular file "
            "(a named pipe)") in d.text()
    ran = ticks()
    wait_for(lambda: ticks() >= ran + 2, 10, what="the old job still running")
    d.send(signal.SIGTERM)
    assert d.exited(15) == 0
    assert "stopped" in d.text()
