"""A job's definition as the Job page shows it: the keys this server's jobs
file sets and their values, with nothing secret (``env:`` values, passwords
in URLs, notification and ping URLs) and nothing a terminal or browser would
act on."""

from __future__ import annotations

import json
import re
from typing import Any

from dblockrun.config.jobs import Job, JobsFile
from dblockrun.config.load import job_key
from dblockrun.printable import printable
from dblockrun.store.dburl import redact

#: A URL in a value (a command's ``postgresql://user:pass@host/db``).
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


def file_job(jobs: JobsFile, name: str) -> Job | None:
    """The file's job of a row (``JOB@HOST``: its every-host job)."""
    return jobs.job(name) or jobs.job(name.split("@", 1)[0])


def shown_definition(job: Job) -> list[tuple[str, str]]:
    """(jobs file key, value as shown) for each key the job sets to other
    than its default (:meth:`Job.set_fields`), in the file's key names."""
    return [(job_key(field), _shown(job, field, value))
            for field, value in job.set_fields().items()]


def _shown(job: Job, field: str, value: Any) -> str:
    if field == "env":  # names only: the values may be secrets
        return ", ".join(name for name, _value in job.env)
    if field == "notify" and job.notify is not None:  # never a URL's text
        return (f"{', '.join(url.describe() for url in job.notify.urls)} "
                f"on {', '.join(job.notify.on)}")
    if field == "ping" and job.ping is not None:
        return job.ping.describe()
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return printable(_URL.sub(lambda m: redact(m.group()), text))
