"""The jobs tests/test_cluster.py submits to a standalone master, written as a user would write them
(docs/deploy.md): every cluster setting comes from the ``spark-submit`` command line, the object-store
credentials from the driver's environment, never from the command line.

    spark-submit --master spark://... tests/stream_jobs/cluster_job.py '<json config>'

``job``:

``write``
    ``rows`` rows over ``slices`` tasks -> ``topic`` (created with ``partitions``), one transaction.
``pipeline``
    the exactly-once consume-transform-produce pipeline ``input`` -> ``output`` through
    ``subscription``, Trigger.AvailableNow, one task per partition range (``minEntriesPerTask=0``);
    with ``register`` set, the source is registered explicitly (the ``--py-files`` way) and the job
    reports where the executors imported pulsartx from.

The storage options (``pulsartx.storage.*``), if any, are the JSON of
``$PULSARTX_JOB_STORAGE_OPTIONS``; without them, an ``s3://`` root takes the ``AWS_*`` variables of
the driver's environment. Never the command line: Spark records it (``sun.java.command``) in its
event log and environment page. Events go to the ``events`` JSON-lines file; the
job leaves with ``os._exit`` (docs/design/deltalake-in-processes.md).
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

CFG: dict[str, Any] = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
STORAGE_ENV = "PULSARTX_JOB_STORAGE_OPTIONS"


def event(name: str, **payload: Any) -> None:
    line = json.dumps({"event": name, "pid": os.getpid(), "t": time.time(), **payload})
    with open(CFG["events"], "a") as f:
        f.write(line + "\n")


def storage_options() -> dict[str, str]:
    raw = json.loads(os.environ.get(STORAGE_ENV) or "{}")
    return {f"pulsartx.storage.{k}": v for k, v in raw.items()}


def write(spark: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    df = spark.range(int(CFG["rows"]), numPartitions=int(CFG["slices"])).select(
        F.concat(F.lit("v-"), F.col("id").cast("string")).alias("value"),
        F.concat(F.lit("k"), (F.col("id") % 50).cast("string")).alias("__key"))
    (df.write.format("pulsartx").mode("append").options(**storage_options())
     .option("service.url", CFG["root"]).option("topic", CFG["topic"])
     .option("createTopic", "true").option("partitions", str(CFG["partitions"])).save())
    return {}


def where_imported(spark: Any) -> list[str]:
    """``pulsartx.datasource.__file__`` as the executors' Python workers see it, one per task."""

    def origin(_: Any) -> Any:
        import pulsartx.datasource

        yield pulsartx.datasource.__file__

    n = int(spark.sparkContext.defaultParallelism)
    return sorted(set(spark.sparkContext.parallelize(range(n), n).mapPartitions(origin).collect()))


def pipeline(spark: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    report: dict[str, Any] = {}
    if CFG.get("register"):
        from pulsartx.datasource.source import PulsarTxDataSource

        spark.dataSource.register(PulsarTxDataSource)
        report["imported_from"] = where_imported(spark)
    opts = storage_options()
    src = (spark.readStream.format("pulsartx").options(**opts).option("service.url", CFG["root"])
           .option("topic", CFG["input"]).option("subscription", CFG["subscription"])
           .option("startingOffsets", "earliest").option("minEntriesPerTask", "0")
           .option("maxEntriesPerTrigger", str(CFG["max_entries"])).load())
    out = src.select(F.upper(F.col("value").cast("string")).alias("value"), F.col("__key"))
    query = (out.writeStream.format("pulsartx").options(**opts).option("service.url", CFG["root"])
             .option("topic", CFG["output"]).option("checkpointLocation", CFG["checkpoint"])
             .trigger(availableNow=True).start())
    query.awaitTermination()
    report["batches"] = [{"batch": p["batchId"], "rows": p["numInputRows"]} for p in query.recentProgress]
    return report


def main() -> None:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    event("session", app_id=spark.sparkContext.applicationId)
    t0 = time.monotonic()
    try:
        report = {"write": write, "pipeline": pipeline}[CFG["job"]](spark)
    except Exception as e:  # the parent reads the reason from the events
        event("failed", error=str(e)[-6000:])
        sys.stdout.flush()
        os._exit(1)
    seconds = round(time.monotonic() - t0, 2)
    spark.stop()  # the application ends FINISHED and its event log is complete before "done"
    event("done", seconds=seconds, **report)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
