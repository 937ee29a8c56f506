"""Retry pauses (``backoff``, ``max-delay``), pure: the random draw is passed in."""

from __future__ import annotations

from dblockrun.jobs import Job
from dblockrun.running.runjob import retry_wait


def job(**keys: object) -> Job:
    return Job("j", "false", cron="@daily", retry_delay=10.0, **keys)  # type: ignore[arg-type]


def test_a_constant_delay_is_exact() -> None:
    assert [retry_wait(job(), n, lambda: 1.0) for n in (1, 2, 3)] == [10.0, 10.0, 10.0]


def test_backoff_grows_to_max_delay_with_up_to_a_fifth_less_at_random() -> None:
    grown = job(backoff=2.0, max_delay=60.0)
    assert [retry_wait(grown, n, lambda: 0.0) for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 60, 60]
    assert retry_wait(grown, 2, lambda: 1.0) == 16.0
    # No pause outlasts lock-at-most, nor overflows.
    assert retry_wait(job(backoff=100.0, lock_at_most=600.0), 500, lambda: 0.0) == 600.0
