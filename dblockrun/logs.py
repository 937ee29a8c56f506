"""Log output: human-readable lines, or one JSON object per line.

Fields given as ``extra=`` (job, run_id, slot, host, token, event) become
JSON keys. Database URLs are always rendered redacted by the code that logs
them; as a last line of defence any ``scheme://user:password@`` in a message
is redacted here too (:func:`scrub`, which ``history --output`` applies as
well). A text line's message has its control characters escaped (a
command's output line, a kill's reason): nothing it holds reaches the
terminal, or forges a line of the log. The JSON log is one object per line
by construction.

``json`` and ``datetime`` are imported by the JSON formatter only: ``exec``
logs text, and starts faster without them.
"""

from __future__ import annotations

import logging
import re
import sys

from dblockrun.printable import printable

FIELDS = ("job", "run_id", "slot", "host", "token", "event", "item")
# Linear on any line: \b lets a scheme start only at a word's start, and the
# bounded repeats keep a line full of "://" from backtracking quadratically (a
# command's 64 KiB line of letters took 10 s of the daemon's CPU before).
_PASSWORD = re.compile(r"(\b\w{1,40}://[^:/@\s]{0,256}):[^@\s]{0,1024}@")


def scrub(text: str) -> str:
    """``text`` with the password of any ``scheme://user:password@`` hidden."""
    return _PASSWORD.sub(r"\1:***@", text)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S%z")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = printable(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        import json
        from datetime import UTC, datetime

        doc: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": scrub(record.getMessage()),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(doc, ensure_ascii=False)


def setup(level: int, fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
