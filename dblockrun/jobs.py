"""The frozen model of a jobs file, shared by the loader, scheduler and store."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

#: A command: a string runs through the job's shell (``sh -c``), a tuple is exec'd.
Command = str | tuple[str, ...]


@dataclass(frozen=True)
class OnFailure:
    disable_for: float | None = None  # seconds
    command: Command | None = None


@dataclass(frozen=True)
class Job:
    """One job of the jobs file. Durations are in seconds."""

    name: str
    command: Command
    cron: str | None = None
    rate: float | None = None
    lock_at_most: float = 3600.0
    lock_at_least: float = 0.0
    timezone: str = "UTC"
    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    shell: str = "/bin/sh"
    starting_deadline: float | None = None
    retries: int = 0
    retry_delay: float = 10.0
    on_failure: OnFailure = field(default_factory=OnFailure)
    jitter: float = 0.0
    description: str = ""
    enabled: bool = True
    items: tuple[str, ...] | None = None
    items_command: Command | None = None
    parallel: int = 1
    batch: int = 1
    history_limit: int = 1000
    line: int = 0  # line of the job's name in the file; not part of the definition

    @property
    def fan_out(self) -> bool:
        """One row per work item (``items`` or ``items-command``)."""
        return self.items is not None or self.items_command is not None

    def definition_hash(self) -> str:
        """A short hash of everything that defines the job (not its line)."""
        data = asdict(self)
        data.pop("line")
        blob = json.dumps(data, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


@dataclass(frozen=True)
class JobsFile:
    path: str
    database: str | None
    jobs: tuple[Job, ...]

    def job(self, name: str) -> Job | None:
        for job in self.jobs:
            if job.name == name:
                return job
        return None
