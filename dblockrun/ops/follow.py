"""``dblockrun tail``: follow a running run's output from any host.

While a run goes, its holder writes the newest 64 KiB of its command's
output to the run's record with each lease renewal (dblockrun/running/heartbeat.py),
only when it grew: ``runs.output`` of a ``running`` run is its live tail,
and the run's result replaces it with the stored output. Following is
reading that record until the run ends, printing what each read adds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from dblockrun.errors import DblockrunError, UsageError
from dblockrun.ops.actions import no_such_job
from dblockrun.store.models import UNFINISHED, RunRecord

if TYPE_CHECKING:
    from dblockrun.store.roles import StatusReading

#: How often ``tail`` reads the run (its holder writes once a heartbeat).
FOLLOW_POLL = 0.5


def grown(before: str, now: str) -> str:
    """What the tail ``now`` adds to ``before``, an earlier tail of the same
    output: all of ``now`` past the longest end of ``before`` it starts
    with (a tail that slid on past 64 KiB starts inside ``before``).
    Output repeating itself exactly across a whole tail cannot be told
    from no output, and shows as none."""
    if now.startswith(before):
        return now[len(before):]
    # The longest suffix of `before` that is a prefix of `now`: the prefix
    # function of now + NUL + before (stored output has no NUL: it is U+FFFD).
    text = now + "\x00" + before
    border = [0] * len(text)
    for i in range(1, len(text)):
        k = border[i - 1]
        while k and text[i] != text[k]:
            k = border[k - 1]
        if text[i] == text[k]:
            k += 1
        border[i] = k
    return now[border[-1]:]


def running_run(store: StatusReading, job: str) -> RunRecord:
    """The run of ``job`` (an every-host job: of any host) running now."""
    rows = store.with_every_host([job])
    if store.lock_state(job) is None:
        raise no_such_job(store, [job])
    runs = [run for row in rows for run in store.control.running(row)]
    if len(runs) > 1:
        ids = ", ".join(f"{r.id} ({r.job}{f' item {r.item}' if r.item else ''} on {r.host})"
                        for r in runs)
        raise UsageError(f"{job} has {len(runs)} runs running: {ids}; give --run ID")
    if not runs:
        last = store.history(job, 1, output=False)
        was = (f"; its last, run {last[0].id}, ended {last[0].result} "
               f"(`dblockrun history --output {last[0].id}` shows its output)"
               if last and last[0].result not in UNFINISHED else "")
        raise DblockrunError(f"no run of {job} is running{was}")
    return runs[0]


def follow(store: StatusReading, run_id: int, write: Callable[[str], None],
           poll: float = FOLLOW_POLL) -> RunRecord:
    """Write the output of run ``run_id`` as it grows (all of it so far
    first), until the run ended: the run as it ended (its stored output
    written to the end). Ctrl-C stops following (KeyboardInterrupt)."""
    shown = ""
    while True:
        run = store.run(run_id)
        if run is None:
            raise DblockrunError(f"run {run_id} is gone from the database (forgotten or pruned)")
        text = run.output or ""
        if text != shown:
            write(grown(shown, text))
            shown = text
        if run.result not in UNFINISHED:  # waiting: its command is still to come
            return run
        time.sleep(poll)
