"""Consume-transform-produce over Arrow tables, exactly once, without Spark.

Each loop takes a table of up to ``--batch`` orders off a durable subscription
(``Consumer.receive_table``), enriches it with Polars (or pyarrow.compute where Polars is not
installed, or with ``--pyarrow``), and in one transaction sends the result keyed by customer
(``Producer.send_table``) and acknowledges the input (``Consumer.acknowledge_table``). A crash
anywhere leaves either both or neither: the next run carries on from the last committed table.

    python examples/table_pipeline.py [--root ./pulsartx-data] [--messages 10000] [--batch 1000] [--pyarrow]

The root is ``--root``, else $PULSARTX_SERVICE_URL, else ./pulsartx-data.
"""
from __future__ import annotations

import argparse
import io
import json
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json

import pulsartx

ORDERS, ENRICHED, SUBSCRIPTION = "table-orders", "table-orders-enriched", "enrich"
TAX = 1.2

try:
    import polars as pl
except ImportError:  # optional: the pyarrow.compute transform below does the same
    pl = None


def enrich_polars(orders: pa.Table) -> pa.Table:
    """JSON orders in, JSON orders with their total out, keyed by customer."""
    schema = pl.Struct({"order": pl.Int64, "customer": pl.String, "amount": pl.Int64})
    df = pl.from_arrow(orders.select(["value"]))
    parsed = df.select(pl.col("value").cast(pl.String).str.json_decode(schema).alias("o")).unnest("o")
    out = parsed.with_columns((pl.col("amount") * TAX).round(2).alias("total")).select(
        pl.struct(["order", "customer", "amount", "total"]).struct.json_encode().cast(pl.Binary).alias("value"),
        pl.col("customer").alias("__key"))
    return out.to_arrow()


def enrich_pyarrow(orders: pa.Table) -> pa.Table:
    """The same with pyarrow alone (its JSON reader takes newline-delimited bytes, hence the join)."""
    lines = b"\n".join(orders.column("value").to_pylist())
    parsed = pyarrow.json.read_json(io.BytesIO(lines))
    total = pc.round(pc.multiply(parsed["amount"], TAX), 2)
    text = [pa.scalar('{"order":'), parsed["order"].cast(pa.string()), pa.scalar(',"customer":"'),
            parsed["customer"], pa.scalar('","amount":'), parsed["amount"].cast(pa.string()),
            pa.scalar(',"total":'), total.cast(pa.string()), pa.scalar("}")]
    value = pc.binary_join_element_wise(*text, pa.scalar(""))
    return pa.table({"value": value.cast(pa.binary()), "__key": parsed["customer"]})


def seed(client: pulsartx.Client, n: int) -> None:
    """``n`` orders, sent as tables too (plain sends: they are the pipeline's input)."""
    producer = client.create_producer(ORDERS)
    for lo in range(0, n, 5000):
        rows = range(lo, min(n, lo + 5000))
        customers = [f"customer-{i % 50}" for i in rows]
        orders = [json.dumps({"order": i, "customer": c, "amount": i % 97}).encode()
                  for i, c in zip(rows, customers, strict=True)]
        producer.send_table(pa.table({"value": orders, "__key": customers}))
    producer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.environ.get("PULSARTX_SERVICE_URL", "./pulsartx-data"))
    ap.add_argument("--messages", type=int, default=10_000, help="orders to seed")
    ap.add_argument("--batch", type=int, default=1000, help="rows per table, one transaction each")
    ap.add_argument("--pyarrow", action="store_true", help="transform with pyarrow.compute even if Polars is there")
    args = ap.parse_args()

    enrich = enrich_pyarrow if args.pyarrow or pl is None else enrich_polars
    print(f"transform: {'Polars' if enrich is enrich_polars else 'pyarrow.compute'}"
          f"{' (Polars is not installed)' if pl is None else ''}")
    with pulsartx.Client(args.root) as client:
        client.admin.ensure_topic(ORDERS, partitions=2)
        client.admin.ensure_topic(ENRICHED, partitions=2)
        consumer = client.subscribe(ORDERS, SUBSCRIPTION, initial_position=pulsartx.InitialPosition.Earliest)
        producer = client.create_producer(ENRICHED, batching_max_messages=args.batch)
        seed(client, args.messages)
        taken = sent = tables = 0
        while True:
            orders = consumer.receive_table(max_messages=args.batch, timeout_millis=500)
            if orders.num_rows == 0:
                break
            with client.new_transaction() as txn:  # both or neither, even across a crash
                ids = producer.send_table(enrich(orders), txn=txn)
                consumer.acknowledge_table(orders, txn=txn)
            taken += orders.num_rows
            sent += len(ids)
            tables += 1
        left = consumer.receive_table(timeout_millis=300).num_rows
        print(f"{tables} transactions of up to {args.batch} rows")
        print(f"{taken} orders in, {sent} enriched out, {left} left on the subscription")


if __name__ == "__main__":
    main()
