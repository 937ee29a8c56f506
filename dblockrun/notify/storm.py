"""Notification storms: when more than ``notify-storm.threshold`` jobs
(10) pass slots for the same cause within its ``window`` (1m) across the
fleet — the database was away, the fleet down or paused, a host lost —
one notification names the cause and the jobs (up to ``max-names``, then
a count) instead of one per job. The per-job records stay as they are.

How (dblockrun/notify/notifier.py): each passed slot of a job whose
``missed`` notifications are on (missed, or skipped for one of the
:data:`FLEET_CAUSES`; a job's own skips, busy or a full group, count
nothing and cost nothing) gets a row in the alerts ledger
(dblockrun/store/alerts.py) with its cause, and its notification waits
``wait`` (5 s) for the others. Then the host counts the jobs with a row of
that cause within the window, fleet-wide; over the threshold, the host
whose conditional write claims the cause's storm row sends the one
notification, and every host drops its per-job ones. A storm is sent once
while it lasts: it is claimed again only after a whole window without it.
"""

from __future__ import annotations

from collections.abc import Sequence

from dblockrun.durations import format_duration
from dblockrun.events import SlotPassed
from dblockrun.jobs import Storm

STORM = "storm"

#: The causes of skipped slots that are the fleet's, not the job's own, and
#: count for a storm (a missed slot always counts): the fleet down, the
#: database away, a daemon late, a host dead, the fleet paused.
FLEET_CAUSES = frozenset({"down", "outage", "late", "dead-holder", "lock-held", "unclaimable",
                          "stopped"})

#: Each cause of passed slots (dblockrun/scheduling/planner.py ``Cause``) as a
#: storm's notification says it.
CAUSES = {
    "down": "no daemon ran the jobs (the fleet was down)",
    "outage": "the database could not be reached",
    "late": "the daemons woke late (stopped, suspended or overloaded)",
    "deadline": "the slots were later than their starting-deadline",
    "busy": "the jobs' previous runs were still going",
    "host-full": "every host was full (--max-running)",
    "group-full": "their groups had no free seat",
    "dead-holder": "a host died holding their locks",
    "lock-at-least": "within lock-at-least of their last starts",
    "lock-held": "their locks were held by a host that died",
    "unclaimable": "the slots could not be claimed (the fleet paused, the jobs disabled)",
    "queue-full": "newer slots took their places in the queue",
    "stopped": "the daemon stopped while the slots waited",
    "lanes-full": "every lane of the jobs was running",
}


def cause_text(cause: str) -> str:
    return CAUSES.get(cause, cause)


def message(cause: str, names: Sequence[str], settings: Storm, events: Sequence[SlotPassed],
            host: str, hostname: str | None = None) -> tuple[str, str]:
    """The title and body of a storm's one notification."""
    shown = list(names[:settings.max_names])
    more = len(names) - len(shown)
    listed = ", ".join(shown) + (f" and {more} more" if more else "")
    where = hostname or host.split(":", 1)[0]
    title = (f"dblockrun: {len(names)} jobs passed slots within "
             f"{format_duration(settings.window)}: {cause_text(cause)} ({where})")
    reasons = sorted({p.reason for p in events})
    lines = [
        f"event: {STORM}",
        f"cause: {cause} ({cause_text(cause)})",
        f"jobs: {len(names)}",
        f"names: {listed}",
        f"window: {format_duration(settings.window)}",
        f"host: {host}",
        *([f"reason: {reasons[0]}"] if reasons else []),
        "detail: each job's passed slots are recorded as usual (dblockrun history JOB); "
        "their notifications are this one",
    ]
    return title, "\n".join(lines)
