"""URLs that carry secrets: notification URLs (apprise) and ping URLs.

A jobs file names such a URL as a literal, ``{env: VAR}`` (an environment
variable of the daemon) or ``{file: PATH}`` (the first line of a regular
file, relative to the jobs file: :mod:`dblockrun.secretfile`).
:mod:`dblockrun.config.load` records where it comes from; :func:`resolve_secrets`
reads the variables and files when the daemon (or ``validate``) loads the
file, so operator commands that only read the file's ``database:`` need
neither. A URL's value is never printed: :func:`shown` renders one with
everything after its host hidden, and a variable read for one is never
passed on to a command (dblockrun/withheld.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from urllib.parse import urlsplit

from dblockrun import withheld
from dblockrun.errors import ConfigError
from dblockrun.jobs import ENV, LITERAL, Job, JobsFile, SecretUrl
from dblockrun.secretfile import first_line

#: A URL's scheme, as apprise and urllib read it.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def shown(url: str) -> str:
    """``url`` safe to print: its scheme and host, the rest hidden
    (``json://hooks.internal/…``, ``https://hc-ping.com/…``). User and
    password are dropped; services whose token is the host (``tgram://``)
    show only the scheme."""
    match = _SCHEME.match(url)
    if match is None:
        return "(not a URL)"
    scheme = match.group(0)
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        host = ""
    # A host without a dot may be a token (slack://TokenA/..., tgram://BOT:TOKEN/...).
    if not host or ("." not in host and host != "localhost"):
        return f"{scheme}…"
    return f"{scheme}{host}/…"


def scrub(text: str, url: str) -> str:
    """``text`` (a library's error message) with every part of ``url`` that
    might be a secret (its user, password, path and query words) hidden."""
    words = {w for w in re.split(r"[/:@?&=#,%+]+", url.split("://", 1)[-1]) if len(w) >= 6}
    for word in sorted(words, key=len, reverse=True):
        text = text.replace(word, "***")
    return text


def quiet_apprise() -> None:
    """Keep apprise's log out of ours: it logs the URLs it loads (tokens and
    all) at DEBUG, and urllib3 the request paths."""
    import logging

    logging.getLogger("apprise").propagate = False
    logging.getLogger("urllib3").setLevel(logging.INFO)


def check_url(value: str) -> str | None:
    """Why ``value`` is not a URL (without echoing it), or None."""
    if not value.strip():
        return "is empty"
    if any(c.isspace() for c in value.strip()) or _SCHEME.match(value.strip()) is None:
        return "is not a URL (scheme://...)"
    return None


def _read(secret: SecretUrl, folder: str) -> str:
    """The URL's value: a literal, a variable or a file's first line (a
    relative path is in ``folder``, the jobs file's)."""
    if secret.source == LITERAL:
        return secret.value
    if secret.source == ENV:
        withheld.add(secret.ref)  # a secret: no command gets it
        value = os.environ.get(secret.ref)
        if value is None:
            raise ValueError(f"environment variable {secret.ref} is not set")
        return value.strip()
    return first_line(os.path.join(folder, secret.ref))


def resolve(secret: SecretUrl, check: str = "", folder: str = "") -> SecretUrl:
    """``secret`` with its value read; ``check``: ``apprise`` also asks
    apprise whether it knows the URL, ``http`` wants http(s). Raises
    ValueError (never echoing the value)."""
    value = _read(secret, folder)
    where = "" if secret.source == LITERAL else f" ({secret.describe()})"
    why = check_url(value)
    if why is not None:
        raise ValueError(f"the URL{where} {why}")
    if check == "apprise":
        import apprise  # here: loading its plugins takes 0.1-0.2 s

        quiet_apprise()
        if apprise.Apprise.instantiate(value) is None:
            scheme = value.split("://", 1)[0]
            raise ValueError(f"the URL{where}: apprise does not support it "
                             f"(scheme {scheme!r}, or a malformed URL)")
    elif check == "http" and urlsplit(value).scheme.lower() not in ("http", "https"):
        raise ValueError(f"the URL{where} must be http:// or https://")
    return replace(secret, value=value)


def resolve_secrets(jobs: JobsFile) -> JobsFile:
    """``jobs`` with every notification and ping URL read from its variable
    or file, and checked. Raises :class:`ConfigError` naming the file, line,
    job and key (and the variable or file, never the value)."""
    return replace(jobs, jobs=tuple(_resolve_job(jobs.path, job) for job in jobs.jobs))


def _resolve_job(path: str, job: Job) -> Job:
    def fail(secret: SecretUrl, exc: ValueError) -> ConfigError:
        return ConfigError(str(exc), file=path, line=secret.line or job.line, job=job.name,
                           key=secret.key)

    notify, ping = job.notify, job.ping
    folder = os.path.dirname(path)
    if notify is not None:
        urls = []
        for url in notify.urls:
            try:
                urls.append(resolve(url, "apprise", folder))
            except ValueError as exc:
                raise fail(url, exc) from None
        notify = replace(notify, urls=tuple(urls))
    if ping is not None:
        try:
            ping = resolve(ping, "http", folder)
        except ValueError as exc:
            raise fail(ping, exc) from None
    if notify is job.notify and ping is job.ping:
        return job
    return replace(job, notify=notify, ping=ping)
