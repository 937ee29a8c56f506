"""Calls from many threads sent as one (dblockrun/store/executor.py: Together)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from helpers import wait_for

from dblockrun.store.executor import Together


def test_calls_while_one_is_sent_go_in_the_next_send_each_with_its_own_answer() -> None:
    gate, sends = threading.Event(), []

    def send(args: Sequence[int]) -> list[int]:
        sends.append(list(args))
        if len(sends) == 1:
            gate.wait(10)
        return [a * 10 for a in args]

    together: Together[int, int] = Together(send)
    got: dict[int, int] = {}

    def call(n: int) -> None:
        got[n] = together(n)

    first = threading.Thread(target=call, args=(0,))
    first.start()
    wait_for(lambda: len(sends) == 1, 10)
    rest = [threading.Thread(target=call, args=(n,)) for n in range(1, 5)]
    for t in rest:
        t.start()
    wait_for(lambda: len(together._waiting) == 4, 10)
    gate.set()
    for t in [first, *rest]:
        t.join(10)
    assert got == {n: n * 10 for n in range(5)}
    assert sends[0] == [0] and sorted(sends[1]) == [1, 2, 3, 4] and len(sends) == 2
    assert together(7) == 70  # alone: at once


def test_a_failed_send_fails_each_of_its_calls_and_the_next_is_sent() -> None:
    calls = 0

    def send(args: Sequence[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("away")
        return list(args)

    together: Together[int, int] = Together(send)
    with pytest.raises(OSError, match="away"):
        together(1)
    assert together(2) == 2
