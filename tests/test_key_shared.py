"""Key_Shared: sticky-key hashes, Pulsar's auto-split hash ranges, each key with one consumer at a
time, the hand-over of a leaving consumer's keys after its unacknowledged messages, and
transactional acknowledgements as on Shared."""
from __future__ import annotations

import time

import pytest

from pulsartx import ConsumerType, InitialPosition, NotAllowedError, Timeout
from pulsartx.exceptions import InvalidConfiguration, TransactionConflict
from pulsartx.subscription.key_shared import HashRanges, murmur3_32, sticky_key_hash

TOPIC = "persistent://public/default/ks"
KEYS = [f"k{i}" for i in range(6)]  # hashes: k0,k1,k2,k4 below 32768, k3,k5 above


def test_murmur3_matches_the_reference_vectors():
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"hello") == 0x248BFA47
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    assert sticky_key_hash("hello") == 0x248BFA47 & 0xFFFF
    assert sticky_key_hash(None) == murmur3_32(b"NONE_KEY") & 0xFFFF


def test_auto_split_ranges_as_pulsar():
    r = HashRanges()
    r.add("a")
    assert r.ranges_of("a") == [(0, 65535)]
    r.add("b")  # the newcomer takes the lower half of the biggest range
    assert r.ranges_of("b") == [(0, 32767)] and r.ranges_of("a") == [(32768, 65535)]
    r.add("c")
    assert r.ranges_of("c") == [(0, 16383)] and r.ranges_of("b") == [(16384, 32767)]
    r.remove("c")  # to the range above
    assert r.ranges_of("b") == [(0, 32767)]
    r.remove("a")  # the top range: to the one below
    assert r.ranges_of("b") == [(0, 65535)] and r.owner(65535) == "b"


def _seed(client, per_key: int = 5) -> None:
    client.admin.create_topic(TOPIC)
    p = client.create_producer(TOPIC)
    for i in range(per_key):
        for k in KEYS:
            p.send_async(f"{k}:{i}".encode(), None, partition_key=k)
    p.flush()


def _sub(client, **kw):
    return client.subscribe(TOPIC, "ks", consumer_type=ConsumerType.KeyShared,
                            initial_position=InitialPosition.Earliest, **kw)


def _drain(c, timeout_ms: int = 400, ack: bool = True) -> list:
    out = []
    while True:
        try:
            m = c.receive(timeout_millis=timeout_ms)
        except Timeout:
            return out
        if ack:
            c.acknowledge(m)
        out.append(m)


def test_keys_spread_by_hash_range_and_stay_in_order(client):
    _seed(client)
    a, b = _sub(client), _sub(client)
    time.sleep(0.6)  # a's next fetch sees b's split
    got_a, got_b = _drain(a), _drain(b)
    keys_a = {m.partition_key() for m in got_a}
    keys_b = {m.partition_key() for m in got_b}
    assert keys_a == {"k3", "k5"} and keys_b == {"k0", "k1", "k2", "k4"}
    for got in (got_a, got_b):
        for k in {m.partition_key() for m in got}:
            assert [m.data().decode() for m in got if m.partition_key() == k] == [f"{k}:{i}" for i in range(5)]
    a.close()
    b.close()


def test_a_leaving_consumer_hands_on_its_keys_after_its_unacked_messages(client):
    _seed(client)
    b = _sub(client)
    a = _sub(client)  # a takes 0..32767: k0, k1, k2, k4
    held = [a.receive(timeout_millis=5000) for _ in range(3)]  # received, never acknowledged
    assert {m.partition_key() for m in held} <= {"k0", "k1", "k2", "k4"}
    time.sleep(0.6)
    got_b = _drain(b, timeout_ms=300)
    assert {m.partition_key() for m in got_b} == {"k3", "k5"}
    a.close()  # its held messages return to the backlog, then its range goes to b
    rest = _drain(b, timeout_ms=1500)
    for k in ("k0", "k1", "k2", "k4"):
        assert [m.data().decode() for m in rest if m.partition_key() == k] == [f"{k}:{i}" for i in range(5)]
    assert {m.data().decode() for m in held} <= {m.data().decode() for m in rest}
    assert all(m.redelivery_count() == 0 for m in rest)
    b.close()


def test_a_key_in_flight_with_one_consumer_is_not_given_to_another(client):
    """b's ranges cover a key that a still holds (a stale view, or a hand-over in progress): b must
    wait until a acknowledges it, then gets the rest of the key in order."""
    _seed(client, per_key=3)
    a = _sub(client)
    first = a.receive(timeout_millis=5000)
    key = first.partition_key()
    b = _sub(client)
    a._key_shared.leave()  # a keeps its claims: b now owns every key
    got_b = _drain(b, timeout_ms=300)
    assert key not in {m.partition_key() for m in got_b}
    a.acknowledge(first)
    a._flush_acks()
    a._release_claims(all_held=True)
    more = _drain(b, timeout_ms=600)
    assert [m.data().decode() for m in more if m.partition_key() == key] == [f"{key}:{i}" for i in (1, 2)]
    a.close()
    b.close()


def test_transactional_acks_pending_acks_and_conflicts_as_on_shared(client):
    _seed(client, per_key=2)
    c = _sub(client)
    msgs = _drain(c, ack=False)
    assert len(msgs) == 12
    t1 = client.new_transaction()
    c.acknowledge(msgs[0], txn=t1)
    t2 = client.new_transaction()
    with pytest.raises(TransactionConflict):
        c.acknowledge(msgs[0], txn=t2)
    t2.abort()
    [st] = client.admin.transactions.get_pending_ack_stats(TOPIC, "ks")
    assert st["pendingAckCount"] == 1
    t1.abort()  # the message comes back, before the later ones of its key
    c.redeliver_unacknowledged_messages()
    again = _drain(c, ack=False, timeout_ms=600)
    key = msgs[0].partition_key()
    assert [m.data().decode() for m in again if m.partition_key() == key] == [f"{key}:0", f"{key}:1"]
    t3 = client.new_transaction()
    c.acknowledge(again, txn=t3)
    t3.commit()
    c.close()
    deadline = time.monotonic() + 10  # a commit's acknowledgements land on the subscription just after it
    while True:
        [st] = client.admin.transactions.get_pending_ack_stats(TOPIC, "ks")
        if st["markDeletePosition"] == 11 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert st["markDeletePosition"] == 11 and st["pendingAckCount"] == 0


def test_cumulative_ack_and_other_types_refused(client):
    _seed(client, per_key=1)
    c = _sub(client)
    m = c.receive(timeout_millis=5000)
    with pytest.raises(NotAllowedError, match="KeyShared"):
        c.acknowledge_cumulative(m)
    with pytest.raises(InvalidConfiguration, match="KeyShared"):
        client.subscribe(TOPIC, "ks", consumer_type=ConsumerType.Shared)
    c.close()


def test_messages_of_a_partitioned_topic_carry_their_partitions_name(client):
    """As on every other subscription type (pulsar-client's ``topic_name()``)."""
    client.admin.create_topic("ksp", 2)
    p = client.create_producer("ksp")
    for i in range(6):
        p.send(b"x", partition_key=f"k{i}")
    c = client.subscribe("ksp", "s", consumer_type=ConsumerType.KeyShared, initial_position=InitialPosition.Earliest)
    got = _drain(c)
    assert len(got) == 6
    assert all(m.topic_name() == f"persistent://public/default/ksp-partition-{m.message_id().partition()}"
               for m in got)
    c.close()
