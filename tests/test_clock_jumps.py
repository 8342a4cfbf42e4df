"""Wall-clock steps (an NTP step of an hour, forward or back) on one process, not a steady skew
between processes (tests/test_clock_skew.py): a step may change *when* a dead owner's work is
given back, never cost a live owner its transaction or its messages.

Each test replaces the clock of the module under test only (its ``now_ms``); storage, the TC logs
and the subscriptions are the real ones."""
from __future__ import annotations

import pytest
from _reads import committed_values

import pulsartx
from pulsartx import ConsumerType, InitialPosition
from pulsartx.client import receiving
from pulsartx.coordinator import coordinator
from pulsartx.coordinator.coordinator import CoordinatorConfig, now_ms
from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.exceptions import ExpiredTransactionError
from pulsartx.naming import TopicName

HOUR = 3_600_000
QUIET = CoordinatorConfig(compact_every=10**6, recovery_grace_ms=0)


class Clock:
    """A wall clock (ms) that the test steps: ``real`` plus ``offset``, or frozen at ``at``."""

    def __init__(self, at: int | None = None):
        self.at, self.offset = at, 0

    def __call__(self) -> int:
        return (now_ms() if self.at is None else self.at) + self.offset


@pytest.fixture
def client(root):
    c = pulsartx.Client(root, num_coordinators=1, coordinator_config=QUIET)
    c.admin.create_topic("cj", 1)
    yield c
    c.close()


P = str(TopicName.parse("cj-partition-0"))


def test_an_owner_whose_clock_steps_forward_before_commit_is_refused_and_nothing_of_it_shows(client, monkeypatch):
    """The owner's clock steps an hour forward between its send and its commit: the commit is
    refused as expired, yet no other process thinks so, so the transaction stays OPEN until a
    sweeper with a right clock reaches its deadline and aborts it. Neither before nor after does
    a READ_COMMITTED reader see its message, and a retried commit names the abort."""
    clock = Clock()
    monkeypatch.setattr(coordinator, "now_ms", clock)
    p = client.create_producer("cj")
    txn = client.new_transaction(timeout_ms=60_000)
    p.send(b"x", txn=txn)
    clock.offset = HOUR
    with pytest.raises(ExpiredTransactionError):
        txn.commit()
    clock.offset = 0
    tc = client._coordinators().for_txn(txn.id)
    m = tc.get(txn.id, refresh=True)
    assert m.status is TxnStatus.OPEN
    assert tc.sweep(now=m.start_ms + m.timeout_ms).timed_out == 1
    assert tc.get(txn.id, refresh=True).status is TxnStatus.ABORTED
    with pytest.raises(ExpiredTransactionError):
        txn.commit()
    p.send(b"y")
    assert committed_values(client, "cj") == [b"y"]


@pytest.mark.xfail(strict=True, reason="extend() and keepalive.due() judge the deadline by the extender's wall clock "
                   "alone: after a backward step the extension silently writes nothing. Needs a step-proof "
                   "base (the extender's monotonic time since its last extension) or extend() raising")
def test_a_keep_alive_after_the_owners_clock_steps_back_moves_the_deadline(client, monkeypatch):
    """The owner begins with a 30 s timeout; 20 s later its host's clock steps back an hour and its
    keep-alive extends the transaction by 30 s, which returns normally. A sweeper whose clock is
    right, 15 s after that extension, must find the transaction open: it was extended while its
    owner lived. Today ``extend`` computes the new deadline as (its clock + 30 s) - start, which is
    below the current one, writes nothing and says nothing, so the live owner's transaction is
    aborted at its original deadline (and ``keepalive.due`` never finds it due either)."""
    clock = Clock(at=now_ms())
    monkeypatch.setattr(coordinator, "now_ms", clock)
    tc = client._coordinators().tc(0)
    t0 = clock()
    m = tc.new_transaction(30_000, partitions=[P])
    clock.at = t0 + 20_000 - HOUR  # the owner's clock steps back an hour
    tc.extend(m.txn_id, 30_000)  # the keep-alive: no error
    clock.at = t0 + 35_000  # another process, right clock, 15 s after the extension
    assert tc.sweep(now=t0 + 35_000).timed_out == 0
    assert tc.get(m.txn_id, refresh=True).status is TxnStatus.OPEN
    assert tc.end_transaction(m.txn_id, TxnAction.COMMIT).status is TxnStatus.COMMITTED


def test_a_shared_consumer_whose_clock_steps_forward_keeps_its_claims(client, monkeypatch):
    """Consumer A (Shared) holds m0..m3, unacknowledged. Its clock then steps forward an hour and
    it receives m4..m7. Consumer B, whose clock is right, must get none of m0..m7 while A lives
    and holds them. Today A's claim write keeps only its own claims unexpired by its own clock, so
    it deletes its claims on m0..m3 and B receives them too (no redelivery counted)."""
    clock = Clock()
    monkeypatch.setattr(receiving, "now_ms", clock)
    p = client.create_producer("cj")
    for i in range(4):
        p.send(f"m{i}".encode())
    a = client.subscribe("cj", "s", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest)
    got_a = []
    while len(got_a) < 4:
        got_a += a.batch_receive(10, timeout_millis=2000)
    for i in range(4, 8):
        p.send(f"m{i}".encode())
    clock.offset = HOUR  # A's clock steps forward
    while len(got_a) < 8:
        got_a += a.batch_receive(10, timeout_millis=2000)
    assert sorted(m.data() for m in got_a) == sorted(f"m{i}".encode() for i in range(8))
    clock.offset = 0  # B's clock is right
    other = pulsartx.Client(client.root.url)
    try:
        b = other.subscribe("cj", "s", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest)
        got_b = b.batch_receive(10, timeout_millis=3000)
        assert [m.data() for m in got_b] == []
        b.close()
    finally:
        other.close()
        a.close()
