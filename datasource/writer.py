"""``df.write.format("pulsartx")``: the DataSourceArrowWriter whose job is one transaction
(:mod:`commit_protocol`).

Save modes. Topics are append-only: ``mode("append")`` is the mode, and ``overwrite`` is refused
with an explanation. Spark 4 itself rejects ``errorifexists`` and ``ignore`` (and the default
mode, which is errorifexists) for every Python data source, with
``[UNSUPPORTED_DATA_SOURCE_SAVE_MODE]``, before any of our code runs; so their meaning is offered
through ``.option("saveMode", "errorifexists" | "ignore")`` with ``mode("append")``: errorifexists
fails if the topic exists and creates it otherwise; ignore writes nothing if it exists and
creates it otherwise.
"""
from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pulsartx.commit_protocol.job import SPARK_QUERY_ID_PROPERTY, JobTransaction, TaskReport
from pulsartx.commit_protocol.task import TaskAppender
from pulsartx.datasource.errors import spark_facing
from pulsartx.datasource.options import PARTITIONS, TRANSACTION_KEEP_ALIVE, TRANSACTION_TIMEOUT_MS
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pulsartx.admin.topics import TopicsAdmin
from pulsartx.exceptions import (
    ExpiredTransactionError,
    InvalidConfiguration,
    TopicAlreadyExists,
    TopicNotFound,
    TransactionFenced,
)
from pulsartx.storage.cli_command import cli_command

if TYPE_CHECKING:
    from pulsartx.commit_protocol.job import JobTransaction
    from pulsartx.datasource.options import WriteOptions

_STRING_MAP = MapType(StringType(), StringType())
WRITE_COLUMNS: dict[str, tuple[tuple[type[DataType], ...], str]] = {
    "value": ((BinaryType, StringType), "binary or string"),
    "__key": ((StringType,), "string"),
    "__topic": ((StringType,), "string"),
    "__eventTime": ((TimestampType, TimestampNTZType), "timestamp"),
    "__messageProperties": ((MapType,), "map<string,string>"),
    "__partition": ((IntegerType, LongType, ShortType, ByteType), "int"),
}


def check_write_schema(schema: StructType) -> list[str]:
    """The DataFrame's columns, validated: ``value`` is required, the ``__`` columns are optional,
    and anything else is refused by name (a typo must not silently drop data)."""
    names = [f.name for f in schema.fields]
    if "value" not in names:
        raise InvalidConfiguration(
            f"the DataFrame has no 'value' column (it has {', '.join(names) or 'no columns'}): select or alias the "
            "payload as value, e.g. df.selectExpr('to_json(struct(*)) AS value')")
    for f in schema.fields:
        spec = WRITE_COLUMNS.get(f.name)
        if spec is None:
            raise InvalidConfiguration(
                f"column {f.name!r} is not written by pulsartx: drop it or rename it; the columns are "
                f"{', '.join(WRITE_COLUMNS)}")
        types, shown = spec
        # MapType equality includes valueContainsNull, which create_map/map() set to False:
        # compare key and value types only.
        ok = isinstance(f.dataType, types) and (f.name != "__messageProperties" or (
            f.dataType.keyType == _STRING_MAP.keyType and f.dataType.valueType == _STRING_MAP.valueType))
        if not ok:
            raise InvalidConfiguration(f"column {f.name!r} has type {f.dataType.simpleString()}: it must be {shown}; "
                                       "cast it first")
    return names


def resolve_targets(opts: WriteOptions, schema: StructType, overwrite: bool
                    ) -> tuple[tuple[str, ...], dict[str, int], frozenset[str], bool]:
    """Driver side, shared by batch and streaming writes: validate mode, columns and topic, create
    the topic when asked. Returns (columns, partition counts, partitions to register up front,
    skip) where skip means saveMode=ignore found the topic, so nothing is written."""
    if overwrite:
        topic = "TOPIC" if opts.topic is None else opts.topic.short
        raise InvalidConfiguration(
            "mode('overwrite') is not supported (nor is streaming outputMode complete): pulsartx topics are "
            "append-only logs (readers hold offsets into them). Use mode('append') / outputMode append; to start "
            f"over, delete and recreate the topic (`{cli_command(opts.root, 'topics', 'delete', topic)}`)")
    columns = check_write_schema(schema)
    if opts.topic is None and "__topic" not in columns:
        raise InvalidConfiguration("no topic to write to: set option topic, or add a __topic column naming each "
                                   "row's topic")
    if opts.save_mode != "append" and "__topic" in columns:
        # Rows routed by __topic go to topics only the tasks see: the driver cannot check whether
        # they exist, and ignoring the mode appended to existing topics anyway.
        raise InvalidConfiguration(
            f"option saveMode={opts.save_mode} needs the topic option and no __topic column: the topics a "
            "__topic column names are known only as rows are written, so they cannot be checked first; drop "
            "the column, or use saveMode append (the default)")
    admin = TopicsAdmin(opts.root)
    counts: dict[str, int] = {}
    skip = False
    if opts.topic is not None:
        name = str(opts.topic)
        try:
            counts[name] = admin.get_partitions(name)
            exists = True
        except TopicNotFound:
            exists = False
        if exists and opts.save_mode == "errorifexists":
            raise TopicAlreadyExists(f"topic {name} already exists and option saveMode=errorifexists: use saveMode "
                                     "append (the default) to add to it")
        skip = exists and opts.save_mode == "ignore"
        if not exists:
            if not opts.create_topic and opts.save_mode == "append":
                create = cli_command(opts.root, "topics", "create", opts.topic.short)
                raise TopicNotFound(f"topic {name} does not exist: create it first (client.admin.create_topic or "
                                    f"`{create}`), or set option createTopic=true with partitions=N")
            counts[name] = admin.ensure_topic(name, opts.partitions)  # a racing creator's count wins
        if opts.partitions_given and not skip and counts[name] != opts.partitions:
            if opts.partitions > counts[name]:
                grow = cli_command(opts.root, "topics", "update-partitioned-topic", opts.topic.short, "-p",
                                   str(opts.partitions))
                how = f"grow the topic (`{grow}`; keys then route by the new count) and write again"
            else:
                delete = cli_command(opts.root, "topics", "delete", opts.topic.short)
                how = f"delete the topic (`{delete}`, its messages are lost) and write again: a count only grows"
            raise InvalidConfiguration(
                f"option {PARTITIONS}={opts.partitions} does not match topic {name}, which has {counts[name]} "
                f"partitions. Remove option {PARTITIONS} (or set {PARTITIONS}={counts[name]}) to write to the topic "
                f"as it is; to have {opts.partitions} partitions, {how}")
    registered: frozenset[str] = frozenset()
    if opts.topic is not None and "__topic" not in columns:
        registered = frozenset(str(opts.topic.with_partition(i)) for i in range(counts[str(opts.topic)]))
    return tuple(columns), counts, registered, skip


def prepare_write(opts: WriteOptions, schema: StructType, overwrite: bool) -> PulsarTxBatchWriter:
    """Driver side (``writer()``): validate everything, then begin the job's transaction."""
    columns, counts, registered, skip = resolve_targets(opts, schema, overwrite)
    job = JobTransaction.begin(opts.root, transactional=opts.transactional and not skip,
                               timeout_ms=opts.transaction_timeout_ms, producer_name=opts.producer_name,
                               partitions=registered, keep_alive=opts.keep_alive)
    create = opts.partitions if opts.create_topic else None
    writer = PulsarTxBatchWriter(job, opts.topic, counts, create, registered, columns, skip)
    writer.compression = opts.compression
    writer.keep_alive = opts.keep_alive
    writer.expected_partitions = opts.partitions if opts.partitions_given else None
    return writer


class TaskWriting:
    """The executor half shared by the batch and streaming writers: route, append, report. The
    writer object is pickled to every task; it carries the transaction and no state."""

    compression: str | None = None  # option compressionType (set by the prepare functions)
    # Option partitions when given (set by the prepare functions): a __topic-routed topic that
    # exists with another count is written as it is, with a WARNING.
    expected_partitions: int | None = None

    def __init__(self, job: JobTransaction, topic, counts: dict[str, int], create_partitions: int | None,
                 registered: frozenset[str], columns: tuple[str, ...], skip: bool):
        self.job = job
        self.topic = topic
        self.counts = counts
        self.create_partitions = create_partitions
        self.registered = registered
        self.columns = columns
        self.skip = skip

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext


        ctx = TaskContext.get()
        # Spark sets it on every task of a streaming query; the streaming sink's driver side cannot
        # learn it otherwise without a checkpointLocation option.
        query = (ctx.getLocalProperty(SPARK_QUERY_ID_PROPERTY) if ctx is not None else None) or ""
        if self.skip:
            collections.deque(iterator, maxlen=0)  # saveMode=ignore on an existing topic: write nothing
            return TaskReport(query_id=query)
        task_id, attempt, unique = ((ctx.partitionId(), ctx.attemptNumber(), ctx.taskAttemptId())
                                    if ctx is not None else (0, 0, None))
        appender = TaskAppender(self.job, self.topic, self.counts, self.create_partitions, task_id, attempt,
                                self.registered, self.compression, task_attempt_id=unique,
                                expected_partitions=self.expected_partitions)
        for batch in iterator:
            if batch.num_rows:
                appender.add(batch)
        report = appender.finish()
        report.query_id = query
        return report


@spark_facing
class PulsarTxBatchWriter(TaskWriting, DataSourceArrowWriter):
    keep_alive: bool = True  # option transactionKeepAlive (set by prepare_write), for the expiry message

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        try:
            self.job.commit(messages)
        except TransactionFenced:
            raise
        except ExpiredTransactionError as e:
            # The TC's message says only "begin a new transaction": the user's fix is an option.
            fix = (f"raise option {TRANSACTION_TIMEOUT_MS}" if self.keep_alive else
                   f"set option {TRANSACTION_KEEP_ALIVE}=true (the default) so the driver extends the transaction "
                   f"while the job runs, or raise option {TRANSACTION_TIMEOUT_MS}")
            raise ExpiredTransactionError(
                f"{e}: the write job outlived its transaction (option {TRANSACTION_TIMEOUT_MS}="
                f"{self.job.timeout_ms} ms) and nothing of it is visible; {fix}, then run the job again") from e

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.job.abort(messages)
