"""After our calls in a pyspark worker, what survives a full collection is frozen, so pyspark's
per-call ``gc.collect()`` walks only what was allocated since; frozen cyclic garbage is found by
the next full round, and nothing changes outside pyspark workers."""
from __future__ import annotations

import gc
import weakref

import pytest
from pulsartx.datasource import worker_gc


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cycle collector frees it


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(worker_gc, "in_spark_worker", lambda: True)
    monkeypatch.setattr(worker_gc, "_calls", 0)
    monkeypatch.setattr(worker_gc, "FULL_EVERY", 3)
    yield
    gc.unfreeze()


def test_survivors_are_frozen_and_frozen_cycles_go_at_the_next_full_round(worker: None) -> None:
    cycle = _Node()
    gone = weakref.ref(cycle)
    worker_gc.after_call()  # call 0: full collection, then freeze
    assert gc.get_freeze_count() > 0
    del cycle  # garbage now, but frozen: the per-call collection does not see it
    gc.collect()
    worker_gc.after_call()  # call 1
    worker_gc.after_call()  # call 2
    gc.collect()
    assert gone() is not None
    worker_gc.after_call()  # call 3: unfreeze, full collection, freeze
    assert gone() is None


def test_frozen_objects_are_still_freed_by_reference_counting(worker: None) -> None:
    class Plain:
        pass

    obj = Plain()
    gone = weakref.ref(obj)
    worker_gc.after_call()  # obj is frozen now
    del obj
    assert gone() is None


def test_nothing_happens_outside_pyspark_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_gc, "_calls", 0)
    before = gc.get_freeze_count()
    worker_gc.after_call()
    assert gc.get_freeze_count() == before
