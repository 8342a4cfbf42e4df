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


class Monotonic:
    """A monotonic clock (ms) that the test moves: real time passing, which a step does not change."""

    def __init__(self) -> None:
        self.at = 0.0

    def __call__(self) -> float:
        return self.at


@pytest.fixture
def tc_clocks(monkeypatch) -> tuple[Clock, Monotonic]:
    """The TC's wall clock and monotonic clock, both set by the test."""
    clock, mono = Clock(at=now_ms()), Monotonic()
    monkeypatch.setattr(coordinator, "now_ms", clock)
    monkeypatch.setattr(coordinator, "monotonic_ms", mono)
    return clock, mono


def test_a_keep_alive_after_the_owners_clock_steps_back_moves_the_deadline(client, tc_clocks):
    """The owner begins with a 30 s timeout; 20 s later its host's clock steps back an hour and its
    keep-alive extends the transaction by 30 s, which returns normally. A sweeper whose clock is
    right, 15 s after that extension, must find the transaction open: it was extended while its
    owner lived. Failed before the fix: ``extend`` computed the new deadline as (its wall clock +
    30 s) - start, below the current one, wrote nothing and said nothing, so the live owner's
    transaction was aborted at its original deadline. It now counts from the begin (or the last
    extension) by the monotonic clock."""
    clock, mono = tc_clocks
    tc = client._coordinators().tc(0)
    t0 = clock()
    m = tc.new_transaction(30_000, partitions=[P])
    clock.at, mono.at = t0 + 20_000 - HOUR, 20_000  # 20 s later, the owner's clock steps back an hour
    tc.extend(m.txn_id, 30_000)  # the keep-alive: no error
    clock.at = t0 + 35_000  # another process, right clock, 15 s after the extension
    assert tc.sweep(now=t0 + 35_000).timed_out == 0
    assert tc.get(m.txn_id, refresh=True).status is TxnStatus.OPEN
    assert tc.get(m.txn_id).start_ms + tc.get(m.txn_id).timeout_ms == t0 + 50_000
    assert tc.end_transaction(m.txn_id, TxnAction.COMMIT).status is TxnStatus.COMMITTED


def test_the_keeper_finds_a_transaction_due_after_its_clock_steps_back(client, tc_clocks):
    """The keep-alive of a driver's transaction (30 s timeout) looks 11 s after the begin, when its
    host's clock has stepped back an hour: less than two thirds of the timeout is left, so it must
    extend. Failed before the fix: ``keepalive.due`` judged by the wall clock, which found the
    deadline an hour away, so nothing was extended and the live owner's transaction timed out."""
    from pulsartx.commit_protocol import keepalive

    clock, mono = tc_clocks
    driver = keepalive.Driver("host", 1, "?")
    tcs = client._coordinators()
    t0 = clock()
    m = tcs.tc(0).new_transaction(30_000, partitions=[P], properties=keepalive.properties(30_000, driver))
    clock.at, mono.at = t0 + 11_000 - HOUR, 11_000
    assert keepalive.extend_due(tcs, [tcs.tc(0).get(m.txn_id, refresh=True)], driver) == (30_000, [])
    extended = tcs.tc(0).get(m.txn_id, refresh=True)
    assert extended.start_ms + extended.timeout_ms == t0 + 41_000


def test_an_extension_after_a_backward_step_does_not_resurrect_an_expired_transaction(client, tc_clocks):
    """35 s after a 30 s transaction began, its owner's clock (stepped back an hour) says it has 55
    minutes left: the extension must still refuse it, as past its deadline, not move it."""
    clock, mono = tc_clocks
    tc = client._coordinators().tc(0)
    t0 = clock()
    m = tc.new_transaction(30_000, partitions=[P])
    clock.at, mono.at = t0 + 35_000 - HOUR, 35_000
    with pytest.raises(ExpiredTransactionError, match="passed its timeout"):
        tc.extend(m.txn_id, 30_000)
    assert tc.get(m.txn_id, refresh=True).timeout_ms == 30_000


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
