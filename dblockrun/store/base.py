"""What running a claimed job needs of a store: the lock engine's run
statements. :class:`~dblockrun.store.engine.LockEngine` has them (``exec``
uses one over a direct driver connection), and so has
:class:`~dblockrun.store.Store`, which hands them to its own engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

if TYPE_CHECKING:
    from dblockrun.store.engine import LockEngine
    from dblockrun.store.store import Store

RunStore: TypeAlias = "LockEngine | Store"


@runtime_checkable
class Disables(Protocol):
    """A store that can disable a job (on-failure: the daemon's Store)."""

    def disable(self, name: str, *, for_seconds: float | None = None, until: float | None = None,
                reason: str | None = None) -> float: ...
