"""Keep pyspark's per-call garbage collection cheap in the workers that run our code.

pyspark's daemon runs a full ``gc.collect()`` in a reused worker after every call it serves
(``pyspark/daemon.py``): after a task's ``write``, after the streaming sink runner's ``commit``,
after the planner's ``streamWriter``. A full collection walks every object the process tracks,
and a worker that has imported pulsartx (pyarrow, deltalake, the TC and log caches) tracks
50,000-90,000: 20-45 ms of CPU each time, run just as the worker hands its answer back, so it
competes with the driver's next phase on the same cores (a streaming batch's ``commitOffsets``).

So at the start of an outermost Spark-facing call in a reused pyspark worker, the objects the
process tracks are frozen (``gc.freeze``, which only moves a list): they go to the permanent
generation, which collections skip, and the daemon's collection after the call walks only what
was allocated since (0.1 ms instead of 20-45). At that point the daemon's collection after the
previous call has just run, so what is frozen is live. Freezing keeps nothing alive: frozen
objects are still freed by reference counting; only cyclic garbage among them waits for the next
full collection. Every :data:`FULL_EVERY`-th call unfreezes instead, so the daemon's collection
after it walks everything, which bounds such garbage by that many calls' worth. A worker's first
call does nothing: a process that serves one call pays nothing.

Stdlib only (imported by :mod:`pulsartx.datasource.errors`, which Spark's data-source discovery
imports in every session).
"""
from __future__ import annotations

import gc
import sys
import threading

FULL_EVERY = 200  # outermost calls between two full collections in one worker
_lock = threading.Lock()
_calls = 0


def in_spark_worker() -> bool:
    """True in a process pyspark started (its ``__main__`` is a ``pyspark.`` module)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (getattr(spec, "name", None) or "").startswith("pyspark.")


def before_call() -> None:
    """At the start of an outermost Spark-facing call (see the module docstring). Nothing happens
    outside pyspark workers: a user's own process keeps its collector as it set it."""
    global _calls
    if not in_spark_worker():
        return
    with _lock:
        n, _calls = _calls, _calls + 1
    if n == 0:
        return
    if n % FULL_EVERY == 0:
        gc.unfreeze()  # the collection after this call walks everything, frozen cycles included
    else:
        gc.freeze()
