"""Acknowledgement-only transactions: the pending acks go first, carrying the transaction's
deadline, and one TC entry holds NEW, the subscriptions and the decision (docs/semantics.md, "An
acknowledgement-only transaction"). In one process; tests/test_ack_only_procs.py SIGKILLs real ones.
"""
from __future__ import annotations

import threading
import time

import pytest
from _procs import read_tc_log
from test_consumer import redelivered, seed

import pulsartx
from pulsartx import InitialPosition
from pulsartx.buffer.state import txn_key
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.coordinator.state import Subscription, TxnStatus
from pulsartx.coordinator.tclog import FENCE_PROPERTY
from pulsartx.exceptions import ExpiredTransactionError
from pulsartx.naming import TopicName
from pulsartx.storage.keyed_log import KeyedLog
from pulsartx.subscription.store import shared_store

pytestmark = pytest.mark.timeout(180)
TOPIC = "persistent://public/default/ao"
P0 = f"{TOPIC}-partition-0"
CFG = CoordinatorConfig(max_clock_skew_ms=200, recovery_grace_ms=0)


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "root")


def _client(root: str) -> pulsartx.Client:
    return pulsartx.Client(root, num_coordinators=1, coordinator_config=CFG)


def _seed(root: str, n: int) -> None:
    c = _client(root)
    seed(c, TOPIC, n)
    c.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest).close()
    c.close()


class Commits:
    """Durable commits this process makes to the TC log and the subscription, in order."""

    def __init__(self, monkeypatch):
        self.seen: list[str] = []
        self._lock = threading.Lock()
        original = KeyedLog.put

        def put(log, rows, *args, **kwargs):
            out = original(log, rows, *args, **kwargs)
            if rows:
                with self._lock:
                    self.seen.append("tc" if log.name.startswith("tc-") else "sub" if log.name.startswith("sub-")
                                     else log.name)
            return out

        monkeypatch.setattr(KeyedLog, "put", put)

    def since(self, mark: int) -> list[str]:
        with self._lock:
            return self.seen[mark:]


def test_an_ack_only_transaction_commits_in_two_sequential_commits(root, monkeypatch):
    """From begin to commit() returning: the pending ack, then one TC entry. Nothing runs beside
    them on this path, so they are the critical path."""
    _seed(root, 6)
    client = _client(root)
    cons = client.subscribe(TOPIC, "s")
    warm = client.new_transaction()  # the TxnID block lease and the stores' first reads
    cons.acknowledge(cons.receive(5000), txn=warm)
    warm.commit()
    client.flush()
    commits = Commits(monkeypatch)
    for i in range(1, 4):
        msgs = [cons.receive(5000) for _ in range(1 if i < 3 else 2)]
        client.flush()
        mark = len(commits.seen)
        txn = client.new_transaction()
        if i == 2:
            cons.acknowledge_cumulative(msgs[-1], txn=txn)
        else:
            cons.acknowledge(msgs, txn=txn)
        txn.commit()
        assert commits.since(mark) == ["sub", "tc"]
        entry = read_tc_log(client.root.url, 0)[txn.id.least_bits]
        assert entry.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED)
        assert entry.subscriptions == frozenset([Subscription(P0, "s")])
    client.flush()
    [st] = client.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    assert (st["markDeletePosition"], st["pendingAckCount"], st["unregisteredTransactions"]) == (4, 0, {})
    client.close()


def test_back_to_back_ack_only_transactions_fold_the_previous_completion(root, monkeypatch):
    """Run back to back, each transaction's acknowledgement also applies its predecessor's commit
    on the subscription: one subscription write and one TC commit per transaction, plus the final
    records folded into the next transactions' TC commits."""
    _seed(root, 31)
    client = _client(root)
    cons = client.subscribe(TOPIC, "s")
    txn = client.new_transaction()
    cons.acknowledge_cumulative(cons.receive(5000), txn=txn)
    txn.commit()
    client.flush()
    commits = Commits(monkeypatch)
    for _ in range(30):
        txn = client.new_transaction()
        cons.acknowledge_cumulative(cons.receive(5000), txn=txn)
        txn.commit()
    client.flush()
    assert commits.seen.count("sub") <= 30 + 3
    assert commits.seen.count("tc") <= 30 + 10
    [st] = client.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    assert (st["markDeletePosition"], st["pendingAckCount"]) == (30, 0)
    client.close()


def test_an_abandoned_ack_only_transaction_is_held_until_its_deadline_then_fenced(root):
    """Another client meets pending acks of a transaction no TC log holds: open (held) until its
    deadline and the skew allowance, then fenced and its messages redelivered once each; the
    owner's commit then fails as expired, and the stats show it as unregistered meanwhile."""
    _seed(root, 3)
    owner = _client(root)
    cons = owner.subscribe(TOPIC, "s")
    msgs = [cons.receive(5000) for _ in range(3)]
    txn = owner.new_transaction(timeout_ms=1500)
    cons.acknowledge(msgs, txn=txn)
    assert txn.id.least_bits not in read_tc_log(owner.root.url, 0)
    [st] = owner.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    deadline = st["unregisteredTransactions"][str(txn.id)]
    assert st["transactions"] == {str(txn.id): 3} and deadline > time.time() * 1000
    other = _client(root)
    cons2 = other.subscribe(TOPIC, "s2-reader", initial_position=InitialPosition.Earliest)  # unrelated
    cons2.close()
    cons.close()
    reader = other.subscribe(TOPIC, "s")
    assert redelivered(reader, 300) == []  # held: the transaction may still commit
    assert time.time() * 1000 < deadline
    time.sleep(max(0.0, (deadline + CFG.max_clock_skew_ms) / 1000 - time.time()) + 0.1)
    got = redelivered(reader)
    assert got == [("m0", 1), ("m1", 1), ("m2", 1)]
    fence = read_tc_log(other.root.url, 0)[txn.id.least_bits]
    assert fence.status is TxnStatus.ABORTED and FENCE_PROPERTY in fence.properties
    with pytest.raises(ExpiredTransactionError):
        txn.commit()
    assert read_tc_log(other.root.url, 0)[txn.id.least_bits].status is TxnStatus.ABORTED
    assert redelivered(reader, 500) == []
    [st] = other.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    assert (st["markDeletePosition"], st["pendingAckCount"], st["unregisteredTransactions"]) == (2, 0, {})
    reader.close()
    other.close()
    owner.close()


def test_an_ack_only_transaction_that_then_produces_lists_its_subscription_with_its_first_entry(root):
    _seed(root, 2)
    client = _client(root)
    client.admin.create_topic("out", 1)
    cons = client.subscribe(TOPIC, "s")
    prod = client.create_producer("out")
    txn = client.new_transaction()
    cons.acknowledge(cons.receive(5000), txn=txn)
    prod.send(b"x", txn=txn)
    prod.flush()
    entry = read_tc_log(client.root.url, 0)[txn.id.least_bits]
    assert entry.status is TxnStatus.OPEN
    assert entry.subscriptions == frozenset([Subscription(P0, "s")])
    assert entry.partitions == frozenset(["persistent://public/default/out-partition-0"])
    cons.acknowledge(cons.receive(5000), txn=txn)  # the log holds it now: no deadline needed
    store = shared_store(client.root, TopicName.parse(P0), "s")
    cursor = store.cursor()
    assert set(cursor.deadlines) == {txn_key(*txn.id.as_tuple())}  # from the first ack only
    assert cursor.pending_txn(0) == cursor.pending_txn(1) == txn_key(*txn.id.as_tuple())
    txn.commit()
    client.flush()
    [st] = client.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    assert (st["markDeletePosition"], st["pendingAckCount"], st["unregisteredTransactions"]) == (1, 0, {})
    client.close()


def test_an_aborted_or_expired_ack_only_transaction_returns_its_messages_once(root):
    _seed(root, 2)
    client = _client(root)
    cons = client.subscribe(TOPIC, "s")
    m0, m1 = cons.receive(5000), cons.receive(5000)
    aborted = client.new_transaction()
    cons.acknowledge(m0, txn=aborted)
    aborted.abort()
    entry = read_tc_log(client.root.url, 0)[aborted.id.least_bits]
    assert entry.subscriptions == frozenset([Subscription(P0, "s")])
    expired = client.new_transaction(timeout_ms=300)
    cons.acknowledge(m1, txn=expired)
    time.sleep(0.5)
    client._coordinators().tc(0).sweep()  # the owner's process aborts its own expired transaction
    assert read_tc_log(client.root.url, 0)[expired.id.least_bits].status in (TxnStatus.ABORTING, TxnStatus.ABORTED)
    with pytest.raises(ExpiredTransactionError):
        expired.commit()
    client.flush()
    cons.redeliver_unacknowledged_messages()
    assert sorted(redelivered(cons)) == [("m0", 1), ("m1", 1)]
    client.close()


def test_a_kept_alive_ack_only_transaction_is_written_and_the_log_governs(root):
    """An extension writes the transaction to its TC log (NEW with its subscriptions), and from then
    on the log's deadline, not the one in the pending acks, says whether it is open."""
    _seed(root, 1)
    client = _client(root)
    cons = client.subscribe(TOPIC, "s")
    txn = client.new_transaction(timeout_ms=800)
    cons.acknowledge(cons.receive(5000), txn=txn)
    client._coordinators().tc(0).extend(txn.id, 20_000)
    entry = read_tc_log(client.root.url, 0)[txn.id.least_bits]
    assert entry.status is TxnStatus.OPEN and entry.subscriptions == frozenset([Subscription(P0, "s")])
    time.sleep(1.3)  # past the deadline in the pending ack, and the skew allowance
    other = _client(root)
    cons.close()
    reader = other.subscribe(TOPIC, "s")
    assert redelivered(reader, 500) == []  # still held: the log says open
    assert read_tc_log(client.root.url, 0)[txn.id.least_bits].status is TxnStatus.OPEN
    txn.commit()
    client.flush()
    [st] = other.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    assert (st["markDeletePosition"], st["pendingAckCount"]) == (0, 0)
    reader.close()
    other.close()
    client.close()


def test_admin_views_and_abort_of_an_open_ack_only_transaction(root):
    """Until its decision the TC log does not list it: the pending-ack stats do, with its deadline,
    and the TC's answer says where to look. An admin abort fences it (as any unregistered id) and
    returns its pending acks at once: each message is redelivered once."""
    _seed(root, 2)
    owner = _client(root)
    cons = owner.subscribe(TOPIC, "s")
    msgs = [cons.receive(5000), cons.receive(5000)]
    txn = owner.new_transaction(timeout_ms=600_000)
    cons.acknowledge(msgs, txn=txn)
    cons.close()
    admin = _client(root)
    [st] = admin.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    assert st["transactions"] == {str(txn.id): 2} and set(st["unregisteredTransactions"]) == {str(txn.id)}
    with pytest.raises(pulsartx.exceptions.TransactionNotFound, match="unregisteredTransactions"):
        admin.admin.transactions.get_transaction_metadata(txn.id)
    admin.admin.transactions.abort_transaction(txn.id)
    entry = read_tc_log(admin.root.url, 0)[txn.id.least_bits]
    assert entry.status is TxnStatus.ABORTED and FENCE_PROPERTY in entry.properties
    [st] = admin.admin.transactions.get_pending_ack_stats(TOPIC, "s")  # returned at once, as when registered
    assert (st["pendingAckCount"], st["transactions"], st["unregisteredTransactions"]) == (0, {}, {})
    with pytest.raises(pulsartx.exceptions.InvalidTxnStatusError):
        txn.commit()
    reader = admin.subscribe(TOPIC, "s")
    assert redelivered(reader) == [("m0", 1), ("m1", 1)]
    [st] = admin.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    assert (st["markDeletePosition"], st["pendingAckCount"], st["unregisteredTransactions"]) == (1, 0, {})
    reader.close()
    admin.close()
    owner.close()


def test_a_keyed_transaction_registers_its_subscription_before_its_decision(root):
    """A transaction key's transactions are in the log from their start (fencing must find them),
    so their acknowledgements register the subscription the ordinary way and carry no deadline."""
    _seed(root, 1)
    client = pulsartx.Client(root, num_coordinators=1, coordinator_config=CFG, transaction_key="k", owner="o")
    cons = client.subscribe(TOPIC, "s")
    txn = client.new_transaction()
    cons.acknowledge(cons.receive(5000), txn=txn)
    entry = read_tc_log(client.root.url, 0)[txn.id.least_bits]
    assert entry.status is TxnStatus.OPEN and entry.subscriptions == frozenset([Subscription(P0, "s")])
    [st] = client.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    assert (st["transactions"], st["unregisteredTransactions"]) == ({str(txn.id): 1}, {})
    txn.commit()
    client.flush()
    [st] = client.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    assert (st["markDeletePosition"], st["pendingAckCount"]) == (0, 0)
    client.close()
