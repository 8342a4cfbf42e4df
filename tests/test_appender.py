"""The hand-written Delta append path (pulsartx.storage.appender): what it writes must be a plain
Delta table to delta-rs, and its compare-and-set must behave as delta-rs's does."""
from __future__ import annotations

import json
import os

import deltalake as dl
import pyarrow as pa
import pytest

from pulsartx.storage import delta
from pulsartx.storage.appender import CHECKPOINT_INTERVAL, DeltaAppender, wait_for_checkpoints
from pulsartx.storage.root import StorageRoot

SCHEMA = pa.schema([("seq", pa.int64(), False), ("offset", pa.int64()), ("name", pa.string()),
                    ("at", pa.timestamp("us", tz="UTC")), ("tags", pa.map_(pa.string(), pa.string()))])


def rows(lo: int, hi: int) -> pa.Table:
    return pa.table({"seq": list(range(lo, hi)), "offset": [i * 10 for i in range(lo, hi)],
                     "name": [f"n{i}" for i in range(lo, hi)],
                     "at": pa.array([1_700_000_000_123_456 + i for i in range(lo, hi)], pa.timestamp("us", tz="UTC")),
                     "tags": pa.array([[("k", str(i))] for i in range(lo, hi)], pa.map_(pa.string(), pa.string()))},
                    schema=SCHEMA)


@pytest.fixture
def table(tmp_path):
    root = StorageRoot.resolve(str(tmp_path))
    delta.create_table(root, SCHEMA, "t", configuration=delta.stats_config(["seq", "offset", "at"]))
    return root, ("t",)


def appender(table, on_commit=None) -> DeltaAppender:
    root, segments = table
    return DeltaAppender(root, segments, delta.open_table(root, *segments), SCHEMA, on_commit=on_commit)


def test_appends_are_a_plain_delta_table_with_stats_and_app_ids(table):
    a = appender(table)
    assert a.fast
    assert [a.append(rows(i, i + 3), {"app.x": i}) for i in range(0, 9, 3)] == [1, 2, 3]
    t = dl.DeltaTable(a.uri)
    assert t.version() == 3
    assert t.transaction_version("app.x") == 6
    assert sorted(t.to_pyarrow_table().column("seq").to_pylist()) == list(range(9))
    assert t.to_pyarrow_table().sort_by("seq").equals(rows(0, 9))
    adds = pa.table(t.get_add_actions(flatten=True)).sort_by("min.seq").to_pydict()
    assert (adds["min.offset"], adds["max.offset"], adds["num_records"]) == ([0, 30, 60], [20, 50, 80], [3, 3, 3])
    # Timestamp statistics round outward to milliseconds, as Delta keeps them.
    assert adds["min.at"][0].isoformat() == "2023-11-14T22:13:20.123000+00:00"
    assert adds["max.at"][0].isoformat() == "2023-11-14T22:13:20.124000+00:00"
    assert t.history(1)[0]["operation"] == "WRITE"


def test_a_commit_setting_one_of_our_app_ids_after_our_snapshot_is_a_conflict(table):
    mine, theirs = appender(table), appender(table)
    mine.append(rows(0, 1), {"app.a": 0})
    with pytest.raises(delta.ConcurrentCommit, match="app.a"):
        theirs.append(rows(1, 2), {"app.a": 1})
    assert theirs.version == 1 and theirs.txn_version("app.a") == 0  # it read the winner's commit
    assert theirs.append(rows(1, 2), {"app.a": 1}) == 2  # and retries from there
    assert dl.DeltaTable(mine.uri).transaction_version("app.a") == 1


def test_a_commit_sharing_no_app_id_is_stepped_over_and_seen_by_on_commit(table):
    seen = []
    mine = appender(table, on_commit=lambda v, actions, ours: seen.append(
        (v, [a["txn"]["appId"] for a in actions if "txn" in a], ours)))
    theirs = appender(table)
    theirs.append(rows(0, 1), {"app.b": 5})
    assert mine.append(rows(1, 2), {"app.a": 0}) == 2
    assert seen == [(1, ["app.b"], False), (2, ["app.a"], True)]
    assert (mine.txn_version("app.b"), mine.txn_version("app.a"), mine.txn_version("app.c")) == (5, 0, None)


def test_a_retried_put_whose_first_response_was_lost_finds_its_own_commit(table, monkeypatch):
    a = appender(table)
    real = StorageRoot.put_if_absent
    calls = []

    def lossy(self, body, *segments):
        calls.append(segments[-1])
        created = real(self, body, *segments)
        if len(calls) == 1:
            raise ConnectionResetError("connection reset by peer")  # the put landed, its answer did not
        return created

    monkeypatch.setattr(StorageRoot, "put_if_absent", lossy)
    monkeypatch.setenv(delta.RETRY_ENV, "5")
    assert a.append(rows(0, 2), {"app.a": 1}) == 1
    assert calls == [f"{1:020d}.json"] * 2
    assert dl.DeltaTable(a.uri).to_pyarrow_table().num_rows == 2


def test_every_hundredth_version_gets_a_checkpoint(table):
    a = appender(table)
    for i in range(CHECKPOINT_INTERVAL):
        a.append(rows(i, i + 1), {f"app.{i % 3}": i})
    wait_for_checkpoints()  # written in the background, off the appender's path
    log_dir = os.path.join(a.uri, "_delta_log")
    assert os.path.exists(os.path.join(log_dir, f"{CHECKPOINT_INTERVAL:020d}.checkpoint.parquet"))
    with open(os.path.join(log_dir, "_last_checkpoint")) as f:
        assert json.load(f)["version"] == CHECKPOINT_INTERVAL
    t = dl.DeltaTable(a.uri)
    assert (t.version(), t.to_pyarrow_table().num_rows, t.transaction_version("app.0")) == (100, 100, 99)


def test_checkpoints_space_out_as_they_grow(table, monkeypatch):
    """A checkpoint rewrites every action the table keeps, so at a fixed interval its cost per
    commit grew with the table's history. The interval doubles until the last checkpoint holds at
    most CHECKPOINT_ACTIONS_PER_VERSION actions per version of it: here (10 versions, one action a
    version) one file per commit puts the checkpoints at 10, 20, 40, 80 and 160, not every 10th."""
    from pulsartx.storage import appender as appender_mod

    monkeypatch.setattr(appender_mod, "CHECKPOINT_INTERVAL", 10)
    monkeypatch.setattr(appender_mod, "CHECKPOINT_ACTIONS_PER_VERSION", 1)
    a = appender(table)
    for i in range(170):
        a.append(rows(i, i + 1))
        wait_for_checkpoints()  # each checkpoint's size is known before the next version asks
    log_dir = os.path.join(a.uri, "_delta_log")
    written = sorted(int(f.split(".")[0]) for f in os.listdir(log_dir) if f.endswith(".checkpoint.parquet"))
    assert written == [10, 20, 40, 80, 160]
    # A process that has not checkpointed the table yet reads the last checkpoint's size before its
    # first one: 162 actions (160 files, metadata, protocol) put the next at 320, not at 180.
    appender_mod._CHECKPOINT_SIZE.clear()
    a = appender(table)
    for i in range(170, 330):
        a.append(rows(i, i + 1))
        wait_for_checkpoints()
    written = sorted(int(f.split(".")[0]) for f in os.listdir(log_dir) if f.endswith(".checkpoint.parquet"))
    assert written == [10, 20, 40, 80, 160, 320]
    t = dl.DeltaTable(a.uri)
    assert (t.version(), t.to_pyarrow_table().num_rows) == (330, 330)
    monkeypatch.setattr(appender_mod, "MAX_CHECKPOINT_INTERVAL", 1280)
    assert [appender_mod.checkpoint_interval(n) for n in (0, 10, 11, 20, 21, 1000)] == [10, 10, 20, 20, 40, 1280]


def test_checkpoints_space_out_only_up_to_a_ceiling(monkeypatch):
    """Whoever opens a table replays the commits since its last checkpoint (one request each for
    our own tail reads on an object store), and a keyed log's tombstones alone would push the
    interval up without end: it stops at MAX_CHECKPOINT_INTERVAL."""
    from pulsartx.storage import appender as appender_mod

    assert appender_mod.checkpoint_interval(10**9) == appender_mod.MAX_CHECKPOINT_INTERVAL
    monkeypatch.setattr(appender_mod, "CHECKPOINT_INTERVAL", 10)
    monkeypatch.setattr(appender_mod, "CHECKPOINT_ACTIONS_PER_VERSION", 1)
    monkeypatch.setattr(appender_mod, "MAX_CHECKPOINT_INTERVAL", 40)
    assert [appender_mod.checkpoint_interval(n) for n in (0, 11, 21, 41, 10**6)] == [10, 20, 40, 40, 40]


def test_a_writer_behind_the_last_checkpoint_reads_app_ids_from_a_spaced_one_below_it(table):
    """Checkpoints lie at multiples of the interval times a power of two, so the one at the
    hundred below a writer's version may not exist: the nearest one that does is read, and the
    answer is delta-rs's at that version."""
    root, segments = table
    a = appender(table)
    for i in range(1, 451):
        a.append(rows(i, i + 1), {f"app.{i % 7}": i})
    wait_for_checkpoints()
    uri = a.uri
    for v in (200, 400):
        dl.DeltaTable(uri, version=v).create_checkpoint()
    log_dir = os.path.join(uri, "_delta_log")
    for f in os.listdir(log_dir):  # only 200 and 400: the appender's own, at 100 and 300, are gone
        if f.endswith(".checkpoint.parquet") and int(f.split(".")[0]) not in (200, 400):
            os.remove(os.path.join(log_dir, f))
    assert json.load(open(os.path.join(log_dir, "_last_checkpoint")))["version"] == 400
    expected = {f"app.{k}": dl.DeltaTable(uri, version=350).transaction_version(f"app.{k}") for k in range(7)}
    assert delta.read_app_ids(root, segments, 350, None, 100, 800) == expected
    assert delta.read_app_ids(root, segments, 350, None, 100) is None  # the hundred below only: 300 is gone


def test_tables_with_writer_features_we_do_not_implement_go_through_delta_rs(table):
    root, segments = table
    t = delta.open_table(root, *segments)
    t.alter.add_constraint({"offset_not_negative": "offset >= 0"})  # writer version 3: CHECK constraints
    a = appender(table)
    assert not a.fast
    assert a.append(rows(0, 2), {"app.a": 1}) == 2
    bad = rows(2, 3).set_column(1, "offset", pa.array([-1], pa.int64()))
    with pytest.raises(Exception, match="failed validation check"):
        a.append(bad, {"app.a": 2})
    assert dl.DeltaTable(a.uri).to_pyarrow_table().num_rows == 2


def _through_delta_rs(table) -> DeltaAppender:
    root, segments = table
    delta.open_table(root, *segments).alter.add_constraint({"offset_not_negative": "offset >= 0"})
    a = appender(table)
    assert not a.fast
    return a


@pytest.mark.parametrize("apps", [{}, {"app.a": 1}], ids=["no-app-ids", "app-ids"])
def test_a_delta_rs_write_whose_response_was_lost_is_found_not_written_twice(table, monkeypatch, apps):
    """The write landed and its caller saw a transient error: the retry re-reads the log and finds
    its own commit, as the put-if-absent path does, instead of writing the rows a second time (no
    app ids) or failing on its own app ids as another writer's (with them)."""
    from pulsartx.storage import faults
    from pulsartx.storage.faults import Fault, Mode, Op

    a = _through_delta_rs(table)
    monkeypatch.setenv(delta.RETRY_ENV, "5")
    lost = Fault(Op.DELTA, Mode.LOST, match=a.uri, transient=True)
    faults.install([lost])
    try:
        version = a.append(rows(0, 2), apps)
    finally:
        faults.clear()
    assert lost.fired == 1
    assert version == 2
    assert dl.DeltaTable(a.uri).version() == 2
    assert sorted(dl.DeltaTable(a.uri).to_pyarrow_table().column("seq").to_pylist()) == [0, 1]
    assert a.append(rows(2, 3), {k: v + 1 for k, v in apps.items()}) == 3
    assert sorted(dl.DeltaTable(a.uri).to_pyarrow_table().column("seq").to_pylist()) == [0, 1, 2]


def test_a_delta_rs_write_that_failed_before_landing_is_written_once_on_retry(table, monkeypatch):
    from pulsartx.storage import faults
    from pulsartx.storage.faults import Fault, Mode, Op

    a = _through_delta_rs(table)
    monkeypatch.setenv(delta.RETRY_ENV, "5")
    failed = Fault(Op.DELTA, Mode.ERROR, match=a.uri, transient=True)
    faults.install([failed])
    try:
        assert a.append(rows(0, 2), {"app.a": 1}) == 2
    finally:
        faults.clear()
    assert failed.fired == 1
    assert sorted(dl.DeltaTable(a.uri).to_pyarrow_table().column("seq").to_pylist()) == [0, 1]


def test_a_writer_kept_across_tasks_notices_its_topic_was_recreated(tmp_path):
    """Spark's Python workers keep one PartitionLog per partition across tasks (pulsartx.commit_protocol.task):
    when the topic is deleted and re-created meanwhile (by another process, whose forget_shared does
    not reach this one), the next task's sync_writer starts over on the new table instead of
    continuing the old table's log (which would leave a version gap and reuse offsets)."""
    import pulsartx
    from pulsartx.log.partition import PartitionLog, build_records
    from pulsartx.naming import TopicName

    client = pulsartx.Client(str(tmp_path))
    client.admin.create_topic("t", 1)
    plog = PartitionLog(client.root, TopicName.parse("t").with_partition(0))
    for i in range(3):
        plog.append(build_records([f"old-{i}".encode()]))
    client.admin.delete_topic("t")
    client.admin.create_topic("t", 1)
    plog.sync_writer()
    res = plog.append(build_records([b"new-0"]))
    assert (res.first_offset, res.version) == (0, 1)
    t = dl.DeltaTable(client.root.uri(*plog.segments))
    assert t.version() == 1 and t.to_pyarrow_table().column("value").to_pylist() == [b"new-0"]


def test_a_writer_whose_tables_first_commits_were_cleaned_up_keeps_its_table(tmp_path, caplog):
    """Delta cleans up commits older than delta.logRetentionDuration (30 days) once a checkpoint
    covers them, version 0 among them: the table is the same one, and a writer kept across tasks
    must neither take it for a re-created table (and reload before every append) nor lose track of
    a real re-creation."""
    import logging

    import pulsartx
    from pulsartx.log.partition import PartitionLog, build_records
    from pulsartx.naming import TopicName

    client = pulsartx.Client(str(tmp_path))
    client.admin.create_topic("t", 1)
    plog = PartitionLog(client.root, TopicName.parse("t").with_partition(0))
    for i in range(3):
        plog.append(build_records([f"m-{i}".encode()]))
    dl.DeltaTable(client.root.uri(*plog.segments)).create_checkpoint()
    log_dir = tmp_path.joinpath(*plog.segments, "_delta_log")
    for v in range(2):  # what expired-log cleanup removes: the commits below the checkpoint's
        (log_dir / f"{v:020d}.json").unlink()
    writer = plog._writer
    assert writer is not None and writer.same_table()
    with caplog.at_level(logging.INFO, logger="pulsartx"):
        plog.sync_writer()
        res = plog.append(build_records([b"m-3"]))
    assert plog._writer is writer
    assert not [r for r in caplog.records if "re-created" in r.getMessage()]
    assert (res.first_offset, res.version) == (3, 4)

    client.admin.delete_topic("t")
    client.admin.create_topic("t", 1)
    assert not writer.same_table()
    plog.sync_writer()
    assert plog.append(build_records([b"new-0"])).version == 1


def test_the_losers_data_file_is_deleted(table):
    mine, theirs = appender(table), appender(table)
    mine.append(rows(0, 1), {"app.a": 0})
    with pytest.raises(delta.ConcurrentCommit):
        theirs.append(rows(1, 2), {"app.a": 1})
    root, segments = table
    on_disk = {f for f in os.listdir(root.uri(*segments)) if f.endswith(".parquet")}
    assert on_disk == {os.path.basename(u) for u in dl.DeltaTable(mine.uri).file_uris()}


@pytest.mark.parametrize("compression, codec", [(None, "UNCOMPRESSED"), ("ZSTD", "ZSTD"), ("lz4", "LZ4"),
                                                ("ZLib", "GZIP"), ("SNAPPY", "SNAPPY")])
def test_the_producers_compression_type_is_the_payload_columns_codec(tmp_path, compression, codec):
    """Pulsar's compressionType (default NONE) applies to the value column; the rest is zstd, except
    in files of a few rows, written plain (delta.SMALL_FILE_ROWS)."""
    import pyarrow.parquet as pq

    import pulsartx

    client = pulsartx.Client(str(tmp_path))
    client.admin.create_topic("t", 1)
    kwargs = {} if compression is None else {"compression_type": compression}
    producer = client.create_producer("t", batching_max_messages=100, batching_max_publish_delay_ms=60_000, **kwargs)
    values = [b"%04d" % i * 250 for i in range(100)]
    for v in values:  # one batch of 100: above SMALL_FILE_ROWS, so the other columns are zstd
        producer.send_async(v, None)
    producer.flush()
    producer.send(b"y")  # a one-row file: only the payload is compressed
    producer.close()
    files = dl.DeltaTable(client.root.uri("topics", "public", "default", "t", "partition-0")).file_uris()
    metas = [pq.ParquetFile(u.removeprefix("file://")).metadata for u in files]
    found = {}
    for meta in metas:
        rg = meta.row_group(0)
        found[meta.num_rows] = {rg.column(i).path_in_schema: rg.column(i).compression for i in range(rg.num_columns)}
    assert sorted(found) == [1, 100]
    assert found[100]["value"] == codec and found[100]["offset"] == "ZSTD"
    assert found[1]["value"] == codec and found[1]["offset"] == "UNCOMPRESSED"
    assert [m.data() for m in client.create_reader("t", pulsartx.MessageId.earliest)] == [*values, b"y"]


def test_an_unknown_compression_type_is_refused_by_name(tmp_path):
    import pulsartx
    from pulsartx.exceptions import InvalidConfiguration

    client = pulsartx.Client(str(tmp_path))
    client.admin.create_topic("t", 1)
    with pytest.raises(InvalidConfiguration, match=r"compression_type='brotli'.*NONE, LZ4, ZLib, ZSTD, SNAPPY"):
        client.create_producer("t", compression_type="brotli")


def test_a_checkpoint_that_cannot_be_scheduled_never_fails_the_commit(table, monkeypatch):
    """At interpreter exit executors refuse work while daemon threads (a consumer's ack flush, a
    producer's batch timer) may still append: the 100th commit has landed and must be reported so."""
    from pulsartx.storage import appender as ap
    from pulsartx.storage.pools import ProcessPool

    closed = ProcessPool(1, "pulsartx-checkpoint")
    closed.get().shutdown()
    monkeypatch.setattr(ap, "_CHECKPOINTS", closed)
    a = appender(table)
    for i in range(CHECKPOINT_INTERVAL):
        assert a.append(rows(i, i + 1)) == i + 1
    assert a.uri not in ap._CHECKPOINT_QUEUED  # nothing stuck for the next one
    assert dl.DeltaTable(a.uri).version() == CHECKPOINT_INTERVAL
    wait_for_checkpoints()  # refused quietly as well


# ---- compaction commits (KeyedLog snapshots) ------------------------------------------------------------


def active_files(table) -> set[str]:
    root, segments = table
    return set(pa.table(dl.DeltaTable(root.uri(*segments)).get_add_actions(flatten=True)).column("path").to_pylist())


def test_a_compaction_commit_replaces_exactly_the_files_it_names(table):
    """Files someone added after the compactor's snapshot stay: their rows are not in its file."""
    mine, theirs = appender(table), appender(table)
    for i in range(3):
        mine.append(rows(i, i + 1))
    snapshot = active_files(table)
    theirs.catch_up()
    theirs.append(rows(10, 11))  # after mine's snapshot
    late = active_files(table) - snapshot
    v = mine.rewrite([(rows(0, 3), False)], [(f, None, False) for f in sorted(snapshot)])
    after = active_files(table)
    assert v == 5 and len(after) == 2 and late <= after and not after & snapshot
    t = dl.DeltaTable(mine.uri).to_pyarrow_table().sort_by("seq")
    assert t.column("seq").to_pylist() == [0, 1, 2, 10]
    commit = [json.loads(line) for line in open(os.path.join(mine.uri, "_delta_log", delta.commit_file(5)))]
    assert sorted(a["remove"]["path"] for a in commit if "remove" in a) == sorted(snapshot)
    assert [a["commitInfo"]["operation"] for a in commit if "commitInfo" in a] == ["OPTIMIZE"]
    assert {a[k]["dataChange"] for a in commit for k in ("add", "remove") if k in a} == {False}


def test_two_compactions_of_the_same_files_one_gives_up(table):
    a, b = appender(table), appender(table)
    a.append(rows(0, 1))
    a.append(rows(1, 2))
    b.catch_up()
    files = sorted(active_files(table))
    a.rewrite([(rows(0, 2), False)], [(f, None, False) for f in files])
    before = active_files(table)
    with pytest.raises(delta.ConcurrentCommit, match="removed files"):
        b.rewrite([(rows(0, 2), False)], [(f, None, False) for f in files])
    assert active_files(table) == before  # the loser committed nothing ...
    assert len(os.listdir(os.path.join(b.uri))) == len(before) + 2 + 1  # ... and deleted its data file
    assert dl.DeltaTable(a.uri).to_pyarrow_table().column("seq").to_pylist() == [0, 1]


def test_keyed_log_compaction_keeps_another_writers_entries(tmp_path):
    """The compactor catches up first (b's entry goes into the snapshot); a commit landing between
    its catch-up and its commit is the appender test above."""
    from pulsartx.storage.keyed_log import KeyedLog

    root = StorageRoot.resolve(str(tmp_path))
    schema = pa.schema([("seq", pa.int64(), False), ("key", pa.string(), False), ("v", pa.string())])

    def log() -> KeyedLog:
        return KeyedLog(root, ("kl",), schema, key_of=lambda r: r["key"], name="kl").open()

    a, b = log(), log()
    for i in range(6):
        a.put([{"seq": 0, "key": f"k{i}", "v": "old"}])
        a.put([{"seq": 1, "key": f"k{i}", "v": "new"}])
    b.put([{"seq": 0, "key": "late", "v": "b"}])  # a has not seen it
    assert a.compact(lambda r: r["key"] != "k0")
    expected = {f"k{i}": "new" for i in range(1, 6)} | {"late": "b"}
    assert {k: r["v"] for k, r in a.rows.items()} == expected
    fresh = log()
    assert {k: r["v"] for k, r in fresh.rows.items()} == expected
    assert fresh.files_since_compaction == 1  # one snapshot file
    assert sorted(dl.DeltaTable(root.uri("kl")).to_pyarrow_table().column("key").to_pylist()) == sorted(
        ["late", *[f"k{i}" for i in range(1, 6)]])
    b.put([{"seq": 1, "key": "late", "v": "b2"}])  # b keeps writing after a's compaction
    assert log().rows["late"]["v"] == "b2"


def test_a_keyed_log_whose_writer_started_over_reloads_what_it_skipped(tmp_path):
    """A writer idle for hours (or seeing the table's metadata change) jumps to a fresh snapshot
    before it raises ConcurrentCommit; the commits it jumped over must still reach the rows."""
    from pulsartx.storage.keyed_log import KeyedLog

    root = StorageRoot.resolve(str(tmp_path))
    schema = pa.schema([("seq", pa.int64(), False), ("key", pa.string(), False), ("v", pa.string())])

    def log() -> KeyedLog:
        return KeyedLog(root, ("kl",), schema, key_of=lambda r: r["key"], name="kl").open()

    a, b = log(), log()
    a.put([{"seq": 0, "key": "a", "v": "1"}])
    b.put([{"seq": 0, "key": "b", "v": "1"}])  # a has not seen it
    a._appender.reload()  # what DeltaAppender.append does on those paths
    a.refresh()
    assert {k: r["v"] for k, r in a.rows.items()} == {"a": "1", "b": "1"}
    assert a.compact(lambda r: True)
    assert {k: r["v"] for k, r in log().rows.items()} == {"a": "1", "b": "1"}


def test_app_id_answers_equal_delta_rs_across_a_checkpoint_and_expiry(tmp_path, monkeypatch):
    """The writer reads the table's app ids once (the last checkpoint plus the commits after it)
    instead of asking delta-rs per id: its answers must be delta-rs's, expired ids included."""
    import time as time_mod

    root = StorageRoot.resolve(str(tmp_path))
    delta.create_table(root, SCHEMA, "t", configuration={**delta.stats_config(["seq", "offset"]),
                                                         "delta.setTransactionRetentionDuration": "interval 7 days"})
    a = appender((root, ("t",)))
    real = time_mod.time
    monkeypatch.setattr(time_mod, "time", lambda: real() - 8 * 86_400)  # a writer whose clock is 8 days behind
    a.append(None, {"old.expired": 1})
    monkeypatch.setattr(time_mod, "time", real)
    for i in range(CHECKPOINT_INTERVAL + 5):  # a checkpoint at 100, commits after it
        a.append(None, {f"app.{i % 7}": i, f"marker.{i}": 0})
    wait_for_checkpoints()
    assert os.path.exists(tmp_path / "t" / "_delta_log" / f"{CHECKPOINT_INTERVAL:020d}.checkpoint.parquet")
    fresh = appender((root, ("t",)))
    ids = ["old.expired", "never.set", *(f"app.{k}" for k in range(7)), *(f"marker.{i}" for i in range(0, 105, 13))]
    theirs = dl.DeltaTable(fresh.uri)
    assert {i: fresh.txn_version(i) for i in ids} == {i: delta.txn_version(theirs, i) for i in ids}
    assert fresh.txn_version("old.expired") is None and fresh.txn_version("app.6") == 104
    assert isinstance(fresh._ids, dict)  # answered from one read of the log, not per id
    fresh.append(None, {"app.6": 200})  # and kept current by the writer's own commits
    assert fresh.txn_version("app.6") == 200


def test_a_long_lived_writer_forgets_short_lived_app_ids_when_delta_does(tmp_path, monkeypatch):
    """Marker guards live an hour (``lifetimes_ms``): Delta forgets them then, and so does the writer's
    memory, which otherwise kept every app id it ever applied."""
    import time as time_mod

    root = StorageRoot.resolve(str(tmp_path))
    delta.create_table(root, SCHEMA, "t", configuration={"delta.setTransactionRetentionDuration": "interval 7 days"})
    a = appender((root, ("t",)))
    real = time_mod.time
    monkeypatch.setattr(time_mod, "time", lambda: real() - 2 * 3600)  # two hours ago
    a.append(None, {"guard.old": 1, "producer.p": 1}, lifetimes_ms={"guard.old": 3_600_000})
    assert a.txn_version("guard.old") == 1  # live, an hour before it expires
    monkeypatch.setattr(time_mod, "time", real)
    a.append(None, {"guard.new": 2}, lifetimes_ms={"guard.new": 3_600_000})
    assert (a.txn_version("guard.old"), a.txn_version("guard.new"), a.txn_version("producer.p")) == (None, 2, 1)
    assert [e[1] for e in a._expiring] == ["guard.new"]
    t = dl.DeltaTable(a.uri)
    assert (t.transaction_version("guard.old"), t.transaction_version("guard.new")) == (None, 2)


def test_app_ids_of_a_writer_behind_the_last_checkpoint_are_read_as_of_its_version(table):
    """A checkpoint written since the writer last read the log lies past its version: the writer
    reads the checkpoint at the interval below its version instead, never a later state."""
    a = appender(table)
    for i in range(CHECKPOINT_INTERVAL + 10):
        a.append(None, {f"app.{i % 5}": i})
    wait_for_checkpoints()
    behind = appender(table)  # at version 110
    for i in range(CHECKPOINT_INTERVAL):
        a.append(None, {f"app.{i % 5}": 1000 + i})
    wait_for_checkpoints()
    assert json.loads(open(os.path.join(a.uri, "_delta_log", "_last_checkpoint")).read())["version"] >= 200
    then = dl.DeltaTable(a.uri, version=behind.version)
    assert {k: behind.txn_version(f"app.{k}") for k in range(5)} == {
        k: delta.txn_version(then, f"app.{k}") for k in range(5)}
    assert isinstance(behind._ids, dict)


def _appender_whose_log_expires_at_once(tmp_path):
    """A writer of a table whose commits expire as soon as a checkpoint covers them."""
    root = StorageRoot.resolve(str(tmp_path))
    delta.create_table(root, SCHEMA, "t", configuration={**delta.stats_config(["seq"]),
                                                         "delta.logRetentionDuration": "interval 0 seconds"})
    return appender((root, ("t",)))


def test_expired_logs_are_cleaned_at_every_tenth_checkpoint_only(tmp_path, monkeypatch):
    """Cleanup lists all of ``_delta_log``: it runs with every CLEANUP_EVERY-th checkpoint, not
    with each one, and then removes what the table's log retention lets it remove."""
    from pulsartx.storage import appender as appender_mod

    monkeypatch.setattr(appender_mod, "CHECKPOINT_INTERVAL", 10)
    monkeypatch.setattr(appender_mod, "CLEANUP_EVERY", 3)
    a = _appender_whose_log_expires_at_once(tmp_path)
    first = os.path.join(a.uri, "_delta_log", delta.commit_file(0))
    for i in range(29):
        a.append(rows(i, i + 1), {"app.x": i})
    wait_for_checkpoints()
    assert os.path.exists(os.path.join(a.uri, "_delta_log", f"{20:020d}.checkpoint.parquet"))
    assert os.path.exists(first)  # checkpoints at 10 and 20: no cleanup yet
    a.append(rows(29, 30), {"app.x": 29})
    wait_for_checkpoints()
    assert not os.path.exists(first)  # the third checkpoint cleaned up
    t = dl.DeltaTable(a.uri)
    assert t.version() == 30 and t.transaction_version("app.x") == 29
    assert sorted(t.to_pyarrow_table().column("seq").to_pylist()) == list(range(30))


def test_a_process_cleans_a_tables_expired_log_at_most_once_an_hour(tmp_path, monkeypatch):
    """A busy partition reaches every 1,000th version within seconds, and each cleanup opens the
    table with delta-rs (a cost that grows with its live files), while nothing in a log expires
    sooner than its retention: once a cleanup ran, the next waits CLEANUP_MIN_INTERVAL_S."""
    from pulsartx.storage import appender as appender_mod

    monkeypatch.setattr(appender_mod, "CHECKPOINT_INTERVAL", 10)
    monkeypatch.setattr(appender_mod, "CLEANUP_EVERY", 1)
    a = _appender_whose_log_expires_at_once(tmp_path)
    appender_mod._LAST_CLEANUP.pop(a.uri, None)
    log_dir = os.path.join(a.uri, "_delta_log")
    for i in range(10):
        a.append(rows(i, i + 1))
    wait_for_checkpoints()
    assert not os.path.exists(os.path.join(log_dir, delta.commit_file(0)))  # the first cleanup ran
    for i in range(10, 30):
        a.append(rows(i, i + 1))
    wait_for_checkpoints()
    assert os.path.exists(os.path.join(log_dir, delta.commit_file(15)))  # within the hour: none since
    monkeypatch.setattr(appender_mod, "CLEANUP_MIN_INTERVAL_S", 0.0)
    for i in range(30, 40):
        a.append(rows(i, i + 1))
    wait_for_checkpoints()
    assert not os.path.exists(os.path.join(log_dir, delta.commit_file(15)))
    assert sorted(dl.DeltaTable(a.uri).to_pyarrow_table().column("seq").to_pylist()) == list(range(40))


def test_a_compaction_that_sets_properties_restates_the_latest_metadata(table):
    """The metaData action a rewrite writes starts from the newest metadata this writer has
    applied (a foreign change read by catch_up does not reload the handle), never an older one."""
    mine, theirs = appender(table), appender(table)
    mine.append(rows(0, 2))
    mine.append(rows(2, 4))
    theirs.catch_up()
    theirs.table.alter.set_table_properties({"delta.appendOnly": "false"})  # another writer's metadata change
    mine.catch_up()  # applied, not reloaded: the handle still holds the metadata of version 0
    assert mine.configuration()["delta.appendOnly"] == "false"
    files = sorted(str(p) for p in delta.add_actions(delta.open_table(table[0], *table[1])).column("path").to_pylist())
    v = mine.rewrite([(rows(0, 4), False)], [(f, None, False) for f in files],
                     properties={"delta.deletedFileRetentionDuration": "interval 60 seconds"})
    t = dl.DeltaTable(mine.uri)
    assert t.version() == v
    assert t.metadata().configuration == {**delta.stats_config(["seq", "offset", "at"]), "delta.appendOnly": "false",
                                          "delta.deletedFileRetentionDuration": "interval 60 seconds"}
    assert (t.protocol().min_reader_version, t.protocol().min_writer_version) == (1, 2)
    assert t.to_pyarrow_table().sort_by("seq").equals(rows(0, 4))
    assert mine.configuration() == t.metadata().configuration
    # A writer that steps onto the change re-reads the table and tries again.
    with pytest.raises(delta.ConcurrentCommit, match="metadata changed"):
        theirs.append(rows(4, 5))
    assert theirs.append(rows(4, 5)) == v + 1
