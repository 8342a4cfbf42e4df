"""Transaction-buffer snapshots: the folded state of a partition, persisted as a small Delta table
so that rebuilding it costs the snapshot plus the records after it (Pulsar's TB snapshots).

Each snapshot replaces the previous one in a single overwrite commit; any snapshot is valid,
because the fold is deterministic over a prefix of the log, so concurrent writers need no
coordination (a losing overwrite is simply skipped).

Each overwrite leaves a tombstone of the files it replaced, and a checkpoint carries them for the
table's ``delta.deletedFileRetentionDuration``. The table keeps them 60 s, as keyed logs do, not
Delta's default 7 days: a snapshot is only ever read at its newest commit, within milliseconds of
finding its files, and nothing in pulsartx vacuums it
(docs/design/short-tombstone-retention-for-buffer-snapshots.md). A table created before gets the
property at its next snapshot.
"""
from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from pulsartx.buffer.state import BufferState
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName
from pulsartx.storage import delta
from pulsartx.storage.keyed_log import missing_retention, short_tombstone_retention
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)

SNAPSHOT_SCHEMA = pa.schema([
    pa.field("kind", pa.string(), False),  # META, ONGOING, ENDED, ABORTED, RANGE, STRAGGLERS
    pa.field("txn_key", pa.int64()),
    pa.field("offset", pa.int64()),
    pa.field("first_offset", pa.int64()),
    pa.field("last_offset", pa.int64()),
])


LIVE_LOOKBACK = 8  # commits read back from the newest one to find the live snapshot (then: open the table)


def _overwrite(actions: list[dict]) -> bool:
    return any(a.get("commitInfo", {}).get("operationParameters", {}).get("mode") == "Overwrite" for a in actions)


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
    """Column-wise per kind: a snapshot holds thousands of ENDED/ABORTED rows (up to twice
    MAX_ENDED committed ones, plus those their TCs have not finished, plus every aborted
    transaction still in the log)."""
    import pyarrow.compute as pc

    s = BufferState()
    kinds = t.column("kind")

    def rows(*kind: str) -> dict[str, list]:
        return t.filter(pc.is_in(kinds, pa.array(kind))).to_pydict()  # in table order

    r = rows("META")
    for o, first in zip(r["offset"], r["first_offset"], strict=True):
        s.end_offset = o
        s.trimmed_below = first or 0
    r = rows("ONGOING")
    s.ongoing.update(zip(r["txn_key"], r["offset"], strict=True))
    s.last_data.update((k, last) for k, last in zip(r["txn_key"], r["last_offset"], strict=True) if last is not None)
    r = rows("ENDED", "ABORTED")  # together: the ended map keeps its marker order
    s.ended.update(zip(r["txn_key"], r["offset"], strict=True))
    s.aborted.update((k, o) for kind, k, o in zip(r["kind"], r["txn_key"], r["offset"], strict=True) if kind == "ABORTED")
    s.last_data.update((k, last) for k, last in zip(r["txn_key"], r["last_offset"], strict=True) if last is not None)
    r = rows("RANGE")
    for k, first, last in zip(r["txn_key"], r["first_offset"], r["last_offset"], strict=True):
        rs = s.ranges.setdefault(k, [])
        if first is not None:
            rs.append((first, last))
    r = rows("STRAGGLERS")
    s.stragglers.extend(zip(r["first_offset"], r["last_offset"], strict=True))
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
        live = self._live_files()
        if live is None:  # not the shape this store writes: ask delta-rs
            t = delta.open_table(self.root, *self.segments)
            if t is None:
                return None
            live = [str(p) for p in delta.add_actions(t).column("path").to_pylist()]
        files = [self.root.fs_path(*self.segments, p) for p in live]
        if not files:
            return None
        return table_to_state(delta.read_parquet(self.root, files, SNAPSHOT_SCHEMA))

    def _live_files(self) -> list[str] | None:
        """The snapshot's data files from the log's newest commits, without loading the table.

        Every commit this store makes is a whole overwrite, so the newest commit that adds files
        holds all of the live ones; commits after it may only leave the files alone (e.g. a
        vacuum). One listing and a read or two, where opening the table reads its checkpoint,
        which grows with every overwrite's tombstones (at 10,000 transactions it took 3 ms of a
        14 ms read-state). None when the log is not in that shape: the caller opens the table."""
        names = self.root.listdir(*self.segments, "_delta_log")
        versions = sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())
        if not versions:
            return [] if not names else None
        tail = delta.LogTail(self.root, self.segments)
        # A listing may miss the commits being created as it runs (readdir racing their creator,
        # an object store's listing lagging its PUT): the ones after its newest are probed, as
        # commits are contiguous. Otherwise an older snapshot would load, perhaps older than the
        # log's start after a retention, with transactions whose markers are gone left open.
        while tail.has_commit(versions[-1] + 1):
            versions.append(versions[-1] + 1)
        for v in reversed(versions[-LIVE_LOOKBACK:]):
            actions = tail.read_commit(v)
            if actions is None or any("remove" in a and not _overwrite(actions) for a in actions):
                return None
            adds = [a["add"]["path"] for a in actions if "add" in a]
            if adds:
                return adds if _overwrite(actions) else None
            if v == 0:
                return []  # created, never written
        return None

    def save(self, state: BufferState) -> bool:
        if not self.write(state_to_table(state)):
            return False
        state.snapshot_offset = state.end_offset
        state.markers_since_snapshot = 0
        return True

    def write(self, table: pa.Table) -> bool:
        """Write a snapshot already taken (``state_to_table``); False when it could not be."""
        t = delta.open_table(self.root, *self.segments)
        if t is None:
            delta.create_table(self.root, SNAPSHOT_SCHEMA, *self.segments, name="transaction-buffer-snapshot",
                               configuration={**delta.stats_config(["offset"]), **short_tombstone_retention()})
            t = delta.open_table(self.root, *self.segments)
        self._upgrade(t)
        try:
            # With the log to read back: a snapshot whose answer was lost is known written, not
            # reported as skipped (or written a second time).
            delta.write(t, table, mode="overwrite", tail=delta.LogTail(self.root, self.segments))
        except Exception as e:
            log.debug("snapshot of %s skipped: %s", self.segments, e)
            return False
        return True

    def _upgrade(self, table: Any) -> None:
        """Give a table created before the short tombstone retention that property: one metadata
        commit, the first time a snapshot is written to it by this version. A failure (a racing
        writer's commit, a store refusing it) costs nothing but the tombstones: the next snapshot
        tries again."""
        missing = missing_retention(table.metadata().configuration)
        if not missing:
            return
        try:
            table.alter.set_table_properties(missing)
        except Exception as e:
            log.debug("snapshot table %s keeps Delta's default tombstone retention for now: %s", self.segments, e)
