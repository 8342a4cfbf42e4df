"""A keyed log's checkpoints keep its compactions' tombstones only for a short retention
(keyed_log.TOMBSTONE_RETENTION_S): new tables are created with it, tables created before get it
with their first compaction, and neither the live state nor a reader holding an older snapshot
depends on the tombstones that expire."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pulsartx.exceptions import StorageError
from pulsartx.storage import delta, keyed_log
from pulsartx.storage.appender import DeltaAppender
from pulsartx.storage.keyed_log import RETENTION_PROPERTY, KeyedLog
from pulsartx.storage.root import StorageRoot

SCHEMA = pa.schema([("seq", pa.int64(), False), ("key", pa.string(), False), ("v", pa.string())])


def _log(root: StorageRoot, every: int = 5) -> KeyedLog:
    return KeyedLog(root, ("kl",), SCHEMA, key_of=lambda r: r["key"], name="kl", compact_every=every).open()


def _update(log: KeyedLog, key: str, v: str) -> None:
    log.cas(key, lambda cur: ({"seq": 0, "key": key, "v": v}, None), what=key, keep=lambda r: r["v"] != "dead")


def _state(log: KeyedLog) -> dict[str, str]:
    return {k: r["v"] for k, r in log.rows.items()}


def _configuration(table: Path) -> dict[str, str]:
    return delta.open_table(StorageRoot.resolve(str(table.parent)), table.name).metadata().configuration


def _commits(table: Path) -> list[list[dict]]:
    return [[json.loads(line) for line in f.read_text().splitlines()]
            for f in sorted((table / "_delta_log").glob("*.json"))]


def _removed(table: Path, since: int = 0) -> set[str]:
    return {a["remove"]["path"] for c in _commits(table)[since:] for a in c if "remove" in a}


def _checkpoint_removes(root: StorageRoot, table: Path) -> set[str]:
    t = delta.open_table(root, "kl")
    t.create_checkpoint()
    cp = table / "_delta_log" / f"{t.version():020d}.checkpoint.parquet"
    return {r["path"] for r in pq.read_table(cp, columns=["remove"]).column("remove").to_pylist() if r}


def _old_style_table(root: StorageRoot) -> None:
    """A keyed log as created before the short retention: statistics on seq, Delta's default retention."""
    delta.create_table(root, SCHEMA, "kl", name="kl", configuration=delta.stats_config(["seq"]))


def test_a_new_keyed_log_has_the_short_retention(tmp_path):
    _log(StorageRoot.resolve(str(tmp_path)))
    conf = _configuration(tmp_path / "kl")
    assert conf == {"delta.dataSkippingStatsColumns": "seq",
                    RETENTION_PROPERTY: f"interval {keyed_log.TOMBSTONE_RETENTION_S} seconds"}


def test_an_older_keyed_log_gets_it_with_its_first_compaction_while_another_writer_races(tmp_path):
    root = StorageRoot.resolve(str(tmp_path))
    table = tmp_path / "kl"
    _old_style_table(root)
    a, b = _log(root), _log(root)  # b: another process's writer, opened before the upgrade
    model: dict[str, str] = {}
    for i in range(4):
        _update(a, f"k{i}", "v0")
        model[f"k{i}"] = "v0"
    assert RETENTION_PROPERTY not in _configuration(table)  # plain writes leave the metadata alone
    _update(a, "k4", "v0")  # the 5th file: compacts, upgrading the table in the same commit
    model["k4"] = "v0"
    assert a.files_since_compaction == 0
    [upgrade] = [c for c in _commits(table) if any("metaData" in x for x in c)][1:]
    assert [next(iter(x)) for x in upgrade][:2] == ["commitInfo", "metaData"]
    assert any("remove" in x for x in upgrade) and any("add" in x for x in upgrade)
    meta = next(x["metaData"] for x in upgrade if "metaData" in x)
    created = next(x["metaData"] for x in _commits(table)[0] if "metaData" in x)
    assert meta == {**created, "configuration": {**created["configuration"],
                                                 RETENTION_PROPERTY: "interval 60 seconds"}}
    t = delta.open_table(root, "kl")
    assert (t.protocol().min_reader_version, t.protocol().min_writer_version) == (1, 2)
    assert t.metadata().configuration[RETENTION_PROPERTY] == "interval 60 seconds"
    # b's next write steps onto the metadata change: it re-reads the table and retries, exactly.
    _update(b, "k0", "vb")
    model["k0"] = "vb"
    for log in (a, b, _log(root)):
        log.refresh()
        assert _state(log) == model
    # Later compactions leave the metadata alone.
    versions = len(_commits(table))
    for i in range(10):
        _update(a, f"k{i % 5}", f"v{i}")
        model[f"k{i % 5}"] = f"v{i}"
    assert not any("metaData" in x for c in _commits(table)[versions:] for x in c)
    assert _state(_log(root)) == model


def test_the_upgrade_through_delta_rs_when_the_store_has_no_conditional_put(tmp_path, monkeypatch):
    monkeypatch.setattr(StorageRoot, "has_put_if_absent", property(lambda self: False))
    root = StorageRoot.resolve(str(tmp_path))
    _old_style_table(root)
    log = _log(root)
    assert not log._appender.fast
    model = {}
    for i in range(7):
        _update(log, f"k{i}", "v0")
        model[f"k{i}"] = "v0"
    assert _configuration(tmp_path / "kl")[RETENTION_PROPERTY] == "interval 60 seconds"
    assert _state(log) == model
    assert _state(_log(root)) == model


def test_a_failing_upgrade_warns_once_and_the_log_still_compacts(tmp_path, monkeypatch, caplog):
    """Without conditional put the upgrade is a delta-rs commit of its own; one that keeps failing
    must neither stop compaction (every open would read the whole history) nor go unseen."""
    monkeypatch.setattr(StorageRoot, "has_put_if_absent", property(lambda self: False))

    def refuse(self, properties):
        raise StorageError("metadata writes are not allowed here")

    monkeypatch.setattr(DeltaAppender, "set_properties_with_deltalake", refuse)
    root = StorageRoot.resolve(str(tmp_path))
    table = tmp_path / "kl"
    _old_style_table(root)
    first, second = _log(root), _log(root)  # two logs of the table in one process
    model: dict[str, str] = {}
    with caplog.at_level(logging.DEBUG, logger="pulsartx.storage.keyed_log"):
        for i in range(24):
            log = first if i % 2 == 0 else second
            _update(log, f"k{i % 7}", f"v{i}")
            model[f"k{i % 7}"] = f"v{i}"
    overwrites = [c for c in _commits(table)
                  if any(x.get("commitInfo", {}).get("operationParameters", {}).get("mode") == "Overwrite" for x in c)]
    assert len(overwrites) >= 3  # compaction went on without the upgrade
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1  # once per table and process, not per attempt nor per log instance
    message = warnings[0].getMessage()
    assert str(table) in message and RETENTION_PROPERTY in message and "SET TBLPROPERTIES" in message
    assert len([r for r in caplog.records if "failed again" in r.getMessage()]) >= 2
    assert RETENTION_PROPERTY not in _configuration(table)
    for log in (first, second):
        log.refresh()
        assert _state(log) == model
    assert _state(_log(root)) == model


def test_checkpoints_drop_expired_tombstones_and_older_snapshots_still_read(tmp_path, monkeypatch):
    monkeypatch.setattr(keyed_log, "TOMBSTONE_RETENTION_S", 1)
    root = StorageRoot.resolve(str(tmp_path))
    table = tmp_path / "kl"
    writer = _log(root)
    model: dict[str, str] = {}
    for i in range(10):
        _update(writer, f"k{i}", "v0")
        model[f"k{i}"] = "v0"
    reader = _log(root)  # opened before the compactions below; it will not look until the end
    before = reader.version
    old_rows = delta.open_table(root, "kl", version=before).to_pyarrow_table().to_pylist()
    for step in range(20):  # four compactions: every file the reader has not read yet is removed
        _update(writer, f"k{step % 12}", f"v{step}")
        model[f"k{step % 12}"] = f"v{step}"
    expired = _removed(table)
    assert writer.files_since_compaction == 0 and len(expired) > 20
    time.sleep(1.2)
    versions = len(_commits(table))
    for step in range(5):  # one more compaction: its tombstones are fresh
        _update(writer, f"k{step}", f"w{step}")
        model[f"k{step}"] = f"w{step}"
    fresh = _removed(table, versions)
    assert writer.files_since_compaction == 0 and fresh
    kept = _checkpoint_removes(root, table)
    assert kept <= fresh  # none of the expired ones (the fresh ones too, if the checkpoint came late)
    assert not kept & expired

    # The live state is exact through every reader: delta-rs from the checkpoint, our own reads.
    live = delta.open_table(root, "kl")
    latest = {r["key"]: r["v"] for r in sorted(live.to_pyarrow_table().to_pylist(), key=lambda r: r["seq"])}
    assert latest == model  # replay: the highest seq per key
    assert set(delta.read_checkpointed_snapshot(root, ("kl",)).adds) == writer._active
    assert _state(_log(root)) == model
    # A snapshot older than the compactions still reads its rows: the removed files stay on disk.
    again = delta.open_table(root, "kl", version=before).to_pyarrow_table().to_pylist()
    assert sorted(again, key=lambda r: r["key"]) == sorted(old_rows, key=lambda r: r["key"])
    # ... and the reader that held it catches up over the commits it missed, whose files are gone
    # from the table (and whose tombstones from the checkpoint), exactly.
    assert reader.version == before
    reader.refresh()
    assert _state(reader) == model


@pytest.mark.parametrize("seconds", [1, 60])
def test_the_property_follows_the_constant(tmp_path, monkeypatch, seconds):
    monkeypatch.setattr(keyed_log, "TOMBSTONE_RETENTION_S", seconds)
    assert keyed_log.table_properties()[RETENTION_PROPERTY] == f"interval {seconds} seconds"
