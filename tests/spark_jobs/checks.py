"""What the Spark write tests look at after a job: TC records, raw partition rows, markers, and
READ_COMMITTED / READ_UNCOMMITTED reads through ``spark.read.format("pulsartx")``.

Everything here observes storage without changing it: TC logs are opened with
``recover_on_open=False`` (opening a TC normally sweeps, which would finish the very transactions
a crash test wants to look at before recovery).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

RC, RU = "READ_COMMITTED", "READ_UNCOMMITTED"


def write(df: Any, root: str, **options: str) -> None:
    df.write.format("pulsartx").mode("append").option("service.url", root).options(**options).save()


def read(spark: Any, root: str, level: str | None = None, **options: str) -> Any:
    r = spark.read.format("pulsartx").option("service.url", root).options(**options)
    if level is not None:
        r = r.option("isolationLevel", level)
    return r.load()


def txns(root: Any) -> dict[str, Any]:
    """Every transaction in every TC log of ``root`` (a StorageRoot or URL): {str(TxnID): TxnMeta}."""
    from pulsartx.coordinator.registry import Coordinators
    from pulsartx.storage.root import StorageRoot

    sr = root if isinstance(root, StorageRoot) else StorageRoot.resolve(root)
    return {str(m.txn_id): m for tc in Coordinators(sr, recover_on_open=False).all() for m in tc.transactions()}


def txn_meta(root: Any, txn_id: str) -> Any:
    return txns(root)[txn_id]


def raw(root: Any, topic: str, columns: tuple[str, ...] = ("type", "value", "producer_name", "txn_most_bits",
                                                          "txn_least_bits")) -> pa.Table:
    """Every stored record of every partition of ``topic`` (markers included), with ``partition``."""
    from pulsartx.admin.topics import TopicsAdmin
    from pulsartx.log.partition import PartitionLog
    from pulsartx.storage.root import StorageRoot

    sr = root if isinstance(root, StorageRoot) else StorageRoot.resolve(root)
    tables = []
    for p in TopicsAdmin(sr).partitions_of(topic):
        plog = PartitionLog(sr, p)
        t = plog.read(0, plog.end_offset(), columns=list(columns))
        tables.append(t.append_column("partition", pa.array([p.partition] * t.num_rows, pa.int32())))
    return pa.concat_tables(tables)


def data_count(root: Any, topic: str) -> int:
    """DATA records of ``topic``, whatever their visibility (markers excluded)."""
    t = raw(root, topic, ("type",))
    return int(pc.sum(pc.equal(t.column("type"), "DATA")).as_py() or 0)


def markers(root: Any, topic: str) -> Counter:
    """Counter of (partition, marker type, str(TxnID)) over ``topic``."""
    t = raw(root, topic, ("type", "txn_most_bits", "txn_least_bits")).to_pylist()
    return Counter((r["partition"], r["type"], f"({r['txn_most_bits']},{r['txn_least_bits']})")
                   for r in t if r["type"] != "DATA")


def values(df: Any) -> list[str]:
    return [bytes(r[0]).decode() for r in df.select("value").collect()]


def counts_by_prefix(df: Any, sep: str = "-") -> dict[str, int]:
    """Rows per value prefix (the job id before ``sep``)."""
    from pyspark.sql import functions as F

    rows = df.groupBy(F.substring_index(F.col("value").cast("string"), sep, 1).alias("p")).count().collect()
    return {r["p"]: r["count"] for r in rows}


def counts_by_topic(df: Any) -> dict[str, int]:
    return {r["__topic"]: r["count"] for r in df.groupBy("__topic").count().collect()}
