"""Spark's rate source -> pulsartx, one transaction per micro-batch.

    PYSPARK_PYTHON=$(which python) spark-submit --properties-file conf/spark-defaults.conf \\
        examples/produce_stream.py [--topic events] [--rows-per-second 1000] [--seconds 30]

After ``--seconds`` it stops at the next batch boundary, once a batch with rows has committed (a
busy machine may spend the whole time starting up), and prints how many messages the run added to
the topic, as a READ_COMMITTED read counts them. A stop in the middle of a batch would be clean
too: that batch's transaction is aborted, and the next run writes its rows.
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
    before = committed_count(spark, root, args.topic)
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
        stop_after_a_batch(query, grace_s=STOP_GRACE_S)
    else:
        query.awaitTermination()
    if query.exception() is not None:
        print(f"the query failed: {query.exception()}", file=sys.stderr)
        return 1
    wrote = committed_count(spark, root, args.topic) - before
    print(f"wrote {wrote} messages to {args.topic} in {len(query.recentProgress)} micro-batches")
    spark.stop()
    return 0


STOP_GRACE_S = 300  # how long past --seconds to wait for a batch with rows to commit


def committed_count(spark: SparkSession, root: str, topic: str) -> int:
    """The topic's messages as a READ_COMMITTED reader sees them."""
    return spark.read.format("pulsartx").option("service.url", root).option("topic", topic).load().count()


def stop_after_a_batch(query, grace_s: float) -> None:
    """Stop once a batch that began after now has completed (the stop then lands between two
    batches, or early in the next one), and one with rows has committed; at most ``grace_s`` on."""
    def last_batch() -> int:
        p = query.lastProgress
        return -1 if p is None else p["batchId"]

    seen = last_batch()
    deadline = time.monotonic() + grace_s
    while query.isActive and time.monotonic() < deadline:
        if last_batch() > seen and any(p["numInputRows"] for p in query.recentProgress):
            break
        time.sleep(0.05)
    query.stop()


if __name__ == "__main__":
    sys.exit(main())
