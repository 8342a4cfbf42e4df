"""Subscription administration (reset, skip, delete) racing live consumers and transactions.

Each test states the scenario and exactly what every consumer receives afterwards."""
from __future__ import annotations

import pytest

import pulsartx
from pulsartx import ConsumerType, InitialPosition, MessageId
from pulsartx.exceptions import PulsarException
from pulsartx.naming import TopicName
from pulsartx.storage import faults
from pulsartx.storage.faults import Fault, Op
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.store import SubscriptionStore

pytestmark = pytest.mark.usefixtures("no_faults")  # the fixture is in conftest.py


@pytest.fixture
def client(root: str):
    c = pulsartx.Client(root, num_coordinators=1)
    yield c
    c.close()


def send(client, topic: str, *values: str, txn=None) -> None:
    p = client.create_producer(topic)
    for v in values:
        p.send(v.encode(), txn=txn)
    p.close()


def vals(msgs) -> list[str]:
    return [m.data().decode() for m in msgs]


def drain(consumer, limit: int = 100) -> list[str]:
    """Everything the consumer receives until it has nothing more."""
    out = []
    for _ in range(limit):
        try:
            out.append(consumer.receive(400))
        except pulsartx.Timeout:
            break
    return vals(out)


def cursor(client, topic: str, partition: int, sub: str) -> CursorState:
    c = SubscriptionStore(client.root, TopicName.parse(topic).with_partition(partition), sub).cursor()
    assert c is not None
    return c


def subscribe(client, topic: str, sub: str, **kw):
    kw.setdefault("initial_position", InitialPosition.Earliest)
    kw.setdefault("acknowledgment_group_time_ms", 0)
    return client.subscribe(topic, sub, **kw)


# ---- delete and re-create while an old consumer object lives ---------------------------------------

def test_old_consumers_acks_do_not_land_in_a_recreated_subscription(client) -> None:
    """A consumer of a subscription deleted (force) and re-created with the same name acknowledges
    what it received from the old one: those acks are for the deleted subscription and must not
    acknowledge anything on the new one, whose consumer must receive every message."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", *[f"m{i}" for i in range(6)])
    old = subscribe(client, "t", "s", consumer_type=ConsumerType.Shared)
    got = [old.receive(5000) for _ in range(3)]
    assert vals(got) == ["m0", "m1", "m2"]
    client.admin.delete_subscription("t", "s", force=True)
    new = subscribe(client, "t", "s", consumer_type=ConsumerType.Shared)
    old.acknowledge(got)  # acknowledgment_group_time_ms=0: persisted now
    assert cursor(client, "t", 0, "s").mark_delete == -1
    assert drain(new) == [f"m{i}" for i in range(6)]
    new.close()
    old.close()


def test_old_consumers_cumulative_ack_does_not_land_in_a_recreated_subscription(client) -> None:
    """Same with a Failover old consumer (the new one waits as its standby): the grouped
    cumulative ack it made before the deletion is flushed, on close, after the re-creation."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", *[f"m{i}" for i in range(6)])
    old = subscribe(client, "t", "s", consumer_type=ConsumerType.Failover,
                    acknowledgment_group_time_ms=600_000)  # grouped: flushed on close
    got = [old.receive(5000) for _ in range(4)]
    old.acknowledge_cumulative(got[-1])  # not persisted yet
    client.admin.delete_subscription("t", "s", force=True)
    new = subscribe(client, "t", "s", consumer_type=ConsumerType.Failover)
    old.close()  # flushes the old subscription's cumulative ack
    assert cursor(client, "t", 0, "s").mark_delete == -1
    assert drain(new) == [f"m{i}" for i in range(6)]
    new.close()


def test_old_consumer_does_not_receive_from_a_recreated_subscription(client) -> None:
    """The deleted subscription's consumer "stops receiving (its cursor is gone) until it is
    closed" (delete_subscription): a re-created subscription of the same name is not its own."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", "m0", "m1")
    old = subscribe(client, "t", "s", consumer_type=ConsumerType.Shared, receiver_queue_size=1)
    assert vals([old.receive(5000)]) == ["m0"]
    client.admin.delete_subscription("t", "s", force=True)
    new = subscribe(client, "t", "s", consumer_type=ConsumerType.Shared)
    send(client, "t", "m2")
    assert drain(new) == ["m0", "m1", "m2"]
    new.close()  # its claims released: nothing stops the old consumer but the subscription's identity
    assert drain(old) == []
    old.close()


def test_old_consumers_txn_ack_does_not_land_in_a_recreated_subscription(client) -> None:
    """A transactional ack by the deleted subscription's consumer, made after the re-creation and
    committed, must not acknowledge the new subscription's messages: it fails (the subscription it
    received them from is gone) and the new consumer receives everything."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", *[f"m{i}" for i in range(4)])
    old = subscribe(client, "t", "s", consumer_type=ConsumerType.Shared)
    got = [old.receive(5000) for _ in range(2)]
    client.admin.delete_subscription("t", "s", force=True)
    new = subscribe(client, "t", "s", consumer_type=ConsumerType.Shared)
    txn = client.new_transaction()
    with pytest.raises(PulsarException, match="deleted"):
        old.acknowledge(got, txn=txn)
    txn.abort()
    client.flush()
    c = cursor(client, "t", 0, "s")
    assert c.mark_delete == -1 and not c.pending and c.redelivery == {}
    assert drain(new) == [f"m{i}" for i in range(4)]
    new.close()
    old.close()


# ---- partitioned topics: one partition's write fails ------------------------------------------------

def test_skip_failing_on_one_partition_says_which_partitions_moved(client) -> None:
    """skip on a partitioned topic whose write fails on partition 1 after partition 0 moved: a
    retry of the same call skips n more on partition 0. The error must name the partitions already
    skipped, so an operator does not skip twice there unknowingly."""
    client.admin.create_topic("t", partitions=2)
    send(client, "t-partition-0", "a0", "a1", "a2", "a3")
    send(client, "t-partition-1", "b0", "b1", "b2", "b3")
    subscribe(client, "t", "s").close()
    faults.install([Fault(Op.CREATE, match="subscriptions/public/default/t/s/partition-1/_delta_log", times=50)])
    with pytest.raises(PulsarException) as e:
        client.admin.skip_messages("t", "s", 1)
    faults.clear()
    assert cursor(client, "t", 0, "s").mark_delete == 0 and cursor(client, "t", 1, "s").mark_delete == -1
    assert "applied on persistent://public/default/t-partition-0 only; failed on " \
        "persistent://public/default/t-partition-1" in str(e.value)
    assert client.admin.skip_messages("t-partition-1", "s", 1)[0]["skipped"] == 1  # the retry the error names
    with subscribe(client, "t", "s") as c:
        assert sorted(drain(c)) == ["a1", "a2", "a3", "b1", "b2", "b3"]


def test_old_consumers_unsubscribe_and_seek_leave_a_recreated_subscription_alone(client) -> None:
    """unsubscribe() or seek() on a consumer whose subscription was deleted and re-created must not
    delete or move the new subscription (whose consumer then still receives everything once)."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", "m0", "m1", "m2")
    old = subscribe(client, "t", "s", consumer_type=ConsumerType.Shared)
    assert vals([old.receive(5000)]) == ["m0"]
    client.admin.delete_subscription("t", "s", force=True)
    new = subscribe(client, "t", "s", consumer_type=ConsumerType.Shared)
    assert vals([new.receive(5000)]) == ["m0"]
    new.acknowledge(MessageId(0, 0))
    with pytest.raises(pulsartx.NotAllowedError, match="'s' .* was deleted"):
        old.seek(MessageId.latest)
    old.unsubscribe()
    assert client.admin.list_subscriptions("t") == ["s"]
    assert cursor(client, "t", 0, "s").mark_delete == 0
    assert drain(new) == ["m1", "m2"]
    new.close()


# ---- reset racing transactions ----------------------------------------------------------------------

def test_reset_into_an_open_transaction_then_commit_or_abort(client) -> None:
    """A reset to an offset inside a transaction still open: nothing from it on is delivered until
    it is decided; then exactly its messages from that offset on (commit) or none (abort)."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", "a0", "a1")
    t1 = client.new_transaction(timeout_ms=600_000)
    send(client, "t", "x2", "x3", "x4", txn=t1)  # offsets 2..4
    send(client, "t", "b5")
    c = subscribe(client, "t", "s")
    assert drain(c) == ["a0", "a1"]
    c.acknowledge_cumulative(MessageId(0, 1))
    client.admin.reset_subscription("t", "s", message_id=MessageId(0, 3))
    assert drain(c) == []
    t1.commit()
    assert drain(c) == ["x3", "x4", "b5"]
    c.close()



# ---- a consumer's grouped acknowledgements crossing an admin reset -----------------------------------

def test_a_cumulative_ack_grouped_before_a_reset_does_not_undo_it(client) -> None:
    """The operator resets to earliest to replay; the live consumer's cumulative ack, made before the
    reset but grouped (persisted on close), must not move the cursor back past the replay."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", *[f"m{i}" for i in range(4)])
    c = subscribe(client, "t", "s", acknowledgment_group_time_ms=600_000)
    got = [c.receive(5000) for _ in range(4)]
    c.acknowledge_cumulative(got[-1])  # grouped: not persisted yet
    client.admin.reset_subscription("t", "s", message_id=MessageId.earliest)
    c.close()  # persists the grouped ack
    with subscribe(client, "t", "s") as again:
        assert drain(again) == ["m0", "m1", "m2", "m3"]


def test_a_negative_ack_grouped_before_a_reset_leaves_no_redelivery_count(client) -> None:
    """"seek and a cursor reset clear the counts" (docs/semantics.md): a negative ack's count bump
    made before the reset, persisted after it, must not survive in the reset cursor."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", "m0", "m1")
    c = subscribe(client, "t", "s", acknowledgment_group_time_ms=600_000, negative_ack_redelivery_delay_ms=0)
    c.negative_acknowledge(c.receive(5000))  # its count bump is grouped
    client.admin.reset_subscription("t", "s", message_id=MessageId.earliest)
    c.close()
    assert cursor(client, "t", 0, "s").redelivery == {}
    with subscribe(client, "t", "s") as again:
        got = [again.receive(5000) for _ in range(2)]
        assert [(m.data(), m.redelivery_count()) for m in got] == [(b"m0", 0), (b"m1", 0)]


def test_individual_acks_grouped_before_a_reset_do_not_undo_it(client) -> None:
    """Same with individual acks on a Shared subscription: persisted after the reset, they would
    acknowledge the replayed messages, which no consumer would then receive."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", *[f"m{i}" for i in range(4)])
    c = subscribe(client, "t", "s", consumer_type=ConsumerType.Shared, acknowledgment_group_time_ms=600_000)
    c.acknowledge([c.receive(5000) for _ in range(4)])  # grouped: not persisted yet
    client.admin.reset_subscription("t", "s", message_id=MessageId.earliest)
    c.close()
    assert cursor(client, "t", 0, "s").acked.ranges() == []
    with subscribe(client, "t", "s", consumer_type=ConsumerType.Shared) as again:
        assert drain(again) == ["m0", "m1", "m2", "m3"]


def test_acks_after_the_consumer_saw_the_reset_are_kept(client) -> None:
    """The live consumer receives the replay after the reset (its fetch reads the new cursor): what
    it acknowledges from then on lands, grouped or not, and what it grouped before does not."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", *[f"m{i}" for i in range(4)])
    c = subscribe(client, "t", "s", acknowledgment_group_time_ms=600_000)
    got = [c.receive(5000) for _ in range(4)]
    c.acknowledge_cumulative(got[-1])
    client.admin.reset_subscription("t", "s", message_id=MessageId(0, 1))
    again = [c.receive(5000) for _ in range(3)]
    assert vals(again) == ["m1", "m2", "m3"]
    c.acknowledge_cumulative(again[0])
    c.close()
    assert cursor(client, "t", 0, "s").mark_delete == 1
    with subscribe(client, "t", "s") as later:
        assert drain(later) == ["m2", "m3"]


def test_a_consumers_seek_drops_acks_grouped_while_it_resets(client, monkeypatch) -> None:
    """seek() persists what its consumer grouped, then resets; a cumulative ack another thread
    groups in between is for the position the seek replaces: persisted after it (on close), it
    would undo the seek."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", *[f"m{i}" for i in range(4)])
    c = subscribe(client, "t", "s", acknowledgment_group_time_ms=600_000)
    got = [c.receive(5000) for _ in range(4)]
    c.acknowledge_cumulative(got[1])  # grouped before the seek: persisted by it, then reset
    flush = c._flush_acks

    def flush_then_ack() -> None:
        flush()
        c.acknowledge_cumulative(got[-1])  # another thread's, between the seek's flush and its reset

    monkeypatch.setattr(c, "_flush_acks", flush_then_ack)
    c.seek(MessageId.earliest)
    monkeypatch.undo()
    assert drain(c) == ["m0", "m1", "m2", "m3"]
    c.close()
    assert cursor(client, "t", 0, "s").mark_delete == -1


def test_a_cursor_written_without_its_reset_epoch_keeps_the_consumers_acks(client) -> None:
    """A process of a version that does not record the reset epoch drops the field (epoch 0) when it
    writes the cursor: a consumer that saw a later epoch keeps acknowledging (a lower epoch is not
    taken for a reset)."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", "m0", "m1", "m2")
    c = subscribe(client, "t", "s")
    client.admin.reset_subscription("t", "s", message_id=MessageId.earliest)
    assert vals([c.receive(5000)]) == ["m0"]  # the consumer sees epoch 1
    store = SubscriptionStore(client.root, TopicName.parse("t").with_partition(0), "s")
    store.update(lambda cur: setattr(cur, "reset_epoch", 0))  # what an older writer leaves
    assert store.cursor().reset_epoch == 0
    c.acknowledge(c.receive(5000))  # m1, persisted now
    assert cursor(client, "t", 0, "s").acked.ranges() == [(1, 1)]
    c.close()
    with subscribe(client, "t", "s") as again:
        assert drain(again) == ["m0", "m2"]


# ---- Shared claims across a reset -------------------------------------------------------------------

def test_reset_replays_to_another_shared_consumer_while_the_first_is_idle(client) -> None:
    """Shared: consumer A received and acknowledged everything; the operator resets to earliest to
    replay. A, alive but not receiving, still claims the offsets it had (and renews them): the
    replay must reach consumer B, not wait for A."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", "m0", "m1", "m2")
    a = subscribe(client, "t", "s", consumer_type=ConsumerType.Shared)
    a.acknowledge([a.receive(5000) for _ in range(3)])
    assert cursor(client, "t", 0, "s").mark_delete == 2
    client.admin.reset_subscription("t", "s", message_id=MessageId.earliest)
    b = subscribe(client, "t", "s", consumer_type=ConsumerType.Shared)
    assert drain(b) == ["m0", "m1", "m2"]
    b.close()
    a.close()


# ---- bad positions --------------------------------------------------------------------------------

def test_reset_to_a_partition_a_one_partition_topic_lacks_is_refused(client) -> None:
    """MessageId(7, 0) on a one-partition topic is a typo (its messages say partition 0): refused,
    naming the partition, with the cursor unchanged; Pulsar's -1 of a non-partitioned topic is
    its one partition."""
    client.admin.create_topic("one", partitions=1)
    send(client, "one", "m0", "m1", "m2")
    with subscribe(client, "one", "s") as c:
        assert drain(c) == ["m0", "m1", "m2"]
        c.acknowledge_cumulative(MessageId(0, 2))
    with pytest.raises(pulsartx.InvalidConfiguration, match=r"to \(7,1\): partition 7 does not exist: "
                                                            r"persistent://public/default/one has partitions 0..0"):
        client.admin.reset_subscription("one", "s", message_id=MessageId(7, 1))
    assert cursor(client, "one", 0, "s").mark_delete == 2
    assert client.admin.reset_subscription("one", "s", message_id=MessageId(-1, 1))[0]["position"] == 1
    with subscribe(client, "one", "s") as c:
        assert drain(c) == ["m1", "m2"]


def test_a_cursor_written_without_its_incarnation_stays_the_consumers_own(client) -> None:
    """A process of a version that does not record incarnations drops the field when it writes the
    cursor: the live consumers of the subscription keep receiving and acknowledging."""
    client.admin.create_topic("t", partitions=1)
    send(client, "t", "m0", "m1")
    c = subscribe(client, "t", "s")
    assert vals([c.receive(5000)]) == ["m0"]
    store = SubscriptionStore(client.root, TopicName.parse("t").with_partition(0), "s")
    store.update(lambda cur: setattr(cur, "incarnation", ""))  # what an older writer leaves
    assert store.cursor().incarnation == ""
    c.acknowledge(c.receive(5000))
    send(client, "t", "m2")
    assert drain(c) == ["m2"]
    c.close()
    assert drain(subscribe(client, "t", "s")) == ["m0", "m2"]  # m1 was acknowledged, the others never
