"""Checkpoints written by pulsartx (pulsartx.storage.checkpoint): after random histories of
appends, compactions, app ids that expire and metadata changes, delta-rs reading the table through
our checkpoint sees exactly what it sees replaying the JSON commits alone, delta-rs's own
checkpoint of the same version holds the same rows, and pulsartx's own readers agree. Layouts the
writer does not continue are left to delta-rs."""
from __future__ import annotations

import json
import os
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import deltalake as dl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pulsartx.admin.topics import TopicsAdmin
from pulsartx.log.dedup import producer_app_id
from pulsartx.log.partition import PartitionLog, build_records
from pulsartx.maintenance.compaction import compact_partition
from pulsartx.naming import TopicName
from pulsartx.storage import appender, checkpoint, delta, faults
from pulsartx.storage.appender import DeltaAppender, wait_for_checkpoints
from pulsartx.storage.faults import Fault, Op
from pulsartx.storage.keyed_log import KeyedLog
from pulsartx.storage.root import StorageRoot

SCHEMA = pa.schema([("seq", pa.int64(), False), ("offset", pa.int64()), ("name", pa.string())])
DAY_MS = 86_400_000


@pytest.fixture(autouse=True)
def checkpoints_only_when_asked(monkeypatch):
    """No checkpoint thread work unless a test asks: each test decides who writes which checkpoint."""
    monkeypatch.setattr(appender, "CHECKPOINT_INTERVAL", 10**9)
    monkeypatch.setattr(appender, "MAX_CHECKPOINT_INTERVAL", 10**9)


def _rows(lo: int, n: int) -> pa.Table:
    return pa.table({"seq": list(range(lo, lo + n)), "offset": [i * 10 for i in range(lo, lo + n)],
                     "name": [f"n{i}" for i in range(lo, lo + n)]}, schema=SCHEMA)


def _table(tmp_path: Path, configuration: dict[str, str] | None = None) -> tuple[StorageRoot, tuple[str, ...]]:
    root = StorageRoot.resolve(str(tmp_path / "root"))
    conf = {**delta.stats_config(["seq", "offset"]), **(configuration or {})}
    delta.create_table(root, SCHEMA, "t", configuration=conf)
    return root, ("t",)


def _log_dir(root: StorageRoot, segments: tuple[str, ...]) -> Path:
    return Path(root.fs_path(*segments, "_delta_log"))


def _written_by(root: StorageRoot, segments: tuple[str, ...], version: int) -> str:
    created = pq.ParquetFile(_log_dir(root, segments) / checkpoint.checkpoint_file(version)).metadata.created_by
    return "delta-rs" if created.startswith("parquet-rs") else "pulsartx" if "parquet-cpp" in created else created


def _json_only(root: StorageRoot, segments: tuple[str, ...], dest: Path) -> StorageRoot:
    """A copy of the table with every checkpoint and the hint removed: delta-rs replays JSON only."""
    shutil.copytree(root.fs_path(*segments), dest / "copy" / Path(*segments))
    for f in (dest / "copy" / Path(*segments) / "_delta_log").iterdir():
        if ".checkpoint." in f.name or f.name == "_last_checkpoint":
            f.unlink()
    return StorageRoot.resolve(str(dest / "copy"))


def _view(uri: str, version: int, app_ids: list[str]) -> dict[str, Any]:
    """What delta-rs reads of a table at ``version``."""
    t = dl.DeltaTable(uri, version=version)
    files = sorted(delta.add_actions(t).to_pylist(), key=lambda a: a["path"])
    p = t.protocol()
    return {"version": t.version(), "files": files, "id": t.metadata().id,
            "configuration": dict(t.metadata().configuration), "schema": t.schema().to_json(),
            "protocol": (p.min_reader_version, p.min_writer_version, p.reader_features, p.writer_features),
            "apps": {a: delta.txn_version(t, a) for a in app_ids}}


def _duckdb_rows(uri: str) -> list[str]:
    """The table's rows as DuckDB's delta extension (delta-kernel-rs, not delta-rs) reads them."""
    import duckdb
    import duckdb_extension_delta

    con = duckdb.connect()
    ext = next(Path(duckdb_extension_delta.__file__).parent.glob("extensions/*/delta.duckdb_extension"))
    con.load_extension(str(ext))
    rows = con.sql(f"SELECT * FROM delta_scan('{uri}')").to_arrow_table().to_pylist()
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)


def _rowset(path: Path) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in pq.read_table(path).to_pylist())


def check_ours(root: StorageRoot, segments: tuple[str, ...], version: int, app_ids: list[str], tmp: Path,
               retention_ms: float | None = None) -> checkpoint.Written:
    """Write our checkpoint at ``version`` and check it against delta-rs (see the module)."""
    written = checkpoint.write_checkpoint(root, segments, version)
    assert written is not None and written.hint_written and _written_by(root, segments, version) == "pulsartx"
    hint = delta.read_last_checkpoint(root, segments)
    ours_path = _log_dir(root, segments) / checkpoint.checkpoint_file(version)
    assert hint == {"version": version, "size": written.size, "sizeInBytes": os.path.getsize(ours_path),
                    "numOfAddFiles": written.num_of_add_files}
    assert not [f for f in os.listdir(_log_dir(root, segments)) if f.startswith(".")]  # no temporary file left
    copy = _json_only(root, segments, tmp / uuid.uuid4().hex)
    through_ours = _view(root.uri(*segments), version, app_ids)
    json_only = _view(copy.uri(*segments), version, app_ids)
    assert through_ours == json_only
    if version == dl.DeltaTable(root.uri(*segments)).version():  # DuckDB reads the latest version
        assert _duckdb_rows(root.uri(*segments)) == _duckdb_rows(copy.uri(*segments))
    # pulsartx's own readers: app ids (ours: our checkpoint's txn column; the copy: every commit).
    assert delta.read_app_ids(root, segments, version, retention_ms) == \
        delta.read_app_ids(copy, segments, version, retention_ms)
    assert {a: v for a, v in delta.read_app_ids(root, segments, version, retention_ms).items() if a in app_ids} == \
        {a: v for a, v in through_ours["apps"].items() if v is not None}
    snap = delta.read_checkpointed_snapshot(root, segments)
    assert snap is not None and (snap.version, snap.table_id) == (version, through_ours["id"])
    assert sorted(snap.adds) == [f["path"] for f in through_ours["files"]]
    assert {p: (a["size"], json.loads(a["stats"])) for p, a in snap.adds.items()} == \
        {p: (a["size"], json.loads(a["stats"])) for p, a in delta.read_checkpointed_snapshot(
            *_checkpointed_by_delta_rs(copy, segments, version)).adds.items()}
    # delta-rs's own checkpoint of the same version holds the same rows, in the same schema.
    theirs_path = _log_dir(copy, segments) / checkpoint.checkpoint_file(version)
    assert pq.read_schema(ours_path) == pq.read_schema(theirs_path)
    assert _rowset(ours_path) == _rowset(theirs_path)
    theirs_hint = delta.read_last_checkpoint(copy, segments)
    assert {**theirs_hint, "sizeInBytes": 0} == {**hint, "sizeInBytes": 0}
    return written


def _checkpointed_by_delta_rs(root: StorageRoot, segments: tuple[str, ...],
                              version: int) -> tuple[StorageRoot, tuple[str, ...]]:
    if not (_log_dir(root, segments) / checkpoint.checkpoint_file(version)).exists():
        dl.DeltaTable(root.uri(*segments), version=version).create_checkpoint()
    return root, segments


class History:
    """Random commits through our appender, tracking the live files and the app ids set."""

    def __init__(self, root: StorageRoot, segments: tuple[str, ...], seed: int, alter: bool = True):
        self.root, self.segments = root, segments
        self.alter = alter  # metadata changes through delta-rs (local roots: no storage options passed)
        self.rng = random.Random(seed)
        self.live: dict[str, int] = {}
        self.apps: dict[str, int] = {}
        self.seq = 0
        self.writer = DeltaAppender(root, segments, delta.open_table(root, *segments), SCHEMA,
                                    on_commit=self._seen)

    def _seen(self, version: int, actions: list[dict[str, Any]], ours: bool) -> None:
        for a in actions:
            if "add" in a:
                self.live[a["add"]["path"]] = a["add"]["size"]
            elif "remove" in a:
                self.live.pop(a["remove"]["path"], None)

    def step(self) -> None:
        r = self.rng.random()
        w = self.writer
        if r < 0.55:
            app = f"app.{self.rng.randrange(8)}"
            self.apps[app] = self.apps.get(app, -1) + 1
            n = self.rng.randrange(1, 4)
            w.append(_rows(self.seq, n), {app: self.apps[app]})
            self.seq += n
        elif r < 0.65:  # app ids alone, some short-lived (expired by the time of the checkpoint)
            app = f"guard.{self.seq}"
            self.seq += 1
            self.apps[app] = 0
            w.append(None, {app: 0}, lifetimes_ms={app: 1} if self.rng.random() < 0.5 else None)
        elif r < 0.85 and len(self.live) >= 2:  # a compaction: some files out, maybe one in
            out = self.rng.sample(sorted(self.live), self.rng.randrange(1, min(6, len(self.live)) + 1))
            parts = [(_rows(self.seq, 2), self.rng.random() < 0.5)] if self.rng.random() < 0.7 else []
            self.seq += 2
            w.rewrite(parts, [(p, self.live[p], self.rng.random() < 0.5) for p in out])
        elif r < 0.95 and self.live:  # a tombstone from long ago (expired) or from days ago (kept)
            path = self.rng.choice(sorted(self.live))
            self.old_remove(path, (8 if self.rng.random() < 0.5 else 6) * DAY_MS)
        elif self.alter:  # a schema-preserving metadata change, through delta-rs
            self.writer.catch_up()
            dl.DeltaTable(self.root.uri(*self.segments)).alter.set_table_properties(
                {"delta.logRetentionDuration": f"interval {30 + self.seq} days"})
            self.seq += 1
            self.writer.reload()
            self.writer.catch_up()

    def old_remove(self, path: str, age_ms: int) -> int:
        now = int(time.time() * 1000)
        cid = str(uuid.uuid4())
        actions = [{"commitInfo": {"timestamp": now, "operation": "DELETE", "txnId": cid}},
                   {"remove": {"path": path, "deletionTimestamp": now - age_ms, "dataChange": True,
                               "extendedFileMetadata": True, "partitionValues": {}, "size": self.live[path]}}]
        return self.writer._commit(actions, cid, {}, {path}, [])

    def run(self, steps: int) -> int:
        for _ in range(steps):
            self.step()
        return self.writer.version


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_histories_read_the_same_through_our_checkpoint(tmp_path, seed):
    root, segments = _table(tmp_path, {"delta.setTransactionRetentionDuration": "interval 7 days"})
    h = History(root, segments, seed)
    first = h.run(15)
    dl.DeltaTable(root.uri(*segments), version=first).create_checkpoint()  # a table's first: delta-rs's
    for _ in range(3):
        v = h.run(h.rng.randrange(5, 40))
        check_ours(root, segments, v, sorted(h.apps), tmp_path, retention_ms=7 * DAY_MS)
    # Mixed writers: delta-rs's checkpoint on top of ours, then ours on top of delta-rs's.
    v = h.run(10)
    dl.DeltaTable(root.uri(*segments), version=v).create_checkpoint()
    assert _written_by(root, segments, v) == "delta-rs"
    assert _view(root.uri(*segments), v, sorted(h.apps)) == _view(
        _json_only(root, segments, tmp_path / "mixed").uri(*segments), v, sorted(h.apps))
    v = h.run(10)
    check_ours(root, segments, v, sorted(h.apps), tmp_path, retention_ms=7 * DAY_MS)


@pytest.mark.parametrize("retention, kept_ages, dropped_ages", [
    (None, [6 * DAY_MS, 3_600_000], [8 * DAY_MS, 30 * DAY_MS]),
    ("interval 1 hours", [30 * 60_000], [2 * 3_600_000, 8 * DAY_MS]),
    ("interval 2 day", [DAY_MS], [3 * DAY_MS]),
])
def test_tombstones_are_kept_while_the_table_retains_them(tmp_path, retention, kept_ages, dropped_ages):
    root, segments = _table(tmp_path, {"delta.deletedFileRetentionDuration": retention} if retention else None)
    h = History(root, segments, 0)
    for i in range(8):
        h.writer.append(_rows(i, 1))
    dl.DeltaTable(root.uri(*segments), version=h.writer.version).create_checkpoint()
    kept, dropped = [], []
    for ages, into in ((kept_ages, kept), (dropped_ages, dropped)):
        for age in ages:
            path = sorted(h.live)[0]
            into.append(path)
            h.old_remove(path, age)
    check_ours(root, segments, h.writer.version, [], tmp_path)
    ck = pq.read_table(_log_dir(root, segments) / checkpoint.checkpoint_file(h.writer.version), columns=["remove"])
    removes = ck.column("remove")
    assert sorted(r["path"] for r in removes.filter(removes.is_valid()).to_pylist()) == sorted(kept)


def test_tombstones_already_in_the_last_checkpoint_expire_from_ours(tmp_path):
    """A tombstone carried over from the previous checkpoint is dropped once it expires."""
    root, segments = _table(tmp_path, {"delta.deletedFileRetentionDuration": "interval 1 seconds"})
    h = History(root, segments, 0)
    for i in range(4):
        h.writer.append(_rows(i, 1))
    h.writer.rewrite([(_rows(10, 2), False)], [(p, s, False) for p, s in sorted(h.live.items())[:2]])
    dl.DeltaTable(root.uri(*segments), version=h.writer.version).create_checkpoint()
    before = pq.read_table(_log_dir(root, segments) / checkpoint.checkpoint_file(h.writer.version))
    assert before.column("remove").null_count == before.num_rows - 2  # still retained
    time.sleep(1.2)
    h.writer.append(_rows(20, 1))
    written = check_ours(root, segments, h.writer.version, [], tmp_path)
    after = pq.read_table(_log_dir(root, segments) / checkpoint.checkpoint_file(h.writer.version))
    assert after.column("remove").null_count == after.num_rows
    assert written.num_of_add_files == 4


def test_app_ids_expire_from_our_checkpoint_as_from_delta_rs(tmp_path):
    root, segments = _table(tmp_path, {"delta.setTransactionRetentionDuration": "interval 1 hours"})
    h = History(root, segments, 0)
    h.writer.append(_rows(0, 1), {"a.long": 1, "a.short": 1}, lifetimes_ms={"a.short": 1})
    dl.DeltaTable(root.uri(*segments), version=h.writer.version).create_checkpoint()
    h.writer.append(_rows(1, 1), {"b.long": 1, "b.short": 1}, lifetimes_ms={"b.short": 1})
    time.sleep(0.01)
    check_ours(root, segments, h.writer.version, ["a.long", "a.short", "b.long", "b.short"], tmp_path,
               retention_ms=3_600_000)
    assert delta.read_app_ids(root, segments, h.writer.version, 3_600_000) == {"a.long": 1, "b.long": 1}
    txn = pq.read_table(_log_dir(root, segments) / checkpoint.checkpoint_file(h.writer.version), columns=["txn"])
    col = txn.column("txn")
    assert sorted(t["appId"] for t in col.filter(col.is_valid()).to_pylist()) == ["a.long", "b.long"]


def test_a_partition_table_checkpointed_by_us_reads_the_same(tmp_path):
    sroot = StorageRoot.resolve(str(tmp_path / "root"))
    TopicsAdmin(sroot).create_topic("t", 1)
    plog = PartitionLog(sroot, TopicName.parse("t").with_partition(0))
    seqs: dict[str, int] = {}

    def traffic(n: int) -> None:
        for i in range(n):
            name = f"p{i % 3}"
            seqs[name] = seqs.get(name, -1) + 1
            plog.append(build_records([f"m{i}".encode()], producer_name=name, sequence_ids=[seqs[name]]),
                        producer_name=name)

    traffic(12)
    first = delta.open_table(sroot, *plog.segments).version()
    dl.DeltaTable(sroot.uri(*plog.segments), version=first).create_checkpoint()
    traffic(6)
    assert compact_partition(sroot, plog.topic, min_files=2).files_after >= 1
    traffic(5)
    apps = [producer_app_id(n) for n in seqs] + ["pulsartx.offset"]
    v = delta.open_table(sroot, *plog.segments).version()
    check_ours(sroot, plog.segments, v, apps, tmp_path, retention_ms=7 * DAY_MS)
    fresh = PartitionLog(sroot, plog.topic)
    assert fresh.end_offset() == 23
    assert len(fresh.read(0, 23, ["offset"])) == 23


def test_a_keyed_log_checkpointed_by_us_reads_the_same(tmp_path):
    schema = pa.schema([("seq", pa.int64(), False), ("key", pa.string(), False), ("v", pa.string())])
    root = StorageRoot.resolve(str(tmp_path / "root"))

    def open_log() -> KeyedLog:
        return KeyedLog(root, ("kl",), schema, key_of=lambda r: r["key"], name="kl", compact_every=7).open()

    kl = open_log()
    rng = random.Random(5)
    keys = [f"k{i}" for i in range(12)]

    def update(n: int) -> None:
        for step in range(n):
            key = rng.choice(keys)
            v = "dead" if rng.random() < 0.2 else f"v{step}"
            kl.cas(key, lambda cur, key=key, v=v: ({"seq": 0, "key": key, "v": v}, None), what=key,
                   keep=lambda r: r["v"] != "dead")

    update(15)
    dl.DeltaTable(root.uri("kl"), version=kl.version).create_checkpoint()
    from pulsartx.storage.keyed_log import bucket_app_id

    apps = sorted({bucket_app_id("kl", k) for k in keys})
    for n in (20, 33):
        update(n)
        check_ours(root, ("kl",), kl.version, apps, tmp_path)
        assert open_log().rows == kl.rows


def test_the_checkpoint_thread_writes_ours_after_delta_rs_wrote_the_first(tmp_path, monkeypatch):
    monkeypatch.setattr(appender, "CHECKPOINT_INTERVAL", 10)
    monkeypatch.setattr(appender, "MAX_CHECKPOINT_INTERVAL", 80)
    root, segments = _table(tmp_path)
    h = History(root, segments, 0)
    for i in range(35):
        h.writer.append(_rows(i, 1), {"app": i})
        wait_for_checkpoints()  # a table's backlog is one job: each version here gets its own
    assert [_written_by(root, segments, v) for v in (10, 20, 30)] == ["delta-rs", "pulsartx", "pulsartx"]
    assert delta.read_last_checkpoint(root, segments)["version"] == 30
    assert _view(root.uri(*segments), 35, ["app"]) == _view(
        _json_only(root, segments, tmp_path).uri(*segments), 35, ["app"])


def _second_checkpoint_under(tmp_path: Path, fault: Fault) -> tuple[StorageRoot, tuple[str, ...], History]:
    """A table checkpointed at version 10 as usual, then at 20 with ``fault`` installed."""
    root, segments = _table(tmp_path)
    h = History(root, segments, 0)
    for i in range(10):
        h.writer.append(_rows(i, 1))
    wait_for_checkpoints()
    faults.install([fault])
    try:
        for i in range(10, 20):
            h.writer.append(_rows(i, 1))
        wait_for_checkpoints()
    finally:
        faults.install([])
    return root, segments, h


def test_a_failed_write_of_ours_falls_back_on_delta_rs(tmp_path, monkeypatch):
    monkeypatch.setattr(appender, "CHECKPOINT_INTERVAL", 10)
    root, segments, _ = _second_checkpoint_under(
        tmp_path, Fault(Op.CREATE, match="00000000000000000020.checkpoint.parquet"))
    assert _written_by(root, segments, 20) == "delta-rs"
    assert delta.read_last_checkpoint(root, segments)["version"] == 20
    assert not [f for f in os.listdir(_log_dir(root, segments)) if f.startswith(".")]


def test_a_checkpoint_of_ours_that_exists_is_not_replaced_by_delta_rs_when_its_hint_fails(tmp_path, monkeypatch):
    """Once our checkpoint file exists, a failed hint is not a reason to fall back: delta-rs would
    find the file, write nothing, and leave the hint behind. The file stays ours and the next
    checkpoint moves the hint."""
    monkeypatch.setattr(appender, "CHECKPOINT_INTERVAL", 10)
    monkeypatch.setattr(appender, "MAX_CHECKPOINT_INTERVAL", 10)
    root, segments, h = _second_checkpoint_under(tmp_path, Fault(Op.WRITE, match="_last_checkpoint"))
    assert _written_by(root, segments, 20) == "pulsartx"
    assert delta.read_last_checkpoint(root, segments)["version"] == 10
    for i in range(20, 30):
        h.writer.append(_rows(i, 1))
    wait_for_checkpoints()
    assert delta.read_last_checkpoint(root, segments)["version"] == 30
    assert _view(root.uri(*segments), 30, []) == _view(_json_only(root, segments, tmp_path).uri(*segments), 30, [])


def test_a_checkpoint_file_that_exists_is_left_as_it_is(tmp_path):
    """As delta-rs: a reader may be part-way through an existing checkpoint file."""
    root, segments = _table(tmp_path)
    h = History(root, segments, 0)
    for i in range(12):
        h.writer.append(_rows(i, 1))
    wait_for_checkpoints()
    delta.open_table(root, *segments, version=5).create_checkpoint()
    (_log_dir(root, segments) / "_last_checkpoint").write_text(json.dumps({"version": 5, "size": 8}))
    existing = _log_dir(root, segments) / checkpoint.checkpoint_file(11)
    existing.write_bytes(b"placeholder")
    assert checkpoint.write_checkpoint(root, segments, 11) is not None
    assert existing.read_bytes() == b"placeholder"


def test_temporary_files_of_writers_that_died_are_swept_with_a_checkpoint(tmp_path, monkeypatch):
    """A process killed between writing a temporary file and renaming (or linking) it leaves it in
    _delta_log; the next checkpoint of the table deletes those older than an hour, at most once an
    hour per table in a process, and leaves young ones (a write may be under way) and log files."""
    monkeypatch.setattr(StorageRoot, "has_put_if_absent", property(lambda self: False))  # the rename path
    monkeypatch.setattr(appender, "CHECKPOINT_INTERVAL", 1)  # every version asked for is due
    root, segments = _table(tmp_path)
    w = DeltaAppender(root, segments, delta.open_table(root, *segments), SCHEMA)
    for i in range(3):
        w.append(_rows(i, 1))
    folder = _log_dir(root, segments)
    old = [f".{checkpoint.checkpoint_file(2)}.tmp-4242-0123456789ab-7", "._last_checkpoint.tmp-4242-0123456789ab-8",
           f"{delta.commit_file(3)}.tmp-99-abcdef012345-0"]  # a put-if-absent's, on local disk
    young = ".00000000000000000005.checkpoint.parquet.tmp-4242-0123456789ab-9"
    lookalike = ".notes.tmp-old"  # not a name these writes make
    two_hours_ago = time.time() - 7200
    for name in [*old, young, lookalike]:
        (folder / name).write_bytes(b"partial")
        if name != young:
            os.utime(folder / name, (two_hours_ago, two_hours_ago))
    logs = sorted(p.name for p in folder.iterdir() if p.name not in {*old, young, lookalike})
    appender.schedule_checkpoint(root, segments, 3).result(30)
    left = sorted(p.name for p in folder.iterdir())
    assert left == sorted({*logs, young, lookalike, checkpoint.checkpoint_file(3), "_last_checkpoint"})
    # Within the hour this process does not list the folder again.
    (folder / old[0]).write_bytes(b"partial")
    os.utime(folder / old[0], (two_hours_ago, two_hours_ago))
    w.append(_rows(3, 1))
    appender.schedule_checkpoint(root, segments, 4).result(30)
    assert (folder / old[0]).exists()
    monkeypatch.setattr(appender, "TEMPORARY_SWEEP_INTERVAL_S", 0.0)
    w.append(_rows(4, 1))
    appender.schedule_checkpoint(root, segments, 5).result(30)
    assert not (folder / old[0]).exists() and (folder / young).exists()
    assert _view(root.uri(*segments), 5, []) == _view(_json_only(root, segments, tmp_path).uri(*segments), 5, [])


def test_a_commit_field_the_checkpoint_schema_lacks_is_not_dropped():
    """pa.array drops a struct's unknown keys without a word: such an action is left to delta-rs."""
    schema = pa.schema([pa.field("add", pa.struct([pa.field("path", pa.string())])),
                        pa.field("txn", pa.struct([pa.field("appId", pa.string())]))])
    with pytest.raises(checkpoint.Unsupported, match="baseRowId"):
        checkpoint._rows(schema, "add", [{"path": "a.parquet", "baseRowId": 4}])


def test_layouts_it_does_not_continue_are_left_to_delta_rs(tmp_path, monkeypatch):
    monkeypatch.setattr(appender, "CHECKPOINT_INTERVAL", 5)
    root, segments = _table(tmp_path)
    w = DeltaAppender(root, segments, delta.open_table(root, *segments), SCHEMA)
    for i in range(4):
        w.append(_rows(i, 1))
    monkeypatch.setattr(appender, "CHECKPOINT_INTERVAL", 10**9)
    w.append(_rows(4, 1))
    monkeypatch.setattr(appender, "CHECKPOINT_INTERVAL", 5)
    with pytest.raises(checkpoint.Unsupported, match="no checkpoint"):
        checkpoint.write_checkpoint(root, segments, 5)
    # The checkpoint thread: delta-rs writes a table's first checkpoint.
    appender.schedule_checkpoint(root, segments, 5).result(30)
    assert _written_by(root, segments, 5) == "delta-rs"
    monkeypatch.setattr(appender, "CHECKPOINT_INTERVAL", 10**9)
    for i in range(5, 8):
        w.append(_rows(i, 1))
    assert checkpoint.write_checkpoint(root, segments, 5) is None  # already there: nothing to write
    hint = _log_dir(root, segments) / "_last_checkpoint"
    good = hint.read_text()
    hint.write_text(json.dumps({**json.loads(good), "parts": 2}))
    with pytest.raises(checkpoint.Unsupported, match="multi-part"):
        checkpoint.write_checkpoint(root, segments, 8)
    hint.write_text(json.dumps({**json.loads(good), "version": 4}))  # names a checkpoint that is not there
    with pytest.raises(checkpoint.Unsupported, match="missing"):
        checkpoint.write_checkpoint(root, segments, 8)
    hint.write_text(good)
    dl.DeltaTable(root.uri(*segments)).alter.set_table_properties({"delta.checkpoint.writeStatsAsStruct": "true"})
    with pytest.raises(checkpoint.Unsupported, match="structs"):
        checkpoint.write_checkpoint(root, segments, 9)


@pytest.mark.parametrize("raw, ms", [
    ("interval 7 days", 7 * DAY_MS), ("interval 1 hour", 3_600_000), ("interval 30 seconds", 30_000),
    ("interval 2 weeks", 14 * DAY_MS), ("interval 0 minutes", 0), ("  interval   5   millisecond ", 5),
    ("interval 3 days trailing words", 3 * DAY_MS),
])
def test_durations_are_read_as_delta_rs_reads_them(raw, ms):
    assert checkpoint.parse_interval_ms(raw) == ms


@pytest.mark.parametrize("raw", ["7 days", "Interval 7 days", "interval 7 Days", "interval -1 days",
                                 "interval 1 month", "interval seven days", "interval 7"])
def test_durations_delta_rs_would_not_read_are_left_to_it(raw):
    with pytest.raises(checkpoint.Unsupported):
        checkpoint.parse_interval_ms(raw)


@pytest.mark.parametrize("raw, expected", [("interval 1 hour", 3_600_000), ("Interval 1 HOUR", False),
                                           ("interval 2 Days", False)])
def test_app_id_retention_is_read_as_delta_rs_reads_it(tmp_path, raw, expected):
    """A retention delta-rs ignores (it keeps the app ids for ever) must not make pulsartx's own
    app-id view forget them: a retry after that time would not be recognised."""
    root, segments = _table(tmp_path, {"delta.setTransactionRetentionDuration": raw})
    assert delta.app_id_retention_ms(delta.open_table(root, *segments)) == expected


def test_domain_metadata_latest_wins_and_removed_ones_are_dropped():
    """No pulsartx table has domain metadata (it needs writer features); the reconciliation of it
    is checked on its own."""
    from pulsartx.storage.checkpoint import _kept_rows, _new_rows, _reconcile

    schema = pa.schema([
        ("add", pa.struct([pa.field("path", pa.string(), False), ("size", pa.int64())])),
        ("remove", pa.struct([pa.field("path", pa.string(), False), ("deletionTimestamp", pa.int64())])),
        ("metaData", pa.struct([pa.field("id", pa.string(), False)])),
        ("protocol", pa.struct([pa.field("minReaderVersion", pa.int32(), False)])),
        ("txn", pa.struct([pa.field("appId", pa.string(), False), ("version", pa.int64()),
                           ("lastUpdated", pa.int64())])),
        ("domainMetadata", pa.struct([pa.field("domain", pa.string(), False), ("configuration", pa.string()),
                                      pa.field("removed", pa.bool_(), False)])),
    ])
    prev = pa.Table.from_pylist([
        {"metaData": {"id": "x"}}, {"protocol": {"minReaderVersion": 1}},
        {"domainMetadata": {"domain": "a", "configuration": "1", "removed": False}},
        {"domainMetadata": {"domain": "b", "configuration": "1", "removed": False}},
        {"domainMetadata": {"domain": "c", "configuration": "1", "removed": False}},
    ], schema=schema)
    tail = _reconcile([[{"domainMetadata": {"domain": "a", "configuration": "2", "removed": False}},
                        {"domainMetadata": {"domain": "b", "configuration": "", "removed": True}},
                        {"domainMetadata": {"domain": "d", "configuration": "1", "removed": False}},
                        {"commitInfo": {"operation": "x"}}],
                       [{"domainMetadata": {"domain": "d", "configuration": "3", "removed": False}}]])
    out = pa.concat_tables([*_new_rows(schema, tail, 0, None), _kept_rows(prev, tail, 0, None)])
    col = out.column("domainMetadata")
    assert sorted((d["domain"], d["configuration"]) for d in col.filter(col.is_valid()).to_pylist()) == [
        ("a", "2"), ("c", "1"), ("d", "3")]
    assert out.num_rows == 5  # metaData, protocol and the three domains


def _s3_rowset(root: StorageRoot, segments: tuple[str, ...], version: int) -> tuple[str, list[str]]:
    with root.arrow_fs.open_input_file(root.fs_path(*segments, "_delta_log", checkpoint.checkpoint_file(version))) as f:
        pf = pq.ParquetFile(f)
        return pf.metadata.created_by, sorted(json.dumps(r, sort_keys=True, default=str)
                                               for r in pf.read().to_pylist())


def test_on_ceph_rgw_our_checkpoint_holds_delta_rs_rows_and_reads_the_same(request):
    """The same writer on an S3 root (one PUT for the checkpoint and one for the hint): delta-rs
    reads the table through it as through its own checkpoint of the same version, which holds
    the same rows."""
    from conftest import storage_backends

    if "rgw" not in storage_backends():
        pytest.skip("PULSARTX_TEST_STORAGE excludes rgw")
    url, options = request.getfixturevalue("rgw_server").new_root("ckpt")
    root = StorageRoot.resolve(url, options)
    segments = ("t",)
    delta.create_table(root, SCHEMA, *segments, configuration=delta.stats_config(["seq", "offset"]))
    h = History(root, segments, 4, alter=False)
    first = h.run(12)
    delta.open_table(root, *segments, version=first).create_checkpoint()
    first_hint = root.read_text(*segments, "_delta_log", "_last_checkpoint")
    v = h.run(25)
    written = checkpoint.write_checkpoint(root, segments, v)
    assert written is not None and written.hint_written
    created, ours = _s3_rowset(root, segments, v)
    assert "parquet-cpp" in created
    assert delta.read_last_checkpoint(root, segments)["size"] == len(ours) == written.size

    def view() -> dict[str, Any]:
        t = delta.open_table(root, *segments, version=v)
        return {"files": sorted(delta.add_actions(t).to_pylist(), key=lambda a: a["path"]),
                "apps": {a: delta.txn_version(t, a) for a in sorted(h.apps)}, "id": t.metadata().id}

    through_ours = view()
    assert sorted(a["path"] for a in through_ours["files"]) == sorted(h.live)
    # delta-rs's own of the same version (it does not replace an existing checkpoint here: ours goes first)
    root.rm(*segments, "_delta_log", checkpoint.checkpoint_file(v))
    root.write_text(first_hint, *segments, "_delta_log", "_last_checkpoint")
    delta.open_table(root, *segments, version=v).create_checkpoint()
    created, theirs = _s3_rowset(root, segments, v)
    assert created.startswith("parquet-rs") and theirs == ours
    assert view() == through_ours
