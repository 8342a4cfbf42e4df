"""The only Delta operations pulsartx needs: create, open, write a data file, commit files with a
compare-and-set, and tail the commit log.

Every write goes through ``write_deltalake`` on a reused DeltaTable handle: re-opening a table
re-reads its log, so latency would grow with history (notes/deltalake.md), whereas a reused
handle is advanced in place by each successful write.

The compare-and-set: a commit carrying ``Transaction(app_id, v)`` fails if any commit after the
writer's snapshot set the same app_id. delta-rs does not check ``v`` itself, so callers compare the
snapshot's ``transaction_version`` before committing (see notes/deltalake.md).
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from pulsartx.exceptions import CorruptedLog, StorageError
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)


class ConcurrentCommit(StorageError):
    """Another writer committed a conflicting version first; reload and retry."""


def _deltalake():
    # Imported lazily: deltalake's runtime panics in a forked child once the parent has used it,
    # and Spark's daemon forks workers (notes/deltalake.md).
    import deltalake

    return deltalake


def open_table(root: StorageRoot, *segments: str, version: int | None = None) -> Any | None:
    """The DeltaTable at ``segments``, or None when no table exists there."""
    dl = _deltalake()
    uri = root.uri(*segments)
    try:
        return dl.DeltaTable(uri, version=version, storage_options=root.delta_options or None)
    except dl.exceptions.TableNotFoundError:
        return None
    except OSError as e:
        raise StorageError(f"cannot open Delta table {uri}: {e}") from e
    except Exception as e:  # delta-rs raises generic errors for corrupt logs
        if "not a Delta table" in str(e) or "No such file" in str(e):
            return None
        raise CorruptedLog(f"Delta table {uri} is unreadable: {e}") from e


def create_table(root: StorageRoot, schema: pa.Schema, *segments: str,
                 configuration: Mapping[str, str] | None = None, name: str | None = None) -> bool:
    """Create an empty table; False when one already exists (the winner of a create race is the
    writer of version 0, which delta-rs makes atomic on every backend)."""
    dl = _deltalake()
    uri = root.uri(*segments)
    if root.is_local:
        import os

        os.makedirs(uri, exist_ok=True)
    try:
        dl.DeltaTable.create(uri, schema, mode="error", name=name, configuration=dict(configuration or {}),
                             storage_options=root.delta_options or None)
        return True
    except Exception as e:
        if "already exists" in str(e).lower() or isinstance(e, FileExistsError):
            return False
        raise StorageError(f"cannot create Delta table {uri}: {e}") from e


_WRITER_PROPERTIES: Any = None


def _writer_properties() -> Any:
    global _WRITER_PROPERTIES
    if _WRITER_PROPERTIES is None:
        _WRITER_PROPERTIES = _deltalake().WriterProperties(compression="ZSTD", compression_level=1)
    return _WRITER_PROPERTIES


def stats_config(columns: Iterable[str]) -> dict[str, str]:
    """Table properties limiting file statistics to the columns we prune on: cheaper writes, and
    the statistics any Delta reader sees are exactly the ones our reads rely on."""
    return {"delta.dataSkippingStatsColumns": ",".join(columns)}


def write(table: Any, data: pa.Table, *, app_transactions: Mapping[str, int] | None = None,
          metadata: Mapping[str, str] | None = None, mode: str = "append") -> int:
    """Write ``data`` as one commit through a reused DeltaTable handle and return the new version.

    ``write_deltalake`` on a handle advances the handle in place (no ``update_incremental``) and
    costs about as much as the raw append. With ``app_transactions`` it is a compare-and-set:
    :class:`ConcurrentCommit` when another commit set one of those app ids after the handle's
    snapshot; the handle is then unchanged and the caller refreshes and retries. A lost attempt
    may leave an unreferenced data file, which vacuum removes.
    """
    dl = _deltalake()
    props = dl.CommitProperties(
        custom_metadata=dict(metadata) if metadata else None,
        # last_updated lets delta.setTransactionRetentionDuration expire idle app ids (producers, markers).
        app_transactions=[dl.Transaction(k, int(v), int(time.time() * 1000))
                          for k, v in (app_transactions or {}).items()] or None,
        max_commit_retries=32,
    )
    try:
        dl.write_deltalake(table, data, mode=mode, writer_properties=_writer_properties(), commit_properties=props)
    except dl.exceptions.CommitFailedError as e:
        raise ConcurrentCommit(str(e)) from e
    except OSError as e:
        raise StorageError(f"cannot write to Delta table {table.table_uri}: {e}") from e
    return table.version()


def txn_version(table: Any, app_id: str) -> int | None:
    """``transaction_version`` with the 0-is-falsy trap avoided (notes/deltalake.md)."""
    v = table.transaction_version(app_id)
    return None if v is None else int(v)


def backoff(attempt: int, base: float = 0.002, cap: float = 0.2) -> None:
    """Jittered exponential backoff between CAS retries, so contending writers spread out."""
    import random

    time.sleep(random.uniform(0, min(cap, base * (2 ** min(attempt, 10)))))


class LogTail:
    """Reads a table's commits after a known version straight from ``_delta_log``.

    This is how readers stay incremental: the cost of catching up is the number of new commits,
    never the length of the history (Delta's own streaming source does the same).
    """

    def __init__(self, root: StorageRoot, segments: tuple[str, ...]):
        self.root = root
        self.segments = segments

    def read_commit(self, version: int) -> list[dict[str, Any]] | None:
        path = self.root.fs_path(*self.segments, "_delta_log", f"{version:020d}.json")
        try:
            raw = self.root.fs.cat_file(path)
        except FileNotFoundError:
            return None
        try:
            return [json.loads(line) for line in raw.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise CorruptedLog(f"commit {version} of {self.root.uri(*self.segments)} is not valid JSON "
                               f"({path}): {e}") from e

    def commits_after(self, version: int) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        v = version + 1
        while True:
            actions = self.read_commit(v)
            if actions is None:
                return
            yield v, actions
            v += 1


def parse_stats(stats: str | None) -> dict[str, Any]:
    return json.loads(stats) if stats else {}


def _ts_stat(micros: int, up: bool) -> str:
    """Delta keeps timestamp stats in milliseconds: round outward so pruning stays correct."""
    import datetime as dt
    import math

    millis = math.ceil(micros / 1000) if up else math.floor(micros / 1000)
    t = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=millis)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def file_stats(table: pa.Table, columns: Iterable[str]) -> str:
    import pyarrow.compute as pc

    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in columns:
        col = table.column(name)
        nulls[name] = col.null_count
        if col.null_count == len(col):
            continue
        mm = pc.min_max(col)
        if pa.types.is_timestamp(col.type):
            lo, hi = mm["min"].cast(pa.int64()).as_py(), mm["max"].cast(pa.int64()).as_py()
            mins[name], maxs[name] = _ts_stat(lo, False), _ts_stat(hi, True)
        else:
            mins[name], maxs[name] = mm["min"].as_py(), mm["max"].as_py()
    return json.dumps({"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls})


def replace_files(root: StorageRoot, table: Any, segments: tuple[str, ...], removes: list[tuple[str, int]],
                  data: pa.Table | None, stats_columns: Iterable[str], data_change: bool = True) -> None:
    """Atomically swap ``removes`` ((path, size) pairs) for one new file holding ``data`` (or for
    nothing): compaction and retention. Removed files stay on disk until vacuum, so readers that
    planned them keep working. Blind appends committed meanwhile are unaffected; a conflict raises
    :class:`ConcurrentCommit` and the caller simply tries again later."""
    import uuid

    import pyarrow.parquet as pq

    dl = _deltalake()
    now = int(time.time() * 1000)
    actions: list[Any] = [dl.transaction.RemoveAction(p, data_change, now, size=s) for p, s in removes]
    if data is not None and data.num_rows:
        name = f"compacted-{uuid.uuid4().hex}.parquet"
        path = root.fs_path(*segments, name)
        pq.write_table(data, path, filesystem=root.arrow_fs, compression="zstd", compression_level=1)
        size = root.arrow_fs.get_file_info(path).size
        actions.append(dl.transaction.AddAction(name, size, {}, now, data_change, file_stats(data, stats_columns)))
    try:
        table.create_write_transaction(actions, mode="append", schema=data.schema if data is not None else
                                       table.schema())
    except dl.exceptions.CommitFailedError as e:
        raise ConcurrentCommit(str(e)) from e
