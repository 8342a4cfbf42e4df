"""The consistent cut of a multi-partition batch read (the Spark batch read's guarantee): every
transaction whole or not at all, also for transactions that begin after the cut's instant T0 with
a TxnID from a block their process leased before it (so their id is below the TC's counter at T0)."""
from __future__ import annotations

from _procs import count_markers

import pulsartx
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.reads import consistent_cut
from pulsartx.coordinator.registry import Coordinators
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName

COLUMNS = ["offset", "value", "txn_most_bits", "txn_least_bits", "type"]
P0, P1 = "p0", "p1"  # keys that hash to partitions 0 and 1 of a 2-partition topic


def visible(plogs, filters) -> dict[str, list[bytes]]:
    out = {}
    for name, plog in plogs.items():
        f = filters[name]
        rows = f.apply(plog.read(0, max(f.read_limit, 0), columns=COLUMNS)) if f.read_limit > 0 else None
        out[name] = [] if rows is None else rows.column("value").to_pylist()
    return out


def test_a_transaction_begun_after_t0_from_an_old_block_is_hidden_whole(tmp_path):
    root = str(tmp_path / "root")
    writer = pulsartx.Client(root, num_coordinators=1)
    writer.admin.create_topic("t", 2)
    producer = writer.create_producer("t")
    before = writer.new_transaction()  # leases the block the late transaction's id comes from
    producer.send(b"before-a", txn=before, partition_key=P0)
    producer.send(b"before-b", txn=before, partition_key=P1)
    before.commit()
    assert writer.flush()

    reader = pulsartx.Client(root, num_coordinators=1)
    names = [str(TopicName.parse(f"t-partition-{i}")) for i in range(2)]
    plogs = {n: PartitionLog(reader.root, TopicName.parse(n)) for n in names}
    buffers = {n: TransactionBuffer(plogs[n]) for n in names}
    late_id = []
    fold_b = buffers[names[1]].state
    calls = [0]

    def state_after_a_late_commit(*a, **kw):
        calls[0] += 1
        if calls[0] == 2:  # the cut's second fold: partition 0 is folded, partition 1 is next
            late = writer.new_transaction()  # after T0, with an id of the already leased block
            late_id.append(late.id)
            producer.send(b"late-a", txn=late, partition_key=P0)
            producer.send(b"late-b", txn=late, partition_key=P1)
            late.commit()
            assert writer.flush()  # markers written in both partitions
        return fold_b(*a, **kw)

    buffers[names[1]].state = state_after_a_late_commit
    filters = consistent_cut(Coordinators(reader.root, recover_on_open=False), buffers)
    assert late_id and late_id[0].least_bits <= reader._coordinators().tc(0).txlog.counter
    assert sum(count_markers(root, "t", 2).values()) == 4  # before's and late's, in both partitions
    # before: whole; late: whole or not at all (here not at all: partition 0 was read before it).
    assert visible(plogs, filters) == {names[0]: [b"before-a"], names[1]: [b"before-b"]}
    writer.close()
    reader.close()


def test_a_cut_that_cannot_read_a_tc_fails_rather_than_hide_a_committed_transaction(tmp_path):
    """commit() returned, its markers are not written yet, and the TC log cannot be read: a batch
    read must fail (and say to retry), not return a cut without the transaction."""
    import pytest

    from pulsartx.coordinator.tclog import tc_segments
    from pulsartx.exceptions import StorageError
    from pulsartx.storage import faults
    from pulsartx.storage.faults import Fault, Op

    root = str(tmp_path / "root")
    writer = pulsartx.Client(root, num_coordinators=1)
    writer.admin.create_topic("t", 2)
    producer = writer.create_producer("t")
    txn = writer.new_transaction()
    producer.send(b"a", txn=txn, partition_key=P0)
    producer.send(b"b", txn=txn, partition_key=P1)
    completer = writer._coordinators().completer
    completer.submit = lambda tc, meta: None  # the markers never come in this process
    txn.commit()

    reader = pulsartx.Client(root, num_coordinators=1)
    names = [str(TopicName.parse(f"t-partition-{i}")) for i in range(2)]
    plogs = {n: PartitionLog(reader.root, TopicName.parse(n)) for n in names}
    buffers = {n: TransactionBuffer(plogs[n]) for n in names}
    faults.install([Fault(Op.READ, match="/".join(tc_segments(0)), times=10_000)])
    try:
        with pytest.raises(StorageError, match="consistent read needs TC 0's log.*retry the read"):
            consistent_cut(Coordinators(reader.root, recover_on_open=False), buffers)
    finally:
        faults.clear()
    # Readable again: the committed transaction is there, whole, though no marker is written yet.
    filters = consistent_cut(Coordinators(reader.root, recover_on_open=False), buffers)
    assert sum(count_markers(root, "t", 2).values()) == 0
    assert visible(plogs, filters) == {names[0]: [b"a"], names[1]: [b"b"]}
    reader.close()
    writer.close()


def test_a_transaction_finished_and_trimmed_during_the_cut_is_shown_by_its_markers(tmp_path):
    """commit() returned before the read; its markers and its trimming from the TC log both land
    between the cut's first fold and T0 (a writer whose clock runs days behind makes its finished
    entries look old enough to trim at once). Fails before the fix: unknown at T0 with markers past
    the first fold, it was taken for a transaction begun after T0 and hidden (a stale read). Its
    data was in the first fold, so it began before T0: it finished and its markers decide."""
    from pulsartx.coordinator.lease import is_lease_row
    from pulsartx.coordinator.state import TxnStatus
    from pulsartx.coordinator.tclog import row_to_meta

    root = str(tmp_path / "root")
    writer = pulsartx.Client(root, num_coordinators=1)
    writer.admin.create_topic("t", 2)
    producer = writer.create_producer("t")
    txn = writer.new_transaction()
    producer.send(b"a", txn=txn, partition_key=P0)
    producer.send(b"b", txn=txn, partition_key=P1)
    completer = writer._coordinators().completer
    submit, held = completer.submit, []
    completer.submit = lambda tc, meta: held.append((tc, meta))  # the markers wait
    txn.commit()

    reader = pulsartx.Client(root, num_coordinators=1)
    names = [str(TopicName.parse(f"t-partition-{i}")) for i in range(2)]
    plogs = {n: PartitionLog(reader.root, TopicName.parse(n)) for n in names}
    buffers = {n: TransactionBuffer(plogs[n]) for n in names}
    coordinators = Coordinators(reader.root, recover_on_open=False)
    tc_of = coordinators.tc

    def finish_and_trim_first(tc_id):
        if held:  # after the first fold, before T0
            submit(*held.pop()).result()
            log = writer._coordinators().tc(0).txlog.log
            log.refresh()
            assert log.compact(lambda r: is_lease_row(r) or not row_to_meta(r).status.is_final)
        return tc_of(tc_id)

    coordinators.tc = finish_and_trim_first
    filters = consistent_cut(coordinators, buffers)
    assert not held and sum(count_markers(root, "t", 2).values()) == 2
    assert all(m.status is not TxnStatus.COMMITTED for m in reader._coordinators().tc(0).transactions())
    assert visible(plogs, filters) == {names[0]: [b"a"], names[1]: [b"b"]}
    reader.close()
    writer.close()


def test_a_marker_written_after_t0_does_not_show_a_transaction_open_at_t0(tmp_path):
    """A transaction OPEN at T0, with data in partition 1 before the cut, writes more data to
    partition 0 and commits between the second folds of partition 0 and partition 1: partition 1's
    fold then holds its commit marker, partition 0's fold lacks its data there. The marker was
    written after T0, so it must not decide the transaction for this cut (only markers folded
    before T0 do): shown in partition 1 alone, it would be a fractured read. Fails before the fix
    (a soak's batch read returned one of such a transaction's two messages)."""
    root = str(tmp_path / "root")
    writer = pulsartx.Client(root, num_coordinators=1)
    writer.admin.create_topic("t", 2)
    producer = writer.create_producer("t")
    txn = writer.new_transaction()
    producer.send(b"open-b", txn=txn, partition_key=P1)  # in the first fold; OPEN at T0

    reader = pulsartx.Client(root, num_coordinators=1)
    names = [str(TopicName.parse(f"t-partition-{i}")) for i in range(2)]
    plogs = {n: PartitionLog(reader.root, TopicName.parse(n)) for n in names}
    buffers = {n: TransactionBuffer(plogs[n]) for n in names}
    fold_b = buffers[names[1]].state
    calls = [0]

    def state_after_the_commit(*a, **kw):
        calls[0] += 1
        if calls[0] == 2:  # the cut's second fold: partition 0 is folded, partition 1 is next
            producer.send(b"open-a", txn=txn, partition_key=P0)
            txn.commit()
            assert writer.flush()  # markers in both partitions
        return fold_b(*a, **kw)

    buffers[names[1]].state = state_after_the_commit
    filters = consistent_cut(Coordinators(reader.root, recover_on_open=False), buffers)
    assert calls[0] >= 2 and sum(count_markers(root, "t", 2).values()) == 2
    assert visible(plogs, filters) == {names[0]: [], names[1]: []}  # whole or not at all: not at all
    reader.close()
    writer.close()
