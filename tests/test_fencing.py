"""Transaction keys and connection epochs (seed 001), with Kafka's fencing tests as the model
(TransactionsTest.testFencingOnCommit / testFencingOnSend / testFencingOnAddPartitions).

A Client built with (transaction_key, owner) is the proposal's "connection": it bumps the key's
epoch and aborts the previous epoch's open transaction. The fenced client's transaction then fails
with ExpiredTransactionError, and the fenced client may not begin new ones (NotAllowedError).
Visibility is asserted through TC metadata and markers: READ_COMMITTED filtering is tested elsewhere.
"""
from __future__ import annotations

import os
from collections import Counter

import pytest
from _procs import BIG_RETENTION_MS, count_markers

import pulsartx
from pulsartx.client.transaction import TransactionState
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import (
    ExpiredTransactionError,
    InvalidConfiguration,
    InvalidTxnStatusError,
    NotAllowedError,
)

KEEP = CoordinatorConfig(finished_retention_ms=BIG_RETENTION_MS, recovery_grace_ms=0)


@pytest.fixture
def root_url(root) -> str:
    return root  # local directory or RGW bucket (conftest's storage fixture)


def connect(root_url: str, key: str | None = "etl-7", owner: str | None = "alice", **kw) -> pulsartx.Client:
    return pulsartx.Client(root_url, transaction_key=key, owner=owner, num_coordinators=4,
                           coordinator_config=kw.pop("cfg", KEEP), **kw)


def meta(client, txn) -> dict:
    return client.admin.transactions.get_transaction_metadata(txn.id)


def markers(root_url: str, topic: str, txn_id: TxnID, partitions: int = 1) -> Counter:
    return Counter({(p, t): c for (p, t, tid), c in count_markers(root_url, topic, partitions).items()
                    if tid == txn_id.as_tuple()})


@pytest.fixture
def fenced(root_url):
    """A (alice, etl-7) opened a transaction and sent to "out"; B connected with the same key."""
    a = connect(root_url)
    a.admin.create_topic("out", 1)
    a.admin.create_topic("other", 1)
    producer = a.create_producer("out")
    txn = a.new_transaction()
    producer.send(b"from-a", txn=txn)
    assert meta(a, txn)["status"] == "OPEN"
    b = connect(root_url)
    assert (a.epoch, b.epoch) == (0, 1)
    return a, b, producer, txn


def assert_fenced_abort(root_url, client, txn):
    md = meta(client, txn)
    assert md["status"] == "ABORTED"
    assert md["reason"].startswith("fenced") and "epoch 1" in md["reason"]
    assert (md["transaction_key"], md["owner"], md["epoch"]) == ("etl-7", "alice", 0)
    assert markers(root_url, "out", txn.id) == Counter({(0, "TXN_ABORT"): 1})


def test_new_connection_aborts_the_old_epochs_transaction(root_url, fenced):
    a, b, _, txn = fenced
    assert_fenced_abort(root_url, b, txn)
    assert txn.id.tc_id == b._key_tc()  # the key's transactions live on the key's TC
    info = b.admin.transactions.get_transaction_key("etl-7", owner="alice")
    assert (info["epoch"], info["txn_ids"], info["coordinator_id"]) == (1, [], b._key_tc())


def test_fencing_on_commit(root_url, fenced):
    a, b, producer, txn = fenced
    with pytest.raises(ExpiredTransactionError, match="fenced"):
        txn.commit()
    assert txn.state is TransactionState.ABORTED
    with pytest.raises(InvalidTxnStatusError):  # it stays unusable
        producer.send(b"again", txn=txn)
    with pytest.raises(NotAllowedError):
        a.new_transaction()
    assert_fenced_abort(root_url, b, txn)


def test_fencing_on_send(root_url, fenced):
    """The fenced transaction already registered "out": the send must still be refused."""
    a, b, producer, txn = fenced
    with pytest.raises(ExpiredTransactionError):
        producer.send(b"late", txn=txn)
    with pytest.raises(InvalidTxnStatusError):
        txn.commit()
    assert meta(b, txn)["status"] == "ABORTED"
    from _procs import data_rows

    assert data_rows(root_url, "out", 1) == Counter({(0, txn.id.as_tuple()): 1})  # nothing written after fencing
    assert_fenced_abort(root_url, b, txn)


def test_fencing_on_add_partitions(root_url, fenced):
    a, b, _, txn = fenced
    with pytest.raises(ExpiredTransactionError):
        a.create_producer("other").send(b"new partition", txn=txn)
    assert meta(b, txn)["partitions"] == ["persistent://public/default/out-partition-0"]
    assert_fenced_abort(root_url, b, txn)


def test_fenced_client_cannot_begin_and_new_one_works(root_url, fenced):
    a, b, _, old = fenced
    with pytest.raises(NotAllowedError, match="epoch"):
        a.new_transaction()
    p = b.create_producer("out")
    txn = b.new_transaction()
    p.send(b"from-b", txn=txn)
    txn.commit()
    assert txn.state is TransactionState.COMMITTED
    b.flush()  # the final entry and the marker follow the decision in the background
    md = meta(b, txn)
    assert (md["status"], md["epoch"], md["transaction_key"], md["owner"]) == ("COMMITTED", 1, "etl-7", "alice")
    assert markers(root_url, "out", txn.id) == Counter({(0, "TXN_COMMIT"): 1})
    info = b.admin.transactions.get_transaction_key("etl-7", owner="alice")
    assert (info["epoch"], info["txn_ids"]) == (1, [str(txn.id)])
    assert info["age_ms"] >= 0
    # still only one abort marker for the fenced one
    assert markers(root_url, "out", old.id) == Counter({(0, "TXN_ABORT"): 1})


def test_one_active_transaction_per_key(root_url):
    """A second transaction on the same key supersedes (aborts) the first one still open."""
    c = connect(root_url)
    first = c.new_transaction()
    second = c.new_transaction()
    md = meta(c, first)
    assert md["status"] == "ABORTED" and md["reason"].startswith("fenced")
    with pytest.raises(ExpiredTransactionError):
        first.commit()
    second.commit()
    assert meta(c, second)["status"] == "COMMITTED"


def test_key_validation(root_url):
    for key, owner in [("a&b", "alice"), ("etl-7", "al&ice"), ("", "alice")]:
        with pytest.raises(InvalidConfiguration):
            connect(root_url, key=key, owner=owner)
    assert not os.path.exists(os.path.join(root_url, "coordinator"))  # refused before touching storage


def test_owners_do_not_fence_each_other(root_url):
    alice = connect(root_url, owner="alice")
    ta = alice.new_transaction()
    bob = connect(root_url, owner="bob")
    nobody = connect(root_url, owner=None)
    tb, tn = bob.new_transaction(), nobody.new_transaction()
    for c, t in [(alice, ta), (bob, tb), (nobody, tn)]:
        assert meta(c, t)["status"] == "OPEN"
        t.commit()
        assert meta(c, t)["status"] == "COMMITTED"
    keys = sorted((k["owner"], k["transaction_key"], k["epoch"]) for k in alice.admin.transactions.list_transaction_keys())
    assert keys == [("", "etl-7", 0), ("alice", "etl-7", 0), ("bob", "etl-7", 0)]
    assert alice.admin.transactions.get_transaction_key("etl-7", owner="bob")["txn_ids"] == [str(tb.id)]
    assert alice.admin.transactions.get_transaction_key("etl-7")["txn_ids"] == [str(tn.id)]
    with pytest.raises(InvalidConfiguration):
        alice.admin.transactions.get_transaction_key("etl-7", owner="carol")


def test_epoch_increments_per_connection(root_url):
    epochs = [connect(root_url).epoch for _ in range(4)]
    assert epochs == [0, 1, 2, 3]
    info = connect(root_url, key="other").admin.transactions.get_transaction_key("etl-7", owner="alice")
    assert info["epoch"] == 3


def test_delete_transaction_key_aborts_its_open_transaction(root_url):
    c = connect(root_url)
    done = c.new_transaction()
    done.commit()
    live = c.new_transaction()
    admin = connect(root_url, key=None, owner=None).admin.transactions
    assert admin.delete_transaction_key("etl-7", owner="alice") == [str(live.id)]
    md = meta(c, live)
    assert md["status"] == "ABORTED" and "deleted" in md["reason"]
    assert meta(c, done)["status"] == "COMMITTED"
    with pytest.raises(ExpiredTransactionError):
        live.commit()
    with pytest.raises(NotAllowedError):
        c.new_transaction()
    assert admin.list_transaction_keys() == []
    with pytest.raises(InvalidConfiguration):
        admin.get_transaction_key("etl-7", owner="alice")
    with pytest.raises(InvalidConfiguration):
        admin.delete_transaction_key("etl-7", owner="alice")


def test_delete_after_finished_transactions_were_trimmed(root_url):
    """The key remembers transactions the TC log has already trimmed: delete must still abort the open one."""
    cfg = CoordinatorConfig(finished_retention_ms=0, compact_every=2)
    c = connect(root_url, cfg=cfg)
    for _ in range(3):
        c.new_transaction().commit()
    live = c.new_transaction()
    admin = connect(root_url, key=None, owner=None, cfg=cfg).admin.transactions
    assert admin.delete_transaction_key("etl-7", owner="alice") == [str(live.id)]
    assert meta(c, live)["status"] == "ABORTED"


def test_epochs_stay_monotonic_across_delete(root_url):
    """After delete + reconnect, a client fenced before the delete must stay fenced (a reused epoch
    would let it begin transactions again and abort the new owner's)."""
    zombie = connect(root_url)
    connect(root_url)  # fences the zombie at epoch 1
    connect(root_url, key=None, owner=None).admin.transactions.delete_transaction_key("etl-7", owner="alice")
    fresh = connect(root_url)
    assert fresh.epoch > 1
    live = fresh.new_transaction()
    with pytest.raises(NotAllowedError):
        zombie.new_transaction()
    assert meta(fresh, live)["status"] == "OPEN"
    live.commit()
    assert meta(fresh, live)["status"] == "COMMITTED"


def test_the_transaction_key_table_is_compacted_as_batches_attach(tmp_path):
    """A streaming query attaches a transaction to its key every micro-batch, one file each: the
    table is compacted like the TC's other logs, so it does not grow a file per batch ever run,
    and every key's row (its epoch, its transactions) survives the compaction."""
    from pulsartx.coordinator.keys import TransactionKeyStore
    from pulsartx.coordinator.txnid import TxnID
    from pulsartx.storage.root import StorageRoot

    root = StorageRoot.resolve(str(tmp_path))
    store = TransactionKeyStore(root, 0)
    store.log.compact_every = 10
    epoch, _ = store.claim("o", "stream")
    other, _ = store.claim("o", "other")
    for i in range(35):
        store.attach("o", "stream", epoch, TxnID(0, i))
    assert store.log.files_since_compaction < 10
    fresh = TransactionKeyStore(root, 0)
    assert fresh.current_epoch("o", "stream") == epoch and fresh.current_epoch("o", "other") == other
    assert fresh.txn_ids("o", "stream")[-1] == TxnID(0, 34)
