"""Compaction: rewrite a partition's old files without what no reader may ever see.

Only files entirely below maxReadPosition are touched, so open transactions' data and anything
still undecided are never rewritten. The transaction buffer is settled through the TCs first
(``reads.settle``): data a zombie wrote after a forgotten marker would otherwise hold
maxReadPosition, and so compaction, where it stands for good. The rewrite drops DATA rows of
aborted transactions, rows a commit marker left out, and stragglers after their own transaction's
marker; it keeps plain messages, committed messages and markers with their offsets, in order, and
the log's last record whatever it is (where the log's end is read). Offsets never change, so
cursors, MessageIds and transaction-buffer snapshots stay valid.

The commit is recorded as Delta records an OPTIMIZE (docs/design/compaction-commits.md): runs of
files that lose no row become one file each, at ``dataChange=false`` (the same rows, rearranged:
a Delta streaming reader skips them); runs of files that lose rows become one file each at
``dataChange=true``, as a Delta DELETE rewrites the files it touches. Runs keep the files' offset
ranges disjoint, as the file index needs.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.reads import settle
from pulsartx.coordinator.registry import Coordinators
from pulsartx.log.index import DataFile
from pulsartx.log.partition import PartitionLog, read_files
from pulsartx.log.schema import RECORD_SCHEMA, STATS_COLUMNS, MessageType
from pulsartx.naming import TopicName
from pulsartx.storage import delta
from pulsartx.storage.appender import DeltaAppender
from pulsartx.storage.keyed_log import missing_retention, upgrade_with_deltalake
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)


@dataclass
class CompactionResult:
    partition: str
    files_before: int = 0
    files_after: int = 0
    rows_before: int = 0
    rows_dropped: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    skipped: str | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def rewrite_plan(files: list[DataFile], kept: pa.Table) -> tuple[list[tuple[pa.Table, bool]],
                                                                    list[tuple[str, int, bool]]]:
    """The OPTIMIZE commit of ``files`` (in offset order) whose surviving rows are ``kept`` (sorted
    by offset): one new file per run of consecutive files that all lose rows or all lose none,
    flagged ``dataChange`` accordingly, and a remove of every file with its own file's flag."""
    offsets = kept.column("offset").to_numpy()
    lo = np.searchsorted(offsets, [f.min_offset for f in files], side="left")
    hi = np.searchsorted(offsets, [f.max_offset for f in files], side="right")
    changed = [int(b - a) != f.num_records for f, a, b in zip(files, lo.tolist(), hi.tolist(), strict=True)]
    parts: list[tuple[pa.Table, bool]] = []
    start = 0
    for i in range(1, len(files) + 1):
        if i == len(files) or changed[i] != changed[start]:
            parts.append((kept.slice(int(lo[start]), int(hi[i - 1] - lo[start])), changed[start]))
            start = i
    return parts, [(f.path, f.size, c) for f, c in zip(files, changed, strict=True)]


def _with_the_last_record(kept: pa.Table, raw: pa.Table, last: int) -> pa.Table:
    """``kept`` (sorted by offset) with the log's last record at offset ``last`` when ``raw`` holds
    it, even one no reader may see (a straggler, the data of a transaction its TC finished without
    a marker here): the newest file's statistics are where the log's end is read. Dropped, the end
    went back, and once the offset app id expired (an idle week) the next append reused an offset
    that readers, cursors and transaction-buffer snapshots had already passed. Readers hide the
    record as before: the state that hid it keeps it, and a fold of the log finds it again."""
    if kept.num_rows and kept.column("offset")[-1].as_py() == last:
        return kept
    tail = raw.filter(pc.equal(raw.column("offset"), last))
    return pa.concat_tables([kept, tail]) if tail.num_rows else kept


def compact_partition(root: StorageRoot, partition: TopicName, min_files: int = 2,
                      attempts: int = 5) -> CompactionResult:
    """Compact, planning again when a concurrent change removed some of the same files first (a
    writer's background merge of small files, another compaction, retention)."""
    for attempt in range(attempts):
        res = _compact_once(root, partition, min_files)
        if res.skipped is None or not res.skipped.startswith("concurrent change") or attempt == attempts - 1:
            return res
        delta.backoff(attempt)
    return res


def _compact_once(root: StorageRoot, partition: TopicName, min_files: int) -> CompactionResult:
    plog = PartitionLog(root, partition)
    index = plog.refresh()
    state, _ = settle(Coordinators.shared(root), TransactionBuffer(plog), eager=True)
    horizon = state.read_limit
    files = [f for f in index.files if f.max_offset < horizon]
    res = CompactionResult(str(partition), files_before=len(index.files), files_after=len(index.files))
    if len(files) < min_files and not (files and state.aborted):
        res.skipped = f"only {len(files)} file(s) below maxReadPosition {state.max_read_position}"
        return res
    raw = read_files(root, plog.segments, files, files[0].min_offset, files[-1].max_offset + 1)
    kept = pa.concat_tables([
        state.filter().apply(raw),  # visible DATA rows (plain and committed)
        raw.filter(pc.not_equal(raw.column("type"), MessageType.DATA.value)),  # markers keep their offsets
    ]).sort_by("offset")
    kept = _with_the_last_record(kept, raw, index.end_offset - 1)
    res.rows_before = raw.num_rows
    res.rows_dropped = raw.num_rows - kept.num_rows
    res.bytes_before = sum(f.size for f in files)
    table = delta.open_table(root, *plog.segments, version=index.version)
    writer = DeltaAppender(root, plog.segments, table, RECORD_SCHEMA)
    # A partition created before the short tombstone retention gets it with its first compaction
    # or merge by this version (docs/design/short-tombstone-retention-for-partitions.md).
    upgrade = missing_retention(writer.configuration())
    try:
        if writer.fast:
            parts, removes = rewrite_plan(files, kept)
            writer.rewrite(parts, removes, properties=upgrade)
        else:  # a store without put-if-absent: delta-rs's commit, recorded as a WRITE
            delta.replace_files(root, table, plog.segments, [(f.path, f.size) for f in files], kept, STATS_COLUMNS,
                                data_change=True)
    except delta.ConcurrentCommit as e:
        res.skipped = f"concurrent change, try again: {e}"
        return res
    if upgrade and not writer.fast:
        # No merges run on such a store, so compactions make its tombstones. The upgrade is a
        # delta-rs commit of its own after the swap: before it, it would move the handle the swap
        # was planned on. A failure is a warning, and the next compaction tries again.
        upgrade_with_deltalake(writer, upgrade, "partition")
    after = plog.refresh()
    res.files_after = len(after.files)
    res.bytes_after = sum(f.size for f in after.files if f.max_offset < horizon)
    log.info("compacted %s: %d files -> %d, dropped %d of %d rows", partition, len(files),
             res.files_after - (res.files_before - len(files)), res.rows_dropped, res.rows_before)
    return res
