"""client.admin: topic_stats, peek and subscription administration (list, reset, skip, delete)."""
from __future__ import annotations

import re
import time

import pytest

import pulsartx
from pulsartx import InitialPosition, MessageId
from pulsartx.admin import SubscriptionNotFound
from pulsartx.admin.subscriptions import cursor_backlog
from pulsartx.exceptions import InvalidConfiguration, NotAllowedError, TopicNotFound
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.ranges import RangeSet
from pulsartx.subscription.store import SubscriptionStore

T = "persistent://public/default/orders"


def send(client, partition: int, *values: str, txn=None) -> None:
    p = client.create_producer(f"orders-partition-{partition}")
    for v in values:
        p.send(v.encode(), txn=txn)
    p.close()


def cursor(root: str, partition: int, sub: str = "billing") -> CursorState:
    from pulsartx.storage.root import StorageRoot

    c = SubscriptionStore(StorageRoot.resolve(root), TopicName.parse(f"orders-partition-{partition}"), sub).cursor()
    assert c is not None
    return c


def subscribe(client, sub: str = "billing", **kw):
    return client.subscribe("orders", sub, initial_position=InitialPosition.Earliest,
                            acknowledgment_group_time_ms=0, **kw)


def drain(consumer, n: int) -> list:
    """Exactly ``n`` messages, then nothing more."""
    out = [consumer.receive(5000) for _ in range(n)]
    with pytest.raises(pulsartx.Timeout):
        consumer.receive(150)
    return out


@pytest.fixture
def client(root: str):
    c = pulsartx.Client(root, num_coordinators=1)
    c.admin.create_topic("orders", partitions=2)
    yield c
    c.close()


def make_workload(client):
    """p0: a0 a1 a2 | c0 COMMIT | x0 ABORT ; p1: b0 b1 | c1 COMMIT. Subscription 'billing' has
    received everything; (0,0) and (0,1) are acked, (1,0) is PENDING_ACK in the open ``txn``."""
    send(client, 0, "a0", "a1", "a2")
    send(client, 1, "b0", "b1")
    with client.new_transaction() as t:
        send(client, 0, "c0", txn=t)
        send(client, 1, "c1", txn=t)
    t = client.new_transaction()
    send(client, 0, "x0", txn=t)
    t.abort()
    consumer = subscribe(client)
    assert len(drain(consumer, 7)) == 7
    consumer.acknowledge([MessageId(0, 0), MessageId(0, 1)])
    txn = client.new_transaction(timeout_ms=600_000)
    consumer.acknowledge(MessageId(1, 0), txn=txn)
    consumer.close()
    return txn


@pytest.fixture
def workload(client):
    return make_workload(client)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The same workload, for tests that only read it (or fail before changing anything)."""
    c = pulsartx.Client(str(tmp_path_factory.mktemp("shared-root")), num_coordinators=1)
    c.admin.create_topic("orders", partitions=2)
    make_workload(c)
    yield c
    c.close()


def test_cursor_backlog_counts_individual_acks_out() -> None:
    c = CursorState(mark_delete=3, acked=RangeSet([(5, 6), (9, 12)]))
    assert cursor_backlog(c, 0, 10) == 10 - 4 - 3  # 4, 7, 8 left
    assert cursor_backlog(c, 0, 4) == 0
    assert cursor_backlog(CursorState(mark_delete=-1), 5, 8) == 3  # offsets below the start are gone


def test_topic_stats(shared) -> None:
    client = shared
    stats = client.admin.topic_stats("orders")
    indexes = [PartitionLog(client.root, TopicName.parse(f"orders-partition-{i}")).refresh() for i in range(2)]
    sizes = [i.size_bytes() for i in indexes]
    assert all(s > 0 for s in sizes)
    # Clock- and name-dependent figures (exact in test_topic_stats.py): rates, producer names.
    for s, producers in zip(stats, (3, 2), strict=True):
        assert s.pop("msgRateIn") > 0 and s.pop("msgRateOut") == s["subscriptions"]["billing"].pop("msgRateOut")
        assert len(s.pop("producers")) == producers  # one per send() call
    billing = {"type": "Exclusive", "consumers": [], "unackedMessages": 0}
    assert stats == [
        {"partition": f"{T}-partition-0", "entries": 7, "messages": 5, "markers": 2,
         "fileCount": len(indexes[0].files), "bytes": sizes[0], "startOffset": 0, "endOffset": 7,
         "maxReadPosition": 6, "ongoingTxnCount": 0, "abortedTxnCount": 1, "blockingTxn": None,
         # markers and aborted data (4, 5, 6) were acked as the consumer passed them
         "subscriptions": {"billing": {"markDeletePosition": 1, "individuallyAckedCount": 3, "pendingAckCount": 0,
                                       "backlog": 2, **billing}}},
        {"partition": f"{T}-partition-1", "entries": 4, "messages": 3, "markers": 1,
         "fileCount": len(indexes[1].files), "bytes": sizes[1], "startOffset": 0, "endOffset": 4,
         "maxReadPosition": 3, "ongoingTxnCount": 0, "abortedTxnCount": 0, "blockingTxn": None,
         "subscriptions": {"billing": {"markDeletePosition": -1, "individuallyAckedCount": 1, "pendingAckCount": 1,
                                       "backlog": 3, **billing}}},
    ]
    assert [s["partition"] for s in client.admin.topic_stats("orders-partition-1")] == [f"{T}-partition-1"]


def test_topic_stats_shows_open_transactions(client) -> None:
    send(client, 0, "a")
    t = client.new_transaction()
    send(client, 0, "open", txn=t)
    send(client, 0, "after")
    s = client.admin.topic_stats("orders")[0]
    assert (s["entries"], s["maxReadPosition"], s["ongoingTxnCount"], s["subscriptions"]) == (3, 0, 1, {})
    assert (s["blockingTxn"]["txnId"], s["blockingTxn"]["firstOffset"], s["blockingTxn"]["heldEntries"]) == (
        str(t.id), 1, 2)
    t.abort()


def test_peek(shared) -> None:
    client = shared
    assert [m.data() for m in client.admin.peek("orders-partition-0", 10)] == [b"a0", b"a1", b"a2", b"c0"]
    assert [m.data() for m in client.admin.peek("orders-partition-0", 2)] == [b"a0", b"a1"]
    unc = client.admin.peek("orders-partition-0", 10, isolation_level="read_uncommitted")
    assert [m.data() for m in unc] == [b"a0", b"a1", b"a2", b"c0", b"x0"]
    assert sorted(m.data() for m in client.admin.peek("orders", 100)) == [b"a0", b"a1", b"a2", b"b0", b"b1",
                                                                            b"c0", b"c1"]
    assert client.admin.peek("orders", 0) == []
    with pytest.raises(InvalidConfiguration, match="isolation_level"):
        client.admin.peek("orders", 1, isolation_level="SERIALIZABLE")
    with pytest.raises(TopicNotFound):
        client.admin.peek("nope")


def test_peek_holds_back_open_transactions(client) -> None:
    t = client.new_transaction()
    send(client, 0, "open", txn=t)
    send(client, 0, "plain")
    assert client.admin.peek("orders") == []  # behind maxReadPosition, as for any reader
    t.commit()
    assert [m.data() for m in client.admin.peek("orders")] == [b"open", b"plain"]


def test_list_subscriptions(client, workload) -> None:
    assert client.admin.list_subscriptions("orders") == ["billing"]
    subscribe(client, "audit").close()
    assert client.admin.list_subscriptions(T) == ["audit", "billing"]
    assert client.admin.list_subscriptions("orders-partition-1") == ["audit", "billing"]
    client.admin.delete_subscription("orders", "audit")
    assert client.admin.list_subscriptions("orders") == ["billing"]
    client.admin.create_topic("other")
    assert client.admin.list_subscriptions("other") == []
    with pytest.raises(TopicNotFound):
        client.admin.list_subscriptions("nope")


def test_reset_to_message_id_moves_one_partition(client, root, workload) -> None:
    rows = client.admin.reset_subscription("orders", "billing", message_id=MessageId(0, 1))
    assert rows == [{"partition": f"{T}-partition-0", "subscription": "billing", "position": 1,
                     "markDeletePosition": 0}]
    c0, c1 = cursor(root, 0), cursor(root, 1)
    assert (c0.mark_delete, c0.acked.ranges()) == (0, [])
    assert c1.pending  # untouched
    with subscribe(client) as consumer:
        got = {(m.message_id().partition(), m.message_id().offset()) for m in drain(consumer, 5)}
    assert got == {(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)}


def test_reset_earliest_latest_and_pending_acks(client, root, workload) -> None:
    rows = client.admin.reset_subscription("orders", "billing", message_id=MessageId.earliest)
    assert [(r["position"], r["markDeletePosition"]) for r in rows] == [(0, -1), (0, -1)]
    c1 = cursor(root, 1)
    assert (c1.mark_delete, c1.pending, c1.acked.ranges()) == (-1, {}, [])  # pending acks dropped too
    workload.commit()  # its pending ack is gone: committing changes nothing
    assert cursor(root, 1).mark_delete == -1
    with subscribe(client) as consumer:
        assert len(drain(consumer, 7)) == 7
    rows = client.admin.reset_subscription("orders", "billing", message_id=MessageId.latest)
    assert [r["position"] for r in rows] == [7, 4]


def test_reset_latest_stops_before_open_transactions(client) -> None:
    subscribe(client).close()
    send(client, 0, "a")
    t = client.new_transaction()
    send(client, 0, "in-txn", txn=t)
    send(client, 0, "b")
    rows = client.admin.reset_subscription("orders", "billing", message_id=MessageId.latest)
    assert rows[0]["position"] == 1  # the open transaction's first message: nothing of it is skipped
    t.commit()
    with subscribe(client) as consumer:
        assert [m.data() for m in drain(consumer, 2)] == [b"in-txn", b"b"]


def test_reset_by_time(client, root) -> None:
    subscribe(client).close()
    send(client, 0, "old0", "old1")
    send(client, 1, "old2")
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.01)
    send(client, 0, "new0")
    plog = PartitionLog(client.root, TopicName.parse("orders-partition-0"))
    assert plog.offset_at_time(0) == 0
    assert plog.offset_at_time(cut) == 2
    assert plog.offset_at_time(cut + 3_600_000) == 3  # nothing that late: the end
    rows = client.admin.reset_subscription("orders", "billing", timestamp_ms=cut)
    assert [r["position"] for r in rows] == [2, 1]
    with subscribe(client) as consumer:
        assert [m.data() for m in drain(consumer, 1)] == [b"new0"]


def test_reset_errors(shared) -> None:
    client = shared
    with pytest.raises(SubscriptionNotFound, match=r"'nope' does not exist on topic persistent://public/default/orders"
                                                   rf".*`pulsartx --service-url {re.escape(client.root.url)} "
                                                   r"subscriptions list persistent://public/default/orders`"):
        client.admin.reset_subscription("orders", "nope", message_id=MessageId.earliest)
    with pytest.raises(InvalidConfiguration, match="exactly one"):
        client.admin.reset_subscription("orders", "billing")
    with pytest.raises(InvalidConfiguration, match="exactly one"):
        client.admin.reset_subscription("orders", "billing", message_id=MessageId.earliest, timestamp_ms=1)
    with pytest.raises(InvalidConfiguration, match="partition 7 does not exist.*0..1"):
        client.admin.reset_subscription("orders", "billing", message_id=MessageId(7, 0))
    with pytest.raises(InvalidConfiguration, match="ends at offset 3; use 'latest'"):
        client.admin.reset_subscription("orders", "billing", message_id=MessageId(1, 9))
    with pytest.raises(InvalidConfiguration, match="must be a MessageId"):
        client.admin.reset_subscription("orders", "billing", message_id="(0,1)")
    with pytest.raises(TopicNotFound):
        client.admin.reset_subscription("nope", "billing", message_id=MessageId.earliest)


def test_skip_is_cumulative_and_leaves_pending_acks(client, root, workload) -> None:
    # p0: mark-delete 1, so 2 (a2) and 3 (c0) are deliverable; p1: 0 is pending, 1 (b1) and 2 (c1) are.
    rows = client.admin.skip_messages("orders", "billing", 1)
    assert rows == [
        {"partition": f"{T}-partition-0", "subscription": "billing", "skipped": 1, "markDeletePosition": 2},
        {"partition": f"{T}-partition-1", "subscription": "billing", "skipped": 1, "markDeletePosition": -1},
    ]
    c1 = cursor(root, 1)
    assert (c1.mark_delete, c1.acked.ranges(), c1.pending_count()) == (-1, [(1, 1), (3, 3)], 1)
    rows = client.admin.skip_messages("orders", "billing", 100)  # more than there is: everything readable
    assert [(r["skipped"], r["markDeletePosition"]) for r in rows] == [(1, 6), (1, -1)]
    assert cursor(root, 1).acked.ranges() == [(1, 3)]
    workload.commit()
    client.flush()  # the pending ack lands (after the decision, in the background): fully acknowledged
    assert cursor(root, 1).mark_delete == 3
    assert [s["subscriptions"]["billing"]["backlog"] for s in client.admin.topic_stats("orders")] == [0, 0]
    assert [r["skipped"] for r in client.admin.skip_messages("orders", "billing", 5)] == [0, 0]


def test_skip_then_consume(client) -> None:
    subscribe(client).close()
    send(client, 0, *[f"m{i}" for i in range(5)])
    assert client.admin.skip_messages("orders-partition-0", "billing", 3)[0]["skipped"] == 3
    with subscribe(client) as consumer:
        assert [m.data() for m in drain(consumer, 2)] == [b"m3", b"m4"]


def test_skip_errors(shared) -> None:
    client = shared
    with pytest.raises(InvalidConfiguration, match="positive integer"):
        client.admin.skip_messages("orders", "billing", 0)
    with pytest.raises(SubscriptionNotFound, match="'ghost'"):
        client.admin.skip_messages("orders", "ghost", 1)


def test_delete_subscription(client, root, workload) -> None:
    consumer = subscribe(client)
    with pytest.raises(NotAllowedError, match=r"'billing' .* live consumer.*--force"):
        client.admin.delete_subscription("orders", "billing")
    assert client.admin.delete_subscription("orders", "billing", force=True) == {
        "topic": T, "subscription": "billing", "partitions": 2}
    consumer.close()
    assert client.admin.list_subscriptions("orders") == []
    with pytest.raises(SubscriptionNotFound):
        client.admin.delete_subscription("orders", "billing")
    workload.commit()  # its pending ack went with the subscription
    with subscribe(client) as again:  # a new subscription of the same name starts over
        assert len(drain(again, 7)) == 7
    assert client.admin.list_subscriptions("orders") == ["billing"]


def test_delete_refused_for_live_shared_consumer(client) -> None:
    consumer = subscribe(client, "workers", consumer_type=pulsartx.ConsumerType.Shared)
    with pytest.raises(NotAllowedError, match="live consumer"):
        client.admin.delete_subscription("orders", "workers")
    consumer.close()
    client.admin.delete_subscription("orders", "workers")
    assert client.admin.list_subscriptions("orders") == []
