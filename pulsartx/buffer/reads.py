"""What a reader may see of a partition, per isolation level.

READ_UNCOMMITTED: every DATA record. READ_COMMITTED is completed by the transaction-buffer issue
(maxReadPosition, aborted set); until transactions exist the two levels coincide.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from pulsartx.log.partition import PartitionLog
from pulsartx.log.schema import MessageType

if TYPE_CHECKING:
    from pulsartx.client.client import Client


class VisibilityReader:
    def __init__(self, client: Client | Any, plog: PartitionLog, isolation_level: str):
        self.client = client
        self.log = plog
        self.isolation = isolation_level
        self._end = 0

    def end_position(self) -> int:
        """The offset below which records may be returned (refreshes the partition)."""
        self._end = self.log.end_offset()
        return self._end

    def more_readable(self, position: int) -> bool:
        return position < self._end

    def fetch(self, position: int, max_records: int) -> tuple[pa.Table, int]:
        end = min(self.end_position(), position + max_records)
        if end <= position:
            return self.log.read(0, 0), position
        table = self.log.read(position, end)
        table = table.filter(pc.equal(table.column("type"), MessageType.DATA.value))
        return table, end
