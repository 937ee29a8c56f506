"""The lock store: schema, dialects and every SQL statement."""

from dblockrun.store.store import DEFAULT_PREFIX, FOREVER, Store

__all__ = ["DEFAULT_PREFIX", "FOREVER", "Store"]
