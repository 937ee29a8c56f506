"""The lock store: schema, dialects and every SQL statement.

:class:`Store` (SQLAlchemy) is imported on first use, so that the light
modules of this package (``models``, ``queries``, ``engine``: ``exec``'s
path) load without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dblockrun.store.store import DEFAULT_PREFIX, FOREVER, Store

__all__ = ["DEFAULT_PREFIX", "FOREVER", "Store"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from dblockrun.store import store

        value = getattr(store, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dblockrun.store' has no attribute {name!r}")
