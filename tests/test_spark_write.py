"""``df.write.format("pulsartx")``: one Spark job is one transaction, through the session's real
local[2] SparkSession (no task retries; the retry and driver-crash cases run their own sessions in
``spark-submit`` subprocesses, tests/test_spark_write_crash.py).

Every check is exact: the rows read back equal the rows written (chispa), the job leaves exactly
one transaction in the TC logs with one commit marker per partition it touched, and a failed or
refused job leaves no visible row and no open transaction.
"""
from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from chispa import assert_df_equality
from pulsartx.commit_protocol.keepalive import TIMEOUT_PROPERTY
from pyspark.sql import functions as F
from spark_jobs.checks import RU, counts_by_prefix, data_count, markers, raw, read, txns, values, write

from pulsartx.client.routing import partition_for_key
from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.state import TxnStatus
from pulsartx.storage.root import StorageRoot

pytestmark = pytest.mark.spark
A, B = "persistent://public/default/wa", "persistent://public/default/wb"
EVENT_US0 = 1_700_000_000_000_000


def error_of(action: Any) -> str:
    with pytest.raises(Exception) as info:
        action()
    return str(info.value)


def open_txns(client: Any) -> list[dict[str, Any]]:
    return client.admin.transactions.get_slow_transactions(0)


def settled_count(root: str, topic: str, quiet_s: float = 2.0, timeout_s: float = 60.0) -> int:
    """DATA records of ``topic`` once no more arrive: after a failed job, a task Spark cancelled may
    still be appending (its pyspark worker finishes the batch it holds; a transactional job's rows
    then land after its abort marker and stay invisible)."""
    deadline = time.monotonic() + timeout_s
    last, since = data_count(root, topic), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.25)
        n = data_count(root, topic)
        if n != last:
            last, since = n, time.monotonic()
    return last


# ---- one job, one transaction -------------------------------------------------------------------
def test_100k_rows_over_two_topics_read_back_exactly(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("wa", 4)
    client.admin.create_topic("wb", 4)
    n = 100_000

    def rows(df: Any) -> Any:
        """The written columns; the same expressions build the expectation (no Python worker)."""
        i = F.col("id")
        return df.select(
            F.concat(F.lit("v-"), i.cast("string")).alias("value"),
            F.when(i % 7 == 0, F.lit(None)).otherwise(F.concat(F.lit("key-"), (i % 1000).cast("string"))).alias("__key"),
            F.when(i % 2 == 0, F.lit(A)).otherwise(F.lit(B)).alias("__topic"),
            F.when(i % 5 == 0, F.timestamp_micros(F.lit(EVENT_US0) + i)).alias("__eventTime"),
            F.when(i % 3 == 0, F.create_map(F.lit("i"), i.cast("string"))).alias("__messageProperties"))

    src = rows(spark.range(n, numPartitions=8))
    assert src.rdd.getNumPartitions() == 8
    write(src, root)

    # One Spark read of everything, kept as Arrow: the checks below need no further scan.
    back = read(spark, root, topics="wa,wb").select(
        F.col("value").cast("string").alias("value"), "__key", "__topic", "__partition", "__eventTime",
        "__messageProperties").toArrow()
    assert back.num_rows == n
    actual = spark.createDataFrame(back.select(["value", "__key", "__topic"]))
    expected = rows(spark.range(n)).select("value", "__key", "__topic")
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)

    # Event times and properties, row by row (sorted by value).
    got = back.sort_by("value")
    ids = sorted(range(n), key=lambda i: f"v-{i}")
    assert got.column("value").to_pylist() == [f"v-{i}" for i in ids]
    assert got.column("__eventTime").cast(pa.int64()).to_pylist() == [EVENT_US0 + i if i % 5 == 0 else None
                                                                       for i in ids]
    assert got.column("__messageProperties").to_pylist() == [[("i", str(i))] if i % 3 == 0 else None for i in ids]

    # Key routing: every key of a topic lands on one partition, Pulsar's hash of the key.
    keyed = back.filter(pc.is_valid(back.column("__key")))
    routed = keyed.group_by(["__topic", "__key"]).aggregate([("__partition", "min"), ("__partition", "max"),
                                                               ("__partition", "count")])
    assert routed.num_rows == 1000  # key-k is on topic wa for even k, on wb for odd k
    for r in routed.to_pylist():
        assert r["__partition_min"] == r["__partition_max"] == partition_for_key(r["__key"], 4), r
    assert sum(routed.column("__partition_count").to_pylist()) == n - len(range(0, n, 7))
    # Rows without a key go round-robin by Arrow batch; the 8 tasks start at different partitions, so
    # together they cover every partition of both topics.
    unkeyed = back.filter(pc.is_null(back.column("__key")))
    assert len(set(zip(unkeyed.column("__topic").to_pylist(), unkeyed.column("__partition").to_pylist(),
                       strict=True))) == 8

    # One transaction, committed, with every partition it touched and the exact entries.
    ts = txns(root)
    assert len(ts) == 1
    (txn_id, meta), = ts.items()
    assert meta.status is TxnStatus.COMMITTED
    assert meta.partitions == {f"{t}-partition-{i}" for t in (A, B) for i in range(4)}
    assert sum(b - a + 1 for _, a, b in meta.commit_entries) == n
    for topic in ("wa", "wb"):
        assert markers(root, topic) == Counter({(i, "TXN_COMMIT", txn_id): 1 for i in range(4)})
        assert data_count(root, topic) == n // 2  # nothing but this job's rows: no duplicate append
    assert open_txns(client) == []


def test_transaction_timeout_and_producer_name_options(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("opt", 2)
    df = spark.range(10, numPartitions=2).selectExpr("cast(id as string) as value")
    write(df, root, topic="opt", transactionTimeoutMs="123456", producerName="etl")
    (first,) = txns(root)
    write(df, root, topic="opt")
    (second,) = set(txns(root)) - {first}
    # The timeout each extension of the driver's keep-alive moves the deadline by (30 s by default);
    # the TC entry's timeout_ms is its deadline, at least that.
    metas = txns(root)
    assert metas[first].status is TxnStatus.COMMITTED and metas[second].status is TxnStatus.COMMITTED
    assert metas[first].properties[TIMEOUT_PROPERTY] == "123456" and metas[first].timeout_ms >= 123456
    assert metas[second].properties[TIMEOUT_PROPERTY] == "30000" and metas[second].timeout_ms >= 30_000
    producers = raw(root, "opt").filter(pc.equal(raw(root, "opt").column("type"), "DATA")).column("producer_name")
    names = set(producers.to_pylist())
    # Per (job, Spark task attempt id, task, attempt) under the given name.
    assert any(re.fullmatch(rf"etl-{re.escape(str(first))}-i\d+-t\d+-a\d+", p) for p in names), names
    assert read(spark, root, topic="opt").count() == 20


def test_a_drivers_jobs_begin_on_the_tc_it_holds_the_lease_of(spark: Any, client: Any, root: str) -> None:
    """The driver-side Python worker that begins the jobs' transactions holds one TC lease: its
    jobs all begin on that log, which no other process begins transactions on meanwhile."""
    client.admin.create_topic("lz", 2)
    df = spark.range(4, numPartitions=2).selectExpr("cast(id as string) as value")
    for _ in range(3):
        write(df, root, topic="lz")
    metas = list(txns(root).values())
    assert len(metas) == 3 and all(m.status is TxnStatus.COMMITTED for m in metas)
    (tc,) = {m.txn_id.most_bits for m in metas}
    lease = Coordinators(StorageRoot.resolve(root), recover_on_open=False).tc(tc).txlog.lease()
    assert lease is not None and not lease.released and lease.owner.split(":")[1] != str(os.getpid())


def test_compression_type_option_sets_the_payload_codec_and_bad_values_are_named(spark: Any, client: Any,
                                                                                  root: str) -> None:
    import glob

    import pyarrow.parquet as pq

    client.admin.create_topic("cz", 1)
    df = spark.range(100, numPartitions=2).selectExpr("cast(id as string) as value")
    message = error_of(lambda: write(df, root, topic="cz", compressionType="brotli"))
    assert "option compressionType='brotli'" in message and "ZSTD" in message
    assert txns(root) == {} and data_count(root, "cz") == 0  # refused before any transaction began
    write(df, root, topic="cz", compressionType="zstd")
    files = glob.glob(f"{root}/topics/public/default/cz/partition-0/*.parquet")
    data_files = [pq.ParquetFile(f) for f in files if pq.ParquetFile(f).metadata.num_rows > 1]  # not the marker
    assert len(data_files) == 2 and all(f.schema_arrow.names[2] == "value" for f in data_files)
    assert {f.metadata.row_group(0).column(2).compression for f in data_files} == {"ZSTD"}
    assert sorted(values(read(spark, root, topic="cz"))) == sorted(str(i) for i in range(100))


# ---- failures ---------------------------------------------------------------------------------
def failing_rows(spark: Any, n: int, slices: int, prefix: str) -> Any:
    """``n`` rows in ``slices`` tasks; the last task always fails (local[2]: no retry)."""
    from pyspark import TaskContext

    last = slices - 1

    def boom(v):  # no type hints: pyspark would try to infer an Arrow UDF from them
        if TaskContext.get().partitionId() == last:
            raise RuntimeError("injected failure of the last task")
        return v

    return spark.range(n, numPartitions=slices).select(
        F.udf(boom, "string", useArrow=False)(F.concat(F.lit(f"{prefix}-"), F.col("id").cast("string"))).alias("value"))


def test_failed_job_is_aborted_invisible_and_does_not_block(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("jf", 4)
    msg = error_of(lambda: write(failing_rows(spark, 4000, 4, "failed"), root, topic="jf"))
    assert "injected failure of the last task" in msg
    (txn_id, meta), = txns(root).items()
    assert meta.status is TxnStatus.ABORTED  # abort() ran before save() raised
    assert open_txns(client) == []
    appended = settled_count(root, "jf")
    assert 0 < appended < 4000  # the tasks that finished did append ...
    assert read(spark, root, topic="jf").count() == 0  # ... and none of it is visible
    assert read(spark, root, RU, topic="jf").count() == appended
    assert all(t == "TXN_ABORT" and x == txn_id for (_, t, x) in markers(root, "jf"))

    # A later job to the same partitions is readable at once: nothing to wait for or sweep.
    t0 = time.monotonic()
    write(spark.range(1000, numPartitions=4).selectExpr("concat('later-', id) as value"), root, topic="jf")
    got = values(read(spark, root, topic="jf"))
    assert sorted(got) == sorted(f"later-{i}" for i in range(1000))
    assert time.monotonic() - t0 < 120
    # Still nothing of the failed job, now that every task of it is long gone.
    assert counts_by_prefix(read(spark, root, topic="jf")) == {"later": 1000}


def test_non_transactional_rows_are_visible_at_once(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("plain", 2)
    write(spark.range(500, numPartitions=2).selectExpr("concat('ok-', id) as value"), root, topic="plain",
          transactional="false")
    assert txns(root) == {}
    stored = raw(root, "plain")
    assert stored.column("txn_most_bits").null_count == stored.num_rows == 500  # no marker either
    # A failing non-transactional job: what its finished tasks appended is visible right away.
    msg = error_of(lambda: write(failing_rows(spark, 4000, 4, "partial"), root, topic="plain",
                                 transactional="false"))
    assert "injected failure of the last task" in msg
    assert txns(root) == {}
    stored = settled_count(root, "plain")
    got = counts_by_prefix(read(spark, root, topic="plain"))
    assert got["ok"] == 500 and 0 < got["partial"] < 4000
    assert got["partial"] == stored - 500


# ---- concurrent readers --------------------------------------------------------------------------
def test_no_fractured_reads_while_jobs_commit(spark: Any, client: Any, root: str) -> None:
    """Jobs spanning 8 partitions commit one after another while two readers loop: Spark batch
    reads and the same planning + executor code called directly (many more reads per second).
    Every read returns each job whole or not at all, and the jobs it returns are a prefix of the
    commit order."""
    from pulsartx.datasource.batch_reader import plan_partitions, read_partition
    from pulsartx.datasource.options import parse_options

    client.admin.create_topic("frac", 8)
    jobs, rows = 6, 4000
    stop = threading.Event()
    seen: dict[str, list[dict[str, int]]] = {"spark": [], "direct": []}
    errors: list[BaseException] = []

    def check(counts: dict[str, int]) -> None:
        assert all(c == rows for c in counts.values()), f"partial job in a read: {counts}"
        visible = sorted(counts)
        assert visible == [f"j{j}" for j in range(len(visible))], f"not a prefix of the commits: {visible}"

    def loop(name: str, once: Any) -> None:
        try:
            while not stop.is_set():
                counts = once()
                seen[name].append(counts)
                check(counts)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            stop.set()

    def direct() -> dict[str, int]:
        opts = parse_options({"service.url": root, "topic": "frac"})
        c: Counter = Counter()
        for part in plan_partitions(opts.root, opts):
            for batch in read_partition(opts.root, part):
                prefix = pc.binary_slice(batch.column("value"), 0, 2).cast("string")
                c.update(dict(zip(*(x.to_pylist() for x in pc.value_counts(prefix).flatten()), strict=True)))
        return dict(c)

    readers = [threading.Thread(target=loop, args=("spark", lambda: counts_by_prefix(read(spark, root, topic="frac"))),
                                daemon=True),
               threading.Thread(target=loop, args=("direct", direct), daemon=True)]
    for t in readers:
        t.start()
    try:
        for j in range(jobs):
            if stop.is_set():
                break
            df = spark.range(rows, numPartitions=8).selectExpr(f"concat('j{j}-', id) as value")
            write(df, root, topic="frac")
    finally:
        stop.set()
        for t in readers:
            t.join(120)
    if errors:
        raise errors[0]
    final = counts_by_prefix(read(spark, root, topic="frac"))
    assert final == {f"j{j}": rows for j in range(jobs)}
    assert {len(m.partitions) for m in txns(root).values()} == {8}  # every job spans all 8 partitions
    partial = [s for s in seen["spark"] + seen["direct"] if 0 < len(s) < jobs]
    assert len(seen["direct"]) >= 3 and len(seen["spark"]) >= 1, {k: len(v) for k, v in seen.items()}
    assert partial, "no read overlapped the jobs: the test proved nothing"


# ---- refused input ------------------------------------------------------------------------------
def test_bad_input_is_refused_and_writes_nothing(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("bad", 2)
    write(spark.range(5).selectExpr("concat('seed-', id) as value"), root, topic="bad")
    baseline = txns(root)

    def refused(df: Any, *expected: str, mode: str = "append", **options: str) -> None:
        w = df.write.format("pulsartx").option("service.url", root).options(**options)
        msg = error_of(lambda: (w.mode(mode) if mode else w).save())
        for text in expected:
            assert text in msg, f"{text!r} not in:\n{msg}"
        assert data_count(root, "bad") == 5  # nothing appended
        assert open_txns(client) == []  # no transaction left open

    good = spark.range(3).selectExpr("concat('x-', id) as value")
    refused(spark.range(3).selectExpr("cast(id as string) as __key"), "the DataFrame has no 'value' column",
            "(it has __key)", topic="bad")
    refused(good.withColumn("payload", F.lit(1)), "column 'payload' is not written by pulsartx", topic="bad")
    refused(good.withColumn("__offset", F.lit(1)), "column '__offset' is not written by pulsartx", topic="bad")
    refused(good, "mode('overwrite') is not supported", "Use mode('append')",
            f"`pulsartx --service-url {root} topics delete public/default/bad`", mode="overwrite", topic="bad")
    for mode in ("errorifexists", "ignore", None):
        refused(good, "UNSUPPORTED_DATA_SOURCE_SAVE_MODE", mode=mode, topic="bad")  # Spark's own check
    for col, expr, shown in [("value", "id", "column 'value' has type bigint: it must be binary or string"),
                             ("__key", "id", "column '__key' has type bigint: it must be string"),
                             ("__topic", "id", "column '__topic' has type bigint: it must be string"),
                             ("__eventTime", "'2024-01-01'", "column '__eventTime' has type string: it must be timestamp"),
                             ("__messageProperties", "map('a', 1)", "must be map<string,string>"),
                             ("__partition", "'1'", "column '__partition' has type string: it must be int")]:
        cols = [f"{expr} AS {col}"] if col == "value" else ["concat('x-', id) AS value", f"{expr} AS {col}"]
        refused(spark.range(3).selectExpr(*cols), shown, topic="bad")
    refused(good, "no topic to write to", "__topic column")
    refused(good, "option topics is for reading", topics="bad")
    refused(good, "names a single partition", topic="bad-partition-1")
    refused(good, "option saveMode='bogus' is invalid", topic="bad", saveMode="bogus")
    refused(good, "option transactional='maybe' is invalid", topic="bad", transactional="maybe")
    refused(good, "option transactionTimeoutMs='0' is invalid", topic="bad", transactionTimeoutMs="0")
    refused(good, "topic persistent://public/default/bad already exists and option saveMode=errorifexists",
            topic="bad", saveMode="errorifexists")
    refused(good, "persistent://public/default/missing does not exist", "createTopic=true",
            f"`pulsartx --service-url {root} topics create public/default/missing`", topic="missing")
    refused(good, "option partitions=4 does not match topic persistent://public/default/bad, which has 2 partitions",
            "set partitions=2", f"`pulsartx --service-url {root} topics update-partitioned-topic public/default/bad -p 4`",
            topic="bad", partitions="4")
    refused(good, "option partitions=1 does not match topic persistent://public/default/bad, which has 2 partitions",
            f"`pulsartx --service-url {root} topics delete public/default/bad`", "a count only grows",
            topic="bad", partitions="1")
    refused(good, "option partitions=3 does not match topic persistent://public/default/bad, which has 2 partitions",
            "set partitions=2", topic="bad", createTopic="true", partitions="3")
    assert client.admin.list_topics() == ["persistent://public/default/bad"]  # nothing created
    assert txns(root) == baseline  # every refusal above happened before a transaction began

    # Refused inside the tasks: the job's transaction is aborted, and nothing is visible.
    refused(good.withColumn("__partition", F.lit(7)), "__partition=7 is out of range: topic "
            "persistent://public/default/bad has 2 partitions (0..1); give a __partition from 0 to 1", topic="bad")
    refused(good.withColumn("__topic", F.lit("nowhere")), "topic persistent://public/default/nowhere (from the "
            "__topic column) does not exist", "createTopic=true")
    refused(good.withColumn("__topic", F.lit(None).cast("string")), "a row has a null __topic and no topic option")
    failed = {k: m for k, m in txns(root).items() if k not in baseline}
    assert len(failed) == 3 and all(m.status is TxnStatus.ABORTED for m in failed.values())
    assert sorted(values(read(spark, root, topic="bad"))) == [f"seed-{i}" for i in range(5)]


def test_save_modes_and_topic_creation(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("exists", 2)
    df = spark.range(30, numPartitions=3).selectExpr("cast(concat('b-', id) as binary) as value")  # binary value

    def topic_values(topic: str) -> list[str]:
        return sorted(values(read(spark, root, topic=topic)))

    expected = sorted(f"b-{i}" for i in range(30))
    # saveMode=ignore: an existing topic is left alone, without even a transaction.
    write(df, root, topic="exists", saveMode="ignore")
    assert data_count(root, "exists") == 0 and txns(root) == {}
    # ... a missing one is created (partitions option) and written.
    write(df, root, topic="ign", saveMode="ignore", partitions="3")
    assert topic_values("ign") == expected
    # saveMode=errorifexists: a missing topic is created and written.
    write(df, root, topic="eie", saveMode="errorifexists", partitions="2")
    assert topic_values("eie") == expected
    # createTopic=true with the default saveMode (append).
    write(df, root, topic="made", createTopic="true", partitions="3")
    assert topic_values("made") == expected
    # createTopic=true for topics named by the __topic column.
    routed = df.withColumn("__topic", F.when(F.col("value").cast("string").endswith("0"), F.lit("c1"))
                           .otherwise(F.lit("c2")))
    write(routed, root, createTopic="true", partitions="2")
    assert topic_values("c1") == sorted(f"b-{i}" for i in range(30) if i % 10 == 0)
    assert len(topic_values("c2")) == 27
    assert [client.admin.get_partitions(t) for t in ("ign", "eie", "made", "c1", "c2")] == [3, 2, 3, 2, 2]
    assert all(m.status is TxnStatus.COMMITTED for m in txns(root).values())
    assert len(txns(root)) == 4
