"""``dblockrun drain HOST`` and ``undrain HOST``: take one host out of
rotation and put it back, from any host (the statements: store/drain.py).

A host is named as its daemon names itself: its ``hostname`` label
(``--label hostname=NAME``, else the machine's name), which also names its
every-host rows (``JOB@HOST``) and begins its holder id (``HOST:pid:random``).
Draining a name no live daemon has is refused (a typo would drain nothing
while the host it meant kept running), naming the live hosts, unless
``--force`` (to drain a host before its daemon starts or while it is down).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dblockrun.errors import UsageError
from dblockrun.scheduling.targeting import check_word
from dblockrun.store import models as m
from dblockrun.store.control import Audit
from dblockrun.store.status import host_name
from dblockrun.store.store import FOREVER
from dblockrun.timetext import ago, stamp

if TYPE_CHECKING:
    from dblockrun.store.roles import Control, StatusReading

#: How often ``drain --wait`` looks at the host's runs.
WAIT_POLL = 0.5


def live_names(store: StatusReading) -> list[str]:
    """The names of the live hosts, sorted, each once."""
    return sorted({host_name(h) for h in store.live_hosts()})


def check_host(host: str) -> str:
    try:
        return check_word(host, "host name")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def drain(store: Control, host: str, entry: Audit, for_seconds: float | None,
          *, force: bool = False) -> m.Drain:
    """Drain ``host``: refused (UsageError, exit 2) when no live daemon
    has that name, unless ``force``."""
    check_host(host)
    if not force:
        live = live_names(store)
        if host not in live:
            hosts = ", ".join(live) if live else "none"
            raise UsageError(f"no live host is named {host!r} (live hosts: {hosts}); "
                             "--force drains it anyway (a host that is down or not started)")
    return store.drains.drain(host, entry, for_seconds)


def undrain(store: Control, host: str, entry: Audit) -> m.Drain | None:
    return store.drains.undrain(check_host(host), entry)


def until_text(drain: m.Drain) -> str:
    return "until undrained" if drain.ends >= FOREVER else f"until {stamp(drain.ends)}"


def drained_line(drain: m.Drain, where: str, running: int) -> str:
    """What ``drain`` says once done."""
    going = (f"; {running} run{'s' if running != 1 else ''} still going there will finish"
             if running else "; nothing runs there now")
    return (f"host {drain.host} drained {until_text(drain)} in {where}: it starts nothing "
            f"new, the other hosts take its slots{going}")


def host_runs(store: StatusReading, host: str) -> list[m.RunRecord]:
    """The runs going on ``host`` (running or waiting under a live lease)."""
    prefix = f"{host}:"
    return [r for r in store.control.running() if r.host.startswith(prefix)]


def run_text(run: m.RunRecord, now: float) -> str:
    item = f" (item {run.item})" if run.item is not None else ""
    return (f"{run.job}{item}: run {run.id}, {run.result} for "
            f"{ago(max(0.0, now - run.started))}")


@dataclass(frozen=True)
class Waited:
    """What ``drain --wait`` saw: the runs it waited for (None: none)."""

    runs: list[m.RunRecord]
    seconds: float


def wait_for_runs(store: StatusReading, host: str, say: Callable[[str], None],
                  timeout: float | None = None) -> Waited:
    """Wait until no run goes on ``host``, saying what it waits for each
    time that changes; TimeoutError after ``timeout`` seconds."""
    start = time.monotonic()
    seen: dict[int, m.RunRecord] = {}
    shown: set[int] | None = None
    while runs := host_runs(store, host):
        ids = {r.id for r in runs}
        if ids != shown:
            now = store.db_now()
            say(f"waiting for {len(runs)} run{'s' if len(runs) != 1 else ''} on {host}: "
                + "; ".join(run_text(r, now) for r in runs))
            shown = ids
        seen.update((r.id, r) for r in runs)
        if timeout is not None and time.monotonic() - start > timeout:
            raise TimeoutError(f"{len(runs)} run(s) still going on {host} after "
                               f"{ago(timeout)}")
        time.sleep(WAIT_POLL)
    return Waited(list(seen.values()), time.monotonic() - start)
