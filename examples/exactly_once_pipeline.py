"""Exactly-once consume-transform-produce: pulsartx topic -> Spark transform -> pulsartx topic.

Every micro-batch is one pulsartx transaction: its output messages and the cumulative
acknowledgement of its input on the durable subscription commit together. Kill it at any point
and run it again (with or without its checkpoint): each input appears in the output exactly once.

    PYSPARK_PYTHON=$(which python) spark-submit --properties-file conf/spark-defaults.conf \\
        examples/exactly_once_pipeline.py [--input orders] [--output orders-enriched] \\
        [--checkpoint ./pulsartx-data/_checkpoints/enrich] [--available-now] [--seed 1000]

--seed N produces N input messages first (so the example runs on a fresh machine).
"""
from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import pulsartx


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--service-url", default=os.environ.get("PULSARTX_SERVICE_URL", "./pulsartx-data"))
    ap.add_argument("--input", default="orders")
    ap.add_argument("--output", default="orders-enriched")
    ap.add_argument("--subscription", default="enrich")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0, help="produce this many input messages first")
    ap.add_argument("--max-entries-per-trigger", type=int, default=10_000)
    ap.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    args = ap.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.appName("pulsartx-exactly-once-pipeline").getOrCreate()
    client = pulsartx.Client(args.service_url)
    root = client.root.url
    checkpoint = args.checkpoint or os.path.join(root, "_checkpoints", args.subscription)
    for topic in (args.input, args.output):
        client.admin.ensure_topic(topic, partitions=args.partitions)
    if args.seed:
        with client.create_producer(args.input) as producer:
            for i in range(args.seed):
                producer.send_async(f'{{"order": {i}, "amount": {i % 100}}}'.encode(), None,
                                    partition_key=f"customer-{i % 50}")
        print(f"produced {args.seed} messages to {args.input}")

    orders = (spark.readStream.format("pulsartx")
              .schema("value binary, __key string, __offset long")  # only what the transform uses
              .option("service.url", root)
              .option("topic", args.input)
              .option("subscription", args.subscription)
              .option("startingOffsets", "earliest")
              .option("maxEntriesPerTrigger", str(args.max_entries_per_trigger))
              .load())
    enriched = orders.select(
        F.to_json(F.struct(
            F.get_json_object(F.col("value").cast("string"), "$.order").cast("long").alias("order"),
            (F.get_json_object(F.col("value").cast("string"), "$.amount").cast("double") * 1.2).alias("gross"),
            F.col("__key").alias("customer"),
            F.col("__offset").alias("source_offset"))).alias("value"),
        F.col("__key"),  # same key -> same output partition: per-key order is kept
    )
    writer = (enriched.writeStream.format("pulsartx")
              .option("service.url", root)
              .option("topic", args.output)
              .option("checkpointLocation", checkpoint)
              .queryName(f"pulsartx-{args.subscription}"))
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="2 seconds")
    query = writer.start()
    print(f"streaming {args.input} -> {args.output} (subscription {args.subscription!r}, checkpoint {checkpoint})")
    query.awaitTermination()
    progress = query.lastProgress
    if progress:
        print(f"last batch {progress['batchId']}: {progress['numInputRows']} input rows")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
