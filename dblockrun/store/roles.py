"""The store's roles: what each kind of consumer does with the store, as a
typing ``Protocol``, so that a consumer names the part it uses and not the
whole :class:`~dblockrun.store.store.Store` (which has them all).

- :class:`StatusReading`: what ``status``, ``history``, ``plan`` and the
  pages read (the jobs' lock rows, the runs, the live hosts, the pause and
  the drains), ``status``'s report whole (:meth:`StatusReading.status`:
  store/status.py builds its statements on the store itself, which its
  readers never see).
- :class:`Control`: what operators' commands do (dblockrun/ops/, the
  dashboard's actions, dblockrun/web/acts.py): disable and enable, run now,
  forget, force unlock, and, through :attr:`Control.control` and
  :attr:`Control.drains`, the fleet's pause, kill requests, drains and the
  audit trail; each with what it reads first.
- :class:`FleetBookkeeping`: what a daemon's bookkeeping does
  (dblockrun/daemon/fleet.py's round, the loop's start and reload): its
  host row and the live hosts, the lock rows it makes and the next due
  times it publishes, the dead holders it reaps, the gaps behind held
  locks, the fleet's key.
- :class:`Alerting`: what notifications read and claim (dblockrun/notify/):
  the alerts ledger (store/alerts.py), a run's record, a host's labels.
- The request broker: :class:`~dblockrun.store.inbox.Inbox` (and the
  :class:`~dblockrun.store.inbox.Listener` behind it), where a daemon learns
  of run-now, kill and drain announcements (store/inbox.py).
- The hot path, a claimed run's renewals, records and release and the
  slot book's writes, is :class:`~dblockrun.store.runstore.RunStore`
  (store/runstore.py), which an in-memory store has too (store/memory.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from dblockrun.store.inbox import Inbox as Inbox
from dblockrun.store.inbox import Listener as Listener

if TYPE_CHECKING:
    from dblockrun.store import models as m
    from dblockrun.store.alerts import AlertStore
    from dblockrun.store.control import Audit, ControlStore
    from dblockrun.store.drain import DrainStore
    from dblockrun.store.status import PassedSince, StatusReport, StatusSource
    from dblockrun.store.store import Store

__all__ = ["Alerting", "Control", "FleetBookkeeping", "Inbox", "Listener", "StatusReading"]


class StatusReading(Protocol):
    """What status, history, ``plan`` and the pages read."""

    #: The database URL and table prefix (as errors name them, redacted).
    url: str
    prefix: str

    def status(self, names: Sequence[str] | None = None,
               live_within: float | None = None) -> StatusReport:
        """The jobs (all, or ``names``), the live hosts (seen within
        ``live_within``; None: each by its own heartbeat), the pause and the
        groups' seats, at one database time (store/status.py)."""

    def passed_since(self, jobs: Sequence[m.JobStatus]) -> dict[str, PassedSince]:
        """Of ``jobs``, those whose slots are being recorded passed."""

    def held_rows(self) -> str | None:
        """Why another session holds the lock rows, or None."""

    @property
    def control(self) -> ControlStore:
        """The pause, kill requests and the audit trail (store/control.py)."""

    @property
    def drains(self) -> DrainStore:
        """The drained hosts (store/drain.py)."""

    def live_hosts(self, within: float | None = None) -> list[m.HostStatus]: ...

    def host_fields(self, ids: list[str]) -> dict[str, str | None]: ...

    def run(self, run_id: int) -> m.RunRecord | None: ...

    def db_now(self) -> float: ...

    def fleet_key(self) -> bytes: ...

    def job_names(self) -> list[str]: ...

    def with_every_host(self, names: Sequence[str]) -> list[str]: ...

    def lock_state(self, name: str) -> m.LockState | None: ...

    def lock_states(self) -> tuple[dict[str, m.LockState], float]: ...

    def hosts(self, seen_within: float | None = None) -> list[m.HostStatus]: ...

    def history(self, job: str | None = None, limit: int = 20,
                item: str | None = None, *, output: bool = True) -> list[m.RunRecord]: ...

    def runs_between(self, start: float, end: float, limit: int) -> list[m.Span]: ...

    def slot_records(self, job: str, first: float, last: float) -> list[m.SlotRecord]: ...


class Control(StatusReading, Protocol):
    """What operators' commands do; the pause, kill requests and the audit
    trail through :attr:`control`, drains through :attr:`drains`."""

    def disable(self, name: str, *, for_seconds: float | None = None, until: float | None = None,
                reason: str | None = None, audit: Audit | None = None) -> m.Disabled: ...

    def enable(self, name: str, audit: Audit | None = None) -> bool | None: ...

    def request_run(self, name: str, audit: Audit | None = None) -> None: ...

    def cancel_request(self, name: str, audit: Audit | None = None) -> bool | None: ...

    def forget(self, rows: Sequence[str], audit: Audit | None = None
               ) -> tuple[int, int] | None: ...

    def force_unlock(self, name: str, audit: Audit | None = None) -> int | None: ...


class HeldGaps(Protocol):
    """What the bookkeeping reads and marks of the held gaps: the slots a
    claim moved a job on over while a lock (a dead holder's, a lock-at-least
    window, a retry's delay) kept them from every host (``FleetBooks``'
    ``held_slots``; recorded through the slot book, :class:`RunStore`'s
    ``record_slots`` with ``gap_of``). The in-memory store plays it too
    (dblockrun/store/memory.py; tests/test_heldgaps_contract.py)."""

    def held_gaps(self) -> list[m.HeldGap]:
        """The rows whose last slot claim moved on from ``after`` (the slot
        before) over a lock held a second or more past it, not looked at yet."""

    def held_gaps_seen(self, gaps: Sequence[m.HeldGap]) -> None:
        """Mark ``gaps`` looked at, each while its claim's token is still the
        row's (a later claim's gap stays)."""

    def record_slots_in(self, job: str, after: float,
                        upto: float) -> tuple[set[float], list[tuple[float, float]]]:
        """The slots in (``after``, ``upto``] the job has a record of, and
        the ranges (first, last) of its summary records that reach into it."""


class FleetBookkeeping(HeldGaps, Protocol):
    """What a daemon's bookkeeping does."""

    @property
    def control(self) -> ControlStore:
        """Where the round starts to read the actions daemons log."""

    @property
    def drains(self) -> DrainStore:
        """This host's drain, read when one is announced (daemon/drain.py)."""

    def books_round(self, host_id: str, *, hostname: str, pid: int, version: str,
                    clock_offset: float | None, running: int, jobs: str | None,
                    within: float, labels: str | None = None,
                    targets: str | None = None, heartbeat: float | None = None,
                    audit_after: int = 0, fields: str | None = None) -> m.BooksRound: ...

    def clock_sample(self) -> m.ClockSample: ...

    def remove_host(self, host_id: str) -> None: ...

    def hosts(self, seen_within: float | None = None) -> list[m.HostStatus]: ...

    def host_fields(self, ids: list[str]) -> dict[str, str | None]: ...

    def fleet_key(self) -> bytes: ...

    def ensure_jobs(self, names: Iterable[str]) -> None: ...

    def ensure_every_host(self, rows: Sequence[tuple[str, str]]) -> None: ...

    def set_next_due(self, names_due: dict[str, float]) -> None: ...

    def lock_state(self, name: str) -> m.LockState | None: ...

    def lock_states(self) -> tuple[dict[str, m.LockState], float]: ...

    def log_bad_tokens(self, names: Iterable[str]) -> None:
        """Log each of ``names`` whose lock row's token no claim takes (edited
        by hand), once per job, saying how to repair it."""

    def sweep_lost(self, recorder: str = "?") -> list[m.LostRun]: ...

    def release(self, name: str, holder: str, token: int, lock_at_least: float = 0.0) -> bool:
        """A run the sweep recorded lost: its lock held until its
        ``lock_at_least`` is over, as the run's end would have held it."""

    def trim_pool(self) -> bool: ...


class Alerting(Protocol):
    """What notifications read and claim: each ``expect:`` alert and storm
    claimed in the alerts ledger, so one host sends it."""

    @property
    def alerts(self) -> AlertStore: ...

    def run(self, run_id: int) -> m.RunRecord | None: ...

    def host_labels(self, host_id: str) -> str | None: ...

    def previous_result(self, job: str, before_id: int) -> str | None: ...


if TYPE_CHECKING:  # the store plays every role: mypy checks it here
    def _plays(store: Store) -> tuple[StatusReading, Control, FleetBookkeeping, Alerting,
                                      StatusSource]:
        return store, store, store, store, store
