"""The Spark batch read's planner and tasks under storage faults and changes between the two.

The driver plans offset ranges, their files and one visibility filter per partition; tasks read
only those files, later. Whatever happens in between (a read error, a topic deleted or re-created,
a transaction decided), a READ_COMMITTED read returns exactly the committed messages of the plan,
or fails with a StorageError that says to retry: never fewer, more or other rows.

The planner and tasks run in this process here (``PulsarTxBatchReader.partitions`` then ``read``,
the calls pyspark's workers make), since a storage fault or a topic change must land between two
of them.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pulsartx.datasource import visibility as visibility_mod
from pulsartx.datasource.batch_reader import OffsetRangePartition, PulsarTxBatchReader
from pulsartx.datasource.options import parse_options

from pulsartx import Client
from pulsartx.exceptions import CorruptedLog, StorageError
from pulsartx.storage import faults
from pulsartx.storage.faults import Fault, Mode, Op

pytestmark = pytest.mark.usefixtures("no_faults")  # the fixture is in conftest.py


@pytest.fixture(autouse=True)
def fresh_planned_buffers() -> Iterator[None]:
    """Each test plans with buffers of its own (the planner keeps them per process)."""
    saved = dict(visibility_mod._PLANNED)
    visibility_mod._PLANNED.clear()
    yield
    visibility_mod._PLANNED.clear()
    visibility_mod._PLANNED.update(saved)


def reader(root: str, **options: str) -> PulsarTxBatchReader:
    return PulsarTxBatchReader(parse_options({"service.url": root, "topic": "t", **options}))


def plan(root: str, **options: str) -> tuple[PulsarTxBatchReader, list[OffsetRangePartition]]:
    r = reader(root, **options)
    parts = r.partitions()
    assert all(isinstance(p, OffsetRangePartition) for p in parts)
    return r, parts  # type: ignore[return-value]


def values(r: PulsarTxBatchReader, parts: list[Any]) -> list[bytes]:
    out: list[bytes] = []
    for part in parts:
        for b in r.read(part):
            out += pa.Table.from_batches([b]).column("value").to_pylist()
    return sorted(out)


def two_partitions_with_a_committed_transaction(c: Client) -> list[bytes]:
    """Topic t, 2 partitions: a plain message each, then one transaction committed across both."""
    c.admin.create_topic("t", 2)
    ps = [c.create_producer(f"t-partition-{i}") for i in range(2)]
    for i, p in enumerate(ps):
        p.send(f"plain{i}".encode())
    txn = c.new_transaction()
    for i, p in enumerate(ps):
        p.send(f"txn{i}".encode(), txn=txn)
    txn.commit()
    for p in ps:
        p.close()
    return [b"plain0", b"plain1", b"txn0", b"txn1"]


@pytest.mark.parametrize("recreated", [False, True])
def test_topic_deleted_after_planning_fails_the_task_with_retry_not_corruption(client: Client, root: str,
                                                                               recreated: bool) -> None:
    """A topic deleted (and maybe re-created) between planning and a task's read took the planned
    files with it. The task said CorruptedLog, "a data file listed in the Delta log is missing":
    nothing is corrupt, the read was planned against a topic that no longer exists. It now says
    so, and to retry the read, as a StorageError."""
    two_partitions_with_a_committed_transaction(client)
    r, parts = plan(root)
    assert client.flush()  # no marker in flight across the delete (docs/storage.md)
    client.admin.delete_topic("t")
    if recreated:
        client.admin.create_topic("t", 2)
        with client.create_producer("t-partition-0") as p:
            for i in range(4):
                p.send(b"new%d" % i)
    with pytest.raises(StorageError) as ei:
        values(r, parts)
    assert not isinstance(ei.value, CorruptedLog)
    msg = str(ei.value)
    assert "after this read was planned" in msg and "retry the read" in msg, msg
    assert ("re-created" in msg) == recreated, msg
    if recreated:
        r2, parts2 = plan(root)
        assert values(r2, parts2) == [b"new0", b"new1", b"new2", b"new3"]


def test_a_data_file_missing_from_the_planned_topic_is_still_corruption(client: Client, root: str) -> None:
    """The same topic, a file its log lists gone: that is a damaged table, and says so."""
    two_partitions_with_a_committed_transaction(client)
    r, parts = plan(root)
    part = parts[0]
    import os

    os.remove(os.path.join(root, *part.segments, part.files[0].path))
    with pytest.raises(CorruptedLog, match="missing"):
        values(r, parts)


@pytest.mark.parametrize("transient", [False, True])
def test_a_data_file_read_error_in_a_task_fails_it_or_is_retried(client: Client, root: str, transient: bool) -> None:
    """A task's read error is a StorageError naming the partition; a transient one is retried and
    the task returns every planned row, no more."""
    expected = two_partitions_with_a_committed_transaction(client)
    r, parts = plan(root)
    faults.install([Fault(Op.READ, Mode.ERROR, match=".parquet", transient=transient)])
    if transient:
        assert values(r, parts) == expected
    else:
        with pytest.raises(StorageError, match="partition-0: cannot read data files"):
            values(r, parts)
    assert faults.plan()[0].fired == 1


def test_a_tc_log_read_error_while_planning_fails_the_read_with_retry(client: Client, root: str) -> None:
    """The cut needs the TC's log: without it a transaction committed before the read began could
    be hidden, so planning fails and says to retry instead of returning less."""
    client.admin.create_topic("t", 2)
    ps = [client.create_producer(f"t-partition-{i}") for i in range(2)]
    txn = client.new_transaction()
    for p in ps:
        p.send(b"in txn", txn=txn)
        p.flush()
    faults.install([Fault(Op.READ, Mode.ERROR, match="coordinator/tc-", times=10**6)])
    with pytest.raises(StorageError, match="retry"):
        plan(root)
    faults.clear()
    txn.abort()
    for p in ps:
        p.close()


def test_a_transaction_decided_between_planning_and_reading_keeps_the_planned_answer(client: Client,
                                                                                      root: str) -> None:
    """An open transaction holds maxReadPosition at planning; its commit before the tasks read does
    not change what they return (the plan's snapshot), and the next read returns it whole."""
    client.admin.create_topic("t", 2)
    ps = [client.create_producer(f"t-partition-{i}") for i in range(2)]
    for i, p in enumerate(ps):
        p.send(f"a{i}".encode())
    txn = client.new_transaction()
    for i, p in enumerate(ps):
        p.send(f"t{i}".encode(), txn=txn)
        p.flush()
    for i, p in enumerate(ps):
        p.send(f"b{i}".encode())
        p.flush()
    r, parts = plan(root)
    txn.commit()
    assert values(r, parts) == [b"a0", b"a1"]
    r2, parts2 = plan(root)
    assert values(r2, parts2) == [b"a0", b"a1", b"b0", b"b1", b"t0", b"t1"]
    for p in ps:
        p.close()


def test_a_topic_a_pattern_matched_then_deleted_while_planning_is_left_out(client: Client, root: str) -> None:
    """A ``topicsPattern`` read lists the topics, then reads each one's metadata. A topic deleted in
    between failed the whole read with TopicNotFound, though a pattern that matches no topic is an
    empty read: the deleted topic is now left out, as if the listing had come after the delete."""
    import threading

    for name in ("pa", "pb"):
        client.admin.create_topic(name, 1)
        with client.create_producer(name) as p:
            p.send(name.encode())
    assert client.flush()
    # The planner's read of pb's metadata waits; pb is deleted meanwhile.
    faults.install([Fault(Op.READ, Mode.DELAY, delay_s=1.0, match="/pb/_topic.json")])
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            r = PulsarTxBatchReader(parse_options({"service.url": root, "topicsPattern": "p[ab]"}))
            out["values"] = values(r, r.partitions())
        except Exception as e:  # reported below
            out["error"] = e

    th = threading.Thread(target=run)
    th.start()
    import time

    time.sleep(0.3)
    client.admin.delete_topic("pb")
    th.join()
    assert faults.plan()[0].fired == 1
    assert out == {"values": [b"pa"]}


@pytest.mark.parametrize("mode, expected", [
    (Mode.ERROR, [b"a0", b"a1"]),  # the abort never lands: the transaction still blocks
    (Mode.LOST, [b"a0", b"a1", b"b0", b"b1"]),  # it landed, its answer was lost: T0 reads it back
])
def test_a_failed_reader_side_abort_while_planning_never_shows_the_expired_transaction(root: str, mode: Mode,
                                                                                        expected: list[bytes]) -> None:
    """Planning aborts a transaction past its timeout (its writer, another process, is gone). When
    that TC write fails, the transaction blocks the read at maxReadPosition; when only its answer is
    lost, the cut reads the abort back from the TC log. Its messages are returned in neither case."""
    import subprocess
    import sys
    import textwrap
    import time

    subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, pulsartx
        c = pulsartx.Client({root!r})
        c.admin.create_topic("t", 2)
        ps = [c.create_producer(f"t-partition-{{i}}") for i in range(2)]
        for i, p in enumerate(ps):
            p.send(f"a{{i}}".encode())
        txn = c.new_transaction(timeout_ms=500)
        for p in ps:
            p.send(b"expired", txn=txn)
            p.flush()
        for i, p in enumerate(ps):
            p.send(f"b{{i}}".encode())
            p.flush()
        os._exit(0)  # no abort, no keep-alive: the transaction expires
    """)], check=True, timeout=120)
    time.sleep(0.6)
    faults.install([Fault(Op.CREATE, mode, match="coordinator/tc-", times=10**6 if mode is Mode.ERROR else 1)])
    r, parts = plan(root)
    assert faults.plan()[0].fired >= 1
    assert values(r, parts) == expected
    faults.clear()
    r2, parts2 = plan(root)
    assert values(r2, parts2) == [b"a0", b"a1", b"b0", b"b1"]


def _retention_removed_offsets_0_to_9(client: Client) -> None:
    """Topic t, 1 partition: offsets 0..9 in one file, 10..14 in another; retention deletes the first."""
    from pulsartx.maintenance.retention import apply_retention
    from pulsartx.naming import TopicName

    client.admin.create_topic("t", 1)
    with client.create_producer("t") as p:
        for i in range(10):
            p.send_async(b"old%d" % i, None)
        p.flush()
        for i in range(5):
            p.send_async(b"new%d" % i, None)
        p.flush()
    res = apply_retention(client.root, TopicName.parse("t").with_partition(0), max_age_ms=0, force=True)
    assert res.new_start_offset == 10


def test_a_starting_offset_deleted_by_retention_fails_the_batch_read(client: Client, root: str) -> None:
    """startingOffsets below the partition's log start was clamped to it in silence: the read
    returned fewer messages than asked for, with nothing to say so. As Spark's Kafka source (and
    this source's streams), failOnDataLoss (true by default) fails the read, naming the partition,
    the offsets and the option."""
    from pulsartx.exceptions import InvalidConfiguration

    _retention_removed_offsets_0_to_9(client)
    with pytest.raises(InvalidConfiguration) as ei:
        plan(root, startingOffsets='{"t":{"0":3}}')
    msg = str(ei.value)
    assert "data loss on persistent://public/default/t-partition-0" in msg, msg
    assert "3..9" in msg and "startingOffsets" in msg and "failOnDataLoss=false" in msg, msg


def test_a_starting_offset_deleted_by_retention_is_skipped_without_fail_on_data_loss(
        client: Client, root: str, caplog: pytest.LogCaptureFixture) -> None:
    _retention_removed_offsets_0_to_9(client)
    with caplog.at_level("WARNING", logger="pulsartx.datasource"):
        r, parts = plan(root, startingOffsets='{"t":{"0":3}}', failOnDataLoss="false")
    assert values(r, parts) == sorted(b"new%d" % i for i in range(5))
    assert any("data loss" in m and "3..9" in m for m in caplog.messages), caplog.messages
    # earliest, or an offset still there, is no data loss either way.
    for start in ("earliest", '{"t":{"0":10}}', '{"t":{"0":-2}}'):
        r, parts = plan(root, startingOffsets=start)
        assert values(r, parts) == sorted(b"new%d" % i for i in range(5)), start


def _delete_when_its_log_is_first_loaded(monkeypatch: pytest.MonkeyPatch, client: Client, topic: str) -> list[str]:
    """Deletes ``topic`` just before the planner first loads one of its partitions' logs: after the
    partition listing, before the load. Returns the topics deleted so far (for the test to check)."""
    from pulsartx.log.partition import PartitionLog

    original = PartitionLog.refresh
    deleted: list[str] = []

    def refresh(self: PartitionLog, *args: Any, **kwargs: Any) -> Any:
        if self.topic.base.local_name == topic and not deleted:
            deleted.append(topic)
            client.admin.delete_topic(topic)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PartitionLog, "refresh", refresh)
    return deleted


@pytest.mark.parametrize("isolation", ["READ_COMMITTED", "READ_UNCOMMITTED"])
def test_a_topic_a_pattern_matched_deleted_before_its_log_is_loaded_is_left_out(
        monkeypatch: pytest.MonkeyPatch, client: Client, root: str, isolation: str) -> None:
    """A ``topicsPattern`` read lists the topics and their partitions, then loads each partition's
    log. A topic deleted in between failed the whole read ("topic partition ... does not exist"),
    though one deleted a moment earlier is left out: it is now left out here too."""
    for name in ("pa", "pb"):
        client.admin.create_topic(name, 2)
        with client.create_producer(name) as p:
            p.send(name.encode())
    assert client.flush()
    deleted = _delete_when_its_log_is_first_loaded(monkeypatch, client, "pb")
    r = PulsarTxBatchReader(parse_options({"service.url": root, "topicsPattern": "p[ab]",
                                           "isolationLevel": isolation}))
    parts = r.partitions()
    assert deleted == ["pb"]
    assert {(p.topic, p.partition) for p in parts} == {("persistent://public/default/pa", 0),
                                                       ("persistent://public/default/pa", 1)}
    assert values(r, parts) == [b"pa"]


def test_a_named_topic_deleted_before_its_log_is_loaded_fails_the_read(
        monkeypatch: pytest.MonkeyPatch, client: Client, root: str) -> None:
    """``topics`` names its topics: one deleted while the read is planned fails it as one deleted
    just before would (TopicNotFound), rather than returning the others as if it were complete."""
    from pulsartx.exceptions import TopicNotFound

    for name in ("pa", "pb"):
        client.admin.create_topic(name, 1)
    deleted = _delete_when_its_log_is_first_loaded(monkeypatch, client, "pb")
    r = PulsarTxBatchReader(parse_options({"service.url": root, "topics": "pa,pb"}))
    with pytest.raises(TopicNotFound, match="pb"):
        r.partitions()
    assert deleted == ["pb"]
