"""Edge cases of Spark batch reads and writes and their options, each found by an adversarial
review: pushed-down filters meeting offset options, ``__topic`` values that name a partition,
save modes with rows routed by ``__topic``, and errors naming the options the user gave.

Every check is exact: the rows read back, what is stored, and that no transaction is left open.
"""
from __future__ import annotations

from typing import Any

import pytest
from _keys import keys_for  # tests/ is on sys.path (conftest)
from pyspark.sql import functions as F
from spark_jobs.checks import data_count, raw, read, txns, write
from test_spark_write import error_of, open_txns  # tests/ is on sys.path (conftest)

from pulsartx.exceptions import InvalidConfiguration

pytestmark = pytest.mark.spark






def test_pushed_partition_filter_with_offsets_for_a_filtered_out_partition(spark: Any, client: Any,
                                                                           root: str) -> None:
    """With filter pushdown on, ``__partition = 0`` removed partition 1 from the read before the
    offsets JSON was checked, so a JSON naming partition 1 (valid for the topic) failed the read
    with "topic has no partition 1 in this read"."""
    client.admin.create_topic("pd", 2)
    k = keys_for(2)
    p = client.create_producer("pd")
    for i in range(3):
        for part in (0, 1):
            p.send(f"p{part}-{i}".encode(), partition_key=k[part])
    p.close()
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        df = read(spark, root, topic="pd", startingOffsets='{"pd":{"0":1,"1":2}}').where("__partition = 0")
        got = sorted((r[0], r[1], bytes(r[2])) for r in df.select("__partition", "__offset", "value").collect())
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")
    assert got == [(0, 1, b"p0-1"), (0, 2, b"p0-2")]


def test_pushed_partition_filter_returns_what_the_unfiltered_read_filtered_returns(spark: Any, client: Any,
                                                                                   root: str) -> None:
    """A committed transaction on partitions 0 and 1 lies, in partition 1, behind an open one: the
    read hides it whole (no fractured read). With filter pushdown on, ``__partition = 0`` planned
    the cut over partition 0 alone, which showed the transaction there: a pushed filter returned a
    row the same query without pushdown does not."""
    client.admin.create_topic("pt", 2)
    ps = [client.create_producer(f"pt-partition-{i}") for i in range(2)]
    open_txn = client.new_transaction()
    ps[1].send(b"open1", txn=open_txn)
    ps[1].flush()
    txn = client.new_transaction()
    for i, p in enumerate(ps):
        p.send(f"t{i}".encode(), txn=txn)
        p.flush()
    txn.commit()
    ps[0].send(b"a0")
    for p in ps:
        p.close()

    def rows(pushdown: bool, where: str) -> list[bytes]:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", str(pushdown).lower())
        try:
            return sorted(bytes(r[0]) for r in read(spark, root, topic="pt").where(where).select("value").collect())
        finally:
            spark.conf.unset("spark.sql.python.filterPushdown.enabled")

    for where in ("__partition = 0", "__topic = 'persistent://public/default/pt' AND __partition IN (0)"):
        assert rows(False, where) == [b"a0"]
        assert rows(True, where) == [b"a0"], where
    open_txn.abort()
    assert rows(True, "__partition = 0") == [b"a0", b"t0"]


def test_topic_column_naming_a_partition_is_refused_and_writes_nothing(spark: Any, client: Any, root: str) -> None:
    """A ``__topic`` of ``wp-partition-1`` was taken as topic ``wp``: its rows were routed by key
    over every partition (``-partition-1`` silently dropped), while the ``topic`` option refuses a
    partition name. It is refused the same way, before anything is appended."""
    client.admin.create_topic("wp", 2)
    k = keys_for(2)
    df = spark.createDataFrame([(f"v{i}", k[i % 2], "wp-partition-1") for i in range(6)],
                               "value string, __key string, __topic string").coalesce(1)
    msg = error_of(lambda: write(df, root))
    assert "__topic='persistent://public/default/wp-partition-1' names a single partition" in msg, msg
    # A value that is no topic name at all is refused naming the column too.
    msg = error_of(lambda: write(df.withColumn("__topic", F.lit("w p")), root))
    assert "column __topic: topic name 'w p': the topic contains ' '" in msg, msg
    assert data_count(root, "wp") == 0
    assert open_txns(client) == []


def test_save_mode_other_than_append_needs_the_topic_option(spark: Any, client: Any, root: str) -> None:
    """``saveMode=errorifexists`` with rows routed by ``__topic`` (no ``topic`` option) appended to
    an existing topic: the option was silently ignored. It is refused, naming the option, before
    any transaction begins."""
    client.admin.create_topic("se", 1)
    df = spark.createDataFrame([("v0", "se")], "value string, __topic string")
    for mode in ("errorifexists", "ignore"):
        msg = error_of(lambda mode=mode: write(df, root, saveMode=mode))
        assert f"option saveMode={mode} needs the topic option" in msg, msg
    assert data_count(root, "se") == 0
    assert txns(root) == {}


def test_start_time_after_end_time_names_the_time_options(client: Any, root: str) -> None:
    """``startingTimestamp`` later than ``endingTimestamp`` was refused as
    "options startingOffsets/endingOffsets: ... starts at ..., after its end", naming two options
    the user never set. (Planning only: the same code runs in Spark's planner.)"""
    from pulsartx.datasource.batch_reader import plan_partitions
    from pulsartx.datasource.options import parse_options

    client.admin.create_topic("tt", 1)
    p = client.create_producer("tt")
    p.send(b"a")
    p.close()
    first = raw(root, "tt", ("publish_time",)).column("publish_time")[0].as_py()
    t = int(first.timestamp() * 1000)
    opts = parse_options({"service.url": root, "topic": "tt", "startingTimestamp": str(t + 1),
                          "endingTimestamp": str(t)})
    with pytest.raises(InvalidConfiguration) as info:
        plan_partitions(opts.root, opts)
    msg = str(info.value)
    assert "startingTimestamp" in msg and "endingTimestamp" in msg and "startingOffsets" not in msg, msg


def test_half_failed_job_routed_to_two_topics_leaves_nothing_visible(spark: Any, client: Any, root: str) -> None:
    """A UDF raising in one task of a job that routes rows by ``__topic`` to a topic it creates
    on the fly: the job's transaction is aborted, nothing is visible in either topic, and no OPEN
    transaction holds readers back."""
    client.admin.create_topic("fa", 2)

    def boom(v: str) -> str:
        if v == "x-399":
            raise ValueError("injected failure")
        return v

    df = spark.range(400, numPartitions=2).select(
        F.udf(boom, "string", useArrow=False)(F.concat(F.lit("x-"), F.col("id").cast("string"))).alias("value"),
        F.when(F.col("id") % 2 == 0, F.lit("fa")).otherwise(F.lit("fb")).alias("__topic"))
    msg = error_of(lambda: write(df, root, createTopic="true", partitions="2"))
    assert "injected failure" in msg
    assert open_txns(client) == []
    assert [m.status.value for m in txns(root).values()] == ["ABORTED"]
    for topic in ("fa", "fb"):
        if topic in " ".join(client.admin.list_topics()):
            assert read(spark, root, topic=topic).count() == 0


def test_job_failing_before_its_write_stage_leaves_no_open_transaction(spark: Any, client: Any, root: str) -> None:
    """The failing UDF runs in a stage before a shuffle, so the write tasks never start: whether
    Spark fails before or after ``writer()`` began the transaction, none is left OPEN (the driver's
    keep-alive would extend it, blocking READ_COMMITTED readers for as long as the driver lives)."""
    client.admin.create_topic("fs", 2)

    def boom(v: str) -> str:
        if v == "y-7":
            raise ValueError("injected failure before the shuffle")
        return v

    df = spark.range(20, numPartitions=2).select(
        F.udf(boom, "string", useArrow=False)(F.concat(F.lit("y-"), F.col("id").cast("string"))).alias("value")
    ).repartition(3)
    msg = error_of(lambda: write(df, root, topic="fs"))
    assert "injected failure before the shuffle" in msg
    assert open_txns(client) == []
    assert {m.status.value for m in txns(root).values()} <= {"ABORTED"}
    assert data_count(root, "fs") == 0


def test_a_starting_offset_deleted_by_retention_fails_the_read_or_is_skipped(spark: Any, client: Any,
                                                                              root: str) -> None:
    """``startingOffsets`` below what retention left was clamped in silence: a batch read returned
    fewer rows than asked for. As Spark's Kafka source, failOnDataLoss (default true) fails it,
    naming the partition, the deleted offsets and the option; false reads from what is left."""
    from pulsartx.maintenance.retention import apply_retention
    from pulsartx.naming import TopicName

    client.admin.create_topic("dl", 1)
    with client.create_producer("dl") as p:
        for batch in ("old", "new"):
            for i in range(4):
                p.send_async(f"{batch}{i}".encode(), None)
            p.flush()
    assert apply_retention(client.root, TopicName.parse("dl").with_partition(0), max_age_ms=0,
                           force=True).new_start_offset == 4
    msg = error_of(lambda: read(spark, root, topic="dl", startingOffsets='{"dl":{"0":1}}').collect())
    assert "data loss on persistent://public/default/dl-partition-0: offsets 1..3" in msg, msg[-2000:]
    assert "failOnDataLoss=false" in msg, msg[-2000:]
    df = read(spark, root, topic="dl", startingOffsets='{"dl":{"0":1}}', failOnDataLoss="false")
    assert sorted(bytes(r[0]) for r in df.select("value").collect()) == [b"new0", b"new1", b"new2", b"new3"]
