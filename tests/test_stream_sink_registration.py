"""The streaming sink registers no output partition up front: each task registers those it has rows
for, before appending to them. A micro-batch that wrote nothing therefore commits with no
participant (no marker on any partition of the topic), and one that wrote to some partitions has
markers on exactly those. Driven without Spark: the planner's ``streamWriter``, a task's
``write`` and the sink runner's ``commit`` are called in one process."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest
from pulsartx.datasource.stream_writer import prepare_stream_write
from pyspark.sql.types import BinaryType, StringType, StructField, StructType
from stream_jobs.harness import committed_messages

import pulsartx
from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.exceptions import InvalidTxnStatusError
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName
from pulsartx.storage.root import StorageRoot

SCHEMA = StructType([StructField("value", BinaryType()), StructField("__key", StringType())])


def _ends(root: StorageRoot, n: int) -> list[int]:
    return [PartitionLog(root, TopicName.parse("out").with_partition(i)).end_offset() for i in range(n)]


def _sink(tmp_path: Path, partitions: int) -> tuple[str, StorageRoot, Path]:
    """A root with the topic "out" and a query checkpoint: (url, root, checkpoint)."""
    url = str(tmp_path / "root")
    with pulsartx.Client(url) as c:
        c.admin.create_topic("out", partitions=partitions)
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "metadata").write_text(json.dumps({"id": "query-1"}) + "\n")
    return url, StorageRoot.resolve(url), ck


def _options(url: str, ck: Path) -> dict[str, str]:
    return {"service.url": url, "topic": "out", "checkpointLocation": str(ck), "transactionKeepAlive": "false"}


def _batch(url: str, ck: Path, batch_id: int, rows: list[tuple[bytes, str]]):
    """One micro-batch through the sink: begin (planner), one task's write, commit (sink runner)."""
    writer = prepare_stream_write(_options(url, ck), SCHEMA, overwrite=False)
    txn = writer.job.txn_id
    meta = Coordinators.shared(StorageRoot.resolve(url)).for_txn(txn).get(txn, refresh=True)
    assert meta.partitions == frozenset()  # nothing registered up front
    table = pa.table({"value": pa.array([v for v, _ in rows], pa.binary()),
                      "__key": pa.array([k for _, k in rows], pa.string())})
    report = writer.write(iter(table.to_batches()))
    writer.commit([report], batch_id)
    return Coordinators.shared(StorageRoot.resolve(url)).for_txn(txn).get(txn, refresh=True)


def test_an_empty_batch_commits_without_participants_and_a_full_one_registers_what_it_wrote(tmp_path: Path) -> None:
    url, root, ck = _sink(tmp_path, 4)

    empty = _batch(url, ck, 0, [])
    assert empty.status is TxnStatus.COMMITTED and empty.partitions == frozenset()
    assert _ends(root, 4) == [0, 0, 0, 0]  # no marker anywhere (before: a commit marker on all four)

    rows = [(f"m{i}".encode(), "k1") for i in range(3)]
    full = _batch(url, ck, 1, rows)
    written = {p for p, _, _ in full.commit_entries}
    assert full.status is TxnStatus.COMMITTED and full.partitions == frozenset(written) and len(written) == 1
    ends = _ends(root, 4)
    assert sorted(ends) == [0, 0, 0, 4]  # three messages and one marker, in the one partition written
    assert [(k, v) for _, _, k, v in committed_messages(url, "out")] == [("k1", f"m{i}") for i in range(3)]

    again = _batch(url, ck, 2, [])
    assert again.status is TxnStatus.COMMITTED and again.partitions == frozenset()
    assert _ends(root, 4) == ends


def test_a_task_of_a_batch_aborted_meanwhile_writes_nothing_and_raises_nothing(tmp_path: Path, caplog) -> None:
    """query.stop() aborts the batch's transaction while tasks still run. A task registering its
    partitions after that is refused; it must then end quietly (an exception would be an ERROR
    line and a stack trace in Spark's log for a requested stop), write nothing, and leave the
    batch unable to commit."""
    url, root, ck = _sink(tmp_path, 2)
    writer = prepare_stream_write(_options(url, ck), SCHEMA, overwrite=False)
    txn = writer.job.txn_id
    tc = Coordinators.shared(root).for_txn(txn)
    tc.end_transaction(txn, TxnAction.ABORT, reason="batch 0 aborted")  # the stop, from the driver
    table = pa.table({"value": pa.array([b"a", b"b"], pa.binary()), "__key": pa.array(["k1", "k2"], pa.string())})
    with caplog.at_level(logging.INFO):
        report = writer.write(iter(table.to_batches()))
    assert report.entries == [] and report.rows == 0
    assert _ends(root, 2) == [0, 0]  # nothing appended anywhere
    assert tc.get(txn, refresh=True).status is TxnStatus.ABORTED
    assert "no longer open" in caplog.text and not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with pytest.raises(InvalidTxnStatusError):  # the batch cannot commit: Spark replays it
        writer.commit([report], 0)
    assert committed_messages(url, "out") == []
