"""Retention keeps every outcome the remaining log needs: a transaction with data left in the log
keeps its marker, and the log's start never passes maxReadPosition."""
from __future__ import annotations

from _reads import committed_values  # tests/ is on sys.path (conftest)

import pulsartx
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.snapshot import SnapshotStore
from pulsartx.log.partition import PartitionLog, build_records
from pulsartx.maintenance.retention import apply_retention
from pulsartx.naming import TopicName

PART = TopicName.parse("r-partition-0")


def _fold_from_the_log(root) -> TransactionBuffer:
    """A transaction buffer with no snapshot to start from (as after a snapshot write that failed):
    the fold covers whatever the log still holds."""
    store = SnapshotStore(root, PART)
    root.rm(*store.segments)
    return TransactionBuffer(PartitionLog(root, PART))


def test_retention_keeps_the_marker_of_a_transaction_whose_straggler_remains(tmp_path):
    """Fails before the fix: the file with T's abort marker was deleted while T's straggler (data
    a zombie appended after the marker) stayed, so a fold of the remaining log saw T's data with
    no marker: T looked OPEN forever and held maxReadPosition at the straggler."""
    c = pulsartx.Client(str(tmp_path / "root"))
    c.admin.create_topic("r", partitions=1)
    p = c.create_producer("r")
    txn = c.new_transaction()
    p.send(b"t", txn=txn)
    txn.abort()
    assert c.flush()  # the abort marker (written by the background completer) lands before the zombie's append
    plog = PartitionLog(c.root, PART)
    plog.append(build_records([b"straggler"], txn=txn.id.as_tuple()))  # a zombie's late append
    for v in (b"p1", b"p2"):
        p.send(v)
    files = plog.refresh().files  # t, the abort marker, the straggler, p1, p2: one file each
    assert len(files) == 5
    keep_last_three = sum(f.size for f in files[2:])
    res = apply_retention(c.root, PART, max_bytes=keep_last_three, force=True)
    state = _fold_from_the_log(c.root).state()
    assert state.ongoing == {}
    assert state.read_limit == state.end_offset == 5
    assert res.new_start_offset <= 1  # the marker (offset 1) is kept
    assert committed_values(c, "r") == [b"p1", b"p2"]
    c.close()


def test_retention_never_moves_the_start_past_max_read_position(tmp_path):
    """Fails before the fix: with force (or no subscription), the files of an open transaction's
    data were deleted, and its commit then showed nothing of what it sent there."""
    c = pulsartx.Client(str(tmp_path / "root"))
    c.admin.create_topic("r", partitions=1)
    p = c.create_producer("r")
    p.send(b"p0")
    open_txn = c.new_transaction()
    p.send(b"o1", txn=open_txn)
    p.flush()
    for v in (b"p1", b"p2"):
        p.send(v)
    res = apply_retention(c.root, PART, max_bytes=1, force=True)
    assert res.new_start_offset <= 1  # o1, the open transaction's first data, stays
    open_txn.commit()
    assert committed_values(c, "r")[-3:] == [b"o1", b"p1", b"p2"]
    c.close()


def test_a_straggler_of_a_committed_transaction_trimmed_from_the_ended_set_stays_hidden(tmp_path, monkeypatch):
    """The buffer remembers only the MAX_ENDED latest plain commits; a straggler (data a zombie
    appended after its transaction's own marker) of an older one looks like a new open
    transaction, which its TC reports COMMITTED. Fails before the fix: the reader then showed the
    straggler, as if it had been part of the commit."""
    import pulsartx.buffer.state as state_mod

    monkeypatch.setattr(state_mod, "MAX_ENDED", 2)
    c = pulsartx.Client(str(tmp_path / "root"))
    c.admin.create_topic("r", partitions=1)
    p = c.create_producer("r")
    old = c.new_transaction()
    p.send(b"old", txn=old)
    old.commit()
    for i in range(3):  # three newer plain commits push `old` out of the ended set
        t = c.new_transaction()
        p.send(f"n{i}".encode(), txn=t)
        t.commit()
    PartitionLog(c.root, PART).append(build_records([b"straggler"], txn=old.id.as_tuple()))
    p.send(b"after")
    assert committed_values(c, "r") == [b"old", b"n0", b"n1", b"n2", b"after"]
    with pulsartx.Client(str(tmp_path / "root")) as fresh:
        assert committed_values(fresh, "r") == [b"old", b"n0", b"n1", b"n2", b"after"]
    c.close()


def test_a_straggler_folded_after_its_transaction_was_forgotten_stays_hidden(tmp_path, monkeypatch):
    """The same straggler, met by a buffer that had already forgotten its transaction (its TC had
    confirmed it finished): the fold sees an open transaction, its TC says COMMITTED (every marker
    written), and the state folded after that lookup still has no marker for it, so the data came
    after its own marker: it is recorded as a straggler."""
    import pulsartx.buffer.state as state_mod
    from pulsartx.buffer.reads import resolved_filter, settle

    monkeypatch.setattr(state_mod, "MAX_ENDED", 2)
    c = pulsartx.Client(str(tmp_path / "root"))
    c.admin.create_topic("r", partitions=1)
    p = c.create_producer("r")
    old = c.new_transaction()
    p.send(b"old", txn=old)
    old.commit()
    for i in range(3):
        t = c.new_transaction()
        p.send(f"n{i}".encode(), txn=t)
        t.commit()
    c.flush()  # the markers: commit() returns at the decision, the background completer writes them
    buf = TransactionBuffer(PartitionLog(c.root, PART))
    state, _ = settle(c._coordinators(), buf, eager=True)  # its TC confirms `old` COMMITTED: forgotten
    assert state.ongoing == {} and state_mod.txn_key(*old.id.as_tuple()) not in state.ended
    PartitionLog(c.root, PART).append(build_records([b"straggler"], txn=old.id.as_tuple()))
    p.send(b"after")
    assert list(buf.state().ongoing.values()) == [8]
    f = resolved_filter(c._coordinators(), buf)
    assert f.read_limit == 10
    assert (buf.state().ongoing, buf.state().stragglers) == ({}, [(8, 8)])  # settled for good
    rows = f.apply(PartitionLog(c.root, PART).read(0, f.read_limit))
    assert rows.column("value").to_pylist() == [b"old", b"n0", b"n1", b"n2", b"after"]
    c.close()


def test_a_snapshot_older_than_the_logs_start_is_not_loaded(tmp_path, monkeypatch):
    """Retention trims, then snapshots the trimmed state; when that snapshot write fails, the one
    before stays, ending before the log's new start. Fails before the fix: a buffer loading it
    folded on from the start, never saw the deleted commit marker of a transaction open in it,
    and held maxReadPosition at that transaction for good: nothing after it was readable."""
    c = pulsartx.Client(str(tmp_path / "root"))
    c.admin.create_topic("r", partitions=1)
    p = c.create_producer("r")
    txn = c.new_transaction()
    p.send(b"t", txn=txn)
    p.flush()
    assert TransactionBuffer(PartitionLog(c.root, PART)).take_snapshot()  # t open in it
    txn.commit()
    assert c.flush()
    for v in (b"p1", b"p2"):
        p.send(v)
    files = PartitionLog(c.root, PART).refresh().files  # t, the commit marker, p1, p2
    monkeypatch.setattr(SnapshotStore, "write", lambda self, table: False)  # the store refuses it
    assert apply_retention(c.root, PART, max_bytes=files[-1].size, force=True).new_start_offset == 3
    monkeypatch.undo()
    state = TransactionBuffer(PartitionLog(c.root, PART)).state()
    assert state.ongoing == {}
    assert state.read_limit == state.end_offset == 4
    c.close()
