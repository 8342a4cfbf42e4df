"""MessageId: a message's position, ``(partition, offset)``, totally ordered within a partition."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

from pulsartx.exceptions import InvalidConfiguration

_FORMAT = ">Biq"  # format version, partition, offset
_VERSION = 1
_LATEST_OFFSET = 2**63 - 1


@dataclass(frozen=True, order=True)
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

    def serialize(self) -> bytes:
        return struct.pack(_FORMAT, _VERSION, self.partition_index, self.offset_value)

    @classmethod
    def deserialize(cls, data: bytes) -> MessageId:
        if not isinstance(data, bytes | bytearray | memoryview) or len(data) != struct.calcsize(_FORMAT):
            raise InvalidConfiguration(
                f"cannot deserialize MessageId from {bytes(data)[:32]!r}: expected the {struct.calcsize(_FORMAT)} "
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
