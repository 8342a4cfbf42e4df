"""The batch write path's driver and task halves without a SparkSession: what one job's tasks
append, and what a later job under the same options appends, exactly."""
from __future__ import annotations

import logging
import time

import pyarrow as pa
import pytest
from pulsartx.datasource.options import parse_write_options
from pulsartx.datasource.writer import prepare_write
from pyspark.sql.types import BinaryType, MapType, StringType, StructField, StructType
from spark_jobs.checks import data_count, txns  # tests/ is on sys.path (conftest)

from pulsartx.admin.topics import TopicsAdmin
from pulsartx.exceptions import ExpiredTransactionError, InvalidConfiguration
from pulsartx.storage.root import StorageRoot

SCHEMA = StructType([StructField("value", StringType())])


@pytest.mark.parametrize("transactional", ["true", "false"])
def test_second_job_under_one_producer_name_writes_all_its_rows(root: str, transactional: str) -> None:
    """With transactional=false the tasks' producer names carried no TxnID, so a second job under
    the same producerName reused the first job's names and sequence ids from 0: its rows were all
    dropped as duplicates, silently (the job succeeded, the topic kept 3 rows of 6)."""
    for job in range(2):
        w = prepare_write(parse_write_options({"service.url": root, "topic": "t", "createTopic": "true",
                                               "transactional": transactional, "producerName": "etl"}),
                          SCHEMA, False)
        report = w.write(iter([pa.RecordBatch.from_pydict({"value": [f"j{job}-{i}" for i in range(3)]})]))
        w.commit([report])
        assert report.rows == 3, report
    assert data_count(root, "t") == 6


def test_a_job_outliving_its_timeout_fails_naming_the_options(root: str) -> None:
    """With transactionKeepAlive=false a job longer than transactionTimeoutMs failed at commit with
    the TC's "transaction (a,b) is expired: ... begin a new transaction", naming no option."""
    w = prepare_write(parse_write_options({"service.url": root, "topic": "t", "createTopic": "true",
                                           "transactionKeepAlive": "false", "transactionTimeoutMs": "50"}),
                      SCHEMA, False)
    report = w.write(iter([pa.RecordBatch.from_pydict({"value": ["a"]})]))
    time.sleep(0.2)
    with pytest.raises(ExpiredTransactionError) as e:
        w.commit([report])
    msg = str(e.value)
    assert "option transactionTimeoutMs=50 ms" in msg and "set option transactionKeepAlive=true" in msg, msg
    w.abort([report])  # what Spark does next: the transaction is aborted, none of the job's rows visible
    assert {m.status.value for m in txns(root).values()} == {"ABORTED"}


@pytest.mark.parametrize(("column", "fix"), [("value", "coalesce(value, '')"),
                                             ("__messageProperties", "v IS NOT NULL")])
def test_null_values_and_null_property_values_are_refused_naming_the_column(root: str, column: str,
                                                                            fix: str) -> None:
    """A null value was stored and consumed as b'', a null property value reached consumers as
    {'a': None}: both are what a producer's send and send_table refuse."""
    schema = StructType([StructField("value", BinaryType()),
                         StructField("__messageProperties", MapType(StringType(), StringType()))])
    w = prepare_write(parse_write_options({"service.url": root, "topic": "t", "createTopic": "true"}), schema, False)
    good = [(b"x", [("a", "1")]), (b"y", None), (b"z", [])]
    bad = (None, None) if column == "value" else (b"w", [("a", None)])
    batch = pa.RecordBatch.from_pydict({"value": pa.array([r[0] for r in [*good, bad]], pa.binary()),
                                        "__messageProperties": pa.array([r[1] for r in [*good, bad]],
                                                                        pa.map_(pa.string(), pa.string()))})
    w.write(iter([batch.slice(0, 3)]))  # a slice without the bad row is fine
    with pytest.raises(InvalidConfiguration, match=f"column {column} has 1 null") as e:
        w.write(iter([batch]))
    assert fix in str(e.value)
    w.abort([])
    assert data_count(root, "t") == 3  # the first task's rows, of the aborted transaction only
    assert {m.status.value for m in txns(root).values()} == {"ABORTED"}


def test_partitions_without_create_topic_is_checked_against_the_topic(root: str) -> None:
    """Without createTopic=true, partitions was ignored: the write went to the existing topic with
    its own count. The same count writes; another is refused before a transaction begins."""
    TopicsAdmin(StorageRoot.resolve(root)).create_topic("t", 2)
    opts = {"service.url": root, "topic": "t"}
    with pytest.raises(InvalidConfiguration, match="option partitions=4 does not match") as e:
        prepare_write(parse_write_options({**opts, "partitions": "4"}), SCHEMA, False)
    assert "has 2 partitions" in str(e.value)
    assert txns(root) == {}
    w = prepare_write(parse_write_options({**opts, "partitions": "2"}), SCHEMA, False)
    w.commit([w.write(iter([pa.RecordBatch.from_pydict({"value": ["a"]})]))])
    assert data_count(root, "t") == 1


@pytest.mark.parametrize("save_mode", ["ignore", "errorifexists"])
def test_partitions_sets_the_count_of_a_topic_a_save_mode_creates(root: str, save_mode: str) -> None:
    """saveMode ignore and errorifexists create a missing topic without createTopic: partitions applies."""
    w = prepare_write(parse_write_options({"service.url": root, "topic": "t", "saveMode": save_mode,
                                           "partitions": "3"}), SCHEMA, False)
    w.commit([w.write(iter([pa.RecordBatch.from_pydict({"value": ["a"]})]))])
    assert TopicsAdmin(StorageRoot.resolve(root)).get_partitions("t") == 3


def test_partitions_other_than_an_existing_topics_count_is_refused(root: str) -> None:
    """createTopic=true with partitions=4 wrote to an existing 2-partition topic as it was, silently."""
    TopicsAdmin(StorageRoot.resolve(root)).create_topic("t", 2)
    opts = {"service.url": root, "topic": "t", "createTopic": "true"}
    with pytest.raises(InvalidConfiguration, match="option partitions=4") as e:
        prepare_write(parse_write_options({**opts, "partitions": "4"}), SCHEMA, False)
    msg = str(e.value)
    assert "persistent://public/default/t" in msg and "has 2 partitions" in msg and "partitions=2" in msg, msg
    assert txns(root) == {}  # refused before a transaction began
    for same in ({**opts, "partitions": "2"}, opts, {**opts, "partitions": "4", "saveMode": "ignore"}):
        w = prepare_write(parse_write_options(same), SCHEMA, False)
        w.commit([w.write(iter([pa.RecordBatch.from_pydict({"value": ["a"]})]))])
    assert data_count(root, "t") == 2  # saveMode=ignore wrote nothing


def test_partitions_other_than_a_routed_topics_count_is_logged(root: str, caplog: pytest.LogCaptureFixture) -> None:
    """A __topic column may name topics made before and topics the write creates: an existing one
    keeps its count, and a WARNING names both counts."""
    TopicsAdmin(StorageRoot.resolve(root)).create_topic("old", 2)
    schema = StructType([StructField("value", StringType()), StructField("__topic", StringType())])
    w = prepare_write(parse_write_options({"service.url": root, "createTopic": "true", "partitions": "4"}),
                      schema, False)
    with caplog.at_level(logging.WARNING, logger="pulsartx.commit_protocol"):
        report = w.write(iter([pa.RecordBatch.from_pydict({"value": ["a", "b"], "__topic": ["old", "new"]})]))
    w.commit([report])
    admin = TopicsAdmin(StorageRoot.resolve(root))
    assert (admin.get_partitions("old"), admin.get_partitions("new")) == (2, 4)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "persistent://public/default/old" in warned[0], warned
    assert "has 2 partitions" in warned[0] and "option partitions=4" in warned[0], warned
