"""Keep pyspark's per-call garbage collection cheap in the workers that run our code.

pyspark's daemon runs a full ``gc.collect()`` in a reused worker after every call it serves
(``pyspark/daemon.py``): after a task's ``write``, after the streaming sink runner's ``commit``,
after the planner's ``streamWriter``. A full collection walks every object the process tracks,
and a worker that has imported pulsartx (pyarrow, deltalake, the TC and log caches) tracks
50,000-90,000: 20-45 ms of CPU each time, run just as the worker hands its answer back, so it
competes with the driver's next phase on the same cores (a streaming batch's ``commitOffsets``).

So after an outermost Spark-facing call in a pyspark worker, the objects that survive a full
collection are frozen (``gc.freeze``): they move to the permanent generation, which collections
skip, and the daemon's collection then walks only what was allocated since (0.1 ms). Freezing
does not keep anything alive: frozen objects are still freed by reference counting. Only cyclic
garbage among them waits, until the next full collection: every :data:`FULL_EVERY` calls the
process unfreezes, collects everything and freezes again, so such garbage is bounded by that many
calls' worth.

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


def after_call() -> None:
    """After an outermost Spark-facing call: the first call of the worker, and every FULL_EVERY-th
    after it, collects everything and freezes what survives. Nothing happens outside pyspark
    workers (a user's own process keeps its collector as it set it)."""
    global _calls
    if not in_spark_worker():
        return
    with _lock:
        n, _calls = _calls, _calls + 1
    if n % FULL_EVERY == 0:
        gc.unfreeze()  # cyclic garbage frozen by the previous round is found now
        gc.collect()
        gc.freeze()
