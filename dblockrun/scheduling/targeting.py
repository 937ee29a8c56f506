"""Host targeting: a daemon's labels, which jobs a host may run (``run-on:``),
and every-host jobs (``on: every-host``).

A daemon has labels (``--label KEY=VALUE``, ``DBLOCKRUN_LABELS``, and the
built-in ``hostname``). Matching is decided by each daemon on its own, before
it plans anything: :func:`local_jobs` is the part of the jobs file this host
runs, and a job it leaves out is never planned, claimed, run on request or
worked through (fan-out items) here. The claim statements do not change.

An every-host job runs on each matching host under a lock row of its own,
``JOB@HOSTNAME`` (the ``hostname`` label): the same lease, fencing, limits and
history as any job, per host. The row ``JOB`` stays the job's own: ``disable
JOB`` pauses it and every host's row, and a host's new row starts as it is.

Hosts publish their labels, and the targeting of their file's jobs
(:func:`targets_json`), with their host row; ``status`` shows both and
marks a job no live host matches.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from dblockrun.jobs import EVERY_HOST_SEP, Job, JobsFile, RunOn

log = logging.getLogger("dblockrun")

#: A label's name or value: letters, digits, ``.``, ``_``, ``-`` (a host name).
LABEL_WORD = re.compile(r"[A-Za-z0-9._-]+")
#: At most: a job name (200) + ``@`` + a value fits the lock row's name (255).
MAX_LABEL = 54
#: The built-in label; its value names an every-host job's row on this host.
HOSTNAME = "hostname"
#: The environment variable with more labels: ``role=db,zone=eu``.
LABELS_ENV = "DBLOCKRUN_LABELS"

Labels = Mapping[str, str]


def check_word(text: str, what: str) -> str:
    """``text`` if it may be a label's name or value, else ValueError saying why."""
    if not LABEL_WORD.fullmatch(text):
        raise ValueError(f"{what} {text[:60]!r}: use letters, digits, '.', '_' and '-'")
    if len(text) > MAX_LABEL:
        raise ValueError(f"{what} {text[:60]!r} is {len(text)} characters long "
                         f"(at most {MAX_LABEL})")
    return text


def parse_label(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> (key, value); ValueError saying what is wrong."""
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"{text[:60]!r} is not KEY=VALUE")
    return check_word(key.strip(), "label name"), check_word(value.strip(), "label value")


def host_labels(given: Iterable[str] = (), env: str | None = None,
                hostname: str | None = None) -> dict[str, str]:
    """A daemon's labels: ``hostname`` (this machine's), then those of
    ``env`` (``DBLOCKRUN_LABELS``, comma-separated), then ``given``
    (``--label``, which win; ``--label hostname=X`` renames the host)."""
    labels = {HOSTNAME: hostname or socket.gethostname()}
    for part in (env or "").split(","):
        if part.strip():
            try:
                key, value = parse_label(part)
            except ValueError as exc:
                raise ValueError(f"{LABELS_ENV}: {exc}") from None
            labels[key] = value
    for text in given:
        try:
            key, value = parse_label(text)
        except ValueError as exc:
            raise ValueError(f"--label: {exc}") from None
        labels[key] = value
    try:
        check_word(labels[HOSTNAME], "host name")
    except ValueError as exc:
        raise ValueError(f"{exc}; give --label hostname=NAME") from None
    return labels


def matches(labels: Labels, run_on: RunOn) -> bool:
    """A host with ``labels`` may run a job with ``run_on``: every label it
    names has one of its values."""
    return all(labels.get(key) in values for key, values in run_on)


def describe(run_on: RunOn) -> str:
    """``role=db zone=eu|us``, as messages show a ``run-on``."""
    return " ".join(f"{key}={'|'.join(values)}" for key, values in run_on)


def label_text(labels: Labels) -> str:
    """``hostname=web1 role=db``, as messages and ``status`` show a host's labels."""
    return " ".join(f"{key}={value}" for key, value in sorted(labels.items()))


def row_name(job: str, hostname: str) -> str:
    """The lock row of an every-host job on the host ``hostname``."""
    return f"{job}{EVERY_HOST_SEP}{hostname}"


def local_jobs(file: JobsFile, labels: Labels) -> JobsFile:
    """The jobs this host runs: those whose ``run-on`` it matches, an
    every-host job under its own row's name (``JOB@HOSTNAME``)."""
    mine: list[Job] = []
    for job in file.jobs:
        if not matches(labels, job.run_on):
            continue
        if job.every_host:
            job = replace(job, name=row_name(job.name, labels[HOSTNAME]))
        mine.append(job)
    if len(mine) == len(file.jobs) and not any(j.every_host for j in mine):
        return file  # nothing targeted: the file itself
    return replace(file, jobs=tuple(mine))


def every_host_rows(jobs: JobsFile) -> list[tuple[str, str]]:
    """(row, job) of the every-host jobs among ``jobs`` (a :func:`local_jobs`)."""
    return [(j.name, j.file_name) for j in jobs.jobs if j.every_host]


def targets(jobs: Iterable[Job]) -> dict[str, dict[str, Any]]:
    """The targeting of ``jobs`` that have any, as hosts publish it:
    ``{job: {"run_on": {label: [values]}, "every_host": bool}}``, with
    ``"after": "after extract"`` for a job that runs after others (``status``
    shows it)."""
    out: dict[str, dict[str, Any]] = {}
    for j in jobs:
        if j.run_on or j.every_host or j.after:
            spec: dict[str, Any] = {"run_on": {k: list(v) for k, v in j.run_on},
                                    "every_host": j.every_host}
            if j.after is not None:
                spec["after"] = j.after.text()
                spec["upstream"] = list(j.after.jobs)
            out[j.name] = spec
    return out


def targets_json(file: JobsFile) -> str | None:
    """:func:`targets` of the whole file (not only what this host runs), or
    None when no job has any."""
    found = targets(file.jobs)
    return json.dumps(found, sort_keys=True) if found else None


def unmatched(file: JobsFile, live: Sequence[Labels]) -> list[Job]:
    """The targeted jobs of ``file`` that no host with ``live`` labels matches."""
    return [j for j in file.jobs if j.run_on and not any(matches(h, j.run_on) for h in live)]


def loads_labels(text: str | None) -> dict[str, str]:
    """A host row's labels column (empty if unset or unreadable)."""
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def loads_targets(text: str | None) -> dict[str, tuple[RunOn, bool]]:
    """A host row's targets column: job -> (run-on, every-host)."""
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return {}
    out: dict[str, tuple[RunOn, bool]] = {}
    if not isinstance(data, dict):
        return out
    for name, spec in data.items():
        if not isinstance(spec, dict):
            continue
        raw = spec.get("run_on") or {}
        run_on = tuple(sorted((str(k), tuple(str(x) for x in v)) for k, v in raw.items()
                              if isinstance(v, list))) if isinstance(raw, dict) else ()
        out[str(name)] = (run_on, bool(spec.get("every_host")))
    return out


def loads_after(text: str | None) -> dict[str, tuple[str, list[str]]]:
    """A host row's targets column: job -> what it runs after, as ``status``
    says it (``after extract``) and the jobs' names."""
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(name): (str(spec["after"]), [str(up) for up in spec.get("upstream") or []
                                             if isinstance(up, str)])
            for name, spec in data.items()
            if isinstance(spec, dict) and isinstance(spec.get("after"), str)}


class LocalJobs:
    """A daemon's jobs file and the part of it this host runs (its labels
    matched against each job's ``run-on``), taken anew at each reload."""

    def __init__(self, file: JobsFile, labels: Mapping[str, str]) -> None:
        #: This host's labels; ``hostname`` defaults to this machine's.
        self.labels = {HOSTNAME: socket.gethostname(), **dict(labels)}
        self.labels_json = json.dumps(self.labels, sort_keys=True)
        self.load(file)

    def load(self, file: JobsFile) -> None:
        self.file = file
        self.jobs = local_jobs(file, self.labels)
        self.targets = targets_json(file)

    def rows(self) -> tuple[list[str], list[tuple[str, str]]]:
        """The lock rows the daemon makes (:mod:`dblockrun.daemon.loop`):
        the file's jobs' (a targeted job's too, so status shows it
        unmatched) with its groups' seats and lanes; and this host's rows
        of its every-host jobs."""
        from dblockrun.scheduling.limits import all_seats  # the daemon's: not status's labels

        return ([*(j.name for j in self.file.jobs), *all_seats(self.file)],
                every_host_rows(self.jobs))

    def unmatched_warnings(self, live: Iterable[Mapping[str, str]]) -> list[str]:
        """A warning for each job of the file whose run-on matches neither
        this host's labels nor any of ``live`` (the other live hosts')."""
        return [f"job {job.name}: no live host matches run-on {describe(job.run_on)} "
                f"(this host: {label_text(self.labels)}), so it runs nowhere"
                for job in unmatched(self.file, [*live, self.labels])]

    def next_due(self, now: float) -> dict[str, float]:
        """Each enabled cron job's next slot after ``now`` that runs (not one
        a calendar, blackout window or its active range excludes), for `status`."""
        # Here: the label functions above (status, validate) need no croniter.
        from dblockrun.scheduling.calendars import next_real_slot
        from dblockrun.scheduling.cron import next_slot_at

        return {job.name: due for job in self.jobs.jobs
                if job.cron is not None and job.enabled
                and (due := next_real_slot(job, now) if job.calendared
                     else next_slot_at(job.schedule, now)) is not None}

    @property
    def targeted(self) -> bool:
        """Whether the host's labels or the file's targeting matter here."""
        return len(self.labels) > 1 or self.targets is not None
