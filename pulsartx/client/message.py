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
    """Turn records (a pyarrow Table in RECORD_SCHEMA) into Messages."""
    cols = {name: table.column(name).to_pylist() for name in
            ("offset", "value", "key", "properties", "publish_time", "event_time", "txn_most_bits", "txn_least_bits")
            if name in table.column_names}
    out = []
    for i in range(table.num_rows):
        props = cols["properties"][i]
        ev = cols["event_time"][i]
        most = cols.get("txn_most_bits", [None] * table.num_rows)[i]
        out.append(Message(
            cols["value"][i] or b"", cols["key"][i], dict(props) if props else {},
            MessageId(partition, cols["offset"][i]), int(cols["publish_time"][i].timestamp() * 1000),
            int(ev.timestamp() * 1000) if ev is not None else 0, topic,
            txn_id=None if most is None else (most, cols["txn_least_bits"][i])))
    return out
