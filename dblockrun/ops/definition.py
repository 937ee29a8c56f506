"""A job's definition as the Job page and ``dblockrun plan`` show it: the
keys a jobs file sets and their values, with nothing secret and nothing a
terminal or browser would act on: ``env:`` its names only, ``notify:`` and ``ping:``
where their URLs come from, every other value with its credentials hidden
(dblockrun/redact.py: a URL's password, ``PGPASSWORD=``, libpq's
``password=``, ``Authorization:`` ...), and the commands (``command``,
``on-failure``'s, ``items-command``) only to whom ``--hide-commands`` lets
see them."""

from __future__ import annotations

import json
from typing import Any

from dblockrun import redact
from dblockrun.config.load import job_key
from dblockrun.jobs import Job, JobsFile
from dblockrun.printable import printable

#: The fields that hold a command.
COMMANDS = ("command", "items_command")
#: The fields that hold a duration (seconds): shown with their units (``2h``).
DURATIONS = ("rate", "lock_at_most", "lock_at_least", "starting_deadline", "retry_delay",
             "max_delay", "jitter")
#: Shown instead of a command to whom may not see it.
HIDDEN = "(hidden: shown to operators and admins)"


def file_job(jobs: JobsFile, name: str) -> Job | None:
    """The file's job of a row (``JOB@HOST``: its every-host job)."""
    return jobs.job(name) or jobs.job(name.split("@", 1)[0])


def shown_definition(job: Job, commands: bool = True) -> list[tuple[str, str]]:
    """(jobs file key, value as shown) for each key the job sets to other
    than its default (:meth:`Job.set_fields`), in the file's key names;
    ``commands``: the commands too (else :data:`HIDDEN`)."""
    return [(job_key(field), shown_value(job, field, value, commands))
            for field, value in job.set_fields().items()]


def shown_value(job: Job, field: str, value: Any, commands: bool = True) -> str:
    """The value ``value`` of ``job``'s field ``field`` (as
    :meth:`Job.definition_data` holds it) as shown: the Job page's, and
    ``dblockrun plan``'s changed keys (dblockrun/ops/plan.py)."""
    if field == "env":  # names only: the values may be secrets
        return ", ".join(name for name, _value in job.env)
    if field == "notify" and job.notify is not None:  # never a URL's text
        return (f"{', '.join(url.describe() for url in job.notify.urls)} "
                f"on {', '.join(job.notify.on)}")
    if field == "ping" and job.ping is not None:
        return job.ping.describe()
    if not commands and field in COMMANDS:
        return HIDDEN
    if field in DURATIONS and isinstance(value, (int, float)):
        from dblockrun.durations import format_duration

        return format_duration(value)
    if not commands and field == "on_failure" and isinstance(value, dict) \
            and value.get("command") is not None:
        value = {**value, "command": HIDDEN}
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return printable(redact.text(text))
