"""Consumer: subscription types, plain acknowledgements, redelivery, seek, unsubscribe, initial
position, and what a READ_COMMITTED subscription skips (markers, aborted transactional data).

Scenarios follow pulsar-client's consumer tests, rewritten against this API; every assertion is on
exact sets of message values.
"""
from __future__ import annotations

import time

import pytest
from _reads import drain, stall_lease_renewals

import pulsartx
from pulsartx import Client, ConsumerType, InitialPosition, MessageId, NotAllowedError, Timeout
from pulsartx.admin import SubscriptionNotFound
from pulsartx.exceptions import AlreadyClosed, ConsumerBusy, InvalidConfiguration, InvalidTopicName

TOPIC = "persistent://public/default/in"
pytestmark = pytest.mark.timeout(120)


# ---- helpers -----------------------------------------------------------------------------------


def seed(client: Client, topic: str, n: int, prefix: str = "m", partitions: int = 1, create: bool = True,
         keyed: bool = False) -> list[MessageId]:
    if create:
        client.admin.create_topic(topic, partitions=partitions)
    p = client.create_producer(topic)
    ids = [p.send(f"{prefix}{i}".encode(), partition_key=f"k{i}" if keyed else None) for i in range(n)]
    p.close()
    return ids


def redelivered(consumer, idle_ms: int = 1500) -> list[tuple[str, int]]:
    """:func:`drain` acknowledging each message, as (value, redelivery count)."""
    return [(m.data().decode(), m.redelivery_count()) for m in drain(consumer, idle_ms, ack=True)]


def vals(msgs) -> list[str]:
    return [m.data().decode() for m in msgs]


def names(prefix: str, idx) -> set[str]:
    return {f"{prefix}{i}" for i in idx}


def mark_delete(client: Client, topic: str, sub: str) -> list[int]:
    return [s["markDeletePosition"] for s in client.admin.transactions.get_pending_ack_stats(topic, sub)]


# ---- API surface ---------------------------------------------------------------------------------


def test_public_names():
    assert pulsartx.ConsumerType.Exclusive and pulsartx.ConsumerType.Failover and pulsartx.ConsumerType.Shared
    assert pulsartx.InitialPosition.Latest and pulsartx.InitialPosition.Earliest
    assert issubclass(ConsumerBusy, pulsartx.PulsarException)


def test_receive_timeout(client):
    client.admin.create_topic(TOPIC)
    c = client.subscribe(TOPIC, "s")
    t0 = time.monotonic()
    with pytest.raises(Timeout, match=r"no message on persistent://public/default/in \(subscription 's'\) "
                                      r"within 200 ms"):
        c.receive(timeout_millis=200)
    assert 0.19 <= time.monotonic() - t0 < 2
    assert c.batch_receive(timeout_millis=50) == []
    assert c.topic() == TOPIC and c.subscription_name() == "s" and c.is_connected()
    c.close()
    assert not c.is_connected()
    with pytest.raises(AlreadyClosed):
        c.receive(timeout_millis=10)
    with pytest.raises(AlreadyClosed):
        c.acknowledge(MessageId(0, 0))


def test_bad_options(client):
    client.admin.create_topic(TOPIC)
    with pytest.raises(InvalidConfiguration, match="consumer_type"):
        client.subscribe(TOPIC, "s", consumer_type="Shared")
    with pytest.raises(InvalidConfiguration, match="initial_position"):
        client.subscribe(TOPIC, "s", initial_position="earliest")
    with pytest.raises(InvalidConfiguration, match="receiver_queue_size"):
        client.subscribe(TOPIC, "s", receiver_queue_size=0)
    with pytest.raises(InvalidConfiguration, match="unacked_messages_timeout_ms"):
        client.subscribe(TOPIC, "s", unacked_messages_timeout_ms=0)
    with pytest.raises(InvalidConfiguration, match="isolation_level"):
        client.subscribe(TOPIC, "s", isolation_level="SERIALIZABLE")


def test_receive_from_all_partitions_and_plain_acks_persist(client):
    seed(client, TOPIC, 30, partitions=3, keyed=True)
    c = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest)
    got = drain(c)
    assert sorted(vals(got)) == sorted(names("m", range(30)))
    assert {m.message_id().partition() for m in got} == {0, 1, 2}
    assert all(m.redelivery_count() == 0 for m in got)
    # As pulsar-client on a partitioned topic: each message names its partition's topic.
    assert {m.topic_name() for m in got} == {f"{TOPIC}-partition-{i}" for i in range(3)}
    assert all(m.topic_name().endswith(f"-partition-{m.message_id().partition()}") for m in got)
    acked = got[::2]
    for m in acked:
        c.acknowledge(m)
    c.close()  # flushes the grouped acks
    c2 = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest)
    again = drain(c2)
    assert sorted(vals(again)) == sorted(set(vals(got)) - set(vals(acked)))
    c2.acknowledge([m.message_id() for m in again])  # a list of ids: one call
    c2.close()
    c3 = client.subscribe(TOPIC, "s")
    with pytest.raises(Timeout):
        c3.receive(timeout_millis=300)
    c3.close()


def test_batch_receive(client):
    seed(client, TOPIC, 25)
    c = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest)
    first = c.batch_receive(max_num_messages=10)
    assert vals(first) == [f"m{i}" for i in range(10)]
    rest = c.batch_receive(timeout_millis=500)
    assert vals(rest) == [f"m{i}" for i in range(10, 25)]
    assert c.batch_receive(timeout_millis=100) == []


def test_acknowledge_cumulative_plain(client):
    ids = seed(client, TOPIC, 10)
    c = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest, acknowledgment_group_time_ms=0)
    got = drain(c)
    c.acknowledge(got[7])
    c.acknowledge_cumulative(got[4])
    assert mark_delete(client, TOPIC, "s") == [ids[4].offset()]
    c.redeliver_unacknowledged_messages()
    assert vals(drain(c)) == ["m5", "m6", "m8", "m9"]
    c.acknowledge_cumulative(ids[9])
    assert mark_delete(client, TOPIC, "s") == [ids[9].offset()]
    c.redeliver_unacknowledged_messages()
    assert drain(c, idle_ms=200) == []


def test_cumulative_ack_of_several_ids_not_allowed(client):
    ids = seed(client, TOPIC, 3)
    c = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest)
    got = drain(c)
    for many in (got, ids[:2], tuple(ids), [ids[0]]):
        with pytest.raises(NotAllowedError, match="acknowledge_cumulative takes one message"):
            c.acknowledge_cumulative(many)
    txn = client.new_transaction()
    with pytest.raises(NotAllowedError):
        c.acknowledge_cumulative(ids, txn=txn)
    txn.commit()
    with pytest.raises(InvalidConfiguration, match="cannot acknowledge"):
        c.acknowledge(MessageId.earliest)


def test_shared_cumulative_ack_not_allowed(client):
    ids = seed(client, TOPIC, 3)
    c = client.subscribe(TOPIC, "s", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest)
    got = drain(c)
    with pytest.raises(NotAllowedError, match="not allowed on a Shared subscription"):
        c.acknowledge_cumulative(got[-1])
    txn = client.new_transaction()
    with pytest.raises(NotAllowedError, match="not allowed on a Shared subscription"):
        c.acknowledge_cumulative(ids[1], txn=txn)
    txn.abort()


# ---- subscription types ------------------------------------------------------------------------


def test_exclusive_refuses_a_second_consumer(root, client):
    client.admin.create_topic(TOPIC)
    c1 = client.subscribe(TOPIC, "excl", consumer_type=ConsumerType.Exclusive)
    with pytest.raises(ConsumerBusy, match=r"subscription 'excl' on persistent://public/default/in is Exclusive"):
        client.subscribe(TOPIC, "excl")
    other = Client(root)  # another client (another process, as far as storage knows)
    with pytest.raises(ConsumerBusy, match="Exclusive"):
        other.subscribe(TOPIC, "excl", consumer_type=ConsumerType.Exclusive)
    c1.close()
    c2 = other.subscribe(TOPIC, "excl")  # free again once the owner closed
    c2.close()
    other.close()


def test_other_type_refused_while_a_consumer_is_live(client):
    client.admin.create_topic(TOPIC)
    for live, other in [(ConsumerType.Exclusive, ConsumerType.Shared), (ConsumerType.Failover, ConsumerType.Exclusive),
                        (ConsumerType.Shared, ConsumerType.Exclusive), (ConsumerType.Shared, ConsumerType.Failover)]:
        sub = f"s-{live.name}-{other.name}"
        c = client.subscribe(TOPIC, sub, consumer_type=live)
        with pytest.raises(InvalidConfiguration, match=rf"is {live.name} and has a live consumer; a {other.name} "):
            client.subscribe(TOPIC, sub, consumer_type=other)
        c.close()
        client.subscribe(TOPIC, sub, consumer_type=other).close()  # nobody live: the type may change


def test_failover_standby_takes_over_on_close(client):
    seed(client, TOPIC, 20)
    a = client.subscribe(TOPIC, "fo", consumer_type=ConsumerType.Failover, initial_position=InitialPosition.Earliest)
    b = client.subscribe(TOPIC, "fo", consumer_type=ConsumerType.Failover)
    first = [a.receive(timeout_millis=2000) for _ in range(8)]
    with pytest.raises(Timeout):
        b.receive(timeout_millis=300)  # standby
    for m in first[:5]:
        a.acknowledge(m)
    a.close()
    rest = drain(b, ack=True)
    assert vals(first[:5]) == [f"m{i}" for i in range(5)]
    assert vals(rest) == [f"m{i}" for i in range(5, 20)]  # received-but-unacked m5..m7 come back
    b.close()
    assert mark_delete(client, TOPIC, "fo") == [19]


def test_shared_consumers_never_hold_the_same_message(client):
    seed(client, TOPIC, 60, partitions=2, keyed=True)
    kw = {"consumer_type": ConsumerType.Shared, "initial_position": InitialPosition.Earliest,
          "receiver_queue_size": 5}
    a = client.subscribe(TOPIC, "sh", **kw)
    b = client.subscribe(TOPIC, "sh", **kw)
    got: dict[str, list[str]] = {"a": [], "b": []}
    idle = 0
    while idle < 4:
        idle += 1
        for name, c in (("a", a), ("b", b)):
            try:
                m = c.receive(timeout_millis=150)
            except Timeout:
                continue
            idle = 0
            got[name].append(m.data().decode())
            c.acknowledge(m)
    assert not set(got["a"]) & set(got["b"])
    assert set(got["a"]) | set(got["b"]) == names("m", range(60))
    assert len(got["a"]) + len(got["b"]) == 60 and got["a"] and got["b"]
    a.close()
    b.close()


def test_shared_consumer_is_not_starved_by_another_holding_messages(client):
    seed(client, TOPIC, 12)
    kw = {"consumer_type": ConsumerType.Shared, "initial_position": InitialPosition.Earliest,
          "receiver_queue_size": 4}
    a = client.subscribe(TOPIC, "sh", **kw)
    b = client.subscribe(TOPIC, "sh", **kw)
    held_by_a = [a.receive(timeout_millis=2000) for _ in range(4)]  # held, not acked
    got_b = [b.receive(timeout_millis=2000) for _ in range(4)]  # b gets the next ones, not nothing
    assert vals(held_by_a) == ["m0", "m1", "m2", "m3"] and vals(got_b) == ["m4", "m5", "m6", "m7"]
    a.close()  # releases its claims: b gets a's messages back
    rest = drain(b)
    assert sorted(vals(rest)) == ["m0", "m1", "m10", "m11", "m2", "m3", "m8", "m9"]


def test_shared_message_held_longer_than_a_lease_stays_with_its_consumer(client):
    seed(client, TOPIC, 1)
    kw = {"consumer_type": ConsumerType.Shared, "initial_position": InitialPosition.Earliest, "lease_ms": 900}
    a = client.subscribe(TOPIC, "sh", **kw)
    b = client.subscribe(TOPIC, "sh", **kw)
    m = a.receive(timeout_millis=2000)
    time.sleep(2.0)  # a is alive and still holds m0 after two lease periods
    with pytest.raises(Timeout):
        b.receive(timeout_millis=500)
    a.close()  # not acked: it goes to b now
    assert b.receive(timeout_millis=3000).data() == m.data()


def test_shared_negative_ack_goes_to_any_consumer(client):
    seed(client, TOPIC, 1)
    kw = {"consumer_type": ConsumerType.Shared, "initial_position": InitialPosition.Earliest,
          "negative_ack_redelivery_delay_ms": 0}
    a = client.subscribe(TOPIC, "sh", **kw)
    b = client.subscribe(TOPIC, "sh", **kw)
    m = a.receive(timeout_millis=2000)
    with pytest.raises(Timeout):
        b.receive(timeout_millis=300)  # a holds it
    a.negative_acknowledge(m)
    a.close()
    m2 = b.receive(timeout_millis=3000)
    assert m2.data() == b"m0" and m2.redelivery_count() == 1


# ---- redelivery ---------------------------------------------------------------------------------


def test_negative_ack_redelivers_after_the_delay(client):
    seed(client, TOPIC, 3)
    c = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest,
                         negative_ack_redelivery_delay_ms=600)
    got = drain(c, idle_ms=200)
    assert vals(got) == ["m0", "m1", "m2"]
    c.acknowledge(got[0])
    c.acknowledge(got[2])
    for count in (1, 2):
        c.negative_acknowledge(got[1])
        t0 = time.monotonic()
        with pytest.raises(Timeout):
            c.receive(timeout_millis=300)  # not before the delay
        m = c.receive(timeout_millis=3000)
        assert time.monotonic() - t0 >= 0.55
        assert m.data() == b"m1" and m.redelivery_count() == count
        got[1] = m
    c.acknowledge(got[1])
    assert drain(c, idle_ms=200) == []


def test_negative_ack_without_delay_counts_the_redelivery(client):
    seed(client, TOPIC, 1)
    c = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest, negative_ack_redelivery_delay_ms=0)
    for count in range(4):
        m = c.receive(timeout_millis=3000)
        assert m.data() == b"m0" and m.redelivery_count() == count
        c.negative_acknowledge(m)


def test_unacked_messages_timeout_redelivers(client):
    seed(client, TOPIC, 4)
    c = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest, unacked_messages_timeout_ms=500)
    got = drain(c, idle_ms=100)
    assert vals(got) == ["m0", "m1", "m2", "m3"]
    c.acknowledge(got[0])
    c.acknowledge(got[3])
    t0 = time.monotonic()
    again = sorted([c.receive(timeout_millis=3000) for _ in range(2)], key=lambda m: m.message_id())
    assert time.monotonic() - t0 >= 0.3
    assert vals(again) == ["m1", "m2"] and [m.redelivery_count() for m in again] == [1, 1]
    for m in again:
        c.acknowledge(m)
    assert drain(c, idle_ms=1000) == []  # acked in time: not redelivered


def test_redeliver_unacknowledged_messages(client):
    seed(client, TOPIC, 5)
    c = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest, receiver_queue_size=2)
    got = [c.receive(timeout_millis=2000) for _ in range(3)]
    c.acknowledge(got[1])
    c.redeliver_unacknowledged_messages()
    again = drain(c)
    assert sorted(vals(again)) == ["m0", "m2", "m3", "m4"]
    counts = {m.data().decode(): m.redelivery_count() for m in again}
    assert counts["m0"] == 1 and counts["m2"] == 1 and counts["m4"] == 0


# ---- seek, unsubscribe, initial position ---------------------------------------------------------


def test_seek(client):
    ids = seed(client, TOPIC, 10)
    c = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest)
    assert len(drain(c, ack=True)) == 10
    c.seek(MessageId.earliest)
    assert vals(drain(c)) == [f"m{i}" for i in range(10)]
    c.seek(ids[6])
    assert vals(drain(c, ack=True)) == ["m6", "m7", "m8", "m9"]
    c.seek(MessageId.latest)
    assert drain(c, idle_ms=200) == []
    seed(client, TOPIC, 2, prefix="n", create=False)
    assert vals(drain(c)) == ["n0", "n1"]


def test_unsubscribe_removes_the_state(root, client):
    seed(client, TOPIC, 6)
    c = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest)
    drain(c, ack=True)
    c.unsubscribe()
    assert not c.is_connected()
    with pytest.raises(SubscriptionNotFound, match="'s' does not exist"):  # not rows of state None
        client.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    c2 = Client(root).subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest)
    assert vals(drain(c2)) == [f"m{i}" for i in range(6)]  # starts over
    c2.close()


def test_initial_position(client):
    seed(client, TOPIC, 5)
    latest = client.subscribe(TOPIC, "late")  # Latest is the default
    earliest = client.subscribe(TOPIC, "early", initial_position=InitialPosition.Earliest)
    seed(client, TOPIC, 3, prefix="n", create=False)
    assert vals(drain(latest)) == ["n0", "n1", "n2"]
    assert vals(drain(earliest)) == [f"m{i}" for i in range(5)] + ["n0", "n1", "n2"]
    latest.close()
    # An existing subscription keeps its position whatever initial_position says.
    again = client.subscribe(TOPIC, "late", initial_position=InitialPosition.Earliest)
    assert vals(drain(again)) == ["n0", "n1", "n2"]


def test_markers_and_aborted_data_are_skipped_and_the_cursor_passes_them(client):
    client.admin.create_topic(TOPIC, partitions=2)
    c = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest)
    p = client.create_producer(TOPIC)
    expected = set()
    for i in range(6):
        txn = client.new_transaction()
        for j in range(3):
            p.send(f"t{i}-{j}".encode(), partition_key=f"k{j}", txn=txn)
        p.send(f"plain{i}".encode(), partition_key=f"k{i}")
        expected.add(f"plain{i}")
        if i % 2:
            txn.commit()
            expected |= {f"t{i}-{j}" for j in range(3)}
        else:
            txn.abort()
    got = drain(c, ack=True)
    assert sorted(vals(got)) == sorted(expected)
    assert not any(v.startswith(("t0-", "t2-", "t4-")) for v in vals(got))
    c.close()
    ends = [partition_end(client, part) for part in client.get_topic_partitions(TOPIC)]
    assert mark_delete(client, TOPIC, "s") == [e - 1 for e in ends]  # past every marker and aborted entry
    stats = client.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    assert all(s["pendingAckCount"] == 0 and s["individuallyAckedRanges"] == 0 for s in stats)


@pytest.mark.parametrize("ctype", [ConsumerType.Exclusive, ConsumerType.Failover])
def test_a_small_receiver_queue_passes_a_long_aborted_run_within_one_receive(client, ctype):
    """A fetch took as many offsets as the receiver queue holds, invisible ones included: with a
    queue of one, a fetch passed one aborted offset, and 3,000 of them took seconds of fetches, so
    receive() raised Timeout while a committed message was there to deliver. A fetch that finds
    nothing visible in its window now widens it (up to FETCH_MAX) before giving up the call."""
    client.admin.create_topic(TOPIC)
    p = client.create_producer(TOPIC, batching_max_messages=1000)
    txn = client.new_transaction()
    for _ in range(3000):
        p.send_async(b"aborted", None, txn=txn)
    p.flush()
    txn.abort()
    p.send(b"m0")
    p.send(b"m1")
    c = client.subscribe(TOPIC, "s", consumer_type=ctype, initial_position=InitialPosition.Earliest,
                         receiver_queue_size=1)
    got = [c.receive(timeout_millis=2000) for _ in range(2)]
    assert [m.data() for m in got] == [b"m0", b"m1"]
    for m in got:
        c.acknowledge(m)
    c.close()
    assert mark_delete(client, TOPIC, "s") == [got[1].message_id().offset()]  # the aborted run passed


def partition_end(client: Client, partition: str) -> int:
    from pulsartx.log.partition import PartitionLog
    from pulsartx.naming import TopicName

    return PartitionLog(client.root, TopicName.parse(partition)).end_offset()


def test_read_uncommitted_subscription_sees_open_transactions(client):
    client.admin.create_topic(TOPIC)
    rc = client.subscribe(TOPIC, "rc", initial_position=InitialPosition.Earliest)
    ru = client.subscribe(TOPIC, "ru", initial_position=InitialPosition.Earliest, isolation_level="READ_UNCOMMITTED")
    p = client.create_producer(TOPIC)
    txn = client.new_transaction()
    p.send(b"open", txn=txn)
    p.send(b"plain")
    assert vals(drain(ru, idle_ms=300)) == ["open", "plain"]
    assert drain(rc, idle_ms=300) == []  # the open transaction bounds maxReadPosition
    txn.commit()
    assert vals(drain(rc)) == ["open", "plain"]


@pytest.mark.parametrize("consumer_type", [ConsumerType.Exclusive, ConsumerType.Failover])
def test_a_subscribe_that_fails_after_taking_the_lease_releases_it(tmp_path, consumer_type):
    """Fails before the fix: the cursor write failed after the Exclusive lease was taken, the
    consumer was never returned, and the retried subscribe raised ConsumerBusy for lease_ms."""
    from pulsartx.storage import faults
    from pulsartx.storage.faults import Fault, Op

    with Client(str(tmp_path / "root")) as client:
        seed(client, TOPIC, 3)
        faults.install([Fault(Op.CREATE, match="/s1/partition-0/_delta_log", times=1_000)])
        try:
            with pytest.raises(pulsartx.exceptions.StorageError):
                client.subscribe(TOPIC, "s1", consumer_type=consumer_type,
                                 initial_position=InitialPosition.Earliest, lease_ms=60_000)
        finally:
            faults.clear()
        with client.subscribe(TOPIC, "s1", consumer_type=consumer_type, initial_position=InitialPosition.Earliest,
                              lease_ms=60_000) as consumer:
            assert [m.data() for m in drain(consumer, ack=True)] == [b"m0", b"m1", b"m2"]


@pytest.mark.parametrize("consumer_type", [ConsumerType.Exclusive, ConsumerType.Shared])
def test_threads_receiving_on_one_consumer_never_get_the_same_message(client, consumer_type):
    """pulsar-client's receive() may be called from several threads. Fails before the fix: two
    threads that found the queue empty at once both fetched the same offsets, which were not yet
    held, and both delivered them."""
    import threading

    seed(client, "threads", 600)
    consumer = client.subscribe("threads", "s", consumer_type=consumer_type, receiver_queue_size=5,
                                initial_position=InitialPosition.Earliest)
    got: list[list[str]] = [[] for _ in range(4)]

    def take(mine: list[str]) -> None:
        while True:
            try:
                msg = consumer.receive(timeout_millis=500)
            except Timeout:
                return
            mine.append(msg.data().decode())

    threads = [threading.Thread(target=take, args=(g,)) for g in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [v for g in got for v in g]
    assert sorted(everything) == sorted(names("m", range(600)))
    consumer.close()


@pytest.mark.parametrize("topics", [["a", "b"], ("a",), __import__("re").compile("a.*")])
def test_subscribe_to_many_topics_says_it_is_unsupported(tmp_path, topics):
    with Client(str(tmp_path / "root")) as client, \
            pytest.raises(InvalidTopicName, match="list of topics or a topic pattern is not supported"):
        client.subscribe(topics, "s")


def test_a_stalled_exclusive_owner_stops_delivering_once_its_lease_may_have_run_out(root, client, monkeypatch):
    """``a``'s renewal hangs past its lease; ``b`` (another process, as far as storage knows)
    subscribes once it ran out and delivers: ``a`` must not deliver what it had queued meanwhile."""
    seed(client, TOPIC, 20)
    a = client.subscribe(TOPIC, "excl", initial_position=InitialPosition.Earliest, lease_ms=1500,
                         receiver_queue_size=100)
    a.receive(timeout_millis=2000)  # the rest is queued
    stalled = stall_lease_renewals(a, monkeypatch)
    other = Client(root)
    deadline = time.monotonic() + 10
    while True:
        try:
            b = other.subscribe(TOPIC, "excl", initial_position=InitialPosition.Earliest, lease_ms=1500)
            break
        except ConsumerBusy:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    got_b = drain(b, idle_ms=300)
    try:
        late = vals(drain(a, idle_ms=300))
    finally:
        stalled.set()
    assert got_b and not set(late) & set(vals(got_b))  # never two consumers delivering the same messages
    a.close()
    b.close()
    other.close()


def test_close_whose_last_ack_flush_failed_lets_the_lease_run_out(root, client, monkeypatch, caplog):
    """Released, the lease let the next owner in at once, to redeliver what was acknowledged; left
    to run out, the next owner waits for it, as a hand-off whose acks did not land does."""
    import logging

    from pulsartx.exceptions import StorageError

    seed(client, TOPIC, 5)
    a = client.subscribe(TOPIC, "excl", initial_position=InitialPosition.Earliest, lease_ms=1500,
                         acknowledgment_group_time_ms=60_000)
    for m in drain(a, idle_ms=300):
        a.acknowledge(m)

    def down(fn):
        raise StorageError("store unavailable")

    monkeypatch.setattr(a._parts[0].store, "update", down)
    with caplog.at_level(logging.WARNING, logger="pulsartx.client.consumer"):
        a.close()
    monkeypatch.undo()
    assert any("not stored" in r.getMessage() and "runs out" in r.getMessage() for r in caplog.records)
    other = Client(root)  # another process, as far as storage knows
    with pytest.raises(ConsumerBusy):
        other.subscribe(TOPIC, "excl", lease_ms=1500)
    time.sleep(1.6)
    other.subscribe(TOPIC, "excl", lease_ms=1500).close()  # once it ran out
    other.close()


def test_a_shared_close_whose_last_ack_flush_failed_keeps_the_claims_on_what_it_acknowledged(root, client,
                                                                                           monkeypatch):
    """Shared: the claims on messages acknowledged but not stored stay until they expire, as an
    Exclusive lease does: released at close, another consumer received those messages again at
    once, while the write whose answer failed may still land. What was not acknowledged is given
    back at once."""
    from pulsartx.exceptions import StorageError

    seed(client, TOPIC, 4)
    a = client.subscribe(TOPIC, "sh", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest,
                         lease_ms=1500, acknowledgment_group_time_ms=60_000)
    got = [a.receive(5000) for _ in range(4)]
    for m in got[:2]:
        a.acknowledge(m)

    def down(fn):
        raise StorageError("store unavailable")

    monkeypatch.setattr(a._parts[0].store, "update", down)
    a.close()
    monkeypatch.undo()
    other = Client(root)
    b = other.subscribe(TOPIC, "sh", consumer_type=ConsumerType.Shared, lease_ms=1500)
    assert sorted(m.data() for m in drain(b, idle_ms=500)) == sorted(m.data() for m in got[2:])
    time.sleep(1.6)  # the claims ran out: the acknowledgements were lost with the failed write
    assert sorted(m.data() for m in drain(b, idle_ms=500)) == sorted(m.data() for m in got[:2])
    b.close()
    other.close()


def test_seek_waits_for_a_fetch_under_way_so_nothing_from_before_it_is_queued_after(client):
    """A fetch that read the cursor before a seek and queues after it must not put messages from
    before the seek position in the queue the seek cleared: the seek waits for it."""
    import threading

    seed(client, TOPIC, 10)
    c = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest, receiver_queue_size=100)
    paused, go, enqueue = threading.Event(), threading.Event(), c._enqueue

    def slow_enqueue(*args, **kw):  # between the fetch's read and its queueing
        if not paused.is_set():
            paused.set()
            go.wait(10)
        return enqueue(*args, **kw)

    c._enqueue = slow_enqueue
    def receive_one() -> None:  # whatever it gets, it gets before the seek returns, or after it
        try:
            c.receive(timeout_millis=1000)
        except Timeout:
            pass

    receiving = threading.Thread(target=receive_one)
    receiving.start()
    assert paused.wait(10)
    seeking = threading.Thread(target=c.seek, args=(MessageId.latest,))
    seeking.start()
    seeking.join(0.5)
    go.set()
    seeking.join(10)
    receiving.join(10)
    assert not seeking.is_alive() and not receiving.is_alive()
    seed(client, TOPIC, 3, prefix="n", create=False)
    assert vals(drain(c)) == ["n0", "n1", "n2"]  # nothing from before the seek position
    c.close()
