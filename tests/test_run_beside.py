"""``run_beside``: independent protocol steps side by side, every one run exactly once, the first
error raised after all ended, and calls nested in a helper's job never deadlocking the pool."""
from __future__ import annotations

import threading

import pytest

from pulsartx.client import transaction


def test_nested_calls_finish_with_a_single_helper(one_helper):
    """A commit flushes its producers beside each other and each producer its queues: with the
    helpers all inside outer jobs, the inner jobs queued behind them would never start."""
    ran: list[str] = []
    lock = threading.Lock()

    def leaf(name: str) -> None:
        with lock:
            ran.append(name)

    def outer(i: int) -> None:
        transaction.run_beside([lambda j=j: leaf(f"{i}.{j}") for j in range(3)])

    worker = threading.Thread(target=lambda: transaction.run_beside([lambda i=i: outer(i) for i in range(3)]),
                              daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "run_beside deadlocked"
    assert sorted(ran) == [f"{i}.{j}" for i in range(3) for j in range(3)]


def test_every_job_runs_once_and_the_first_error_is_raised_after_all_ended(one_helper):
    ran: list[int] = []

    def job(i: int) -> None:
        ran.append(i)
        if i in (1, 3):
            raise ValueError(f"job {i}")

    with pytest.raises(ValueError, match="job 1"):
        transaction.run_beside([lambda i=i: job(i) for i in range(5)])
    assert sorted(ran) == [0, 1, 2, 3, 4]
