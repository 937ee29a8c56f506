"""What a run may ask of a store beyond its role
(:class:`~dblockrun.store.runstore.RunStore`, the hot path's statements):
looked for at run time, as only some stores have it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Disables(Protocol):
    """A store that can disable a job (on-failure: the daemon's Store)."""

    def disable(self, name: str, *, for_seconds: float | None = None, until: float | None = None,
                reason: str | None = None) -> float: ...
