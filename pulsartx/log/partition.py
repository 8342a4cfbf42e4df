"""PartitionLog: one topic partition as an append-only Delta table with dense offsets.

Append protocol (one Delta commit per batch):
  1. from the writer handle's snapshot, read the next offset (app-transaction ``pulsartx.offset``)
     and the producer's last sequence id (app-transaction ``pulsartx.producer.<name>``);
  2. drop already-persisted sequence ids and number the rest from the next offset;
  3. write them as one commit that sets both app-transaction versions.
Every append sets ``pulsartx.offset``, so two appenders from the same snapshot conflict and exactly
one wins: offsets are never given twice, and the loser retries from the new snapshot (re-running
the dedup check, which makes dedup race-free too).
"""
from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from pulsartx import forks
from pulsartx.exceptions import CorruptedLog, ProducerBusy, StorageError, TopicNotFound
from pulsartx.log.compression import CompressionType
from pulsartx.log.constant import constant
from pulsartx.log.dedup import OFFSET_APP_ID, new_message_keep, producer_app_id
from pulsartx.log.index import DataFile, FileIndex
from pulsartx.log.remembered import REMEMBERED
from pulsartx.log.schema import (
    MARKER_ENTRIES,
    PARTITION_TABLE_CONFIG,
    PROPERTIES,
    RECORD_SCHEMA,
    TIMESTAMP,
    MessageType,
)
from pulsartx.naming import TopicName
from pulsartx.storage import delta
from pulsartx.storage.appender import DeltaAppender
from pulsartx.storage.cli_command import cli_command
from pulsartx.storage.diagnose import naming_partition
from pulsartx.storage.group_commit import Done, GroupCommit, Write
from pulsartx.storage.keyed_log import missing_retention, short_tombstone_retention
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)
MAX_APPEND_ATTEMPTS = 200
# An append after this long without a commit through its writer first checks that the table is
# still the one the writer loaded, and catches up (PartitionLog._writer_idle).
IDENTITY_CHECK_IDLE_S = 1.0
# How long a marker's guard app id stays in the table: the marker is written at most once in that
# time. Later only a recovery of a transaction still unfinished an hour after its decision could
# write it again, and a repeated marker is ignored by every reader (the fold, the interop query).
# Kept for the table's retention (7 days) instead, the guards were most of a busy partition's
# checkpoints and app-id lookups (docs/design/short-lived-marker-guards.md).
GUARD_LIFETIME_MS = 3_600_000
# Every MERGE_EVERY-th version a writing process merges the partition's small files in the
# background (pulsartx/maintenance/merging.py), through its own writer and, for the files it wrote
# itself, from the rows it still holds (below), so merging costs it little; ``PULSARTX_MERGE_EVERY``
# sets the interval, 0 turns it off (then `pulsartx coordinator run` merges them on each pass
# alone; docs/design/small-file-merging.md).
MERGE_EVERY = int(os.environ.get("PULSARTX_MERGE_EVERY", "64"))
# What runs then, given the PartitionLog that wrote the version: the merge scheduler registers
# itself here, as maintenance sits above the log.
EVERY_MERGE_INTERVAL: list[Callable[[PartitionLog], None]] = []
# The rows of the small files a writer made, kept so that merging them needs no read back: files
# of fewer records than this (a merge's inputs: FANOUT**2 of merging.py) ...
REMEMBER_MAX_RECORDS = 1024
# ... and at most this many bytes of them in a process, whatever number of partitions it writes to:
# the least recently written partition's oldest rows forgotten first (pulsartx/log/remembered.py).
REMEMBER_MAX_BYTES = 4 << 20
_ROWS_KEYS = itertools.count()
INCARNATION_CHECK_S = 5.0  # how often a long-lived reader checks that its partition was not re-created


def partition_table_properties() -> dict[str, str]:
    """The properties a new partition table is created with: PARTITION_TABLE_CONFIG and the keyed
    logs' short tombstone retention. Every merge removes the files it rewrote, and with Delta's
    default 7 days every checkpoint of a busy partition carried a week of those removes
    (docs/design/short-tombstone-retention-for-partitions.md)."""
    return {**PARTITION_TABLE_CONFIG, **short_tombstone_retention()}


def partition_segments(topic: TopicName) -> tuple[str, ...]:
    assert topic.partition is not None, "a partition log needs a partition index"
    return ("topics", *topic.path_segments(), f"partition-{topic.partition}")


@dataclass
class AppendResult:
    """What one append made durable. ``offsets[i]`` is the offset of input row ``i``, or None when
    dedup dropped it as already persisted.

    ``offsets`` is built when first read: a Python list of every row's offset cost a Spark write
    task 3.3 ms of CPU per 125,000-row append, and the task reads only ``entries`` and
    ``duplicates`` (docs/design/big-local-files-streamed.md)."""

    version: int | None
    first_offset: int | None = None
    last_offset: int | None = None
    attempts: int = 1
    duplicates: int = 0
    entries: list[tuple[int, int]] = field(default_factory=list)
    kept: Any = field(default=None, repr=False, compare=False)  # the input rows dedup kept (NumPy bools; None: all)

    @functools.cached_property
    def offsets(self) -> list[int | None]:
        if self.first_offset is None:  # nothing written: every input row was a duplicate
            return [None] * self.duplicates
        assert self.last_offset is not None
        written = range(self.first_offset, self.last_offset + 1)
        if self.kept is None:
            return list(written)
        given = iter(written)
        return [next(given) if x else None for x in self.kept.tolist()]


@dataclass
class _AppendItem:
    records: pa.Table
    app_id: str | None  # the producer's dedup app id
    seqs: Any  # its sequence ids (numpy), with app_id
    guard_app_id: str | None  # at most once ever (markers)
    codecs: dict[str, str] | None  # None: any (a marker's empty payload)
    producer_name: str | None = None
    floor: int | None = None  # the producer's: a persisted id above it is another writer's (ProducerBusy)
    keep: Any = None  # planned: the rows dedup keeps (None: all)
    rows: pa.Table | None = None  # planned: the rows written
    attempts: int = 0
    result: AppendResult | None = None


def records_from_arrow(values: pa.Array, *, keys: pa.Array | None = None, properties: pa.Array | None = None,
                       event_times: pa.Array | None = None, producer_name: str | None = None,
                       first_sequence_id: int | None = None, sequence_ids: pa.Array | None = None,
                       txn: tuple[int, int] | None = None, msg_type: MessageType = MessageType.DATA,
                       marker_entries: pa.Array | None = None) -> pa.Table:
    """Rows without ``offset``/``publish_time`` (assigned by :meth:`PartitionLog.append`), built from
    Arrow columns without touching Python objects per row: the Spark write path's builder, which the
    client's :func:`build_records` feeds too. ``first_sequence_id`` numbers the rows consecutively."""
    n = len(values)

    def const(v: Any, t: pa.DataType) -> pa.Array:
        return constant(v, n, t)

    if sequence_ids is None and first_sequence_id is not None:
        sequence_ids = pa.array(np.arange(first_sequence_id, first_sequence_id + n, dtype=np.int64))

    def as_type(col: pa.Array, t: pa.DataType) -> pa.Array:
        return col if col.type == t else col.cast(t)  # a cast is a kernel call, even to the same type

    cols = {
        "type": const(msg_type.value, pa.string()),
        "value": as_type(values, pa.binary()),
        "key": as_type(keys, pa.string()) if keys is not None else pa.nulls(n, pa.string()),
        "properties": as_type(properties, PROPERTIES) if properties is not None else pa.nulls(n, PROPERTIES),
        "event_time": as_type(event_times, TIMESTAMP) if event_times is not None else pa.nulls(n, TIMESTAMP),
        "producer_name": const(producer_name, pa.string()),
        "sequence_id": sequence_ids if sequence_ids is not None else pa.nulls(n, pa.int64()),
        "txn_most_bits": const(None if txn is None else txn[0], pa.int64()),
        "txn_least_bits": const(None if txn is None else txn[1], pa.int64()),
        "marker_entries": marker_entries if marker_entries is not None else pa.nulls(n, MARKER_ENTRIES),
    }
    return pa.table(cols)


def build_records(values: Sequence[bytes], *, keys: Sequence[str | None] | None = None,
                  properties: Sequence[dict[str, str] | None] | None = None,
                  event_times_ms: Sequence[int | None] | None = None, producer_name: str | None = None,
                  sequence_ids: Sequence[int] | None = None, txn: tuple[int, int] | None = None,
                  msg_type: MessageType = MessageType.DATA, marker_entries: Any = None) -> pa.Table:
    """The same rows from Python values (the client producer's path)."""
    def given(col: Sequence | None) -> bool:
        if col is None:
            return False
        if isinstance(col, list):
            return col.count(None) != len(col)  # C speed: most batches carry no keys or event times
        return any(v is not None for v in col)

    return records_from_arrow(
        pa.array(values, pa.binary()),
        keys=pa.array(keys, pa.string()) if given(keys) else None,
        properties=_properties(properties) if properties is not None else None,
        event_times=pa.array([None if t is None else t * 1000 for t in event_times_ms], pa.int64()).cast(TIMESTAMP)
        if given(event_times_ms) else None,
        producer_name=producer_name,
        sequence_ids=pa.array(sequence_ids, pa.int64()) if sequence_ids is not None else None,
        txn=txn, msg_type=msg_type, marker_entries=marker_entries)


def _properties(properties: Sequence[dict[str, str] | None]) -> pa.Array:
    """A message sent without properties has an empty map, as in Pulsar. A batch without any
    (the common case) is built from offsets alone rather than from a list per message."""
    if not any(properties):
        offsets = pa.array(np.zeros(len(properties) + 1, dtype=np.int32))
        empty = pa.array([], pa.string())
        return pa.MapArray.from_arrays(offsets, empty, empty, type=PROPERTIES)
    return pa.array([list((p or {}).items()) for p in properties], PROPERTIES)


def _finish(records: pa.Table, first_offset: int, publish_us: int) -> pa.Table:
    n = records.num_rows
    offsets = pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64))
    publish = pa.array(np.full(n, publish_us, dtype=np.int64)).cast(_PUBLISH_TIME)
    names = set(records.column_names)
    cols = []
    for f in RECORD_SCHEMA:
        if f.name == "offset":
            cols.append(offsets)
        elif f.name == "publish_time":
            cols.append(publish)
        elif f.name in names:
            col = records.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))  # a cast is a kernel call: most are no-ops
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(cols, schema=RECORD_SCHEMA)


_PUBLISH_TIME = RECORD_SCHEMA.field("publish_time").type


class PartitionLog:
    """Appends to and reads one partition. Holds a reusable DeltaTable for writing (re-reading the
    log on each append would make latency grow with history) and a :class:`FileIndex` for reads."""

    def __init__(self, root: StorageRoot, topic: TopicName, remember_rows: bool = True):
        """``remember_rows`` False: a log made for one pass and dropped (`pulsartx coordinator run`'s
        merges) keeps no rows of the files it commits, which nothing would merge from."""
        self.root = root
        self.topic = topic
        self.segments = partition_segments(topic)
        self._writer: DeltaAppender | None = None
        self._index: FileIndex | None = None
        self._table_id: str | None = None
        self._identity_checked = 0.0
        self._tail = delta.LogTail(root, self.segments)
        self._append_lock = threading.RLock()
        # The rows of small files this log's writer committed are kept in the process's REMEMBERED
        # under this key (see REMEMBER_MAX_*), and forgotten with the log (once it kept any).
        self._rows_key = next(_ROWS_KEYS)
        self._remembers = remember_rows
        self._rows_finalizer: weakref.finalize | None = None
        self._committing: pa.Table | None = None  # the rows of the commit in flight (_write_group, merge)
        self._writer_table_id: str | None = None
        # A producer's last sequence id as planned so far in the group being planned: its appends
        # queued one after the other share a commit, each deduplicated behind the ones before it.
        self._planned: dict[str, int] = {}
        # Markers' shared catch-up probe (_behind): the last one's (start, answer), the one running.
        self._probe_lock = threading.Lock()
        self._probed: tuple[float, bool] = (float("-inf"), True)
        self._probing: threading.Event | None = None
        # Appends and markers of this process's threads share commits (group commit).
        self._group = GroupCommit(
            f"{topic} appends", self._append_lock, self._write_group, lambda: self._catch_up(self._appender()),
            max_attempts=MAX_APPEND_ATTEMPTS, before_group=self.sync_writer,
            exhausted=f"append to {topic} lost the commit race {MAX_APPEND_ATTEMPTS} times in a row; too many "
                      "concurrent writers on one partition: add partitions or retry later",
            start_plan=self._planned.clear)

    def __repr__(self) -> str:
        return f"PartitionLog({self.topic})"

    # ---- table handles -------------------------------------------------------------------------
    def _appender(self) -> DeltaAppender:
        if self._writer is None:
            with naming_partition(self.root, self.segments, self.topic):
                t = delta.open_table(self.root, *self.segments)
            if t is None:
                raise TopicNotFound(f"topic partition {self.topic} does not exist under {self.root.url}: create it "
                                    "with client.admin.create_topic() or "
                                    f"`{cli_command(self.root, 'topics', 'create', self.topic.base.short)}`")
            writer = DeltaAppender(self.root, self.segments, t, RECORD_SCHEMA, track_max="offset",
                                   on_commit=self._on_commit)
            writer.on_reload = lambda: self._on_writer_reload(writer)
            self._writer = writer
            self._writer_table_id = t.metadata().id
            self._forget_rows()
        return self._writer

    def _on_writer_reload(self, writer: DeltaAppender) -> None:
        """The writer started over from the latest snapshot (its own was too old, or a commit changed
        the table's metadata), which may be a table deleted and re-created since: the remembered
        rows go, the writer's table id follows its new snapshot (a stale one would refuse every
        merge, or pass an old index's runs as the new table's), and an index of another table goes.
        A superseded writer's reload touches nothing: the rows held and the index are the current
        writer's."""
        if writer is not self._writer:
            return
        self._forget_rows()
        table_id = writer.table.metadata().id
        if table_id != self._writer_table_id:
            log.info("%s: its writer reloaded onto a new table (re-created): starting over", self.topic)
            self._writer_table_id = table_id
            self._index = None

    def _on_commit(self, version: int, actions: list[dict[str, Any]], ours: bool) -> None:
        """Every commit the writer applies, its own and others': the file index, once loaded, takes
        it too (so a merge planned from the index needs no reads of the log), and the remembered
        rows follow the files: a removed file's are forgotten, our own new file's kept.

        The commit has landed when this runs: a failure here must neither fail it nor have it made
        again (an append's caller would send it twice), so it is logged, and what it may have left
        half-done starts over: the rows held are dropped (runs are then read back) and the index is
        loaded afresh when next read."""
        try:
            self._apply_to_derived(version, actions, ours)
        except Exception as e:
            self._committing = None
            self._forget_rows()
            self._index = None
            log.warning("%s: version %d is committed, but updating this process's file index and held rows "
                        "after it failed (both start over): %s", self.topic, version, e, exc_info=True)

    def _apply_to_derived(self, version: int, actions: list[dict[str, Any]], ours: bool) -> None:
        idx = self._index
        if idx is not None and self._table_id == self._writer_table_id:
            idx.apply_commit(version, actions, next_only=True)
        for a in actions:
            if "remove" in a:
                self._forget_row(a["remove"]["path"])
        if not ours or self._committing is None:
            return
        rows, self._committing = self._committing, None
        if MERGE_EVERY > 0:
            adds = [a["add"]["path"] for a in actions if "add" in a]
            if len(adds) == 1:  # the file written from exactly these rows
                self._remember_rows(adds[0], rows)

    def _remember_rows(self, path: str, rows: pa.Table) -> None:
        if not self._remembers or rows.num_rows >= REMEMBER_MAX_RECORDS:
            return
        # The whole buffers the rows keep alive, slices of larger ones included: an upper bound,
        # and a sum of sizes (Table.nbytes walks the buffers: 30 µs an append against 1).
        size = rows.get_total_buffer_size()
        if size > REMEMBER_MAX_BYTES:
            return
        if self._rows_finalizer is None:
            # release(), not forget_all(): a finalizer must take no lock (RememberedRows says why)
            self._rows_finalizer = weakref.finalize(self, REMEMBERED.release, self._rows_key)
        REMEMBERED.remember(self._rows_key, path, rows, size, REMEMBER_MAX_BYTES)

    def _forget_row(self, path: str) -> None:
        REMEMBERED.forget(self._rows_key, path)

    def _forget_rows(self) -> None:
        """On a reload the commits in between reach no on_commit: start afresh."""
        REMEMBERED.forget_all(self._rows_key)

    @property
    def remembered_bytes(self) -> int:
        return REMEMBERED.bytes_of(self._rows_key)

    def remembered_paths(self) -> list[str]:
        return REMEMBERED.paths(self._rows_key)

    def remembered_rows(self, files: Sequence[DataFile]) -> pa.Table | None:
        """The rows of ``files`` (consecutive, in offset order) exactly as this process's writer
        committed them, or None unless it still holds every one of them."""
        held = REMEMBERED.rows(self._rows_key, [f.path for f in files])
        return None if held is None else pa.concat_tables(held)

    def merge_files(self, files: Sequence[DataFile], rows: pa.Table) -> int | None:
        """Replace ``files`` by one file of ``rows`` (the same rows: a merge, dataChange=false),
        through this log's writer, so that it stays the only one this process commits through.
        The merged file is written first, outside the append lock (appends of other threads go on
        meanwhile); under the lock only the checks and the commit itself: the writer caught up and
        still on the table the files were planned from, the files still live. Returns the version,
        or None when the files changed meanwhile (another merge, a compaction, retention: nothing
        committed, the file deleted), or the store or table is not one
        :meth:`DeltaAppender.rewrite` commits to (no put-if-absent: `pulsartx compact` merges those)."""
        with self._append_lock:  # the writer as appends use it (one is made under the lock only)
            writer = self._appender()
        if not writer.fast:
            return None
        # Under the lock every append waits: two reads (the table's identity, the commits after the
        # writer's), not a third for the file index, which the writer's commits keep up to date.
        written = writer.write_rewrite_files([(rows, False)])
        committed = False
        try:
            with self._append_lock:
                self.sync_writer()  # caught up, and still on the table the files were planned from
                if self._writer is not writer:  # started over on a re-created table: another table's file
                    return None
                idx = self._index
                if idx is None or idx.version != writer.version or self._table_id != self._writer_table_id:
                    idx = self.refresh()  # not loaded, or not following this writer's commits: read
                if idx.version < writer.version:
                    # The index could not follow the log up to the writer (commits cleaned up past
                    # its version): files it lists may have been removed since, so nothing is merged.
                    log.info("merging small files of %s skipped: its file index (version %d) is behind "
                             "the writer (version %d)", self.topic, idx.version, writer.version)
                    return None
                live = {f.path for f in idx.files}
                if self._table_id != self._writer_table_id or any(f.path not in live for f in files):
                    return None
                # A partition created before the short tombstone retention gets it with its first
                # merge by this version, in the same commit (merges are what make its tombstones).
                upgrade = missing_retention(writer.configuration())
                self._committing = rows
                committed = True  # from here on the commit deletes its file itself when it gives up
                try:
                    return writer.commit_rewrite(written, [(f.path, f.size, False) for f in files],
                                                 properties=upgrade)
                except delta.ConcurrentCommit as e:
                    log.info("merging small files of %s stopped (a concurrent change): %s", self.topic, e)
                    return None
                finally:
                    self._committing = None
        finally:
            if not committed:
                writer.discard_rewrite(written)

    def can_merge_files(self) -> bool:
        """Whether :meth:`merge_files` can commit here at all (a store with put-if-absent, a table
        this process commits to itself): asked before a merge is planned and its files read back."""
        with self._append_lock:
            return self._appender().fast

    def _catch_up(self, writer: DeltaAppender) -> None:
        if not writer.catch_up():
            writer.reload()

    def exists(self) -> bool:
        return self.root.exists(*self.segments, "_delta_log", delta.commit_file(0))

    # ---- append --------------------------------------------------------------------------------
    def append(self, records: pa.Table, producer_name: str | None = None, guard_app_id: str | None = None,
               compression: CompressionType | str | None = None) -> AppendResult:
        """Append ``records`` (from :func:`build_records`) as one Delta commit.

        With ``producer_name``, rows whose ``sequence_id`` is not above the producer's last
        persisted one are dropped, atomically with the offset assignment. With ``guard_app_id``, the
        append happens at most once ever: if a commit already set that app id, nothing is written
        and ``AppendResult.version`` is None (markers use this to be idempotent). ``compression``:
        the producer's CompressionType, the codec of the payload column (default NONE, as Pulsar).

        Appends and markers that threads of this process make concurrently share one commit (group
        commit): each keeps its own dedup or guard check, planned against the state the commit is
        based on, and a lost race re-plans each alone. A producer's appends queued one after the
        other (:meth:`submit_append`) may share a commit: each is deduplicated behind the ones
        before it, as if they had been committed one by one.
        """
        return self.wait_append(self.submit_append(records, producer_name, guard_app_id, compression))

    def submit_append(self, records: pa.Table, producer_name: str | None = None, guard_app_id: str | None = None,
                      compression: CompressionType | str | None = None, floor: int | None = None) -> Any:
        """Queue :meth:`append` without waiting; :meth:`wait_append` answers it. A producer submits
        its batches in sequence-id order under its own lock and waits outside it, so its next batch
        joins the commit under way's successor instead of waiting for that commit to finish.

        ``floor`` (with ``producer_name``): the highest id of the name that the producer may have
        persisted itself or found persisted when it was made. A higher one persisted was appended
        by another live producer of the name, and the append fails with ProducerBusy instead of
        having its rows dropped as that writer's duplicates. None: no such check (Spark's task
        appends, a producer given ``initial_sequence_id``)."""
        codecs = {"value": CompressionType.parse(compression).parquet_codec}
        item = _AppendItem(records, producer_app_id(producer_name) if producer_name else None,
                           records.column("sequence_id").to_numpy() if producer_name else None, guard_app_id, codecs,
                           producer_name, floor if producer_name else None)
        # One producer's appends have distinct keys: planned in queue order (see _plan), they may share a commit.
        key = guard_app_id or id(item)
        return self._group.submit(key, lambda: self._plan(item), kind=codecs["value"], before=self._writer_idle())

    def _writer_idle(self) -> bool:
        """Whether an append's group must first check the table and catch up (:meth:`sync_writer`):
        after ``IDENTITY_CHECK_IDLE_S`` without a commit through this writer. The topic may have
        been deleted and re-created meanwhile by another process, and this writer's next version
        would then be a gap in the new table (``CorruptedLog`` for every reader of it). A busy
        writer skips the read; a commit in flight across a delete and re-create is the documented
        limitation (docs/storage.md)."""
        writer = self._writer
        return writer is not None and writer.idle_s() > IDENTITY_CHECK_IDLE_S

    def wait_append(self, request: Any) -> AppendResult:
        return self._group.wait(request).result

    def append_marker(self, records: pa.Table, guard_app_id: str) -> AppendResult:
        """Append one transaction's marker row, at most once ever (``guard_app_id``), sharing the
        commit of whatever else is being appended here (a marker's payload is empty: any codec).
        When a probe finds others' appends since our last look, the group first catches up on them
        (:meth:`sync_writer`): a marker surely follows its transaction's data, which other writers
        may have appended."""
        item = _AppendItem(records, None, None, guard_app_id, None)
        return self._group.run(guard_app_id, lambda: self._plan(item), before=self._behind()).result

    def _behind(self) -> bool:
        """Whether a marker's group must catch up first (:meth:`sync_writer`), probed without the
        append lock: a commit in flight holds it for its round trips, and the probe's reads under
        it made every append of the partition wait for them, while in one process appending alone
        they find nothing. A commit that lands after the probe only costs the marker's group a
        lost race (re-read, re-planned), as it did after a sync.

        Markers asking together share a probe: any probe that began after a marker asked answers
        for it (the many markers of transactions in flight made two requests each)."""
        asked = time.monotonic()
        while True:
            with self._probe_lock:
                began, answer = self._probed
                if began >= asked:
                    return answer
                running = self._probing
                if running is None:
                    running = self._probing = threading.Event()
                    mine, began = True, time.monotonic()
                else:
                    mine = False
            if not mine:
                running.wait()  # then its answer, if it began after we asked, or a probe of our own
                continue
            answer = True  # should the probe itself fail: catch up, as a failed probe does
            try:
                answer = self._probe_behind()
            finally:
                with self._probe_lock:
                    self._probed, self._probing = (began, answer), None
                running.set()
            return answer

    def _probe_behind(self) -> bool:
        writer = self._writer
        if writer is None:
            return True
        try:
            if not writer.same_table():
                return True
            for _ in range(2):
                nxt = writer.next_commit()
                if not nxt.arrived():
                    return False
                if writer.version == nxt.version:
                    return True  # a commit this writer has not applied: another writer's
                # our own group committed meanwhile: probe past it once more
            return True
        except Exception:
            return True  # the sync under the lock reads again, and reports a storage error itself

    def _plan(self, item: _AppendItem) -> Done | Write:
        """An append's own checks against the state the group's commit is based on."""
        item.attempts += 1
        writer = self._appender()
        n = item.records.num_rows
        if item.guard_app_id is not None and writer.txn_version(item.guard_app_id) is not None:
            item.result = AppendResult(None, attempts=item.attempts, duplicates=n)
            return Done(item)
        item.keep = None
        if item.app_id is not None:
            last = writer.txn_version(item.app_id)
            before = self._planned.get(item.app_id)  # the producer's appends ahead of this one in the commit
            if before is not None and (last is None or before > last):
                last = before
            if item.floor is not None and last is not None and last > item.floor:
                raise ProducerBusy(
                    f"another producer named {item.producer_name!r} appended sequence id {last} to {self.topic}, "
                    f"above this producer's {item.floor}: two live producers of one name drop each other's "
                    "messages as duplicates, so this append was refused. Close the other producer, or give each "
                    "its own producer_name")
            keep = new_message_keep(item.seqs, last)
            if not keep.any():
                item.result = AppendResult(None, attempts=item.attempts, duplicates=n)
                return Done(item)
            item.keep = None if keep.all() else keep
            self._planned[item.app_id] = int(item.seqs[keep].max())
        item.rows = item.records if item.keep is None else item.records.filter(pa.array(item.keep))
        return Write([item], item)

    def _write_group(self, items: list[_AppendItem]) -> None:
        """One commit for a group's appends and markers (the lock is held). ConcurrentCommit (any
        append since our snapshot: every append sets the offset app id): re-planned."""
        writer = self._appender()
        next_offset = _next_offset(writer)
        tables = [i.rows for i in items]
        schema = tables[0].schema
        rows = pa.concat_tables([t if t.schema == schema else t.cast(schema) for t in tables])
        data = _finish(rows, next_offset, int(time.time() * 1_000_000))
        apps = {OFFSET_APP_ID: next_offset + rows.num_rows}
        at = next_offset
        for i in items:
            if i.app_id is not None:
                high = int(i.seqs.max() if i.keep is None else i.seqs[i.keep].max())
                apps[i.app_id] = max(high, apps.get(i.app_id, high))
            if i.guard_app_id is not None:
                apps[i.guard_app_id] = at
            at += i.rows.num_rows
        codecs = next((i.codecs for i in items if i.codecs is not None), {"value": CompressionType.NONE.parquet_codec})
        guards = {i.guard_app_id: GUARD_LIFETIME_MS for i in items if i.guard_app_id is not None}
        self._committing = data
        try:
            version = writer.append(data, apps, codecs=codecs, lifetimes_ms=guards)
        finally:
            self._committing = None
        if version is not None and MERGE_EVERY > 0 and version % MERGE_EVERY == 0:
            for hook in EVERY_MERGE_INTERVAL:
                try:
                    hook(self)
                except Exception as e:  # the append has landed: it must not be reported failed, or made again
                    log.warning("%s: scheduling a merge after version %d failed: %s", self.topic, version, e)
        at = next_offset
        for i in items:
            k = i.rows.num_rows
            last = at + k - 1
            i.result = AppendResult(version, at, last, i.attempts, i.records.num_rows - k, [(at, last)], i.keep)
            at += k

    def sync_writer(self) -> None:
        """Catch this log's writer up on others' appends (a probe per new commit) before an append
        that surely follows them, e.g. a commit marker after a Spark job's task appends: otherwise
        the append first loses its race to the stale view, encoding and writing its file twice.
        Also notices a topic deleted and re-created since (then it starts over from the new table)."""
        with self._append_lock:
            if self._writer is not None and not self._writer.same_table():
                log.info("%s was re-created since this process opened it: reloading", self.topic)
                self._writer, self._index = None, None
                self._forget_rows()
            self._catch_up(self._appender())

    def last_sequence_id(self, producer_name: str) -> int | None:
        with self._append_lock:  # the writer as appends use it: one is made, or replaced, under the lock only
            writer = self._appender()
            self._catch_up(writer)
            return writer.txn_version(producer_app_id(producer_name))

    # ---- reads ---------------------------------------------------------------------------------
    @property
    def index(self) -> FileIndex:
        if self._index is None:
            self.refresh()
        assert self._index is not None
        return self._index

    def refresh(self) -> FileIndex:
        """Bring the file index up to date: a snapshot load the first time, then only new commits."""
        with naming_partition(self.root, self.segments, self.topic):  # a corrupt log names this partition
            return self._refresh()

    def _refresh(self) -> FileIndex:
        # One index throughout (threads share this log): another thread may start over meanwhile.
        idx = self._index
        checked = False  # this call checked a long-loaded index is still the table's (below)
        if idx is not None and time.monotonic() - self._identity_checked >= INCARNATION_CHECK_S:
            # A long-lived reader must notice a topic deleted and re-created elsewhere: the new table's
            # commits would otherwise be applied as if they continued the old one's log.
            self._identity_checked = time.monotonic()
            current = self._tail.table_id()
            if current is not None and current != self._table_id:
                log.info("%s was deleted and re-created since this process loaded it: starting over", self.topic)
                self._index = idx = None
            else:
                checked = True
        if idx is None:
            idx = FileIndex()
            light = delta.read_checkpointed_snapshot(self.root, self.segments)
            if light is not None:  # a checkpoint to start from: read without delta-rs (half the cost)
                idx.load_adds(light.adds.values(), light.version)
                self._table_id = light.table_id
            else:
                t = delta.open_table(self.root, *self.segments)
                if t is None:
                    raise TopicNotFound(f"topic partition {self.topic} does not exist under {self.root.url}")
                idx.load_snapshot(t)
                self._table_id = t.metadata().id
            self._index = idx
            self._identity_checked = time.monotonic()
        applied = False
        for version, actions in self._tail.commits_after(idx.version):
            idx.apply_commit(version, actions)
            applied = True
        if checked and not applied and self._checkpoint_past(idx.version):
            # Delta cleans up commits older than delta.logRetentionDuration once a checkpoint covers
            # them: a reader idle that long finds its next commit gone, a gap that catching up commit
            # by commit never crosses. Asked only at the identity check, when no commit followed.
            log.info("%s: the commits after version %d were cleaned up since this process read them: "
                     "reloading from the last checkpoint", self.topic, idx.version)
            self._index = None
            return self._refresh()
        return idx

    def _checkpoint_past(self, version: int) -> bool:
        """Whether the table's last checkpoint is past ``version``."""
        info = delta.read_last_checkpoint(self.root, self.segments)
        return info is not None and int(info.get("version", -1)) > version

    def next_commit(self) -> delta.NextCommit:
        """The commit after the ones the file index has applied (before it is loaded: version 0)."""
        return delta.NextCommit(self._tail, -1 if self._index is None else self._index.version)

    @property
    def table_id(self) -> str:
        """The partition table's unique Delta id: its incarnation (a re-created topic is a new table)."""
        if self._table_id is None:
            self.refresh()
        assert self._table_id is not None
        return self._table_id

    def end_offset(self, refresh: bool = True) -> int:
        return (self.refresh() if refresh else self.index).end_offset

    def offset_at_time(self, publish_ms: int) -> int:
        """The first offset published at or after ``publish_ms`` (epoch milliseconds), or the end
        offset when none is yet: where seeking by time, and Spark's ``startingTimestamp``, begin.

        Publish times come from the writers' clocks, so they need not rise with offsets: this is
        the first offset in offset order whose time qualifies. Files whose statistics show every
        record earlier are skipped unread."""
        index = self.refresh()
        target_us = int(publish_ms) * 1000
        for f in index.files:
            if f.max_publish_us is not None and f.max_publish_us < target_us:
                continue
            rows = read_files(self.root, self.segments, [f], f.min_offset, f.max_offset + 1,
                              ["offset", "publish_time"])
            times = rows.column("publish_time").cast(pa.int64()).to_numpy()
            hits = np.flatnonzero(times >= target_us)
            if len(hits):
                return int(rows.column("offset")[int(hits[0])].as_py())
        return index.end_offset

    def read(self, start: int, end: int, columns: Sequence[str] | None = None, txn_only: bool = False) -> pa.Table:
        """All records with ``start <= offset < end`` in offset order (every type, no isolation).
        ``txn_only``: skip the files whose statistics prove they hold no transactional record (the
        transaction buffer's fold, for which plain records only move the end)."""
        files = self.index.files_for(start, end)
        if txn_only:
            files = [f for f in files if not f.txn_free]
        return read_files(self.root, self.segments, files, start, end, columns)


def _next_offset(writer: DeltaAppender) -> int:
    """Where the log ends: the highest offset in its files' statistics, plus one. The offset app id
    every append sets is the compare-and-set guard, but its value may expire with the table's
    app-id retention (delta-rs drops it when it loads a snapshot after 7 idle days), so it is
    only a lower bound here; the files never expire (retention keeps the newest one)."""
    end = 0 if writer.max_value is None else writer.max_value + 1
    return max(end, writer.txn_version(OFFSET_APP_ID) or 0)


# A forked child starts without its parent's writers: their handles belong to the parent's
# deltalake runtime, their locks and group commits to threads the child does not have.
_SHARED: forks.ProcessCache[tuple[str, str], PartitionLog] = forks.ProcessCache()


def shared_log(root: StorageRoot, topic: TopicName) -> PartitionLog:
    """A process-wide PartitionLog per partition, for writers that come and go (the TC's marker
    channel): reusing its DeltaTable avoids re-reading the Delta log on every marker."""
    return _SHARED.get_or_make((root.url, str(topic)), lambda: PartitionLog(root, topic),
                               keep=lambda plog: plog.root == root)


def forget_shared(root: StorageRoot, topic: TopicName) -> None:
    """Drop cached handles of a deleted topic's partitions (a re-created topic is a new table)."""
    prefix = f"{topic.base}-partition-"
    _SHARED.drop(lambda k: k[0] == root.url and k[1].startswith(prefix))


def read_files(root: StorageRoot, segments: tuple[str, ...], files: Sequence[DataFile], start: int, end: int,
               columns: Sequence[str] | None = None) -> pa.Table:
    """Read records in ``[start, end)`` from the given files. Shared by the client reader and by
    Spark executors, which receive the file list from the driver and never open the Delta log."""
    cols = list(columns) if columns is not None else RECORD_SCHEMA.names
    if "offset" not in cols:
        cols = ["offset", *cols]
    paths = [root.fs_path(*segments, f.path) for f in files]

    def in_range(t: pa.Table) -> np.ndarray:  # a mask, not a pc.field expression (see delta.read_parquet)
        off = t.column("offset").to_numpy()
        return (off >= start) & (off < end)

    keep = in_range if files and (start > files[0].min_offset or end <= files[-1].max_offset) else None
    where = f"partition {'/'.join(segments[1:])}"
    try:
        # A network fault is retried, then StorageUnavailable; only unreadable content is corruption.
        table = delta.retrying(f"read data files of {where} at", root.uri(*segments),
                               lambda: delta.read_parquet(root, paths, RECORD_SCHEMA, cols, keep), root=root)
    except StorageError:
        raise
    except FileNotFoundError as e:
        raise CorruptedLog(f"{where}: a data file listed in the Delta log is missing: {e}") from e
    except pa.ArrowInvalid as e:
        raise CorruptedLog(f"{where}: cannot read data files: {e}") from e
    except OSError as e:
        raise StorageError(f"{where}: cannot read data files: {delta.describe(e, delta.secrets_of(root))}") from e
    off = table.column("offset").to_numpy()
    if len(off) > 1 and not bool(np.all(off[1:] > off[:-1])):
        table = table.sort_by("offset")
    return table


