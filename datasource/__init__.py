"""Spark DataSource (pyspark's Python DataSource API) for pulsartx: ``spark.read.format("pulsartx")``.

Discovery
    After ``pip install`` (editable or not) into the interpreter ``PYSPARK_PYTHON`` names, Spark
    finds the source by itself: its first data-source call in a session imports top-level
    ``pyspark_*`` modules and registers their ``DefaultSource`` (our ``pyspark_pulsartx`` shim).
    With ``--py-files`` / ``addPyFile`` that scan does not see the code, so register explicitly::

        from pulsartx.datasource import PulsarTxDataSource
        spark.dataSource.register(PulsarTxDataSource)

Options (Kafka source / pulsar-spark connector names)
    Declared once in :mod:`pulsartx.datasource.option_table`, from which ``docs/options.md`` is generated;
    an option not listed for the API it is given to is refused, naming the nearest valid one. The
    Spark conf ``spark.pulsartx.service.url`` cannot reach Python data sources, see
    :mod:`pulsartx.datasource.options`.

Schema
    ``value binary, __key string, __topic string, __partition int, __offset bigint,
    __messageId binary, __publishTime timestamp, __eventTime timestamp,
    __messageProperties map<string,string>``.

Filter pushdown
    Not implemented yet, on purpose: while ``spark.sql.python.filterPushdown.enabled`` is false
    (Spark's default), a reader that merely defines ``pushFilters`` makes every read fail with
    ``DATA_SOURCE_PUSHDOWN_DISABLED``. When pushdown is added (offset and publish-time ranges map
    onto file statistics), it must keep reads working with the flag off.
"""
from pulsartx.datasource.source import PulsarTxDataSource

__all__ = ["PulsarTxDataSource"]
