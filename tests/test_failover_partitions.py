"""Failover on a partitioned topic: an active consumer per partition, picked as Pulsar's broker does
(partition ``i`` to the consumer at ``i mod n`` of the live Failover consumers in name order), handed
off through each partition's lease when consumers come and go, with acknowledgements landed first.
A topic of one partition keeps one active consumer for the subscription, the first to come.
Real Delta tables under tmp_path, consumers in threads (tests/test_consumer_procs.py kills one).
"""
from __future__ import annotations

import time

import pytest
from _reads import drain, stall_lease_renewals

from pulsartx import Client, ConsumerType, InitialPosition, NotAllowedError, Timeout
from pulsartx.subscription.leases import failover_order

pytestmark = pytest.mark.timeout(120)
TOPIC = "persistent://public/default/fo"
LEASE_MS = 1500  # renewals, and so hand-offs, every half second


@pytest.fixture
def client(tmp_path):
    c = Client(str(tmp_path), num_coordinators=1)
    yield c
    c.close()


def send(client: Client, n: int, start: int = 0, topic: str = TOPIC) -> set[str]:
    p = client.create_producer(topic)
    for i in range(start, start + n):
        p.send(f"m{i}".encode(), partition_key=f"k{i}")
    p.close()
    return {f"m{i}" for i in range(start, start + n)}


def failover(client: Client, name: str, topic: str = TOPIC, **kw):
    return client.subscribe(topic, "fo", consumer_type=ConsumerType.Failover, consumer_name=name,
                            initial_position=InitialPosition.Earliest, lease_ms=LEASE_MS, **kw)


def active_on(consumer) -> set[int]:
    if not consumer._per_partition:  # one lease for the subscription
        return {p.index for p in consumer._parts} if consumer._active else set()
    return {p.index for p in consumer._parts if p.owned}


def settle(*expected: tuple[object, set[int]], timeout_s: float = 10.0) -> None:
    """Wait until each consumer is active on exactly its partitions."""
    deadline = time.monotonic() + timeout_s
    while any(active_on(c) != want for c, want in expected):
        assert time.monotonic() < deadline, [(c.consumer_name(), active_on(c), want) for c, want in expected]
        time.sleep(0.05)


def values(msgs) -> list[str]:
    return [m.data().decode() for m in msgs]


def partitions_of(msgs) -> set[int]:
    return {m.message_id().partition() for m in msgs}


def test_pulsars_order_is_by_consumer_name():
    ids = ["b-0000000a", "a-b-0000000c", "a-0000000f", "a-00000001"]
    assert failover_order(ids) == ["a-00000001", "a-0000000f", "a-b-0000000c", "b-0000000a"]


@pytest.mark.parametrize("names, owners", [
    (["b", "a"], {"a": {0, 2}, "b": {1, 3}}),
    (["c", "a", "b"], {"a": {0, 3}, "b": {1}, "c": {2}}),
])
def test_partitions_go_to_consumers_by_index_mod_count_in_name_order(client, names, owners):
    client.admin.create_topic(TOPIC, partitions=4)
    consumers = {n: failover(client, n) for n in names}
    settle(*[(consumers[n], owners[n]) for n in names])
    sent = send(client, 40)
    got = {n: drain(c, idle_ms=600, ack=True) for n, c in consumers.items()}
    for n in names:
        assert partitions_of(got[n]) <= owners[n]
    everything = [v for n in names for v in values(got[n])]
    assert sorted(everything) == sorted(sent)  # each once
    for c in consumers.values():
        c.close()


def test_a_closed_consumers_partitions_go_to_the_other_each_message_once(client):
    client.admin.create_topic(TOPIC, partitions=4)
    a, b = failover(client, "a"), failover(client, "b")
    settle((a, {0, 2}), (b, {1, 3}))
    sent = send(client, 40)
    acked_b = drain(b, idle_ms=600, ack=True)
    assert partitions_of(acked_b) == {1, 3}
    sent |= send(client, 20, start=40)
    held = [b.receive(timeout_millis=2000) for _ in range(3)]  # b's, unacknowledged
    b.close()
    settle((a, {0, 1, 2, 3}))
    acked_a = drain(a, idle_ms=800, ack=True)
    assert sorted(values(acked_a) + values(acked_b)) == sorted(sent)  # nothing lost, nothing twice
    assert set(values(held)) <= set(values(acked_a))  # received by b, never acknowledged: redelivered
    a.close()


def test_a_hand_back_lands_the_acknowledgements_first(client):
    """``a`` alone has every partition and acknowledges in groups that would land only seconds
    later; ``b`` comes, and the rule hands it partitions 1 and 3: what ``a`` acknowledged there
    lands before the lease moves, and what ``a`` had queued there is dropped, so ``b`` receives
    every other message of those partitions, and none that ``a`` acknowledged."""
    client.admin.create_topic(TOPIC, partitions=4)
    a = failover(client, "a", acknowledgment_group_time_ms=5000, receiver_queue_size=50)
    settle((a, {0, 1, 2, 3}))
    sent = send(client, 80)
    first = [a.receive(timeout_millis=2000) for _ in range(30)]
    a.acknowledge(first)
    assert partitions_of(first) == {0, 1, 2, 3}
    b = failover(client, "b")
    settle((a, {0, 2}), (b, {1, 3}))
    got_b = drain(b, idle_ms=600, ack=True)
    rest_a = drain(a, idle_ms=600, ack=True)
    assert partitions_of(got_b) == {1, 3} and partitions_of(rest_a) <= {0, 2}
    assert not set(values(first)) & set(values(got_b))
    assert sorted(values(first) + values(rest_a) + values(got_b)) == sorted(sent)
    b.close()
    a.close()


def test_a_consumer_that_comes_back_gets_its_partitions_back(client):
    client.admin.create_topic(TOPIC, partitions=4)
    a, b = failover(client, "a"), failover(client, "b")
    settle((a, {0, 2}), (b, {1, 3}))
    sent = send(client, 20)
    got = drain(a, idle_ms=600, ack=True) + drain(b, idle_ms=600, ack=True)
    b.close()
    settle((a, {0, 1, 2, 3}))
    sent |= send(client, 20, start=20)
    got += drain(a, idle_ms=600, ack=True)
    b = failover(client, "b")
    settle((a, {0, 2}), (b, {1, 3}))
    sent |= send(client, 20, start=40)
    late_a, late_b = drain(a, idle_ms=600, ack=True), drain(b, idle_ms=600, ack=True)
    assert partitions_of(late_a) <= {0, 2} and partitions_of(late_b) <= {1, 3}
    assert sorted(values(got + late_a + late_b)) == sorted(sent)
    a.close()
    b.close()


def test_a_topic_of_one_partition_keeps_the_first_consumer_active(client):
    """Unchanged: one active consumer for the subscription, the first to come, whatever the names."""
    client.admin.create_topic(TOPIC, partitions=1)
    b, a = failover(client, "b"), failover(client, "a")
    send(client, 5)
    assert values(drain(b, ack=True)) == [f"m{i}" for i in range(5)]
    with pytest.raises(Timeout):
        a.receive(timeout_millis=300)
    b.close()
    a.close()


@pytest.mark.parametrize("before", [1, 2])
def test_partitions_a_growth_adds_go_by_the_same_rule(client, before):
    client.admin.create_topic(TOPIC, partitions=before)
    a = failover(client, "a", auto_update_partitions_interval_ms=100)
    b = failover(client, "b", auto_update_partitions_interval_ms=100)
    settle((a, {0}), (b, set() if before == 1 else {1}))
    client.admin.update_partitioned_topic(TOPIC, 4)
    settle((a, {0, 2}), (b, {1, 3}))
    sent = send(client, 40)
    got_a, got_b = drain(a, idle_ms=600, ack=True), drain(b, idle_ms=600, ack=True)
    assert partitions_of(got_a) <= {0, 2} and partitions_of(got_b) <= {1, 3}
    assert sorted(values(got_a) + values(got_b)) == sorted(sent)
    a.close()
    b.close()


def test_delivery_from_a_partition_waits_for_its_lease_renewal(client, monkeypatch):
    """A consumer delivers a partition's messages only within its lease (a share of it, counted
    from the renewal's start): paused past it, it may no longer be the active consumer there."""
    client.admin.create_topic(TOPIC, partitions=2)
    a = failover(client, "a", receiver_queue_size=100)
    settle((a, {0, 1}))
    sent = send(client, 20)
    first = a.receive(timeout_millis=2000)
    a.acknowledge(first)
    stuck = first.message_id().partition()
    monkeypatch.setattr(a, "_reconcile", lambda: None)  # renewals stop
    with a._lock:
        next(p for p in a._parts if p.index == stuck).lease_until = 0.0
    got = drain(a, idle_ms=300, ack=True)
    assert stuck not in partitions_of(got)
    monkeypatch.undo()  # renewals again
    got += drain(a, idle_ms=1500, ack=True)
    assert sorted(values([first, *got])) == sorted(sent)
    a.close()


def test_deleting_the_subscription_sees_and_stops_its_failover_consumers(client):
    client.admin.create_topic(TOPIC, partitions=4)
    a, b = failover(client, "a"), failover(client, "b")
    settle((a, {0, 2}), (b, {1, 3}))
    with pytest.raises(NotAllowedError, match="2 live consumer"):
        client.admin.delete_subscription(TOPIC, "fo")
    client.admin.delete_subscription(TOPIC, "fo", force=True)
    send(client, 8)
    settle((a, set()), (b, set()))
    assert drain(a, idle_ms=300) == [] and drain(b, idle_ms=300) == []
    a.close()
    b.close()
    c = failover(client, "c")  # the subscription made again: its own leases, at once
    settle((c, {0, 1, 2, 3}), timeout_s=3.0)
    c.close()


def test_a_paused_owner_that_takes_its_lease_back_does_not_deliver_what_it_queued_before(client, monkeypatch):
    """``a`` fetched partition messages into its queue, then paused (renewals stop) past its leases;
    ``b`` took the partitions, received and acknowledged everything, and closed. ``a`` renewing
    then takes the leases again as if it had held them throughout: what it queued before the pause
    was another consumer's to deliver meanwhile, and went out a second time."""
    client.admin.create_topic(TOPIC, partitions=2)
    a = failover(client, "a", receiver_queue_size=100)
    settle((a, {0, 1}))
    sent = send(client, 20)
    first = a.receive(timeout_millis=2000)
    a.acknowledge(first)
    with a._lock:
        assert sum(len(p.queue) for p in a._parts) == 19  # both partitions fetched
    monkeypatch.setattr(a, "_reconcile", lambda: None)  # paused: no renewal
    with a._lock:
        for p in a._parts:
            p.lease_until = 0.0  # its own delivery window is over, as it is once the lease is
    b = failover(client, "b")
    settle((b, {0, 1}), timeout_s=10.0)  # a's leases and presence ran out
    got_b = drain(b, idle_ms=600, ack=True)
    b.close()
    assert sorted(values([first, *got_b])) == sorted(sent)
    monkeypatch.undo()  # a renews again
    settle((a, {0, 1}))
    deadline = time.monotonic() + 2.0
    while any(p.lease_until < time.monotonic() for p in a._parts) and time.monotonic() < deadline:
        time.sleep(0.05)
    again = drain(a, idle_ms=600, ack=True)
    assert values(again) == []  # b acknowledged every one of them
    a.close()


def test_a_stalled_single_lease_owner_stops_delivering_once_its_lease_may_have_run_out(client, monkeypatch):
    """One lease for the subscription (a topic of one partition): ``a``'s renewal hangs past its
    lease, ``b`` takes it and delivers; ``a`` must not deliver what it had queued meanwhile."""

    client.admin.create_topic(TOPIC, partitions=1)
    a = failover(client, "a", receiver_queue_size=100)
    send(client, 20)
    a.receive(timeout_millis=2000)  # the rest is queued
    stalled = stall_lease_renewals(a, monkeypatch)
    b = failover(client, "b")
    got_b = [b.receive(timeout_millis=5000)]  # once a's lease ran out
    got_b += drain(b, idle_ms=300)
    try:
        late = values(drain(a, idle_ms=300))
    finally:
        stalled.set()
    assert not set(late) & set(values(got_b))  # never two consumers delivering the same messages
    a.close()
    b.close()
