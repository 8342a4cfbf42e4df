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

    def __init__(self, task_attempt_id: int, attempt: int, query_id: str | None = None) -> None:
        self.id, self.attempt, self.query_id = task_attempt_id, attempt, query_id

    def getLocalProperty(self, key: str) -> str | None:  # noqa: N802
        """Spark's streaming query id, the one local property the sink reads."""
        return self.query_id if key == "sql.streaming.queryId" else None

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


def test_a_new_query_under_an_explicit_key_without_a_checkpoint_is_not_taken_for_a_replay(tmp_path: Path) -> None:
    """Two queries under one ``transactionKey``, neither given ``checkpointLocation`` (their
    checkpoints come from spark.sql.streaming.checkpointLocation, which pyspark does not pass to data
    sources), each commit their batch 0: both outputs are kept. Fails before the fix: with no query
    id, a batch was known by its id alone, so the second query's batch 0 was taken for a replay of
    the first's and its output discarded."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("out", 1)
    _sink_batch(root, None, 0, ["first-query"], query_id="6f1c2a9e-0000-4000-8000-00000000000a", transactionKey="k")
    _sink_batch(root, None, 0, ["second-query"], query_id="6f1c2a9e-0000-4000-8000-00000000000b",
                transactionKey="k")
    assert _output(root) == [b"first-query", b"second-query"]


def test_a_replay_under_an_explicit_key_without_a_checkpoint_is_written_once(tmp_path: Path) -> None:
    """The same query (same Spark query id) replaying its last batch after a restart is still
    recognised without a checkpoint; so is a batch whose tasks, or whose committed transaction, have
    no query id (an earlier version's): then the batch id alone decides, as it did before."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("out", 1)
    query = "6f1c2a9e-0000-4000-8000-00000000000c"
    _sink_batch(root, None, 0, ["b0"], query_id=query, transactionKey="k")
    _sink_batch(root, None, 0, ["b0"], query_id=query, transactionKey="k")  # the restart's replay
    _sink_batch(root, None, 1, ["b1"], query_id=query, transactionKey="k")
    _sink_batch(root, None, 1, ["b1"], query_id=None, transactionKey="k")  # tasks that report no query id
    _sink_batch(root, None, 2, ["b2"], query_id=None, transactionKey="k")  # committed by an earlier version
    _sink_batch(root, None, 2, ["b2"], query_id=query, transactionKey="k")  # replayed after the upgrade
    assert _output(root) == [b"b0", b"b1", b"b2"]


def test_a_task_report_from_a_version_without_the_query_id_reads_as_none_known() -> None:
    """Reports are pickled by the tasks' version and unpickled by the driver's."""
    import pickle

    from pulsartx.commit_protocol.job import JobTransaction, TaskReport

    old = TaskReport(rows=1, txn=(0, 1))
    del old.__dict__["query_id"]  # the shape an earlier version pickles
    report = pickle.loads(pickle.dumps(old))
    assert report.query_id == "" and JobTransaction.query_id_of([report, None]) == ""
    assert JobTransaction.query_id_of([report, TaskReport(query_id="q")]) == "q"
    with pytest.raises(ValueError, match="several streaming queries"):
        JobTransaction.query_id_of([TaskReport(query_id="q"), TaskReport(query_id="r")])


def _sink_batch(root: str, checkpoint: str | None, batch_id: int, values: list[str], query_id: str | None = None,
                **options: str) -> None:
    """One micro-batch through the sink as pyspark drives it: begin, one task's write, commit.
    ``query_id``: the Spark query id the task sees (Spark sets it on every task of a streaming query)."""
    import pyspark

    schema = StructType([StructField("value", BinaryType())])
    given = {"checkpointLocation": checkpoint} if checkpoint is not None else {}
    writer = prepare_stream_write({"service.url": root, "topic": "out", "transactionKeepAlive": "false", **given,
                                   **options}, schema, False)
    task = _Context(batch_id, 0, query_id)
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
