"""Message, with the accessors of pulsar-client's ``pulsar.Message``."""
from __future__ import annotations

from dataclasses import dataclass, field

from pulsartx.log.message_id import MessageId


@dataclass
class Message:
    _value: bytes
    _key: str | None
    _properties: dict[str, str]
    _message_id: MessageId
    _publish_ms: int
    _event_ms: int
    _topic: str
    _redelivery_count: int = 0
    txn_id: tuple[int, int] | None = field(default=None, repr=False)

    def data(self) -> bytes:
        return self._value

    def value(self) -> bytes:
        return self._value

    def properties(self) -> dict[str, str]:
        return dict(self._properties)

    def partition_key(self) -> str | None:
        return self._key

    def message_id(self) -> MessageId:
        return self._message_id

    def publish_timestamp(self) -> int:
        """Milliseconds since the epoch at which the message was appended."""
        return self._publish_ms

    def event_timestamp(self) -> int:
        """Milliseconds since the epoch given by the producer, 0 when none was given (as in Pulsar)."""
        return self._event_ms

    def topic_name(self) -> str:
        return self._topic

    def redelivery_count(self) -> int:
        return self._redelivery_count


def messages_from_table(table, topic: str, partition: int) -> list[Message]:
    """Turn records (a pyarrow Table in RECORD_SCHEMA) into Messages. Timestamps become epoch
    milliseconds in Arrow, not via datetime objects: this loop is the consumer's per-message cost."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows

    def millis(name: str) -> list:
        col = table.column(name).cast(pa.int64())
        return pc.divide(col, 1000).to_pylist()

    def column(name: str) -> list:
        return table.column(name).to_pylist() if name in table.column_names else [None] * n

    offsets, values, keys, props = column("offset"), column("value"), column("key"), column("properties")
    published, events = millis("publish_time"), millis("event_time")
    most, least = column("txn_most_bits"), column("txn_least_bits")
    return [Message(values[i] or b"", keys[i], dict(props[i]) if props[i] else {}, MessageId(partition, offsets[i]),
                    published[i], events[i] or 0, topic,
                    txn_id=None if most[i] is None else (most[i], least[i]))
            for i in range(n)]
