"""Transactional acknowledgements (PIP-31 PENDING_ACK) through the public API, in one process.

Scenarios from Pulsar's TransactionEndToEndTest / PendingAckPersistentTest and Kafka's
TransactionsTest (consume-transform-produce), rewritten against this API. Restarts here are a new
Client + Consumer on the same root; tests/test_consumer_procs.py restarts real processes.
"""
from __future__ import annotations

import time

import pytest
from _reads import drain

from pulsartx import (
    Client,
    ConsumerType,
    InitialPosition,
    MessageId,
    NotAllowedError,
    Timeout,
    TransactionState,
)
from pulsartx.admin import SubscriptionNotFound
from pulsartx.exceptions import InvalidTxnStatusError, TransactionConflict

pytestmark = pytest.mark.timeout(180)
IN = "persistent://public/default/in"
OUT = "persistent://public/default/out"


def seed(client: Client, topic: str, n: int, partitions: int = 1, prefix: str = "m") -> list[MessageId]:
    client.admin.create_topic(topic, partitions=partitions)
    p = client.create_producer(topic)
    ids: list[MessageId | None] = [None] * n

    def cb(i):
        def done(res, mid):
            ids[i] = mid
        return done

    for i in range(n):
        p.send_async(f"{prefix}{i}".encode(), cb(i), partition_key=f"k{i}" if partitions > 1 else None)
    p.flush()
    p.close()
    assert all(ids)
    return ids  # type: ignore[return-value]


def receive_n(consumer, n: int, timeout_ms: int = 10_000) -> list:
    out: list = []
    deadline = time.monotonic() + timeout_ms / 1000
    while len(out) < n:
        assert time.monotonic() < deadline, f"received {len(out)} of {n}"
        out += consumer.batch_receive(max_num_messages=n - len(out), timeout_millis=200)
    return out


def vals(msgs) -> list[str]:
    return [m.data().decode() for m in msgs]


def pending_stats(client: Client, topic: str, sub: str) -> list[dict]:
    client.flush()  # a decided transaction's acknowledgements land in the background
    return client.admin.transactions.get_pending_ack_stats(topic, sub)


def read_all(client: Client, topic: str, isolation_level: str = "READ_COMMITTED") -> list[str]:
    r = client.create_reader(topic, MessageId.earliest, isolation_level=isolation_level)
    out = []
    while True:
        try:
            out.append(r.read_next(timeout_millis=300).data().decode())
        except Timeout:
            break
    r.close()
    return out


# ---- PendingAckPersistentTest / TransactionEndToEndTest ----------------------------------------


def test_1000_messages_acked_in_a_txn_abort_then_commit(root, client):
    seed(client, IN, 1000)
    c = client.subscribe(IN, "sub", initial_position=InitialPosition.Earliest)
    msgs = receive_n(c, 1000)
    assert vals(msgs) == [f"m{i}" for i in range(1000)]
    txn = client.new_transaction()
    for m in msgs[:10]:  # one by one ...
        c.acknowledge(m, txn=txn)
    c.acknowledge(msgs[10:], txn=txn)  # ... and the rest as one write
    # ADD_SUBSCRIPTION reached the TC, and the pending acks are durable: another client sees them.
    meta = client.admin.transactions.get_transaction_metadata(txn.id)
    assert meta["subscriptions"] == [f"{IN}-partition-0:sub"] and meta["status"] == "OPEN"
    other = Client(root)
    [st] = pending_stats(other, IN, "sub")
    assert st["pendingAckCount"] == 1000 and st["transactions"] == {str(txn.id): 1000}
    assert st["markDeletePosition"] == -1 and st["pendingCumulativeAck"] is None
    [tst] = other.admin.transactions.get_transaction_in_pending_ack_stats(txn.id, IN, "sub")
    assert tst["pendingAckRanges"] == [[0, 999]] and tst["pendingAckCount"] == 1000
    assert tst["cumulativeAckPosition"] is None
    other.close()

    with pytest.raises(Timeout):
        c.receive(timeout_millis=500)
    c.redeliver_unacknowledged_messages()  # PENDING_ACK is not "unacknowledged"
    with pytest.raises(Timeout):
        c.receive(timeout_millis=500)
    c.acknowledge(msgs[5])  # a plain ack of a message in PENDING_ACK is ignored
    c.acknowledge_cumulative(msgs[20])
    c.close()
    c = client.subscribe(IN, "sub")  # a new consumer does not get them either
    with pytest.raises(Timeout):
        c.receive(timeout_millis=500)

    txn.abort()
    again = receive_n(c, 1000)
    assert sorted(vals(again)) == sorted(vals(msgs))  # all 1000 back, m5 and m0..m20 included
    assert {m.redelivery_count() for m in again} == {1}
    with pytest.raises(Timeout):
        c.receive(timeout_millis=300)
    [st] = pending_stats(client, IN, "sub")
    assert st["pendingAckCount"] == 0 and st["transactions"] == {}

    txn2 = client.new_transaction()
    c.acknowledge(again, txn=txn2)
    txn2.commit()
    assert txn2.state is TransactionState.COMMITTED
    c.redeliver_unacknowledged_messages()
    with pytest.raises(Timeout):
        c.receive(timeout_millis=500)
    [st] = pending_stats(client, IN, "sub")
    assert st["markDeletePosition"] == 999 and st["pendingAckCount"] == 0 and st["individuallyAckedRanges"] == 0


def test_cumulative_ack_conflict_between_txns(client):
    ids = seed(client, IN, 5)
    c = client.subscribe(IN, "fo", consumer_type=ConsumerType.Failover, initial_position=InitialPosition.Earliest)
    msgs = receive_n(c, 5)
    a, b = client.new_transaction(), client.new_transaction()
    c.acknowledge_cumulative(msgs[2], txn=a)
    with pytest.raises(TransactionConflict, match="another transaction holds a pending cumulative ack"):
        c.acknowledge_cumulative(msgs[2], txn=b)
    with pytest.raises(TransactionConflict, match="another transaction holds a pending cumulative ack"):
        c.acknowledge_cumulative(msgs[4], txn=b)
    with pytest.raises(TransactionConflict, match="at or below this transaction's pending position 2"):
        c.acknowledge_cumulative(msgs[1], txn=a)
    with pytest.raises(TransactionConflict, match="offset 1 is already pending"):
        c.acknowledge(msgs[1], txn=b)
    [tst] = client.admin.transactions.get_transaction_in_pending_ack_stats(a.id, IN, "fo")
    assert tst["cumulativeAckPosition"] == ids[2].offset() and tst["pendingAckRanges"] == []
    [st] = pending_stats(client, IN, "fo")
    assert st["pendingCumulativeAck"] == {"txn_id": str(a.id), "position": 2} and st["pendingAckCount"] == 3

    # A transaction in which a conflict happened cannot commit: commit raises and aborts it.
    with pytest.raises(TransactionConflict, match="cannot commit"):
        b.commit()
    assert b.state is TransactionState.ABORTED
    client.flush()  # the abort's final entry follows the decision in the background
    assert client.admin.transactions.get_transaction_metadata(b.id)["status"] == "ABORTED"

    a.abort()
    c.redeliver_unacknowledged_messages()
    again = drain(c)
    assert vals(again) == ["m0", "m1", "m2", "m3", "m4"]
    assert [m.redelivery_count() for m in again] == [1, 1, 1, 1, 1]
    cc = client.new_transaction()
    c.acknowledge_cumulative(again[-1], txn=cc)
    cc.commit()
    client.flush()
    c.redeliver_unacknowledged_messages()
    assert drain(c, idle_ms=300) == []
    [st] = pending_stats(client, IN, "fo")
    assert st["markDeletePosition"] == 4 and st["pendingAckCount"] == 0 and st["pendingCumulativeAck"] is None
    d = client.new_transaction()
    with pytest.raises(TransactionConflict, match="at or below the mark-delete position 4"):
        c.acknowledge_cumulative(ids[3], txn=d)
    with pytest.raises(TransactionConflict, match="already acknowledged"):
        c.acknowledge(ids[0], txn=d)
    with pytest.raises(TransactionConflict):
        d.commit()


def test_individual_ack_conflicts(client):
    seed(client, IN, 6)
    c = client.subscribe(IN, "s", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest,
                         acknowledgment_group_time_ms=0)
    m = receive_n(c, 6)
    c.acknowledge(m[0])  # plain, persisted at once (no grouping)
    a, b = client.new_transaction(), client.new_transaction()
    with pytest.raises(TransactionConflict, match="offset 0 is already acknowledged"):
        c.acknowledge(m[0], txn=a)
    a2 = client.new_transaction()
    c.acknowledge([m[1], m[2]], txn=a2)
    with pytest.raises(TransactionConflict, match="offset 2 is already pending acknowledgement by another"):
        c.acknowledge([m[3], m[2]], txn=b)  # all or nothing: m3 is not pending either
    with pytest.raises(TransactionConflict, match="by this transaction"):
        c.acknowledge(m[1], txn=a2)
    [st] = pending_stats(client, IN, "s")
    assert st["transactions"] == {str(a2.id): 2}
    with pytest.raises(NotAllowedError):
        c.acknowledge_cumulative(m[4], txn=b)
    # a and a2 both saw conflicts and cannot commit; b too.
    for t in (a, a2, b):
        with pytest.raises(TransactionConflict):
            t.commit()
        assert t.state is TransactionState.ABORTED
    c.redeliver_unacknowledged_messages()
    again = drain(c)
    assert vals(again) == ["m1", "m2", "m3", "m4", "m5"]
    assert [x.redelivery_count() for x in again] == [1, 1, 1, 1, 1]
    done = client.new_transaction()
    c.acknowledge(again, txn=done)
    done.commit()
    with pytest.raises(InvalidTxnStatusError):
        c.acknowledge(again[0], txn=done)  # a finished transaction takes no more acks
    [st] = pending_stats(client, IN, "s")
    assert st["markDeletePosition"] == 5


def test_txn_timeout_redelivers_without_sweeper(client):
    seed(client, IN, 2)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    m0, m1 = receive_n(c, 2)
    txn = client.new_transaction(timeout_ms=3000)
    t0 = time.monotonic()
    c.acknowledge(m0, txn=txn)
    c.acknowledge(m1)
    with pytest.raises(Timeout):
        c.receive(timeout_millis=1500)
    c.redeliver_unacknowledged_messages()
    with pytest.raises(Timeout):
        c.receive(timeout_millis=max(1, int((2.7 - (time.monotonic() - t0)) * 1000)))
    got = c.receive(timeout_millis=10_000)
    assert time.monotonic() - t0 >= 3.0
    assert got.data() == b"m0" and got.redelivery_count() == 1
    meta = client.admin.transactions.get_transaction_metadata(txn.id)
    assert meta["status"] == "ABORTED"
    with pytest.raises(InvalidTxnStatusError):
        txn.commit()
    c.acknowledge(got)
    c.close()
    assert pending_stats(client, IN, "s")[0]["markDeletePosition"] == 1


# ---- ADD_SUBSCRIPTION beside the PENDING_ACK write --------------------------------------------


def test_an_ack_whose_registration_fails_leaves_nothing_pending(client):
    """The TC ended the transaction behind the client's back (an admin abort): ADD_SUBSCRIPTION
    fails, and the pending ack written beside it is returned before the error is raised."""
    seed(client, IN, 3)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    m0, m1, m2 = receive_n(c, 3)
    txn = client.new_transaction()
    client.admin.transactions.abort_transaction(txn.id)
    with pytest.raises(InvalidTxnStatusError):
        c.acknowledge_cumulative(m1, txn=txn)
    with pytest.raises(InvalidTxnStatusError):
        c.acknowledge(m2, txn=txn)
    [st] = pending_stats(client, IN, "s")
    assert (st["pendingAckCount"], st["markDeletePosition"]) == (0, -1)
    assert drain(c) == []  # the consumer still holds all three, as if the acks were never tried
    c.redeliver_unacknowledged_messages()
    again = receive_n(c, 3)
    assert vals(again) == ["m0", "m1", "m2"] and [m.redelivery_count() for m in again] == [1, 1, 1]
    other = client.new_transaction()
    c.acknowledge_cumulative(again[-1], txn=other)  # no conflict left behind
    other.commit()
    assert pending_stats(client, IN, "s")[0]["markDeletePosition"] == 2
    assert drain(c) == []


@pytest.mark.parametrize("outcome", ["commit", "abort", "commit, then trimmed"])
def test_a_pending_ack_its_tc_never_listed_is_returned_once_the_txn_ends(client, outcome):
    """A process that died between its PENDING_ACK write and ADD_SUBSCRIPTION: the TC ends the
    transaction without this subscription, and consumer-side resolution returns the ack (a
    committed transaction that did not list the subscription did not acknowledge on it)."""
    from pulsartx.buffer.state import txn_key
    from pulsartx.naming import TopicName
    from pulsartx.subscription.store import shared_store

    seed(client, IN, 2)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    txn = client.new_transaction()
    store = shared_store(client.root, TopicName.parse(f"{IN}-partition-0"), "s")
    store.update(lambda cur: cur.txn_ack(txn_key(*txn.id.as_tuple()), [0]))  # then the process died
    assert pending_stats(client, IN, "s")[0]["pendingAckCount"] == 1
    [m1] = receive_n(c, 1)
    assert m1.data() == b"m1"  # m0 is PENDING_ACK
    txn.abort() if outcome == "abort" else txn.commit()
    assert client.admin.transactions.get_transaction_metadata(txn.id)["subscriptions"] == []
    if outcome == "commit, then trimmed":  # the TC forgets finished transactions: that is no answer either
        from pulsartx.coordinator.coordinator import now_ms
        from pulsartx.exceptions import TransactionNotFound

        tl = client._coordinators().for_txn(txn.id).txlog
        tl.finished_retention_ms, tl.log.compact_every = 0, 1
        assert tl.maybe_compact(now_ms())
        with pytest.raises(TransactionNotFound, match="trimmed"):
            client.admin.transactions.get_transaction_metadata(txn.id)
    c.acknowledge(m1)
    got = c.receive(timeout_millis=10_000)  # resolution runs on a fetch
    assert got.data() == b"m0" and got.redelivery_count() == 1
    assert pending_stats(client, IN, "s")[0]["pendingAckCount"] == 0
    c.acknowledge(got)
    assert drain(c) == []


# ---- consume-transform-produce (Kafka TransactionsTest) ----------------------------------------


def test_consume_transform_produce_500_commit_abort_alternating(client):
    seed(client, IN, 500, partitions=2)
    client.admin.create_topic(OUT, partitions=2)
    c = client.subscribe(IN, "ctp", initial_position=InitialPosition.Earliest, receiver_queue_size=100)
    p = client.create_producer(OUT)
    committed, aborted, n_txn = [], [], 0
    while True:
        batch = c.batch_receive(max_num_messages=60, timeout_millis=500)
        if not batch:
            break
        txn = client.new_transaction()
        for m in batch:
            p.send_async(b"out-" + m.data(), None, partition_key=m.partition_key(), txn=txn)
        c.acknowledge(batch, txn=txn)
        if n_txn % 2 == 0:
            txn.commit()
            committed += vals(batch)
        else:
            p.flush()  # write the outputs first: abort() drops what is still queued, and we count them below
            txn.abort()
            aborted += vals(batch)
        n_txn += 1
    assert len(committed) == 500 and set(committed) == {f"m{i}" for i in range(500)}
    assert aborted  # half the transactions were aborted and their inputs came back
    outputs = read_all(client, OUT)
    assert sorted(outputs) == sorted(f"out-m{i}" for i in range(500))  # exactly once: 500 unique
    # The aborted outputs were written (READ_UNCOMMITTED sees them) but never become visible.
    assert len(read_all(client, OUT, "READ_UNCOMMITTED")) == 500 + len(aborted)
    stats = pending_stats(client, IN, "ctp")
    ends = [s["markDeletePosition"] for s in stats]
    assert sum(e + 1 for e in ends) == 500  # the subscription is at the end of both partitions
    assert all(s["pendingAckCount"] == 0 and s["individuallyAckedRanges"] == 0 for s in stats)


def test_ctp_across_two_subscriptions_and_two_output_topics(client):
    seed(client, "a", 3, prefix="a")
    seed(client, "b", 3, prefix="b")
    client.admin.create_topic("x")
    client.admin.create_topic("y", partitions=2)
    ca = client.subscribe("a", "sa", initial_position=InitialPosition.Earliest)
    cb = client.subscribe("b", "sb", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest)
    px, py = client.create_producer("x"), client.create_producer("y")

    def step(commit: bool) -> tuple[list[str], list[str]]:
        ia, ib = drain(ca), drain(cb)
        txn = client.new_transaction()
        for m in ia:
            px.send(b"x-" + m.data(), txn=txn)
        for m in ib:
            py.send_async(b"y-" + m.data(), None, txn=txn)
        ca.acknowledge_cumulative(ia[-1], txn=txn)
        cb.acknowledge(ib, txn=txn)
        py.flush()  # send_async registers y's partitions when its batch goes out, not when queued
        meta = client.admin.transactions.get_transaction_metadata(txn.id)
        assert meta["subscriptions"] == ["persistent://public/default/a-partition-0:sa",
                                         "persistent://public/default/b-partition-0:sb"]
        parts = set(meta["partitions"])  # ADD_PARTITION for x and for the y partitions written to
        assert "persistent://public/default/x-partition-0" in parts and len(parts) >= 2
        assert parts <= {"persistent://public/default/x-partition-0"} | \
            {f"persistent://public/default/y-partition-{i}" for i in range(2)}
        txn.commit() if commit else txn.abort()
        return ia, ib

    ia, ib = step(commit=False)
    assert vals(ia) == ["a0", "a1", "a2"] and vals(ib) == ["b0", "b1", "b2"]
    assert read_all(client, "x") == [] and read_all(client, "y") == []  # neither output appears
    ia, ib = step(commit=True)  # the inputs were redelivered on both subscriptions
    assert vals(ia) == ["a0", "a1", "a2"] and sorted(vals(ib)) == ["b0", "b1", "b2"]
    assert {m.redelivery_count() for m in ia + ib} == {1}
    assert read_all(client, "x") == ["x-a0", "x-a1", "x-a2"]
    assert sorted(read_all(client, "y")) == ["y-b0", "y-b1", "y-b2"]
    assert drain(ca, idle_ms=200) == [] and drain(cb, idle_ms=200) == []
    assert pending_stats(client, "a", "sa")[0]["markDeletePosition"] == 2
    assert pending_stats(client, "b", "sb")[0]["markDeletePosition"] == 2


# ---- restart replay ------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_pending_acks_survive_a_restart(root, outcome):
    c1 = Client(root)
    seed(c1, IN, 8, partitions=2)
    cons = c1.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    msgs = receive_n(cons, 8)
    by_part: dict[int, list] = {0: [], 1: []}
    for m in msgs:
        by_part[m.message_id().partition()].append(m)
    txn = c1.new_transaction()
    cons.acknowledge_cumulative(by_part[0][1], txn=txn)  # partition 0: cumulative up to its 2nd message
    cons.acknowledge(by_part[1][0], txn=txn)  # partition 1: one individual ack
    held = [by_part[0][0], by_part[0][1], by_part[1][0]]
    held_ids = {m.message_id() for m in held}
    cons.close()
    before = pending_stats(c1, IN, "s")

    c2 = Client(root)  # restart: a fresh client replays the store
    assert pending_stats(c2, IN, "s") == before
    assert before[0]["pendingCumulativeAck"] == {"txn_id": str(txn.id), "position": by_part[0][1].message_id().offset()}
    assert before[1]["transactions"] == {str(txn.id): 1}
    cons2 = c2.subscribe(IN, "s")
    rest = drain(cons2)
    assert sorted(vals(rest)) == sorted(vals(m for m in msgs if m.message_id() not in held_ids))
    # The restarted consumer's txn-less conflicts still apply to the replayed state.
    t2 = c2.new_transaction()
    with pytest.raises(TransactionConflict):
        cons2.acknowledge(by_part[1][0].message_id(), txn=t2)
    t2.abort()
    for m in rest:
        cons2.acknowledge(m)

    txn.commit() if outcome == "commit" else txn.abort()
    back = drain(cons2)
    if outcome == "commit":
        assert back == []
        assert all(s["pendingAckCount"] == 0 for s in pending_stats(c2, IN, "s"))
    else:
        assert sorted(vals(back)) == sorted(vals(held))
        assert {m.redelivery_count() for m in back} == {1}
        for m in back:
            cons2.acknowledge(m)
    cons2.close()
    stats = pending_stats(c2, IN, "s")
    assert sum(s["markDeletePosition"] + 1 for s in stats) == 8 and all(s["pendingAckCount"] == 0 for s in stats)
    c1.close()
    c2.close()


def test_txn_acks_after_unsubscribe_and_resubscribe(root, client):
    """The TC participant caches subscription stores per process: after an unsubscribe and a new
    subscribe of the same name, a transaction's acks on the new subscription must still end."""
    seed(client, IN, 5)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    first = receive_n(c, 5)
    t = client.new_transaction()
    c.acknowledge(first[:2], txn=t)
    t.commit()
    c.unsubscribe()
    with pytest.raises(SubscriptionNotFound):
        pending_stats(client, IN, "s")
    other = Client(root)  # the subscription is gone for everyone
    with pytest.raises(SubscriptionNotFound):
        pending_stats(other, IN, "s")
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    again = receive_n(c, 5)
    assert vals(again) == [f"m{i}" for i in range(5)] and {m.redelivery_count() for m in again} == {0}
    t = client.new_transaction()
    c.acknowledge(again[:3], txn=t)
    t.commit()
    client.flush()  # the pending acks land (after the decision, in the background)
    [st] = pending_stats(other, IN, "s")
    assert st["markDeletePosition"] == 2 and st["pendingAckCount"] == 0
    c.redeliver_unacknowledged_messages()
    assert vals(drain(c)) == ["m3", "m4"]
    other.close()


def test_a_subscription_table_recreated_elsewhere_is_reloaded_by_the_processs_shared_store(tmp_path):
    """Consumers and the TC's participant calls share one store per (partition, subscription) in a
    process; a table deleted and re-created by another process under it must not be continued
    from the old table's version (the new subscription starts from its own state)."""
    import shutil

    from pulsartx.naming import TopicName
    from pulsartx.subscription.store import SubscriptionStore, shared_store

    client = Client(str(tmp_path))
    seed(client, IN, 5)
    c = client.subscribe(IN, "s", consumer_type=ConsumerType.Exclusive, initial_position=InitialPosition.Earliest)
    for _ in range(3):
        c.acknowledge(c.receive(5000))
    c.close()
    part = TopicName.parse(IN).with_partition(0)
    cached = shared_store(client.root, part, "s")
    assert cached.cursor().mark_delete == 2
    # "Another process": removes the table and creates a fresh one with an independent store.
    shutil.rmtree(client.root.fs_path(*cached.segments))
    other = SubscriptionStore(client.root, part, "s")
    other.create(-1)
    c = client.subscribe(IN, "s", consumer_type=ConsumerType.Exclusive, initial_position=InitialPosition.Earliest)
    assert [c.receive(5000).data() for _ in range(5)] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    c.close()


def test_a_subscription_table_in_another_layout_is_refused_by_name(tmp_path):
    """A table written by another pulsartx version is not read with columns missing (state would
    be silently lost): the error names the table and the way out."""
    import pyarrow as pa

    from pulsartx.exceptions import CorruptedLog
    from pulsartx.naming import TopicName
    from pulsartx.storage import delta
    from pulsartx.subscription.store import SubscriptionStore

    client = Client(str(tmp_path))
    seed(client, IN, 1)
    store = SubscriptionStore(client.root, TopicName.parse(IN).with_partition(0), "old")
    old = pa.schema([pa.field("seq", pa.int64(), False), pa.field("key", pa.string(), False),
                     pa.field("mark_delete", pa.int64()), pa.field("acked", pa.list_(pa.int64()))])
    delta.create_table(client.root, old, *store.segments)
    with pytest.raises(CorruptedLog, match=r"sub-old-0 table .*written by another pulsartx version"):
        store.cursor()


def test_concurrent_txn_acks_share_cursor_writes_and_fail_alone(client):
    """Acknowledgements in transactions from 8 threads (8 Shared consumers of one process, whose
    cursor writes may share commits): a conflicting one fails alone, and every other transaction's
    acknowledgements land exactly once."""
    import threading

    seed(client, IN, 400)
    held = client.new_transaction()  # holds offset 0 pending: every thread's first attempt conflicts
    first = client.subscribe(IN, "g", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest)
    consumers = [first] + [client.subscribe(IN, "g", consumer_type=ConsumerType.Shared) for _ in range(7)]
    m0 = receive_n(first, 1)[0]
    assert m0.message_id().offset() == 0
    first.acknowledge(m0, txn=held)
    acked: list[list[int]] = [[] for _ in consumers]
    conflicts: list[str] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        c = consumers[i]
        probe = client.new_transaction()
        try:
            c.acknowledge(m0, txn=probe)
        except TransactionConflict as e:
            with lock:
                conflicts.append(str(e))
        probe.abort()
        while True:
            msgs = c.batch_receive(max_num_messages=5, timeout_millis=1500)
            if not msgs:
                return
            txn = client.new_transaction()
            c.acknowledge(msgs, txn=txn)
            txn.commit()
            acked[i] += [m.message_id().offset() for m in msgs]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held.commit()
    assert len(conflicts) == 8 and all("offset 0 is already pending" in c for c in conflicts), conflicts
    everything = sorted(o for a in acked for o in a)
    assert everything == list(range(1, 400))  # each exactly once
    [st] = pending_stats(client, IN, "g")
    assert (st["markDeletePosition"], st["pendingAckCount"], st["pendingCumulativeAck"]) == (399, 0, None)
    for c in consumers:
        c.close()
