"""Shared by the benchmarks: database URLs, a unique table prefix, tables."""

from __future__ import annotations

import os
import secrets
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dblockrun.store import Store

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
MY_HOST, MY_PORT, MY_USER, MY_DB = "127.0.0.1", 3306, "root", "test"

#: URL per backend; SQLite's lives in the given temporary folder.
URLS: dict[str, Callable[[str], str]] = {
    "postgresql": lambda _tmp: os.environ.get(
        "BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    "mariadb": lambda _tmp: os.environ.get("BENCH_MY_URL", "mysql://root@127.0.0.1:3306/test"),
    "sqlite": lambda tmp: f"sqlite:///{tmp}/bench.db",
}


def bench_prefix() -> str:
    """A table prefix no other run uses (dropped at the end of each bench)."""
    return f"bench_{os.getpid()}_{secrets.token_hex(3)}_"


def make_schema(url: str, prefix: str) -> Store:
    from dblockrun.store import Store

    store = Store(url, prefix)
    store.ensure_schema()
    return store


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def percentile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class Table:
    """A plain text table, columns right-aligned except the first."""

    def __init__(self, headers: Sequence[str]) -> None:
        self.headers = list(headers)
        self.rows: list[list[str]] = []

    def add(self, row: Sequence[object]) -> None:
        self.rows.append([str(c) for c in row])

    def lines(self) -> list[str]:
        widths = [max(len(r[i]) for r in [self.headers, *self.rows])
                  for i in range(len(self.headers))]

        def line(cells: Sequence[str]) -> str:
            out = [cells[0].ljust(widths[0])]
            out += [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
            return "  ".join(out).rstrip()

        return [line(self.headers), "  ".join("-" * w for w in widths),
                *(line(row) for row in self.rows)]

    def print(self) -> None:
        print("\n".join(self.lines()), end="\n\n", flush=True)
