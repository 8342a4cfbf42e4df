"""The partition log: record format, offsets and MessageId, producer dedup, appends and range reads."""
from pulsartx.log.message_id import MessageId
from pulsartx.log.partition import AppendResult, PartitionLog
from pulsartx.log.schema import RECORD_SCHEMA, MessageType

__all__ = ["RECORD_SCHEMA", "AppendResult", "MessageId", "MessageType", "PartitionLog"]
