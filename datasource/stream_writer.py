"""``writeStream.format("pulsartx")``: each micro-batch is one transaction (pulsartx.commit_protocol.microbatch).

pyspark calls ``streamWriter()`` for every micro-batch, twice: in a planner worker (that writer is
pickled to the tasks, so it begins the batch's transaction) and in the sink runner that commits or
aborts (which rebuilds the DataSource, so it must not begin another: it learns the transaction from
the tasks' reports). Nothing lives in memory between batches.
"""
from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from pulsartx.commit_protocol.job import JobTransaction
from pulsartx.commit_protocol.microbatch import MicroBatchTransaction, query_transaction_key
from pulsartx.datasource.errors import spark_facing
from pulsartx.datasource.option_table import WRITE_STREAM
from pulsartx.datasource.options import (
    CHECKPOINT_LOCATION,
    TRANSACTION_KEY,
    _lower,
    parse_write_options,
)
from pulsartx.datasource.writer import TaskWriting, resolve_targets
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pulsartx.coordinator.keys import full_key
from pulsartx.exceptions import InvalidConfiguration

if TYPE_CHECKING:
    from pulsartx.commit_protocol.microbatch import MicroBatchTransaction

    from pulsartx.storage.root import StorageRoot

log = logging.getLogger("pulsartx.datasource")
SINK_RUNNER = "pyspark.sql.worker.python_streaming_sink_runner"


def in_sink_runner() -> bool:
    """True in pyspark's streaming sink runner, the process that only commits or aborts batches."""
    return SINK_RUNNER in sys.modules


def prepare_stream_write(options, schema: StructType, overwrite: bool) -> PulsarTxStreamWriter:

    raw = _lower(options)
    opts = parse_write_options(raw, WRITE_STREAM)
    checkpoint = raw.get(CHECKPOINT_LOCATION.lower())
    explicit = raw.get(TRANSACTION_KEY.lower())
    if explicit is not None:
        full_key(None, explicit)  # validates the key (no '&')
    if not checkpoint and not explicit:
        # Spark resolves spark.sql.streaming.checkpointLocation for the query but passes a Python
        # data source only the options given to writeStream: the session setting never arrives here.
        raise InvalidConfiguration(
            f"a pulsartx streaming sink needs option {CHECKPOINT_LOCATION} on writeStream (exactly-once needs it), "
            f"e.g. .option('{CHECKPOINT_LOCATION}', '/path/to/checkpoint'); the session setting "
            "spark.sql.streaming.checkpointLocation is not passed to data sources")
    if not opts.transactional:
        raise InvalidConfiguration("option transactional=false is not supported by the streaming sink: every "
                                   "micro-batch is one transaction")
    key = query_transaction_key(checkpoint, explicit, opts.root)
    timeout = opts.transaction_timeout_ms
    # No partition is registered up front (a batch write registers its topic's): each task
    # registers the partitions it has rows for before appending to them (Pulsar's ADD_PARTITION
    # before send). A micro-batch with no output then has no participant, and its commit is one
    # TC-log write instead of a marker on every partition of the topic
    # (docs/design/empty-micro-batches-register-nothing.md).
    columns, counts, _, skip = resolve_targets(opts, schema, overwrite)
    create = opts.partitions if opts.create_topic else None
    if in_sink_runner():
        return PulsarTxStreamWriter(None, opts.root, key, checkpoint, timeout, opts.keep_alive, opts.topic, counts,
                                    create, frozenset(), columns, skip)
    mbt = MicroBatchTransaction.begin(opts.root, key, checkpoint, timeout_ms=timeout,
                                      producer_name=opts.producer_name, keep_alive=opts.keep_alive)
    writer = PulsarTxStreamWriter(mbt, opts.root, key, checkpoint, timeout, opts.keep_alive, opts.topic, counts,
                                  create, frozenset(), columns, skip)
    writer.compression = opts.compression
    writer.expected_partitions = opts.partitions if opts.partitions_given else None
    return writer


@spark_facing
class PulsarTxStreamWriter(TaskWriting, DataSourceStreamArrowWriter):
    def __init__(self, mbt: MicroBatchTransaction | None, root: StorageRoot, key: str, checkpoint: str | None,
                 timeout_ms: int, keep_alive: bool, *args):
        super().__init__(mbt.job if mbt is not None else JobTransaction(root, None, f"stream-{key}", timeout_ms), *args)
        self.mbt = mbt
        self.root = root
        self.key = key
        self.checkpoint = checkpoint
        self.timeout_ms = timeout_ms
        self.keep_alive = keep_alive

    def _batch_txn(self, messages: list[WriterCommitMessage | None]) -> MicroBatchTransaction | None:
        return MicroBatchTransaction.for_commit(self.root, self.key, self.checkpoint, self.timeout_ms, messages)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 (Spark's name)
        mbt = self._batch_txn(messages)
        if mbt is None:
            # No task wrote anything; the input may still need acknowledging, atomically as always.
            mbt = MicroBatchTransaction.begin(self.root, self.key, self.checkpoint, timeout_ms=self.timeout_ms,
                                              keep_alive=self.keep_alive)
        mbt.commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        mbt = self._batch_txn(messages)
        if mbt is not None:
            mbt.abort(messages, batchId)
        else:
            aborted = MicroBatchTransaction.abort_open_of_run(self.root, self.key, self.checkpoint, batchId)
            log.info("batch %d aborted before any task reported; aborted its open transaction(s) %s", batchId,
                     [str(t) for t in aborted])
