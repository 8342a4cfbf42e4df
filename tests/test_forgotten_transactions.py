"""A partition's transaction buffer remembers only the latest MAX_ENDED plain commits. Data a zombie
appends after its transaction's own marker (a straggler) is never visible; when the buffer no
longer remembers that marker, the straggler looks like a new open transaction, and only its TC
can tell. These tests hold every reader to the straggler's invisibility, and maintenance to its
progress past it, whatever the TC says at the time: COMMITTING (its markers on their way),
COMMITTED, or nothing any more (its entry trimmed)."""
from __future__ import annotations

import pytest
from _reads import committed_values  # tests/ is on sys.path (conftest)

import pulsartx
import pulsartx.buffer.state as state_mod
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.reads import VisibilityReader
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.coordinator.state import TxnStatus
from pulsartx.log.partition import PartitionLog, build_records, partition_segments
from pulsartx.maintenance.compaction import compact_partition
from pulsartx.maintenance.retention import apply_retention
from pulsartx.naming import TopicName
from pulsartx.storage import faults
from pulsartx.storage.faults import Fault, Op

P0 = TopicName.parse("f-partition-0")
P1 = TopicName.parse("f-partition-1")


@pytest.fixture(autouse=True)
def small_ended_set(monkeypatch):
    monkeypatch.setattr(state_mod, "MAX_ENDED", 2)
    faults.clear()
    yield
    faults.clear()


def _commit_each(c: pulsartx.Client, topic: str, values: list[bytes]) -> None:
    p = c.create_producer(topic)
    for v in values:
        t = c.new_transaction()
        p.send(v, txn=t)
        t.commit()
    assert c.flush()


def _read_and_snapshot(c: pulsartx.Client, partition: TopicName) -> None:
    """A reader of ``partition`` catches up (folding its buffer, asking the TCs what it needs), and
    its buffer's state is snapshotted, as readers' buffers are every so often: every later reader
    and maintenance run folds on from there."""
    vis = VisibilityReader(c, PartitionLog(c.root, partition), "READ_COMMITTED")
    assert vis.end_position() == vis.buffer.state().end_offset
    assert vis.buffer.take_snapshot()


def _forgotten_straggler(c: pulsartx.Client) -> pulsartx.Transaction:
    """`old` commits on f-partition-0; three newer plain commits push it out of the ended set (a
    reader's buffer forgets it, and is snapshotted); then a zombie of `old` appends after its
    marker, and more is written behind the straggler."""
    c.admin.create_topic("f", partitions=1)
    old = c.new_transaction()
    c.create_producer("f").send(b"old", txn=old)
    old.commit()
    _commit_each(c, "f", [b"n0", b"n1", b"n2"])
    _read_and_snapshot(c, P0)
    PartitionLog(c.root, P0).append(build_records([b"straggler"], txn=old.id.as_tuple()))  # offset 8
    c.create_producer("f").send(b"p1")
    _commit_each(c, "f", [b"n3"])
    return old


@pytest.mark.parametrize("tc_entry", ["committed", "trimmed"])
def test_compaction_and_retention_pass_a_straggler_of_a_forgotten_transaction(tmp_path, tc_entry):
    """Fails before the fix: the straggler at offset 8 stayed in the buffer's open transactions for
    good, so maxReadPosition stayed at 7: compaction never touched a file from there on, and
    retention never moved the log's start past it, whether the TC still had the transaction
    (COMMITTED) or had trimmed it."""
    cfg = CoordinatorConfig(compact_every=2, finished_retention_ms=0) if tc_entry == "trimmed" else None
    with pulsartx.Client(str(tmp_path / "root"), coordinator_config=cfg) as c:
        old = _forgotten_straggler(c)
        if tc_entry == "trimmed":
            _commit_each(c, "f", [b"n4", b"n5"])  # TC log compactions trim the finished entries
            with pytest.raises(pulsartx.exceptions.TransactionNotFound):
                c._coordinators().for_txn(old.id).get(old.id, refresh=True)
        else:
            assert c._coordinators().for_txn(old.id).get(old.id, refresh=True).status is TxnStatus.COMMITTED
        at = {0: b"old", 2: b"n0", 4: b"n1", 6: b"n2", 9: b"p1", 10: b"n3", 12: b"n4", 14: b"n5"}
        expected = [v for o, v in at.items() if o < 12 or tc_entry == "trimmed"]
        assert committed_values(c, "f") == expected
        end = PartitionLog(c.root, P0).end_offset()
        res = compact_partition(c.root, P0)
        assert res.skipped is None
        assert res.rows_dropped == 1  # the straggler, and nothing else
        state = TransactionBuffer(PartitionLog(c.root, P0)).state()
        assert (state.ongoing, state.read_limit, state.end_offset) == ({}, end, end)
        offsets = PartitionLog(c.root, P0).read(0, end, ["offset"]).column("offset").to_pylist()
        assert offsets == [o for o in range(end) if o != 8]
        assert committed_values(c, "f") == expected
        newest = PartitionLog(c.root, P0).refresh().files[-1]
        res = apply_retention(c.root, P0, max_bytes=1, force=True)
        assert res.new_start_offset == newest.min_offset > 8  # everything but the newest file
        with pulsartx.Client(str(tmp_path / "root")) as fresh:
            assert committed_values(fresh, "f") == [v for o, v in at.items() if o >= newest.min_offset and v in expected]


def test_a_straggler_of_a_forgotten_transaction_stays_hidden_while_it_is_committing(tmp_path):
    """`old` commits on both partitions; its marker lands on partition 0, partition 1's marker
    write keeps failing, so `old` stays COMMITTING. Partition 0 goes on: three plain commits, then
    a zombie of `old` appends there. Fails before the fix: the buffer of partition 0 had forgotten
    `old`'s marker, took the straggler for data of a transaction decided COMMIT, and every reader
    returned it."""
    cfg = CoordinatorConfig(recovery_grace_ms=10**9)  # nobody else completes `old` meanwhile
    with pulsartx.Client(str(tmp_path / "root"), coordinator_config=cfg) as c:
        c.admin.create_topic("f", partitions=2)
        old = c.new_transaction()
        p0 = c.create_producer("f-partition-0")
        p0.send(b"old0", txn=old)
        c.create_producer("f-partition-1").send(b"old1", txn=old)
        faults.install([Fault(Op.CREATE, match="/".join(partition_segments(P1)) + "/_delta_log", times=10**6)])
        old.commit()
        assert not c.flush(1)  # partition 1's marker cannot be written (the completer keeps trying)
        tc = c._coordinators().for_txn(old.id)
        assert tc.get(old.id, refresh=True).status is TxnStatus.COMMITTING
        assert state_mod.txn_key(*old.id.as_tuple()) in TransactionBuffer(PartitionLog(c.root, P0)).state().ended
        for i in range(3):
            t = c.new_transaction()
            p0.send(f"n{i}".encode(), txn=t)
            t.commit()
        c.flush(1)  # theirs complete; `old` does not
        _read_and_snapshot(c, P0)
        PartitionLog(c.root, P0).append(build_records([b"straggler"], txn=old.id.as_tuple()))
        p0.send(b"after")
        p0.flush()
        expected = [b"old0", b"n0", b"n1", b"n2", b"after"]
        assert tc.get(old.id, refresh=True).status is TxnStatus.COMMITTING
        assert committed_values(c, "f-partition-0") == expected
        with pulsartx.Client(str(tmp_path / "root"), coordinator_config=cfg) as fresh:
            assert committed_values(fresh, "f-partition-0") == expected
        faults.clear()
        tc.sweep(grace_ms=0)  # partition 1 back: `old` completes (here, or at the completer's next try)
        assert tc.get(old.id, refresh=True).status is TxnStatus.COMMITTED
        assert committed_values(c, "f-partition-0") == expected
        assert committed_values(c, "f-partition-1") == [b"old1"]


@pytest.mark.parametrize("tc_entry", ["committed", "trimmed"])
def test_a_spark_batch_read_neither_shows_nor_stops_at_a_straggler_of_a_forgotten_transaction(tmp_path, tc_entry):
    """The consistent cut every Spark batch read plans with, over the same partition. Fails before
    the fix: with `old` still COMMITTED in its TC, the cut showed the straggler as part of the
    commit; with `old` trimmed from its TC, the cut took the straggler for an undecided
    transaction and stopped every read at it, for good."""
    from pulsartx.datasource.visibility import plan_visibility

    cfg = CoordinatorConfig(compact_every=2, finished_retention_ms=0) if tc_entry == "trimmed" else None
    with pulsartx.Client(str(tmp_path / "root"), coordinator_config=cfg) as c:
        _forgotten_straggler(c)
        if tc_entry == "trimmed":
            _commit_each(c, "f", [b"n4", b"n5"])
        at = {0: b"old", 2: b"n0", 4: b"n1", 6: b"n2", 9: b"p1", 10: b"n3", 12: b"n4", 14: b"n5"}
        expected = [v for o, v in at.items() if o < 12 or tc_entry == "trimmed"]
        plog = PartitionLog(c.root, P0)
        f = plan_visibility(c.root, {"p0": plog}, "READ_COMMITTED")["p0"].filter
        assert f.read_limit == plog.end_offset()
        assert f.apply(plog.read(0, f.read_limit)).column("value").to_pylist() == expected


def test_retention_keeps_the_marker_of_a_commit_still_committing(tmp_path):
    """`old` is COMMITTING, its marker written on partition 0 only. Fails before the fix: retention
    deleted partition 0's marker (no data of `old` lay after it yet) and the buffer forgot it with
    the deleted offsets; a straggler of `old` appended later was then taken for data of a decided
    commit, and every reader returned it."""
    cfg = CoordinatorConfig(recovery_grace_ms=10**9)
    with pulsartx.Client(str(tmp_path / "root"), coordinator_config=cfg) as c:
        c.admin.create_topic("f", partitions=2)
        old = c.new_transaction()
        p0 = c.create_producer("f-partition-0")
        p0.send(b"old0", txn=old)  # 0, its marker at 1
        c.create_producer("f-partition-1").send(b"old1", txn=old)
        faults.install([Fault(Op.CREATE, match="/".join(partition_segments(P1)) + "/_delta_log", times=10**6)])
        old.commit()
        assert not c.flush(1)
        for v in (b"p2", b"p3"):
            p0.send(v)
            p0.flush()
        tc = c._coordinators().for_txn(old.id)
        assert tc.get(old.id, refresh=True).status is TxnStatus.COMMITTING
        res = apply_retention(c.root, P0, max_bytes=1, force=True)
        assert res.new_start_offset == 1  # the marker stays
        PartitionLog(c.root, P0).append(build_records([b"straggler"], txn=old.id.as_tuple()))  # 4
        p0.send(b"after")
        p0.flush()
        assert committed_values(c, "f-partition-0") == [b"p2", b"p3", b"after"]
        faults.clear()
        tc.sweep(grace_ms=0)  # here, or at the completer's next try
        assert tc.get(old.id, refresh=True).status is TxnStatus.COMMITTED
        res = apply_retention(c.root, P0, max_bytes=1, force=True)  # finished: the marker may go now
        assert res.new_start_offset == 5  # everything but the newest file, the straggler included
        assert committed_values(c, "f-partition-0") == [b"after"]
