"""A topic's rows as readers see them: ``value`` plus ``__``-prefixed metadata, in Arrow.

One shape for every Arrow reader: Spark's read (``spark.read.format("pulsartx")``, whose pyspark
schema in :mod:`pulsartx.datasource.schema` this must match type for type) and the client's
``Consumer.receive_table``. It lives here, below both, because the client must not import the
Spark data source (pyspark) to hand out a table.

The column names follow the pulsar-spark connector, so queries written against Pulsar port over.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from pulsartx.log.constant import constant
from pulsartx.log.schema import PROPERTIES, TIMESTAMP

# Every column is nullable, like the Kafka source's: a user-supplied schema or a union with
# another source then never trips over nullability. Timestamps are UTC micros, as pyspark expects.
ROW_SCHEMA = pa.schema([
    pa.field("value", pa.binary()),
    pa.field("__key", pa.string()),
    pa.field("__topic", pa.string()),
    pa.field("__partition", pa.int32()),
    pa.field("__offset", pa.int64()),
    pa.field("__messageId", pa.binary()),
    pa.field("__publishTime", TIMESTAMP),
    pa.field("__eventTime", TIMESTAMP),
    pa.field("__messageProperties", PROPERTIES),
])

# The stored record column each row column is built from; None: derived from the partition and
# the offset. A read projected to some columns reads only their stored columns.
STORED_COLUMN: dict[str, str | None] = {
    "value": "value", "__key": "key", "__topic": None, "__partition": None, "__offset": None,
    "__messageId": None, "__publishTime": "publish_time", "__eventTime": "event_time",
    "__messageProperties": "properties",
}
ALL_COLUMNS: tuple[str, ...] = tuple(ROW_SCHEMA.names)
assert set(STORED_COLUMN) == set(ALL_COLUMNS), "STORED_COLUMN must cover ROW_SCHEMA exactly"


def message_ids(partition: int | np.ndarray, offsets: Any) -> pa.Array:
    """``MessageId(partition, offset).serialize()`` for a whole column at once (``partition``: one
    for all rows, or one per row).

    Per-row ``struct.pack`` costs about a microsecond a row; a packed numpy record array
    reinterpreted as fixed-size binary costs nothing per row. The layout must stay identical to
    ``MessageId``'s ``">Biq"`` (format version 1, partition, offset; big-endian, unpadded).
    """
    offs = np.asarray(offsets, dtype=np.int64)
    rec = np.empty(len(offs), dtype=np.dtype([("version", "u1"), ("partition", ">i4"), ("offset", ">i8")]))
    rec["version"] = 1
    rec["partition"] = partition
    rec["offset"] = offs
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(rec.itemsize), len(rec), [None, pa.py_buffer(rec)])
    return fixed.cast(pa.binary())


def parse_message_ids(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray] | None:
    """The (partitions, offsets) a ``__messageId`` column holds, or None if some value is not a
    serialized MessageId (null, another length or format version): the inverse of
    :func:`message_ids`, without a Python object per row."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if arr.null_count or not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)
                              or pa.types.is_fixed_size_binary(arr.type)):
        return None
    arr = arr.cast(pa.binary())
    n = len(arr)
    dtype = np.dtype([("version", "u1"), ("partition", ">i4"), ("offset", ">i8")])
    ends = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4)
    if n and not (np.diff(ends) == dtype.itemsize).all():
        return None
    rec = np.frombuffer(arr.buffers()[2], dtype=dtype, count=n, offset=int(ends[0])) if n else np.empty(0, dtype)
    if n and not (rec["version"] == 1).all():
        return None
    return rec["partition"].astype(np.int64), rec["offset"].astype(np.int64)


def rows_from_records(records: pa.Table, topic: str, partition: int,
                      columns: Sequence[str] = ALL_COLUMNS) -> pa.Table:
    """Visible records of one partition (RECORD_SCHEMA columns, offset order) as rows of
    :data:`ROW_SCHEMA`, or of its projection to ``columns`` (canonical names; only those are built).

    Casts are explicit because delta-rs and parquet readers may hand back view or large types
    (``binary_view``, ``string_view``) that pyspark refuses.
    """
    n = records.num_rows

    def build(name: str, field: pa.Field) -> pa.ChunkedArray | pa.Array:
        stored = STORED_COLUMN[name]
        if stored is not None:
            return records.column(stored).cast(field.type)
        if name == "__topic":
            return constant(topic, n, pa.string())
        if name == "__partition":
            return constant(partition, n, pa.int32())
        offsets = records.column("offset").cast(pa.int64())
        return offsets if name == "__offset" else message_ids(partition, offsets.to_numpy())

    schema = ROW_SCHEMA if tuple(columns) == ALL_COLUMNS else pa.schema([ROW_SCHEMA.field(c) for c in columns])
    return pa.Table.from_arrays([build(f.name, f) for f in schema], schema=schema)
