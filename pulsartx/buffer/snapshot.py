"""Transaction-buffer snapshots: the folded state of a partition, persisted as a small Delta table
so that rebuilding it costs the snapshot plus the records after it (Pulsar's TB snapshots).

Each snapshot replaces the previous one in a single overwrite commit; any snapshot is valid,
because the fold is deterministic over a prefix of the log, so concurrent writers need no
coordination (a losing overwrite is simply skipped).
"""
from __future__ import annotations

import logging

import pyarrow as pa

from pulsartx.buffer.state import BufferState
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName
from pulsartx.storage import delta
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)

SNAPSHOT_SCHEMA = pa.schema([
    pa.field("kind", pa.string(), False),  # META, ONGOING, ENDED, ABORTED, RANGE, STRAGGLERS
    pa.field("txn_key", pa.int64()),
    pa.field("offset", pa.int64()),
    pa.field("first_offset", pa.int64()),
    pa.field("last_offset", pa.int64()),
])


def snapshot_segments(topic: TopicName, incarnation: str) -> tuple[str, ...]:
    """Snapshots of one incarnation of a partition (its Delta table's id): a deleted and
    re-created topic's partition is a new table, which must never load the old one's state."""
    return ("buffer-snapshots", *topic.path_segments(), f"partition-{topic.partition}", incarnation)


def topic_snapshots(topic: TopicName) -> tuple[str, ...]:
    """Where every snapshot of a topic's partitions lives (removed with the topic)."""
    return ("buffer-snapshots", *topic.base.path_segments())


def state_to_table(s: BufferState) -> pa.Table:
    rows = [{"kind": "META", "txn_key": None, "offset": s.end_offset, "first_offset": s.trimmed_below,
             "last_offset": None}]
    rows += [{"kind": "ONGOING", "txn_key": k, "offset": o, "first_offset": None, "last_offset": s.last_data.get(k)}
             for k, o in s.ongoing.items()]
    rows += [{"kind": "ABORTED" if k in s.aborted else "ENDED", "txn_key": k, "offset": o, "first_offset": None,
              "last_offset": s.last_data.get(k)} for k, o in s.ended.items()]
    rows += [{"kind": "RANGE", "txn_key": k, "offset": None, "first_offset": a, "last_offset": b}
             for k, rs in s.ranges.items() for a, b in rs]
    # A commit that listed no entries here shows nothing: kept as a RANGE row without offsets.
    rows += [{"kind": "RANGE", "txn_key": k, "offset": None, "first_offset": None, "last_offset": None}
             for k, rs in s.ranges.items() if not rs]
    rows += [{"kind": "STRAGGLERS", "txn_key": None, "offset": None, "first_offset": a, "last_offset": b}
             for a, b in s.stragglers]
    return pa.Table.from_pylist(rows, schema=SNAPSHOT_SCHEMA)


def table_to_state(t: pa.Table) -> BufferState:
    s = BufferState()
    cols = t.to_pydict()  # column lists, not row dicts: snapshots hold up to MAX_ENDED rows
    for kind, k, o, first, last in zip(cols["kind"], cols["txn_key"], cols["offset"], cols["first_offset"],
                                       cols["last_offset"], strict=True):
        if kind == "META":
            s.end_offset = o
            s.trimmed_below = first or 0
        elif kind == "ONGOING":
            s.ongoing[k] = o
            if last is not None:
                s.last_data[k] = last
        elif kind in ("ENDED", "ABORTED"):
            s.ended[k] = o
            if kind == "ABORTED":
                s.aborted[k] = o
            if last is not None:
                s.last_data[k] = last
        elif kind == "RANGE":
            rs = s.ranges.setdefault(k, [])
            if first is not None:
                rs.append((first, last))
        elif kind == "STRAGGLERS":
            s.stragglers.append((first, last))
    s.rebuild_plain_ended()
    s.snapshot_offset = s.end_offset
    return s


class SnapshotStore:
    def __init__(self, root: StorageRoot, topic: TopicName, incarnation: str | None = None):
        """``incarnation``: the partition table's Delta id (default: the current table's)."""
        self.root = root
        if incarnation is None:
            incarnation = PartitionLog(root, topic).table_id
        self.segments = snapshot_segments(topic, incarnation)

    def load(self) -> BufferState | None:
        t = delta.open_table(self.root, *self.segments)
        if t is None:
            return None
        import pyarrow.dataset as ds

        files = [self.root.fs_path(*self.segments, str(p))
                 for p in pa.table(t.get_add_actions(flatten=True)).column("path").to_pylist()]
        if not files:
            return None
        table = ds.dataset(files, schema=SNAPSHOT_SCHEMA, format="parquet", filesystem=self.root.arrow_fs).to_table()
        return table_to_state(table)

    def save(self, state: BufferState) -> bool:
        t = delta.open_table(self.root, *self.segments)
        if t is None:
            delta.create_table(self.root, SNAPSHOT_SCHEMA, *self.segments, name="transaction-buffer-snapshot",
                               configuration=delta.stats_config(["offset"]))
            t = delta.open_table(self.root, *self.segments)
        try:
            delta.write(t, state_to_table(state), mode="overwrite")
        except Exception as e:
            log.debug("snapshot of %s skipped: %s", self.segments, e)
            return False
        state.snapshot_offset = state.end_offset
        state.markers_since_snapshot = 0
        return True
