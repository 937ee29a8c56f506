"""dblockrun: a cron replacement for fleets, locked in a shared SQL database.

The Python API (:func:`lock`, :func:`locked`, :class:`Lease`, :class:`LockBusy`,
:class:`LockLost`) lives in :mod:`dblockrun.api`; it is imported on first use,
so ``import dblockrun`` stays light (no SQLAlchemy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from dblockrun.api import Lease, LockBusy, LockLost, close_stores, lock, locked

__all__ = ["Lease", "LockBusy", "LockLost", "__version__", "close_stores", "lock", "locked"]

_LAZY = frozenset({"Lease", "LockBusy", "LockLost", "close_stores", "lock", "locked"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from dblockrun import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dblockrun' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
