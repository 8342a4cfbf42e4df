"""Dead-letter policy, as pulsar-client's: durable redelivery counts, the move to the dead-letter
topic after max_redeliver_count redeliveries (negative acks or ack timeouts), its default name, its
initial subscription, and the acknowledgement on the source. Real Delta tables, public API."""
from __future__ import annotations

import time

import pytest

from pulsartx import (
    Client,
    ConsumerDeadLetterPolicy,
    ConsumerType,
    InitialPosition,
    InvalidConfiguration,
    MessageId,
    Timeout,
    TopicNotFound,
)
from pulsartx.exceptions import InvalidTopicName

pytestmark = pytest.mark.timeout(120)
DLQ = "persistent://public/default/src-sub-DLQ"


@pytest.fixture
def client(tmp_path):
    c = Client(str(tmp_path), num_coordinators=1)
    yield c
    c.close()


def _seed(client, n: int, partitions: int = 1) -> None:
    client.admin.create_topic("src", partitions=partitions)
    p = client.create_producer("src")
    for i in range(n):
        p.send(f"m{i}".encode(), partition_key=f"k{i}", properties={"i": str(i)})
    p.close()


def _read_all(client, topic: str) -> list:
    r = client.create_reader(topic, MessageId.earliest)
    out = []
    while True:
        try:
            out.append(r.read_next(timeout_millis=300))
        except Timeout:
            r.close()
            return out


def _nothing_left(client, subscription: str = "sub") -> bool:
    c = client.subscribe("src", subscription)
    try:
        c.receive(timeout_millis=300)
        return False
    except Timeout:
        return True
    finally:
        c.close()


def test_policy_checks_its_arguments():
    assert ConsumerDeadLetterPolicy(3).dead_letter_topic is None
    with pytest.raises(InvalidConfiguration, match="max_redeliver_count"):
        ConsumerDeadLetterPolicy(0)
    with pytest.raises(InvalidConfiguration, match="max_redeliver_count"):
        ConsumerDeadLetterPolicy("3")
    with pytest.raises(InvalidTopicName):
        ConsumerDeadLetterPolicy(1, dead_letter_topic="a/b")


def test_subscribe_refuses_what_is_not_a_policy(client):
    client.admin.create_topic("src")
    with pytest.raises(InvalidConfiguration, match="ConsumerDeadLetterPolicy"):
        client.subscribe("src", "sub", dead_letter_policy={"max_redeliver_count": 1})


def test_nacked_message_moves_after_max_redeliveries_counted_across_restarts(client):
    _seed(client, 4, partitions=2)
    policy = ConsumerDeadLetterPolicy(max_redeliver_count=2, initial_subscription_name="dlq-sub")
    seen: list[int] = []
    for _ in range(3):  # one delivery per consumer: the count lives with the subscription, not the consumer
        c = client.subscribe("src", "sub", initial_position=InitialPosition.Earliest,
                             negative_ack_redelivery_delay_ms=0, dead_letter_policy=policy)
        while True:
            m = c.receive(timeout_millis=3000)
            if m.data() == b"m1":
                break
            c.acknowledge(m)
        seen.append(m.redelivery_count())
        c.negative_acknowledge(m)
        c.close()
    assert seen == [0, 1, 2]  # max_redeliver_count + 1 deliveries, as Pulsar
    # The next consumer finds it past the limit: moved, not delivered.
    c = client.subscribe("src", "sub", dead_letter_policy=policy)
    while True:  # what the earlier consumers had fetched past m1 and not acknowledged
        try:
            m = c.receive(timeout_millis=500)
        except Timeout:
            break
        assert m.data() != b"m1"
        c.acknowledge(m)
    c.close()
    assert _nothing_left(client)
    [dead] = _read_all(client, DLQ)
    assert dead.data() == b"m1"
    assert dead.partition_key() == "k1"
    props = dead.properties()
    assert props["i"] == "1"
    assert props["REAL_TOPIC"].startswith("persistent://public/default/src-partition-")
    assert props["ORIGIN_MESSAGE_ID"].startswith("(")  # the source MessageId, as printed
    # The initial subscription was made before the first dead letter, so it sees it.
    d = client.subscribe(DLQ, "dlq-sub")
    assert d.receive(timeout_millis=2000).data() == b"m1"
    d.close()


def test_ack_timeouts_count_too_and_a_named_topic_is_used(client):
    _seed(client, 2)
    policy = ConsumerDeadLetterPolicy(max_redeliver_count=1, dead_letter_topic="poison")
    c = client.subscribe("src", "sub", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest,
                         unacked_messages_timeout_ms=200, dead_letter_policy=policy)
    counts: dict[bytes, list[int]] = {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            m = c.receive(timeout_millis=800)
        except Timeout:
            break
        counts.setdefault(m.data(), []).append(m.redelivery_count())
        if m.data() == b"m0":
            c.acknowledge(m)
    assert counts == {b"m0": [0], b"m1": [0, 1]}
    c.close()
    assert [m.data() for m in _read_all(client, "poison")] == [b"m1"]
    assert _nothing_left(client)


def test_without_a_policy_redelivery_is_unlimited(client):
    _seed(client, 1)
    c = client.subscribe("src", "sub", initial_position=InitialPosition.Earliest, negative_ack_redelivery_delay_ms=0)
    for n in range(4):
        m = c.receive(timeout_millis=3000)
        assert m.redelivery_count() == n
        c.negative_acknowledge(m)
    c.close()
    with pytest.raises(TopicNotFound):  # and no dead-letter topic was made
        client.admin.get_partitions(DLQ)


def test_a_move_leaves_the_open_transaction_of_a_keyed_client_alone(tmp_path):
    """One active transaction per transaction key: the move's own transaction must not fence it."""
    client = Client(str(tmp_path), num_coordinators=1, transaction_key="app")
    try:
        _seed(client, 2)
        out = client.create_producer("out")
        txn = client.new_transaction()
        out.send(b"result", txn=txn)
        c = client.subscribe("src", "sub", initial_position=InitialPosition.Earliest,
                             negative_ack_redelivery_delay_ms=0,
                             dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=1))
        while True:
            try:
                m = c.receive(timeout_millis=800)
            except Timeout:
                break
            if m.data() == b"m1":
                c.negative_acknowledge(m)
            else:
                c.acknowledge(m, txn=txn)
        txn.commit()
        assert [m.data() for m in _read_all(client, DLQ)] == [b"m1"]
        assert [m.data() for m in _read_all(client, "out")] == [b"result"]
        c.close()
        client.flush()
        assert _nothing_left(client)
    finally:
        client.close()
