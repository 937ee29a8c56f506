"""The log lines of a run's start and end, a subscriber of the run events
(dblockrun/events.py): ``job backup: run 17 started (token 5, attempt 1)``
and ``job backup: run 17 failed, exit 3, 1.25s``, each with its JSON fields
(job, run_id, token, host, slot, event) for ``--log-format json``."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from dblockrun.events import Event, RunEnded, RunStarted
from dblockrun.store import models as m

log = logging.getLogger("dblockrun")


def _slot(slot: float | None) -> str | None:
    """As ``DBLOCKRUN_SLOT`` gives it to the command."""
    if slot is None:
        return None
    return datetime.fromtimestamp(slot, UTC).isoformat().replace("+00:00", "Z")


def log_run(event: Event) -> None:
    """Log a run's start or end (other events are logged where they happen);
    a fan-out item's run is named ``job:item``."""
    if not isinstance(event, RunStarted | RunEnded):
        return
    fields = {"job": event.job.name, "run_id": event.run_id, "token": event.token,
              "host": event.host, "slot": _slot(event.slot), "item": event.item}
    name = event.job.name if event.item is None else f"{event.job.name}:{event.item}"
    if isinstance(event, RunStarted):
        log.info("job %s: run %d started (token %d, attempt %d)", name,
                 event.run_id, event.token, event.attempt, extra={**fields, "event": "start"})
    else:
        why = f" ({event.detail})" if event.detail else ""
        log.log(logging.INFO if event.result == m.OK else logging.WARNING,
                "job %s: run %d %s, exit %s, %.2fs%s", name, event.run_id,
                event.result, event.exit_code, event.duration, why,
                extra={**fields, "event": event.result})
