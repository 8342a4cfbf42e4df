"""A Spark Connect client for tests/test_spark_connect.py, run as its own Python process (the test
process already has a classic SparkSession):

    python tests/spark_jobs/connect_client.py '<json config>'

Through ``SparkSession.builder.remote(remote)`` only, it reads ``input`` (every column, then a
declared subset), writes its values upper-cased to ``output``, runs the availableNow pipeline
``input`` -> ``stream_output`` through ``subscription`` with :class:`PulsarTxProgressListener`
attached, then ships pulsartx as a session artifact (``py_files``) and reads ``input`` again
through a data source it registers itself. Its options name
the storage root only: the server has the credentials in its environment (docs/deploy.md).

The last line it prints is ``@@RESULT <json>``; it leaves with ``os._exit`` (deltalake may abort at
interpreter exit, docs/design/deltalake-in-processes.md).
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

CFG: dict[str, Any] = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
REGISTERED = "pulsartx_registered"


def run() -> dict[str, Any]:
    from pulsartx.datasource.progress import PulsarTxProgressListener
    from pulsartx.datasource.source import PulsarTxDataSource
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.datasource import DataSource, DataSourceReader

    spark = SparkSession.builder.remote(CFG["remote"]).getOrCreate()
    root, out = CFG["root"], {"session": type(spark).__module__}

    def read(fmt: str = "pulsartx") -> Any:
        return spark.read.format(fmt).option("service.url", root).option("topic", CFG["input"])

    rows = read().load().select("__partition", "__offset", "__key", F.col("value").cast("string")).collect()
    out["read"] = sorted([list(r) for r in rows])
    slim = read().schema("value binary, __key string").load()
    out["declared"] = {"columns": slim.columns, "rows": slim.count()}

    (read().load().select(F.upper(F.col("value").cast("string")).alias("value"), "__key")
     .write.format("pulsartx").mode("append").option("service.url", root).option("topic", CFG["output"])
     .option("createTopic", "true").option("partitions", "2").save())

    listener = PulsarTxProgressListener(root)
    spark.streams.addListener(listener)
    query = (spark.readStream.format("pulsartx").option("service.url", root).option("topic", CFG["input"])
             .option("subscription", CFG["subscription"]).option("startingOffsets", "earliest")
             .option("maxEntriesPerTrigger", str(CFG["max_entries"])).load()
             .select(F.concat(F.lit("S:"), F.col("value").cast("string")).alias("value"), "__key")
             .writeStream.format("pulsartx").option("service.url", root).option("topic", CFG["stream_output"])
             .option("createTopic", "true").option("partitions", "2").option("checkpointLocation", CFG["checkpoint"]).trigger(availableNow=True).start())
    query.awaitTermination()
    out["stream"] = {"exception": None if query.exception() is None else str(query.exception()),
                     "batches": [p.numInputRows for p in query.recentProgress]}
    deadline = time.monotonic() + 30  # progress events reach a Connect client's listener asynchronously
    while len(listener.batches) < len(out["stream"]["batches"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    out["listener"] = sorted([batch, bt.status, bt.entries] for (_, batch), bt in listener.batches.items())

    # The Connect form of --py-files: the session's Python workers, driver-side and executors,
    # import the shipped zip before the installed package (what a probe source reports).
    spark.addArtifacts(CFG["py_files"], pyfile=True)

    class ImportedFrom(DataSourceReader):
        def __init__(self, planner: str):
            self.planner = planner

        def read(self, partition: Any) -> Any:
            import pulsartx.datasource

            yield self.planner, pulsartx.datasource.__file__

    class WhereImported(DataSource):
        @classmethod
        def name(cls) -> str:
            return "where_imported"

        def schema(self) -> str:
            return "planner string, executor string"

        def reader(self, schema: Any) -> Any:
            import pulsartx.datasource

            return ImportedFrom(pulsartx.datasource.__file__)

    spark.dataSource.register(WhereImported)
    out["imported_from"] = list(spark.read.format("where_imported").load().collect()[0])

    class RegisteredSource(PulsarTxDataSource):
        """Pickled by value to the server: registration over Connect works like a local one."""

        @classmethod
        def name(cls) -> str:
            return REGISTERED

    spark.dataSource.register(RegisteredSource)
    out["registered_rows"] = read(REGISTERED).load().count()
    return out


def main() -> None:
    try:
        result = {"ok": True, "result": run()}
    except BaseException:
        result = {"ok": False, "error": traceback.format_exc()}
    print("@@RESULT " + json.dumps(result), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
