"""Spark's rate source -> pulsartx, one transaction per micro-batch.

    PYSPARK_PYTHON=$(which python) spark-submit --properties-file conf/spark-defaults.conf \\
        examples/produce_stream.py [--topic events] [--rows-per-second 1000] [--seconds 30]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import pulsartx


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--service-url", default=os.environ.get("PULSARTX_SERVICE_URL", "./pulsartx-data"))
    ap.add_argument("--topic", default="events")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rows-per-second", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=30, help="stop after this long (0: run until killed)")
    ap.add_argument("--checkpoint", default=None)
    args = ap.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.appName("pulsartx-produce-stream").getOrCreate()
    client = pulsartx.Client(args.service_url)
    root = client.root.url
    client.admin.ensure_topic(args.topic, partitions=args.partitions)
    rate = spark.readStream.format("rate").option("rowsPerSecond", args.rows_per_second).load()
    events = rate.select(
        F.to_json(F.struct("timestamp", "value")).alias("value"),
        (F.col("value") % 16).cast("string").alias("__key"),
        F.col("timestamp").alias("__eventTime"),
    )
    query = (events.writeStream.format("pulsartx")
             .option("service.url", root)
             .option("topic", args.topic)
             .option("checkpointLocation", args.checkpoint or os.path.join(root, "_checkpoints", f"rate-{args.topic}"))
             .trigger(processingTime="1 second")
             .start())
    print(f"rate source -> {args.topic}: {args.rows_per_second} rows/s")
    if args.seconds:
        time.sleep(args.seconds)
        query.stop()
    else:
        query.awaitTermination()
    print(f"done; last progress: {query.lastProgress and query.lastProgress['numInputRows']} rows in the last batch")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
