"""The Spark-facing row shape of a topic, and the conversion from stored records to it.

The column names follow the pulsar-spark connector (``value`` plus ``__``-prefixed metadata) so
queries written against Pulsar port over. The Arrow schema must equal what pyspark derives from the
Spark schema (``to_arrow_schema(schema, timezone="UTC")``), type for type and nullability for
nullability: pyspark rejects any other RecordBatch with ``DATA_SOURCE_RETURN_SCHEMA_MISMATCH``.
``tests/test_spark_read.py`` checks the two stay equal.

pyarrow and numpy are imported lazily: this module is loaded by the discovery shim in every
Python worker's data-source lookup, which should not pay for them.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

if TYPE_CHECKING:
    import pyarrow as pa

# Every column is nullable, like the Kafka source's: a user-supplied schema or a union with
# another source then never trips over nullability.
SPARK_SCHEMA = StructType([
    StructField("value", BinaryType()),
    StructField("__key", StringType()),
    StructField("__topic", StringType()),
    StructField("__partition", IntegerType()),
    StructField("__offset", LongType()),
    StructField("__messageId", BinaryType()),
    StructField("__publishTime", TimestampType()),
    StructField("__eventTime", TimestampType()),
    StructField("__messageProperties", MapType(StringType(), StringType())),
])

# Stored record columns a read needs to build the rows above (``offset`` is always read).
RECORD_COLUMNS = ("type", "value", "key", "properties", "event_time", "publish_time")

# RecordBatches handed to Spark stay around this size, so a partition of large messages does not
# become one huge Arrow buffer in the JVM.
TARGET_BATCH_BYTES = 32 * 1024 * 1024
MAX_BATCH_ROWS = 65_536


def arrow_schema() -> pa.Schema:
    """The exact Arrow schema pyspark expects for :data:`SPARK_SCHEMA` (timestamps are UTC micros)."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema([
        pa.field("value", pa.binary()),
        pa.field("__key", pa.string()),
        pa.field("__topic", pa.string()),
        pa.field("__partition", pa.int32()),
        pa.field("__offset", pa.int64()),
        pa.field("__messageId", pa.binary()),
        pa.field("__publishTime", ts),
        pa.field("__eventTime", ts),
        pa.field("__messageProperties", pa.map_(pa.string(), pa.string())),
    ])


def message_ids(partition: int, offsets: Any) -> pa.Array:
    """``MessageId(partition, offset).serialize()`` for a whole column at once.

    Per-row ``struct.pack`` costs about a microsecond a row in the executor; a packed numpy record
    array reinterpreted as fixed-size binary costs nothing per row. The layout must stay identical
    to ``MessageId``'s ``">Biq"`` (format version 1, partition, offset; big-endian, unpadded).
    """
    import numpy as np
    import pyarrow as pa

    offs = np.asarray(offsets, dtype=np.int64)
    rec = np.empty(len(offs), dtype=np.dtype([("version", "u1"), ("partition", ">i4"), ("offset", ">i8")]))
    rec["version"] = 1
    rec["partition"] = partition
    rec["offset"] = offs
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(rec.itemsize), len(rec), [None, pa.py_buffer(rec)])
    return fixed.cast(pa.binary())


def to_spark_table(records: pa.Table, topic: str, partition: int) -> pa.Table:
    """Visible records of one partition as rows of :data:`SPARK_SCHEMA`.

    Casts are explicit because delta-rs and parquet readers may hand back view or large types
    (``binary_view``, ``string_view``) that pyspark refuses.
    """
    import pyarrow as pa

    schema = arrow_schema()
    n = records.num_rows

    def col(name: str, field: str) -> pa.ChunkedArray:
        return records.column(name).cast(schema.field(field).type)

    offsets = records.column("offset").cast(pa.int64())
    columns = [
        col("value", "value"),
        col("key", "__key"),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        offsets,
        message_ids(partition, offsets.to_numpy()),
        col("publish_time", "__publishTime"),
        col("event_time", "__eventTime"),
        col("properties", "__messageProperties"),
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def spark_batches(table: pa.Table) -> Iterator[pa.RecordBatch]:
    """Split a converted table into RecordBatches of bounded size (by rows and by value bytes).

    Chunks are sliced, not copied, unless they are small on average (many tiny files): then
    they are combined first, since every batch costs pyspark a message and the JVM a vector."""
    if table.num_rows == 0:
        return
    value_bytes = table.column("value").nbytes
    avg = max(1, value_bytes // table.num_rows)
    rows = max(1, min(MAX_BATCH_ROWS, TARGET_BATCH_BYTES // avg))
    chunks = table.column("value").num_chunks
    if chunks > 1 and table.num_rows / chunks < rows / 8:
        table = table.combine_chunks()
    for batch in table.to_batches(max_chunksize=rows):
        if batch.num_rows:
            yield batch
