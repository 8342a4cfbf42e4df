"""The Spark-facing row shape of a topic: its pyspark schema, and projections of it.

The rows themselves (Arrow schema, conversion from stored records) are the client's too
(``Consumer.receive_table``), so they live in :mod:`pulsartx.log.rows`, which this module
re-exports. The Arrow schema must equal what pyspark derives from the Spark schema
(``to_arrow_schema(schema, timezone="UTC")``), type for type and nullability for nullability:
pyspark rejects any other RecordBatch with ``DATA_SOURCE_RETURN_SCHEMA_MISMATCH``.
``tests/test_spark_read.py`` checks the two stay equal.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

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

from pulsartx.log.rows import ROW_SCHEMA, STORED_COLUMN, message_ids, rows_from_records

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

ALL_COLUMNS: tuple[str, ...] = tuple(SPARK_SCHEMA.fieldNames())
assert ALL_COLUMNS == tuple(ROW_SCHEMA.names), "SPARK_SCHEMA and pulsartx.log.rows.ROW_SCHEMA must match"
__all__ = ["ALL_COLUMNS", "FULL", "SPARK_SCHEMA", "STORED_COLUMN", "Projection", "arrow_schema", "message_ids",
           "projection", "spark_batches", "to_spark_table"]

# RecordBatches handed to Spark stay around this size, so a partition of large messages does not
# become one huge Arrow buffer in the JVM.
TARGET_BATCH_BYTES = 32 * 1024 * 1024
MAX_BATCH_ROWS = 65_536


class Projection(tuple):
    """The columns a read returns, in the user's order and spelling: all of :data:`SPARK_SCHEMA`
    unless ``.schema()`` names a subset.

    Python data sources get no column pruning from Spark, and every column a reader returns is
    converted by the JVM whether the query uses it or not (the map column and the 33-byte
    ``__topic`` cost more than a 100-byte value). A declared subset is the user's way to prune, as
    Spark's file sources read only the columns a query needs.
    """

    @property
    def canonical(self) -> tuple[str, ...]:
        return tuple(_CANONICAL[c.lower()] for c in self)

    @property
    def stored(self) -> tuple[str, ...]:
        """Stored record columns to read for these (``type`` always, since markers are filtered;
        ``offset`` is always read by the log)."""
        return tuple(dict.fromkeys(("type", *(s for c in self.canonical if (s := STORED_COLUMN[c]) is not None))))


_CANONICAL = {name.lower(): name for name in STORED_COLUMN}
assert set(STORED_COLUMN) == set(ALL_COLUMNS), "STORED_COLUMN must cover SPARK_SCHEMA exactly"
FULL = Projection(ALL_COLUMNS)


def canonical_column(name: str) -> str | None:
    """The topic-schema column a (declared, any-case) column name stands for, if any."""
    return _CANONICAL.get(name.lower())


def projection(schema: StructType) -> Projection:
    """The columns a user-supplied read schema selects.

    Rows have the fixed topic schema (like the Kafka source's); ``.schema()`` may restate it or
    name a subset of its columns. Anything else is refused here, naming the column and the fix,
    instead of failing later with an opaque Arrow mismatch in the executor."""
    # Imported here: Spark's data-source discovery imports this module, which must stay pyspark-only.
    from pulsartx.exceptions import InvalidConfiguration

    declared = schema.simpleString()
    if not schema.fields:
        raise InvalidConfiguration(
            f"the pulsartx source cannot read with an empty .schema({declared}): name some of the columns of "
            f"{SPARK_SCHEMA.simpleString()}, or drop the .schema() call to read them all")
    seen: set[str] = set()
    for f in schema.fields:
        canonical = canonical_column(f.name)
        if canonical is None:
            raise InvalidConfiguration(
                f"the pulsartx source has a fixed schema and cannot read with .schema({declared}): column "
                f"{f.name!r} is not one of its columns; drop the .schema() call (the schema is "
                f"{SPARK_SCHEMA.simpleString()}) or declare a subset of those columns, and select or cast columns instead")
        want = SPARK_SCHEMA[canonical]
        if f.dataType != want.dataType or not f.nullable:
            raise InvalidConfiguration(
                f"the pulsartx source has a fixed schema and cannot read with .schema({declared}): column "
                f"{f.name!r} is a nullable {want.dataType.simpleString()}, not {declared_type(f)}; declare it as "
                f"'{f.name} {want.dataType.simpleString()}', or drop the .schema() call "
                f"(the schema is {SPARK_SCHEMA.simpleString()}) and select or cast columns instead")
        if canonical in seen:
            raise InvalidConfiguration(
                f"the pulsartx source cannot read with .schema({declared}): column {f.name!r} is declared twice")
        seen.add(canonical)
    return Projection(tuple(f.name for f in schema.fields))


def declared_type(f: StructField) -> str:
    return f.dataType.simpleString() + ("" if f.nullable else " NOT NULL")


def arrow_schema(columns: Projection = FULL) -> pa.Schema:
    """The exact Arrow schema pyspark expects for :data:`SPARK_SCHEMA`, or the projection of it
    to ``columns`` (timestamps are UTC micros)."""
    import pyarrow as pa

    if columns == FULL:
        return ROW_SCHEMA
    return pa.schema([ROW_SCHEMA.field(c).with_name(name) for name, c in zip(columns, columns.canonical, strict=True)])


def to_spark_table(records: pa.Table, topic: str, partition: int, columns: Projection = FULL) -> pa.Table:
    """Visible records of one partition as rows of :data:`SPARK_SCHEMA` (or of its projection to
    ``columns``, in the user's spelling; only those are built)."""
    rows = rows_from_records(records, topic, partition, columns.canonical)
    return rows if tuple(columns) == columns.canonical else rows.rename_columns(list(columns))


def spark_batches(table: pa.Table) -> Iterator[pa.RecordBatch]:
    """Split a converted table into RecordBatches of bounded size (by rows and by value bytes).

    Chunks are sliced, not copied, unless they are small on average (many tiny files): then
    they are combined first, since every batch costs pyspark a message and the JVM a vector."""
    if table.num_rows == 0:
        return
    values = [c for name, c in zip(table.column_names, table.columns, strict=True) if canonical_column(name) == "value"]
    avg = max(1, (values[0] if values else table).nbytes // table.num_rows)
    rows = max(1, min(MAX_BATCH_ROWS, TARGET_BATCH_BYTES // avg))
    chunks = max(c.num_chunks for c in table.columns)
    if chunks > 1 and table.num_rows / chunks < rows / 8:
        table = table.combine_chunks()
    for batch in table.to_batches(max_chunksize=rows):
        if batch.num_rows:
            yield batch
