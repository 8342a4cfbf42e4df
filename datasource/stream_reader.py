"""``spark.readStream.format("pulsartx")``: micro-batches over offset ranges.

Offsets are ``{topic: {partition: next offset}}`` JSON with sorted keys, each topic also holding
``"tableIds": {partition: Delta table id}``, the incarnation its offsets belong to, so a restarted
query tells a re-created topic from the one its checkpoint read (offsets without it, from before it
was recorded or given by a user, are still accepted). The reader lives in one
long-lived process per query run (its transaction buffers fold incrementally across batches) but
``stop()`` is never called, so it holds no leases or locks.

* ``latestOffset`` never goes past a partition's maxReadPosition: undecided data is never planned,
  and a replayed batch (restart from ``offsets/N``) re-reads exactly the same committed rows, since
  everything below maxReadPosition is already decided by markers. Aborted data is filtered when
  the batch is read, as in batch reads.
* ``maxEntriesPerTrigger`` is honoured through admission control (``ReadMaxRows``), spread over
  partitions in proportion to their backlog; ``Trigger.AvailableNow`` stops at the offsets present
  when the query starts.
* ``topicsPattern`` is re-evaluated every batch; new partitions start at their earliest offset.
* ``subscription``: the query's position lives in a durable subscription. The first batch starts
  from it (so a query without a checkpoint resumes after the last committed output); each batch's
  range is handed to the sink (``pulsartx.commit_protocol.handoff``), whose transaction acknowledges it when
  the sink is pulsartx; ``commit(end)`` acknowledges it otherwise (idempotent with the former).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import partial
from typing import Any

import pyarrow as pa
from pulsartx.commit_protocol import handoff
from pulsartx.commit_protocol.handoff import TABLE_IDS, Offsets, positions
from pulsartx.datasource.batch_reader import (
    OffsetRangePartition,
    PackedPartition,
    pack_ranges,
    range_partitions,
    read_partition,
    skip_deleted,
)
from pulsartx.datasource.errors import spark_facing
from pulsartx.datasource.offsets import EARLIEST, LATEST
from pulsartx.datasource.options import StreamOptions
from pulsartx.datasource.schema import FULL, Projection
from pulsartx.datasource.topics import partitions_to_read
from pulsartx.datasource.visibility import Visibility
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pulsartx.admin.topics import TopicsAdmin
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.reads import resolved_filter
from pulsartx.client.transaction import run_beside
from pulsartx.coordinator.registry import Coordinators
from pulsartx.exceptions import InvalidConfiguration, StorageError, TopicNotFound
from pulsartx.log.partition import PartitionLog, partition_segments
from pulsartx.naming import TopicName
from pulsartx.storage import delta
from pulsartx.subscription.store import shared_store

log = logging.getLogger("pulsartx.datasource")


def _sorted(offsets: Offsets) -> Offsets:
    """Partitions in number order, then the topic's table ids (same order): Spark compares offsets
    by their JSON text."""
    out: Offsets = {}
    for t in sorted(offsets):
        parts = positions(offsets[t])
        out[t] = {p: parts[p] for p in sorted(parts, key=int)}
        tables = offsets[t].get(TABLE_IDS)
        if tables:
            out[t][TABLE_IDS] = {p: tables[p] for p in sorted(tables, key=int)}
    return out


def _copy(offsets: Offsets) -> Offsets:
    """A copy whose table ids can be changed without changing ``offsets``'."""
    return {t: {k: dict(v) if k == TABLE_IDS else v for k, v in ps.items()} for t, ps in offsets.items()}


def _get(offsets: Offsets, p: TopicName) -> int | None:
    return offsets.get(p.base.short, {}).get(str(p.partition))


def _table(offsets: Offsets, p: TopicName) -> str | None:
    """The table id ``offsets`` recorded for the partition; None in offsets from before they did."""
    return offsets.get(p.base.short, {}).get(TABLE_IDS, {}).get(str(p.partition))


def _put(offsets: Offsets, p: TopicName, offset: int, table: str) -> None:
    parts = offsets.setdefault(p.base.short, {})
    parts[str(p.partition)] = offset
    parts.setdefault(TABLE_IDS, {})[str(p.partition)] = table


def spread(limit: int, backlog: dict[str, int]) -> dict[str, int]:
    """Share ``limit`` entries among partitions in proportion to their backlog (largest
    remainders first), never giving a partition more than it has.

    A partition whose proportional share rounds down to nothing gets one entry first (the smallest
    backlogs first, while the limit lasts): by remainders alone, a partition holding a few entries
    beside one whose backlog stays large (fed faster than the limit) was given nothing batch after
    batch, so its entries waited for as long as the other's load lasted."""
    total = sum(backlog.values())
    if total <= limit:
        return dict(backlog)
    share = {k: (v * limit) // total for k, v in backlog.items()}
    left = limit - sum(share.values())
    for k in sorted((k for k, v in backlog.items() if v and not share[k]), key=lambda k: (backlog[k], k))[:left]:
        share[k] = 1
        left -= 1
    for k in sorted(backlog, key=lambda k: ((backlog[k] * limit) % total, backlog[k]), reverse=True):
        if left <= 0:
            break
        if share[k] < backlog[k]:
            share[k] += 1
            left -= 1
    return share


@spark_facing
class PulsarTxStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: StreamOptions, projection: Projection = FULL):
        self.opts = opts
        self.projection = projection
        self.root = opts.read.root
        self._buffers: dict[str, Any] = {}
        self._logs: dict[str, Any] = {}
        self._available_now: Offsets | None = None
        # Per partition, the table (incarnation) this run's offsets belong to where they do not
        # record it (offsets from before they did), and the last offset found to be the old table's
        # with where it resumed: a topic re-created under the query.
        self._tables: dict[str, str] = {}
        self._moved: dict[str, tuple[int, int]] = {}

    # ---- helpers ------------------------------------------------------------------------------------
    def _partitions(self) -> list[TopicName]:
        assert self.opts.read.selection is not None
        return partitions_to_read(self.root, self.opts.read.selection)

    def _log(self, p: TopicName):
        key = str(p)
        if key not in self._logs:
            self._logs[key] = PartitionLog(self.root, p)
        return self._logs[key]

    def _limit(self, p: TopicName) -> int:
        """The highest offset a batch may end at: maxReadPosition + 1 (or the end, uncommitted)."""
        if self.opts.read.isolation_level != "READ_COMMITTED":
            return self._log(p).end_offset()
        return self._filter(p).read_limit

    def _filter(self, p: TopicName):
        """The partition's READ_COMMITTED filter, ongoing transactions resolved through their TCs
        (the client readers' path): an expired transaction is aborted, not waited for."""

        key = str(p)
        if key not in self._buffers:
            self._buffers[key] = TransactionBuffer(self._log(p))
        return resolved_filter(Coordinators.shared(self.root), self._buffers[key])

    def _decided_up_to(self, p: TopicName, hi: int, end: int):
        """The partition's filter, which must decide every transaction below ``hi``, the end
        ``latestOffset`` planned when their outcomes were known. A filter built now stops short
        of it when an outcome known then is not now: a transaction decided through its TC alone
        (no marker yet) whose TC log cannot be read at this moment, in this run or in a restarted
        one replaying the batch. The filter then takes it for an open one, and applying it would
        show that transaction's data whatever the outcome, aborted included: the batch fails
        instead, to be retried, rather than return what may have been aborted."""
        flt = self._filter(p)
        if flt.read_limit < min(hi, end):
            raise StorageError(
                f"{p}: this micro-batch reads up to offset {hi - 1}, but a transaction from offset "
                f"{flt.read_limit} on cannot be decided now (its transaction coordinator's log cannot be "
                "read): retry the query; its data is neither shown nor skipped meanwhile")
        return flt

    def _store(self, p: TopicName):
        assert self.opts.subscription is not None
        return shared_store(self.root, p, self.opts.subscription)  # loaded once per worker process

    def _starting(self, p: TopicName) -> int:
        """Where a partition without a checkpointed offset starts."""
        plog = self._log(p)
        self._tables.setdefault(str(p), plog.table_id)
        self.opts.read.starting_offsets.check_table(p, plog.table_id)
        spec = self.opts.read.starting_offsets.position(p, plog.offset_at_time)
        if spec == EARLIEST:
            start = plog.refresh().start_offset
        elif spec == LATEST:
            start = self._limit(p)
        else:
            start = spec
        store = self._store(p) if self.opts.subscription is not None else None
        cursor = store.cursor() if store is not None and store.exists() else None
        if cursor is None or cursor.deleted:
            self._check_start(p, spec, start)
        if store is None:
            return start
        if cursor is None or cursor.deleted:
            cursor = store.create(start - 1)
            log.info("created subscription %r on %s at offset %d", self.opts.subscription, p, start)
        return cursor.mark_delete + 1

    def _check_start(self, p: TopicName, spec: int, start: int) -> None:
        """An explicit starting offset past the partition's end is refused, naming the option: the
        first batch would otherwise take it for a checkpoint of a re-created topic, and report that
        (or, with failOnDataLoss=false, read from the earliest offset, which the option skipped)."""
        if spec < 0:
            return
        end = self._log(p).end_offset()
        if start > end:
            option = self.opts.read.starting_offsets.source(p)
            raise InvalidConfiguration(
                f"option {option}: offset {start} for {p} is past the partition's end {end} (its next offset); "
                f"give an offset from 0 to {end}, or -1 (latest) to start at its end")

    def _resume_from(self, p: TopicName, offset: int, recorded: str | None, planning: bool = False) -> int:
        """``offset`` itself, unless the topic was deleted and re-created since (its offsets
        restarted), so that the offsets are the old topic's: its table is not the one the offsets
        record (``recorded``), or, in offsets that record none, not the one this run first saw, or
        the offset lies past the partition's end. As Spark's Kafka source: an error with
        failOnDataLoss (the default), else the new topic from its start."""
        plog, key = self._log(p), str(p)
        end = plog.end_offset()
        table = plog.table_id  # loaded with the log, checked by its refreshes: no read of its own
        moved = self._moved.get(key)
        if moved is not None and moved[0] == offset and recorded != table:
            # Still the old table's offset: the batch planned from the new table's start. Kept
            # until a batch is planned from it: offsets that record no table, whose first end equals
            # the old offset, run no batch (Spark sees the same offsets), and the next one starts
            # there again. An offset recorded on the current table is that table's own.
            if planning:
                del self._moved[key]
            return moved[1]
        # The table the offsets came from: a re-created topic that has grown past the offset is
        # noticed too, not read on from that offset.
        recreated = (recorded if recorded is not None else self._tables.setdefault(key, table)) != table
        if offset <= end and not recreated:
            return offset
        if self.opts.fail_on_data_loss:
            where = (f"this query read the old topic up to offset {offset}" if offset <= end else
                     f"this query's checkpoint is at offset {offset}, past the partition's end {end}, so it belongs "
                     "to the old topic")
            raise InvalidConfiguration(
                f"topic partition {p} was deleted and re-created (or truncated): {where}; start from a new "
                "checkpointLocation, or set option failOnDataLoss=false to read the new topic from its start")
        start = plog.refresh().start_offset
        log.warning("%s was re-created: its offsets restarted (checkpoint at %d, end now %d); reading it from %d",
                    p, offset, end, start)
        self._tables[key] = table
        self._moved[key] = (offset, start)
        self._buffers.pop(key, None)  # the old table's transactions
        return start

    # ---- DataSourceStreamReader ---------------------------------------------------------------------
    def initialOffset(self) -> Offsets:
        partitions = self._partitions()
        self.opts.read.starting_offsets.check_against(partitions)
        out: Offsets = {}
        for p in partitions:
            _put(out, p, self._starting(p), self._log(p).table_id)
        return _sorted(out)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_entries_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def _available(self, start: Offsets, partitions: list[TopicName]) -> tuple[Offsets, dict[str, int]]:
        """(end offsets if everything available were read, backlog per partition).

        A topic ``topicsPattern`` no longer lists was deleted: it leaves the offsets. Kept, every
        later batch would plan it, which fails in any source process that did not load it before
        the delete (a restarted query, forever); and a topic re-created under the name is new,
        read from its start like any topic the pattern picks up
        (docs/design/stream-source-topic-lifecycle.md)."""
        assert self.opts.read.selection is not None
        listed = {p.base.short for p in partitions}
        gone = [] if self.opts.read.selection.pattern is None else [t for t in start if t not in listed and
                                                                     not self._exists(t)]
        if gone:
            log.warning("topics %s were deleted: no longer read", sorted(gone))
        end = _copy({t: ps for t, ps in start.items() if t not in gone})
        backlog: dict[str, int] = {}
        for p in partitions:
            s = _get(start, p)
            if s is None:  # a partition that appeared since the query started (topicsPattern, growth)
                s = self._log(p).refresh().start_offset if self.opts.subscription is None else self._starting(p)
            else:
                s = self._resume_from(p, s, _table(start, p))
            _put(end, p, s, self._log(p).table_id)  # the table s belongs to: _resume_from has just compared it
            limit = self._limit(p)
            if self._available_now is not None:
                cap = _get(self._available_now, p)
                limit = min(limit, cap if cap is not None else s)
            backlog[str(p)] = max(0, limit - s)
        return end, backlog

    def _exists(self, topic: str) -> bool:
        """Whether ``topic`` exists, asked again of its own metadata: a topic merely missing from one
        listing keeps its offsets (dropped, it would be read again from its start)."""
        try:
            TopicsAdmin(self.root).get_partitions(topic)
        except TopicNotFound:
            return False
        return True

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        partitions = self._partitions()  # listed once per batch: each listing reads the topics' metadata
        end, backlog = self._available(start, partitions)
        if isinstance(limit, ReadMaxRows):
            backlog = spread(limit.max_rows, backlog)
        for p in partitions:
            b = backlog.get(str(p), 0)
            if b:
                end[p.base.short][str(p.partition)] += b
        return _sorted(end)

    def reportLatestOffset(self) -> Offsets | None:
        out: Offsets = {}
        for p in self._partitions():
            _put(out, p, self._limit(p), self._log(p).table_id)
        return _sorted(out)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self.reportLatestOffset()
        log.info("Trigger.AvailableNow: reading up to %s", self._available_now)

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        planned: list[OffsetRangePartition] = []
        for topic, parts in end.items():
            for part, hi in positions(parts).items():
                p = TopicName.parse(topic).with_partition(int(part))
                lo = start.get(topic, {}).get(part)
                lo_table, hi_table = _table(start, p), _table(end, p)
                # The end on a table other than the start's: the batch reads the re-created topic
                # from its start, whatever the offsets' numbers.
                recreated = hi_table is not None and (lo_table != hi_table if lo_table is not None
                                                      else str(p) in self._moved)
                if lo == hi and not recreated:
                    continue  # nothing to read; the topic may even be gone since (a replayed batch)
                plog = self._log(p)
                index = plog.refresh()
                if hi_table is not None and hi_table != plog.table_id:
                    self._planned_table_gone(p, hi)
                    continue
                if lo is None:
                    lo = index.start_offset
                lo = self._resume_from(p, lo, lo_table, planning=True)
                lo = skip_deleted(p, lo, index.start_offset, self.opts.fail_on_data_loss,
                                  "this query read them")
                if hi <= lo:
                    continue
                if self.opts.read.isolation_level == "READ_COMMITTED":
                    visibility = Visibility("READ_COMMITTED", self._decided_up_to(p, hi, index.end_offset))
                else:
                    visibility = Visibility(self.opts.read.isolation_level)
                planned.extend(range_partitions(p, index, visibility, lo, hi, self.opts.read.max_entries_per_partition,
                                                plog.table_id))
        if self.opts.subscription is not None and planned:
            handoff.record(self.root, self.opts.subscription, start, end)
        return pack_ranges(planned, self.opts.min_entries_per_task, self.opts.read.max_entries_per_partition)

    def _planned_table_gone(self, p: TopicName, hi: int) -> None:
        """The batch ends on a table the partition no longer is (the topic was re-created after
        the batch was planned, or before a restarted query replays it): its offsets cannot be read
        on the new table, whose messages they would skip or take twice. With failOnDataLoss=false
        the partition reads nothing in this batch, and the next one reads the new table from its
        start."""
        if self.opts.fail_on_data_loss:
            raise InvalidConfiguration(
                f"topic partition {p} was deleted and re-created after this micro-batch was planned up to offset "
                f"{hi} of the old topic; start from a new checkpointLocation, or set option failOnDataLoss=false to "
                "read the new topic from its start")
        log.warning("%s was re-created after this micro-batch was planned: nothing read from it in this batch", p)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, PackedPartition):
            return (b for r in partition.ranges for b in read_partition(self.root, r, self.projection))
        if not isinstance(partition, OffsetRangePartition):
            return iter(())
        return read_partition(self.root, partition, self.projection)

    def commit(self, end: Offsets) -> None:
        """Spark processed everything up to ``end``: move the subscription there (a no-op when the
        pulsartx sink already acknowledged it inside its transaction). The input partitions are
        separate tables: their cursors are read with ``delta.read_each`` (side by side on an
        object store, where each read waits on the network; one after another on a local disk,
        where threads only add CPU), and the ones behind are moved side by side (``run_beside``,
        as the sink's commit acknowledges them). The hand-off record goes once every one ended."""
        if self.opts.subscription is None:
            return
        targets = [(TopicName.parse(topic).with_partition(int(part)), off)
                   for topic, parts in end.items() for part, off in positions(parts).items() if off > 0]
        behind = delta.read_each(self.root, partial(self._behind, end=end), targets, "pulsartx-source-commit")
        run_beside([partial(self._move, p, off) for (p, off), b in zip(targets, behind, strict=True) if b])
        handoff.forget(self.root, self.opts.subscription, end)

    def _same_table(self, p: TopicName, end: Offsets) -> bool:
        """Whether ``end``'s offset for ``p`` is on the partition's current table (or names none).
        A batch planned on a topic re-created since read nothing of the new one
        (:meth:`_planned_table_gone`): moving the new topic's cursor to the old topic's offset would
        acknowledge messages nobody read. The id is read from the table's first commit, not taken
        from the partition's log: that one is checked at most every INCARNATION_CHECK_S, and a topic
        re-created while the batch ran is committed within that. Asked only of a partition whose
        cursor is to move (one small read beside the cursor's, as the sink's acknowledgement does)."""
        recorded = _table(end, p)
        if recorded is None:
            return True
        current = delta.LogTail(self.root, partition_segments(p)).table_id()
        if current is None:  # no version 0: cleaned up after a checkpoint (the log knows the id), or deleted
            try:
                current = self._log(p).table_id
            except TopicNotFound:  # deleted since, in a process that never loaded it: no subscription to move
                return False
        if recorded == current:
            return True
        log.warning("%s was re-created after offset %s was planned: its subscription is not moved there", p,
                    _get(end, p))
        return False

    def _behind(self, target: tuple[TopicName, int], end: Offsets | None = None) -> bool:
        """Whether the partition's cursor exists and is not yet at ``off - 1`` (and, given the
        batch's ``end``, whether that offset is the partition's current table's: :meth:`_same_table`).

        The cursor is read fresh: the sink acknowledged the batch in another process, so this
        process's cached state is stale, and an update planned on it attempts a write (a data
        file and a commit, lost to the sink's) before finding nothing to do."""
        p, off = target
        store = self._store(p)
        if not store.exists():
            return False
        cursor = store.cursor()
        behind = cursor is None or cursor.deleted or cursor.mark_delete < off - 1
        return behind and (end is None or self._same_table(p, end))

    def _move(self, p: TopicName, off: int) -> None:
        self._store(p).update(lambda c: c.ack_cumulative(off - 1))

    def stop(self) -> None:
        """Never called by pyspark (docs/design/spark-job-state-in-storage.md); nothing depends on it."""


@spark_facing
class RefusedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stands in for a stream reader whose options were refused: every call raises the refusal.

    pyspark 4.3's stream runner builds the reader inside ``try: ... finally: reader.stop()``, so an
    error raised by ``streamReader()`` itself reaches Spark as ``UnboundLocalError: cannot access
    local variable 'reader'``, with our message only in its context (and hidden entirely once
    :mod:`pulsartx.datasource.errors` leads with the message). Raised from the reader's first call, it is
    the error Spark reports."""

    def __init__(self, error: Exception):
        self.error = error

    def initialOffset(self) -> Offsets:
        raise self.error

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        raise self.error

    def prepareForTriggerAvailableNow(self) -> None:
        raise self.error

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        raise self.error

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        raise self.error

    def commit(self, end: Offsets) -> None:
        raise self.error

