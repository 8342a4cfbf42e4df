"""MessageId: a message's position, ``(partition, offset)``, totally ordered within a partition."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import total_ordering
from typing import ClassVar

from pulsartx.exceptions import InvalidConfiguration

_FORMAT = ">Biq"  # format version, partition, offset
_VERSION = 1
_LATEST_OFFSET = 2**63 - 1


@total_ordering
@dataclass(frozen=True)
class MessageId:
    """Position of a message. ``earliest``/``latest`` are sentinels that sort before/after every
    real position, like Pulsar's."""

    partition_index: int
    offset_value: int

    earliest: ClassVar[MessageId]
    latest: ClassVar[MessageId]

    def partition(self) -> int:
        return self.partition_index

    def offset(self) -> int:
        return self.offset_value

    def _sort_key(self) -> tuple[int, int, int]:
        # The sentinels use partition -1, so plain field order would put ``latest`` before every
        # real position: rank them explicitly instead.
        if self.is_earliest:
            return (0, 0, 0)
        if self.is_latest:
            return (2, 0, 0)
        return (1, self.partition_index, self.offset_value)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._sort_key() < other._sort_key()

    def serialize(self) -> bytes:
        return struct.pack(_FORMAT, _VERSION, self.partition_index, self.offset_value)

    @classmethod
    def deserialize(cls, data: bytes) -> MessageId:
        if not isinstance(data, bytes | bytearray | memoryview) or len(data) != struct.calcsize(_FORMAT):
            shown = bytes(data)[:32] if isinstance(data, bytes | bytearray | memoryview) else data
            raise InvalidConfiguration(
                f"cannot deserialize MessageId from {shown!r}: expected the {struct.calcsize(_FORMAT)} "
                "bytes of MessageId.serialize()")
        version, partition, offset = struct.unpack(_FORMAT, bytes(data))
        if version != _VERSION:
            raise InvalidConfiguration(f"cannot deserialize MessageId: unknown format version {version}")
        return cls(partition, offset)

    @property
    def is_earliest(self) -> bool:
        return self == MessageId.earliest

    @property
    def is_latest(self) -> bool:
        return self == MessageId.latest

    def __str__(self) -> str:
        if self.is_earliest:
            return "earliest"
        if self.is_latest:
            return "latest"
        return f"({self.partition_index},{self.offset_value})"


MessageId.earliest = MessageId(-1, -1)
MessageId.latest = MessageId(-1, _LATEST_OFFSET)
