"""MessageId: a message's position, ``(partition, offset)``, totally ordered within a partition.

pulsar-client's accessors map onto it as follows (docs/semantics.md, "MessageId"). A partition is
one unbounded log with no ledger roll-over, and every message is its own record (no batches), so:

* ``ledger_id()`` is 0 for every real message (-1 for ``earliest``, 2**63-1 for ``latest``, as
  Pulsar's sentinels);
* ``entry_id()`` is the offset within the partition (-1 / 2**63-1 for the sentinels);
* ``batch_index()`` is always -1, Pulsar's value for a message not in a batch;
* ``partition()`` is the partition index (-1 for the sentinels, as in Pulsar).

``serialize()`` gives 13 bytes: a format byte (1), the partition as a signed 32-bit and the offset
as a signed 64-bit integer, big-endian. ``deserialize()`` accepts exactly that and nothing else.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import total_ordering
from typing import ClassVar

from pulsartx.exceptions import InvalidConfiguration

_FORMAT = ">Biq"  # format version, partition, offset
_VERSION = 1
_LATEST_OFFSET = 2**63 - 1
_SIZE = struct.calcsize(_FORMAT)


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

    def ledger_id(self) -> int:
        """Pulsar's ledger id: a partition here is one ledger that never rolls over, so 0; the
        sentinels keep Pulsar's (-1 for earliest, 2**63-1 for latest) so comparisons by it agree."""
        if self.is_earliest:
            return -1
        if self.is_latest:
            return _LATEST_OFFSET
        return 0

    def entry_id(self) -> int:
        """Pulsar's entry id: the offset within the partition."""
        return self.offset_value

    def batch_index(self) -> int:
        """Always -1: each message is its own record, Pulsar's value for a message not in a batch."""
        return -1

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
        """The MessageId ``serialize()`` gave; anything else (another length or format version, a
        position no message can have) raises InvalidConfiguration rather than seeking or
        acknowledging somewhere unintended."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidConfiguration(f"cannot deserialize MessageId from a {type(data).__name__}: give the bytes "
                                       "of MessageId.serialize()")
        raw = bytes(data)
        if len(raw) != _SIZE:
            raise InvalidConfiguration(
                f"cannot deserialize MessageId from {raw[:32]!r} ({len(raw)} bytes): expected the {_SIZE} "
                "bytes of MessageId.serialize()")
        version, partition, offset = struct.unpack(_FORMAT, raw)
        if version != _VERSION:
            raise InvalidConfiguration(f"cannot deserialize MessageId: unknown format version {version} "
                                       f"(this version reads {_VERSION})")
        mid = cls(partition, offset)
        if not (mid.is_earliest or mid.is_latest) and (partition < 0 or offset < 0):
            raise InvalidConfiguration(f"cannot deserialize MessageId: ({partition},{offset}) is no message's "
                                       "position (partition and offset must be >= 0)")
        return mid

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
