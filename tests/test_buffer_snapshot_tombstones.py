"""Buffer-snapshot tables keep their overwrites' tombstones only for the keyed logs' short retention
(keyed_log.TOMBSTONE_RETENTION_S): every snapshot is an overwrite, so with Delta's default 7 days
each checkpoint carried a week of them. New tables are created with it, older ones get it at their
next snapshot, and loads (which only ever read the newest snapshot) read exactly what was written."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq

from pulsartx.buffer.snapshot import SNAPSHOT_SCHEMA, SnapshotStore, state_to_table
from pulsartx.buffer.state import BufferState
from pulsartx.naming import TopicName
from pulsartx.storage import delta, keyed_log
from pulsartx.storage.keyed_log import RETENTION_PROPERTY
from pulsartx.storage.root import StorageRoot

PART = TopicName.parse("snap-partition-0")


def _store(tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(StorageRoot.resolve(str(tmp_path)), PART, "incarnation-1")


def _snapshot(store: SnapshotStore, end: int) -> None:
    s = BufferState(end_offset=end, ended={end - 1: end - 1})
    assert store.write(state_to_table(s))


def _configuration(store: SnapshotStore) -> dict[str, str]:
    return dict(delta.open_table(store.root, *store.segments).metadata().configuration)


def _commits(store: SnapshotStore) -> list[list[dict]]:
    folder = Path(store.root.fs_path(*store.segments, "_delta_log"))
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in sorted(folder.glob("*.json"))]


def test_a_new_snapshot_table_has_the_short_retention(tmp_path):
    store = _store(tmp_path)
    _snapshot(store, 10)
    assert _configuration(store) == {"delta.dataSkippingStatsColumns": "offset",
                                     RETENTION_PROPERTY: f"interval {keyed_log.TOMBSTONE_RETENTION_S} seconds"}
    assert store.load().end_offset == 10


def test_an_older_snapshot_table_gets_it_at_its_next_snapshot(tmp_path):
    store = _store(tmp_path)
    delta.create_table(store.root, SNAPSHOT_SCHEMA, *store.segments, name="transaction-buffer-snapshot",
                       configuration=delta.stats_config(["offset"]))  # as created before
    assert RETENTION_PROPERTY not in _configuration(store)
    _snapshot(store, 10)
    assert _configuration(store)[RETENTION_PROPERTY] == "interval 60 seconds"
    upgrades = [c for c in _commits(store)[1:] if any("metaData" in a for a in c)]
    assert len(upgrades) == 1  # once: later snapshots leave the metadata alone
    for end in (20, 30):
        _snapshot(store, end)
    assert len([c for c in _commits(store)[1:] if any("metaData" in a for a in c)]) == 1
    loaded = store.load()
    assert (loaded.end_offset, dict(loaded.ended)) == (30, {29: 29})
    assert _store(tmp_path).load().end_offset == 30


def test_checkpoints_drop_expired_snapshot_tombstones_and_an_older_version_still_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(keyed_log, "TOMBSTONE_RETENTION_S", 1)
    store = _store(tmp_path)
    _snapshot(store, 1)
    old_version = delta.open_table(store.root, *store.segments).version()
    old_files = [store.root.fs_path(*store.segments, p) for p in
                 delta.add_actions(delta.open_table(store.root, *store.segments)).column("path").to_pylist()]
    for end in range(2, 6):
        _snapshot(store, end)
    expired = {a["remove"]["path"] for c in _commits(store) for a in c if "remove" in a}
    time.sleep(1.2)
    versions = len(_commits(store))
    for end in range(6, 9):
        _snapshot(store, end)
    fresh = {a["remove"]["path"] for c in _commits(store)[versions:] for a in c if "remove" in a}
    assert len(expired) == 4 and len(fresh) == 3
    t = delta.open_table(store.root, *store.segments)
    t.create_checkpoint()
    cp = Path(store.root.fs_path(*store.segments, "_delta_log", f"{t.version():020d}.checkpoint.parquet"))
    kept = {r["path"] for r in pq.read_table(cp, columns=["remove"]).column("remove").to_pylist() if r}
    assert kept == fresh
    assert store.load().end_offset == 8
    # A load that found the first snapshot's files before the overwrites still reads them: removed
    # files stay on storage (nothing in pulsartx vacuums snapshot tables).
    assert delta.read_parquet(store.root, old_files, SNAPSHOT_SCHEMA).column("offset").to_pylist()[0] == 1
    assert delta.open_table(store.root, *store.segments, version=old_version).to_pyarrow_table().num_rows == 2


def test_a_listing_that_misses_the_newest_snapshot_commit_still_loads_the_newest(tmp_path):
    """The load lists _delta_log and reads the newest commit it saw; a listing that misses one
    being created (readdir racing a creator, an object-store listing lagging its PUT) loaded an
    older snapshot. Older than a retention's trim, its transactions whose markers were trimmed
    stay open for good."""
    from pulsartx.storage import faults
    from pulsartx.storage.faults import Fault, Mode, Op

    store = _store(tmp_path)
    for end in (10, 20):
        _snapshot(store, end)
    newest = delta.commit_file(delta.open_table(store.root, *store.segments).version())
    faults.install([Fault(Op.LIST, Mode.HIDE, match="_delta_log", hide=newest)])
    try:
        loaded = _store(tmp_path).load()
        assert faults.plan()[0].fired == 1
    finally:
        faults.clear()
    assert loaded.end_offset == 20
