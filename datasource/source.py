"""``PulsarTxDataSource``: the class Spark instantiates for ``format("pulsartx")``.

Module-level imports stay light (pyspark only): the discovery shim imports this module in every
session's data-source lookup. Everything that touches storage is imported inside the methods,
which run in the driver's planner workers and in executors.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pulsartx.datasource.errors import spark_facing
from pulsartx.datasource.schema import SPARK_SCHEMA, projection
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from pulsartx.datasource.options import PulsarTxOptions

SOURCE_NAME = "pulsartx"


@spark_facing
class PulsarTxDataSource(DataSource):
    """Apache Pulsar-style topics on Delta tables, read with Kafka-source-style options."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _read_options(self, use: str) -> PulsarTxOptions:
        from pulsartx.datasource.options import parse_options

        return parse_options(self.options, use=use)

    def schema(self) -> StructType:
        # Validate here: schema() runs at load(), so bad options and unknown topics fail right
        # away as an AnalysisException instead of at the first action. It runs for read and
        # readStream alike, so option names are checked against both; reader() and
        # streamReader() check their own.
        from pulsartx.datasource.option_table import ANY_READ
        from pulsartx.datasource.topics import selected_topics

        opts = self._read_options(ANY_READ)
        assert opts.selection is not None
        selected_topics(opts.root, opts.selection)
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        from pulsartx.datasource.batch_reader import PulsarTxBatchReader, PulsarTxPushdownReader
        from pulsartx.datasource.option_table import READ
        from pulsartx.datasource.pushdown import pushdown_worker

        columns = projection(schema)

        # Parsed again rather than cached from schema(): with a user-supplied schema, schema() is
        # never called, and this is still the driver, where the storage root must be resolved.
        cls = PulsarTxPushdownReader if pushdown_worker() else PulsarTxBatchReader
        return cls(self._read_options(READ), columns)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """Runs on the driver: validates the options and columns, then begins the job's transaction."""
        from pulsartx.datasource.options import parse_write_options
        from pulsartx.datasource.writer import prepare_write

        return prepare_write(parse_write_options(self.options), schema, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pulsartx.datasource.options import parse_stream_options
        from pulsartx.datasource.stream_reader import PulsarTxStreamReader, RefusedStreamReader

        from pulsartx.exceptions import PulsarException

        try:
            return PulsarTxStreamReader(parse_stream_options(self.options), projection(schema))
        except PulsarException as e:  # raised here, pyspark would report an UnboundLocalError instead
            return RefusedStreamReader(e)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Called for every micro-batch: begins that batch's transaction."""
        from pulsartx.datasource.stream_writer import prepare_stream_write

        return prepare_stream_write(self.options, schema, overwrite)
