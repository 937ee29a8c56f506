"""The man pages describe every command, option, variable and job key, and the
examples stay valid.

A new option, command, environment variable or job key fails here until
man/dblockrun.1 or man/dblockrun-jobs.5 describes it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from clitree import commands, option_names

from dblockrun import __version__
from dblockrun.cli import cli
from dblockrun.config.load import (
    AFTER_KEYS,
    EXPECT_KEYS,
    JOB_KEYS,
    NOTIFY_KEYS,
    ON_FAILURE_KEYS,
    TOP_LEVEL_KEYS,
    load_jobs,
    load_jobs_text,
)
from dblockrun.durations import parse_duration
from dblockrun.jobs import LIMIT_KEYS
from dblockrun.scheduling.cron import describe_next

REPO = Path(__file__).resolve().parent.parent
MAN1 = REPO / "man" / "dblockrun.1"
MAN5 = REPO / "man" / "dblockrun-jobs.5"
EXAMPLES = REPO / "examples"

# --- reading roff ------------------------------------------------------------------


def plain(roff: str) -> str:
    """``roff`` with the escapes a reader does not see removed (``\\-`` is ``-``)."""
    text = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", roff)  # font changes
    text = text.replace("\\-", "-").replace("\\%", "").replace("\\&", "")
    text = text.replace("\\~", " ").replace("\\ ", " ").replace("\\(dq", '"')
    return text.replace("\\e", "\\")


def heading(line: str, macro: str) -> str | None:
    if not line.startswith(macro + " "):
        return None
    return line[len(macro) + 1 :].strip().strip('"')


def section(text: str, macro: str, name: str) -> str:
    """The lines after ``.SH name`` (or ``.SS name``) up to the next heading."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if heading(line, macro) == name:
            body: list[str] = []
            for following in lines[index + 1 :]:
                if following.startswith((".SH ", ".SS ")) and (
                    macro == ".SS" or following.startswith(".SH ")
                ):
                    break
                body.append(following)
            return "\n".join(body)
    raise AssertionError(f"no {macro} {name} heading")


def subsections(text: str, within: str) -> list[str]:
    """The ``.SS`` headings of the ``.SH within`` section."""
    return [
        name
        for line in section(text, ".SH", within).splitlines()
        if (name := heading(line, ".SS")) is not None
    ]


def tags(body: str) -> list[str]:
    """The first word of each ``.TP`` tag line in ``body`` (macros and quotes removed)."""
    found: list[str] = []
    lines = body.splitlines()
    for index, line in enumerate(lines[:-1]):
        if re.fullmatch(r"\.TP( \d+)?", line):
            tag = lines[index + 1].replace("\\", "\\\\")
            try:
                words = shlex.split(tag)
            except ValueError:  # an apostrophe in the tag
                words = tag.split()
            if words and words[0].startswith("."):
                words = words[1:]
            if words:
                found.append(words[0].replace("\\\\", "\\"))
    return found


def mentions(body: str, word: str) -> bool:
    """``word`` appears in ``body`` as a whole token (``--lease`` is not ``--lease-x``)."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", body) is not None


def man1() -> str:
    return plain(MAN1.read_text(encoding="utf-8"))


def man5() -> str:
    return plain(MAN5.read_text(encoding="utf-8"))


# --- the command tree -----------------------------------------------------------------


def test_the_pages_exist_and_are_plain_text() -> None:
    for page in (MAN1, MAN5):
        text = page.read_text(encoding="utf-8")
        assert text.startswith('.\\"') or text.startswith(".TH")
        assert "\t" not in text, f"{page.name}: tabs change meaning in roff"


def test_every_command_has_a_section() -> None:
    documented = subsections(man1(), "COMMANDS")
    names = [name for name, _ in commands()]
    missing = [name for name in names if name not in documented]
    assert not missing, f"commands without a .SS section under COMMANDS in dblockrun.1: {missing}"
    stale = [name for name in documented if name not in names]
    assert not stale, f"dblockrun.1 describes commands that do not exist: {stale}"


@pytest.mark.parametrize("name", [name for name, _ in commands()])
def test_every_option_of_a_command_is_in_its_section(name: str) -> None:
    command = dict(commands())[name]
    body = section(man1(), ".SS", name)
    missing = [opt for opt in option_names(command) if not mentions(body, opt)]
    assert not missing, f"dblockrun.1, section {name}: options not described: {missing}"
    # And nothing described there that the command does not take.
    described = [tag for tag in tags(body) if tag.startswith("-")]
    stale = [tag for tag in described if tag.rstrip(",") not in option_names(command)]
    assert not stale, f"dblockrun.1, section {name}: describes options it lacks: {stale}"


def test_global_options_are_in_options() -> None:
    body = section(man1(), ".SH", "OPTIONS")
    names = option_names(cli) + list(cli.get_help_option_names(click.Context(cli)))
    missing = [opt for opt in names if not mentions(body, opt)]
    assert not missing, f"dblockrun.1, OPTIONS: global options not described: {missing}"


def test_every_environment_variable_is_described() -> None:
    """Every DBLOCKRUN_* name in the source, and XDG_STATE_HOME, is under ENVIRONMENT."""
    used: set[str] = {"XDG_STATE_HOME"}
    for path in (REPO / "dblockrun").rglob("*.py"):
        used.update(re.findall(r"\bDBLOCKRUN_[A-Z0-9_]+\b", path.read_text(encoding="utf-8")))
    body = section(man1(), ".SH", "ENVIRONMENT")
    missing = sorted(name for name in used if not mentions(body, name))
    assert not missing, f"dblockrun.1, ENVIRONMENT: variables not described: {missing}"


def test_man1_has_the_sections_a_reader_looks_for() -> None:
    text = man1()
    for name in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "COMMANDS", "ENVIRONMENT",
                 "EXIT STATUS", "SIGNALS", "FILES", "SEE ALSO"):
        section(text, ".SH", name)
    assert "dblockrun-jobs (5)" in section(text, ".SH", "SEE ALSO")


# --- the jobs file page ---------------------------------------------------------------


def test_every_top_level_key_is_described() -> None:
    described = tags(section(man5(), ".SH", "TOP-LEVEL KEYS"))
    missing = [key for key in (*TOP_LEVEL_KEYS, "database", "defaults", "jobs")
               if key not in described]
    assert not missing, f"dblockrun-jobs.5, TOP-LEVEL KEYS: not described: {missing}"
    stale = [key for key in described if key not in TOP_LEVEL_KEYS]
    assert not stale, f"dblockrun-jobs.5 describes top-level keys that do not exist: {stale}"


def test_every_job_key_is_described() -> None:
    described = [tag.rstrip(":") for tag in tags(section(man5(), ".SH", "JOB KEYS"))]
    nested = (*ON_FAILURE_KEYS, *NOTIFY_KEYS, *LIMIT_KEYS, *AFTER_KEYS, *EXPECT_KEYS)
    missing = [key for key in (*JOB_KEYS, *nested) if key not in described]
    assert not missing, f"dblockrun-jobs.5, JOB KEYS: keys not described: {missing}"
    stale = [key for key in described if key not in JOB_KEYS and key not in nested]
    assert not stale, f"dblockrun-jobs.5 describes job keys that do not exist: {stale}"


def test_man5_has_the_sections_a_reader_looks_for() -> None:
    text = man5()
    for name in ("NAME", "DESCRIPTION", "TOP-LEVEL KEYS", "JOB KEYS", "DURATIONS",
                 "CRON EXPRESSIONS", "DAYLIGHT SAVING TIME", "FAN-OUT", "JOB CHAINS",
                 "VALIDATION",
                 "EXAMPLES", "SEE ALSO"):
        section(text, ".SH", name)


def example_blocks(text: str) -> list[str]:
    return re.findall(r"^\.EX\n(.*?)^\.EE$", text, flags=re.S | re.M)


def test_the_jobs_page_example_is_a_valid_jobs_file() -> None:
    blocks = example_blocks(section(man5(), ".SH", "EXAMPLES"))
    assert blocks, "dblockrun-jobs.5: no .EX block under EXAMPLES"
    jobs = load_jobs_text(blocks[0], "dblockrun-jobs.5 EXAMPLES")
    assert len(jobs.jobs) >= 4


# --- rendering --------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
@pytest.mark.parametrize("page", [MAN1, MAN5], ids=lambda p: p.name)
def test_the_page_renders_without_warnings(page: Path) -> None:
    result = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-z", str(page)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", f"groff warnings for {page.name}:\n{result.stderr}"


# --- the examples -------------------------------------------------------------------------


def test_the_quick_start_jobs_file_loads_and_covers_the_common_cases() -> None:
    jobs = load_jobs(str(EXAMPLES / "jobs.yaml"))
    assert jobs.database is None, "the quick start must run on the default SQLite file"
    now = datetime(2026, 3, 1, tzinfo=UTC)

    def gap(cron: str, timezone: str) -> float:
        first, second = describe_next(cron, timezone, now, 2)
        return (second - first).total_seconds()

    enabled = [job for job in jobs.jobs if job.enabled]
    assert any(isinstance(job.cron, str) and gap(job.cron, job.timezone) <= 10
               for job in enabled), (
        "a newcomer should see a run within 10 seconds"
    )
    assert any(len(cron.split()) == 6 for job in enabled for cron in job.crons)
    assert any(job.rate and not job.cron for job in enabled)
    assert any(job.timezone != "UTC" for job in enabled)
    assert any(job.lock_at_least > 0 for job in enabled)
    assert any(job.retries > 0 for job in enabled)
    assert any(job.on_failure.disable_for for job in enabled)
    assert any(job.items and job.parallel > 1 for job in enabled)


def test_the_quick_start_jobs_file_validates_from_the_cli() -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, ["validate", str(EXAMPLES / "jobs.yaml")])
    assert result.exit_code == 0, result.output


def k8s_documents() -> list[dict[str, Any]]:
    with open(EXAMPLES / "k8s-deployment.yaml", encoding="utf-8") as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def flag_value(args: list[str], flag: str, default: str) -> str:
    return args[args.index(flag) + 1] if flag in args else default


def test_the_kubernetes_example() -> None:
    docs = {doc["kind"]: doc for doc in k8s_documents()}
    assert set(docs) == {"ConfigMap", "Deployment", "Secret"}
    jobs_text = docs["ConfigMap"]["data"]["jobs.yaml"]
    assert load_jobs_text(jobs_text, "k8s ConfigMap").jobs

    deployment = docs["Deployment"]
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    args = [str(arg) for arg in container["args"]]
    assert args[0] == "daemon"
    grace = parse_duration(flag_value(args, "--grace", "30s"))
    assert pod["spec"]["terminationGracePeriodSeconds"] > grace + 5

    env = {item["name"]: item for item in container["env"]}
    secret = env["DBLOCKRUN_DB"]["valueFrom"]["secretKeyRef"]
    assert secret["name"] == docs["Secret"]["metadata"]["name"]
    assert docs["Secret"]["stringData"][secret["key"]].startswith("postgresql://")

    # The image the Containerfile builds, of this version, and its user.
    repository, _, tag = container["image"].rpartition(":")
    assert repository.endswith("/dblockrun") and tag == __version__
    uid = re.search(r"useradd --uid (\d+)", (REPO / "Containerfile").read_text())
    assert uid is not None and pod["spec"]["securityContext"]["runAsUser"] == int(uid.group(1))

    host, _, port_text = flag_value(args, "--metrics", "").rpartition(":")
    port = int(port_text)
    # The kubelet's probe and the scraper come to the pod's address: a port
    # alone would bind the loopback only.
    assert host == "0.0.0.0"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert [p["containerPort"] for p in container["ports"]] == [port]
    probe = container["livenessProbe"]
    assert probe["httpGet"]["path"] == "/healthz"
    # A database blip or failover must not restart the pods: minutes, not seconds.
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 120

    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    jobs_file = args[-1]
    assert jobs_file == f"{mounts['jobs']}/jobs.yaml"
    assert volumes["jobs"]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]


def systemd_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: {line!r} before any [section]"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not KEY=VALUE"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_the_systemd_unit() -> None:
    unit = systemd_unit(EXAMPLES / "dblockrun.service")
    service = {key: values[-1] for key, values in unit["Service"].items()}
    assert service["Type"] == "notify"  # READY=1, STOPPING=1, WATCHDOG=1 (daemon/sdnotify.py)
    assert service["NotifyAccess"] == "main"
    assert parse_duration(service["WatchdogSec"].replace("min", "m")) >= 60
    exec_start = shlex.split(service["ExecStart"])
    assert exec_start[:2] == ["/usr/local/bin/dblockrun", "daemon"]
    assert exec_start[-1] == "/etc/dblockrun/jobs.yaml"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["Restart"] == "on-failure"
    assert service["KillMode"] == "mixed"
    assert service["EnvironmentFile"] == "-/etc/dblockrun/env"
    assert service.get("User") not in (None, "", "root")
    grace = parse_duration(flag_value(exec_start, "--grace", "30s"))
    assert parse_duration(service["TimeoutStopSec"]) > grace + 5
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_the_demo_script_is_valid_bash() -> None:
    script = EXAMPLES / "demo-fleet.sh"
    assert os.access(script, os.X_OK), "examples/demo-fleet.sh must be executable"
    text = script.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert "trap " in text
    bash = shutil.which("bash")
    assert bash is not None
    result = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 0, result.stderr
