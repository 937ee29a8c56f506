"""The frozen model of a jobs file, shared by the loader, scheduler and store."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from functools import cached_property

#: What a job (and an exec lock) may be called.
JOB_NAME = re.compile(r"[A-Za-z0-9._-]+")

#: A command: a string runs through the job's shell (``sh -c``), a tuple is exec'd.
Command = str | tuple[str, ...]


@dataclass(frozen=True)
class OnFailure:
    disable_for: float | None = None  # seconds
    command: Command | None = None

    @property
    def wanted(self) -> bool:
        """Whether a failure has anything to do."""
        return bool(self.disable_for) or self.command is not None


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
    #: Run the command as this user (the daemon must be root); None: as the daemon.
    user: str | None = None
    #: The fleet-wide limit group (``groups:`` at the top) the job runs in.
    group: str | None = None
    line: int = 0  # line of the job's name in the file; not part of the definition

    @property
    def fan_out(self) -> bool:
        """One row per work item (``items`` or ``items-command``)."""
        return self.items is not None or self.items_command is not None

    def definition_hash(self) -> str:
        """A short hash of everything that defines the job (not its line)."""
        data = asdict(self)
        data.pop("line")
        if data["user"] is None:
            del data["user"]  # hashes stay those of versions without `user:`
        if data["group"] is None:
            del data["group"]  # nor `group:`
        import hashlib  # here: exec never hashes, and starts faster without them
        import json

        blob = json.dumps(data, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


@dataclass(frozen=True)
class JobsFile:
    path: str
    database: str | None
    jobs: tuple[Job, ...]
    #: ``database-file:``, relative to the jobs file's folder.
    database_file: str | None = None
    #: ``groups:``: (group, at most this many of its jobs at once in the fleet).
    groups: tuple[tuple[str, int], ...] = ()

    def job(self, name: str) -> Job | None:
        return self._by_name.get(name)

    @cached_property
    def _by_name(self) -> dict[str, Job]:
        # A daemon looks a job up for each attempt: 2,000 jobs due at once
        # were 4 million name comparisons with a scan.
        return {job.name: job for job in self.jobs}
