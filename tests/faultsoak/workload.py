"""The soak's jobs file, the command every job runs, and that command's log.

Every command is `soak-cmd.sh SECONDS [fail-first]`: it appends a `start`
line, sleeps, and appends an `end` line (also when stopped by SIGTERM), each
one `printf` of bash (a single small O_APPEND write: lines of concurrent
commands never interleave):

    start|end  REAL_TIME  JOB  HOST  SLOT  ITEM  TOKEN  RUN_ID  STATUS

``REAL_TIME`` is bash's ``$EPOCHREALTIME`` on the machine's real clock: the
jobs set ``LD_PRELOAD`` empty, so a command of a daemon whose clock the
nemesis shifted (libfaketime) does not inherit the shift. The database
servers are local, so the database clock in the records and this clock are
the same clock and the checker can compare them. ``HOST`` is the daemon's
``hostname`` label (its every-host rows are ``JOB@HOST``); ``SLOT`` and
``ITEM`` are ``-`` where the run has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

#: Daemon options of the soak fleet: failover within seconds.
HEARTBEAT = 1.0
LEASE = 3.0
GRACE = 2.0

SCRIPT = """\
#!/bin/bash
# soak-cmd.sh SECONDS [fail-first]: log start and end, sleep SECONDS between.
log() {
  printf '%s %s %s %s %s %s %s %s %s\\n' "$1" "$EPOCHREALTIME" "$DBLOCKRUN_JOB" "$SOAK_HOST" \\
    "${DBLOCKRUN_SLOT:--}" "${DBLOCKRUN_ITEM:--}" "$DBLOCKRUN_FENCING_TOKEN" \\
    "$DBLOCKRUN_RUN_ID" "$2" >> "$SOAK_LOG"
}
trap 'log end 143; exit 143' TERM INT
log start -
status=0
if [ "$2" = fail-first ]; then
  marker="$SOAK_DIR/attempted.$DBLOCKRUN_JOB.$DBLOCKRUN_FENCING_TOKEN"
  [ -e "$marker" ] || { : > "$marker"; status=1; }
fi
sleep "$1" & wait $!
log end "$status"
exit "$status"
"""


@dataclass(frozen=True)
class JobSpec:
    """What the checker needs to know of one job of the file."""

    name: str
    cron: str | None = None
    rate: float | None = None
    lock_at_least: float = 0.0
    group: str | None = None
    every_host: bool = False
    items: tuple[str, ...] = ()
    retries: int = 0
    #: Every slot in the window must have exactly one record (a plain cron
    #: job; not one whose rate refuses slots, nor a fan-out job, whose items
    #: run at most once per slot).
    every_slot: bool = True


GROUP = "g"
GROUP_LIMIT = 1

#: The mix: a per-second cron job, a rate job, cron + rate, lock-at-least, two
#: jobs of a group of one seat, an every-host job, a fan-out job and a job
#: that fails its first attempt and is retried.
SPECS = (
    JobSpec("tick", cron="* * * * * *"),
    JobSpec("rate", rate=2.0, every_slot=False),
    JobSpec("cron-rate", cron="*/2 * * * * *", rate=5.0, every_slot=False),
    JobSpec("at-least", cron="*/2 * * * * *", lock_at_least=4.0),
    JobSpec("group-a", cron="*/2 * * * * *", group=GROUP),
    JobSpec("group-b", cron="1-59/2 * * * * *", group=GROUP),
    JobSpec("every-host", cron="*/2 * * * * *", every_host=True),
    JobSpec("fan-out", cron="*/3 * * * * *", items=("i1", "i2", "i3", "i4", "i5"),
            every_slot=False),
    JobSpec("retry", cron="*/2 * * * * *", retries=1),
)

SPEC = {s.name: s for s in SPECS}

#: The job body per job: `key: value` lines after `cron`/`rate` (indented 4).
BODIES = {
    "tick": "command: [/bin/bash, {script}, '0.2']",
    "rate": "command: [/bin/bash, {script}, '0.3']",
    "cron-rate": "command: [/bin/bash, {script}, '0.3']",
    "at-least": "lock-at-least: 4s\n    command: [/bin/bash, {script}, '0.2']",
    "group-a": "group: g\n    command: [/bin/bash, {script}, '1.5']",
    "group-b": "group: g\n    command: [/bin/bash, {script}, '1.5']",
    "every-host": "on: every-host\n    command: [/bin/bash, {script}, '0.2']",
    "fan-out": ("items: [i1, i2, i3, i4, i5]\n    parallel: 2\n"
                "    command: [/bin/bash, {script}, '0.4']"),
    "retry": ("retries: 1\n    retry-delay: 250ms\n"
              "    command: [/bin/bash, {script}, '0.2', fail-first]"),
}


def jobs_yaml(script: Path, generation: int = 0) -> str:
    """The jobs file; ``generation`` (bumped by each reload the nemesis
    makes) changes a description only: what is due stays the same."""
    lines = [
        "groups:",
        f"  {GROUP}: {GROUP_LIMIT}",
        "defaults:",
        "  lock-at-most: 20s",
        "  history-limit: 1000000",
        "  env: {LD_PRELOAD: '', FAKETIME: ''}",
        "jobs:",
    ]
    for spec in SPECS:
        lines.append(f"  {spec.name}:")
        if spec.name == "tick":
            lines.append(f"    description: reloaded {generation} times")
        if spec.cron is not None:
            lines.append(f"    cron: \"{spec.cron}\"")
        if spec.rate is not None:
            lines.append(f"    rate: {spec.rate:g}s")
        lines.append("    " + BODIES[spec.name].format(script=script))
    return "\n".join(lines) + "\n"


@dataclass
class Command:
    """One invocation of a command, as it logged itself."""

    job: str  # the name in the file
    host: str  # the daemon's hostname label
    slot: float | None
    item: str | None
    token: int
    run_id: int
    start: float
    end: float | None = None
    status: str | None = None

    @property
    def row(self) -> str:
        """The lock row it ran under: ``JOB``, ``JOB@HOST``, ``JOB/ITEM``."""
        if SPEC[self.job].every_host:
            return f"{self.job}@{self.host}"
        return self.job if self.item is None else f"{self.job}/{self.item}"


def parse_slot(text: str) -> float | None:
    return None if text == "-" else datetime.fromisoformat(text).timestamp()


def slot_text(slot: float | None) -> str:
    """As ``DBLOCKRUN_SLOT`` reads (``-``: none)."""
    if slot is None:
        return "-"
    return datetime.fromtimestamp(slot, UTC).isoformat().replace("+00:00", "Z")


def read_commands(log: Path) -> tuple[list[Command], list[str]]:
    """The commands of the log, and the lines that made no sense (an end
    without a start, a torn line, a run id two commands claim)."""
    commands: dict[tuple[str, ...], Command] = {}
    bad: list[str] = []
    if not log.exists():
        return [], []
    for raw in log.read_text().splitlines():
        parts = raw.split()
        if len(parts) != 9 or parts[0] not in ("start", "end"):
            bad.append(f"torn command log line {raw!r}")
            continue
        kind, at, job, host, slot, item, token, run_id, status = parts
        key = (job, host, slot, item, token, run_id)
        if kind == "start":
            if key in commands:
                bad.append(f"two commands started as {' '.join(key)}")
                continue
            commands[key] = Command(job, host, parse_slot(slot), None if item == "-" else item,
                                    int(token), int(run_id), float(at))
        elif key not in commands:
            bad.append(f"an end line with no start: {raw!r}")
        else:
            commands[key].end = float(at)
            commands[key].status = status
    runs: dict[int, list[Command]] = {}
    for c in commands.values():
        runs.setdefault(c.run_id, []).append(c)
    for rid, cs in sorted(runs.items()):
        if len(cs) > 1:
            bad.append(f"run id {rid} was given to {len(cs)} commands: " + ", ".join(
                f"{c.row} slot {slot_text(c.slot)} on {c.host}"
                for c in cs))
    return sorted(commands.values(), key=lambda c: c.start), bad
