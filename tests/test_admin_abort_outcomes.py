"""An admin abort never re-decides a transaction that may have finished, and a marker in a partition
is the last word for that partition: no TC entry written after it can reverse it.

The hole these tests pin: once a committed transaction's TC entry is trimmed
(``finished_retention_ms``), the TC could not tell "issued, never registered" from "finished and
trimmed", so an admin abort logged ABORTED for it, reported ``status: ABORTED``, and every Spark
batch read (the consistent cut) then hid that transaction's committed messages while client
readers still showed them.
"""
from __future__ import annotations

import pytest
from _reads import committed_values
from click.testing import CliRunner

import pulsartx
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.reads import consistent_cut
from pulsartx.cli.main import cli
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.state import MetadataOp, TxnMeta, TxnStatus
from pulsartx.exceptions import TransactionNotFound
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName

# Every finished transaction is trimmed at the next compaction, which runs every other TC write.
TRIM = CoordinatorConfig(finished_retention_ms=0, compact_every=2, recovery_grace_ms=0)
COLUMNS = ["offset", "value", "txn_most_bits", "txn_least_bits", "type"]


def _committed_then_trimmed(root: str) -> tuple[pulsartx.Client, pulsartx.TxnID]:
    """A transaction over both partitions of ``t``, committed with its markers written, whose TC
    entry later transactions' compactions have trimmed."""
    c = pulsartx.Client(root, num_coordinators=1, coordinator_config=TRIM)
    c.admin.create_topic("t", 2)
    producer = c.create_producer("t")
    txn = c.new_transaction()
    producer.send(b"a", txn=txn, partition_key="p0")
    producer.send(b"b", txn=txn, partition_key="p1")
    txn.commit()
    assert c.flush()
    for _ in range(4):  # full compactions drop every finished entry, the committed one's included
        other = c.new_transaction()
        producer.send(b"x", txn=other)
        other.abort()
        assert c.flush()
    fresh = pulsartx.Client(root, num_coordinators=1, coordinator_config=TRIM)
    with pytest.raises(TransactionNotFound, match="trimmed"):
        fresh._coordinators().tc(0).get(txn.id, refresh=True)
    fresh.close()
    return c, txn.id


def _cut_values(root: str) -> list[bytes]:
    """What a Spark batch read of ``t`` returns, through the consistent cut its planner takes."""
    reader = pulsartx.Client(root, num_coordinators=1)
    names = [str(TopicName.parse(f"t-partition-{i}")) for i in range(2)]
    plogs = {n: PartitionLog(reader.root, TopicName.parse(n)) for n in names}
    filters = consistent_cut(Coordinators(reader.root, recover_on_open=False),
                             {n: TransactionBuffer(p) for n, p in plogs.items()})
    out = []
    for n in names:
        f = filters[n]
        if f.read_limit > 0:
            out += f.apply(plogs[n].read(0, f.read_limit, columns=COLUMNS)).column("value").to_pylist()
    reader.close()
    return sorted(out)


def test_admin_abort_of_a_committed_and_trimmed_transaction_is_refused(tmp_path):
    root = str(tmp_path / "root")
    c, txn_id = _committed_then_trimmed(root)
    assert _cut_values(root) == [b"a", b"b"]
    admin = pulsartx.Client(root, num_coordinators=1)
    with pytest.raises(TransactionNotFound, match="may have finished") as ei:
        admin.admin.transactions.abort_transaction(str(txn_id))
    assert str(txn_id) in str(ei.value) and "trimmed" in str(ei.value)
    result = CliRunner().invoke(cli, ["--service-url", root, "--json", "transactions", "abort", str(txn_id)])
    assert result.exit_code != 0 and "may have finished" in result.output + (result.stderr or "")
    # Nothing was logged for it, and every reader still shows the committed messages.
    tc = admin._coordinators().tc(0)
    tc.refresh()
    assert tc.txlog.get(txn_id.least_bits) is None
    assert _cut_values(root) == [b"a", b"b"]
    assert sorted(committed_values(admin, "t")) == [b"a", b"b"]
    admin.close()
    c.close()


def test_admin_abort_still_fences_a_transaction_that_registered_nothing(tmp_path):
    """The one case a TC may log a decision for an id its log does not hold: no finished
    transaction was ever trimmed at or above it, so it cannot have finished."""
    root = str(tmp_path / "root")
    c = pulsartx.Client(root, num_coordinators=1, coordinator_config=TRIM)
    c.admin.create_topic("t", 1)
    idle = c.new_transaction()  # registers nothing: only this process knows it
    admin = pulsartx.Client(root, num_coordinators=1)
    meta = admin.admin.transactions.abort_transaction(str(idle.id))
    assert (meta["status"], meta["reason"]) == ("ABORTED", "admin abort")
    with pytest.raises(pulsartx.PulsarException, match="ABORTED"):
        c.create_producer("t").send(b"late", txn=idle)
    assert committed_values(admin, "t") == []
    admin.close()
    c.close()


def test_a_marker_is_the_last_word_over_a_later_tc_entry(tmp_path):
    """Whatever a TC log says later (here, an ABORTED entry written straight into it for a
    committed and trimmed transaction, as the old admin abort did), the partitions' commit markers
    decide: the consistent cut and the client readers agree."""
    root = str(tmp_path / "root")
    c, txn_id = _committed_then_trimmed(root)
    tc = c._coordinators().tc(0)
    tc.refresh()
    t = 0
    tc.txlog.write(TxnMeta(txn_id, TxnStatus.ABORTED, 0, t, t, reason="admin abort"), MetadataOp.NEW, None)
    assert _cut_values(root) == [b"a", b"b"]
    assert sorted(committed_values(c, "t")) == [b"a", b"b"]
    c.close()


def test_an_admin_fence_outlives_compaction(tmp_path):
    """The ABORTED entry an admin abort logs for a transaction that registered nothing is its
    owner's only way to learn of the fence: compaction keeps it however old, or the owner would
    register and commit the id later, reversing the ABORTED the admin was told."""
    root = str(tmp_path / "root")
    owner = pulsartx.Client(root, num_coordinators=1, coordinator_config=TRIM)
    owner.admin.create_topic("t", 1)
    fenced = owner.new_transaction()
    admin = pulsartx.Client(root, num_coordinators=1)
    assert admin.admin.transactions.abort_transaction(str(fenced.id))["status"] == "ABORTED"
    tc = owner._coordinators().for_txn(fenced.id)
    for _ in range(4):  # the owner's own writes compact the log, trimming every finished entry
        other = owner.new_transaction()
        owner.create_producer("t").send(b"x", txn=other)
        other.abort()
        assert owner.flush()
    fresh = pulsartx.Client(root, num_coordinators=1)
    assert fresh._coordinators().for_txn(fenced.id).get(fenced.id, refresh=True).status.value == "ABORTED"
    assert tc.txlog.trimmed_through >= 0  # compaction did trim around it
    with pytest.raises(pulsartx.PulsarException, match="ABORTED"):
        fenced.commit()
    assert committed_values(fresh, "t") == []
    for c in (owner, admin, fresh):
        c.close()


def test_a_commit_refused_as_not_found_then_an_abort_ends_quietly(tmp_path):
    """An operator aborts an open transaction and its entry is trimmed; its owner then tries to
    commit (refused: the TC holds no such transaction, so nothing was committed) and aborts. The
    abort returns, and the transaction is ABORTED. It used to raise TransactionNotFound: the
    refused commit counted as one whose outcome might have been a commit."""
    import time

    from pulsartx.coordinator.tclog import TransactionLog

    root = str(tmp_path / "root")
    cfg = CoordinatorConfig(finished_retention_ms=0, compact_every=4, recovery_grace_ms=0)
    with pulsartx.Client(root, num_coordinators=1, coordinator_config=cfg) as c, \
            pulsartx.Client(root, num_coordinators=1) as operator:
        c.admin.create_topic("t", 1)
        p = c.create_producer("t")
        txn = c.new_transaction()
        p.send(b"m", txn=txn)
        assert operator.admin.transactions.abort_transaction(str(txn.id))["status"] in ("ABORTING", "ABORTED")
        assert c.flush() and operator.flush()
        tl = TransactionLog(c.root, txn.id.most_bits, compact_every=1, finished_retention_ms=0).open()
        tl.log.files_since_compaction = 1
        tl.maybe_compact(int(time.time() * 1000))
        with pytest.raises(pulsartx.PulsarException):
            txn.commit()
        txn.abort()
        assert txn.state.value == "ABORTED"
        assert committed_values(c, "t") == []
