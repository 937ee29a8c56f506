"""What running a claimed job needs of a store, as a protocol.

:class:`~dblockrun.store.Store` (SQLAlchemy) has it all; the lean store of
``exec`` (:mod:`dblockrun.store.lean`) has it without importing SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from dblockrun.store import models as m


class RunStore(Protocol):
    statements: int

    def ensure_jobs(self, names: Iterable[str]) -> None: ...

    def claim(self, name: str, holder: str, lease: float) -> int | None: ...

    def renew(self, name: str, holder: str, token: int, lease: float) -> bool: ...

    def release(self, name: str, holder: str, token: int, lock_at_least: float = 0.0) -> bool: ...

    def start_run(self, job: str, host: str, *, token: int | None, slot: float | None = None,
                  attempt: int = 1, item: str | None = None, result: str = ...) -> int: ...

    def finish_run(self, run_id: int, job: str, token: int | None, result: str,
                   exit_code: int | None, output: str | None) -> bool: ...

    def prune_runs(self, job: str, keep: int) -> int: ...

    def disable(self, name: str, *, for_seconds: float | None = None, until: float | None = None,
                reason: str | None = None) -> float: ...

    def lock_state(self, name: str) -> m.LockState | None: ...

    def close(self) -> None: ...


@runtime_checkable
class FinishAndRelease(Protocol):
    """A store that records a run's result and releases its lock in one round trip."""

    def finish_and_release(self, run_id: int, job: str, holder: str, token: int, result: str,
                           exit_code: int | None, output: str | None,
                           lock_at_least: float = 0.0) -> tuple[bool, bool]: ...
