"""Batch reads: the driver plans offset ranges and their files, executors read only those files.

Planning opens each partition's Delta log once (``PartitionLog.refresh``) and puts the file list
into the input partition, so executors never open a Delta log, never import deltalake, and read
exactly the snapshot the driver saw even if producers keep appending. A partition with more than
``maxEntriesPerPartition`` offsets in range is split into several input partitions (balanced, cut
where files start: :func:`split_range`); a partition with none still gets one (empty) input
partition, so the task count is predictable.
"""
from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pulsartx.datasource.errors import spark_facing
from pulsartx.datasource.offsets import EARLIEST, LATEST, OffsetSpec
from pulsartx.datasource.options import PulsarTxOptions
from pulsartx.datasource.pushdown import Pushed, push
from pulsartx.datasource.schema import FULL, Projection, spark_batches, to_spark_table
from pulsartx.datasource.topics import load_listed, partitions_to_read
from pulsartx.datasource.visibility import READ_COMMITTED, Visibility, plan_visibility, visible_records
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pulsartx.admin.topics import TopicsAdmin
from pulsartx.exceptions import CorruptedLog, InvalidConfiguration, StorageError
from pulsartx.log.index import DataFile, FileIndex
from pulsartx.log.partition import PartitionLog, partition_segments, read_files
from pulsartx.naming import TopicName
from pulsartx.storage import delta
from pulsartx.storage.root import StorageRoot

# One executor read call covers at most this much of the range, so memory stays bounded by it
# rather than by maxEntriesPerPartition, while thousands of tiny files still cost few calls.
READ_GROUP_BYTES = 64 * 1024 * 1024
READ_GROUP_RECORDS = 100_000

log = logging.getLogger("pulsartx.datasource")


@dataclass
class OffsetRangePartition(InputPartition):
    """Offsets ``[start, end)`` of one topic partition, with the files holding them."""

    topic: str  # full topic name without the partition suffix, as __topic shows it
    partition: int
    segments: tuple[str, ...]
    start: int
    end: int
    files: tuple[DataFile, ...]
    visibility: Visibility
    # The partition table (its Delta id) the files were planned from; None: not known.
    table_id: str | None = None


@dataclass
class PackedPartition(InputPartition):
    """Several small offset ranges read by one task, one after the other (streaming; see
    :func:`pack_ranges`)."""

    ranges: tuple[OffsetRangePartition, ...]


def pack_ranges(ranges: Sequence[OffsetRangePartition], min_entries: int, max_entries: int | None = None
                ) -> list[InputPartition]:
    """Input partitions for ``ranges``: about one task per ``min_entries`` (at least one, at most
    one per range), ranges dealt largest first to the least loaded task. Ranges of at least
    ``min_entries`` each get a task of their own (smaller ones may join them); ``min_entries`` 0
    keeps every range in its own task. No task gets more than ``max_entries``
    (maxEntriesPerPartition, which bounds a task's work): if packing would, the ranges stay apart.

    The task count is rounded to the nearest, not up: ranges usually hold a few commit markers
    besides their rows, and rounding up turned 100,004 entries at 50,000 a task into three tasks,
    two of them half full, i.e. a second wave of tasks on two cores."""
    import heapq
    import math

    sizes = [r.end - r.start for r in ranges]
    if min_entries <= 0 or len(ranges) <= 1:
        return list(ranges)
    total = sum(sizes)
    tasks = max(1, int(total / min_entries + 0.5), sum(1 for n in sizes if n >= min_entries))
    if max_entries is not None:
        tasks = max(tasks, math.ceil(total / max_entries))
    tasks = min(len(ranges), tasks)
    if tasks == len(ranges):
        return list(ranges)
    heap = [(0, i) for i in range(tasks)]
    groups: list[list[OffsetRangePartition]] = [[] for _ in range(tasks)]
    for size, r in sorted(zip(sizes, ranges, strict=True), key=lambda x: -x[0]):
        load, i = heapq.heappop(heap)
        groups[i].append(r)
        heapq.heappush(heap, (load + size, i))
    if max_entries is not None and max(load for load, _ in heap) > max_entries:
        return list(ranges)
    return [g[0] if len(g) == 1 else PackedPartition(tuple(g)) for g in groups if g]


def skip_deleted(p: TopicName, lo: int, first: int, fail_on_data_loss: bool, asked: str) -> int:
    """Where a read of ``p`` asked to start at ``lo`` (``asked`` says who asked) starts, when
    retention has deleted the partition's offsets below ``first``: an error naming the partition,
    the lost offsets and failOnDataLoss, or with failOnDataLoss=false ``first``, with a warning.
    Batch reads and streams alike, as Spark's Kafka source: clamped in silence, a read returns
    fewer messages than asked for with nothing to say so."""
    if lo >= first:
        return lo
    if fail_on_data_loss:
        raise InvalidConfiguration(
            f"data loss on {p}: offsets {lo}..{first - 1} were deleted (retention) before {asked}; the partition "
            f"now starts at {first}: set option failOnDataLoss=false to skip them")
    log.warning("data loss on %s: skipping deleted offsets %d..%d", p, lo, first - 1)
    return first


def resolve_range(topic: TopicName, starting: OffsetSpec, ending: OffsetSpec, earliest: int,
                  latest: int, offset_at_time: Callable[[int], int], fail_on_data_loss: bool = True
                  ) -> tuple[int, int]:
    """The offsets to read on one partition, clamped to what exists now. Offsets past the end are
    clamped rather than waited for: a batch read is a snapshot. A start below ``earliest`` (deleted
    by retention) is data loss: :func:`skip_deleted`. ``offset_at_time`` resolves a publish time
    (``startingTimestamp`` and its kin) to an offset."""
    s, e = starting.position(topic, offset_at_time), ending.position(topic, offset_at_time)
    if s >= 0 and e >= 0 and s > e:
        raise InvalidConfiguration(
            f"options {starting.source(topic)}/{ending.source(topic)}: partition {topic} starts at {s}, after its "
            f"end {e}; the start must not be after the end")
    if s >= 0 and s != e:  # an empty range asks for nothing, deleted or not
        s = skip_deleted(topic, s, earliest, fail_on_data_loss, f"this read (option {starting.source(topic)} starts it at {s})")
    start = earliest if s == EARLIEST else latest if s == LATEST else s
    end = latest if e == LATEST else earliest if e == EARLIEST else e
    start = min(max(start, earliest), latest)
    return start, min(max(end, start), latest)


def split_range(start: int, end: int, max_entries: int, boundaries: Sequence[int] = ()) -> list[tuple[int, int]]:
    """``[start, end)`` in as few pieces of at most ``max_entries`` as it takes, of about equal size,
    each cut moved to the nearest of ``boundaries`` (the offsets where a data file starts) that
    keeps every piece within the bound.

    Cutting every ``max_entries`` left a tail: 505,002 entries at 500,000 (a job's rows plus its
    markers and an aborted attempt) made a task of 5,002, and a Python data-source task costs about
    0.1 s of CPU whatever it reads. A cut inside a file made both tasks decode that whole file and
    mask it; a cut where a file starts reads each file once (docs/design/balanced-range-splits.md)."""
    n = end - start
    if n <= 0:
        return [(start, start)]
    k = -(-n // max_entries)
    cuts = [start]
    inner = sorted(b for b in boundaries if start < b < end)
    for i in range(1, k):
        prev, left = cuts[-1], k - i  # pieces still to come after this cut
        lo, hi = max(prev + 1, end - left * max_entries), min(prev + max_entries, end - left)
        ideal = min(max(start + round(i * n / k), lo), hi)
        j = bisect.bisect_left(inner, ideal)
        near = [b for b in inner[max(0, j - 1):j + 1] if lo <= b <= hi]
        cuts.append(min(near, key=lambda b: abs(b - ideal)) if near else ideal)
    cuts.append(end)
    return list(itertools.pairwise(cuts))


def plan_partitions(root: StorageRoot, opts: PulsarTxOptions, pushed: Pushed | None = None
                    ) -> list[OffsetRangePartition]:
    """Driver side: one or more offset-range input partitions per topic partition."""
    assert opts.selection is not None
    partitions = partitions_to_read(root, opts.selection)
    # The offsets options are checked against what the options select, not against what a pushed
    # filter leaves: a JSON naming a partition that a WHERE clause then excludes is still valid.
    opts.starting_offsets.check_against(partitions)
    opts.ending_offsets.check_against(partitions)
    # A pushed filter on topic or partition narrows what is read, not the READ_COMMITTED cut: a
    # transaction hidden because of its data in a partition the filter leaves out stays hidden, or
    # the filtered read would return rows the same query without pushdown does not
    # (docs/design/pushed-filters-keep-the-cut.md).
    plogs = {str(p): PartitionLog(root, p) for p in partitions}
    listed = partitions
    if pushed is not None:
        partitions = [p for p in partitions if pushed.allows_partition(str(p.base), p.partition)]
    planned: list[OffsetRangePartition] = []
    # Every log the plan reads is loaded here, the cut's too: a topic a pattern matched that was
    # deleted since it was listed is left out whole, as partitions_to_read leaves it out a moment
    # earlier, instead of failing the read.
    admin, gone = TopicsAdmin(root), set()
    indexes: dict[str, FileIndex] = {}
    for p in listed if opts.isolation_level == READ_COMMITTED else partitions:
        if p.base not in gone:
            index = load_listed(admin, opts.selection, p, plogs[str(p)].refresh)
            if index is None:
                log.info("topic %s was deleted while this read was planned: it is left out", p.base)
                gone.add(p.base)
            else:
                indexes[str(p)] = index
    partitions = [p for p in partitions if p.base not in gone]
    plogs = {k: v for k, v in plogs.items() if v.topic.base not in gone}
    cut = plogs if opts.isolation_level == READ_COMMITTED else {str(p): plogs[str(p)] for p in partitions}
    visibilities = plan_visibility(root, cut, opts.isolation_level)
    for p in partitions:
        assert p.partition is not None
        index, visibility = indexes[str(p)], visibilities[str(p)]
        for spec in (opts.starting_offsets, opts.ending_offsets):
            spec.check_table(p, plogs[str(p)].table_id)
        limit = index.end_offset if visibility.read_limit is None else min(index.end_offset, visibility.read_limit)
        start, end = resolve_range(p, opts.starting_offsets, opts.ending_offsets, index.start_offset, limit,
                                   plogs[str(p)].offset_at_time, opts.fail_on_data_loss)
        if pushed is not None:
            start, end = pushed.clamp(start, end)
        ranges = range_partitions(p, index, visibility, start, end, opts.max_entries_per_partition,
                                  plogs[str(p)].table_id)
        if pushed is not None and (pushed.publish_lo_us is not None or pushed.publish_hi_us is not None):
            ranges = [dataclasses.replace(r, files=tuple(f for f in r.files if pushed.keeps_file(f))) for r in ranges]
        planned.extend(ranges)
    return planned


def range_partitions(p: TopicName, index: FileIndex, visibility: Visibility, start: int, end: int,
                     max_entries: int, table_id: str | None = None) -> list[OffsetRangePartition]:
    """Input partitions covering ``[start, end)`` of one topic partition (batch and streaming);
    ``table_id``: the partition table ``index`` lists, for :func:`read_partition`'s errors."""
    assert p.partition is not None
    files = index.files_for(start, end)
    return [OffsetRangePartition(str(p.base), p.partition, partition_segments(p), lo, hi,
                                 tuple(f for f in files if f.min_offset < hi and f.max_offset >= lo), visibility,
                                 table_id)
            for lo, hi in split_range(start, end, max_entries, [f.min_offset for f in files])]


def file_groups(files: Sequence[DataFile]) -> Iterator[list[DataFile]]:
    group: list[DataFile] = []
    size = records = 0
    for f in files:
        if group and (size + f.size > READ_GROUP_BYTES or records + f.num_records > READ_GROUP_RECORDS):
            yield group
            group, size, records = [], 0, 0
        group.append(f)
        size += f.size
        records += f.num_records
    if group:
        yield group


def read_steps(part: OffsetRangePartition, projection: Projection = FULL
               ) -> Iterator[tuple[list[DataFile], tuple[str, ...], bool]]:
    """The executor's reads: (files, stored columns, whether to filter). Runs of files the plan
    shows whole (:meth:`Visibility.shows_file`: inside one committed append)
    are read with the output's columns only and no filter; the others with the filter's columns
    too, then filtered."""
    vis = part.visibility
    filtered = tuple(dict.fromkeys((*projection.stored, *vis.columns)))
    whole = tuple(c for c in projection.stored if c not in vis.columns)
    for group in file_groups(part.files):
        for shown, files in itertools.groupby(group, key=lambda f: vis.shows_file(f, part.start, part.end)):
            yield list(files), whole if shown else filtered, not shown


def gone_since_planning(root: StorageRoot, part: OffsetRangePartition) -> StorageError | None:
    """The error for a task whose planned files are missing because their topic was deleted (and
    maybe re-created) after the read was planned, or None when it was not: then the table has lost
    a file its log lists, which is corruption. Asked only once a file is missing, so a task costs
    nothing more; version 0 holds the table's id (a re-created topic is a new table)."""
    if part.table_id is None:
        return None
    try:
        current = delta.LogTail(root, part.segments).table_id()
        if current == part.table_id or (current is None and root.has_file(*part.segments, "_delta_log",
                                                                           "_last_checkpoint")):
            return None  # the planned table, or one whose version 0 was cleaned up: cannot tell
    except StorageError:
        return None
    what = "deleted" if current is None else "deleted and re-created"
    name = TopicName.parse(part.topic).with_partition(part.partition)
    return StorageError(f"topic partition {name} was {what} after this read was planned, and the files the plan "
                        "read went with it: retry the read, which reads the topic as it is then")


def read_partition(root: StorageRoot, part: OffsetRangePartition, projection: Projection = FULL
                   ) -> Iterator[pa.RecordBatch]:
    """Executor side: raw records of the planned files → visible records → Spark rows (only the
    stored columns ``projection`` needs are read)."""
    for files, columns, filtering in read_steps(part, projection):
        try:
            rows = read_files(root, part.segments, files, part.start, part.end, columns)
        except CorruptedLog as e:
            if isinstance(e.__cause__, FileNotFoundError):
                gone = gone_since_planning(root, part)
                if gone is not None:
                    raise gone from e
            raise
        if filtering:
            rows = visible_records(rows, part.visibility)
        yield from spark_batches(to_spark_table(rows, part.topic, part.partition, projection))


@spark_facing
class PulsarTxBatchReader(DataSourceReader):
    # No pushFilters here: while spark.sql.python.filterPushdown.enabled is false (the default),
    # merely defining it makes every read fail with DATA_SOURCE_PUSHDOWN_DISABLED. The subclass
    # below is used only where pyspark pushes filters (datasource/pushdown.py).

    def __init__(self, opts: PulsarTxOptions, projection: Projection = FULL):
        self.opts = opts
        self.projection = projection
        # A clean copy of the root travels to executors: no filesystem objects cached by planning.
        self.root = dataclasses.replace(opts.root)
        self.pushed: Pushed | None = None

    def partitions(self) -> list[InputPartition]:
        return list(plan_partitions(dataclasses.replace(self.root), self.opts, self.pushed))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRangePartition):
            return iter(())  # pyspark substitutes InputPartition(None) for an empty plan
        return read_partition(self.root, partition, self.projection)


@spark_facing
class PulsarTxPushdownReader(PulsarTxBatchReader):
    def pushFilters(self, filters: list[Any]) -> Iterable[Any]:  # noqa: N802 (pyspark's name)
        self.pushed, rejected = push(list(filters))
        return rejected
