"""At the start of our calls in a reused pyspark worker, what the process tracks is frozen, so
pyspark's per-call ``gc.collect()`` walks only what was allocated since; frozen cyclic garbage is
found after every FULL_EVERY-th call, and nothing changes outside pyspark workers. pyspark's
daemon collection after each call is played by ``gc.collect()``."""
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
    gc.unfreeze()
    yield
    gc.unfreeze()


def call() -> None:
    """One outermost call, then the daemon's collection."""
    worker_gc.before_call()
    gc.collect()


def test_a_workers_first_call_freezes_nothing(worker: None) -> None:
    call()
    assert gc.get_freeze_count() == 0


def test_later_calls_freeze_and_frozen_cycles_go_after_the_full_round(worker: None) -> None:
    call()  # call 0: nothing
    cycle = _Node()
    gone = weakref.ref(cycle)
    call()  # call 1: freezes, the cycle included
    assert gc.get_freeze_count() > 0
    del cycle  # garbage now, but frozen: the daemon's collection does not see it
    call()  # call 2
    assert gone() is not None
    call()  # call 3: unfreezes, so the collection after it walks everything
    assert gone() is None


def test_frozen_objects_are_still_freed_by_reference_counting(worker: None) -> None:
    class Plain:
        pass

    call()
    obj = Plain()
    gone = weakref.ref(obj)
    call()  # obj is frozen now
    assert gc.get_freeze_count() > 0
    del obj
    assert gone() is None


def test_nothing_happens_outside_pyspark_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_gc, "_calls", 5)
    before = gc.get_freeze_count()
    worker_gc.before_call()
    assert gc.get_freeze_count() == before and worker_gc._calls == 5
