"""SIGKILL while a TC writes markers: a child process (a fresh interpreter, tests/_procs.py) commits
or aborts a transaction over 4 partitions and parks after COMMITTING/ABORTING is logged and the
first partition's marker is written; the others have none.

While it is parked, reads must not be fractured: a Spark batch read over the 4 partitions and a
client read return all of a decided-COMMIT transaction (readers consult the TC decision) and none of
a decided-ABORT one. After SIGKILL, recovery (a sweep, or reader-side resolution by a reader whose TC
opens with ``recovery_grace_ms=0``) leaves exactly one marker of the decided outcome in every
partition, and READ_COMMITTED shows the transaction's messages exactly once.
"""
from __future__ import annotations

import time
from collections import Counter

import pytest
from _keys import keys_for  # tests/ is on sys.path (conftest)
from _procs import BIG_RETENTION_MS, Child, count_markers, read_tc_log

import pulsartx
from pulsartx import MessageId
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.coordinator.txnid import TxnID

NPARTS = 4
TOPIC = "crash"
CHILD_CFG = {"finished_retention_ms": BIG_RETENTION_MS}
# The parent's reads while the child is parked must not roll the transaction forward themselves.
HOLD = CoordinatorConfig(finished_retention_ms=BIG_RETENTION_MS, recovery_grace_ms=10**9)
RECOVER = CoordinatorConfig(finished_retention_ms=BIG_RETENTION_MS, recovery_grace_ms=0)
MARKER = {TxnAction.COMMIT: "TXN_COMMIT", TxnAction.ABORT: "TXN_ABORT"}
DECIDED = {TxnAction.COMMIT: TxnStatus.COMMITTING, TxnAction.ABORT: TxnStatus.ABORTING}
# Spark's planner opens TCs with the default recovery grace (5 s): only reads well within it are
# guaranteed to have happened before anyone but the child could write the remaining markers.
SPARK_GRACE_S = 4.0




@pytest.fixture
def root_url(tmp_path) -> str:
    path = tmp_path / "buffer-crash"
    path.mkdir()
    c = pulsartx.Client(str(path), num_coordinators=2, coordinator_config=RECOVER)
    c.admin.create_topic(TOPIC, NPARTS)
    p = c.create_producer(TOPIC)
    for i, k in enumerate(keys_for(NPARTS)):
        p.send(f"pre{i}".encode(), partition_key=k)
    c.close()
    return str(path)


def txn_markers(root_url: str, txn: TxnID) -> Counter:
    return Counter({(p, t): n for (p, t, tid), n in count_markers(root_url, TOPIC, NPARTS).items()
                    if tid == txn.as_tuple()})


def client_values(client, level: str = "READ_COMMITTED") -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    with client.create_reader(TOPIC, MessageId.earliest, isolation_level=level) as r:
        for m in r:
            out.setdefault(m.message_id().partition(), []).append(m.data())
    return out


def spark_values(spark, root_url: str, level: str | None = None) -> dict[int, list[bytes]]:
    reader = spark.read.format("pulsartx").option("service.url", root_url).option("topic", TOPIC)
    if level is not None:
        reader = reader.option("isolationLevel", level)
    rows = reader.load().select("__partition", "__offset", "value").collect()
    out: dict[int, list[bytes]] = {}
    for part, _off, value in sorted(rows, key=lambda r: (r[0], r[1])):
        out.setdefault(part, []).append(bytes(value))
    return out


def expected(action: TxnAction | None, post: bool = False) -> dict[int, list[bytes]]:
    """pre_i, then the transaction's m_i when it is visible, then post_i if sent."""
    return {i: [f"pre{i}".encode()] + ([f"m{i}".encode()] if action is TxnAction.COMMIT else [])
            + ([f"post{i}".encode()] if post else []) for i in range(NPARTS)}


def crash_mid_markers(root_url: str, action: TxnAction, spark=None) -> TxnID:
    """Run the child to "decided + first marker", read while it is parked, then SIGKILL it."""
    child = Child("crash_txn", root=root_url, topic=TOPIC, partitions=NPARTS, stage="mid", action=action.value,
                  cfg=CHILD_CFG, stop_after=1)
    try:
        event = child.wait_event("mid", timeout=90)
        paused_at = time.monotonic()
        txn = TxnID(*event["txn"])
        fractured = Counter({(0, MARKER[action]): 1})
        assert txn_markers(root_url, txn) == fractured
        assert read_tc_log(root_url, txn.tc_id)[txn.least_bits].status is DECIDED[action]
        # No fractured read: all of a decided commit, none of a decided abort, in every partition.
        if spark is not None:
            assert spark_values(spark, root_url) == expected(action)
        reader_client = pulsartx.Client(root_url, coordinator_config=HOLD)
        assert client_values(reader_client) == expected(action)
        assert client_values(reader_client, "READ_UNCOMMITTED") == expected(TxnAction.COMMIT)
        reader_client.close()
        if spark is None or time.monotonic() - paused_at < SPARK_GRACE_S:
            # the reads above really saw the half-written markers
            assert txn_markers(root_url, txn) == fractured
    finally:
        if child.proc.poll() is None:
            child.sigkill()
    return txn


def send_post(root_url: str) -> None:
    c = pulsartx.Client(root_url, coordinator_config=HOLD)
    p = c.create_producer(TOPIC)
    for i, k in enumerate(keys_for(NPARTS)):
        p.send(f"post{i}".encode(), partition_key=k)
    c.close()


def assert_recovered(root_url: str, txn: TxnID, action: TxnAction) -> None:
    assert txn_markers(root_url, txn) == Counter({(i, MARKER[action]): 1 for i in range(NPARTS)})
    assert read_tc_log(root_url, txn.tc_id)[txn.least_bits].status is action.final_status
    c = pulsartx.Client(root_url, coordinator_config=RECOVER)
    assert client_values(c) == expected(action, post=True)
    assert client_values(c, "READ_UNCOMMITTED") == expected(TxnAction.COMMIT, post=True)
    # recovery is stable: more sweeps write nothing
    assert c.admin.transactions.sweep(grace_ms=0) == {"timed_out": 0, "completed": 0, "failed": 0}
    assert txn_markers(root_url, txn) == Counter({(i, MARKER[action]): 1 for i in range(NPARTS)})
    c.close()


@pytest.mark.spark
def test_commit_killed_mid_markers_no_fractured_reads_then_sweep(spark, root_url):
    # Warm Spark up (the first data source call of a session is slow) and check the starting point.
    assert spark_values(spark, root_url) == expected(None)
    txn = crash_mid_markers(root_url, TxnAction.COMMIT, spark=spark)
    send_post(root_url)
    c = pulsartx.Client(root_url, coordinator_config=RECOVER)
    c.admin.transactions.sweep(grace_ms=0)
    c.close()
    assert_recovered(root_url, txn, TxnAction.COMMIT)
    assert spark_values(spark, root_url) == expected(TxnAction.COMMIT, post=True)


def test_abort_killed_mid_markers_then_sweep(root_url):
    txn = crash_mid_markers(root_url, TxnAction.ABORT)
    send_post(root_url)
    c = pulsartx.Client(root_url, coordinator_config=RECOVER)
    c.admin.transactions.sweep(grace_ms=0)
    c.close()
    assert_recovered(root_url, txn, TxnAction.ABORT)


@pytest.mark.parametrize("action", [TxnAction.COMMIT, TxnAction.ABORT])
def test_killed_mid_markers_recovered_by_a_reader(root_url, action):
    """No sweeper: a READ_COMMITTED reader whose client opens the TC with recovery_grace_ms=0 rolls
    the decided transaction forward and reads it exactly once."""
    txn = crash_mid_markers(root_url, action)
    send_post(root_url)
    c = pulsartx.Client(root_url, coordinator_config=RECOVER)
    assert client_values(c) == expected(action, post=True)
    c.close()
    assert_recovered(root_url, txn, action)
