"""Quickstart: what pulsartx is for, in one screen.

1. One transaction produces to two topics and commits; another does the same and aborts.
2. A Spark READ_COMMITTED read of both topics returns exactly the committed messages.
3. Consume-transform-produce: a streaming job reads the orders on a durable subscription and
   writes invoices; each micro-batch's output and the acknowledgement of its input commit as one
   transaction, so every order becomes exactly one invoice, through crashes and restarts.
4. The CLI commands to look at what it left behind.

    make demo
    # or by hand, from the repository (quiet Spark logs come from conf/log4j2.properties):
    PYSPARK_PYTHON=$(pwd)/.venv/bin/python .venv/bin/spark-submit --properties-file conf/spark-defaults.conf \\
        examples/quickstart.py

The storage root is `spark.pulsartx.service.url` (conf/spark-defaults.conf), else $PULSARTX_SERVICE_URL,
else ./pulsartx-data. Run it again: each run tags its messages and shows only its own.
"""
from __future__ import annotations

import json
import os
import sys
import uuid

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import pulsartx

ORDERS, PAYMENTS, INVOICES = "demo-orders", "demo-payments", "demo-invoices"
SUBSCRIPTION = "invoicing"


def order(n: int, customer: str, amount: int) -> bytes:
    return json.dumps({"order": n, "customer": customer, "amount": amount}).encode()


def produce(client: pulsartx.Client, run: str) -> None:
    """Step 1: two transactions, each across two topics; one commits, one aborts."""
    props = {"run": run}
    orders = client.create_producer(ORDERS)
    payments = client.create_producer(PAYMENTS)
    with client.new_transaction() as txn:  # commits on success, aborts on an exception
        orders.send(order(1, "alice", 30), txn=txn, partition_key="alice", properties=props)
        orders.send(order(2, "bob", 12), txn=txn, partition_key="bob", properties=props)
        payments.send(b'{"order": 1, "paid": 30}', txn=txn, partition_key="alice", properties=props)
    print(f"committed txn {txn.txn_id}: orders 1 and 2 to {ORDERS}, a payment to {PAYMENTS}")
    txn = client.new_transaction()
    orders.send(order(3, "carol", 99), txn=txn, partition_key="carol", properties=props)
    payments.send(b'{"order": 3, "paid": 99}', txn=txn, partition_key="carol", properties=props)
    txn.abort()
    print(f"aborted   txn {txn.txn_id}: order 3 to {ORDERS}, a payment to {PAYMENTS}")


def read(spark: SparkSession, root: str, run: str, isolation: str) -> list[tuple[str, str]]:
    df = (spark.read.format("pulsartx")
          .schema("value binary, __topic string, __messageProperties map<string,string>")
          .option("service.url", root).option("topics", f"{ORDERS},{PAYMENTS}")
          .option("isolationLevel", isolation).load())
    rows = df.where(df["__messageProperties"]["run"] == run).select("__topic", "value").collect()
    return sorted((r["__topic"].rsplit("/", 1)[-1], r["value"].decode()) for r in rows)


def transform(spark: SparkSession, root: str) -> None:
    """Step 3: demo-orders -> invoice -> demo-invoices, one transaction per micro-batch."""
    orders = (spark.readStream.format("pulsartx")
              .schema("value binary, __key string, __messageProperties map<string,string>")
              .option("service.url", root).option("topic", ORDERS)
              .option("subscription", SUBSCRIPTION).option("startingOffsets", "earliest").load())
    amount = F.get_json_object(F.col("value").cast("string"), "$.amount").cast("double")
    invoices = orders.select(
        F.to_json(F.struct(
            F.get_json_object(F.col("value").cast("string"), "$.order").cast("long").alias("order"),
            F.col("__key").alias("customer"),
            F.round(amount * 1.2, 2).alias("gross"))).cast("binary").alias("value"),
        F.col("__key"), F.col("__messageProperties"))
    query = (invoices.writeStream.format("pulsartx")
             .option("service.url", root).option("topic", INVOICES)
             .option("checkpointLocation", os.path.join(root, "_checkpoints", "quickstart-" + SUBSCRIPTION))
             .trigger(availableNow=True).start())
    query.awaitTermination()


def _here(path: str, otherwise: str) -> str:
    """``path`` relative to the working directory when it is below it (``./pulsartx-data``)."""
    if "://" in path or not os.path.exists(path):
        return otherwise
    rel = os.path.relpath(path)
    return otherwise if rel.startswith("..") else rel if rel.startswith(".") else "./" + rel


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.appName("pulsartx-quickstart").getOrCreate()
    service_url = spark.conf.get("spark.pulsartx.service.url", None) or os.environ.get("PULSARTX_SERVICE_URL")
    run = uuid.uuid4().hex[:8]

    with pulsartx.Client(service_url) as client:
        root = client.root.url
        print(f"storage root {root}, run {run}\n")
        print("1. One transaction across two topics, committed; another aborted")
        for topic, partitions in ((ORDERS, 2), (PAYMENTS, 1), (INVOICES, 2)):
            client.admin.ensure_topic(topic, partitions=partitions)
        produce(client, run)

    print("\n2. Spark reads both topics READ_COMMITTED: exactly the committed messages")
    committed = read(spark, root, run, "READ_COMMITTED")
    for topic, value in committed:
        print(f"   {topic:<14} {value}")
    uncommitted = read(spark, root, run, "READ_UNCOMMITTED")
    print(f"   (READ_UNCOMMITTED shows {len(uncommitted)}: the aborted transaction's 2 as well)")

    print(f"\n3. Consume-transform-produce: {ORDERS} -> {INVOICES}, exactly once")
    transform(spark, root)
    invoices = (spark.read.format("pulsartx").schema("value binary, __messageProperties map<string,string>")
                .option("service.url", root).option("topic", INVOICES).load())
    mine = sorted(r["value"].decode() for r in
                  invoices.where(invoices["__messageProperties"]["run"] == run).select("value").collect())
    for value in mine:
        print(f"   {INVOICES:<14} {value}")
    print(f"   each micro-batch wrote its invoices and acknowledged its orders on subscription "
          f"{SUBSCRIPTION!r} in one transaction")
    spark.stop()

    cli = f"{_here(os.path.join(sys.prefix, 'bin', 'pulsartx'), 'pulsartx')} --service-url {_here(root, root)}"
    print("\n4. Look at it next")
    for args in ("topics list", f"topics stats {ORDERS}", f"topics peek {INVOICES}",
                 f"subscriptions list {ORDERS}", "transactions coordinator-stats"):
        print(f"   {cli} {args}")

    expected = [(ORDERS, order(1, "alice", 30).decode()), (ORDERS, order(2, "bob", 12).decode()),
                (PAYMENTS, '{"order": 1, "paid": 30}')]
    if committed != sorted(expected) or len(uncommitted) != 5 or len(mine) != 2:
        print(f"ERROR: read {committed}, {len(uncommitted)} uncommitted, invoices {mine}", file=sys.stderr)
        return 1
    print("\nquickstart OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
