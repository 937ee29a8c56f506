"""The packages: the sdist and wheel build and pass ``twine check``, and the
wheel, installed into a clean virtual environment with no checkout on its
path, gives a working ``dblockrun`` (its version, ``validate``, a daemon on
SQLite running a job).

The module builds once (about 30 s, most of it pip installing the
dependencies into the new environment); ``pytest -m package`` picks it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import Process, daemon_argv
from helpers import LOW_PRIORITY, REPO, clean_env, wait_for

from dblockrun import __version__

#: Builds from the checkout (its build/ and egg-info) as the image does: one
#: xdist worker runs the builds, one after the other.
pytestmark = [pytest.mark.package, pytest.mark.xdist_group("builds")]


@dataclass(frozen=True)
class Installed:
    """The built packages and the environment the wheel is installed in."""

    sdist: Path
    wheel: Path
    venv: Path
    home: Path  # a folder outside the checkout: the working directory of every command
    build_log: str  # what `python -m build` said

    def env(self) -> dict[str, str]:
        return outside(PATH=f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                       HOME=str(self.home), XDG_STATE_HOME=str(self.home / "state"))

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The installed console script ``dblockrun`` with ``args``."""
        return subprocess.run([str(self.venv / "bin" / "dblockrun"), *args], cwd=self.home,
                              env=self.env(), capture_output=True, text=True, timeout=timeout)


def outside(**extra: str) -> dict[str, str]:
    """The environment of a process that must not see the checkout: without
    the PYTHONPATH conftest.py sets for the other tests' processes."""
    env = clean_env(**extra)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


def _check(args: list[str], cwd: Path, timeout: float) -> str:
    """Run ``args``; what it printed (stdout, then stderr)."""
    proc = subprocess.run([*LOW_PRIORITY, *args], cwd=cwd, env=outside(), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return f"{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    # Not tmp_path_factory: pytest keeps the last three base folders per user,
    # so a concurrent test session could remove this one under the module.
    root = Path(tempfile.mkdtemp(prefix="dblockrun-package-"))
    dist = root / "dist"
    # --no-isolation: the build uses this environment's setuptools, so it
    # needs no network; the sdist is built first and the wheel from it.
    build_log = _check([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist),
                        str(REPO)], cwd=root, timeout=300)
    sdist = dist / f"dblockrun-{__version__}.tar.gz"
    wheel = dist / f"dblockrun-{__version__}-py3-none-any.whl"
    assert sorted(dist.iterdir()) == sorted([sdist, wheel])
    _check([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
           cwd=root, timeout=120)

    venv = root / "venv"
    home = root / "home"
    home.mkdir()
    _check([sys.executable, "-m", "venv", str(venv)], cwd=root, timeout=120)
    _check([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
            "--disable-pip-version-check", str(wheel)], cwd=root, timeout=600)
    yield Installed(sdist=sdist, wheel=wheel, venv=venv, home=home, build_log=build_log)
    shutil.rmtree(root, ignore_errors=True)


def test_the_wheel_and_sdist_carry_the_one_version(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(f"dblockrun-{__version__}.dist-info/METADATA").decode()
        entry_points = wheel.read(f"dblockrun-{__version__}.dist-info/entry_points.txt").decode()
    assert f"\nVersion: {__version__}\n" in metadata
    assert "dblockrun = dblockrun.__main__:main" in entry_points
    assert "dblockrun/py.typed" in names
    assert not [n for n in names if n.startswith(("tests/", "bench/"))]
    with tarfile.open(installed.sdist) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    # The sdist carries what a packager needs besides the code.
    assert {"README.md", "CHANGELOG.md", "man/dblockrun.1", "man/dblockrun-jobs.5",
            "pyproject.toml"} <= members


def test_the_licence_is_an_spdx_expression_with_its_file(installed: Installed) -> None:
    """Issue 36 item 12: ``license = "MIT"`` and ``license-files`` (PEP 639),
    not the TOML table setuptools deprecates (builds refused from
    2027-02-18), nor a licence classifier beside the expression."""
    with zipfile.ZipFile(installed.wheel) as wheel:
        metadata = wheel.read(f"dblockrun-{__version__}.dist-info/METADATA").decode()
        licence = wheel.read(f"dblockrun-{__version__}.dist-info/licenses/LICENSE").decode()
    assert "\nLicense-Expression: MIT\n" in metadata
    assert "\nLicense-File: LICENSE\n" in metadata
    assert "Classifier: License ::" not in metadata
    assert licence.startswith("MIT License\n")
    with tarfile.open(installed.sdist) as sdist:
        assert f"dblockrun-{__version__}/LICENSE" in sdist.getnames()
    assert "deprecated" not in installed.build_log.lower(), installed.build_log


def test_installed_command_is_the_wheel_not_the_checkout(installed: Installed) -> None:
    version = installed.run("--version")
    assert (version.returncode, version.stdout) == (0, f"dblockrun, version {__version__}\n")
    where = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c",
         "import dblockrun, sys; print(dblockrun.__file__); print(sys.path)"],
        cwd=installed.home, env=installed.env(), capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    module, path = where.stdout.splitlines()
    assert Path(module).is_relative_to(installed.venv), module
    assert str(REPO) not in path


def test_installed_command_validates_the_example(installed: Installed) -> None:
    jobs = installed.home / "jobs.yaml"
    shutil.copy(REPO / "examples" / "jobs.yaml", jobs)
    proc = installed.run("validate", str(jobs))
    assert proc.returncode == 0, proc.stderr
    bad = installed.home / "bad.yaml"
    bad.write_text("jobs:\n  x:\n    cron: '* * * * *'\n    comand: echo\n")
    proc = installed.run("validate", str(bad))
    assert proc.returncode == 2
    assert "bad.yaml:4" in proc.stderr and "comand" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_installed_daemon_runs_a_job_on_sqlite(installed: Installed) -> None:
    marker = installed.home / "ran"
    jobs = installed.home / "daemon.yaml"
    jobs.write_text(f"""\
jobs:
  hello:
    cron: "* * * * * *"
    command: echo "slot $DBLOCKRUN_SLOT" >> {marker}
""")
    db = f"sqlite:///{installed.home / 'state.db'}"
    daemon = Process(daemon_argv(["--db", db], jobs,
                                 program=[str(installed.venv / "bin" / "dblockrun")]),
                     installed.home / "daemon.log", cwd=installed.home, env=installed.env(),
                     stdout_to_log=True)
    try:
        wait_for(lambda: marker.exists() and marker.read_text().startswith("slot "), 60,
                 what="the installed daemon to run the job")
    finally:
        code = daemon.stop(60)
    assert code == 0, daemon.text()
    history = installed.run("--db", db, "history", "--json", "hello")
    assert history.returncode == 0, history.stderr
    runs = json.loads(history.stdout)["runs"]
    assert runs and {run["result"] for run in runs if run["finished"]} <= {"ok"}
    assert any(run["result"] == "ok" for run in runs)
