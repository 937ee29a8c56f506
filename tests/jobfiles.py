"""The jobs files tests write and read: text loaded as dblockrun loads it,
the error a bad one gets, a file of one job, a file from each job's keys."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from dblockrun.config.load import load_jobs_text
from dblockrun.errors import ConfigError
from dblockrun.jobs import JobsFile

#: The name the loaded text gets in messages (``jobs.yaml:3: job 'j': ...``).
FILE = "jobs.yaml"


def load(text: str, path: str = FILE) -> JobsFile:
    """``text`` (dedented) loaded as the jobs file ``path``."""
    return load_jobs_text(textwrap.dedent(text), path)


def error(text: str) -> str:
    """The message loading ``text`` fails with."""
    with pytest.raises(ConfigError) as info:
        load(text)
    return info.value.render()


def one_job(**keys: Any) -> str:
    """A file whose job 'j' (line 2) has ``keys`` from line 3 on, in that order."""
    body = {"cron": "'@daily'", "command": "x", **keys}
    lines = [f"    {key}: {value}" for key, value in body.items() if value is not None]
    return "jobs:\n  j:\n" + "\n".join(lines) + "\n"


def jobs_file(path: Path, jobs: dict[str, str], groups: str = "") -> Path:
    """Write a jobs file: ``jobs`` maps a name to the job's keys (YAML
    lines, indented 4); ``groups`` comes first."""
    lines = [groups] if groups else []
    lines.append("jobs:")
    for name, body in jobs.items():
        lines.append(f"  {name}:")
        lines += [f"    {line}" for line in textwrap.dedent(body).strip().splitlines()]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_jobs(path: Path, body: str) -> Path:
    path.write_text(body)
    return path
