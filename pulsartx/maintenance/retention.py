"""Retention: delete a partition's oldest files by age or size, never past the slowest
subscription's mark-delete position unless forced, then vacuum what is unreferenced.

Whatever the limits say, retention keeps what the rest of the log needs to be read correctly
(:func:`_needed_by_the_log`): it never passes maxReadPosition (an open transaction's data stays
until its outcome is known), and it never deletes the marker of a transaction that still has data
after the new start (a straggler whose marker is gone would look like an open transaction to a
fold of the remaining log, forever), nor that of a commit its TC has not finished
(:func:`_needed_until_finished`). It settles the transaction buffer through the TCs first, as
compaction does, so a straggler of a forgotten transaction does not hold it back for good."""
from __future__ import annotations

import datetime
import logging
import math
import time
from dataclasses import dataclass

import pyarrow.compute as pc

from pulsartx.admin.subscriptions import live_cursor, subscription_names
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.reads import finished, settle
from pulsartx.buffer.state import BufferState, txn_key_column
from pulsartx.coordinator.registry import Coordinators
from pulsartx.log.index import DataFile
from pulsartx.log.partition import PartitionLog, partition_segments
from pulsartx.log.schema import STATS_COLUMNS, MessageType
from pulsartx.naming import TopicName
from pulsartx.storage import delta
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.store import SubscriptionStore

log = logging.getLogger(__name__)


@dataclass
class RetentionResult:
    partition: str
    files_deleted: int = 0
    bytes_deleted: int = 0
    new_start_offset: int = 0
    held_by_subscription: str | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def slowest_subscription(root: StorageRoot, partition: TopicName) -> tuple[str | None, int | None]:
    """(name, first unacknowledged offset) of the live subscription furthest behind on the partition."""

    slowest: tuple[str | None, int | None] = (None, None)
    for name in subscription_names(root, [partition]):
        cur = live_cursor(SubscriptionStore(root, partition, name))
        if cur is not None and (slowest[1] is None or cur.mark_delete + 1 < slowest[1]):
            slowest = (name, cur.mark_delete + 1)
    return slowest


def _needed_by_the_log(plog: PartitionLog, state: BufferState, doomed: list[DataFile]) -> list[DataFile]:
    """The leading files of ``doomed`` that the rest of the log does not need (see the module)."""
    doomed = [f for f in doomed if f.max_offset < state.read_limit]  # below maxReadPosition
    if not doomed:
        return doomed
    start = doomed[-1].max_offset + 1
    ended_below = {k: o for k, o in state.ended.items() if o < start}
    if not ended_below:
        return doomed
    rows = plog.read(start, state.end_offset, ["type", "txn_most_bits", "txn_least_bits"], txn_only=True)
    data = rows.filter(pc.and_(pc.equal(rows.column("type"), MessageType.DATA.value),
                               pc.is_valid(rows.column("txn_most_bits"))))
    stragglers = set(pc.unique(txn_key_column(data)).to_pylist()) & ended_below.keys()
    if not stragglers:
        return doomed
    keep_from = min(ended_below[k] for k in stragglers)
    log.info("retention on %s keeps offsets from %d: the marker of %d transaction(s) with data after it",
             plog.topic, keep_from, len(stragglers))
    return [f for f in doomed if f.max_offset < keep_from]


def _needed_until_finished(coordinators: Coordinators, plog: PartitionLog, state: BufferState,
                           doomed: list[DataFile]) -> list[DataFile]:
    """The leading files of ``doomed`` holding no commit marker of a transaction its TC has not
    finished (still COMMITTING, its other markers on their way, or its TC unreadable now). Its TC
    cannot tell a straggler of it from data its commit covers, so only this partition's memory of
    the marker can: deleted, a straggler appended later would be shown."""
    if not doomed:
        return doomed
    start = doomed[-1].max_offset + 1
    plain = {k: o for k, o in state.ended.items() if o < start and k not in state.aborted and k not in state.ranges}
    unfinished = plain.keys() - finished(coordinators, set(plain)) if plain else set()
    if not unfinished:
        return doomed
    keep_from = min(plain[k] for k in unfinished)
    log.info("retention on %s keeps offsets from %d: the marker of %d transaction(s) not finished yet",
             plog.topic, keep_from, len(unfinished))
    return [f for f in doomed if f.max_offset < keep_from]


def apply_retention(root: StorageRoot, partition: TopicName, max_age_ms: int | None = None,
                    max_bytes: int | None = None, force: bool = False, attempts: int = 5) -> RetentionResult:
    """Delete the oldest files past the limits, planning again when a concurrent change removed
    some of them first (a writer's background merge of small files, a compaction)."""
    for attempt in range(attempts):
        try:
            return _retention_once(root, partition, max_age_ms, max_bytes, force)
        except delta.ConcurrentCommit:
            if attempt == attempts - 1:
                raise
            delta.backoff(attempt)
    raise AssertionError("unreachable")


def _retention_once(root: StorageRoot, partition: TopicName, max_age_ms: int | None, max_bytes: int | None,
                    force: bool) -> RetentionResult:
    plog = PartitionLog(root, partition)
    index = plog.refresh()
    files = index.files
    res = RetentionResult(str(partition), new_start_offset=index.start_offset)
    if len(files) <= 1:
        return res
    now_us = int(time.time() * 1_000_000)
    total = sum(f.size for f in files)
    doomed = []
    for f in files[:-1]:  # the newest file stays: it carries the log's end
        too_old = max_age_ms is not None and f.max_publish_us is not None and now_us - f.max_publish_us > max_age_ms * 1000
        too_big = max_bytes is not None and total > max_bytes
        if not (too_old or too_big):
            break
        doomed.append(f)
        total -= f.size
    tcs = Coordinators.shared(root)
    state, _ = settle(tcs, TransactionBuffer(plog), eager=True)
    doomed = _needed_until_finished(tcs, plog, state, _needed_by_the_log(plog, state, doomed))
    if not force and doomed:
        name, first_unacked = slowest_subscription(root, partition)
        if first_unacked is not None:
            allowed = [f for f in doomed if f.max_offset < first_unacked]
            if len(allowed) < len(doomed):
                res.held_by_subscription = name
            doomed = allowed
    if not doomed:
        return res
    table = delta.open_table(root, *plog.segments)
    delta.replace_files(root, table, plog.segments, [(f.path, f.size) for f in doomed], None, STATS_COLUMNS)
    res.files_deleted = len(doomed)
    res.bytes_deleted = sum(f.size for f in doomed)
    res.new_start_offset = plog.refresh().start_offset
    # The aborted set must not grow forever (PIP-196): forget what retention deleted. Readers drop
    # rows below the snapshot's horizon, so one still holding the old files stays correct.
    buf = TransactionBuffer(plog)
    buf.state().trim_below(res.new_start_offset)
    buf.take_snapshot()
    log.info("retention on %s: deleted %d file(s), %d bytes; log now starts at %d", partition, res.files_deleted,
             res.bytes_deleted, res.new_start_offset)
    return res


# The youngest an unreferenced data file may be when vacuum deletes it, whatever retention is asked:
# a writer commits the data file it wrote within milliseconds, an hour is far beyond any of them.
ORPHAN_MIN_HOURS = 1


def vacuum(root: StorageRoot, partition: TopicName, retention_hours: float = 1.0) -> int:
    """Physically delete files unreferenced for ``retention_hours``: long enough for any read that
    planned them to finish, and for any write to commit the data file it wrote. Returns the number
    of files deleted.

    delta-rs's full mode, which lists the partition's directory: its default (lite) mode finds
    removed files only through the tombstones the table still keeps, and a partition keeps them
    for 60 s (docs/design/short-tombstone-retention-for-partitions.md), so it would leave every
    file merged away before that. Full mode deletes, besides the tombstones older than the
    retention, every file the snapshot does not reference that was last written longer ago than
    the retention (orphans of lost commits), never a live file, a file with a recent tombstone, a
    younger file (a write not committed yet) or anything under ``_delta_log`` or another ``_`` or
    ``.`` name. One case needs more: a file written long ago and removed recently, whose tombstone
    the checkpoint has already dropped, looks like an old orphan. Every such file was live at the
    table's version as of the retention's horizon, so that version's files are kept too. A
    retention under ``ORPHAN_MIN_HOURS`` applies to files the table holds a tombstone for; files
    nothing references wait until they are that old."""
    segments = partition_segments(partition)
    table = delta.open_table(root, *segments)
    if table is None:
        return 0

    def lite(hours: int) -> list[str]:  # the files of the tombstones the table keeps, older than ``hours``
        return table.vacuum(retention_hours=hours, enforce_retention_duration=False, dry_run=False)

    # delta-rs takes whole hours: round up, never delete sooner than asked.
    hours = max(0, math.ceil(retention_hours))
    deleted: set[str] = set()  # delta-rs also lists tombstoned files an earlier vacuum deleted
    if hours < ORPHAN_MIN_HOURS:
        # Full mode at this retention would delete a data file a writer has written and not yet
        # committed, and the commit would then name a missing file. Files the table still holds a
        # tombstone for go now (lite mode never deletes a file nothing removed); unreferenced ones
        # wait until they are ORPHAN_MIN_HOURS old.
        deleted.update(lite(hours))
        table = delta.open_table(root, *segments)
        if table is None:
            return len(deleted)
        hours = ORPHAN_MIN_HOURS
    try:
        keep = _version_hours_ago(root, segments, hours)
    except Exception as e:
        # Without that version full mode could delete a file removed within the retention:
        # only the tombstones the table keeps are trusted, as delta-rs's lite mode does.
        log.warning("vacuum of %s: the table's version %d hour(s) ago cannot be read (%s); deleting only "
                    "files whose tombstones the table still keeps", partition, hours, e)
        deleted.update(lite(hours))
        return len(deleted)
    if keep is not None:
        deleted.update(table.vacuum(retention_hours=hours, enforce_retention_duration=False, dry_run=False,
                                    full=True, keep_versions=[keep]))
    return len(deleted)


def _version_hours_ago(root: StorageRoot, segments: tuple[str, ...], hours: int) -> int | None:
    """The table's version ``hours`` ago, whose files vacuum keeps; None when the table is gone."""
    horizon = delta.open_table(root, *segments)
    if horizon is None:
        return None
    horizon.load_as_version(datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=hours))
    version = horizon.version()
    if version > 0 and not root.exists(*segments, "_delta_log", delta.commit_file(version - 1)):
        # delta-rs answers a time before the oldest commit left (log cleanup) with that commit,
        # whose files may be newer than the horizon: it is not the version the horizon saw.
        raise LookupError(f"the log's oldest commit left, version {version}, may be younger than that")
    return version
