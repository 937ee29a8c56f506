"""Run and slot events: what became of a run or a slot, told once to
whoever subscribed (metrics, notifications and pings, the log).

The lifecycle (dblockrun/running/runjob.py) and the slot book emit them; neither
calls a metric, a notifier or a ping itself. A subscriber is called on the
emitting thread, so it must be quick (the notifier only queues); one that
raises is logged with its traceback and the others still hear the event.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dblockrun.jobs import Job

if TYPE_CHECKING:
    from dblockrun.store.models import Trigger

log = logging.getLogger("dblockrun")


@dataclass(frozen=True)
class RunStarted:
    """An attempt's command was started (``attempt`` 1 is the run's start)."""

    job: Job
    host: str
    run_id: int
    token: int
    slot: float | None
    attempt: int
    item: str | None = None


@dataclass(frozen=True)
class RunEnded:
    """An attempt ended and was recorded; ``final``: no retry follows, so
    the run is over (notifications and pings are sent for those)."""

    job: Job
    host: str
    run_id: int
    #: The run's first attempt (its pings are keyed by it).
    first_run_id: int
    slot: float | None
    attempt: int
    #: ``ok``, ``failed``, ``timeout`` or ``killed`` (dblockrun/store/models.py).
    result: str
    exit_code: int | None
    #: The command's own duration, seconds.
    duration: float
    #: The stored output tail, ending with the reason line when it was stopped.
    output: str
    #: Why it was stopped or could not start ("" for a command that exited).
    detail: str
    final: bool
    item: str | None = None
    #: The run's fencing token (the log line's JSON carries it).
    token: int | None = None
    #: The upstream run that started it (``after:``; None: a slot's run).
    upstream: Trigger | None = None


@dataclass(frozen=True)
class SlotPassed:
    """A slot that did not run was recorded ``missed`` or ``skipped`` (by
    this host, once fleet-wide). A summary record stands for ``count``
    slots from ``first`` to ``slot``."""

    job: Job
    host: str
    slot: float
    #: ``missed`` or ``skipped``.
    result: str
    #: Why, as stored with the record (one line, no trailing newline).
    reason: str
    #: What passed it (dblockrun/scheduling/planner.py ``Cause``), a metric label.
    cause: str
    #: How late the slot was when it was recorded, seconds.
    late: float
    count: int = 1
    first: float | None = None


@dataclass(frozen=True)
class RunLost:
    """This host's bookkeeping recorded another host's run ``lost``: its
    holder stopped renewing the lease (once fleet-wide: the sweep that
    wrote the record)."""

    #: The job as this host's file defines it (None: not in this file).
    job: Job | None
    name: str
    #: The dead holder.
    host: str
    run_id: int
    #: The run's first attempt (its pings are keyed by it; a retry's is earlier).
    first_run_id: int
    slot: float | None
    #: Its last renewal (database time).
    ended: float
    recorded_by: str
    item: str | None = None


@dataclass(frozen=True)
class Alert:
    """An alert of a job's ``expect:`` (dblockrun/notify/alerts.py), claimed
    by this host (once fleet-wide: the ledger row it inserted), or its
    recovery (``cleared``: this host's update cleared it)."""

    job: Job
    #: ``late``, ``slow`` or ``fast``.
    kind: str
    host: str
    #: One line: what is late, slow or fast (or what cleared it).
    detail: str
    cleared: bool = False
    slot: float | None = None
    run_id: int | None = None


Event = RunStarted | RunEnded | SlotPassed | RunLost | Alert
Handler = Callable[[Event], None]


class Events:
    """Subscribers, called in the order they subscribed."""

    def __init__(self) -> None:
        self._handlers: tuple[Handler, ...] = ()
        self._lock = threading.Lock()

    def subscribe(self, handler: Handler) -> None:
        with self._lock:
            self._handlers = (*self._handlers, handler)

    def emit(self, event: Event) -> None:
        for handler in self._handlers:
            try:
                handler(event)
            except Exception:
                log.exception("a subscriber failed on %s", type(event).__name__)
