"""``spark.read.format("pulsartx")`` against real Delta tables, through a real local[2] SparkSession.

Everything is produced with ``pulsartx.Client`` and compared exactly (chispa) with what the
producer reported: values, keys, properties, event times, partitions, offsets and message ids.
"""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pulsartx.datasource.options import parse_options
from pulsartx.datasource.schema import SPARK_SCHEMA, arrow_schema, message_ids

from pulsartx import MessageId, MessageType, TopicName
from pulsartx.log.partition import PartitionLog, build_records

pytestmark = pytest.mark.spark

COMPARED = ["value", "__key", "__topic", "__partition", "__offset", "__messageId", "__eventTime",
            "__messageProperties"]
SCHEMA_STRING = ("struct<value:binary,__key:string,__topic:string,__partition:int,__offset:bigint,"
                 "__messageId:binary,__publishTime:timestamp,__eventTime:timestamp,"
                 "__messageProperties:map<string,string>>")
EVENT_MS0 = 1_700_000_000_000


@dataclass(frozen=True)
class Sent:
    value: bytes
    key: str | None
    topic: str
    partition: int
    offset: int
    event_ms: int | None
    properties: dict[str, str]

    def row(self) -> tuple[Any, ...]:
        event = None if self.event_ms is None else dt.datetime.fromtimestamp(self.event_ms / 1000, tz=dt.UTC)
        return (self.value, self.key, self.topic, self.partition, self.offset,
                MessageId(self.partition, self.offset).serialize(), event, self.properties)


def produce(client: Any, topic: str, n: int, *, prefix: str = "m", keyed: bool = True,
            batch: int = 1000, delay_ms: int = 10) -> list[Sent]:
    """Send ``n`` messages with a mix of keys, properties and event times; return what landed where.
    Unkeyed messages go round-robin by batch: a ``delay_ms`` longer than the sends makes full
    batches of ``batch`` the only boundaries, so the split over partitions is known."""
    ids: dict[bytes, MessageId] = {}
    lock = threading.Lock()

    def done(value: bytes):
        def cb(result: Any, mid: MessageId | None) -> None:
            assert mid is not None, f"send of {value!r} failed: {result}"
            with lock:
                ids[value] = mid
        return cb

    sent = []
    with client.create_producer(topic, batching_max_messages=batch, batching_max_publish_delay_ms=delay_ms) as producer:
        for i in range(n):
            value = f"{prefix}-{i}".encode()
            key = f"key-{i % 3}" if keyed and i % 2 == 0 else None
            props = {"i": str(i), "kind": "even" if i % 2 == 0 else "odd"} if i % 3 == 0 else None
            event_ms = EVENT_MS0 + i if i % 4 else None
            producer.send_async(value, done(value), properties=props, partition_key=key, event_timestamp=event_ms)
            sent.append((value, key, props, event_ms))
        producer.flush()
    full = str(TopicName.parse(topic))
    return [Sent(v, k, full, ids[v].partition(), ids[v].offset(), ev, p or {}) for v, k, p, ev in sent]


def read(spark: Any, root: str, **options: str) -> Any:
    return spark.read.format("pulsartx").option("service.url", root).options(**options).load()


def expected_df(spark: Any, sent: list[Sent]) -> Any:
    # From Arrow: a local relation, so building the expectation starts no Python worker.
    schema = pa.schema([f for f in arrow_schema() if f.name in COMPARED])
    rows = [dict(zip(COMPARED, s.row(), strict=True)) for s in sorted(sent, key=lambda s: (s.topic, s.partition, s.offset))]
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=schema))


def assert_read_equals(df: Any, spark: Any, sent: list[Sent]) -> None:
    # One task sorting in place: no range-partitioning sample job, no shuffle. It still reads
    # every planned input partition.
    actual = df.select(*COMPARED).coalesce(1).sortWithinPartitions("__topic", "__partition", "__offset")
    assert_df_equality(actual, expected_df(spark, sent))


def error_of(action: Any) -> str:
    with pytest.raises(Exception) as info:  # AnalysisException at load(), or a task failure
        action()
    return str(info.value)


# ---- pure unit checks (no Spark job) -------------------------------------------------------------
def test_arrow_schema_is_what_pyspark_expects() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    assert arrow_schema().equals(to_arrow_schema(SPARK_SCHEMA, timezone="UTC"))
    assert SPARK_SCHEMA.simpleString() == SCHEMA_STRING


def test_vectorised_message_ids_equal_serialize() -> None:
    offsets = [0, 1, 255, 2**31, 2**62]
    got = message_ids(7, offsets).to_pylist()
    assert got == [MessageId(7, o).serialize() for o in offsets]


def test_storage_options_and_service_url_fallbacks(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = parse_options({"topic": "t", "service.url": str(tmp_path), "pulsartx.storage.aws_region": "eu-west-1",
                          "pulsartx.storage.AWS_ENDPOINT_URL": "http://minio:9000"})
    assert opts.root.url == str(tmp_path)
    assert opts.root.storage_options == {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://minio:9000"}
    monkeypatch.setenv("PULSARTX_SERVICE_URL", str(tmp_path / "from-env"))
    assert parse_options({"topic": "t"}).root.url == str(tmp_path / "from-env")
    monkeypatch.delenv("PULSARTX_SERVICE_URL")
    monkeypatch.chdir(tmp_path)
    # The default is made absolute where options are parsed (the driver), never on executors.
    assert parse_options({"topic": "t"}).root.url == os.path.join(str(tmp_path), "pulsartx-data")


def test_shim_is_discoverable_and_light() -> None:
    code = ("import pkgutil, sys, pyspark_pulsartx as m\n"
            "from pyspark.sql.datasource import DataSource\n"
            "assert 'pyspark_pulsartx' in {x.name for x in pkgutil.iter_modules()}\n"
            "assert issubclass(m.DefaultSource, DataSource) and m.DefaultSource.name() == 'pulsartx'\n"
            "assert 'deltalake' not in sys.modules, 'the shim must not import deltalake'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


# ---- reads -----------------------------------------------------------------------------------
def test_read_everything_exactly(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("orders", partitions=3)
    before = dt.datetime.now(dt.UTC)
    sent = produce(client, "orders", 40, batch=7)
    after = dt.datetime.now(dt.UTC)
    df = read(spark, root, topic="orders")
    assert df.schema == SPARK_SCHEMA
    assert df.schema.simpleString() == SCHEMA_STRING
    assert_read_equals(df, spark, sent)
    assert {s.partition for s in sent} == {0, 1, 2}
    times = df.selectExpr("min(unix_micros(__publishTime))", "max(unix_micros(__publishTime))").first()
    assert before.timestamp() * 1e6 - 1000 <= times[0] <= times[1] <= after.timestamp() * 1e6 + 1000


def test_a_grown_topic_is_read_whole(spark: Any, client: Any, root: str) -> None:
    """A batch read after ``update_partitioned_topic`` plans every partition, old and new."""
    client.admin.create_topic("grows", partitions=1)
    sent = produce(client, "grows", 5)
    client.admin.update_partitioned_topic("grows", 3)
    sent += produce(client, "grows", 30, prefix="n")
    assert {s.partition for s in sent} == {0, 1, 2}
    assert_read_equals(read(spark, root, topic="grows"), spark, sent)


def test_load_path_and_name_forms(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("acme/prod/events", partitions=2)
    sent = produce(client, "acme/prod/events", 10, keyed=False, batch=5, delay_ms=600_000)  # 5 per partition
    for name in ("acme/prod/events", "persistent://acme/prod/events"):
        assert_read_equals(spark.read.format("pulsartx").option("service.url", root).load(name), spark, sent)
    # One partition by its partition name.
    one = [s for s in sent if s.partition == 1]
    assert_read_equals(read(spark, root, topic="acme/prod/events-partition-1"), spark, one)


def test_starting_and_ending_offsets(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("t", partitions=2)
    sent = produce(client, "t", 20, keyed=False, batch=5, delay_ms=600_000)  # 10 per partition, 2 files each

    def between(p: int, lo: int, hi: int) -> list[Sent]:
        return [s for s in sent if s.partition == p and lo <= s.offset < hi]

    df = read(spark, root, topic="t", startingOffsets='{"t":{"0":2,"1":-2}}',
              endingOffsets='{"persistent://public/default/t":{"0":5}}')
    assert_read_equals(df, spark, between(0, 2, 5) + between(1, 0, 10))

    df = read(spark, root, topic="t", startingOffsets='{"public/default/t":{"1":-1}}', endingOffsets="latest")
    assert_read_equals(df, spark, between(0, 0, 10))

    assert_read_equals(read(spark, root, topic="t", startingOffsets="earliest", endingOffsets="latest"), spark, sent)
    assert read(spark, root, topic="t", startingOffsets="latest").count() == 0
    # Offsets past the end are a snapshot of what exists, not a wait.
    df = read(spark, root, topic="t", startingOffsets='{"t":{"0":8,"1":9}}', endingOffsets='{"t":{"0":99,"1":99}}')
    assert_read_equals(df, spark, between(0, 8, 10) + between(1, 9, 10))


def test_topics_and_topics_pattern(spark: Any, client: Any, root: str) -> None:
    for name in ("alpha", "beta", "acme/prod/gamma"):
        client.admin.create_topic(name, partitions=2)
    sent = {name: produce(client, name, 6, prefix=name, keyed=False) for name in ("alpha", "beta", "acme/prod/gamma")}

    def check(df: Any, names: list[str]) -> None:
        assert_read_equals(df, spark, [s for n in names for s in sent[n]])

    check(read(spark, root, topics="alpha, persistent://acme/prod/gamma"), ["alpha", "acme/prod/gamma"])
    check(read(spark, root, topicsPattern="alp.*|bet.*"), ["alpha", "beta"])  # bare names (public/default)
    check(read(spark, root, topicsPattern="acme/prod/.*"), ["acme/prod/gamma"])  # tenant/ns/topic
    check(read(spark, root, topicsPattern="persistent://public/default/.*"), ["alpha", "beta"])
    assert read(spark, root, topicsPattern="nothing-.*").count() == 0


def test_large_partitions_are_split(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("big", partitions=2)
    sent = produce(client, "big", 20, keyed=False, batch=5, delay_ms=600_000)  # 10 per partition
    df = read(spark, root, topic="big", maxEntriesPerPartition="3")
    assert df.rdd.getNumPartitions() == 8  # 10 offsets per partition -> 4 ranges each
    assert_read_equals(df, spark, sent)
    df = read(spark, root, topic="big", maxEntriesPerPartition="4", startingOffsets='{"big":{"0":1,"1":3}}')
    assert df.rdd.getNumPartitions() == 3 + 2
    assert_read_equals(df, spark, [s for s in sent if s.offset >= (1 if s.partition == 0 else 3)])


def test_markers_are_never_returned(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("with-markers")
    first = produce(client, "with-markers", 3, prefix="a", keyed=False)
    plog = PartitionLog(client.root, TopicName.parse("with-markers").with_partition(0))
    plog.append(build_records([b""], msg_type=MessageType.TXN_ABORT))
    second = produce(client, "with-markers", 3, prefix="b", keyed=False)
    assert [s.offset for s in second] == [4, 5, 6]  # the marker took offset 3
    for level in ("READ_COMMITTED", "read_uncommitted"):
        assert_read_equals(read(spark, root, topic="with-markers", isolationLevel=level), spark, first + second)


def test_empty_topic(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("empty", partitions=2)
    df = read(spark, root, topic="empty")
    assert df.schema == SPARK_SCHEMA
    assert df.count() == 0


def test_found_without_register_in_a_fresh_session(spark: Any, client: Any, root: str) -> None:
    from pulsartx.datasource import PulsarTxDataSource

    client.admin.create_topic("disc")
    sent = produce(client, "disc", 3, keyed=False)
    fresh = spark.newSession()  # never calls spark.dataSource.register
    assert_read_equals(fresh.read.format("pulsartx").option("service.url", root).load("disc"), spark, sent)
    # The --py-files route: explicit registration works as well.
    other = spark.newSession()
    other.dataSource.register(PulsarTxDataSource)
    assert other.read.format("pulsartx").option("service.url", root).load("disc").count() == 3


# ---- errors ----------------------------------------------------------------------------------
def test_topic_option_errors(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("exists")
    msg = error_of(lambda: read(spark, root))
    assert "no topic given" in msg and "topic, topics or topicsPattern" in msg
    msg = error_of(lambda: read(spark, root, topic="exists", topicsPattern="e.*"))
    assert "topic and topicsPattern" in msg and "exactly one" in msg
    msg = error_of(lambda: spark.read.format("pulsartx").option("service.url", root).option("topics", "a").load("exists"))
    assert "topics and topic (the load()/save() path)" in msg
    msg = error_of(lambda: read(spark, root, topicsPattern="(unclosed"))
    assert "topicsPattern" in msg and "not a valid regular expression" in msg
    msg = error_of(lambda: read(spark, root, topic="a/b"))
    assert "option topic" in msg and "'a/b'" in msg


def test_unknown_topic_error(spark: Any, root: str) -> None:
    msg = error_of(lambda: read(spark, root, topic="missing"))
    assert "persistent://public/default/missing does not exist" in msg
    assert "create_topic('public/default/missing'" in msg
    assert f"`pulsartx --service-url {root} topics create public/default/missing`" in msg
    msg = error_of(lambda: read(spark, root, topics="missing-too"))
    assert "option topics: topic persistent://public/default/missing-too does not exist" in msg


def test_value_option_errors(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("v", partitions=2)
    msg = error_of(lambda: read(spark, root, topic="v", isolationLevel="SERIALIZABLE"))
    assert "isolationLevel='SERIALIZABLE'" in msg and "READ_COMMITTED or READ_UNCOMMITTED" in msg
    msg = error_of(lambda: read(spark, root, topic="v", startingOffsets='{"v":{"0":1}'))
    assert "startingOffsets" in msg and "not valid JSON" in msg and '{"public/default/my-topic":{"0":23,"1":-2}}' in msg
    msg = error_of(lambda: read(spark, root, topic="v", endingOffsets='[1, 2]'))
    assert "endingOffsets" in msg and "not an object of topics" in msg
    msg = error_of(lambda: read(spark, root, topic="v", startingOffsets='{"v":{"zero":1}}'))
    assert "startingOffsets" in msg and "partition key 'zero'" in msg
    msg = error_of(lambda: read(spark, root, topic="v", maxEntriesPerPartition="0"))
    assert "maxEntriesPerPartition='0'" in msg and "positive integer" in msg
    msg = error_of(lambda: read(spark, root, topic="v", **{"service.url": " "}))
    assert "service.url is empty" in msg
    # Checked against the topics at plan time: a typo in a key must not silently read everything.
    msg = error_of(lambda: read(spark, root, topic="v", startingOffsets='{"w":{"0":1}}').collect())
    assert "startingOffsets" in msg and "persistent://public/default/w" in msg
    msg = error_of(lambda: read(spark, root, topic="v", endingOffsets='{"v":{"5":1}}').collect())
    assert "endingOffsets" in msg and "no partition 5" in msg
    msg = error_of(lambda: read(spark, root, topic="v", startingOffsets='{"v":{"0":4}}',
                               endingOffsets='{"v":{"0":2}}').collect())
    assert "starts at 4, after its end 2" in msg


def test_user_schema_is_rejected_unless_identical_or_a_subset(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("s")
    produce(client, "s", 2, keyed=False)
    base = spark.read.format("pulsartx").option("service.url", root).option("topic", "s")
    assert base.schema(SPARK_SCHEMA).load().count() == 2
    msg = error_of(lambda: base.schema("value string").load().collect())
    assert "fixed schema" in msg and "drop the .schema() call" in msg
    assert "column 'value' is a nullable binary, not string" in msg and "'value binary'" in msg
    msg = error_of(lambda: base.schema("value binary, payload string").load().collect())
    assert "column 'payload' is not one of its columns" in msg and "declare a subset" in msg
    msg = error_of(lambda: base.schema("__offset bigint NOT NULL").load().collect())
    assert "column '__offset' is a nullable bigint, not bigint NOT NULL" in msg
    msg = error_of(lambda: base.schema("value binary, VALUE binary").load().collect())
    assert "column 'VALUE' is declared twice" in msg


def test_declared_subset_schema_returns_only_those_columns(spark: Any, client: Any, root: str) -> None:
    """``.schema()`` naming some of the topic's columns (any order, any case) is the column pruning
    Python data sources otherwise lack: exactly those columns come back, with the same rows as a
    full read, committed data only."""
    client.admin.create_topic("sub", 2)
    sent = produce(client, "sub", 60)
    with client.create_producer("sub") as p:
        txn = client.new_transaction()
        p.send(b"aborted", txn=txn, partition_key="key-0")
        txn.abort()
        txn = client.new_transaction()
        p.send(b"committed", txn=txn, partition_key="key-0", properties={"t": "1"})
        txn.commit()
    full = read(spark, root, topic="sub")

    def props(m: Any) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((m or {}).items()))

    expected = sorted((r["__offset"], bytes(r["value"]), props(r["__messageProperties"])) for r in full.collect())
    assert len(expected) == 61 and {v for _, v, _ in expected} == {x.value for x in sent} | {b"committed"}

    base = spark.read.format("pulsartx").option("service.url", root).option("topic", "sub")
    df = base.schema("__offset long, value binary, __messageProperties map<string,string>").load()
    assert df.schema.simpleString() == "struct<__offset:bigint,value:binary,__messageProperties:map<string,string>>"
    assert sorted((r[0], bytes(r[1]), props(r[2])) for r in df.collect()) == expected

    derived = sorted((r[0], bytes(r[1])) for r in base.schema("__partition int, __messageId binary").load().collect())
    assert derived == sorted((r["__partition"], bytes(r["__messageId"])) for r in full.collect())
    assert {(x.partition, MessageId(x.partition, x.offset).serialize()) for x in sent} < set(derived)

    keys = base.schema("__KEY string").load()
    assert keys.columns == ["__KEY"]
    assert sorted((r[0] or "") for r in keys.collect()) == sorted([x.key or "" for x in sent] + ["key-0"])


def test_projection_reads_only_the_stored_columns_it_needs() -> None:
    from pulsartx.datasource.schema import FULL, projection
    from pyspark.sql.types import StructType

    from pulsartx.exceptions import InvalidConfiguration

    assert projection(SPARK_SCHEMA) == FULL
    assert set(FULL.stored) == {"type", "value", "key", "properties", "event_time", "publish_time"}
    p = projection(StructType.fromDDL("__key string, __offset long"))
    assert p == ("__key", "__offset") and p.stored == ("type", "key")
    assert arrow_schema(p).names == ["__key", "__offset"]
    with pytest.raises(InvalidConfiguration, match=r"empty \.schema"):
        projection(StructType([]))
