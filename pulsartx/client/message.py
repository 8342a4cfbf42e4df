"""Message, with the accessors of pulsar-client's ``pulsar.Message``.

A consumer's or reader's per-message cost is what the application sees as receive throughput, and
building a Python object with nine decoded fields per record was most of it (4 us of ~13 us per
message, docs/design/column-backed-messages.md). So one read's records are decoded column by column, once, into
:class:`Records` (a vectorised ``to_pylist`` per column, on first use), and a :class:`Message` is a
row index into it: creating one costs a slotted object, and a field costs a list lookup.
"""
from __future__ import annotations

from typing import Any

from pulsartx.log.message_id import MessageId


class Records:
    """The decoded columns of one read (records in RECORD_SCHEMA), shared by its messages. A column
    is turned into a Python list the first time any message asks for it (a consumer that never
    looks at keys or properties never decodes them)."""

    __slots__ = ("_table", "_cols", "topic", "partition", "offsets")

    def __init__(self, table: Any, topic: str, partition: int):
        self._table = table
        self._cols: dict[str, list] = {}
        self.topic = topic
        self.partition = partition
        self.offsets: list[int] = table.column("offset").to_pylist()

    def column(self, name: str) -> list:
        col = self._cols.get(name)
        if col is None:
            col = self._cols[name] = self._decode(name)
        return col

    def select(self, rows: Any) -> Any:
        """The records at these row indices (ascending), as a pyarrow Table: a slice, not a copy,
        when they are contiguous (a table receive's usual case)."""
        import numpy as np
        import pyarrow as pa

        if len(rows) and (np.diff(rows) == 1).all():
            return self._table.slice(int(rows[0]), len(rows))
        return self._table.take(pa.array(rows, pa.int64()))

    def _decode(self, name: str) -> list:
        import pyarrow as pa
        import pyarrow.compute as pc

        t = self._table
        if name not in t.column_names:
            return [None] * t.num_rows
        if name in ("publish_time", "event_time"):  # epoch milliseconds in Arrow, not via datetime objects
            return pc.divide(t.column(name).cast(pa.int64()), 1000).to_pylist()
        return t.column(name).to_pylist()


class Message:
    """One record of a :class:`Records` batch (``_i``), plus what the consumer tracks per delivery."""

    __slots__ = ("_rows", "_i", "_offset", "_redelivery_count", "_id")

    def __init__(self, rows: Records, i: int, offset: int, redelivery_count: int = 0):
        self._rows = rows
        self._i = i
        self._offset = offset
        self._redelivery_count = redelivery_count
        self._id: MessageId | None = None

    def data(self) -> bytes:
        return self._rows.column("value")[self._i] or b""

    def value(self) -> bytes:
        return self.data()

    def properties(self) -> dict[str, str]:
        props = self._rows.column("properties")[self._i]
        return dict(props) if props else {}

    def partition_key(self) -> str | None:
        return self._rows.column("key")[self._i]

    def message_id(self) -> MessageId:
        mid = self._id
        if mid is None:
            mid = self._id = MessageId(self._rows.partition, self._offset)
        return mid

    def publish_timestamp(self) -> int:
        """Milliseconds since the epoch at which the message was appended."""
        return self._rows.column("publish_time")[self._i]

    def event_timestamp(self) -> int:
        """Milliseconds since the epoch given by the producer, 0 when none was given (as in Pulsar)."""
        return self._rows.column("event_time")[self._i] or 0

    def topic_name(self) -> str:
        return self._rows.topic

    def redelivery_count(self) -> int:
        return self._redelivery_count

    @property
    def txn_id(self) -> tuple[int, int] | None:
        """(most bits, least bits) of the transaction that produced it, None outside one."""
        most = self._rows.column("txn_most_bits")[self._i]
        return None if most is None else (most, self._rows.column("txn_least_bits")[self._i])

    def __repr__(self) -> str:
        return (f"Message(topic={self.topic_name()!r}, id={self.message_id()}, key={self.partition_key()!r}, "
                f"{len(self.data())} bytes, redelivery_count={self._redelivery_count})")


def messages_from_table(table: Any, topic: str, partition: int) -> list[Message]:
    """The records of ``table`` (RECORD_SCHEMA columns, offset order) as Messages."""
    rows = Records(table, topic, partition)
    return [Message(rows, i, o) for i, o in enumerate(rows.offsets)]
