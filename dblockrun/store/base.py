"""What running a claimed job needs of a store, as a protocol.

:class:`~dblockrun.store.engine.LockEngine` has it (``exec`` uses one over a
direct driver connection), and so has :class:`~dblockrun.store.Store`, which
hands these calls to its own engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


class RunStore(Protocol):
    @property
    def statements(self) -> int: ...

    def renew(self, name: str, holder: str, token: int, lease: float) -> bool: ...

    def renew_many(self, holder: str, held: Sequence[tuple[str, int]],
                   lease: float) -> set[str]: ...

    def release(self, name: str, holder: str, token: int, lock_at_least: float = 0.0) -> bool: ...

    def start_run(self, job: str, host: str, *, token: int | None, slot: float | None = None,
                  attempt: int = 1, item: str | None = None, result: str = ...) -> int: ...

    def finish_run(self, run_id: int, job: str, token: int | None, result: str,
                   exit_code: int | None, output: str | None) -> bool: ...

    def finish_and_release(self, run_id: int, job: str, holder: str, token: int, result: str,
                           exit_code: int | None, output: str | None,
                           lock_at_least: float = 0.0) -> tuple[bool, bool]: ...

    def prune_runs(self, job: str, keep: int) -> int: ...


@runtime_checkable
class Disables(Protocol):
    """A store that can disable a job (on-failure: the daemon's Store)."""

    def disable(self, name: str, *, for_seconds: float | None = None, until: float | None = None,
                reason: str | None = None) -> float: ...
