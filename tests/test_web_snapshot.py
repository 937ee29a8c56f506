"""The shared status document of ``GET /api/v1/status``: read once for every
client, served at once while the next one is read, never older than its limit."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import wait_for

from dblockrun.web.snapshot import Snapshot


class Reader:
    """A read that counts its calls and can be held until released."""

    def __init__(self) -> None:
        self.calls = 0
        self.go = threading.Event()
        self.go.set()
        self.fail = False

    def __call__(self) -> str:
        self.go.wait(30)
        if self.fail:
            raise RuntimeError("database down")
        self.calls += 1
        return f"doc {self.calls}"


def test_one_read_serves_every_request_and_the_next_is_read_behind_them() -> None:
    read = Reader()
    snap = Snapshot(read, max_age=0.2, too_old=60)
    assert [snap.get() for _ in range(20)] == ["doc 1"] * 20
    assert read.calls == 1
    read.go.clear()  # the next read takes as long as it must

    def reading() -> bool:
        assert snap.get() == "doc 1"
        return snap._reading

    wait_for(reading, 10, what="a background read started")
    started = time.monotonic()
    assert snap.get() == "doc 1"  # served at once, not after the read
    assert time.monotonic() - started < 0.1
    read.go.set()
    wait_for(lambda: snap.get() == "doc 2", 10, what="the new document")


def test_an_action_makes_the_next_request_read_it() -> None:
    read = Reader()
    snap = Snapshot(read, max_age=60)
    assert snap.get() == "doc 1"
    snap.forget()
    assert snap.get() == "doc 2"


def test_a_document_too_old_is_never_served() -> None:
    read = Reader()
    snap = Snapshot(read, max_age=0.05, too_old=0.3)
    assert snap.get() == "doc 1"
    read.fail = True
    with pytest.raises(RuntimeError, match="database down"):
        wait_for(lambda: snap.get() and False, 10, what="the read's error")
