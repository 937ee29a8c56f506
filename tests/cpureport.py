"""What each test costs the machine's cores, printed at the end of the run.

The suite is CPU-bound on CI's two cores (docs/development.md), so the
figure that says where to cut is CPU time, not wall time (``--durations``
shows that one). For each test, from its setup to the end of its teardown:
the CPU time of the pytest process itself and of the processes it started
and reaped (``RUSAGE_CHILDREN``: a daemon stopped in the test's teardown,
with the spawn service and commands it reaped). The database servers' own
CPU is not in it.

Each worker attaches its figure to the teardown report (``user_properties``,
which pytest-xdist carries to the controller); the controller prints the
files and the tests that cost most, and the total.
"""

from __future__ import annotations

import resource
import sys
from collections import defaultdict
from collections.abc import Generator
from typing import Any

import pytest

#: The user property that carries a test's CPU seconds.
KEY = "cpu_seconds"
_START = pytest.StashKey[float]()


def cpu_now() -> float:
    """CPU seconds of this process and its reaped children so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, Any, None]:
    if call.when == "setup":
        item.stash[_START] = cpu_now()
    outcome = yield
    if call.when == "teardown" and _START in item.stash:
        report: pytest.TestReport = outcome.get_result()
        report.user_properties.append((KEY, cpu_now() - item.stash[_START]))


class CpuSummary:
    """The controller's tally (or the only process's, without xdist)."""

    def __init__(self) -> None:
        self.tests: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        for name, value in report.user_properties:
            if name == KEY and isinstance(value, float):
                self.tests[report.nodeid] = value

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.tests:
            return
        files: dict[str, float] = defaultdict(float)
        for nodeid, seconds in self.tests.items():
            files[nodeid.split("::")[0]] += seconds
        total = sum(self.tests.values())
        write = terminalreporter.write_line
        terminalreporter.section("CPU per test (pytest and the processes it reaped)")
        write(f"{total / 60:.1f} CPU-minutes in {len(self.tests)} tests")
        write("files:")
        for path, seconds in sorted(files.items(), key=lambda kv: -kv[1])[:15]:
            write(f"  {seconds:8.1f} s  {100 * seconds / total:4.1f} %  {path}")
        write("tests:")
        for nodeid, seconds in sorted(self.tests.items(), key=lambda kv: -kv[1])[:15]:
            write(f"  {seconds:8.1f} s  {nodeid}")


def register(config: pytest.Config) -> None:
    """The measure on every process that runs tests, the tally on the one
    that reports (not on an xdist worker)."""
    config.pluginmanager.register(sys.modules[__name__], "dblockrun-cpu")
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(CpuSummary(), "dblockrun-cpu-summary")
