"""Signal handlers installed for a block and restored after it."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Any

Handler = Callable[[int], None]


@contextmanager
def handling(handlers: Mapping[int, Handler]) -> Iterator[None]:
    """Route the given signals to ``handlers`` inside the block."""
    previous: dict[int, Any] = {}

    def make(fn: Handler) -> Callable[[int, FrameType | None], None]:
        return lambda signum, _frame: fn(signum)

    for sig, fn in handlers.items():
        previous[sig] = signal.signal(sig, make(fn))
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
