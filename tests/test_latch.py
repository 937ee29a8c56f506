"""The run path's one-way flag (dblockrun/latch.py): every waiter goes on once it
is set, before or after, and a wait with a timeout says whether it was."""

from __future__ import annotations

import threading

from dblockrun.latch import Latch


def test_every_waiter_goes_on_once_set_and_a_timed_wait_says_whether() -> None:
    latch = Latch()
    assert not latch.is_set()
    assert latch.wait(0.01) is False  # not set: the timeout passes
    woke: list[bool] = []
    waiters = [threading.Thread(target=lambda: woke.append(latch.wait(30))) for _ in range(5)]
    for t in waiters:
        t.start()
    setters = [threading.Thread(target=latch.set) for _ in range(3)]  # set at once, thrice
    for t in setters:
        t.start()
    for t in setters + waiters:
        t.join(30)
    assert woke == [True] * 5
    assert latch.is_set() and latch.wait() and latch.wait(0)
