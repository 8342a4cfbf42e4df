"""Predicate pushdown on ``__topic``, ``__partition``, ``__offset`` and ``__publishTime``.

pyspark fails every read of a source whose reader overrides ``pushFilters`` while
``spark.sql.python.filterPushdown.enabled`` is false (the default): DATA_SOURCE_PUSHDOWN_DISABLED.
When the setting is true, pyspark calls ``DataSource.reader()`` in a dedicated worker
(``data_source_pushdown_filters``) and pushes the filters there. So ``reader()`` returns the
pushdown-capable reader only inside that worker (:func:`pushdown_worker`), and the plain reader
everywhere else: reads work with the setting either way, and are pruned when it is on.

Filters on topic, partition and offset are applied exactly by planning and are consumed; filters
on ``__publishTime`` only prune files (by their statistics), so they are handed back to Spark.
"""
from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from pulsartx.datasource.schema import canonical_column

PUSHDOWN_WORKER = "pyspark.sql.worker.data_source_pushdown_filters"


def pushdown_worker() -> bool:
    return PUSHDOWN_WORKER in sys.modules


def _us(v: Any) -> int | None:
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.UTC)
        return int(v.timestamp() * 1_000_000)
    return None


@dataclass(frozen=True)
class Pushed:
    """What the pushed filters allow; everything unconstrained by default."""

    topics: frozenset[str] | None = None
    partitions: frozenset[int] | None = None
    offset_lo: int = 0  # inclusive
    offset_hi: int | None = None  # exclusive
    publish_lo_us: int | None = None
    publish_hi_us: int | None = None
    handled: tuple = field(default=(), compare=False)

    def allows_partition(self, topic: str, partition: int) -> bool:
        return (self.topics is None or topic in self.topics) and (self.partitions is None or partition in self.partitions)

    def clamp(self, start: int, end: int) -> tuple[int, int]:
        lo = max(start, self.offset_lo)
        hi = end if self.offset_hi is None else min(end, self.offset_hi)
        return lo, max(lo, hi)

    def keeps_file(self, f: Any) -> bool:
        if self.publish_lo_us is not None and f.max_publish_us is not None and f.max_publish_us < self.publish_lo_us:
            return False
        if self.publish_hi_us is not None and f.min_publish_us is not None and f.min_publish_us > self.publish_hi_us:
            return False
        return True


def push(filters: list[Any]) -> tuple[Pushed, list[Any]]:
    """Fold the filters Spark offers into a :class:`Pushed`; returns it and the filters to reject."""
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        LessThan,
        LessThanOrEqual,
    )

    p = Pushed()
    rejected: list[Any] = []
    for f in filters:
        col = canonical_column(f.attribute[0]) if len(getattr(f, "attribute", ())) == 1 else None
        value = getattr(f, "value", None)
        if col == "__topic" and isinstance(f, EqualTo | In):
            vals = frozenset([value] if isinstance(f, EqualTo) else value)
            p = replace(p, topics=vals if p.topics is None else p.topics & vals)
        elif col == "__partition" and isinstance(f, EqualTo | In):
            vals = frozenset([value] if isinstance(f, EqualTo) else value)
            p = replace(p, partitions=vals if p.partitions is None else p.partitions & vals)
        elif col == "__offset" and isinstance(value, int) and isinstance(
                f, EqualTo | GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual):
            lo, hi = {EqualTo: (value, value + 1), GreaterThan: (value + 1, None), GreaterThanOrEqual: (value, None),
                      LessThan: (None, value), LessThanOrEqual: (None, value + 1)}[type(f)]
            if lo is not None:
                p = replace(p, offset_lo=max(p.offset_lo, lo))
            if hi is not None:
                p = replace(p, offset_hi=hi if p.offset_hi is None else min(p.offset_hi, hi))
        elif col == "__publishTime" and _us(value) is not None and isinstance(
                f, GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual | EqualTo):
            us = _us(value)
            if isinstance(f, GreaterThan | GreaterThanOrEqual | EqualTo):
                p = replace(p, publish_lo_us=us if p.publish_lo_us is None else max(p.publish_lo_us, us))
            if isinstance(f, LessThan | LessThanOrEqual | EqualTo):
                p = replace(p, publish_hi_us=us if p.publish_hi_us is None else min(p.publish_hi_us, us))
            rejected.append(f)  # files are pruned, rows are still filtered by Spark
        else:
            rejected.append(f)
    return p, rejected
