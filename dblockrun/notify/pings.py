"""Heartbeat pings in the healthchecks.io convention (Cronitor and others
accept the same): ``URL/start`` when a run starts, ``URL`` when it ends
well, ``URL/fail`` when it does not, each with ``?rid=RUN-UUID`` so the
service pairs a start with its end; the end's body is the output tail.
Plain HTTP with urllib, sent by :class:`~dblockrun.notify.notifier.Notifier`."""

from __future__ import annotations

import uuid
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: The body of a ping: the output tail, at most this many bytes (healthchecks' limit).
MAX_BODY = 100_000
#: Seconds a ping may take.
TIMEOUT = 10.0

START, SUCCESS, FAIL = "start", "success", "fail"

#: rid = uuid5(RID_NAMESPACE, "JOB/RUN_ID"): healthchecks wants a UUID.
RID_NAMESPACE = uuid.UUID("6b9f1c3e-4d0a-5e7b-9c21-0d5f3a8e7b42")


def run_uuid(job: str, run_id: int) -> str:
    """The ``rid`` of a run: a UUID derived from the job and its run id
    (the first attempt's, as ``history`` shows it)."""
    return str(uuid.uuid5(RID_NAMESPACE, f"{job}/{run_id}"))


def ping_url(base: str, signal: str, rid: str) -> str:
    """``base`` with ``/start`` or ``/fail`` appended to its path (nothing
    for success) and ``rid`` added to its query."""
    parts = urlsplit(base)
    path = parts.path.rstrip("/")
    if signal != SUCCESS:
        path = f"{path}/{signal}"
    query = urlencode([*parse_qsl(parts.query, keep_blank_values=True), ("rid", rid)])
    return urlunsplit((parts.scheme, parts.netloc, path or "/", query, ""))


def send(url: str, body: bytes) -> None:
    """POST ``body`` to ``url``; raises OSError saying why (``HTTP 500
    Internal Server Error``, ``[Errno 111] Connection refused``) on failure,
    an HTTP status over 399 included."""
    import urllib.error  # here: only a daemon with pings needs them
    import urllib.request

    from dblockrun import __version__

    request = urllib.request.Request(url, data=body[-MAX_BODY:], method="POST",
                                     headers={"User-Agent": f"dblockrun/{__version__}",
                                              "Content-Type": "text/plain; charset=utf-8"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            response.read(1024)
    except urllib.error.HTTPError as exc:
        raise OSError(f"HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise OSError(str(exc.reason)) from None
