"""The only Delta operations pulsartx needs: create, open, write a data file, commit files with a
compare-and-set, and tail the commit log.

Why pre-written files plus ``create_write_transaction`` instead of ``write_deltalake``: we choose the
file name and the statistics (min/max offset drive every range read), we can retry a conflicted
commit without re-reading the table, and a commit costs ~8 ms instead of ~25 ms.

The compare-and-set: a commit carrying ``Transaction(app_id, v)`` fails if any commit after the
writer's snapshot set the same app_id. delta-rs does not check ``v`` itself, so callers compare the
snapshot's ``transaction_version`` before committing (see notes/deltalake.md).
"""
from __future__ import annotations

import datetime as dt_
import json
import logging
import math
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pulsartx.exceptions import CorruptedLog, StorageError
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)
_EPOCH = dt_.datetime(1970, 1, 1, tzinfo=dt_.UTC)


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


def _stat_value(v: Any) -> Any:
    if isinstance(v, dt_.datetime):
        return v.astimezone(dt_.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return v


def _ts_bound(scalar: pa.Scalar, up: bool) -> str | None:
    """Delta keeps timestamp stats at millisecond precision: round outward so pruning stays correct."""
    if not scalar.is_valid:
        return None
    micros = scalar.cast(pa.int64()).as_py()
    millis = math.ceil(micros / 1000) if up else math.floor(micros / 1000)
    return _stat_value(_EPOCH + dt_.timedelta(milliseconds=millis))


def file_stats(table: pa.Table, columns: Iterable[str]) -> str:
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in columns:
        col = table.column(name)
        nulls[name] = col.null_count
        if col.null_count == len(col) or len(col) == 0:
            continue
        mm = pc.min_max(col)
        if pa.types.is_timestamp(col.type):
            mins[name], maxs[name] = _ts_bound(mm["min"], False), _ts_bound(mm["max"], True)
        else:
            mins[name], maxs[name] = mm["min"].as_py(), mm["max"].as_py()
    return json.dumps({"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls})


def write_data_file(root: StorageRoot, table: pa.Table, segments: tuple[str, ...], prefix: str,
                    stats_columns: Iterable[str]) -> Any:
    """Write one parquet file into a table's folder and return its (uncommitted) AddAction.

    An uncommitted file is invisible to every Delta reader; if the commit never happens, vacuum
    removes it.
    """
    dl = _deltalake()
    name = f"{prefix}-{uuid.uuid4().hex}.parquet"
    path = root.fs_path(*segments, name)
    try:
        pq.write_table(table, path, filesystem=root.arrow_fs, compression="zstd", compression_level=1,
                       write_statistics=list(stats_columns))
        size = root.arrow_fs.get_file_info(path).size
    except OSError as e:
        raise StorageError(f"cannot write data file {root.uri(*segments, name)}: {e}") from e
    return dl.transaction.AddAction(name, size, {}, int(time.time() * 1000), True, file_stats(table, stats_columns))


def commit(table: Any, schema: pa.Schema, *, adds: list[Any] = (), removes: list[Any] = (),
           app_transactions: Mapping[str, int] | None = None, metadata: Mapping[str, str] | None = None,
           mode: str = "append") -> None:
    """Commit files atomically; raise :class:`ConcurrentCommit` when an app-transaction CAS lost."""
    dl = _deltalake()
    props = dl.CommitProperties(
        custom_metadata=dict(metadata) if metadata else None,
        # last_updated lets delta.setTransactionRetentionDuration expire idle app ids (producers, markers).
        app_transactions=[dl.Transaction(k, int(v), int(time.time() * 1000))
                          for k, v in (app_transactions or {}).items()] or None,
        max_commit_retries=32,
    )
    try:
        table.create_write_transaction(list(adds) + list(removes), mode=mode, schema=schema, commit_properties=props)
    except dl.exceptions.CommitFailedError as e:
        raise ConcurrentCommit(str(e)) from e


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
