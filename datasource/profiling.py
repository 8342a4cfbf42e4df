"""CPU profiles of the Spark-facing calls, taken where they run: inside pyspark's Python workers.

Wall-clock timings of a micro-batch or a Spark write mean little on a shared machine; call counts
and CPU per function do not move with load. Spark's own Python profiler (``spark.python.profile``)
covers UDFs only, not data-source methods, and the calls run in worker processes a driver-side
``cProfile`` never sees. So when ``PULSARTX_PROFILE_DIR`` names a directory, every outermost
Spark-facing call (:func:`pulsartx.datasource.errors.spark_facing`: ``read``, ``write``,
``commit``, ``latestOffset``, ``streamWriter``...) runs under :mod:`cProfile` and leaves one
``<pid>-<seq>-<Class>.<method>.prof`` file there, readable with :mod:`pstats` or
``python -m pulsartx.datasource.profiling DIR``. An iterator a call returns (``read``) is profiled
while Spark consumes it, one ``next`` at a time, so Spark's own work between batches is left out.

The variable is read once, at import. Timings are CPU (``time.process_time``, the whole process): when it is unset, :func:`profiled` returns the function
itself and nothing is added to any call. Workers inherit the driver's environment in local mode;
on a cluster, set it with ``spark.executorEnv.PULSARTX_PROFILE_DIR`` too.

Stdlib only: :mod:`pulsartx.datasource.errors` imports this module, and Spark's data-source
discovery imports that one in every session.
"""
from __future__ import annotations

import cProfile
import functools
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

PROFILE_DIR_ENV = "PULSARTX_PROFILE_DIR"
PROFILE_DIR: str | None = os.environ.get(PROFILE_DIR_ENV) or None
_seq = itertools.count()
_active = threading.local()  # one profiler per thread: a nested Spark-facing call is in its caller's profile


def _dump(prof: cProfile.Profile, label: str, span: float | None = None) -> None:
    assert PROFILE_DIR is not None
    os.makedirs(PROFILE_DIR, exist_ok=True)
    path = os.path.join(PROFILE_DIR, f"{os.getpid()}-{next(_seq):05d}-{label}.prof")
    prof.dump_stats(path)
    if span is not None:
        with open(path[:-5] + ".span", "w") as f:
            f.write(f"{span:.6f}\n")


def _profiled_iterator(it: Iterator[Any], prof: cProfile.Profile, label: str, started: float) -> Iterator[Any]:
    """Profiles each ``next`` only; the ``.span`` file beside the profile holds the process's CPU
    from the call to the iterator's end, which adds what pyspark did with the batches meanwhile
    (Arrow to the JVM): the share two readers of the same rows may differ by outside our code."""
    try:
        while True:
            _active.on = True
            prof.enable()
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                prof.disable()
                _active.on = False
            yield item
    finally:
        _dump(prof, label, time.process_time() - started)


def profiled(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    """``fn`` under cProfile when ``PULSARTX_PROFILE_DIR`` is set, else ``fn`` itself."""
    if PROFILE_DIR is None:
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(_active, "on", False):
            return fn(*args, **kwargs)
        prof = cProfile.Profile(time.process_time)  # CPU, not wall: the machine may be busy
        started = time.process_time()
        _active.on = True
        prof.enable()
        try:
            out = fn(*args, **kwargs)
        except BaseException:
            prof.disable()
            _active.on = False
            _dump(prof, label)
            raise
        finally:
            prof.disable()
            _active.on = False
        if isinstance(out, Iterator):
            return _profiled_iterator(out, prof, label, started)
        _dump(prof, label)
        return out

    return wrapper


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def summary(directory: str, top: int = 25, sort: str = "tottime") -> str:
    """Calls and CPU per label (``Class.method``) summed over the directory's profiles, then the
    top functions of each label."""
    import pstats
    from collections import defaultdict

    groups: dict[str, list[str]] = defaultdict(list)
    for name in sorted(os.listdir(directory)):
        if name.endswith(".prof"):
            groups[name.split("-", 2)[2][:-5]].append(os.path.join(directory, name))
    lines: list[str] = []
    for label, files in sorted(groups.items()):
        stats = pstats.Stats(*files, stream=_Sink(lines))
        spans = [float(_read(f[:-5] + ".span")) for f in files if os.path.exists(f[:-5] + ".span")]
        span = f"; {sum(spans) * 1000:.1f} ms CPU from call to the iterator's end over {len(spans)} calls" if spans else ""
        lines.append(f"== {label}: {len(files)} calls, {stats.total_tt * 1000:.1f} ms CPU in total, "
                     f"{stats.total_tt * 1000 / len(files):.2f} ms per call{span}")
        stats.sort_stats(sort).print_stats(top)
    return "\n".join(lines)


class _Sink:
    """A text stream for :class:`pstats.Stats` that collects lines (pstats writes a line in
    several pieces)."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        self.partial = ""

    def write(self, text: str) -> None:
        *done, self.partial = (self.partial + text).split("\n")
        self.lines.extend(done)


if __name__ == "__main__":
    print(summary(sys.argv[1], top=int(sys.argv[2]) if len(sys.argv) > 2 else 25,
                  sort=sys.argv[3] if len(sys.argv) > 3 else "tottime"))
