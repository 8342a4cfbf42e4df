"""A task attempt's side of the commit protocol: route rows to partitions, append them with the
job's TxnID through the idempotent-producer path, and report exactly what was appended.

The producer name is unique per (job, task attempt), and sequence ids count the attempt's rows,
so a retried append inside an attempt is deduplicated while a new attempt of the same task
writes afresh (its own report is the one the driver commits; the failed attempt's entries are
never listed in a marker, so they stay invisible).
"""
from __future__ import annotations

import itertools
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pulsartx.commit_protocol.job import JobTransaction, TaskReport

from pulsartx.admin.topics import TopicsAdmin
from pulsartx.client.routing import partitions_for_keys
from pulsartx.exceptions import InvalidConfiguration, InvalidTopicName, InvalidTxnStatusError, TopicNotFound
from pulsartx.log.partition import PartitionLog, records_from_arrow, shared_log
from pulsartx.naming import TopicName

log = logging.getLogger("pulsartx.commit_protocol")
FLUSH_ROWS = 250_000
FLUSH_BYTES = 64 * 1024 * 1024


@dataclass
class _Buffer:
    log: PartitionLog
    chunks: list[pa.Table] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0


def split_by_partition(rows: pa.Table, idx: np.ndarray) -> Iterator[tuple[int, pa.Table]]:
    """``rows`` cut by partition index, each part in the rows' order: one stable sort and one
    ``take``, then zero-copy slices. A filter per partition scanned every row once per partition
    it touched (four masks, four filter kernels a batch over four partitions)."""
    if not len(idx):
        return
    first = idx[0]
    if bool((idx == first).all()):
        yield int(first), rows  # one partition: whole, no copy
        return
    order = np.argsort(idx, kind="stable")
    ordered = idx[order]
    cuts = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), len(ordered)]
    taken = rows.take(pa.array(order))
    for a, b in itertools.pairwise(cuts):
        yield int(ordered[a]), taken.slice(a, b - a)


def _row_topic(name: str) -> TopicName:
    """A ``__topic`` value as a topic, refused as the ``topic`` option would be: a task's error
    must name the column, and a partition name must not be silently re-routed over every partition."""
    try:
        topic = TopicName.parse(name)
    except InvalidTopicName as e:
        raise InvalidTopicName(f"column __topic: {e}") from None
    if topic.partition is not None:
        raise InvalidConfiguration(f"__topic={str(topic)!r} names a single partition: give the topic, and use a "
                                   "__partition column to choose partitions")
    return topic


def check_nulls(batch: pa.RecordBatch) -> None:
    """Refuse what a producer refuses (docs/semantics.md, send_table): a null ``value`` was stored and
    read back by consumers as ``b""``, and a null property value reached them as ``{"k": None}``
    where properties map str to str. A null key, event time or properties map is a message without one."""
    names = batch.schema.names
    value = batch.column(names.index("value"))
    if value.null_count:
        raise InvalidConfiguration(
            f"column value has {value.null_count} null(s): every message has a payload; filter those rows out "
            "(df.where('value IS NOT NULL')) or fill them (coalesce(value, ''))")
    if "__messageProperties" in names:
        props = batch.column(names.index("__messageProperties"))
        lo, hi = props.offsets[0].as_py(), props.offsets[-1].as_py()
        nulls = props.items.slice(lo, hi - lo).null_count
        if nulls:
            raise InvalidConfiguration(
                f"column __messageProperties has {nulls} null property value(s): properties map string to "
                "string; drop them (map_filter(__messageProperties, (k, v) -> v IS NOT NULL)) or fill them")


class TaskAppender:
    def __init__(self, job: JobTransaction, default_topic: TopicName | None, partition_counts: dict[str, int],
                 create_topics: int | None, task_id: int, attempt: int, registered: frozenset[str] = frozenset(),
                 compression: str | None = None, task_attempt_id: int | None = None,
                 expected_partitions: int | None = None):
        self.job = job
        self.compression = compression  # the write's compressionType option: the payload column's codec
        self.default_topic = default_topic
        self.counts = dict(partition_counts)  # topic -> partitions, known on the driver
        self.create_topics = create_topics  # partitions for topics created on the fly, or None
        self.expected_partitions = expected_partitions  # option partitions, when given
        self.task_id = task_id
        # Spark numbers a task's attempts per stage attempt: a stage run again (a shuffle fetch
        # failure, a lost executor) runs the task as attempt 0 again. Under one name, the new
        # attempt's sequence ids would be taken for resends of the failed attempt's rows, which no
        # report lists: those rows would be lost. Spark's task attempt id is unique in its context.
        unique = "" if task_attempt_id is None else f"-i{task_attempt_id}"
        plain = f"plain-{job.run_id}" if job.run_id else "plain"
        self.producer = f"{job.producer_prefix}-{job.txn_id or plain}{unique}-t{task_id}-a{attempt}"
        self.registered = set(registered)
        self.buffers: dict[str, _Buffer] = {}
        self.report = TaskReport(attempt=self.producer, txn=job.txn_id.as_tuple() if job.txn_id else None)
        self.sequence = 0
        # Set when the transaction was found ended (aborted by a stopped query or a failed job) as
        # the task registered: its rows are then dropped, not written.
        self.ended: InvalidTxnStatusError | None = None
        # The partition of the task's next unkeyed Arrow batch: rotating by batch from a start that
        # differs between the tasks of a job and from job to job (each micro-batch is a new
        # transaction), as Pulsar's router starts each producer at a random partition.
        self.round_robin = task_id + zlib.crc32(f"{job.producer_prefix}-{job.txn_id or 'plain'}".encode())

    # ---- routing ----------------------------------------------------------------------------------
    def _partitions_of(self, topic: str) -> int:
        n = self.counts.get(topic)
        if n is None:
            admin = TopicsAdmin(self.job.root)
            try:
                n = admin.get_partitions(topic)
            except TopicNotFound:
                if self.create_topics is None:
                    raise TopicNotFound(
                        f"topic {topic} (from the __topic column) does not exist: create it first, or set "
                        "option createTopic=true with partitions=N") from None
                n = admin.ensure_topic(topic, self.create_topics)
            if self.expected_partitions is not None and n != self.expected_partitions:
                # Not refused, as a topic the option names is: the topics of a __topic column may mix
                # ones made before, with their own counts, and ones this write creates.
                log.warning("topic %s (from the __topic column) has %d partitions; option partitions=%d applies "
                            "only to topics this write creates, so its rows are written over its %d", topic, n,
                            self.expected_partitions, n)
            self.counts[topic] = n
        return n

    def _route(self, batch: pa.RecordBatch) -> Iterator[tuple[str, pa.Table]]:
        """Split a batch into per-partition tables: ``__partition`` if given, else the key's hash
        (Pulsar's router), else the batch's round-robin partition (:meth:`_batch_partition`)."""
        table = pa.Table.from_batches([batch])
        if "__topic" in table.column_names:
            topics = table.column("__topic")
            if topics.null_count:
                if self.default_topic is None:
                    raise InvalidConfiguration("a row has a null __topic and no topic option is set: give every row "
                                               "a __topic or set option topic")
                topics = pc.fill_null(topics, str(self.default_topic))
            groups = [(_row_topic(t), table.filter(pc.equal(topics, t))) for t in pc.unique(topics).to_pylist()]
        else:
            assert self.default_topic is not None
            groups = [(self.default_topic, table)]
        for topic, rows in groups:
            name = str(topic)
            n = self._partitions_of(name)
            if self._unrouted(rows):
                yield str(topic.with_partition(self._batch_partition(n))), rows  # whole, no copy
                continue
            idx = self._partition_index(rows, n, name)
            for p, part in split_by_partition(rows, idx):
                yield str(topic.with_partition(p)), part

    @staticmethod
    def _has_values(rows: pa.Table, column: str) -> bool:
        """Whether some row has a value in ``column`` (the column may be absent)."""
        return column in rows.column_names and rows.column(column).null_count < rows.num_rows

    def _unrouted(self, rows: pa.Table) -> bool:
        """No row names a partition or has a key: the whole batch goes to one partition."""
        return not (self._has_values(rows, "__partition") or self._has_values(rows, "__key"))

    def _batch_partition(self, n: int) -> int:
        """The partition of this Arrow batch's unkeyed rows, the next one for the next batch.
        Pulsar's round-robin router with batching does the same: "round-robin is not done per
        individual message but rather it's set to the same boundary of batching delay". Spreading
        row by row instead cut every batch into a slice per partition, so each task appended to
        every partition (a data file and a Delta commit each) however few rows it had."""
        p = self.round_robin % n
        self.round_robin += 1
        return p

    def _partition_index(self, rows: pa.Table, n: int, topic: str) -> np.ndarray:
        if self._has_values(rows, "__partition"):
            given = rows.column("__partition").to_numpy(zero_copy_only=False)
            bad = list(dict.fromkeys(int(v) for v in given if not np.isnan(v) and not 0 <= v < n))[:3]
            if bad:
                # Only a task sees the rows, so this cannot fail earlier; one line, leading Spark's error.
                raise InvalidConfiguration(
                    f"__partition={', '.join(map(str, bad))} is out of range: topic {topic} has {n} partition"
                    f"{'s' if n > 1 else ''} (0..{n - 1}); give a __partition from 0 to {n - 1}, or null to route "
                    "the row by __key")
            default = self._fallback(rows, n)
            return np.where(np.isnan(given.astype(float)), default, np.nan_to_num(given)).astype(np.int64)
        return self._fallback(rows, n)

    def _fallback(self, rows: pa.Table, n: int) -> np.ndarray:
        """Each row's partition by its key; rows without a key share the batch's partition."""
        if n == 1:
            return np.zeros(rows.num_rows, dtype=np.int64)  # no key to hash
        if not self._has_values(rows, "__key"):
            return np.full(rows.num_rows, self._batch_partition(n), dtype=np.int64)
        keyed = partitions_for_keys(rows.column("__key"), n)
        unkeyed = keyed < 0
        if unkeyed.any():
            keyed[unkeyed] = self._batch_partition(n)
        return keyed

    # ---- appending --------------------------------------------------------------------------------
    def add(self, batch: pa.RecordBatch) -> None:
        check_nulls(batch)
        for partition, rows in self._route(batch):
            buf = self.buffers.get(partition)
            if buf is None:
                # Python workers outlive tasks: the process-wide log is loaded once per worker
                # (a Delta snapshot load costs tens of ms and grows with the table), and caught
                # up before each append (_flush).
                buf = self.buffers[partition] = _Buffer(shared_log(self.job.root, TopicName.parse(partition)))
            buf.chunks.append(rows)
            buf.rows += rows.num_rows
            buf.bytes += rows.nbytes
            if buf.rows >= FLUSH_ROWS or buf.bytes >= FLUSH_BYTES:
                self._flush(partition, buf)

    def _flush(self, partition: str, buf: _Buffer) -> None:
        if not buf.rows:
            return
        if self.ended is None:
            # Other tasks of the job appended to this partition since this worker last looked: without
            # catching up first (one probe per new commit), the append would take a stale next offset,
            # lose its commit race and encode its file twice (11 of 16 appends did, in bench/spark_write.py).
            # Also notices a partition deleted or re-created since, before ADD_PARTITION names it.
            buf.log.sync_writer()
            if self.job.transactional and partition not in self.registered:
                self._register([partition])  # ADD_PARTITION before any data reaches the partition
        chunks = buf.chunks
        buf.chunks, buf.rows, buf.bytes = [], 0, 0
        if self.ended is not None:  # the transaction ended: nothing of this task is written
            return
        rows = pa.concat_tables(chunks)
        records = records_from_arrow(
            rows.column("value"),
            keys=rows.column("__key") if "__key" in rows.column_names else None,
            properties=rows.column("__messageProperties") if "__messageProperties" in rows.column_names else None,
            event_times=rows.column("__eventTime") if "__eventTime" in rows.column_names else None,
            producer_name=self.producer, first_sequence_id=self.sequence,
            txn=self.job.txn_id.as_tuple() if self.job.txn_id else None)
        self.sequence += rows.num_rows
        res = buf.log.append(records, producer_name=self.producer, compression=self.compression)
        self.report.entries.extend((partition, a, b) for a, b in res.entries)
        self.report.rows += rows.num_rows - res.duplicates

    def _register(self, partitions: list[str]) -> None:
        """ADD_PARTITION for ``partitions``. A refusal because the transaction is no longer OPEN
        (the TC re-read its log before refusing) means the driver aborted it: a query stopped
        mid-batch, a job that failed, a newer run fencing this one. Nothing of this task could then
        ever be visible, and the batch or job cannot commit (its commit is refused and Spark replays
        the batch), so the task drops its rows and ends without an error: an exception would be an
        ERROR line and a stack trace in Spark's log for a requested stop."""
        if self.ended is not None:
            return
        try:
            self.job.register(partitions)
        except InvalidTxnStatusError as e:
            self.ended = e
            log.info("task %s: transaction %s is no longer open (%s); its rows are not written", self.producer,
                     self.job.txn_id, e)
            return
        self.registered.update(partitions)

    def finish(self) -> TaskReport:
        # Tasks of one job finish at about the same time, each with a buffer per partition: starting
        # at a partition of its own, they do not race for the same partition's next offset (a lost
        # race re-encodes the whole append).
        names = sorted(self.buffers)
        # Every partition the task still has to register, in one ADD_PARTITION: one TC-log write
        # per task instead of one per partition (the streaming sink registers nothing up front).
        unregistered = [p for p in names if self.buffers[p].rows and p not in self.registered]
        if self.job.transactional and unregistered and self.ended is None:
            for p in unregistered:  # a partition deleted or re-created since is noticed before ADD_PARTITION names it
                self.buffers[p].log.sync_writer()
            self._register(unregistered)
        start = self.task_id % len(names) if names else 0
        for partition in names[start:] + names[:start]:
            self._flush(partition, self.buffers[partition])
        log.info("task %s appended %d rows in %d entries", self.producer, self.report.rows, len(self.report.entries))
        return self.report
