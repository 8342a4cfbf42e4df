"""At the start of our calls in a reused worker pyspark's daemon forked, what the process tracks is
frozen, so the daemon's per-call ``gc.collect()`` walks only what was allocated since; every
FULL_EVERY-th call collects frozen cyclic garbage itself, and nothing changes in other processes
(pyspark's streaming source runner among them, which never collects between our calls). The
daemon's collection after each call is played by ``gc.collect()``; the process's ``__main__`` and
environment by a stand-in module and ``SPARK_REUSE_WORKER``."""
from __future__ import annotations

import gc
import importlib.machinery
import sys
import types
import weakref
from collections.abc import Iterator

import pytest
from pulsartx.datasource import worker_gc


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cycle collector frees it


def _run_as(monkeypatch: pytest.MonkeyPatch, main: str, reuse: bool = True) -> None:
    """Make this process look like one pyspark started with ``python -m main``."""
    fake = types.ModuleType("__main__")
    fake.__spec__ = importlib.machinery.ModuleSpec(main, None)
    monkeypatch.setitem(sys.modules, "__main__", fake)
    if reuse:
        monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    else:
        monkeypatch.delenv("SPARK_REUSE_WORKER", raising=False)


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh call count, FULL_EVERY=3, no automatic collections (only the ones a test makes)."""
    monkeypatch.setattr(worker_gc, "_calls", 0)
    monkeypatch.setattr(worker_gc, "FULL_EVERY", 3)
    enabled = gc.isenabled()
    gc.disable()
    gc.unfreeze()
    gc.collect()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


@pytest.fixture
def worker(collector: None, monkeypatch: pytest.MonkeyPatch) -> None:
    _run_as(monkeypatch, worker_gc.DAEMON)


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


@pytest.mark.parametrize(("main", "reuse"), [
    ("pyspark.sql.streaming.python_streaming_source_runner", False),  # as pyspark starts it
    ("pyspark.sql.streaming.python_streaming_source_runner", True),
    ("pyspark.worker", True),  # a worker started without the daemon
    (worker_gc.DAEMON, False),  # a daemon worker that is not reused serves one call
])
def test_nothing_happens_where_no_collection_follows_each_call(collector: None, monkeypatch: pytest.MonkeyPatch,
                                                               main: str, reuse: bool) -> None:
    """The streaming source runner loops over latestOffset/partitions/commit for a query's life
    with no collection between them: each call's cyclic garbage stays for the automatic
    collections to free, never frozen out of their sight."""
    _run_as(monkeypatch, main, reuse)
    assert worker_gc.in_spark_worker()
    gone = []
    for _ in range(10):
        worker_gc.before_call()
        gone.append(weakref.ref(_Node()))  # the call's cyclic garbage
        assert gc.get_freeze_count() == 0
    assert worker_gc._calls == 0
    gc.collect()  # an automatic collection
    assert [g() for g in gone] == [None] * 10


def test_the_round_collects_itself_when_calls_share_a_daemon_call(worker: None) -> None:
    """The sink runner's streamWriter and commit: two calls of ours per daemon call, one
    collection after both. With FULL_EVERY=4 every round falls on the first of a pair, so an
    unfreeze alone would be refrozen by the second before any collection, and the frozen cycles
    (1,000 objects each here) would pile up for the life of the worker."""
    worker_gc.FULL_EVERY = 4
    gone: list[weakref.ref] = []
    after_round: list[int] = []
    for n in range(40):
        worker_gc.before_call()
        if n and n % 4 == 0:
            after_round.append(gc.get_freeze_count())
        head = _Node()
        head.garbage = [[] for _ in range(1_000)]  # tracked objects the cycle holds
        gone.append(weakref.ref(head))
        del head
        if n % 2 == 1:
            gc.collect()  # the daemon, after the pair
    # Freed: every cycle of a call before the last round (n=36), and each pair's second one (the
    # daemon's collection saw it before anything froze it). Alive: the first of each pair after
    # the round, frozen by the second.
    assert [n for n, g in enumerate(gone) if g() is not None] == [36, 38]
    assert max(after_round) - min(after_round) < 1_000  # not one call's garbage more, round after round
