"""Keep pyspark's per-call garbage collection cheap in the workers that run our code.

pyspark's daemon runs a full ``gc.collect()`` in a reused worker after every call it serves
(``pyspark/daemon.py``): after a task's ``write``, after the streaming sink runner's ``commit``,
after the planner's ``streamWriter``. A full collection walks every object the process tracks,
and a worker that has imported pulsartx (pyarrow, deltalake, the TC and log caches) tracks
50,000-90,000: 20-45 ms of CPU each time, run just as the worker hands its answer back, so it
competes with the driver's next phase on the same cores (a streaming batch's ``commitOffsets``).

So at the start of an outermost Spark-facing call in a reused worker the daemon forked, the
objects the process tracks are frozen (``gc.freeze``, which only moves a list): they go to the
permanent generation, which collections skip, and the daemon's collection after the call walks
only what was allocated since (0.1 ms instead of 20-45). Usually the daemon's collection after the
previous call has just run, so what is frozen is live. Freezing keeps nothing alive: frozen objects
are still freed by reference counting; only cyclic garbage among them waits for the next full
collection. Every :data:`FULL_EVERY`-th call runs that collection itself (unfreeze, collect,
freeze again), which bounds such garbage by that many calls' worth even where no daemon collection
follows the call at once: the sink runner's ``streamWriter`` and ``commit`` are two of our calls in
one daemon call, so an unfreeze alone on the round's call could be undone by the next call's freeze
before any collection, every round (always on ``streamWriter`` where a worker serves only those
pairs and ``FULL_EVERY`` is even), and the frozen garbage would never be walked. A worker's first call
does nothing: a process that serves one call pays nothing.

Only there: pyspark also starts processes outside its daemon, which loop over calls of ours with
no collection between them (the streaming source runner, ``latestOffset``/``partitions``/
``commit`` for a query's life). Freezing there would freeze each call's uncollected cyclic
garbage, which the automatic collections then never see; they keep their collector as it is.

Stdlib only (imported by :mod:`pulsartx.datasource.errors`, which Spark's data-source discovery
imports in every session).
"""
from __future__ import annotations

import gc
import os
import sys
import threading

FULL_EVERY = 200  # outermost calls between two full collections in one worker
DAEMON = "pyspark.daemon"  # the ``__main__`` of the workers pyspark's daemon forks
_lock = threading.Lock()
_calls = 0


def _main_module() -> str:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) or ""


def in_spark_worker() -> bool:
    """True in a process pyspark started (its ``__main__`` is a ``pyspark.`` module)."""
    return _main_module().startswith("pyspark.")


def in_reused_daemon_worker() -> bool:
    """True in a worker pyspark's daemon forked and reuses, which runs ``gc.collect()`` after each
    call it serves there (``pyspark/daemon.py``, reading the same variable): the premise of freezing."""
    return _main_module() == DAEMON and bool(os.environ.get("SPARK_REUSE_WORKER"))


def before_call() -> None:
    """At the start of an outermost Spark-facing call (see the module docstring). Nothing happens
    outside reused daemon workers: other processes keep their collector as they set it."""
    global _calls
    if not in_reused_daemon_worker():
        return
    with _lock:
        n, _calls = _calls, _calls + 1
    if n == 0:
        return
    if n % FULL_EVERY == 0:
        gc.unfreeze()
        gc.collect()  # frozen cycles included, whatever follows this call
    gc.freeze()
