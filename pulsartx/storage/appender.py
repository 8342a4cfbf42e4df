"""Appends to a Delta table by writing the data file and the commit ourselves.

Why: every pulsartx protocol step is a tiny Delta append (a TC status change, a cursor, a
commit marker, a producer batch), and ``write_deltalake`` costs 13 ms on a fresh table and grows
with the table's active files, 40-70 ms at 150-300 files, because each commit rebuilds the
snapshot (measured on local disk; docs/design/own-delta-append-path.md). An append in the Delta
protocol is two objects: one parquet file and ``_delta_log/<version>.json`` created only if absent.
Written directly that costs about 2 ms locally, flat, and two requests on S3 instead of ~20.

The tables stay plain Delta tables: the commit is the same ``commitInfo``/``txn``/``add`` JSON
delta-rs writes (with per-file statistics for the table's ``delta.dataSkippingStatsColumns``), and
every ``CHECKPOINT_INTERVAL``-th version the writer that made it writes a checkpoint (in the
background), as delta-rs's post-commit hook would, and less often as the checkpoints grow
(:func:`checkpoint_interval`): pulsartx's own from the last one and the commits since
(:mod:`pulsartx.storage.checkpoint`), delta-rs's for a table's first and where that falls back. Only tables at protocol (1, 2) with no column invariants take
this path (what pulsartx creates); any other table, or a store without put-if-absent, is written
through ``write_deltalake`` instead.

Compare-and-set, as delta-rs and the Delta protocol define it for app transactions: an append that
sets app ids fails with :class:`ConcurrentCommit` if any commit after our snapshot set one of them.
We try ``version + 1``; if it is taken we read that commit, apply it to our state and check it; a
commit that shares none of our app ids is simply stepped over (appends commute). A put whose
response was lost and is retried finds its own commit (same unique ``txnId``) and succeeds.

State: ``version`` and the app-id versions set by commits after the DeltaTable handle's snapshot
(``txn_version`` consults these first, then the handle), kept current by reading every commit
after ``version`` in order (``catch_up``). Owners that keep derived state (a KeyedLog's rows and
files) see each commit through ``on_commit``, flagged when it is their own; our own commits made
through delta-rs (:meth:`DeltaAppender.write_with_deltalake`) are not among them, and the handle,
which stands at such a commit's version, holds their files.
"""
from __future__ import annotations

import heapq
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from pulsartx import forks
from pulsartx.exceptions import CorruptedLog, StorageError
from pulsartx.storage import checkpoint, delta
from pulsartx.storage.pools import ProcessPool
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)
ENGINE = "pulsartx"
CHECKPOINT_INTERVAL = 100
MAX_VANISHED_SLOTS = 5  # a commit slot that is taken but unreadable, this many times in a row: give up
# A writer that has not looked at the log for this long re-reads the table before writing: the
# Delta log's JSON commits may be cleaned up after 30 days (delta.logRetentionDuration), and a put
# at a version that was cleaned up would succeed where it must conflict.
STALE_AFTER_S = 6 * 3600.0
# Statistics in the commit: Delta's default is the first 32 columns; we compute them for primitive
# columns only (strings would need Delta's truncation rules, and no pulsartx read prunes on them).
DEFAULT_STATS_COLUMNS = 32
EXPIRING_SOON_MS = 2 * 3_600_000  # app ids expiring sooner than this are tracked for forgetting

T = TypeVar("T")


_CHECKPOINTS = ProcessPool(1, "pulsartx-checkpoint")
# Expired-log cleanup lists the whole _delta_log folder, which grows by a file per version for the
# 30 days of delta.logRetentionDuration, and needs delta-rs's open of the table, whose cost grows with
# its live files: it runs with the checkpoint at every CLEANUP_EVERY x CHECKPOINT_INTERVAL-th version
# only, and at most once per CLEANUP_MIN_INTERVAL_S per table in a process (a busy partition reaches
# every 1,000th version within seconds; nothing in a log expires sooner than days).
CLEANUP_EVERY = 10
CLEANUP_MIN_INTERVAL_S = 3600.0
# table URI -> time.monotonic() of this process's last cleanup of it
_LAST_CLEANUP: forks.ProcessCache[str, float] = forks.ProcessCache()
# A process that dies while writing a commit, a checkpoint or its hint on local disk leaves the
# temporary file it was writing in _delta_log, where nothing else would ever delete it: the
# checkpoint thread deletes those older than TEMPORARY_MIN_AGE_S, listing the folder at most once
# per TEMPORARY_SWEEP_INTERVAL_S per table in a process (a listing grows with the log, as cleanup's).
TEMPORARY_MIN_AGE_S = 3600.0
TEMPORARY_SWEEP_INTERVAL_S = 3600.0
_LAST_SWEEP: forks.ProcessCache[str, float] = forks.ProcessCache()
# table URI -> newest version waiting for a checkpoint. A forked child starts empty: the parent's
# queued checkpoints are the parent's (left queued here, their tables would never be checkpointed
# again), and its lock may have been held by its checkpoint thread.
_CHECKPOINT_QUEUED: forks.ProcessCache[str, int] = forks.ProcessCache()
# A checkpoint rewrites every action the table keeps (live files, tombstones and app ids not yet
# expired), so its cost follows the table's size while the versions between two checkpoints stayed
# CHECKPOINT_INTERVAL: a busy partition of small files spent more CPU per commit on checkpoints the
# longer it ran (docs/design/checkpoints-follow-table-size.md). The interval doubles until the
# last checkpoint holds at most this many actions per version of the interval.
CHECKPOINT_ACTIONS_PER_VERSION = 20
# ... but never past this many versions: whoever opens the table (delta-rs, or our own tail reads,
# one request per commit on an object store) replays the commits since the last checkpoint, and a
# keyed log's tombstones alone would otherwise push the interval up without end.
MAX_CHECKPOINT_INTERVAL = 800
# table URI -> actions in its last checkpoint, as this process read it
_CHECKPOINT_SIZE: forks.ProcessCache[str, int] = forks.ProcessCache()


def checkpoint_interval(actions: int) -> int:
    """Versions between two checkpoints of a table whose last checkpoint held ``actions``:
    CHECKPOINT_INTERVAL doubled until the checkpoint's rewrite, spread over the commits of one
    interval, is at most CHECKPOINT_ACTIONS_PER_VERSION actions a commit, up to
    MAX_CHECKPOINT_INTERVAL versions. Always a multiple of
    CHECKPOINT_INTERVAL, so writers that estimate a table's size differently still checkpoint
    at versions the others' rule also picks (a multiple of the smaller interval)."""
    interval = CHECKPOINT_INTERVAL
    while actions > interval * CHECKPOINT_ACTIONS_PER_VERSION and interval * 2 <= MAX_CHECKPOINT_INTERVAL:
        interval *= 2
    return interval


def checkpoint_due(uri: str, version: int) -> bool:
    """Whether the writer of ``version`` checkpoints the table at ``uri`` (see :func:`checkpoint_interval`)."""
    return version % checkpoint_interval(_CHECKPOINT_SIZE.get(uri, 0)) == 0


def schedule_checkpoint(root: StorageRoot, segments: tuple[str, ...], version: int) -> Future[None] | None:
    """Checkpoint a table at ``version`` on the process's checkpoint thread. A table with a
    checkpoint already waiting gets only the newest version (a backlog is one job per table).
    Never raises: it runs after a commit that has landed (after interpreter shutdown has begun,
    ``submit`` refuses work, and the appends of daemon threads still get here).

    The thread is not a daemon (a daemon thread inside delta-rs at interpreter exit can abort the
    process), but queued jobs are skipped once shutdown begins: exit waits for one running job
    at most."""
    uri = root.uri(*segments)
    with _CHECKPOINT_QUEUED.lock:
        queued = uri in _CHECKPOINT_QUEUED
        _CHECKPOINT_QUEUED[uri] = max(version, _CHECKPOINT_QUEUED.get(uri, -1))
        if queued:
            return None
        try:
            return _CHECKPOINTS.get().submit(_write_checkpoint, root, segments, uri)
        except RuntimeError as e:  # interpreter shutting down: the commits alone are the table
            _CHECKPOINT_QUEUED.pop(uri, None)
            log.debug("checkpoint of %s at version %d not scheduled: %s", uri, version, e)
            return None


def _shutting_down() -> bool:
    import concurrent.futures.thread as cft

    return bool(getattr(cft, "_shutdown", False))


def _write_checkpoint(root: StorageRoot, segments: tuple[str, ...], uri: str) -> None:
    with _CHECKPOINT_QUEUED.lock:
        version = _CHECKPOINT_QUEUED.pop(uri)
    if _shutting_down():
        log.debug("checkpoint of %s at version %d skipped: the process is exiting", uri, version)
        return
    try:
        if uri not in _CHECKPOINT_SIZE:
            # The first checkpoint this process asks for: the table may be large already, so its
            # last checkpoint's size decides whether this version is due (read here, off the commit path).
            _note_checkpoint_size(root, segments, uri)
            if not checkpoint_due(uri, version):
                return
        t = None
        if not _write_own_checkpoint(root, segments, uri, version):
            # A fresh open at the version, not a kept handle brought up to it: delta-rs 1.x's
            # update_incremental grows with the table's files (30 ms at 300 files, 95 ms at 1,100,
            # CPU, local disk), an open from the last checkpoint stays at 25-40 ms, and
            # create_checkpoint builds its own snapshot of that version in any case.
            t = delta.open_table(root, *segments, version=version)
            if t is None:
                return
            t.create_checkpoint()
            _note_checkpoint_size(root, segments, uri)
        if version % (CHECKPOINT_INTERVAL * CLEANUP_EVERY) == 0 and _cleanup_due(uri):
            # Cleanup needs delta-rs's table; opened after the checkpoint, it reads that one.
            if t is None:
                t = delta.open_table(root, *segments, version=version)
            if t is not None:
                t.cleanup_metadata()
    except Exception as e:  # an optimisation: the commits alone are the table
        log.info("checkpoint of %s at version %d skipped: %s", uri, version, e)
    if root.is_local and _once_per(_LAST_SWEEP, uri, TEMPORARY_SWEEP_INTERVAL_S):
        try:
            gone = root.remove_stale_temporaries(*segments, "_delta_log", older_than_s=TEMPORARY_MIN_AGE_S)
        except OSError as e:
            log.info("leftover temporary files of %s not swept: %s", uri, e)
        else:
            if gone:
                log.info("deleted %d temporary file(s) left in %s/_delta_log by writers that died: %s",
                         len(gone), uri, ", ".join(gone))


def _cleanup_due(uri: str) -> bool:
    """Whether this process cleans the expired log of ``uri`` now (and then notes that it did)."""
    return _once_per(_LAST_CLEANUP, uri, CLEANUP_MIN_INTERVAL_S)


def _once_per(last_run: forks.ProcessCache[str, float], uri: str, interval_s: float) -> bool:
    """Whether a job of ``uri`` that runs at most every ``interval_s`` in a process is due now (and
    then notes that it runs)."""
    now = time.monotonic()
    last = last_run.get(uri)
    if last is not None and now - last < interval_s:
        return False
    last_run[uri] = now
    return True


def _write_own_checkpoint(root: StorageRoot, segments: tuple[str, ...], uri: str, version: int) -> bool:
    """The checkpoint at ``version`` written by pulsartx from the last one and the commits since
    (:mod:`pulsartx.storage.checkpoint`); False when delta-rs must write it (the table's first
    checkpoint, a layout that module does not continue, or any error)."""
    try:
        written = checkpoint.write_checkpoint(root, segments, version)
    except checkpoint.Unsupported as e:
        log.debug("checkpoint of %s at version %d left to delta-rs: %s", uri, version, e)
        return False
    except Exception as e:
        log.info("checkpoint of %s at version %d left to delta-rs after an error: %s", uri, version,
                 delta.describe(e, delta.secrets_of(root)))
        return False
    if written is not None and written.hint_written:
        _CHECKPOINT_SIZE[uri] = written.size
    else:
        _note_checkpoint_size(root, segments, uri)
    return True


def _note_checkpoint_size(root: StorageRoot, segments: tuple[str, ...], uri: str) -> None:
    """Remember how many actions the table's last checkpoint holds (``size`` in ``_last_checkpoint``,
    which delta-rs writes with it), which sets the interval to the next one."""
    try:
        info = delta.read_last_checkpoint(root, segments)
        size = int(info["size"]) if info is not None else 0
    except (ValueError, KeyError, TypeError):
        size = 0
    _CHECKPOINT_SIZE[uri] = size


def wait_for_checkpoints() -> None:
    """Block until every checkpoint scheduled so far is written (tests, orderly shutdown)."""
    _CHECKPOINTS.drain()


def _fast_capable(table: Any) -> bool:
    p = table.protocol()
    if p.min_reader_version > 1 or p.min_writer_version > 2 or p.writer_features or p.reader_features:
        return False
    schema = table.schema()
    fields = getattr(schema, "fields", [])
    return not any("delta.invariants" in (getattr(f, "metadata", None) or {}) for f in fields)


def _snapshot_max(table: Any, column: str, uri: str) -> int | None:
    """The maximum of ``column`` over a snapshot's files, from their statistics (None: no files)."""
    import pyarrow.compute as pc

    adds = delta.add_actions(table)
    if adds.num_rows == 0:
        return None
    name = f"max.{column}"
    if name not in adds.column_names or adds.column(name).null_count:
        raise CorruptedLog(f"Delta table {uri}: a data file has no {column!r} statistics, so where the log ends "
                           f"cannot be told; rewrite it with its statistics (compaction does)")
    return int(pc.max(adds.column(name)).as_py())


def _stats_columns(table: Any, schema: pa.Schema) -> list[str]:
    configured = table.metadata().configuration.get("delta.dataSkippingStatsColumns")
    names = [c.strip() for c in configured.split(",") if c.strip()] if configured else schema.names[:DEFAULT_STATS_COLUMNS]
    out = []
    for name in names:
        if name not in schema.names:
            continue
        t = schema.field(name).type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_timestamp(t) or pa.types.is_date(t):
            out.append(name)
    return out


@dataclass(frozen=True)
class RewriteFiles:
    """A rewrite's data files, written and not yet committed (:meth:`DeltaAppender.write_rewrite_files`)."""

    commit_id: str  # the commit's txnId, which also names the files
    now: int  # epoch ms the files were written at: their modificationTime, the commit's timestamp
    adds: list[dict[str, Any]]  # their add actions


class DeltaAppender:
    """The append path of one Delta table for one process (callers serialise their appends)."""

    def __init__(self, root: StorageRoot, segments: tuple[str, ...], table: Any, schema: pa.Schema,
                 on_commit: Callable[[int, list[dict[str, Any]], bool], None] | None = None,
                 track_max: str | None = None):
        self.root = root
        self.segments = segments
        self.schema = schema
        self.on_commit = on_commit
        # A statistics column whose maximum over every file added so far is kept (the partition
        # log's offset: its end must come from the log itself, which never expires, not an app id).
        self.track_max = track_max
        self.max_value: int | None = None
        # Called when this writer starts over from a fresh snapshot: the commits in between reach no
        # on_commit, so an owner with derived state must rebuild it (KeyedLog reopens).
        self.on_reload: Callable[[], None] | None = None
        self._tail = delta.LogTail(root, segments)
        # path -> delta.since_boot() when this writer wrote the data file, until it is committed or
        # discarded: with the file's modificationTime (the wall clock), how long it has waited
        # (``_refresh_stale_files``), even across a wall clock set back.
        self._written: dict[str, float] = {}
        self._reset(table)

    def _reset(self, table: Any) -> None:
        self.table = table
        self.version = table.version()
        self._apps: dict[str, int] = {}
        # Every app id as of ``version`` once read (delta.read_app_ids), then kept by _apply; None
        # until a lookup misses ``_apps``, or while the log is not in a form that reads.
        self._ids: dict[str, int] | None = None
        self._ids_retry_at = -1  # the version from which reading them is tried (again)
        self._retention_ms: tuple[float | None | bool] | None = None  # (app_id_retention_ms,), once read
        # (expiry ms, app id, version) of app ids that expire within EXPIRING_SOON_MS of being applied
        # (marker guards): forgotten here when Delta forgets them, so a long-lived writer's memory
        # holds the last hour's guards, not every guard it ever saw.
        self._expiring: list[tuple[float, str, int]] = []
        self.fast = self.root.has_put_if_absent and _fast_capable(table)
        self._stats = _stats_columns(table, self.schema)
        self._synced = time.monotonic()
        # The latest metaData action applied after the handle's snapshot (None: the handle's holds).
        # A foreign one is applied without a reload by catch_up, so a commit that restates the
        # metadata must start from this, not from the handle.
        self._metadata: dict[str, Any] | None = None
        if self.track_max is not None:
            self.max_value = _snapshot_max(table, self.track_max, self.uri)

    @property
    def uri(self) -> str:
        return self.root.uri(*self.segments)

    # ---- state ---------------------------------------------------------------------------------
    def txn_version(self, app_id: str) -> int | None:
        """The version of ``app_id`` as of :attr:`version` (None if never set)."""
        if app_id in self._apps:
            return self._apps[app_id]
        if self._ids is None and self.version >= self._ids_retry_at:
            retention = self._app_id_retention()
            ids = None if retention is False else delta.read_app_ids(self.root, self.segments, self.version, retention,
                                                                     CHECKPOINT_INTERVAL, MAX_CHECKPOINT_INTERVAL)
            if ids is None:  # not readable as this reads it (now): delta-rs answers until the log moves on
                self._ids_retry_at = self.version + CHECKPOINT_INTERVAL
            self._ids = ids
        if not isinstance(self._ids, dict):
            return delta.txn_version(self.table, app_id)
        return self._ids.get(app_id)

    def _apply(self, version: int, actions: list[dict[str, Any]], foreign: bool = True) -> None:
        now = time.time() * 1000
        retention = self._retention()
        for a in actions:
            if "txn" in a:
                app_id, v = a["txn"]["appId"], int(a["txn"]["version"])
                self._apps[app_id] = v
                if isinstance(self._ids, dict):
                    self._ids[app_id] = v
                updated = a["txn"].get("lastUpdated")
                if updated is not None and retention and updated + retention - now < EXPIRING_SOON_MS:
                    heapq.heappush(self._expiring, (updated + retention, app_id, v))
            elif "metaData" in a:
                self._metadata = a["metaData"]
            elif "add" in a and self.track_max is not None:
                v = delta.parse_stats(a["add"].get("stats")).get("maxValues", {}).get(self.track_max)
                if v is not None and (self.max_value is None or int(v) > self.max_value):
                    self.max_value = int(v)
        while self._expiring and self._expiring[0][0] <= now:
            _, app_id, v = heapq.heappop(self._expiring)
            for ids in (self._apps, self._ids):
                if isinstance(ids, dict) and ids.get(app_id) == v:
                    del ids[app_id]
        self.version = version
        self._synced = time.monotonic()
        if self.on_commit is not None:
            self.on_commit(version, actions, not foreign)

    def idle_s(self) -> float:
        """Seconds since this writer last applied a commit (its own or another's) or caught up."""
        return time.monotonic() - self._synced

    def catch_up(self) -> bool:
        """Apply every commit after :attr:`version`. False when the log no longer holds them (our
        snapshot is older than the log's retention): the owner must reload (:meth:`reload`)."""
        if time.monotonic() - self._synced > STALE_AFTER_S:
            return False
        for version, actions in self._tail.commits_after(self.version):
            self._apply(version, actions)
        self._synced = time.monotonic()
        return True

    def next_commit(self) -> delta.NextCommit:
        """The commit after the ones this writer has applied (what an idle reader of the table waits for)."""
        return delta.NextCommit(self._tail, self.version)

    def same_table(self) -> bool:
        """Whether the table here is still the one this writer loaded, not one deleted and
        re-created under the same path since (version 0 carries the table's unique id): a
        process-wide writer kept across Spark tasks must not continue another table's log.

        No version 0: Delta cleans up commits past delta.logRetentionDuration once a checkpoint
        covers them, so on a table older than that the id cannot be read there. The table is then
        the same one while the commit at this writer's version is still there (a deleted table
        has none, and a re-created one has its own version 0 for years to come)."""
        table_id = self._tail.table_id()
        if table_id is None:
            return self._tail.has_commit(self.version)
        return table_id == self.table.metadata().id

    def reload(self, table: Any | None = None) -> Any:
        """Start over from a fresh snapshot (``table``, or the latest one); returns the handle."""
        if table is None:
            table = delta.open_table(self.root, *self.segments)
        self._reset(table)
        if self.on_reload is not None:
            self.on_reload()
        return table

    def sync_handle(self) -> Any:
        """Bring the DeltaTable handle to the latest version (for operations that need the whole
        snapshot: overwrites, file listings), applying the commits in between first."""
        self.catch_up()
        delta.update(self.table, self.root, self.segments)
        self._rebase(self.table.version())
        return self.table

    def _rebase(self, version: int, ours: bool = False) -> None:
        """The handle now stands at ``version`` (``ours``: a commit we just made through it): apply
        the others' commits up to it that we have not seen (delta-rs steps over them), then let the
        handle's snapshot answer for app ids."""
        for v in range(self.version + 1, version if ours else version + 1):
            actions = self._tail.read_commit(v)
            if actions is not None:
                self._apply(v, actions)
        self.version = version
        self._apps = {}
        self._ids = None  # our own commit through delta-rs set app ids nothing applied here: read again
        self._synced = time.monotonic()

    # ---- appending -----------------------------------------------------------------------------
    def append(self, data: pa.Table | None, app_transactions: Mapping[str, int] | None = None,
               metadata: Mapping[str, str] | None = None, codecs: Mapping[str, str] | None = None,
               lifetimes_ms: Mapping[str, int] | None = None) -> int:
        """Commit ``data`` as one new file; returns its version. Raises ConcurrentCommit when a
        commit after our snapshot set one of ``app_transactions`` (the caller re-reads and retries).
        ``codecs``: parquet codecs of some columns (the payload's compression type); others zstd-1.

        ``data`` None: a commit of app ids alone, no data file (a TxnID block lease).

        ``lifetimes_ms``: app ids that Delta may forget sooner than the table's
        ``delta.setTransactionRetentionDuration``, after this many ms. Delta keeps one retention
        per table and expires an app id by its ``lastUpdated``, so theirs is written that much
        earlier (docs/design/short-lived-marker-guards.md)."""
        apps = {k: int(v) for k, v in (app_transactions or {}).items()}
        if not self.fast:
            return self.write_with_deltalake(data, apps=apps, metadata=metadata)
        self._check_fresh()
        if data is not None and data.schema != self.schema:
            data = data.cast(self.schema)
        now = int(time.time() * 1000)
        commit_id = str(uuid.uuid4())  # also names the data file: both need a globally unique id
        add = None if data is None else self._write_data_file(data, now, codecs, commit_id)
        try:
            actions: list[dict[str, Any]] = [
                {"commitInfo": {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Append"},
                                "isBlindAppend": True, "engineInfo": ENGINE, "clientVersion": ENGINE,
                                "txnId": commit_id, **dict(metadata or {})}},
                *({"txn": {"appId": k, "version": v, "lastUpdated": self._last_updated(k, now, lifetimes_ms)}}
                  for k, v in apps.items()),
                *([{"add": add}] if add is not None else []),
            ]
        except BaseException:
            self._discard(add)
            raise
        return self._commit(actions, commit_id, apps, set(), [add] if add is not None else [])

    def _app_id_retention(self) -> float | None | bool:
        """:func:`delta.app_id_retention_ms` of the table, read once per snapshot handle."""
        if self._retention_ms is None:
            self._retention_ms = (delta.app_id_retention_ms(self.table),)
        return self._retention_ms[0]

    def _retention(self) -> float:
        """The table's app-id retention in ms; 0 when app ids never expire (or it cannot be read)."""
        retention = self._app_id_retention()
        return float(retention) if retention else 0.0

    def _last_updated(self, app_id: str, now: int, lifetimes_ms: Mapping[str, int] | None) -> int:
        life = (lifetimes_ms or {}).get(app_id)
        retention = self._retention()
        return now - int(retention) + life if life is not None and retention > life else now

    def rewrite(self, parts: Sequence[tuple[pa.Table, bool]], removes: Sequence[tuple[str, int | None, bool]],
                codecs: Mapping[str, str] | None = None, apps: Mapping[str, int] | None = None,
                properties: Mapping[str, str] | None = None, metadata: Mapping[str, str] | None = None) -> int:
        """Commit a compaction as Delta records an OPTIMIZE: ``removes`` ((path, size, dataChange)
        of data files as of :attr:`version`) replaced by one new file per ``parts`` entry
        ((rows, dataChange)); returns the version. ``dataChange`` False says the rows are the same
        rows rearranged, which a Delta streaming reader skips; True that rows were dropped
        (docs/design/compaction-commits.md). A commit after our snapshot that removed one of the
        same files (another compaction, retention) raises ConcurrentCommit; files others added
        meanwhile stay, as their rows are not in ours. ``apps``: app-transaction versions the same
        commit sets (a record of what the compaction dropped, atomic with dropping it).
        ``properties``: table properties the same commit sets, as a metaData action restating the
        metadata as of :attr:`version` with them (what delta-rs's SET TBLPROPERTIES writes). A
        commit after our snapshot that changed the metadata raises ConcurrentCommit, as for any
        commit; one that only appended is stepped over (its files are valid under either).
        ``metadata``: fields added to the commit's ``commitInfo``, as :meth:`append` adds them.

        The same as :meth:`write_rewrite_files` then :meth:`commit_rewrite`, which a caller that
        serialises its commits calls apart, writing the files outside its lock."""
        self._check_fresh()  # before writing files a stale writer would only throw away
        return self.commit_rewrite(self.write_rewrite_files(parts, codecs), removes, apps, properties, metadata)

    def write_rewrite_files(self, parts: Sequence[tuple[pa.Table, bool]],
                            codecs: Mapping[str, str] | None = None) -> RewriteFiles:
        """The data files of a :meth:`rewrite`, written and not yet committed: they change no state
        of this writer, so they may be written while other threads commit through it. Committed by
        :meth:`commit_rewrite`, or deleted by :meth:`discard_rewrite`."""
        if not self.fast:
            raise ValueError("a compaction commit needs the fast path; use write_with_deltalake(mode='overwrite')")
        now = int(time.time() * 1000)
        commit_id = str(uuid.uuid4())
        schema = self.schema
        adds: list[dict[str, Any]] = []
        try:
            for i, (data, change) in enumerate(parts):
                if data.num_rows:
                    rows = data if data.schema.equals(schema, check_metadata=True) else data.cast(schema)
                    add = self._write_data_file(rows, now, codecs, f"{commit_id}-{i}")
                    adds.append({**add, "dataChange": change})
        except BaseException:
            self._discard_all(adds)
            raise
        return RewriteFiles(commit_id, now, adds)

    def discard_rewrite(self, files: RewriteFiles) -> None:
        """Delete the data files of a rewrite that will not be committed."""
        self._discard_all(files.adds)

    def commit_rewrite(self, files: RewriteFiles, removes: Sequence[tuple[str, int | None, bool]],
                       apps: Mapping[str, int] | None = None, properties: Mapping[str, str] | None = None,
                       metadata: Mapping[str, str] | None = None) -> int:
        """Commit the files of :meth:`write_rewrite_files` as :meth:`rewrite` describes; their data
        files are deleted when the commit gives up, as :meth:`rewrite`'s are."""
        try:
            self._check_fresh()
        except BaseException:
            self.discard_rewrite(files)
            raise
        now, commit_id, adds = files.now, files.commit_id, files.adds
        read_version = self.version
        meta = None
        if properties:
            meta = self._metadata_action()
            meta["configuration"] = {**(meta.get("configuration") or {}), **properties}
        actions: list[dict[str, Any]] = [
            {"commitInfo": {"timestamp": now, "operation": "OPTIMIZE",
                            "operationParameters": {"predicate": "[]", "zOrderBy": "[]"},
                            "readVersion": read_version, "isolationLevel": "SnapshotIsolation",
                            "isBlindAppend": False, "engineInfo": ENGINE, "clientVersion": ENGINE,
                            "operationMetrics": {
                                "numRemovedFiles": str(len(removes)), "numAddedFiles": str(len(adds)),
                                "numRemovedBytes": str(sum(s or 0 for _, s, _ in removes)),
                                "numAddedBytes": str(sum(a["size"] for a in adds))},
                            "txnId": commit_id, **dict(metadata or {})}},
            *([{"metaData": meta}] if meta is not None else []),
            *({"txn": {"appId": k, "version": int(v), "lastUpdated": now}} for k, v in (apps or {}).items()),
            *({"remove": {"path": p, "deletionTimestamp": now, "dataChange": change, "extendedFileMetadata": True,
                          "partitionValues": {}, **({"size": size} if size is not None else {})}}
              for p, size, change in removes),
            *({"add": add} for add in adds),
        ]
        return self._commit(actions, commit_id, dict(apps or {}), {p for p, _, _ in removes}, adds)

    def configuration(self) -> dict[str, str]:
        """The table's properties as of :attr:`version`."""
        if self._metadata is not None:
            return dict(self._metadata.get("configuration") or {})
        return dict(self.table.metadata().configuration)

    def _metadata_action(self) -> dict[str, Any]:
        """The table's metaData action as of :attr:`version`, as delta-rs writes it."""
        if self._metadata is not None:
            return dict(self._metadata)
        m = self.table.metadata()
        return {"id": m.id, "name": m.name, "description": m.description,
                "format": {"provider": "parquet", "options": {}}, "schemaString": self.table.schema().to_json(),
                "partitionColumns": list(m.partition_columns), "createdTime": m.created_time,
                "configuration": dict(m.configuration)}

    def set_properties_with_deltalake(self, properties: Mapping[str, str]) -> int:
        """Set table properties through delta-rs (a metaData commit of its own): the path of a
        table that :meth:`rewrite` cannot commit to. Returns the version."""
        table = self.sync_handle()
        table.alter.set_table_properties(dict(properties))  # a failure: the caller re-reads the table
        self._rebase(table.version(), ours=True)
        self._metadata = None  # the handle holds the new metadata
        return self.version

    def _check_fresh(self) -> None:
        if time.monotonic() - self._synced > STALE_AFTER_S:
            self.reload()
            raise delta.ConcurrentCommit(f"{self.uri}: snapshot older than {STALE_AFTER_S:g} s, re-read the table")

    def _commit(self, actions: list[dict[str, Any]], commit_id: str, apps: Mapping[str, int], removing: set[str],
                adds: list[dict[str, Any]]) -> int:
        """Create the next free commit file holding ``actions``, stepping over others' commits that
        do not conflict (see the module); the data files of ``adds`` are deleted when it gives up."""
        try:
            return self._commit_once(actions, commit_id, apps, removing, adds)
        finally:
            for add in adds:
                self._written.pop(add["path"], None)

    def _commit_once(self, actions: list[dict[str, Any]], commit_id: str, apps: Mapping[str, int],
                     removing: set[str], adds: list[dict[str, Any]]) -> int:
        vanished = 0
        body = b""
        while True:
            # Not once a slot answered taken but unreadable: it may hold our own commit, naming the
            # files as they are.
            if (not vanished and self._refresh_stale_files(adds)) or not body:
                body = ("\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n").encode()
            version = self.version + 1
            name = delta.commit_file(version)
            try:
                created = self._io(f"commit version {version} to",
                                   lambda name=name, body=body: self.root.put_if_absent(body, *self.segments, "_delta_log", name))
            except StorageError as e:
                created = self._slot_after_failed_put(version, e)
            if created:
                self._apply(version, actions, foreign=False)
                if version % CHECKPOINT_INTERVAL == 0:
                    self._checkpoint(version)
                return version
            theirs = self._tail.read_commit(version)
            if theirs is None:
                # Taken, yet nothing to read: a put racing a delete, or a store answering
                # inconsistently. Retried a few times, never forever.
                vanished += 1
                if vanished >= MAX_VANISHED_SLOTS:
                    self._discard_all(adds)
                    raise StorageError(
                        f"{self.uri}: version {version} answered that it exists but it cannot be read ({vanished} "
                        "times): the table was deleted, or the store does not answer consistently; open it again")
                delta.backoff(vanished, base=0.01, cap=0.2)
                continue
            if any(a.get("commitInfo", {}).get("txnId") == commit_id for a in theirs):
                self._apply(version, actions, foreign=False)  # our own put, whose response was lost
                return version
            self._apply(version, theirs)
            if any("metaData" in a or "protocol" in a for a in theirs):
                self._discard_all(adds)
                self.reload()
                raise delta.ConcurrentCommit(f"{self.uri}: table metadata changed at version {version}")
            clash = sorted(a["txn"]["appId"] for a in theirs if "txn" in a and a["txn"]["appId"] in apps)
            if clash:
                self._discard_all(adds)
                raise delta.ConcurrentCommit(f"{self.uri}: version {version} also set {', '.join(clash)}")
            if removing and any("remove" in a and a["remove"]["path"] in removing for a in theirs):
                self._discard_all(adds)
                raise delta.ConcurrentCommit(f"{self.uri}: version {version} removed files this compaction removes")

    def _slot_after_failed_put(self, version: int, error: StorageError) -> bool:
        """A put that raised has an unknown outcome, whatever the error says (the write may have
        happened and only its answer failed): the slot is read back, never guessed. Empty: the put
        did not happen (as far as anyone can tell now), and its error stands. The commit's data
        files are kept: on an object store a put whose request failed can still land later, and
        a commit naming a deleted file would break every reader of the table, where an orphaned
        file costs only space until vacuum. Taken: False, and the caller's read-back tells our own
        commit (a lost answer) from another writer's.

        A read-back that fails is tried again, whatever its error, for the storage retry budget
        (``PULSARTX_STORAGE_RETRY_SECONDS``), with the table's append lock still held: an unknown
        outcome reported to a producer is one its application may resend under new sequence ids,
        written twice if the put had landed, and nothing of the partition may be appended meanwhile
        (a later batch's higher ids would make a resend of this one look like a duplicate).
        Unreadable for the whole budget: OutcomeUnknown, the files kept."""
        taken = self._read_back(version, error) is not None
        if not taken:
            raise error
        return False

    def _read_back(self, version: int, error: StorageError) -> list[dict[str, Any]] | None:
        try:
            return delta.retrying(f"read back commit {version} of", self.uri, lambda: self._tail.read_commit(version),
                                  root=self.root, every_error=True)
        except Exception as e:
            raise delta.OutcomeUnknown(
                f"{self.uri}: committing version {version} failed ({error}) and reading it back failed too "
                f"({delta.describe(e, delta.secrets_of(self.root))}): whether it was written is unknown; "
                "re-read the table before acting on it") from error

    def _write_data_file(self, data: pa.Table, now: int, codecs: Mapping[str, str] | None,
                         unique: str) -> dict[str, Any]:
        name = f"part-00000-{unique}-c000.zstd.parquet"
        size = self._io("write a data file to", lambda: delta.put_parquet(self.root, self.segments, name, data, codecs))
        stats = delta.file_stats(data, self._stats)
        self._written[name] = delta.since_boot()
        return {"path": name, "partitionValues": {}, "size": size, "modificationTime": now, "dataChange": True,
                "stats": stats}

    def _refresh_stale_files(self, adds: list[dict[str, Any]]) -> bool:
        """Copy every data file of ``adds`` written ``delta.STALE_DATA_FILE_S`` or more ago to a
        new name (a new object, so vacuum sees it as new), and point its add action there, until
        none is that old (a copy may take a pause too); True if any was copied. A file already gone
        cannot be committed: StorageError, nothing committed (the caller's data fails, as on any
        failed commit, and is not half-written). On any failure the files are deleted, as when a
        commit gives up: no put of this commit can be pending here."""
        refreshed = False
        try:
            while True:
                stale = [a for a in adds if delta.file_age_s(a["modificationTime"], self._written.get(a["path"]))
                         >= delta.STALE_DATA_FILE_S]
                if not stale:
                    return refreshed
                for add in stale:
                    self._copy_stale_file(add)
                refreshed = True
        except BaseException:
            self._discard_all(adds)
            raise

    def _copy_stale_file(self, add: dict[str, Any]) -> None:
        old, new = add["path"], f"part-00000-{uuid.uuid4()}-c000.zstd.parquet"
        waited = delta.file_age_s(add["modificationTime"], self._written.get(old))
        log.warning("%s: data file %s was written %.0f s ago and is not committed yet; copying it to %s first, as "
                    "a vacuum may delete an unreferenced file that old", self.uri, old, waited, new)
        written, boot = int(time.time() * 1000), delta.since_boot()
        try:
            self._io("copy a data file of", lambda: delta.copy_file(self.root, self.segments, old, new))
        except StorageError as e:
            if not isinstance(e.__cause__, FileNotFoundError):
                raise
            raise StorageError(
                f"{self.uri}: data file {old} was written {waited:.0f} s ago and is gone, most likely deleted by "
                "a vacuum while this writer was paused; nothing was committed, write the data again") from e
        self._discard(add)
        add["path"], add["modificationTime"] = new, written
        self._written[new] = boot

    def _discard_all(self, adds: list[dict[str, Any]]) -> None:
        for add in adds:
            self._discard(add)

    def _discard(self, add: dict[str, Any] | None) -> None:
        """Delete the data file of a commit that lost its race (vacuum would, later)."""
        if add is None:
            return
        name = add["path"]
        self._written.pop(name, None)
        try:
            self.root.rm(*self.segments, name)
        except Exception as e:  # an unreferenced file is harmless
            log.debug("could not delete unreferenced %s of %s: %s", name, self.uri, e)

    def _io(self, what: str, fn: Callable[[], T]) -> T:
        """Transient faults retried (then StorageUnavailable); any other failure a StorageError
        naming the table, as ``delta.write`` reports delta-rs's."""
        try:
            return delta.retrying(what, self.uri, fn, root=self.root)
        except StorageError:
            raise
        except (OSError, pa.ArrowException) as e:
            raise StorageError(f"cannot {what} Delta table {self.uri}: "
                               f"{delta.describe(e, delta.secrets_of(self.root))}") from e

    def _checkpoint(self, version: int) -> None:
        """What delta-rs's post-commit hook does every 100 versions: a checkpoint, so opening the
        table reads one parquet file plus the commits of less than one interval, and (every
        CLEANUP_EVERY-th time) expired-log cleanup; less often on a large table
        (:func:`checkpoint_interval`). In the background: written by pulsartx it costs ~15 ms of
        CPU on a small table (60-90 ms through delta-rs, which replays the commits since the last
        checkpoint twice), which on the appender's path would add ~0.15 ms to every protocol step."""
        if checkpoint_due(self.uri, version):
            schedule_checkpoint(self.root, self.segments, version)

    def write_with_deltalake(self, data: pa.Table, *, mode: str = "append", apps: Mapping[str, int] | None = None,
                             metadata: Mapping[str, str] | None = None) -> int:
        """A write through ``write_deltalake`` (the general path, and overwrites such as compaction),
        keeping our state exact: delta-rs checks app ids against its handle's snapshot, so the
        handle is first brought up to date when our view is ahead of it (always for an overwrite,
        which must replace every current file); delta-rs rebases over commits that share no app id
        with ours, and we read those so ``on_commit`` sees them."""
        apps = dict(apps or {})
        if mode != "append" or any(a in self._apps for a in apps):
            self.sync_handle()
        try:
            version = delta.write(self.table, data, app_transactions=apps or None, metadata=metadata, mode=mode,
                                  tail=self._tail)
        except delta.ConcurrentCommit:
            # delta-rs checks against its handle's snapshot, and a conflict it finds there (another
            # writer's metadata change or compaction) stays for every retry from that handle, however
            # far catch_up has read: the retry must start from the latest snapshot.
            try:
                self.sync_handle()
            except Exception as e:  # the conflict stands; the next write syncs again
                log.debug("%s: bringing the handle up after a conflict failed: %s", self.uri, e)
            raise
        self._rebase(version, ours=True)
        return version
