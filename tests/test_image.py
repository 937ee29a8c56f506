"""The container image: the ``Containerfile`` builds with buildah, runs as
the non-root user ``dblockrun`` with tini as PID 1, and its daemon runs a job
against the test PostgreSQL; an orphan a job leaves behind is reaped, and the
image's ``HEALTHCHECK`` passes against the running daemon. The documented
dashboard command (``IMAGE web --listen ...``: the entrypoint is already
``dblockrun``) serves the Fleet page from inside the image.

Skipped, saying why, where it cannot run: not root, or no buildah or
debootstrap (``scripts/test`` installs them with apt). No registry needs to be
reachable: ``scripts/base-image`` makes the base image locally under its
public name once and it is kept between runs. The image is tagged with a hash
of what goes into it (the Containerfile and the files of the wheel), so a run
on an unchanged checkout reuses the last run's image; older test images are
removed. (buildah's ``--layers`` cache would save the apt step, but with vfs
storage every cached layer is a full copy: it made a build 4 times slower.)

``podman run`` cannot start containers on the CI machines, so the image runs
through ``buildah run`` (chroot isolation, the host's network) the way a
container runtime starts it: a new PID namespace (``unshare``), the image's
user (``setpriv``), then its ``ENTRYPOINT`` and a ``CMD``.

``pytest -m image`` picks this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerDatabases, selected_backends
from harness import children, comm, descendants, state, track
from helpers import (
    LOW_PRIORITY,
    REPO,
    TestDb,
    clean_env,
    free_port,
    http_get,
    new_prefix,
    wait_for,
)

from dblockrun import __version__

#: Builds from the checkout (a wheel: its build/ and egg-info) as the package
#: test does: one xdist worker runs the builds, one after the other.
pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.xdist_group("builds")]

REPOSITORY = "localhost/dblockrun"
BUILDAH = ["buildah", "--storage-driver", "vfs"]
#: What the image is made of: the Containerfile and what goes into the wheel.
INPUTS = ("Containerfile", "pyproject.toml", "README.md", "MANIFEST.in", "dblockrun")


def unavailable() -> str | None:
    """Why the image cannot be built here, or None."""
    if os.geteuid() != 0:
        return "building the image needs root (buildah with vfs storage and chroot isolation)"
    for tool in ("buildah", "debootstrap", "unshare", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/test installs it with apt as root)"
    return None


def outside() -> dict[str, str]:
    """An environment without the checkout on PYTHONPATH (conftest.py sets it)."""
    env = clean_env()
    env.pop("PYTHONPATH", None)
    return env


def check(args: list[str], cwd: Path, timeout: float) -> str:
    proc = subprocess.run([*LOW_PRIORITY, *args], cwd=cwd, env=outside(), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr}"
    return proc.stdout


def inputs_hash() -> str:
    digest = hashlib.sha256()
    for name in INPUTS:
        path = REPO / name
        for file in sorted([path] if path.is_file() else path.rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts:
                digest.update(str(file.relative_to(REPO)).encode() + b"\0")
                digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def kept_images() -> list[str]:
    """The names of the test images kept from earlier runs."""
    listed = subprocess.run([*BUILDAH, "images", "--format", "{{.Name}}:{{.Tag}}"],
                            capture_output=True, text=True, timeout=120).stdout.split()
    return [name for name in listed if name.startswith(f"{REPOSITORY}:test-")]


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[str, dict[str, Any]]]:
    """The image built from the repository's Containerfile: its name and configuration."""
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    name = f"{REPOSITORY}:test-{inputs_hash()}"
    context = Path(tempfile.mkdtemp(prefix="dblockrun-image-"))
    try:
        if name not in kept_images():
            check([str(REPO / "scripts" / "base-image")], cwd=context, timeout=900)
            # The wheels of dblockrun and its dependencies, built on the host:
            # pip in a RUN of the build has no network.
            check([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation",
                   "--wheel-dir", str(context / "wheelhouse"), f"{REPO}[web]"], cwd=context,
                  timeout=600)
            check([*BUILDAH, "bud", "--format", "docker", "--isolation", "chroot",
                   "--pull=never", "--build-arg", f"VERSION={__version__}", "-t", name,
                   "-f", str(REPO / "Containerfile"), str(context)], cwd=context, timeout=1800)
            for old in kept_images():
                if old != name:
                    subprocess.run([*BUILDAH, "rmi", old], capture_output=True, timeout=300)
        inspected = json.loads(check([*BUILDAH, "inspect", "--type", "image", name],
                                     cwd=context, timeout=60))
        yield name, inspected
    finally:
        shutil.rmtree(context, ignore_errors=True)


def test_the_image_runs_as_dblockrun_under_tini_with_a_healthcheck(
        image: tuple[str, dict[str, Any]]) -> None:
    config = image[1]["Docker"]["config"]
    assert config["User"] == "dblockrun"
    assert config["Entrypoint"][:2] == ["tini", "--"]
    assert config["Cmd"][0] == "daemon" and "--metrics" in config["Cmd"]
    assert "/healthz" in " ".join(config["Healthcheck"]["Test"])
    labels = image[1]["OCIv1"]["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.title"] == "dblockrun"
    assert {"org.opencontainers.image.description",
            "org.opencontainers.image.licenses"} <= set(labels)


# --- running it ---------------------------------------------------------------------------

JOBS = """\
jobs:
  hello:
    cron: "* * * * * *"
    command: echo "hello as $(id -un)"
  orphan:
    rate: 1h
    # The sleep, in a session of its own, outlives the shell that started it
    # and is re-parented to PID 1. The shell waits until the sleep's session
    # is made (its pid file), so the end of the run cannot stop it first.
    command: |
      setsid sh -c 'echo $$ > /tmp/orphan.pid; exec sleep 4' > /dev/null 2>&1 &
      until [ -s /tmp/orphan.pid ]; do sleep 0.1; done
      echo "left sleep $(cat /tmp/orphan.pid) behind"
"""










def kill_all(run: subprocess.Popen[str]) -> None:
    """SIGKILL a container's run and everything under it (a test that failed)."""
    for pid in [*descendants(run.pid), run.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def namespace_pid(pid: int) -> int:
    """``pid``'s number in its own (innermost) PID namespace."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^NSpid:\s+(.*)$", status, re.M)
    assert match is not None
    return int(match.group(1).split()[-1])


@pytest.fixture
def postgres(request: pytest.FixtureRequest, server_databases: ServerDatabases) -> TestDb:
    if "postgresql" not in selected_backends(request.config):
        pytest.skip("postgresql is not among the selected backends")
    return TestDb("postgresql", server_databases.url("postgresql"), new_prefix())


def test_the_images_daemon_runs_a_job_on_postgresql_and_tini_reaps_orphans(
        image: tuple[str, dict[str, Any]], postgres: TestDb, tmp_path: Path) -> None:
    name, inspected = image
    config = inspected["Docker"]["config"]
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "jobs.yaml").write_text(JOBS)
    port = free_port()
    container = check([*BUILDAH, "from", "--pull=never", name], cwd=tmp_path, timeout=300)
    container = container.strip().splitlines()[-1]
    user = config["User"]
    # The image's entrypoint and command, on a port of this test's own.
    command = [*config["Entrypoint"], "daemon", "--metrics", f"127.0.0.1:{port}",
               "/etc/dblockrun/jobs.yaml"]
    run = track(subprocess.Popen(
        [*BUILDAH, "run", "--isolation", "chroot", "--user", "root", "--cap-add",
         "CAP_SYS_ADMIN", "-v", f"{tmp_path / 'etc'}:/etc/dblockrun:ro",
         "-e", f"DBLOCKRUN_DB={postgres.url}", "-e", f"DBLOCKRUN_TABLE_PREFIX={postgres.prefix}",
         container, "--", "unshare", "--pid", "--fork", "--mount-proc",
         "setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *command],
        cwd=tmp_path, env=outside(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True))
    tini = 0
    try:
        tini = wait_for(lambda: next((p for p in descendants(run.pid) if comm(p) == "tini"),
                                     None), 120, what="tini to start in the container")
        assert namespace_pid(tini) == 1  # tini is the container's PID 1

        # The orphan: a child of tini once its shell has exited ...
        orphan = wait_for(lambda: next((p for p in children(tini) if comm(p) == "sleep"),
                                       None), 120, what="the orphaned sleep under tini")
        # ... and gone, not a zombie, once it has ended.
        wait_for(lambda: state(orphan) is None, 60, what="tini to reap the orphan")

        def healthz() -> tuple[int, str] | None:
            answer = http_get(port, "/healthz")
            return answer if answer[0] else None

        assert wait_for(healthz, 60, what="/healthz") == (200, "ok\n")
        # The image's own HEALTHCHECK command, inside the container (the
        # host's network: it reaches the daemon's /healthz on the port above).
        probe = [part.replace("9464", str(port)) for part in config["Healthcheck"]["Test"][1:]]
        check([*BUILDAH, "run", "--isolation", "chroot", container, "--", *probe],
              cwd=tmp_path, timeout=120)

        def history() -> list[dict[str, Any]] | None:
            proc = subprocess.run(
                [sys.executable, "-m", "dblockrun", "--db", postgres.url, "--table-prefix",
                 postgres.prefix, "history", "--json", "hello"],
                env=clean_env(), capture_output=True, text=True, timeout=60)
            runs = [r for r in json.loads(proc.stdout)["runs"] if r["result"] == "ok"] \
                if proc.returncode == 0 else []
            return runs or None

        ran = wait_for(history, 120, interval=0.5, what="a run of hello recorded ok")
        output = subprocess.run(
            [sys.executable, "-m", "dblockrun", "--db", postgres.url, "--table-prefix",
             postgres.prefix, "history", "--output", str(ran[0]["id"])],
            env=clean_env(), capture_output=True, text=True, timeout=60)
        assert output.stdout == "hello as dblockrun\n"

        # A runtime's stop: SIGTERM to PID 1, which tini passes to the daemon.
        os.kill(tini, signal.SIGTERM)
        log, _ = run.communicate(timeout=120)
        assert "starting: 2 jobs" in log, log
        assert "Traceback" not in log, log
    finally:
        if run.poll() is None:
            kill_all(run)
            log, _ = run.communicate(timeout=60)
            print(log)  # shown by pytest when the test failed
        subprocess.run([*BUILDAH, "rm", container], capture_output=True, timeout=300)


def test_the_images_dashboard_answers_as_documented(
        image: tuple[str, dict[str, Any]], postgres: TestDb, tmp_path: Path) -> None:
    name, inspected = image
    config = inspected["Docker"]["config"]
    subprocess.run([sys.executable, "-m", "dblockrun", "--db", postgres.url, "--table-prefix",
                    postgres.prefix, "disable", "nightly", "--create", "--reason", "from the host"],
                   env=clean_env(), capture_output=True, text=True, timeout=60, check=True)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "jobs.yaml").write_text(
        "jobs:\n  nightly:\n    cron: '0 3 * * *'\n    command: echo nightly\n")
    port = free_port()
    container = check([*BUILDAH, "from", "--pull=never", name], cwd=tmp_path, timeout=300)
    container = container.strip().splitlines()[-1]
    user = config["User"]
    # docs/container.md: `docker run ... -v /etc/dblockrun:/etc/dblockrun:ro
    # IMAGE web -f /etc/dblockrun/jobs.yaml --listen 0.0.0.0:8080`, here on
    # 127.0.0.1 and a port of this test's own (the host's network).
    command = [*config["Entrypoint"], "web", "-f", "/etc/dblockrun/jobs.yaml", "--listen",
               f"127.0.0.1:{port}"]
    run = track(subprocess.Popen(
        [*BUILDAH, "run", "--isolation", "chroot", "--user", "root", "--cap-add",
         "CAP_SYS_ADMIN", "-v", f"{tmp_path / 'etc'}:/etc/dblockrun:ro",
         "-e", f"DBLOCKRUN_DB={postgres.url}",
         "-e", f"DBLOCKRUN_TABLE_PREFIX={postgres.prefix}",
         container, "--", "unshare", "--pid", "--fork", "--mount-proc",
         "setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *command],
        cwd=tmp_path, env=outside(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True))
    try:
        def fleet() -> tuple[int, str] | None:
            if run.poll() is not None:
                raise AssertionError(f"dblockrun web exited {run.returncode}")
            answer = http_get(port, "/")
            return answer if answer[0] == 200 else None

        _status, page = wait_for(fleet, 120, interval=0.5, what="the dashboard in the image")
        assert 'data-job="nightly"' in page and "Fleet" in page
        # The definition from the mounted jobs file (commands hidden: no users).
        job = http_get(port, "/jobs/nightly")
        assert job[0] == 200 and "/etc/dblockrun/jobs.yaml" in job[1] and "0 3 * * *" in job[1]
    finally:
        for pid in [*descendants(run.pid), run.pid]:
            if comm(pid) == "tini":
                os.kill(pid, signal.SIGTERM)  # a runtime's stop
        try:
            log, _ = run.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            kill_all(run)
            log, _ = run.communicate(timeout=60)
        subprocess.run([*BUILDAH, "rm", container], capture_output=True, timeout=300)
    assert f"serving {postgres.url} (table prefix {postgres.prefix})" in log, log
    assert "Traceback" not in log, log
    assert "GET / HTTP" not in log  # no access log without --access-log
