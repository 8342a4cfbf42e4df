"""Publish and consume rates without a broker to count them: figures over a recent window,
read back from what storage keeps.

* publish rate: DATA entries whose publish time falls in the window (only the files whose
  publish-time statistics reach into it are read, two columns of them);
* consume rate: offsets a subscription acknowledged in the window, from the cursor table's
  history (each change is a row restating the cursor, with its time): the acknowledged count now
  minus the count in the last row before the window. After the table's compaction the history
  may begin inside the window; the rate then covers the part still kept, and is a lower bound.
"""
from __future__ import annotations

import json
import time
from typing import Any

import pyarrow.compute as pc

from pulsartx.log.index import FileIndex
from pulsartx.log.partition import read_files
from pulsartx.log.schema import MessageType
from pulsartx.storage import delta
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.store import CURSOR, STATE_SCHEMA

RATE_WINDOW_S = 60.0


def publish_rate(root: StorageRoot, segments: tuple[str, ...], index: FileIndex, window_s: float = RATE_WINDOW_S,
                 now_ms: int | None = None) -> float:
    """DATA entries published per second over the last ``window_s`` seconds."""
    now_us = (int(time.time() * 1000) if now_ms is None else now_ms) * 1000
    cutoff = now_us - int(window_s * 1_000_000)
    files = [f for f in index.files if f.max_publish_us is None or f.max_publish_us >= cutoff]
    if not files:
        return 0.0
    rows = read_files(root, segments, files, index.start_offset, index.end_offset, ["type", "publish_time"])
    recent = pc.and_(pc.equal(rows.column("type"), MessageType.DATA.value),
                     pc.greater_equal(rows.column("publish_time").cast("int64"), cutoff))
    return pc.sum(recent.cast("int64")).as_py() / window_s if rows.num_rows else 0.0


def acknowledged_count(state: dict[str, Any], mark_delete: int) -> int:
    """Offsets acknowledged so far by one cursor row: up to the mark-delete position, plus the
    ranges acknowledged individually above it."""
    return mark_delete + 1 + sum(b - a + 1 for a, b in state.get("acked") or ())


def consume_rate(root: StorageRoot, cursor_segments: tuple[str, ...], window_s: float = RATE_WINDOW_S,
                 now_ms: int | None = None) -> float:
    """Offsets acknowledged per second over the last ``window_s`` seconds (0 without history)."""
    table = delta.open_table(root, *cursor_segments)
    if table is None:
        return 0.0
    files = delta.add_actions(table).column("path").to_pylist()
    if not files:
        return 0.0
    paths = [root.fs_path(*cursor_segments, str(f)) for f in files]
    rows = [r for r in delta.read_parquet(root, paths, STATE_SCHEMA, ["seq", "key", "updated_ms", "mark_delete",
                                                                       "state"]).to_pylist()
            if r["key"] == CURSOR and r["updated_ms"] is not None and r["mark_delete"] is not None]
    if len(rows) < 2:
        return 0.0
    rows.sort(key=lambda r: r["seq"])
    now = int(time.time() * 1000) if now_ms is None else now_ms
    cutoff = now - int(window_s * 1000)
    before = [r for r in rows if r["updated_ms"] <= cutoff]
    base = before[-1] if before else rows[0]
    last = rows[-1]
    done = (acknowledged_count(json.loads(last["state"] or "{}"), last["mark_delete"])
            - acknowledged_count(json.loads(base["state"] or "{}"), base["mark_delete"]))
    return max(done, 0) / window_s
