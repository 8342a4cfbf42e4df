"""``spark.read.format("pulsartx")`` isolation levels against topics with committed, aborted and open
transactions, through the session's local[2] SparkSession.

READ_COMMITTED (the default) returns plain messages and committed transactions below each
partition's maxReadPosition, READ_UNCOMMITTED every message; neither returns markers. The driver
decides visibility once for all partitions, consulting the TC for transactions whose markers are not
all written, so a transaction between its decision and its last marker is read whole or not at all.
"""
from __future__ import annotations

from typing import Any

import pytest
from _keys import keys_for  # tests/ is on sys.path (conftest)
from chispa import assert_df_equality

from pulsartx.buffer.markers import write_marker
from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.naming import TopicName

pytestmark = pytest.mark.spark
RC, RU = "READ_COMMITTED", "READ_UNCOMMITTED"




def load(spark: Any, root: str, topic: str, level: str | None = None) -> Any:
    reader = spark.read.format("pulsartx").option("service.url", root).option("topic", topic)
    if level is not None:
        reader = reader.option("isolationLevel", level)
    return reader.load()


def rows(spark: Any, root: str, topic: str, level: str | None = None) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every row, sorted."""
    got = load(spark, root, topic, level).select("__partition", "__offset", "value").collect()
    return sorted((r[0], r[1], bytes(r[2])) for r in got)


def test_isolation_levels_exact_rows(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("iso", 2)
    k = keys_for(2)
    p = client.create_producer("iso")
    committed, aborted, still_open = (client.new_transaction() for _ in range(3))
    sent: dict[bytes, tuple[int, int]] = {}

    def send(value: bytes, part: int, txn=None) -> None:
        mid = p.send(value, partition_key=k[part], txn=txn)
        sent[value] = (mid.partition(), mid.offset())

    send(b"a0", 0)
    send(b"b0", 1)
    send(b"c0", 0, committed)
    send(b"c1", 1, committed)
    send(b"x0", 0, aborted)
    send(b"x1", 1, aborted)
    send(b"a1", 0)
    send(b"b1", 1)
    send(b"o0", 0, still_open)
    send(b"a2", 0)
    committed.commit()
    aborted.abort()

    def expect(*values: bytes) -> list[tuple[int, int, bytes]]:
        return sorted((*sent[v], v) for v in values)

    rc = expect(b"a0", b"c0", b"a1", b"b0", b"c1", b"b1")  # partition 0 stops before o0
    ru = expect(*sent)
    assert rows(spark, root, "iso") == rc  # READ_COMMITTED is the default
    assert rows(spark, root, "iso", RC) == rc
    # READ_UNCOMMITTED: every message, never a marker (chispa, in partition and offset order)
    actual = load(spark, root, "iso", RU).select("value", "__partition", "__offset").coalesce(1) \
        .sortWithinPartitions("__partition", "__offset")
    assert_df_equality(actual, spark.createDataFrame([(v, part, off) for part, off, v in ru], actual.schema))
    still_open.commit()
    assert rows(spark, root, "iso") == expect(b"a0", b"c0", b"a1", b"o0", b"a2", b"b0", b"c1", b"b1")


def test_large_aborted_then_committed_over_20_partitions(spark: Any, client: Any, root: str) -> None:
    """Kafka: an aborted transaction of 10,000 records over 20 partitions, then a committed one of
    1,000: READ_COMMITTED reads exactly the 1,000, READ_UNCOMMITTED 11,000."""
    client.admin.create_topic("big", 20)
    # Unkeyed sends go round-robin by batch: batches of 500 give the 10,000 aborted ones at least 20
    # batches, one per partition in turn.
    p = client.create_producer("big", batching_max_messages=500)
    aborted = client.new_transaction()
    for i in range(10_000):
        p.send_async(f"a{i}".encode(), None, txn=aborted)
    p.flush()
    aborted.abort()
    committed = client.new_transaction()
    for i in range(1000):
        p.send_async(f"c{i}".encode(), None, txn=committed)
    committed.commit()
    rc = [bytes(r[0]) for r in load(spark, root, "big").select("value").collect()]
    assert sorted(rc) == sorted(f"c{i}".encode() for i in range(1000))
    ru = load(spark, root, "big", RU).select("__partition", "value").collect()
    assert len(ru) == 11_000 and {r[0] for r in ru} == set(range(20))
    assert sorted(bytes(r[1]) for r in ru) == sorted([f"a{i}".encode() for i in range(10_000)]
                                                     + [f"c{i}".encode() for i in range(1000)])


def test_bad_isolation_level_names_the_option(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("v")
    with pytest.raises(Exception) as info:
        load(spark, root, "v", "READ_DIRTY").collect()
    msg = str(info.value)
    assert "isolationLevel='READ_DIRTY'" in msg and "READ_COMMITTED" in msg and "READ_UNCOMMITTED" in msg


class Stop(Exception):
    pass


def decide_only(client: Any, txn: Any, action: TxnAction) -> None:
    """Log the TC's decision for ``txn`` but write no marker (a TC stopped right after deciding)."""
    def stop(meta: Any) -> None:
        raise Stop(meta.status.value)

    tc = client._coordinators().tc(txn.id.tc_id)
    with pytest.raises(Stop):
        tc.end_transaction(txn.id, action, before_participants=stop)
    assert tc.get(txn.id, refresh=True).status is (TxnStatus.COMMITTING if action is TxnAction.COMMIT
                                                   else TxnStatus.ABORTING)


def test_no_fractured_read_while_markers_are_half_written(spark: Any, client: Any, root: str) -> None:
    """X decided COMMIT and Y decided ABORT, each with its marker in one partition of four only."""
    client.admin.create_topic("frac", 4)
    k = keys_for(4)
    p = client.create_producer("frac")
    x, y = client.new_transaction(), client.new_transaction()
    for i in range(4):
        p.send(f"x{i}".encode(), partition_key=k[i], txn=x)
        p.send(f"y{i}".encode(), partition_key=k[i], txn=y)
    decide_only(client, x, TxnAction.COMMIT)
    decide_only(client, y, TxnAction.ABORT)
    name = str(TopicName.parse("frac-partition-0"))
    assert write_marker(client.root, name, x.id, TxnAction.COMMIT).version is not None
    assert write_marker(client.root, str(TopicName.parse("frac-partition-1")), y.id, TxnAction.ABORT).version is not None
    for i in range(4):
        p.send(f"after{i}".encode(), partition_key=k[i])
    got = rows(spark, root, "frac")
    assert sorted(v for _, _, v in got) == sorted(f"{w}{i}".encode() for w in ("x", "after") for i in range(4))
    assert [v for part, _, v in got if part == 0] == [b"x0", b"after0"]  # x0 at 0, y0 at 1, marker at 2
    assert len(rows(spark, root, "frac", RU)) == 12


def test_committed_transaction_behind_an_open_one_is_read_whole(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("lso", 2)
    k = keys_for(2)
    p = client.create_producer("lso")
    blocker, x = client.new_transaction(), client.new_transaction()
    p.send(b"open", partition_key=k[0], txn=blocker)
    p.send(b"x0", partition_key=k[0], txn=x)
    p.send(b"x1", partition_key=k[1], txn=x)
    x.commit()
    got = [v for _, _, v in rows(spark, root, "lso")]
    assert got in ([], [b"x0", b"x1"])


def test_transaction_committing_during_planning_is_read_whole(client: Any, root: str, monkeypatch: Any) -> None:
    """The Spark planner's path (plan_partitions + read_partition, no Spark needed), with a transaction
    that commits while the driver is between folding partition 0 and asking the TC."""
    from pulsartx.datasource.batch_reader import plan_partitions, read_partition
    from pulsartx.datasource.options import parse_options

    from pulsartx.buffer.buffer import TransactionBuffer

    client.admin.create_topic("cut", 2)
    k = keys_for(2)
    p = client.create_producer("cut")
    p.send(b"plain0", partition_key=k[0])
    p.send(b"plain1", partition_key=k[1])
    orig = TransactionBuffer.state
    injected = []

    def state(self: Any, refresh: bool = True) -> Any:
        s = orig(self, refresh)
        if not injected and self.log.topic.partition == 0:
            injected.append(True)
            x = client.new_transaction()
            p.send(b"x1", partition_key=k[1], txn=x)
            p.send(b"x0", partition_key=k[0], txn=x)
            x.commit()
        return s

    monkeypatch.setattr(TransactionBuffer, "state", state)
    opts = parse_options({"service.url": root, "topic": "cut"})
    got = [v for part in plan_partitions(opts.root, opts) for b in read_partition(opts.root, part)
           for v in b.column("value").to_pylist()]
    assert injected
    assert sorted(v for v in got if v.startswith(b"x")) in ([], [b"x0", b"x1"])
