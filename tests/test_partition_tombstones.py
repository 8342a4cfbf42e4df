"""A topic partition's checkpoints keep its merges' tombstones only for the keyed logs' short
retention (keyed_log.TOMBSTONE_RETENTION_S): new partitions are created with it, partitions created
before get it with their first merge (or, on a store without conditional put, their first
compaction); no reader depends on the tombstones that expire; and pulsartx's vacuum, which lists
the partition's directory instead of reading tombstones, still finds every file removed longer
ago than its retention while keeping whatever that retention protects."""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import deltalake
import pyarrow.parquet as pq
import pytest

import pulsartx
from pulsartx import MessageId, TopicName
from pulsartx.exceptions import StorageError
from pulsartx.log import partition as partition_mod
from pulsartx.log.partition import PartitionLog, build_records, partition_segments
from pulsartx.log.remembered import RememberedRows
from pulsartx.log.schema import PARTITION_TABLE_CONFIG, RECORD_SCHEMA
from pulsartx.maintenance import merging
from pulsartx.maintenance.compaction import compact_partition
from pulsartx.maintenance.merging import merge_through
from pulsartx.maintenance.retention import vacuum
from pulsartx.storage import appender, delta, keyed_log
from pulsartx.storage.appender import DeltaAppender
from pulsartx.storage.checkpoint import write_checkpoint
from pulsartx.storage.keyed_log import RETENTION_PROPERTY
from pulsartx.storage.root import StorageRoot

PART = TopicName.parse("tt-partition-0")
SEGMENTS = partition_segments(PART)
RUN = 4  # files merged into one (merging.FANOUT, small here so the tests stay below a checkpoint interval)


@pytest.fixture(autouse=True)
def _merge_by_hand(monkeypatch):
    """No background merge: each test merges when it means to, runs of RUN files."""
    monkeypatch.setattr(partition_mod, "MERGE_EVERY", 10**9)
    monkeypatch.setattr(partition_mod, "REMEMBERED", RememberedRows())
    monkeypatch.setattr(merging, "FANOUT", RUN)


def _table(root: str) -> Path:
    return Path(root, *SEGMENTS)


def _topic(tmp_path, old_style: bool = False, monkeypatch=None) -> tuple[str, pulsartx.Client]:
    """A store with the one-partition topic ``tt``; ``old_style``: created as before the short
    retention (the partition's properties without it)."""
    root = str(tmp_path / "root")
    client = pulsartx.Client(root)
    if old_style:
        with monkeypatch.context() as m:
            m.setattr(partition_mod, "short_tombstone_retention", lambda: {})
            client.admin.create_topic("tt", 1)
    else:
        client.admin.create_topic("tt", 1)
    return root, client


def _append(plog: PartitionLog, first: int, n: int) -> None:
    for i in range(first, first + n):  # one file (one version) per message
        plog.append(build_records([f"m{i}".encode()]))


def _configuration(root: str) -> dict[str, str]:
    return dict(deltalake.DeltaTable(str(_table(root))).metadata().configuration)


def _commits(root: str) -> list[list[dict]]:
    return [[json.loads(line) for line in f.read_text().splitlines()]
            for f in sorted((_table(root) / "_delta_log").glob("*.json"))]


def _removed(root: str, since: int = 0) -> set[str]:
    return {a["remove"]["path"] for c in _commits(root)[since:] for a in c if "remove" in a}


def _checkpoint_removes(root: str, version: int) -> set[str]:
    cp = _table(root) / "_delta_log" / f"{version:020d}.checkpoint.parquet"
    return {r["path"] for r in pq.read_table(cp, columns=["remove"]).column("remove").to_pylist() if r}


def _expected(n: int) -> list[tuple[int, bytes]]:
    return [(i, f"m{i}".encode()) for i in range(n)]


def _through_delta_rs(root: str) -> list[tuple[int, bytes]]:
    t = deltalake.DeltaTable(str(_table(root))).to_pyarrow_table().sort_by("offset")
    return list(zip(t.column("offset").to_pylist(), t.column("value").to_pylist(), strict=True))


def _through_log(plog: PartitionLog) -> list[tuple[int, bytes]]:
    idx = plog.refresh()
    t = plog.read(0, idx.end_offset)
    return list(zip(t.column("offset").to_pylist(), t.column("value").to_pylist(), strict=True))


def _through_reader(client: pulsartx.Client) -> list[tuple[int, bytes]]:
    with client.create_reader("tt", MessageId.earliest) as r:
        return [(m.message_id().offset(), m.data()) for m in r]


def _data_files(root: str) -> set[str]:
    """Every file of the partition's directory outside ``_delta_log``."""
    base = _table(root)
    return {str(p.relative_to(base)) for p in base.rglob("*") if p.is_file() and "_delta_log" not in p.parts}


def test_a_new_partition_has_the_short_retention(tmp_path):
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("tt", 2)
    for i in range(2):
        conf = dict(deltalake.DeltaTable(str(Path(root, *partition_segments(TopicName.parse(f"tt-partition-{i}")))))
                    .metadata().configuration)
        assert conf == {**PARTITION_TABLE_CONFIG,
                        RETENTION_PROPERTY: f"interval {keyed_log.TOMBSTONE_RETENTION_S} seconds"}
        assert conf[RETENTION_PROPERTY] == "interval 60 seconds"


def test_an_older_partition_gets_it_with_its_first_merge_while_another_writer_races(tmp_path, monkeypatch):
    root, client = _topic(tmp_path, old_style=True, monkeypatch=monkeypatch)
    assert RETENTION_PROPERTY not in _configuration(root)
    ours = PartitionLog(client.root, PART)
    _append(ours, 0, RUN)
    theirs = PartitionLog(client.root, PART)  # another process's writer, opened before the upgrade
    _append(theirs, RUN, 1)
    assert RETENTION_PROPERTY not in _configuration(root)  # appends leave the metadata alone
    assert merge_through(ours, max_runs=1) == RUN
    [created, upgrade] = [c for c in _commits(root) if any("metaData" in x for x in c)]
    assert [next(iter(x)) for x in upgrade][:2] == ["commitInfo", "metaData"]
    assert upgrade[0]["commitInfo"]["operation"] == "OPTIMIZE"
    assert sum("remove" in x for x in upgrade) == RUN and sum("add" in x for x in upgrade) == 1
    meta = next(x["metaData"] for x in upgrade if "metaData" in x)
    first = next(x["metaData"] for x in created if "metaData" in x)
    assert meta == {**first, "configuration": {**first["configuration"], RETENTION_PROPERTY: "interval 60 seconds"}}
    t = deltalake.DeltaTable(str(_table(root)))
    assert (t.protocol().min_reader_version, t.protocol().min_writer_version) == (1, 2)
    assert t.metadata().configuration[RETENTION_PROPERTY] == "interval 60 seconds"
    # Their next append wanted the slot the merge took: it re-reads the table and lands, exactly once.
    _append(theirs, RUN + 1, 1)
    _append(ours, RUN + 2, RUN)
    assert merge_through(ours, max_runs=2) == RUN  # later merges leave the metadata alone
    assert len([c for c in _commits(root) if any("metaData" in x for x in c)]) == 2
    n = 2 * RUN + 2
    assert _through_delta_rs(root) == _expected(n)
    for plog in (ours, theirs, PartitionLog(client.root, PART)):
        assert _through_log(plog) == _expected(n)
    assert _through_reader(client) == _expected(n)
    client.close()


def test_a_store_without_conditional_put_gets_it_with_a_compaction(tmp_path, monkeypatch):
    """No merge runs there (its commits need put-if-absent): compaction makes the tombstones, and
    the upgrade is a delta-rs commit of its own after the compaction's."""
    root, client = _topic(tmp_path, old_style=True, monkeypatch=monkeypatch)
    monkeypatch.setattr(StorageRoot, "has_put_if_absent", property(lambda self: False))
    plog = PartitionLog(client.root, PART)
    _append(plog, 0, 6)
    assert merge_through(plog) == 0
    res = compact_partition(client.root, PART)
    assert res.skipped is None and res.files_after == 1
    assert _configuration(root)[RETENTION_PROPERTY] == "interval 60 seconds"
    [swap, upgrade] = [[next(iter(x)) for x in c] for c in _commits(root)[-2:]]
    assert "remove" in swap and "metaData" not in swap and "metaData" in upgrade
    assert _through_delta_rs(root) == _expected(6)
    assert _through_log(PartitionLog(client.root, PART)) == _expected(6)
    client.close()


def test_a_failing_upgrade_warns_once_and_compaction_still_runs(tmp_path, monkeypatch, caplog):
    root, client = _topic(tmp_path, old_style=True, monkeypatch=monkeypatch)
    monkeypatch.setattr(StorageRoot, "has_put_if_absent", property(lambda self: False))

    def refuse(self, properties):
        raise StorageError("metadata writes are not allowed here")

    monkeypatch.setattr(DeltaAppender, "set_properties_with_deltalake", refuse)
    plog = PartitionLog(client.root, PART)
    with caplog.at_level(logging.DEBUG, logger="pulsartx.storage.keyed_log"):
        for round_ in range(3):
            _append(plog, 3 * round_, 3)
            res = compact_partition(client.root, PART)
            assert res.skipped is None and res.files_after == 1
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1  # once per table and process
    message = warnings[0].getMessage()
    assert str(_table(root)) in message and RETENTION_PROPERTY in message and "SET TBLPROPERTIES" in message
    assert len([r for r in caplog.records if "failed again" in r.getMessage()]) == 2
    assert RETENTION_PROPERTY not in _configuration(root)
    assert _through_delta_rs(root) == _expected(9)
    assert _through_log(PartitionLog(client.root, PART)) == _expected(9)
    client.close()


def test_checkpoints_drop_expired_tombstones_and_every_reader_stays_exact(tmp_path, monkeypatch):
    monkeypatch.setattr(keyed_log, "TOMBSTONE_RETENTION_S", 1)
    root, client = _topic(tmp_path)
    assert _configuration(root)[RETENTION_PROPERTY] == "interval 1 seconds"
    writer = PartitionLog(client.root, PART)
    _append(writer, 0, RUN)
    deltalake.DeltaTable(str(_table(root))).create_checkpoint()  # what pulsartx's checkpoints start from
    before = writer.index.version
    early = PartitionLog(client.root, PART)  # a reader that looked before the merges, then not until the end
    assert _through_log(early) == _expected(RUN)
    reader = client.create_reader("tt", MessageId.earliest)
    assert [(reader.read_next(5000).message_id().offset()) for _ in range(2)] == [0, 1]
    old_rows = deltalake.DeltaTable(str(_table(root)), version=before).to_pyarrow_table().sort_by("offset")

    assert merge_through(writer, max_runs=1) == RUN
    _append(writer, RUN, RUN)
    assert merge_through(writer, max_runs=1) == RUN
    expired = _removed(root)
    assert len(expired) == 2 * RUN
    time.sleep(1.3)
    versions = len(_commits(root))
    _append(writer, 2 * RUN, RUN)
    assert merge_through(writer, max_runs=1) == RUN
    fresh = _removed(root, versions)
    assert len(fresh) == RUN
    [merge] = [c for c in _commits(root)[versions:] if any("remove" in x for x in c)]
    merged_at = merge[0]["commitInfo"]["timestamp"]

    # pulsartx's checkpoint, counted from the last merge's time: exactly its tombstones.
    version = writer.index.version
    written = write_checkpoint(client.root, SEGMENTS, version, now_ms=merged_at + 200)
    assert written is not None and written.version == version
    assert _checkpoint_removes(root, version) == fresh
    # delta-rs's checkpoint keeps none of the expired ones either (the fresh ones too, if it came late).
    _append(writer, 3 * RUN, 1)
    appender.wait_for_checkpoints()
    t = deltalake.DeltaTable(str(_table(root)))
    t.create_checkpoint()
    kept = _checkpoint_removes(root, t.version())
    assert kept <= fresh and not kept & expired

    n = 3 * RUN + 1
    assert _through_delta_rs(root) == _expected(n)  # from the newest checkpoint
    live = {f.path for f in PartitionLog(client.root, PART).refresh().files}
    snapshot = delta.read_checkpointed_snapshot(client.root, SEGMENTS)
    assert snapshot is not None and set(snapshot.adds) == live
    assert live == {os.path.basename(u) for u in t.file_uris()}
    assert _through_log(PartitionLog(client.root, PART)) == _expected(n)
    assert _through_reader(client) == _expected(n)
    # A snapshot older than the merges still reads its rows: the removed files stay on storage.
    again = deltalake.DeltaTable(str(_table(root)), version=before).to_pyarrow_table().sort_by("offset")
    assert again.equals(old_rows)
    # The reader and the log that looked before the merges catch up over them exactly.
    assert early.index.version == before
    assert _through_log(early) == _expected(n)
    rest = [(m.message_id().offset(), m.data()) for m in iter(reader)]
    assert rest == _expected(n)[2:]
    reader.close()
    client.close()


def _merged_away_and_checkpointed(tmp_path, monkeypatch) -> tuple[str, pulsartx.Client, PartitionLog, set[str]]:
    """A partition whose merges removed 3 * RUN files, two thirds of them with tombstones that
    expired before the last checkpoint: delta-rs's lite vacuum no longer sees those."""
    monkeypatch.setattr(keyed_log, "TOMBSTONE_RETENTION_S", 1)
    root, client = _topic(tmp_path)
    writer = PartitionLog(client.root, PART)
    for k in range(2):
        _append(writer, k * RUN, RUN)
        assert merge_through(writer, max_runs=1) == RUN
    time.sleep(1.3)
    _append(writer, 2 * RUN, RUN)
    assert merge_through(writer, max_runs=1) == RUN
    appender.wait_for_checkpoints()
    deltalake.DeltaTable(str(_table(root))).create_checkpoint()
    removed = _removed(root)
    assert len(removed) == 3 * RUN and removed <= _data_files(root)
    return root, client, writer, removed


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_vacuum_deletes_every_merged_away_file_even_without_its_tombstone(tmp_path, monkeypatch):
    root, client, writer, removed = _merged_away_and_checkpointed(tmp_path, monkeypatch)
    lite = set(deltalake.DeltaTable(str(_table(root))).vacuum(retention_hours=0, dry_run=True,
                                                               enforce_retention_duration=False))
    assert lite < removed  # the tombstones that expired are not in the table any more
    live = {f.path for f in PartitionLog(client.root, PART).refresh().files}
    log_before = sorted(p.name for p in (_table(root) / "_delta_log").iterdir())
    in_flight = DeltaAppender(client.root, SEGMENTS, delta.open_table(client.root, *SEGMENTS), RECORD_SCHEMA)
    uncommitted = in_flight.write_rewrite_files([(writer.read(0, RUN), False)])  # as a merge writes it
    [pending] = [a["path"] for a in uncommitted.adds]
    # At 0 hours the files the table still holds tombstones for go; the others, unreferenced like a
    # write in flight, wait until they are an hour old (retention.ORPHAN_MIN_HOURS).
    assert vacuum(client.root, PART, 0) == len(lite)
    assert _data_files(root) == live | (removed - lite) | {pending}
    for p in removed - lite:
        _age(_table(root) / p, 2 * 3600)
    # delta-rs names again the tombstoned files the first vacuum deleted
    assert vacuum(client.root, PART, 0) == len(removed)
    assert _data_files(root) == live | {pending}  # exactly the merged-away files went, never the write in flight
    in_flight.discard_rewrite(uncommitted)
    log_after = sorted(p.name for p in (_table(root) / "_delta_log").iterdir())
    assert set(log_before) <= set(log_after)  # vacuum's own commits are all that changed there
    n = 3 * RUN
    assert _through_delta_rs(root) == _expected(n)
    assert _through_log(writer) == _expected(n)
    assert _through_log(PartitionLog(client.root, PART)) == _expected(n)
    assert _through_reader(client) == _expected(n)
    _append(writer, n, 1)  # the partition stays writable
    assert _through_reader(client) == _expected(n + 1)
    client.close()


def test_vacuum_keeps_what_its_retention_protects(tmp_path, monkeypatch):
    """With a retention of an hour: a file removed a moment ago is kept even when it was written
    long before and its tombstone is gone (the version an hour ago still had it), as are a data
    file written but not committed yet and the hidden and log files; a file nothing ever
    referenced, written long ago, and files removed long ago go."""
    monkeypatch.setattr(keyed_log, "TOMBSTONE_RETENTION_S", 1)
    root, client = _topic(tmp_path)
    writer = PartitionLog(client.root, PART)
    table = _table(root)
    # Two hours ago: RUN files appended and merged away, RUN more appended (still live an hour ago).
    _append(writer, 0, RUN)
    assert merge_through(writer, max_runs=1) == RUN
    long_ago = _removed(root)
    _append(writer, RUN, RUN)
    (table / "part-00000-orphan-c000.zstd.parquet").write_bytes(b"a lost commit's file")
    (table / ".hidden.tmp-1-000000000000-1").write_bytes(b"a temporary")
    for p in table.rglob("*"):
        if p.is_file():
            _age(p, 2 * 3600)
    # Now: those RUN files merged away (tombstones expired and checkpointed), and a write in flight.
    assert merge_through(writer, max_runs=1) == RUN
    recent = _removed(root) - long_ago
    assert len(recent) == RUN and all(time.time() - (table / p).stat().st_mtime > 3600 for p in recent)
    time.sleep(1.3)
    _append(writer, 2 * RUN, 1)
    appender.wait_for_checkpoints()
    t = deltalake.DeltaTable(str(table))
    t.create_checkpoint()
    assert not _checkpoint_removes(root, t.version())
    in_flight = DeltaAppender(client.root, SEGMENTS, delta.open_table(client.root, *SEGMENTS), RECORD_SCHEMA)
    uncommitted = in_flight.write_rewrite_files([(writer.read(0, RUN), False)])  # as a merge writes it
    [pending] = [a["path"] for a in uncommitted.adds]
    files = _data_files(root)

    assert vacuum(client.root, PART, 1) == len(long_ago) + 1
    assert files - _data_files(root) == long_ago | {"part-00000-orphan-c000.zstd.parquet"}
    assert {pending, ".hidden.tmp-1-000000000000-1"} | recent <= _data_files(root)
    n = 2 * RUN + 1
    assert _through_delta_rs(root) == _expected(n)
    assert _through_log(PartitionLog(client.root, PART)) == _expected(n)
    assert _through_reader(client) == _expected(n)
    in_flight.discard_rewrite(uncommitted)
    client.close()


def test_vacuum_without_the_horizon_version_deletes_only_what_tombstones_name(tmp_path, monkeypatch, caplog):
    """Unable to read the table's version at the horizon, full mode could take a file removed within
    the retention for an old orphan: the vacuum then trusts only the tombstones, and says so."""
    root, client, writer, removed = _merged_away_and_checkpointed(tmp_path, monkeypatch)
    orphan = _table(root) / "part-00000-orphan-c000.zstd.parquet"
    orphan.write_bytes(b"a lost commit's file")
    _age(orphan, 2 * 3600)
    files = _data_files(root)

    def unreadable(self, version):
        raise OSError("commit file unreadable")

    monkeypatch.setattr(deltalake.DeltaTable, "load_as_version", unreadable)
    with caplog.at_level(logging.WARNING, logger="pulsartx.maintenance.retention"):
        assert vacuum(client.root, PART, 1) == 0  # no tombstone is an hour old
    assert _data_files(root) == files
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "cannot be read" in warning and "commit file unreadable" in warning
    assert _through_log(PartitionLog(client.root, PART)) == _expected(3 * RUN)
    client.close()


def test_vacuum_after_log_cleanup_does_not_take_the_oldest_commit_left_for_the_horizon(tmp_path, monkeypatch, caplog):
    """delta-rs answers a time before the oldest commit left in the log with that commit. After an
    idle month, the first commit removes old files and becomes the oldest left (a checkpoint,
    then log cleanup): those files were merged away a moment ago, yet not live at that commit. The
    vacuum must not take it for the version at its horizon, or it deletes them under a read planned
    before the merge."""
    monkeypatch.setattr(keyed_log, "TOMBSTONE_RETENTION_S", 1)
    root, client = _topic(tmp_path)
    writer = PartitionLog(client.root, PART)
    table = _table(root)
    _append(writer, 0, RUN)
    appender.wait_for_checkpoints()
    for p in table.rglob("*"):
        if p.is_file():
            _age(p, 40 * 86400)
    old = _data_files(root)
    assert merge_through(writer, max_runs=1) == RUN  # the first commit after the idle month
    deltalake.DeltaTable(str(table)).create_checkpoint()
    deltalake.DeltaTable(str(table)).cleanup_metadata()  # commits older than 30 days go
    assert not (table / "_delta_log" / delta.commit_file(0)).exists()
    time.sleep(1.3)
    _append(writer, RUN, 1)
    deltalake.DeltaTable(str(table)).create_checkpoint()  # the merge's tombstones have expired
    with caplog.at_level(logging.WARNING, logger="pulsartx.maintenance.retention"):
        assert vacuum(client.root, PART, 1) == 0
    assert old <= _data_files(root)  # removed a moment ago: kept for the hour
    assert any("oldest commit left" in r.getMessage() for r in caplog.records)
    assert _through_log(PartitionLog(client.root, PART)) == _expected(RUN + 1)
    client.close()
