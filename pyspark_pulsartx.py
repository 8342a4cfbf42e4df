"""Discovery shim: pyspark imports every top-level ``pyspark_*`` module it finds on ``sys.path`` and
registers its ``DefaultSource``, so ``spark.read.format("pulsartx")`` works with no ``register()``.

Spark imports this in every session's data-source lookup, and an import error here breaks that
lookup for every source, so it must stay tiny: pyspark plus our class definition, never
deltalake (whose runtime panics in processes forked after it started).
"""
from pulsartx.datasource.source import PulsarTxDataSource


class DefaultSource(PulsarTxDataSource):
    """``PulsarTxDataSource`` under the name pyspark's discovery looks for."""


__all__ = ["DefaultSource"]
