"""The partition log's record format: one row per message or marker, dense offsets in every row.

Offsets live in the rows (rather than being derived from Delta versions) so that any Delta engine
can ``SELECT ... WHERE offset > n``, range reads are plain data skipping on file statistics, and
compaction keeps offsets for free. docs/storage.md explains the trade-off.
"""
from __future__ import annotations

from enum import StrEnum

import pyarrow as pa


class MessageType(StrEnum):
    """PIP-31's MessageType: markers take an offset like Kafka's control records."""

    DATA = "DATA"
    TXN_COMMIT = "TXN_COMMIT"
    TXN_ABORT = "TXN_ABORT"


TIMESTAMP = pa.timestamp("us", tz="UTC")
PROPERTIES = pa.map_(pa.string(), pa.string())
# A commit marker may list exactly which offset ranges belong to its transaction (PIP-31: "add the
# list of message id of the transaction as part of the commit marker"); entries outside them are
# never visible. Null means "every message of the transaction in this partition".
MARKER_ENTRIES = pa.list_(pa.struct([pa.field("first_offset", pa.int64(), False),
                                     pa.field("last_offset", pa.int64(), False)]))

RECORD_SCHEMA = pa.schema([
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("type", pa.string(), nullable=False),
    pa.field("value", pa.binary()),
    pa.field("key", pa.string()),
    pa.field("properties", PROPERTIES),
    pa.field("event_time", TIMESTAMP),
    pa.field("publish_time", TIMESTAMP, nullable=False),
    pa.field("producer_name", pa.string()),
    pa.field("sequence_id", pa.int64()),
    pa.field("txn_most_bits", pa.int64()),
    pa.field("txn_least_bits", pa.int64()),
    pa.field("marker_entries", MARKER_ENTRIES),
])

# Columns with min/max statistics in every data file: the offset drives range reads,
# publish_time drives time-travel reads, and txn_most_bits's null count tells the transaction
# buffer that a file holds no transactional record (no data of a transaction, no marker), which
# its fold then skips without reading.
STATS_COLUMNS = ("offset", "publish_time", "sequence_id", "txn_most_bits")

# Table properties of every partition table. App ids (producer sequence ids, marker guards) idle for
# a week expire, as Pulsar forgets an inactive producer's dedup state.
PARTITION_TABLE_CONFIG = {"delta.setTransactionRetentionDuration": "interval 7 days",
                          "delta.dataSkippingStatsColumns": ",".join(STATS_COLUMNS)}
