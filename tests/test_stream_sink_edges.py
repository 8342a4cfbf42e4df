"""The streaming sink driven without Spark: a task run again by a new attempt of its stage, which
Spark numbers as attempt 0 again; the options it refuses; and the transaction key a restarted
query finds its committed batches under, whatever spelling of its checkpoint it is given."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pulsartx.commit_protocol import task as task_mod
from pulsartx.datasource.stream_writer import prepare_stream_write
from pyspark.sql.types import BinaryType, StructField, StructType

import pulsartx


class _Context:
    """What pyspark's TaskContext.get() gives a task: its partition, its attempt number (counted
    per stage attempt) and its task attempt id (unique in the Spark context)."""

    def __init__(self, task_attempt_id: int, attempt: int) -> None:
        self.id, self.attempt = task_attempt_id, attempt

    def partitionId(self) -> int:  # noqa: N802 (Spark's names)
        return 0

    def attemptNumber(self) -> int:  # noqa: N802
        return self.attempt

    def taskAttemptId(self) -> int:  # noqa: N802
        return self.id


def _rows(values: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"value": [v.encode() for v in values]})


def test_a_task_run_again_by_a_new_stage_attempt_loses_no_row(tmp_path: Path, monkeypatch: Any) -> None:
    """The task's first run appends rows, then fails (a shuffle fetch failure): Spark runs the stage
    again, and the task as attempt 0 again. Fails before the fix: both runs appended under one
    producer name, so the second run's first rows were taken for resends of the first run's (whose
    entries no report lists) and were lost."""
    import pyspark

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("out", 1)
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "metadata").write_text(json.dumps({"id": "q"}) + "\n")
    schema = StructType([StructField("value", BinaryType())])
    writer = prepare_stream_write({"service.url": root, "topic": "out", "checkpointLocation": str(ck),
                                   "transactionKeepAlive": "false"}, schema, False)
    monkeypatch.setattr(task_mod, "FLUSH_ROWS", 2)  # the first run's rows reach storage before it fails

    def failing() -> Iterator[pa.RecordBatch]:
        yield _rows(["r0", "r1"])
        raise RuntimeError("FetchFailed")

    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: _Context(7, 0)))
    with pytest.raises(RuntimeError, match="FetchFailed"):
        writer.write(failing())
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: _Context(12, 0)))
    report = writer.write(iter([_rows(["r0", "r1"]), _rows(["r2"])]))
    writer.commit([report], 0)
    with pulsartx.Client(root) as c:
        reader = c.create_reader("out", pulsartx.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(1000).data())
    assert got == [b"r0", b"r1", b"r2"]


def test_a_sink_without_the_checkpoint_option_names_the_session_setting_it_cannot_see(tmp_path: Path) -> None:
    """pyspark passes a Python data source only the writeStream options: a query whose checkpoint
    comes from spark.sql.streaming.checkpointLocation reaches the sink without one. Fails before
    the fix: the error said only "needs option checkpointLocation", which such a query seemed to
    have, and the options table gave that session setting as the option's default."""
    from pulsartx.exceptions import InvalidConfiguration

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("out", 1)
    schema = StructType([StructField("value", BinaryType())])
    with pytest.raises(InvalidConfiguration, match=r"checkpointLocation on writeStream.*"
                       r"spark\.sql\.streaming\.checkpointLocation is not passed to data sources"):
        prepare_stream_write({"service.url": root, "topic": "out", "queryName": "q"}, schema, False)


@pytest.mark.xfail(strict=True, reason="without a checkpointLocation option (an explicit transactionKey alone, the "
                   "checkpoint from spark.sql.streaming.checkpointLocation) the sink has no Spark query id, so a "
                   "batch token is ':<batch id>' only: a new query (or a deleted checkpoint) under the key whose "
                   "first batch id equals the key's last committed one is taken for its replay and its output "
                   "discarded; refusing transactionKey without checkpointLocation would fix it")
def test_a_new_query_under_an_explicit_key_without_a_checkpoint_is_not_taken_for_a_replay(tmp_path: Path) -> None:
    from pulsartx.commit_protocol.microbatch import MicroBatchTransaction
    from pulsartx.commit_protocol.task import TaskAppender

    from pulsartx.naming import TopicName
    from pulsartx.storage.root import StorageRoot

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("out", 1)
    r, topic = StorageRoot.resolve(root), TopicName.parse("out")

    def batch_zero(connection: str, value: str) -> None:
        mbt = MicroBatchTransaction.begin(r, "k", None, timeout_ms=600_000, connection=connection)
        appender = TaskAppender(mbt.job, topic, {str(topic): 1}, None, 0, 0)
        appender.add(_rows([value]))
        mbt.commit([appender.finish()], 0)

    batch_zero("run-1", "first-query")
    batch_zero("run-2", "second-query")  # another query under the same key: its own batch 0
    with pulsartx.Client(root) as c:
        reader = c.create_reader("out", pulsartx.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(1000).data())
    assert got == [b"first-query", b"second-query"]


def _sink_batch(root: str, checkpoint: str, batch_id: int, values: list[str], **options: str) -> None:
    """One micro-batch through the sink as pyspark drives it: begin, one task's write, commit."""
    import pyspark

    schema = StructType([StructField("value", BinaryType())])
    writer = prepare_stream_write({"service.url": root, "topic": "out", "checkpointLocation": checkpoint,
                                   "transactionKeepAlive": "false", **options}, schema, False)
    task = _Context(batch_id, 0)
    original = pyspark.TaskContext.get
    pyspark.TaskContext.get = staticmethod(lambda: task)
    try:
        report = writer.write(iter([_rows(values)]))
    finally:
        pyspark.TaskContext.get = original
    writer.commit([report], batch_id)


def _output(root: str) -> list[bytes]:
    with pulsartx.Client(root) as c:
        reader = c.create_reader("out", pulsartx.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(1000).data())
    return got


def _checkpoint(tmp_path: Path, query_id: str) -> Path:
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    return ck


def test_a_batch_replayed_under_each_spelling_of_its_checkpoint_is_written_once(tmp_path: Path,
                                                                               monkeypatch: Any) -> None:
    """Batch 0 commits, then every restart replays it under another spelling of the same
    checkpoint. Fails before the fix: the key hashed the path as written, so each spelling was a
    query of its own that had never committed batch 0, and the batch was written once per spelling."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("out", 1)
    ck = _checkpoint(tmp_path, "6f1c2a9e-0000-4000-8000-000000000001")
    (tmp_path / "link").symlink_to(ck, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    spellings = [str(ck), "ck", f"{tmp_path}/./ck/", f"file://{ck}", str(tmp_path / "link")]
    for spelling in spellings:
        _sink_batch(root, spelling, 0, ["b0"])
    _sink_batch(root, "link", 1, ["b1"])
    assert _output(root) == [b"b0", b"b1"]


def test_a_query_begun_under_its_checkpoint_path_key_keeps_it(tmp_path: Path) -> None:
    """A query whose batches were committed under the key of its checkpoint's path (the only key
    before query ids were used) still finds them after the upgrade: a replay of its last batch is
    written once, and the run that held the key is fenced. Once the query-id key has a row (a
    restart under another spelling), it is the key, under every spelling; the transactionKey
    option still wins over both."""
    from pulsartx.commit_protocol.microbatch import (
        MicroBatchTransaction,
        checkpoint_path_key,
        query_transaction_key,
    )
    from pulsartx.commit_protocol.task import TaskAppender

    from pulsartx.exceptions import NotAllowedError
    from pulsartx.naming import TopicName
    from pulsartx.storage.root import StorageRoot

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("out", 1)
    r, topic = StorageRoot.resolve(root), TopicName.parse("out")
    ck = _checkpoint(tmp_path, "6f1c2a9e-0000-4000-8000-000000000002")
    old_key = checkpoint_path_key(str(ck))
    old_run = MicroBatchTransaction.begin(r, old_key, str(ck), timeout_ms=600_000, connection="old-run")
    appender = TaskAppender(old_run.job, topic, {str(topic): 1}, None, 0, 0)
    appender.add(_rows(["b3"]))
    old_run.commit([appender.finish()], 3)

    assert query_transaction_key(str(ck), None, r) == old_key
    _sink_batch(root, str(ck), 3, ["b3"])  # the upgraded query's restart replays batch 3
    assert _output(root) == [b"b3"]
    with pytest.raises(NotAllowedError):  # the pre-upgrade run is a zombie now
        MicroBatchTransaction.begin(r, old_key, str(ck), timeout_ms=600_000, connection="old-run")

    (tmp_path / "link").symlink_to(ck, target_is_directory=True)
    _sink_batch(root, str(tmp_path / "link"), 4, ["b4"])
    new_key = "query-6f1c2a9e-0000-4000-8000-000000000002"
    assert query_transaction_key(str(tmp_path / "link"), None, r) == new_key
    assert query_transaction_key(str(ck), None, r) == new_key
    assert query_transaction_key(str(ck), "mine", r) == "mine"
    _sink_batch(root, str(ck), 4, ["b4"])
    assert _output(root) == [b"b3", b"b4"]
