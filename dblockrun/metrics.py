"""What the daemon counts, as one interface; without ``--metrics`` it counts nothing.

The daemon's parts count through a :class:`Metrics`: claims by outcome,
went-backwards claims, notifications and pings, and (as a subscriber of the
run and slot events, dblockrun/events.py) finished runs and passed slots.
This class is that interface and its null implementation: a daemon started
without ``--metrics`` uses it as is and never imports prometheus_client
(about 14 MB of the daemon's memory, with http.server; issue 21).
``daemon --metrics ADDR`` uses :class:`dblockrun.prometheus.Prometheus`,
which keeps the counts and serves them with ``/healthz``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dblockrun.errors import UsageError

if TYPE_CHECKING:
    from dblockrun.events import Event
    from dblockrun.supervise import Threads

#: Where ``--metrics PORT`` listens when no host is given: this host only.
DEFAULT_HOST = "127.0.0.1"


class Metrics:
    """The counts of a daemon without ``--metrics``: none (every method does
    nothing). :class:`dblockrun.prometheus.Prometheus` overrides each."""

    def claimed(self, job: str, outcome: str) -> None:
        """A claim attempt: ``won``, ``lost`` (busy, disabled, another host's) or ``error``."""

    def went_backwards(self, job: str) -> None:
        """A claim whose token or slot was not newer than one this daemon had seen."""

    def sent(self, what: str, job: str, label: str, outcome: str) -> None:
        """A notification (``what`` ``notify``, ``label`` its event) or a ping
        (``what`` ``ping``, ``label`` its signal): ``sent``, ``failed`` or ``dropped``."""

    def alert(self, kind: str, state: str) -> None:
        """An alert (``late``, ``slow``, ``fast``, ``storm``) ``fired`` or
        ``cleared`` by this host, or a notification ``held`` (a failure
        before ``notify: {after: N}``) or ``collapsed`` into a storm."""

    def hear(self, event: Event) -> None:
        """A subscriber of the run and slot events (dblockrun/events.py)."""

    def watch(self, read: Callable[[], dict[str, float | None]]) -> None:
        """Values read from the daemon's state when the metrics are read."""

    def watch_threads(self, threads: Threads) -> None:
        """Each supervised thread's crashes."""


def parse_addr(addr: str) -> tuple[str, int]:
    """``--metrics [HOST:]PORT`` as (host, port); a UsageError if malformed."""
    host, _, port = addr.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise UsageError(f"--metrics {addr!r}: expected [HOST:]PORT, e.g. 127.0.0.1:9464") from None
    if not 0 <= number <= 65535:
        raise UsageError(f"--metrics {addr!r}: port out of range")
    return (host.strip("[]") or DEFAULT_HOST), number
