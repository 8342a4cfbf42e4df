"""Transaction edge cases as a PIP-31 user meets them through the client: negative acknowledgements
of messages acknowledged in a transaction, a commit after a failed abort, and other sequences where
a message could be lost, duplicated, shown too early or counted twice."""
from __future__ import annotations

import threading
import time

import pytest
from _reads import committed_values, drain

from pulsartx import Client, ConsumerType, InitialPosition, MessageId, TransactionState
from pulsartx.coordinator.coordinator import TransactionCoordinator
from pulsartx.exceptions import (
    ExpiredTransactionError,
    InvalidConfiguration,
    InvalidTxnStatusError,
    StorageError,
    TransactionHasOperationFailed,
)
from pulsartx.subscription.store import SubscriptionStore

pytestmark = pytest.mark.timeout(120)
IN = "persistent://public/default/in"
OUT = "persistent://public/default/out"


def seed(client: Client, topic: str, n: int) -> None:
    client.admin.create_topic(topic, partitions=1)
    p = client.create_producer(topic)
    for i in range(n):
        p.send(f"m{i}".encode())
    p.close()


@pytest.mark.parametrize("order", ["ack_then_nack", "nack_then_ack"])
def test_negative_ack_of_a_message_acknowledged_in_a_transaction_counts_no_redelivery(client, order):
    """Pulsar's broker ignores a redelivery request for a message its consumer no longer holds, as
    one acknowledged in a transaction: after the abort it comes back once, count 1, at once."""
    seed(client, IN, 3)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest, acknowledgment_group_time_ms=0,
                         negative_ack_redelivery_delay_ms=0 if order == "nack_then_ack" else 60_000)
    m0 = c.receive(5000)
    txn = client.new_transaction()
    if order == "ack_then_nack":
        c.acknowledge(m0, txn=txn)
        c.negative_acknowledge(m0)
    else:
        c.negative_acknowledge(m0)
        c.acknowledge(m0, txn=txn)
    rest = drain(c)
    assert [m.data() for m in rest] == [b"m1", b"m2"]  # m0 stays in PENDING_ACK
    txn.abort()
    got = c.receive(5000)  # at once: the 60 s negative-ack delay does not hold it back
    assert got.data() == b"m0" and got.redelivery_count() == 1
    assert drain(c, 300) == []


def test_commit_after_a_failed_abort_does_not_commit(client, monkeypatch):
    """abort() dropped the queued sends (their senders were told) and then failed to log its
    decision: a commit() after it must not commit the rest of the transaction without them."""
    client.admin.create_topic(OUT, partitions=1)
    p = client.create_producer(OUT, batching_max_publish_delay_ms=60_000)
    txn = client.new_transaction()
    p.send(b"a", txn=txn)
    results = []
    p.send_async(b"b", lambda res, _mid: results.append(res), txn=txn)
    real = TransactionCoordinator.end_transaction

    def failing(self, *a, **kw):
        raise StorageError("injected: the TC log cannot be written")

    monkeypatch.setattr(TransactionCoordinator, "end_transaction", failing)
    with pytest.raises(StorageError):
        txn.abort()
    monkeypatch.setattr(TransactionCoordinator, "end_transaction", real)
    assert len(results) == 1 and results[0].name != "Ok"
    with pytest.raises(InvalidTxnStatusError):
        txn.commit()
    assert txn.state is TransactionState.ABORTED
    client.flush()
    assert client.admin.transactions.get_transaction_metadata(txn.id)["status"] == "ABORTED"
    assert committed_values(client, OUT) == []


@pytest.mark.parametrize("registered", [False, True], ids=["ack_only", "producing"])
def test_commit_waits_for_an_acknowledgement_in_flight(client, monkeypatch, registered):
    """acknowledge(txn=) in one thread, commit() in another while the pending-ack write is on its
    way: as Pulsar's commit waits for the transaction's acks in flight, the decision comes after
    the write, so the message is acknowledged by the commit, not left PENDING_ACK for good (nor,
    for a transaction not yet in its TC log, returned though its ack succeeded)."""
    seed(client, IN, 3)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    m0, m1, _m2 = (c.receive(5000) for _ in range(3))
    txn = client.new_transaction()
    if registered:
        client.create_producer(OUT).send(b"x", txn=txn)
    c.acknowledge(m0, txn=txn)
    entered, release = threading.Event(), threading.Event()
    acker: list[threading.Thread] = []
    real = SubscriptionStore.update

    def gated(self, fn):
        if acker and threading.current_thread() is acker[0] and not release.is_set():
            entered.set()
            release.wait(10)
        return real(self, fn)

    monkeypatch.setattr(SubscriptionStore, "update", gated)
    out: list[object] = []
    acker.append(threading.Thread(target=lambda: out.append(c.acknowledge(m1, txn=txn))))
    acker[0].start()
    assert entered.wait(10)
    committer = threading.Thread(target=lambda: out.append(txn.commit()))
    committer.start()
    committer.join(0.5)
    assert committer.is_alive()  # the decision waits for the ack's write
    release.set()
    acker[0].join(10)
    committer.join(10)
    assert out == [None, None] and txn.state is TransactionState.COMMITTED
    client.flush()
    [st] = client.admin.transactions.get_pending_ack_stats(IN, "s")
    assert st["markDeletePosition"] == 1 and st["pendingAckCount"] == 0
    with pytest.raises(InvalidTxnStatusError):
        c.acknowledge(_m2, txn=txn)  # once decided, no ack joins it


def test_commit_of_a_timed_out_transaction_with_queued_sends_says_time_out(client):
    """docs/semantics.md: a transaction past its timeout raises ExpiredTransactionError on commit
    and its state becomes TIME_OUT, with sends still queued too (their abort must not overwrite it)."""
    client.admin.create_topic(OUT, partitions=1)
    p = client.create_producer(OUT, batching_max_publish_delay_ms=60_000)
    txn = client.new_transaction(timeout_ms=300)
    results = []
    p.send_async(b"late", lambda res, _mid: results.append(res), txn=txn)
    time.sleep(0.6)
    with pytest.raises(ExpiredTransactionError):
        txn.commit()
    assert txn.state is TransactionState.TIME_OUT
    with pytest.raises(ExpiredTransactionError):
        txn.commit()  # again: the same answer
    client.flush()
    assert len(results) == 1 and results[0].name != "Ok"
    assert committed_values(client, OUT) == []


@pytest.mark.parametrize("how", ["cumulative_txn", "individual_txn", "cumulative", "individual"])
def test_an_ack_past_the_partitions_end_is_refused(client, how):
    """A MessageId past the end names a message not written yet: acknowledged, the messages
    written there later were never delivered (a cumulative ack dropped every one up to it). A
    Pulsar broker refuses such a position too."""
    seed(client, IN, 3)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest, acknowledgment_group_time_ms=0)
    assert len(drain(c)) == 3
    future = MessageId.deserialize(bytes([1]) + (0).to_bytes(4, "big") + (50).to_bytes(8, "big"))
    txn = client.new_transaction() if how.endswith("txn") else None
    ack = c.acknowledge_cumulative if how.startswith("cumulative") else c.acknowledge
    with pytest.raises(InvalidConfiguration, match="no message at offset 50 yet"):
        ack(future, txn=txn)
    if txn is not None:
        txn.commit()  # the refused ack never joined it
    p = client.create_producer(IN)
    for i in range(60):
        p.send(b"n%d" % i)
    assert len(drain(c)) == 60  # none of them was acknowledged ahead of its delivery


def test_an_ack_past_the_timeout_on_a_registered_subscription_raises(client):
    """docs/semantics.md: a transaction past its timeout raises ExpiredTransactionError on ack, also
    where it registered the subscription before (no registration to fail); the ack is taken back."""
    seed(client, IN, 3)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    m0, m1, m2 = (c.receive(5000) for _ in range(3))
    txn = client.new_transaction(timeout_ms=500)
    client.create_producer(OUT).send(b"o", txn=txn)  # in its TC log: registrations go the ordinary way
    c.acknowledge(m0, txn=txn)
    time.sleep(0.8)
    with pytest.raises(ExpiredTransactionError):
        c.acknowledge(m1, txn=txn)
    assert txn.state is TransactionState.TIME_OUT
    with pytest.raises(ExpiredTransactionError):
        txn.commit()
    c.redeliver_unacknowledged_messages()
    again = drain(c)
    assert sorted(m.data() for m in again) == [b"m0", b"m1", b"m2"]
    assert {m.data(): m.redelivery_count() for m in again} == {b"m0": 1, b"m1": 1, b"m2": 1}


def test_shared_messages_an_abort_gives_back_go_to_any_consumer(client):
    """Shared: the consumer that acknowledged in the aborted transaction keeps its claims while it
    lives; the messages the abort gives back must not wait for it (Pulsar redelivers them to any
    consumer), here one that never calls receive() again."""
    seed(client, IN, 3)
    c1 = client.subscribe(IN, "s", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest,
                          receiver_queue_size=1)
    m0 = c1.receive(5000)
    c2 = client.subscribe(IN, "s", consumer_type=ConsumerType.Shared, receiver_queue_size=1)
    txn = client.new_transaction()
    c1.acknowledge(m0, txn=txn)
    txn.abort()
    client.flush()  # the abort's pass over the subscription
    got = drain(c2, 1500)
    assert sorted(m.data() for m in got) == [b"m0", b"m1", b"m2"]
    assert [m.redelivery_count() for m in got if m.data() == b"m0"] == [1]


@pytest.mark.parametrize("landed", [False, True], ids=["lost", "landed_reply_lost"])
def test_commit_after_a_failed_transactional_ack_aborts(client, monkeypatch, landed):
    """A pending-ack write that failed (its outcome unknown: it may have landed or not) is a
    failed operation of the transaction, as a failed send is: committing the rest would commit the
    output of a consume-transform-produce step with its input acknowledged or not, unknown. As
    Pulsar's client, commit() aborts and raises TransactionHasOperationFailed."""
    seed(client, IN, 2)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    m0, _m1 = (c.receive(5000) for _ in range(2))
    txn = client.new_transaction()
    client.create_producer(OUT).send(b"out", txn=txn)
    real = SubscriptionStore.update

    def failing(self, fn):
        if landed:
            real(self, fn)
        raise StorageError("injected: the subscription's log cannot be written")

    monkeypatch.setattr(SubscriptionStore, "update", failing)
    with pytest.raises(StorageError):
        c.acknowledge(m0, txn=txn)
    monkeypatch.setattr(SubscriptionStore, "update", real)
    with pytest.raises(TransactionHasOperationFailed):
        txn.commit()
    assert txn.state is TransactionState.ABORTED
    client.flush()
    assert committed_values(client, OUT) == []
    c.redeliver_unacknowledged_messages()
    assert sorted(m.data() for m in drain(c)) == [b"m0", b"m1"]
