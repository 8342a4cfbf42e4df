"""What a transaction of full batches costs beside plain produce: its Delta commits per table, the
partition registration begun while the batch fills, and that the per-message checks still refuse."""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

import pulsartx
from pulsartx import MessageId
from pulsartx.client import producer as producer_mod
from pulsartx.coordinator.coordinator import TransactionCoordinator
from pulsartx.exceptions import InvalidTxnStatusError, PulsarException
from pulsartx.storage.appender import DeltaAppender

pytestmark = pytest.mark.parametrize("storage", ["local"], indirect=True)


@pytest.fixture
def commits(monkeypatch) -> Counter:
    """Delta commits attempted per table, by kind: "tc" (a TC log) or the partition's name."""
    seen: Counter = Counter()
    real = DeltaAppender._commit

    def counting(self, *a, **kw):
        uri = str(self.uri)
        seen["tc" if "/coordinator/" in uri else uri.rsplit("/", 2)[-2] + "/" + uri.rsplit("/", 1)[-1]] += 1
        return real(self, *a, **kw)

    monkeypatch.setattr(DeltaAppender, "_commit", counting)
    return seen


def read_all(client, topic: str, partitions: int) -> list[bytes]:
    out = []
    for p in range(partitions):
        r = client.create_reader(f"{topic}-partition-{p}", MessageId.earliest)
        while r.has_message_available():
            out.append(r.read_next().data())
    return out


def test_full_batch_transaction_commits_like_the_protocol(root, commits):
    """A 1,000-message transaction to 4 partitions with batches of 1,000: one data commit and one
    marker commit in one partition, and in the TC log the registration (NEW + ADD_PARTITION),
    the decision and the final entry: nothing more than the protocol's steps."""
    client = pulsartx.Client(root)
    client.admin.create_topic("t", 4)
    prod = client.create_producer("t", batching_max_messages=1000, batching_max_publish_delay_ms=60_000)
    warm = client.new_transaction()  # the TC's lease and TxnID block, the partition handles
    prod.send(b"warm", txn=warm)
    warm.commit()
    client.flush()
    values = [b"m%04d" % i for i in range(1000)]
    txn = client.new_transaction()  # a lease renewal or a TxnID block would be written here
    commits.clear()
    for v in values:
        prod.send_async(v, None, txn=txn)
    txn.commit()
    client.flush()
    parts = {k: n for k, n in commits.items() if k != "tc"}
    assert list(parts.values()) == [2], parts  # the data, then the marker, in one partition
    assert commits["tc"] == 3
    assert sorted(read_all(client, "t", 4)) == sorted([b"warm", *values])
    client.close()


def test_registration_starts_while_the_batch_fills(root, monkeypatch):
    """The partition is registered once its queue reaches EARLY_REGISTRATION_AT messages, on a
    helper thread, and the batch's append waits for it: data never precedes its registration."""
    order: list[str] = []
    real_add = TransactionCoordinator.add_partitions
    real_write = producer_mod.Producer._write

    def add(self, txn_id, partitions):
        order.append(f"add:{threading.current_thread() is threading.main_thread()}")
        return real_add(self, txn_id, partitions)

    def write(self, *a, **kw):
        order.append("append")
        return real_write(self, *a, **kw)

    monkeypatch.setattr(TransactionCoordinator, "add_partitions", add)
    monkeypatch.setattr(producer_mod.Producer, "_write", write)
    client = pulsartx.Client(root)
    prod = client.create_producer("one", batching_max_messages=1000, batching_max_publish_delay_ms=60_000)
    txn = client.new_transaction()
    for i in range(producer_mod.EARLY_REGISTRATION_AT - 1):
        prod.send_async(b"%d" % i, None, txn=txn)
    assert order == []  # a small transaction registers its partitions together at its flush
    for i in range(producer_mod.EARLY_REGISTRATION_AT - 1, 1000):
        prod.send_async(b"%d" % i, None, txn=txn)
    txn.commit()
    client.flush()
    assert order == ["add:False", "append"]  # once, beside the sender, before the data
    assert len(read_all(client, "one", 1)) == 1000
    client.close()


def test_failed_early_registration_fails_the_batch_and_aborts(root, monkeypatch):
    """Registrations that fail: the batch is never appended, commit() raises, the transaction
    aborts, every message is reported failed and nothing of it is ever visible."""
    def failing(self, txn_id, partitions):
        raise PulsarException("injected: TC log unavailable")

    monkeypatch.setattr(TransactionCoordinator, "add_partitions", failing)
    client = pulsartx.Client(root)
    prod = client.create_producer("one", batching_max_messages=1000, batching_max_publish_delay_ms=60_000)
    txn = client.new_transaction()
    results = []
    for i in range(500):
        prod.send_async(b"%d" % i, lambda res, _mid: results.append(res), txn=txn)
    with pytest.raises(PulsarException):
        txn.commit()
    client.flush()
    assert txn.state.value == "ABORTED"
    assert len(results) == 500 and pulsartx.Result.Ok not in results
    monkeypatch.undo()
    assert read_all(client, "one", 1) == []
    client.close()


def test_early_registration_failed_then_registered_again(root, monkeypatch):
    """A registration begun beside the batch that failed is made again by the batch's flush
    (data still after it): the transaction commits, each message once."""
    real_add = TransactionCoordinator.add_partitions
    calls = []

    def failing_once(self, txn_id, partitions):
        calls.append(set(partitions))
        if len(calls) == 1:
            raise PulsarException("injected: TC log unavailable")
        return real_add(self, txn_id, partitions)

    monkeypatch.setattr(TransactionCoordinator, "add_partitions", failing_once)
    client = pulsartx.Client(root)
    prod = client.create_producer("one", batching_max_messages=1000, batching_max_publish_delay_ms=60_000)
    txn = client.new_transaction()
    for i in range(500):
        prod.send_async(b"%d" % i, None, txn=txn)
    deadline = time.monotonic() + 30
    while txn._registering_parts and time.monotonic() < deadline:  # the failure has come back
        time.sleep(0.01)
    assert not txn._registering_parts and len(calls) == 1
    txn.commit()
    client.flush()
    assert len(calls) == 2
    assert sorted(read_all(client, "one", 1)) == sorted(b"%d" % i for i in range(500))
    client.close()


def test_abort_waits_for_a_registration_under_way(root):
    """An abort while a partition's registration runs beside the batch: the decision follows it,
    the queued messages are dropped, and the partition holds nothing."""
    client = pulsartx.Client(root)
    prod = client.create_producer("one", batching_max_messages=1000, batching_max_publish_delay_ms=60_000)
    txn = client.new_transaction()
    for i in range(300):
        prod.send_async(b"%d" % i, None, txn=txn)
    txn.abort()
    client.flush()
    assert txn.state.value == "ABORTED"
    assert read_all(client, "one", 1) == []
    client.close()


def test_sends_on_an_ended_transaction_still_raise(root):
    """The per-message check's fast path only passes an OPEN transaction."""
    client = pulsartx.Client(root)
    prod = client.create_producer("one")
    txn = client.new_transaction()
    prod.send_async(b"x", None, txn=txn)
    txn.commit()
    with pytest.raises(InvalidTxnStatusError):
        prod.send_async(b"late", None, txn=txn)
    t2 = client.new_transaction()
    t2.abort()
    with pytest.raises(InvalidTxnStatusError):
        prod.send(b"late", txn=t2)
    assert read_all(client, "one", 1) == [b"x"]
    client.close()
