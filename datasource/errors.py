"""Our error message first, where Spark shows a Python data source's error.

pyspark's workers report an exception as its formatted traceback, which Spark puts after its own
prefix: ``[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: Traceback (most
recent call last):`` then four to seven frames of our code, and our one useful line last. pyspark's
only switch for that text is the ``SPARK_HIDE_TRACEBACK`` environment variable, read when the
worker formats the exception; it then sends ``module.Class: message`` and the exception's notes.

So when a pulsartx error (a ``PulsarException``: a message written for users) leaves a method
Spark calls, in a pyspark worker process, :func:`spark_facing` sets that variable and adds the
traceback, with its cause chain, as a note after the message. The worker exits right after
reporting the error, so the variable dies with it; other errors (bugs) keep Spark's full
traceback. Outside pyspark workers (tests calling the methods directly) nothing changes.

This module stays import-light (no pulsartx import): ``pulsartx.datasource.source`` uses it, and Spark's
data-source discovery imports that module in every session.
"""
from __future__ import annotations

import functools
import os
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from pulsartx.datasource import worker_gc
from pulsartx.datasource.profiling import profiled
from pulsartx.datasource.worker_gc import in_spark_worker

HIDE_TRACEBACK = "SPARK_HIDE_TRACEBACK"
NOTE = "pulsartx traceback, for debugging:\n"
# The methods of DataSource, its readers and writers that pyspark calls.
SPARK_METHODS = ("schema", "reader", "writer", "streamReader", "streamWriter", "partitions", "read", "write",
                 "commit", "abort", "initialOffset", "latestOffset", "reportLatestOffset",
                 "prepareForTriggerAvailableNow", "getDefaultReadLimit", "pushFilters")
_depth = threading.local()
C = TypeVar("C", bound=type)


def is_ours(exc: BaseException) -> bool:
    return any(c.__name__ == "PulsarException" and c.__module__ == "pulsartx.exceptions" for c in type(exc).__mro__)


def lead_with_message(exc: BaseException) -> None:
    """Make ``exc``'s message the first thing Spark shows (see the module docstring)."""
    if not is_ours(exc) or not in_spark_worker() or NOTE in "".join(getattr(exc, "__notes__", ())):
        return
    exc.add_note(NOTE + "".join(traceback.format_exception(exc)).rstrip())
    os.environ[HIDE_TRACEBACK] = "1"


def _outermost(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn``; an error leaving the outermost Spark-facing call leads with its message."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        if depth == 0:
            worker_gc.before_call()
        _depth.n = depth + 1
        try:
            out = fn(*args, **kwargs)
        except BaseException as e:
            if depth == 0:
                lead_with_message(e)
            raise
        finally:
            _depth.n = depth
        return _iterating(out) if depth == 0 and isinstance(out, Iterator) else out

    return wrapper


def _iterating(it: Iterator[Any]) -> Iterator[Any]:
    """``read()`` returns an iterator whose errors come while Spark consumes it."""
    try:
        yield from it
    except BaseException as e:
        lead_with_message(e)
        raise


def spark_facing(cls: C) -> C:
    """Class decorator: every Spark-called method the class (or a base of ours) defines leads its
    pulsartx errors with their message, and is CPU-profiled when ``PULSARTX_PROFILE_DIR`` is set
    (:mod:`pulsartx.datasource.profiling`)."""
    for name in SPARK_METHODS:
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner is None or not owner.__module__.startswith(("pulsartx.datasource.", "pulsartx.commit_protocol.")):
            continue  # pyspark's own default (or not defined at all)
        fn = vars(owner)[name]
        if isinstance(fn, classmethod | staticmethod) or getattr(fn, "__wrapped__", None) is not None:
            continue
        setattr(cls, name, profiled(_outermost(fn), f"{cls.__name__}.{name}"))
    return cls
