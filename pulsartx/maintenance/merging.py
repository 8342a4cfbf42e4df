"""Small-file merging: keep a busy partition's file count (and so its checkpoints, its file
index and every reader's planning) from growing with its history.

A small transaction appends one file per participant and one more for its marker, so a busy
partition gains thousands of files a minute. Merging rewrites runs of consecutive files into one,
*without dropping or changing a row*: offsets, markers, aborted data and open transactions' data
all stay as they were. That is why it needs no transaction state and no horizon, unlike compaction
(``compaction.py``), and may run in the writing process at any time. The commit is an OPTIMIZE at
``dataChange=false`` (docs/design/compaction-commits.md).

The plan is size-tiered, as in an LSM tree: a file's tier is ``floor(log_FANOUT(records))``, and
the oldest run of ``FANOUT`` consecutive files of one tier becomes one file of the next tier. Each
row is so rewritten about ``log_FANOUT(rows)`` times over its life, never once per merge, and files
of ``FANOUT ** MAX_TIER`` records or more are left alone.
"""
from __future__ import annotations

import logging
import math

from pulsartx import forks
from pulsartx.log import partition as partition_log
from pulsartx.log.index import DataFile
from pulsartx.log.partition import PartitionLog, read_files
from pulsartx.naming import TopicName
from pulsartx.storage.appender import wait_for_checkpoints
from pulsartx.storage.pools import ProcessPool
from pulsartx.storage.retry import OutcomeUnknown
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)
FANOUT = 32
MAX_TIER = 3  # files of FANOUT**3 (32,768) records or more are never merged
MAX_RUNS_PER_PASS = 8
_POOL = ProcessPool(1, "pulsartx-merge")
# The partitions with a merge queued or running. A forked child runs none of its parent's queued
# merges (left queued, those partitions would never be merged here); its lock may have been held
# by the parent's merge thread.
_QUEUED: forks.ProcessCache[tuple[str, str], bool] = forks.ProcessCache()


def tier(records: int) -> int:
    return 0 if records < FANOUT else int(math.log(records, FANOUT) + 1e-9)


def plan_run(files: list[DataFile]) -> list[DataFile] | None:
    """The oldest run of FANOUT consecutive files (in offset order) of one tier below MAX_TIER."""
    start = 0
    for i in range(1, len(files) + 1):
        if i == len(files) or tier(files[i].num_records) != tier(files[start].num_records):
            t = tier(files[start].num_records)
            if i - start >= FANOUT and t < MAX_TIER:
                return files[start:start + FANOUT]
            start = i
    return None


def merge_small_files(root: StorageRoot, partition: TopicName, max_runs: int = MAX_RUNS_PER_PASS) -> int:
    """Merge up to ``max_runs`` runs; returns how many files were replaced. A concurrent change to
    the same files (another merge, a compaction, retention) makes it stop until the next pass."""
    return merge_through(PartitionLog(root, partition, remember_rows=False), max_runs)  # one pass, then dropped


def merge_through(plog: PartitionLog, max_runs: int = MAX_RUNS_PER_PASS) -> int:
    """:func:`merge_small_files` through ``plog``'s own writer and file index: a writing process
    passes its shared log, whose writer is open and caught up and whose rows of the files it wrote
    are still in memory (:meth:`PartitionLog.remembered_rows`), so such a run is merged without a
    read of the log or of a data file. A run with any file it did not write (or no longer holds)
    is read back from storage."""
    if not plog.can_merge_files():  # a store without put-if-absent: left to `pulsartx compact`, nothing read
        return 0
    merged = 0
    for _ in range(max_runs):
        index = plog.refresh()
        run = plan_run(index.files)
        if run is None:
            break
        rows = plog.remembered_rows(run)
        if rows is None:
            rows = read_files(plog.root, plog.segments, run, run[0].min_offset, run[-1].max_offset + 1)
        rows = rows.combine_chunks()  # one chunk a column: the parquet encoding of 32 costs about twice as much
        expected = sum(f.num_records for f in run)
        offsets = rows.column("offset")
        if rows.num_rows != expected or (expected and (offsets[0].as_py(), offsets[-1].as_py())
                                         != (run[0].min_offset, run[-1].max_offset)):
            raise RuntimeError(f"{plog.topic}: files {run[0].path}..{run[-1].path} read back "
                               f"{rows.num_rows} rows, their statistics say {expected}")
        if plog.merge_files(run, rows) is None:
            break
        merged += len(run)
    if merged:
        log.debug("merged %d small files of %s", merged, plog.topic)
    return merged


def schedule_merge(root: StorageRoot, partition: TopicName, plog: PartitionLog | None = None) -> None:
    """Merge on the process's merge thread, once per partition at a time, through ``plog`` (the
    writer whose commit asked for it; by default the process's shared one). A failed merge is only
    logged: it changed nothing (its commit either landed whole or not at all), or, its outcome
    unknown, it landed whole or not at all, which the next pass reads from the log."""
    key = (root.url, str(partition))
    with _QUEUED.lock:
        if key in _QUEUED:
            return
        _QUEUED[key] = True

    def run() -> None:
        try:
            merge_through(plog if plog is not None else partition_log.shared_log(root, partition))
        except OutcomeUnknown as e:
            log.info("merging small files of %s failed, outcome unknown (it landed whole or not at all; "
                     "the next pass reads which from the log): %s", partition, e)
        except Exception as e:
            log.info("merging small files of %s failed (nothing changed; retried later): %s", partition, e)
        finally:
            with _QUEUED.lock:
                _QUEUED.pop(key, None)

    try:
        _POOL.get().submit(run)
    except RuntimeError:  # the interpreter is exiting
        with _QUEUED.lock:
            _QUEUED.pop(key, None)


def _merge_after(plog: PartitionLog) -> None:
    schedule_merge(plog.root, plog.topic, plog)


def wait_for_merges() -> None:
    """Block until every merge scheduled so far has run (tests, orderly shutdown)."""
    _POOL.drain()


def wait_for_background_writes() -> None:
    """Block until the merges and checkpoints this process queued so far have been written, so
    that none of them lands after its table was deleted: a merge's put would re-create the
    ``_delta_log`` with one commit far past version 0, or land in a re-created topic's table past a
    gap its readers stop at, and delta-rs would re-create it with only a checkpoint. The merges go
    first: a merge's commit can schedule a checkpoint."""
    wait_for_merges()
    wait_for_checkpoints()


if _merge_after not in partition_log.EVERY_MERGE_INTERVAL:
    partition_log.EVERY_MERGE_INTERVAL.append(_merge_after)
