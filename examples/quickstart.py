"""Quickstart: produce with the pulsartx client, read back with Spark.

    make demo
    # or by hand:
    PYSPARK_PYTHON=$(which python) spark-submit --properties-file conf/spark-defaults.conf examples/quickstart.py

The storage root is `spark.pulsartx.service.url` (conf/spark-defaults.conf), else $PULSARTX_SERVICE_URL,
else ./pulsartx-data.
"""
from __future__ import annotations

import os
import sys
import time

from pyspark.sql import SparkSession

import pulsartx
from pulsartx.exceptions import TopicAlreadyExists

TOPIC = "persistent://public/default/quickstart"
PARTITIONS = 4
MESSAGES = 1000


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.appName("pulsartx-quickstart").getOrCreate()
    service_url = spark.conf.get("spark.pulsartx.service.url", None) or os.environ.get("PULSARTX_SERVICE_URL")

    with pulsartx.Client(service_url) as client:
        print(f"storage root: {client.root.url}")
        try:
            client.admin.create_topic(TOPIC, partitions=PARTITIONS)
            print(f"created {TOPIC} with {PARTITIONS} partitions")
        except TopicAlreadyExists:
            print(f"{TOPIC} exists; appending to it")
        run = int(time.time())
        with client.create_producer(TOPIC) as producer:
            for i in range(MESSAGES):
                producer.send_async(f"order-{run}-{i}".encode(), None, partition_key=f"customer-{i % 10}",
                                    properties={"run": str(run)})
            producer.flush()
        print(f"produced {MESSAGES} messages")

    df = (spark.read.format("pulsartx")
          .option("service.url", client.root.url)
          .option("topic", TOPIC)
          .load())
    mine = df.where(df["__messageProperties"]["run"] == str(run))
    print(f"Spark sees {mine.count()} messages of this run; per partition:")
    mine.groupBy("__partition").count().orderBy("__partition").show()
    mine.selectExpr("cast(value as string) as value", "__key", "__partition", "__offset").orderBy("__offset").show(5)
    total = mine.count()
    spark.stop()
    if total != MESSAGES:
        print(f"ERROR: expected {MESSAGES} messages, Spark read {total}", file=sys.stderr)
        return 1
    print("quickstart OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
