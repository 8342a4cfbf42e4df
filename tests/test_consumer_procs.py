"""Consumers in real, separate processes: Shared distribution, Failover takeover after kill -9,
a Shared consumer's claims expiring after kill -9, and PENDING_ACK across consumer restarts.

Children are fresh interpreters started with subprocess (deltalake must never run in a forked
child, docs/design/deltalake-in-processes.md); this file is also the child's script. They speak ``_procs``'s protocol
(``@@EVENT``/``@@RESULT`` lines, then ``os._exit(0)``), so they are judged by what they printed and
by what is in storage, never by exit codes.
"""
from __future__ import annotations

import json
import os
import queue
import time
from typing import Any

import pytest
from _procs import Child, emit, hang, main

pytestmark = pytest.mark.timeout(240)
HERE = os.path.abspath(__file__)
TOPIC = "persistent://public/default/in"


class Proc(Child):
    """A child running ``command(**args)`` from this file's :data:`COMMANDS`."""

    script = HERE

    def all_events(self, name: str) -> list[Any]:
        """Every ``@@EVENT name`` the child printed (call once it is dead: reads to EOF)."""
        self._reader.join(30)
        while True:
            try:
                line = self._q.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return [json.loads(line.split(" ", 2)[2]) for line in self.lines if line.startswith(f"@@EVENT {name} ")]


def seed(root: str, topic: str, n: int, partitions: int = 1, keyed: bool = False) -> list[str]:
    """``keyed``: each message with its own key, so that they spread over the partitions."""
    import pulsartx

    c = pulsartx.Client(root)
    c.admin.create_topic(topic, partitions=partitions)
    p = c.create_producer(topic)
    for i in range(n):
        p.send_async(f"m{i}".encode(), None, partition_key=f"k{i}" if keyed else None)
    p.flush()
    c.close()
    return [f"m{i}" for i in range(n)]


def _go(tmp_path) -> str:
    return str(tmp_path / "go")


# ================================ tests ===========================================================


def test_shared_distribution_across_two_processes(root, tmp_path):
    expected = seed(root, TOPIC, 300, partitions=2)
    go = _go(tmp_path)
    args = {"root": root, "topic": TOPIC, "sub": "shared", "type": "Shared", "go_file": go, "queue": 10,
            "delay_ms": 2, "first_timeout_ms": 10_000, "idle_ms": 2500, "group_ms": 100}
    a, b = Proc("consume", **args), Proc("consume", **args)
    a.wait_event("subscribed")
    b.wait_event("subscribed")
    open(go, "w").close()
    ra, rb = a.result(), b.result()
    got_a, got_b = ra["acked"], rb["acked"]
    assert len(got_a) == len(set(got_a)) and len(got_b) == len(set(got_b))
    assert not set(got_a) & set(got_b)  # never processed twice
    assert set(got_a) | set(got_b) == set(expected)  # nothing lost
    assert ra["max_redelivery"] == 0 and rb["max_redelivery"] == 0  # no redelivery happened
    assert got_a and got_b  # both took part
    _assert_at_end(root, TOPIC, "shared", 300)


def test_shared_consumers_in_two_processes_follow_a_growth(root, tmp_path):
    """Both processes subscribed before the topic grew from 2 to 4 partitions; the messages a
    producer then spreads over all 4 are each processed once, and the subscription ends at the end
    of every partition, the new ones included."""
    import pulsartx

    seed(root, TOPIC, 0, partitions=2)
    go = _go(tmp_path)
    args = {"root": root, "topic": TOPIC, "sub": "grow", "type": "Shared", "go_file": go, "queue": 10,
            "first_timeout_ms": 10_000, "idle_ms": 2500, "update_ms": 100}
    a, b = Proc("consume", **args), Proc("consume", **args)
    a.wait_event("subscribed")
    b.wait_event("subscribed")
    c = pulsartx.Client(root)
    c.admin.update_partitioned_topic(TOPIC, 4)
    p = c.create_producer(TOPIC)
    for i in range(200):
        p.send_async(f"g{i}".encode(), None)
    p.flush()
    c.close()
    open(go, "w").close()
    got_a, got_b = a.result()["acked"], b.result()["acked"]
    assert len(got_a) + len(got_b) == 200
    assert set(got_a) | set(got_b) == {f"g{i}" for i in range(200)}
    _assert_at_end(root, TOPIC, "grow", 200)
    with pulsartx.Client(root) as c:
        assert len(c.admin.transactions.get_pending_ack_stats(TOPIC, "grow")) == 4


def test_failover_standby_takes_over_after_kill_9(root, tmp_path):
    expected = seed(root, TOPIC, 200)
    go = _go(tmp_path)
    common = {"root": root, "topic": TOPIC, "sub": "fo", "type": "Failover", "lease_ms": 1500, "go_file": go,
              "delay_ms": 2}
    active = Proc("consume", **common, ack_limit=80, hold=6, first_timeout_ms=10_000, idle_ms=2000)
    assert active.wait_event("subscribed")["active"] is True
    standby = Proc("consume", **common, first_timeout_ms=20_000, idle_ms=2500)
    assert standby.wait_event("subscribed")["active"] is False
    open(go, "w").close()
    holding = active.wait_event("holding")
    active.sigkill()
    killed_at = time.time()
    acked_by_active = [e["value"] for e in active.all_events("acked")]
    assert len(acked_by_active) == 80 and holding["held"] == [f"m{i}" for i in range(80, 86)]
    r = standby.result()
    assert r["first_receive_time"] >= killed_at  # the standby delivered nothing while the active lived
    assert r["first_receive_time"] - killed_at < 1.5 + 3.0  # took over about one lease period later
    acked_by_standby = r["acked"]
    assert not set(acked_by_active) & set(acked_by_standby)
    assert set(acked_by_active) | set(acked_by_standby) == set(expected)
    assert set(holding["held"]) <= set(acked_by_standby)  # received but unacked: redelivered
    assert acked_by_standby[:6] == holding["held"]
    _assert_at_end(root, TOPIC, "fo", 200)


def test_failover_partitions_of_a_killed_consumer_go_to_the_other_after_its_leases(root, tmp_path):
    """Two Failover consumers split a 4-partition topic by Pulsar's rule (``a``: 0 and 2, ``b``: 1
    and 3). ``a`` is SIGKILLed holding unacknowledged messages: once its leases run out ``b`` takes
    its partitions, receives what ``a`` held, and nothing is lost or acknowledged twice."""
    expected = seed(root, TOPIC, 200, partitions=4, keyed=True)
    go = _go(tmp_path)
    common = {"root": root, "topic": TOPIC, "sub": "fo4", "type": "Failover", "lease_ms": 1500, "go_file": go,
              "delay_ms": 2}
    a = Proc("consume", **common, name="a", ack_limit=40, hold=4, first_timeout_ms=10_000, idle_ms=2000)
    a.wait_event("subscribed")
    b = Proc("consume", **common, name="b", first_timeout_ms=20_000, idle_ms=5000)
    b.wait_event("subscribed")
    time.sleep(2.0)  # a hands partitions 1 and 3 to b (a renewal of each, a third of the lease apart)
    open(go, "w").close()
    holding = a.wait_event("holding")
    a.sigkill()
    killed_at = time.time()
    acked_a = a.all_events("acked")
    assert {e["partition"] for e in acked_a} | set(holding["partitions"]) <= {0, 2}
    r = b.result()
    acked_b = r["acked"]
    before = {p for p, at in zip(r["partitions"], [e["at"] for e in b.all_events("acked")], strict=True)
              if at < killed_at}
    assert before <= {1, 3}  # b delivered nothing of a's partitions while a lived
    assert set(r["partitions"]) == {0, 1, 2, 3}
    values_a = [e["value"] for e in acked_a]
    assert not set(values_a) & set(acked_b) and len(acked_b) == len(set(acked_b))
    assert set(values_a) | set(acked_b) == set(expected)
    assert set(holding["held"]) <= set(acked_b)  # received by a, never acknowledged: redelivered
    _assert_at_end(root, TOPIC, "fo4", 200)


def test_shared_claims_of_a_killed_consumer_expire(root, tmp_path):
    expected = seed(root, TOPIC, 40)
    go = _go(tmp_path)
    common = {"root": root, "topic": TOPIC, "sub": "sh", "type": "Shared", "lease_ms": 1500, "go_file": go,
              "queue": 10, "delay_ms": 0}
    dying = Proc("consume", **common, ack_limit=5, hold=3, first_timeout_ms=10_000, idle_ms=2000)
    dying.wait_event("subscribed")
    open(go, "w").close()
    holding = dying.wait_event("holding")
    dying.sigkill()
    acked_by_dying = [e["value"] for e in dying.all_events("acked")]
    survivor = Proc("consume", **common, first_timeout_ms=10_000, idle_ms=3000)
    r = survivor.result()
    assert len(acked_by_dying) == 5 and not set(acked_by_dying) & set(r["acked"])
    assert set(acked_by_dying) | set(r["acked"]) == set(expected)
    assert set(holding["held"]) <= set(r["acked"])
    _assert_at_end(root, TOPIC, "sh", 40)


def test_even_odd_txn_acks_across_consumer_restarts(root):
    """Even messages acked in a transaction that aborts, odd ones in one that commits, with the
    consumer process restarted (the first one killed -9 with its transaction open) between steps."""
    import pulsartx
    from pulsartx.coordinator.txnid import TxnID

    seed(root, TOPIC, 10)
    step1 = Proc("even_odd", root=root, step=1, lease_ms=4000)
    txn_e = TxnID(*step1.wait_event("acked")["txn"])
    step1.sigkill()
    killed_at = time.time()

    admin_client = pulsartx.Client(root)
    [st] = admin_client.admin.transactions.get_pending_ack_stats(TOPIC, "eo")
    assert st["transactions"] == {str(txn_e): 5} and st["pendingAckCount"] == 5  # replayed from the store
    [tst] = admin_client.admin.transactions.get_transaction_in_pending_ack_stats(txn_e, TOPIC, "eo")
    assert tst["pendingAckRanges"] == [[o, o] for o in range(0, 10, 2)]

    r2 = Proc("even_odd", root=root, step=2).result()
    assert r2["received"] == [f"m{i}" for i in range(1, 10, 2)]  # the evens are PENDING_ACK
    if r2["subscribed_at"] - killed_at < 3.5:  # the killed consumer's Exclusive lease had to run out first
        assert r2["busy_first"]
    [st] = admin_client.admin.transactions.get_pending_ack_stats(TOPIC, "eo")
    assert st["transactions"] == {str(txn_e): 5} and st["markDeletePosition"] == -1

    admin_client.admin.transactions.abort_transaction(txn_e)  # TC abort of the evens' transaction
    [st] = admin_client.admin.transactions.get_pending_ack_stats(TOPIC, "eo")
    assert st["transactions"] == {} and st["individuallyAckedRanges"] == 5

    r3 = Proc("even_odd", root=root, step=3).result()
    assert r3["received"] == [f"m{i}" for i in range(0, 10, 2)]
    assert r3["redelivery"] == [1] * 5
    assert r3["odd_conflicts"] == ["already acknowledged"] * 5
    assert r3["left"] == []
    [st] = admin_client.admin.transactions.get_pending_ack_stats(TOPIC, "eo")
    assert st["markDeletePosition"] == 9 and st["pendingAckCount"] == 0 and st["individuallyAckedRanges"] == 0
    admin_client.close()


def _assert_at_end(root: str, topic: str, sub: str, total: int) -> None:
    import pulsartx

    c = pulsartx.Client(root)
    stats = c.admin.transactions.get_pending_ack_stats(topic, sub)
    c.close()
    assert sum(s["markDeletePosition"] + 1 for s in stats) == total
    assert all(s["pendingAckCount"] == 0 and s["individuallyAckedRanges"] == 0 for s in stats)


# ================================ child side ======================================================


def consume(root: str, topic: str, sub: str, type: str, go_file: str, first_timeout_ms: int, idle_ms: int,
            delay_ms: int = 0, queue: int = 1000, lease_ms: int = 10_000, ack_limit: int | None = None,
            hold: int = 0, group_ms: int = 0, update_ms: int | None = None, name: str | None = None) -> dict:
    """Subscribe, wait for ``go_file``, then receive and acknowledge (each ack durable before the
    ``acked`` event unless ``group_ms``) until nothing comes for ``idle_ms``. With
    ``ack_limit``: after that many acks, receive ``hold`` more without acking and wait to be killed.
    ``update_ms``: the consumer's ``auto_update_partitions_interval_ms``; ``name``: its consumer name."""
    import pulsartx
    from pulsartx import ConsumerType, InitialPosition

    client = pulsartx.Client(root)
    c = client.subscribe(topic, sub, consumer_type=ConsumerType[type], initial_position=InitialPosition.Earliest,
                         receiver_queue_size=queue, lease_ms=lease_ms, acknowledgment_group_time_ms=group_ms,
                         auto_update_partitions_interval_ms=update_ms, consumer_name=name)
    emit("EVENT", "subscribed", {"active": c._active})
    _wait_for(go_file)
    acked: list[str] = []
    partitions: list[int] = []
    first_time = None
    max_redelivery = 0
    timeout = first_timeout_ms
    while True:
        if ack_limit is not None and len(acked) == ack_limit:
            msgs = [c.receive(timeout_millis=5000) for _ in range(hold)]
            emit("EVENT", "holding", {"held": [m.data().decode() for m in msgs],
                                      "partitions": [m.message_id().partition() for m in msgs]})
            hang()
        try:
            m = c.receive(timeout_millis=timeout)
        except pulsartx.Timeout:
            break
        timeout = idle_ms
        if first_time is None:
            first_time = time.time()
        max_redelivery = max(max_redelivery, m.redelivery_count())
        if delay_ms:
            time.sleep(delay_ms / 1000)
        c.acknowledge(m)
        acked.append(m.data().decode())
        partitions.append(m.message_id().partition())
        emit("EVENT", "acked", {"value": acked[-1], "partition": partitions[-1], "at": time.time()})
    c.close()
    return {"acked": acked, "partitions": partitions, "first_receive_time": first_time, "max_redelivery": max_redelivery}


def even_odd(root: str, step: int, lease_ms: int = 1500) -> dict:
    import pulsartx
    from pulsartx import InitialPosition
    from pulsartx.exceptions import ConsumerBusy, TransactionConflict
    from pulsartx.log.message_id import MessageId

    client = pulsartx.Client(root)
    busy_first = False
    deadline = time.monotonic() + 30
    while True:
        try:
            c = client.subscribe(TOPIC, "eo", initial_position=InitialPosition.Earliest, lease_ms=lease_ms)
            break
        except ConsumerBusy:
            busy_first = True
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    subscribed_at = time.time()
    got = []
    timeout = 5000
    while True:
        try:
            got.append(c.receive(timeout_millis=timeout))
        except pulsartx.Timeout:
            break
        timeout = 700
    received = [m.data().decode() for m in got]
    if step == 1:
        assert received == [f"m{i}" for i in range(10)], received
        txn = client.new_transaction()
        c.acknowledge([m for m in got if int(m.data()[1:]) % 2 == 0], txn=txn)
        emit("EVENT", "acked", {"txn": [txn.id.most_bits, txn.id.least_bits]})
        hang()
    if step == 2:
        txn = client.new_transaction()
        for m in got:
            c.acknowledge(m, txn=txn)
        txn.commit()
        c.close()
        client.close()  # waits for the commit's background completion (this child leaves with os._exit)
        return {"received": received, "busy_first": busy_first, "subscribed_at": subscribed_at}
    conflicts = []
    probe = client.new_transaction()
    for off in range(1, 10, 2):
        try:
            c.acknowledge(MessageId(0, off), txn=probe)
            conflicts.append("none")
        except TransactionConflict as e:
            conflicts.append("already acknowledged" if "already acknowledged" in str(e) else str(e))
    probe.abort()
    txn = client.new_transaction()
    c.acknowledge(got, txn=txn)
    txn.commit()
    c.redeliver_unacknowledged_messages()
    left = []
    while True:
        try:
            left.append(c.receive(timeout_millis=700).data().decode())
        except pulsartx.Timeout:
            break
    c.close()
    client.close()
    return {"received": received, "redelivery": [m.redelivery_count() for m in got], "odd_conflicts": conflicts,
            "left": left}


def _wait_for(path: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"start signal {path} never came")
        time.sleep(0.005)


COMMANDS = {"consume": consume, "even_odd": even_odd}

if __name__ == "__main__":
    main(COMMANDS)
