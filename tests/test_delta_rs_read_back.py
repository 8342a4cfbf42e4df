"""Commits made through delta-rs (``delta.write``, ``delta.replace_files``) whose answer was lost are
read back for their own ``pulsartxCommitId``, never guessed: a landed one is this call's success,
the read-back is retried whatever its error for the storage retry budget, and only then is the
outcome unknown (``OutcomeUnknown``). The handle refresh (``delta.update``) has its fail point too."""
from __future__ import annotations

from collections.abc import Iterator

import deltalake as dl
import pyarrow as pa
import pytest

import pulsartx
from pulsartx.buffer.snapshot import SnapshotStore
from pulsartx.buffer.state import BufferState
from pulsartx.exceptions import StorageError
from pulsartx.log.partition import PartitionLog, build_records
from pulsartx.maintenance.compaction import compact_partition
from pulsartx.maintenance.retention import apply_retention
from pulsartx.naming import TopicName
from pulsartx.storage import delta, faults
from pulsartx.storage.appender import DeltaAppender
from pulsartx.storage.faults import Fault, Mode, Op
from pulsartx.storage.root import StorageRoot

SCHEMA = pa.schema([("seq", pa.int64(), False), ("name", pa.string())])
PART = TopicName.parse("r-partition-0")

pytestmark = pytest.mark.usefixtures("no_faults")  # the fixture is in conftest.py


def rows(*seqs: int) -> pa.Table:
    return pa.table({"seq": list(seqs), "name": [f"n{s}" for s in seqs]}, schema=SCHEMA)


@pytest.fixture
def table(tmp_path, monkeypatch) -> tuple[StorageRoot, tuple[str, ...]]:
    """A table of two one-row files (versions 1 and 2), a short retry budget."""
    monkeypatch.setenv(delta.RETRY_ENV, "5")
    root = StorageRoot.resolve(str(tmp_path))
    delta.create_table(root, SCHEMA, "t", configuration=delta.stats_config(["seq"]))
    for s in (0, 1):
        dl.write_deltalake(root.uri("t"), rows(s), mode="append")
    return root, ("t",)


def _commits(root: StorageRoot, segments: tuple[str, ...]) -> Iterator[tuple[int, list[dict]]]:
    return delta.LogTail(root, segments).commits_after(-1)


def _live(root: StorageRoot, segments: tuple[str, ...]) -> list[tuple[str, int]]:
    return [(a["path"], a["size_bytes"]) for a in delta.add_actions(dl.DeltaTable(root.uri(*segments))).to_pylist()]


def _seqs(root: StorageRoot, segments: tuple[str, ...]) -> list[int]:
    return sorted(dl.DeltaTable(root.uri(*segments)).to_pyarrow_table().column("seq").to_pylist())


def _lost_once(monkeypatch, error: BaseException) -> list[int]:
    """delta-rs's file swap lands, then its caller sees ``error``; the handle stays at its version,
    as after an answer lost on an object store. Returns the list of calls made."""
    real = dl.DeltaTable.create_write_transaction
    calls: list[int] = []

    def lost(self, *args, **kwargs):
        calls.append(self.version())
        real(self, *args, **kwargs)
        if len(calls) == 1:
            raise error

    monkeypatch.setattr(dl.DeltaTable, "create_write_transaction", lost)
    return calls


@pytest.mark.parametrize("error", [ConnectionResetError("connection reset by peer"),
                                   dl.exceptions.CommitFailedError("Transaction failed: a concurrent transaction "
                                                                   "deleted the same data your transaction deletes")],
                         ids=["lost-answer", "delta-rs-retry-met-its-own-commit"])
def test_a_file_swap_whose_answer_was_lost_is_its_own_commit_not_a_concurrent_change(table, monkeypatch, error):
    """Fails before the fix: the swap was sent again (or delta-rs's own retry of the put met it)
    and met its own removes as another writer's, so it reported ConcurrentCommit, and compaction or
    retention planned again a swap that had landed."""
    root, segments = table
    calls = _lost_once(monkeypatch, error)
    delta.replace_files(root, delta.open_table(root, *segments), segments, _live(root, segments), rows(0, 1), ["seq"])
    monkeypatch.undo()
    assert calls == [2]  # sent once
    assert [v for v, _ in _commits(root, segments)] == [0, 1, 2, 3]
    assert len(_live(root, segments)) == 1 and _seqs(root, segments) == [0, 1]


def test_a_lost_answer_at_the_file_swaps_fail_point_is_read_back(table):
    """A permanent-looking error after the swap took effect is not a failure either."""
    root, segments = table
    lost = Fault(Op.DELTA, Mode.LOST, match=root.uri(*segments))
    handle, live = delta.open_table(root, *segments), _live(root, segments)
    faults.install([lost])
    delta.replace_files(root, handle, segments, live, None, ["seq"])
    faults.clear()
    assert lost.fired == 1
    assert [v for v, _ in _commits(root, segments)] == [0, 1, 2, 3]
    assert _live(root, segments) == []


def test_a_file_swap_that_did_not_land_reports_its_error(table):
    root, segments = table
    handle, live = delta.open_table(root, *segments), _live(root, segments)
    failed = Fault(Op.DELTA, match=root.uri(*segments))
    faults.install([failed])
    with pytest.raises(StorageError, match="injected I/O error"):
        delta.replace_files(root, handle, segments, live, None, ["seq"])
    assert failed.fired == 1
    faults.clear()
    assert [v for v, _ in _commits(root, segments)] == [0, 1, 2]


def test_a_lost_file_swap_whose_log_cannot_be_read_back_is_outcome_unknown(table, monkeypatch):
    root, segments = table
    monkeypatch.setenv(delta.RETRY_ENV, "0.3")
    handle, live = delta.open_table(root, *segments), _live(root, segments)
    faults.install([Fault(Op.DELTA, Mode.LOST, match=root.uri(*segments)),
                    Fault(Op.READ, match="_delta_log", times=10_000)])
    with pytest.raises(delta.OutcomeUnknown, match="unknown"):
        delta.replace_files(root, handle, segments, live, None, ["seq"])
    faults.clear()
    assert _live(root, segments) == []  # it had landed


def _partition(tmp_path, n: int) -> pulsartx.Client:
    c = pulsartx.Client(str(tmp_path / "root"))
    c.admin.create_topic("r", partitions=1)
    plog = PartitionLog(c.root, PART)
    for i in range(n):  # one file (one version) per message
        plog.append(build_records([f"m{i}".encode()]))
    return c


def test_retention_whose_swap_answer_was_lost_deletes_once_and_says_so(tmp_path, monkeypatch):
    """Fails before the fix: the landed swap came back as a concurrent change, the retry found
    nothing left to delete, and retention reported no file deleted (and trimmed nothing)."""
    c = _partition(tmp_path, 3)
    files = PartitionLog(c.root, PART).refresh().files
    calls = _lost_once(monkeypatch, ConnectionResetError("connection reset by peer"))
    res = apply_retention(c.root, PART, max_bytes=files[-1].size, force=True)
    monkeypatch.undo()
    assert len(calls) == 1
    assert res.files_deleted == 2 and res.new_start_offset == 2
    assert [f.path for f in PartitionLog(c.root, PART).refresh().files] == [files[-1].path]
    c.close()


def test_a_compaction_through_delta_rs_whose_answer_was_lost_is_not_redone(tmp_path, monkeypatch):
    """A store without conditional put compacts through ``replace_files``. Fails before the fix:
    the landed compaction was reported as skipped for a concurrent change."""
    c = _partition(tmp_path, 3)
    monkeypatch.setattr(StorageRoot, "has_put_if_absent", property(lambda self: False))
    calls = _lost_once(monkeypatch, ConnectionResetError("connection reset by peer"))
    res = compact_partition(c.root, PART)
    assert len(calls) == 1
    assert res.skipped is None and (res.files_before, res.files_after) == (3, 1)
    swaps = [v for v, actions in _commits(c.root, PartitionLog(c.root, PART).segments)
             if any("remove" in a for a in actions)]
    assert len(swaps) == 1
    monkeypatch.undo()
    values = PartitionLog(c.root, PART).read(0, 3).column("value").to_pylist()
    assert values == [b"m0", b"m1", b"m2"]
    c.close()


def test_a_delta_rs_write_whose_read_back_meets_io_errors_keeps_reading_for_the_budget(table):
    """Fails before the fix: the first permanent read error of the read-back made the write's
    outcome unknown at once, though the log was readable a moment later and held the write."""
    root, segments = table
    handle = delta.open_table(root, *segments)
    reads = Fault(Op.READ, match="_delta_log", times=3)
    faults.install([Fault(Op.DELTA, Mode.LOST, transient=True), reads])
    assert delta.write(handle, rows(2), tail=delta.LogTail(root, segments)) == 3
    faults.clear()
    assert reads.fired == 3
    assert handle.version() == 3 and _seqs(root, segments) == [0, 1, 2]


def test_a_delta_rs_write_with_a_permanent_looking_error_after_it_landed_is_read_back(table):
    """Fails before the fix: an error that was not transient was reported as a failed write
    (StorageError) though the write had landed; a caller resending it wrote the rows twice."""
    root, segments = table
    handle = delta.open_table(root, *segments)
    faults.install([Fault(Op.DELTA, Mode.LOST)])
    assert delta.write(handle, rows(2), tail=delta.LogTail(root, segments)) == 3
    faults.clear()
    assert handle.version() == 3 and _seqs(root, segments) == [0, 1, 2]


def test_a_delta_rs_write_that_did_not_land_reports_its_error_after_reading_back(table, monkeypatch):
    root, segments = table
    handle = delta.open_table(root, *segments)

    def refused(*args, **kwargs):
        raise OSError("injected: the store refused the write")

    monkeypatch.setattr(dl, "write_deltalake", refused)
    with pytest.raises(StorageError, match="cannot write to Delta table .*refused the write"):
        delta.write(handle, rows(2), tail=delta.LogTail(root, segments))
    assert [v for v, _ in _commits(root, segments)] == [0, 1, 2]


def test_a_delta_rs_write_whose_read_back_fails_for_the_budget_is_outcome_unknown(table, monkeypatch):
    """Permanent read errors for the whole budget: unknown, as with transient ones (test_faults)."""
    root, segments = table
    monkeypatch.setenv(delta.RETRY_ENV, "0.3")
    handle = delta.open_table(root, *segments)
    faults.install([Fault(Op.DELTA, Mode.LOST, transient=True), Fault(Op.READ, match="_delta_log", times=10_000)])
    with pytest.raises(delta.OutcomeUnknown, match="unknown"):
        delta.write(handle, rows(2), tail=delta.LogTail(root, segments))
    faults.clear()
    assert _seqs(root, segments) == [0, 1, 2]  # it had landed


def _two_writers(table) -> tuple[DeltaAppender, DeltaAppender]:
    root, segments = table
    return tuple(DeltaAppender(root, segments, delta.open_table(root, *segments), SCHEMA) for _ in range(2))


def test_a_lost_answer_refreshing_the_handle_is_read_again_not_assumed(table):
    """The refresh took effect and its answer was lost: it is retried (read again), and the
    handle and the writer's state stand at the latest version. Fails before the fix: the refresh
    had no fail point, so its faults could not be tested at all."""
    a, b = _two_writers(table)
    b.append(rows(2), {"app.b": 1})
    lost = Fault(Op.DELTA, Mode.LOST, transient=True, match=a.uri)
    faults.install([lost])
    handle = a.sync_handle()
    faults.clear()
    assert lost.fired == 1
    assert handle.version() == a.version == 3 and a.txn_version("app.b") == 1


def test_a_refresh_that_failed_after_moving_the_handle_leaves_the_writer_exact(table):
    """A permanent error after the handle moved: the caller sees the error (nothing is assumed
    about where the handle stands), and the writer's next write through delta-rs steps over the
    commits it had not applied instead of losing them."""
    root, segments = table
    a, b = _two_writers(table)
    a.fast = False  # commits through delta-rs, on the handle
    b.append(rows(2), {"app.b": 1})
    faults.install([Fault(Op.DELTA, Mode.LOST, match=a.uri)])
    with pytest.raises(OSError, match="injected"):
        a.sync_handle()
    faults.clear()
    b.append(rows(3), {"app.b": 2})
    assert a.append(rows(4), {"app.a": 1}) == 5
    assert a.txn_version("app.b") == 2 and a.txn_version("app.a") == 1
    assert _seqs(root, segments) == [0, 1, 2, 3, 4]


def test_a_buffer_snapshot_whose_answer_was_lost_is_known_written(tmp_path):
    """Fails before the fix: the snapshot's overwrite had no read-back, so a permanent-looking
    error after it landed reported it as skipped, and the buffer kept counting toward the next."""
    store = SnapshotStore(StorageRoot.resolve(str(tmp_path)), TopicName.parse("snap-partition-0"), "incarnation-1")
    assert store.save(BufferState(end_offset=5))
    lost = Fault(Op.DELTA, Mode.LOST, match=store.root.uri(*store.segments))
    faults.install([lost])
    state = BufferState(end_offset=10, markers_since_snapshot=3)
    assert store.save(state)
    faults.clear()
    assert lost.fired == 1
    assert (state.snapshot_offset, state.markers_since_snapshot) == (10, 0)
    overwrites = [v for v, actions in _commits(store.root, store.segments) if any("add" in a for a in actions)]
    assert len(overwrites) == 2 and store.load().end_offset == 10


def test_a_topic_whose_marker_answer_was_lost_is_created(tmp_path):
    """Fails before the fix: the marker landed, its answer failed, and create_topic raised; a
    retry was then told the topic already exists."""
    c = pulsartx.Client(str(tmp_path / "root"))
    lost = Fault(Op.CREATE, Mode.LOST, match="_topic.json")
    faults.install([lost])
    c.admin.create_topic("t", partitions=2)
    faults.clear()
    assert lost.fired == 1
    assert c.admin.get_partitions("t") == 2
    c.close()


def test_a_topic_whose_marker_was_not_written_reports_the_error(tmp_path):
    c = pulsartx.Client(str(tmp_path / "root"))
    faults.install([Fault(Op.CREATE, match="_topic.json")])
    with pytest.raises((StorageError, OSError), match="injected"):
        c.admin.create_topic("t", partitions=2)
    faults.clear()
    c.admin.create_topic("t", partitions=2)  # the creator that failed repairs it
    assert c.admin.get_partitions("t") == 2
    c.close()
