"""The partition log: MessageId, dedup, appends with dense offsets, and incremental tailing."""
from __future__ import annotations

import os
import shutil
import struct

import pytest

import pulsartx.log.partition as partition_mod
from pulsartx import Client, MessageId, Timeout
from pulsartx.admin.topics import TopicsAdmin
from pulsartx.exceptions import InvalidConfiguration, TopicNotFound
from pulsartx.log.dedup import OFFSET_APP_ID, new_message_mask, producer_app_id
from pulsartx.log.partition import PartitionLog, build_records
from pulsartx.naming import TopicName
from pulsartx.storage import delta
from pulsartx.storage.appender import wait_for_checkpoints
from pulsartx.storage.root import StorageRoot

# ---- MessageId ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mid", [MessageId(0, 0), MessageId(3, 12345), MessageId(0, 2**63 - 2), MessageId.earliest,
                                 MessageId.latest])
def test_message_id_round_trip(mid):
    data = mid.serialize()
    assert isinstance(data, bytes) and len(data) == 13
    back = MessageId.deserialize(data)
    assert back == mid and hash(back) == hash(mid)
    assert (back.partition(), back.offset()) == (mid.partition(), mid.offset())
    assert MessageId.deserialize(bytearray(data)) == mid
    assert MessageId.deserialize(memoryview(data)) == mid


def test_message_id_accessors_and_str():
    m = MessageId(2, 7)
    assert (m.partition(), m.offset()) == (2, 7)
    assert str(m) == "(2,7)"
    assert str(MessageId.earliest) == "earliest" and str(MessageId.latest) == "latest"
    assert MessageId.earliest.is_earliest and not MessageId.earliest.is_latest
    assert MessageId.latest.is_latest and not MessageId.latest.is_earliest
    assert not m.is_earliest and not m.is_latest


def test_message_id_total_order_within_partition():
    ids = [MessageId(0, o) for o in (5, 0, 3, 1, 4, 2)]
    assert sorted(ids) == [MessageId(0, o) for o in range(6)]
    for a in range(6):
        for b in range(6):
            x, y = MessageId(0, a), MessageId(0, b)
            assert (x < y, x <= y, x == y, x > y, x >= y) == (a < b, a <= b, a == b, a > b, a >= b)


@pytest.mark.parametrize("mid", [MessageId(0, 0), MessageId(0, 10**12), MessageId(5, 0), MessageId(9999, 2**62)])
def test_earliest_before_and_latest_after_every_position(mid):
    assert MessageId.earliest < mid < MessageId.latest
    assert MessageId.latest > mid > MessageId.earliest
    assert MessageId.earliest <= mid <= MessageId.latest
    assert sorted([MessageId.latest, mid, MessageId.earliest]) == [MessageId.earliest, mid, MessageId.latest]
    assert MessageId.earliest != mid != MessageId.latest


@pytest.mark.parametrize("garbage", [b"", b"garbage", b"\x00" * 12, b"\x01" * 14, b"\x02" + b"\x00" * 12,
                                     "not bytes", None, 12])
def test_message_id_deserialize_garbage(garbage):
    with pytest.raises(InvalidConfiguration, match="deserialize MessageId"):
        MessageId.deserialize(garbage)


def test_message_id_deserialize_unknown_version_names_it():
    with pytest.raises(InvalidConfiguration, match="unknown format version 7"):
        MessageId.deserialize(struct.pack(">Biq", 7, 0, 0))


# ---- dedup rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seqs,last,expected", [
    ([], None, []),
    ([0, 1, 2], None, [True, True, True]),
    ([0, 1, 2], -1, [True, True, True]),
    ([0, 1, 2], 0, [False, True, True]),  # version 0 is a real value, not "nothing persisted"
    ([0, 1, 2], 2, [False, False, False]),
    ([1, 2, 3, 4], 2, [False, False, True, True]),
    ([5, 3, 6], None, [True, False, True]),  # must also beat every kept predecessor in the batch
    ([3, 3, 4, 4], None, [True, False, True, False]),
    ([10, 11], 100, [False, False]),
    ([7, 5, 8], 4, [True, False, True]),
])
def test_new_message_mask(seqs, last, expected):
    assert new_message_mask(seqs, last) == expected


def test_app_ids():
    assert producer_app_id("p-1") == "pulsartx.producer.p-1"
    assert OFFSET_APP_ID == "pulsartx.offset"


# ---- appends ------------------------------------------------------------------------------------


@pytest.fixture
def sroot(root):
    return StorageRoot.resolve(root)  # local directory or RGW bucket (conftest's storage fixture)


@pytest.fixture
def plog(sroot):
    TopicsAdmin(sroot).create_topic("t")
    return PartitionLog(sroot, TopicName.parse("t-partition-0"))


def _values(plog: PartitionLog) -> tuple[list[int], list[bytes]]:
    t = plog.read(0, plog.end_offset())
    return t.column("offset").to_pylist(), t.column("value").to_pylist()


def test_append_assigns_dense_offsets(plog):
    r1 = plog.append(build_records([b"a", b"b", b"c"]))
    assert (r1.offsets, r1.first_offset, r1.last_offset, r1.version, r1.duplicates) == ([0, 1, 2], 0, 2, 1, 0)
    assert r1.entries == [(0, 2)]
    r2 = plog.append(build_records([b"d"]))
    assert (r2.offsets, r2.first_offset, r2.last_offset, r2.version) == ([3], 3, 3, 2)
    r3 = plog.append(build_records([b"e", b"f"]))
    assert (r3.offsets, r3.version) == ([4, 5], 3)
    assert _values(plog) == ([0, 1, 2, 3, 4, 5], [b"a", b"b", b"c", b"d", b"e", b"f"])
    assert plog.end_offset() == 6
    # Ranges are half-open and come back in offset order.
    assert plog.read(2, 5).column("offset").to_pylist() == [2, 3, 4]
    assert plog.read(5, 100).column("value").to_pylist() == [b"f"]
    assert plog.read(6, 10).num_rows == 0
    # The CAS key holds the next offset.
    t = delta.open_table(plog.root, *plog.segments)
    assert delta.txn_version(t, OFFSET_APP_ID) == 6


def test_append_dedup_drops_persisted_sequence_ids(plog):
    mk = lambda vals, seqs: build_records(vals, producer_name="p", sequence_ids=seqs)  # noqa: E731
    r = plog.append(mk([b"s0", b"s1", b"s2"], [0, 1, 2]), producer_name="p")
    assert (r.offsets, r.duplicates) == ([0, 1, 2], 0)
    assert plog.last_sequence_id("p") == 2

    r = plog.append(mk([b"s1", b"s2", b"s3", b"s4"], [1, 2, 3, 4]), producer_name="p")
    assert (r.offsets, r.duplicates, r.first_offset, r.last_offset) == ([None, None, 3, 4], 2, 3, 4)

    r = plog.append(mk([b"s4"], [4]), producer_name="p")
    assert (r.offsets, r.version, r.duplicates, r.first_offset) == ([None], None, 1, None)

    r = plog.append(mk([b"s7", b"s5", b"s8"], [7, 5, 8]), producer_name="p")
    assert (r.offsets, r.duplicates) == ([5, None, 6], 1)
    assert plog.last_sequence_id("p") == 8

    # Another producer has its own sequence; records without a producer are never deduplicated.
    r = plog.append(build_records([b"q0"], producer_name="q", sequence_ids=[0]), producer_name="q")
    assert r.offsets == [7]
    r = plog.append(build_records([b"n", b"n"]))
    assert r.offsets == [8, 9]
    assert plog.last_sequence_id("q") == 0
    assert plog.last_sequence_id("nobody") is None

    t = plog.read(0, plog.end_offset())
    assert t.column("offset").to_pylist() == list(range(10))
    assert t.column("value").to_pylist() == [b"s0", b"s1", b"s2", b"s3", b"s4", b"s7", b"s8", b"q0", b"n", b"n"]
    assert t.column("sequence_id").to_pylist() == [0, 1, 2, 3, 4, 7, 8, 0, None, None]
    assert t.column("producer_name").to_pylist() == ["p"] * 7 + ["q", None, None]


def test_dedup_survives_a_new_log_handle(plog, sroot):
    plog.append(build_records([b"a", b"b"], producer_name="p", sequence_ids=[10, 11]), producer_name="p")
    fresh = PartitionLog(sroot, TopicName.parse("t-partition-0"))
    assert fresh.last_sequence_id("p") == 11
    r = fresh.append(build_records([b"b", b"c"], producer_name="p", sequence_ids=[11, 12]), producer_name="p")
    assert r.offsets == [None, 2]
    assert _values(fresh) == ([0, 1, 2], [b"a", b"b", b"c"])


def test_missing_partition(sroot):
    TopicsAdmin(sroot).create_topic("t", partitions=2)
    missing = PartitionLog(sroot, TopicName.parse("t-partition-5"))
    assert not missing.exists()
    with pytest.raises(TopicNotFound, match="t-partition-5"):
        missing.append(build_records([b"x"]))
    with pytest.raises(TopicNotFound, match="t-partition-5"):
        missing.refresh()
    assert PartitionLog(sroot, TopicName.parse("t-partition-1")).exists()


def test_record_columns_round_trip(plog):
    plog.append(build_records([b"v1", b"v2"], keys=["k1", None], properties=[{"a": "1", "b": "2"}, None],
                              event_times_ms=[1_700_000_000_123, None], producer_name="p", sequence_ids=[0, 1]),
                producer_name="p")
    t = plog.read(0, 2).to_pylist()
    assert [r["key"] for r in t] == ["k1", None]
    assert [r["properties"] for r in t] == [[("a", "1"), ("b", "2")], []]  # no properties: an empty map
    assert t[0]["event_time"].timestamp() * 1000 == pytest.approx(1_700_000_000_123)
    assert t[1]["event_time"] is None
    assert [r["type"] for r in t] == ["DATA", "DATA"]
    assert t[0]["publish_time"] == t[1]["publish_time"]  # one commit, one publish time


# ---- tailing is incremental ---------------------------------------------------------------------

N_TAIL_APPENDS = int(os.environ.get("PULSARTX_TEST_TAIL_APPENDS", "200"))


def _count_read_commit(plog: PartitionLog) -> list[tuple[int, bool]]:
    calls: list[tuple[int, bool]] = []
    orig = plog._tail.read_commit

    def counting(version):
        out = orig(version)
        calls.append((version, out is not None))
        return out

    plog._tail.read_commit = counting
    return calls


@pytest.fixture(scope="module", autouse=True)
def _no_background_merges():
    """These tests count the commits and files a read or open touches; a writer's background merge
    of small files (tested in test_small_file_merging.py) adds both."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(partition_mod, "MERGE_EVERY", 0)
        yield


@pytest.fixture(scope="module")
def long_log(tmp_path_factory) -> str:
    """A root whose one partition has N single-message commits (built once, copied per test)."""
    path = str(tmp_path_factory.mktemp("long-log") / "root")
    root = StorageRoot.resolve(path)
    TopicsAdmin(root).create_topic("tail")
    writer = PartitionLog(root, TopicName.parse("tail-partition-0"))
    for i in range(N_TAIL_APPENDS):
        writer.append(build_records([b"m%d" % i]))
    assert writer.end_offset() == N_TAIL_APPENDS
    wait_for_checkpoints()  # background checkpoints done before the tests copy the root
    return path


def _copy_of(long_log: str, tmp_path) -> tuple[str, StorageRoot, PartitionLog]:
    path = str(tmp_path / "root")
    shutil.copytree(long_log, path)
    root = StorageRoot.resolve(path)
    return path, root, PartitionLog(root, TopicName.parse("tail-partition-0"))


def test_tailing_reads_only_new_commits(long_log, tmp_path, monkeypatch):
    """After N single-message appends (crossing automatic checkpoints), catching up costs the new
    commits only: no snapshot reload, one commit file read per new commit."""
    _, root, writer = _copy_of(long_log, tmp_path)
    n = N_TAIL_APPENDS
    assert os.path.exists(root.fs_path(*writer.segments, "_delta_log", "_last_checkpoint"))
    assert writer.last_sequence_id("nobody") is None  # opens the writer's table before counting opens

    # A log handle opened now loads the snapshot (checkpoint-based) once...
    tailer = PartitionLog(root, TopicName.parse("tail-partition-0"))
    calls = _count_read_commit(tailer)
    idx = tailer.refresh()
    assert (idx.version, idx.end_offset, len(idx.files)) == (n, n, n)
    assert calls == [(n + 1, False)]

    opens = []
    orig_open = delta.open_table
    monkeypatch.setattr(partition_mod.delta, "open_table", lambda *a, **k: opens.append(a) or orig_open(*a, **k))

    # ...then a refresh with nothing new probes one missing commit file...
    calls.clear()
    assert tailer.refresh() is idx
    assert calls == [(n + 1, False)]

    # ...and one more append costs exactly one commit read.
    writer.append(build_records([b"new"]))
    calls.clear()
    assert tailer.refresh() is idx
    assert calls == [(n + 1, True), (n + 2, False)]
    assert (idx.version, idx.end_offset) == (n + 1, n + 1)

    # Three more appends: three commit reads.
    for i in range(3):
        writer.append(build_records([b"more%d" % i]))
    calls.clear()
    tailer.refresh()
    assert calls == [(n + 2, True), (n + 3, True), (n + 4, True), (n + 5, False)]
    assert opens == []  # never reloaded the table
    assert tailer.read(n, n + 4).column("value").to_pylist() == [b"new", b"more0", b"more1", b"more2"]


@pytest.mark.parametrize("isolation", ["READ_UNCOMMITTED", "READ_COMMITTED"])
def test_reader_at_end_reads_only_the_new_message(long_log, tmp_path, monkeypatch, isolation):
    root_path, _, writer = _copy_of(long_log, tmp_path)
    n = N_TAIL_APPENDS

    with Client(root_path) as client:
        reader = client.create_reader("tail", MessageId.latest, isolation_level=isolation)
        fetcher = reader._fetchers[0]
        calls = _count_read_commit(fetcher.log)
        reads: list[tuple[int, int, list[str]]] = []
        orig_read_files = partition_mod.read_files

        def counting_read_files(root_, segments, files, start, end, columns=None):
            reads.append((start, end, [f.path for f in files]))
            return orig_read_files(root_, segments, files, start, end, columns)

        monkeypatch.setattr(partition_mod, "read_files", counting_read_files)
        assert not reader.has_message_available()
        assert calls == [(n + 1, False)]
        assert [r for r in reads if r[2]] == []  # no data file opened

        writer.append(build_records([b"the-new-one"]))
        calls.clear()
        msg = reader.read_next(timeout_millis=2000)
        assert (msg.data(), msg.message_id()) == (b"the-new-one", MessageId(0, n))
        # One new commit read (then probes for the next one, which does not exist yet)...
        assert [v for v, hit in calls if hit] == [n + 1]
        assert {v for v, hit in calls if not hit} == {n + 2}
        # ...and only the new data file, for only the new offset, once: READ_COMMITTED's fold of the
        # transaction buffer skips it, as its statistics show no transactional record.
        reads = [r for r in reads if r[2]]
        assert len(reads) == 1
        for start, end, files in reads:
            assert (start, end, len(files)) == (n, n + 1, 1)
        assert len({r[2][0] for r in reads}) == 1
        with pytest.raises(Timeout):
            reader.read_next(timeout_millis=50)


def test_only_statistics_that_prove_it_make_a_file_transaction_free():
    """The transaction buffer skips reading a txn_free file; a table written before txn_most_bits
    had statistics (no null count) must read as before."""
    import json as _json

    from pulsartx.log.index import data_file_from_add

    def add(null_counts: dict, records: int = 3) -> dict:
        stats = {"numRecords": records, "minValues": {"offset": 0}, "maxValues": {"offset": records - 1},
                 "nullCount": null_counts}
        return {"path": "f.parquet", "size": 1, "stats": _json.dumps(stats)}

    assert data_file_from_add(add({"offset": 0, "txn_most_bits": 3})).txn_free
    assert not data_file_from_add(add({"offset": 0, "txn_most_bits": 2})).txn_free  # one transactional row
    assert not data_file_from_add(add({"offset": 0})).txn_free  # an older table: unknown
    assert not data_file_from_add(add({})).txn_free


@pytest.mark.parametrize("checkpoint", [False, True])
def test_offsets_continue_after_the_offset_app_id_expired(root, monkeypatch, checkpoint):
    """Partition tables let idle app ids expire after 7 days (producer dedup state, as Pulsar
    forgets idle producers), and delta-rs drops an expired one whenever it loads a snapshot. The
    next offset must come from the log itself. Fails before the fix: appends made by a clock eight
    days behind, then a fresh handle, and the next append started again at offset 0."""
    import time

    sroot = StorageRoot.resolve(root)
    TopicsAdmin(sroot).create_topic("idle", 1)
    topic = TopicName.parse("idle").with_partition(0)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 8 * 86400)
    old = PartitionLog(sroot, topic)
    assert old.append(build_records([b"a", b"b", b"c"])).entries == [(0, 2)]
    monkeypatch.setattr(time, "time", real)
    if checkpoint:
        delta.open_table(sroot, *old.segments).create_checkpoint()
    assert delta.open_table(sroot, *old.segments).transaction_version(OFFSET_APP_ID) is None  # expired
    fresh = PartitionLog(sroot, topic)
    assert fresh.append(build_records([b"d", b"e"])).entries == [(3, 4)]
    rows = PartitionLog(sroot, topic).read(0, 10, ["offset", "value"]).to_pylist()
    assert [(r["offset"], r["value"]) for r in rows] == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e")]


def test_open_from_a_checkpoint_without_delta_rs_matches_delta_rs(plog, sroot):
    """A partition with a checkpoint is opened from it and the commits after it (no delta-rs):
    the same files, statistics, version and table id as delta-rs's snapshot, also after a
    compaction (removes after the checkpoint) and with a stale ``_last_checkpoint`` hint."""
    from pulsartx.log.index import FileIndex
    from pulsartx.maintenance.compaction import compact_partition

    for i in range(104):
        plog.append(build_records([f"m{i}".encode()]))
    wait_for_checkpoints()  # at version 100
    res = compact_partition(sroot, plog.topic, min_files=2)
    assert res.files_after < res.files_before, res
    for i in range(3):
        plog.append(build_records([f"late{i}".encode()]))
    # A stale hint: a newer checkpoint, the hint still naming the older one.
    delta.open_table(sroot, *plog.segments).create_checkpoint()
    sroot.write_text('{"version":100,"size":1}', *plog.segments, "_delta_log", "_last_checkpoint")

    light = delta.read_checkpointed_snapshot(sroot, plog.segments)
    t = delta.open_table(sroot, *plog.segments)
    assert light is not None and (light.version, light.table_id) == (t.version(), t.metadata().id)
    from_light, from_delta_rs = FileIndex(), FileIndex()
    from_light.load_adds(light.adds.values(), light.version)
    from_delta_rs.load_snapshot(t)
    assert from_light.files == from_delta_rs.files and from_light.version == from_delta_rs.version
    fresh = PartitionLog(sroot, plog.topic)
    assert fresh.end_offset() == 107
    assert fresh.read(0, 107).column("value").to_pylist() == [f"m{i}".encode() for i in range(104)] + [
        f"late{i}".encode() for i in range(3)]
    # No checkpoint (a young table): delta-rs opens it.
    assert delta.read_checkpointed_snapshot(sroot, ("nowhere",)) is None
