"""Log output: human-readable lines, or one JSON object per line.

Fields given as ``extra=`` (job, run_id, slot, host, token, event) become
JSON keys. Database URLs are always rendered redacted by the code that logs
them; as a last line of defence every credential in a line (a URL's
password, ``PGPASSWORD=``, an ``Authorization`` header ...) is hidden here
too, by the one redactor (:func:`dblockrun.redact.text`, which a command's
stored output and the dashboard use as well). A text line's message has its
control characters escaped (a
command's output line, a kill's reason): nothing it holds reaches the
terminal, or forges a line of the log. The JSON log is one object per line
by construction.

``json`` and ``datetime`` are imported by the JSON formatter only: ``exec``
logs text, and starts faster without them.
"""

from __future__ import annotations

import logging
import sys

from dblockrun.printable import printable
from dblockrun.redact import text as redact

FIELDS = ("job", "run_id", "slot", "host", "token", "event", "item")


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S%z")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = printable(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        import json
        from datetime import UTC, datetime

        doc: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(doc, ensure_ascii=False)


def setup(level: int, fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
