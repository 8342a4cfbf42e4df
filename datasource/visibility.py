"""Which stored records of a partition a Spark read may return: the executor half of
:mod:`pulsartx.buffer.reads`.

The split is deliberate. The driver decides *what could be visible* when it plans (the offset
range, and later the transaction state: maxReadPosition, aborted transactions, committed ranges
from markers) and freezes it into a picklable :class:`Visibility` carried by each input partition.
The executor then calls :func:`visible_records` on the raw records of its range, and nothing else
decides visibility. The transaction-buffer work extends exactly these two places: fields on
``Visibility`` (filled in :func:`plan_visibility`) and the filter in ``visible_records``; the
columns it needs go in :attr:`Visibility.columns`.

Today both isolation levels return every DATA record and never a marker, matching
``VisibilityReader.fetch``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pulsartx.log.schema import MessageType

if TYPE_CHECKING:
    import pyarrow as pa

    from pulsartx.log.partition import PartitionLog


@dataclass(frozen=True)
class Visibility:
    """What the driver decided about one partition's visibility, shipped to the executor."""

    isolation_level: str

    @property
    def columns(self) -> tuple[str, ...]:
        """Stored columns :func:`visible_records` needs besides the output ones."""
        return ("type",)


def plan_visibility(plog: PartitionLog, isolation_level: str) -> Visibility:
    """Driver side: freeze the partition's visibility state for a read planned now."""
    return Visibility(isolation_level)


def visible_records(records: pa.Table, visibility: Visibility) -> pa.Table:
    """Executor side: the raw records of a planned range, reduced to what the reader may see."""
    import pyarrow.compute as pc

    return records.filter(pc.equal(records.column("type"), MessageType.DATA.value))
