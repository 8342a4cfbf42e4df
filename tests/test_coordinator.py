"""The transaction coordinator against a real storage root, in one process: PIP-31 request processing
(new / add partition / add subscription / end), the TC log entries each request writes, expiration by
the sweeper, TxnID allocation across restarts, and opening a TC from its snapshot plus tail.

Multi-process races and SIGKILL recovery are in test_coordinator_crash.py, transaction keys in
test_fencing.py.
"""
from __future__ import annotations

import time
from collections import Counter

import pytest
from _procs import BIG_RETENTION_MS, count_markers

import pulsartx
from pulsartx.client.transaction import TransactionState
from pulsartx.coordinator.coordinator import CoordinatorConfig, now_ms
from pulsartx.coordinator.state import Subscription, TxnAction, TxnStatus
from pulsartx.coordinator.tclog import tc_segments
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import (
    ExpiredTransactionError,
    InvalidTxnStatusError,
    NotAllowedError,
    TransactionCoordinatorNotFoundError,
    TransactionNotFound,
)
from pulsartx.naming import TopicName

KEEP = CoordinatorConfig(finished_retention_ms=BIG_RETENTION_MS, compact_every=10**6, recovery_grace_ms=0)
COMMIT, ABORT = TxnAction.COMMIT, TxnAction.ABORT


@pytest.fixture
def root_url(root) -> str:
    return root  # local directory or RGW bucket (conftest's storage fixture)


@pytest.fixture
def client(root_url):
    c = pulsartx.Client(root_url, num_coordinators=2, coordinator_config=KEEP)
    yield c
    c.close()


def history(client, tc_id: int, txn_id: TxnID) -> list[tuple[str, str | None, str]]:
    """Every TC-log entry of one transaction still in the table, in order: (op, expected, new)."""
    import deltalake

    rows = deltalake.DeltaTable(client.root.uri(*tc_segments(tc_id)),
                                storage_options=client.root.delta_options or None).to_pyarrow_table().to_pylist()
    mine = sorted((r for r in rows if r["txnid_least_bits"] == txn_id.least_bits), key=lambda r: r["seq"])
    assert [r["seq"] for r in mine] == list(range(len(mine))), "one entry per seq, no gaps"
    return [(r["metadata_op"], r["expected_status"], r["new_status"]) for r in mine]


def partitions(client, topic: str, n: int) -> list[str]:
    client.admin.create_topic(topic, n)
    return [str(TopicName.parse(f"{topic}-partition-{i}")) for i in range(n)]


def markers_of(root_url, topic, n, txn_id: TxnID) -> Counter:
    return Counter({(p, t): c for (p, t, tid), c in count_markers(root_url, topic, n).items()
                    if tid == txn_id.as_tuple()})


# ---- CommandNewTxn / AddPartition / AddSubscription ----------------------------------------------------


def test_new_transaction_logs_open(client):
    tc = client._coordinators().tc(1)
    m = tc.new_transaction(5000, owner="o", properties={"app": "x"})
    assert m.txn_id == TxnID(1, 0) and m.status is TxnStatus.OPEN and m.seq == 0
    assert (m.timeout_ms, m.owner, m.properties) == (5000, "o", {"app": "x"})
    assert history(client, 1, m.txn_id) == [("NEW", None, "OPEN")]
    assert tc.get(m.txn_id) == m
    assert tc.new_transaction(5000).txn_id == TxnID(1, 1)


def test_add_partitions_and_subscriptions_are_sets(client, root_url):
    tc = client._coordinators().tc(0)
    t = tc.new_transaction(60_000).txn_id
    log = tc.txlog.log
    v = log.version
    m = tc.add_partitions(t, ["a", "b"])
    assert (m.partitions, m.seq, log.version) == (frozenset({"a", "b"}), 1, v + 1)
    for repeat in (["a", "b"], ["b"], ["a", "a"], []):
        m = tc.add_partitions(t, repeat)
        assert (m.partitions, m.seq, log.version) == (frozenset({"a", "b"}), 1, v + 1), repeat
    m = tc.add_partitions(t, ["b", "c"])
    assert (m.partitions, m.seq, log.version) == (frozenset({"a", "b", "c"}), 2, v + 2)

    s1, s2 = Subscription("t", "s1"), Subscription("t", "s2")
    m = tc.add_subscriptions(t, [s1])
    assert (m.subscriptions, m.seq, log.version) == (frozenset({s1}), 3, v + 3)
    m = tc.add_subscriptions(t, [s1])
    assert (m.subscriptions, m.seq, log.version) == (frozenset({s1}), 3, v + 3)
    m = tc.add_subscriptions(t, [s1, s2])
    assert (m.subscriptions, m.seq, log.version) == (frozenset({s1, s2}), 4, v + 4)
    assert history(client, 0, t) == [("NEW", None, "OPEN"), ("ADD_PARTITION", "OPEN", "OPEN"),
                                      ("ADD_PARTITION", "OPEN", "OPEN"), ("ADD_SUBSCRIPTION", "OPEN", "OPEN"),
                                      ("ADD_SUBSCRIPTION", "OPEN", "OPEN")]
    # durable: another client replaying the log sees the same sets
    other = pulsartx.Client(root_url, coordinator_config=KEEP)
    seen = other._coordinators().tc(0).get(t)
    assert (seen.partitions, seen.subscriptions, seen.seq) == (frozenset({"a", "b", "c"}), frozenset({s1, s2}), 4)


@pytest.mark.parametrize("action", [COMMIT, ABORT])
def test_adding_is_rejected_unless_open(client, action):
    (a,) = partitions(client, "rej", 1)
    sub = Subscription(a, "s")
    tc = client._coordinators().tc(0)
    t = tc.new_transaction(60_000).txn_id
    tc.add_partitions(t, [a])
    tc.add_subscriptions(t, [sub])
    during: list[type] = []

    def while_decided(meta):
        assert meta.status is action.ending_status
        for call in (lambda: tc.add_partitions(t, ["z"]), lambda: tc.add_partitions(t, [a]),
                     lambda: tc.add_subscriptions(t, [Subscription("t", "z")])):
            with pytest.raises(InvalidTxnStatusError) as ei:
                call()
            during.append(type(ei.value))

    assert tc.end_transaction(t, action, before_participants=while_decided).status is action.final_status
    assert during == [InvalidTxnStatusError] * 3
    v = tc.txlog.log.version
    for call in (lambda: tc.add_partitions(t, ["z"]), lambda: tc.add_subscriptions(t, [Subscription("t", "z")]),
                 # a repeat is not a way around it: PIP-31 checks OPEN before anything else
                 lambda: tc.add_partitions(t, [a]), lambda: tc.add_subscriptions(t, [sub])):
        with pytest.raises(InvalidTxnStatusError) as ei:
            call()
        assert type(ei.value) is InvalidTxnStatusError
    assert tc.txlog.log.version == v


# ---- CommandEndTxn ------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", [COMMIT, ABORT])
def test_end_transaction_path_and_retries(client, root_url, action):
    parts = partitions(client, "end", 3)
    tc = client._coordinators().tc(0)
    t = tc.new_transaction(60_000).txn_id
    tc.add_partitions(t, parts)
    m = tc.end_transaction(t, action)
    assert m.status is action.final_status and m.seq == 3
    ending, final = action.ending_status.value, action.final_status.value
    expected_history = [("NEW", None, "OPEN"), ("ADD_PARTITION", "OPEN", "OPEN"), ("UPDATE", "OPEN", ending),
                        ("UPDATE", ending, final)]
    assert history(client, 0, t) == expected_history
    marker = "TXN_COMMIT" if action is COMMIT else "TXN_ABORT"
    assert markers_of(root_url, "end", 3, t) == Counter({(i, marker): 1 for i in range(3)})

    v = tc.txlog.log.version
    # a client retrying after a lost reply: same action is a no-op success
    for _ in range(2):
        assert tc.end_transaction(t, action).status is action.final_status
    # the opposite action is refused, with the plain status error (this transaction was not fenced)
    opposite = ABORT if action is COMMIT else COMMIT
    with pytest.raises(InvalidTxnStatusError) as ei:
        tc.end_transaction(t, opposite)
    assert type(ei.value) is InvalidTxnStatusError
    assert tc.txlog.log.version == v
    assert history(client, 0, t) == expected_history
    assert markers_of(root_url, "end", 3, t) == Counter({(i, marker): 1 for i in range(3)})


@pytest.mark.parametrize("action", [COMMIT, ABORT])
def test_end_retry_while_decided_completes_once(client, root_url, action):
    """A retry arriving while COMMITTING/ABORTING succeeds (and helps finish); the opposite fails."""
    parts = partitions(client, "dec", 2)
    tc = client._coordinators().tc(1)
    t = tc.new_transaction(60_000).txn_id
    tc.add_partitions(t, parts)
    seen = {}

    def retry_inside(meta):
        seen["decided"] = tc.get(t, refresh=True).status
        opposite = ABORT if action is COMMIT else COMMIT
        with pytest.raises(InvalidTxnStatusError):
            tc.end_transaction(t, opposite)
        seen["retry"] = tc.end_transaction(t, action).status

    assert tc.end_transaction(t, action, before_participants=retry_inside).status is action.final_status
    assert seen == {"decided": action.ending_status, "retry": action.final_status}
    ending, final = action.ending_status.value, action.final_status.value
    assert history(client, 1, t) == [("NEW", None, "OPEN"), ("ADD_PARTITION", "OPEN", "OPEN"),
                                     ("UPDATE", "OPEN", ending), ("UPDATE", ending, final)]
    marker = "TXN_COMMIT" if action is COMMIT else "TXN_ABORT"
    assert markers_of(root_url, "dec", 2, t) == Counter({(i, marker): 1 for i in range(2)})


def test_owner_check_and_admin_abort(client):
    tc = client._coordinators().tc(0)
    t = tc.new_transaction(60_000, owner="alice").txn_id
    with pytest.raises(NotAllowedError):
        tc.end_transaction(t, COMMIT, owner="bob")
    assert tc.get(t).status is TxnStatus.OPEN
    assert [d["txn_id"] for d in client.admin.transactions.get_slow_transactions(0)] == [str(t)]
    out = client.admin.transactions.abort_transaction(str(t))
    assert (out["status"], out["reason"], out["owner"]) == ("ABORTED", "admin abort", "alice")
    assert client.admin.transactions.get_slow_transactions(0) == []
    stats = {s["coordinator_id"]: s for s in client.admin.transactions.get_coordinator_stats()}
    assert (stats[0]["recently_aborted"], stats[0]["ongoing_txn_size"], stats[0]["low_water_mark"]) == (1, 0, 0)
    assert stats[1]["low_water_mark"] == -1


# ---- unknown transactions and coordinators -----------------------------------------------------------


def test_unknown_txn_and_wrong_tc(client):
    tcs = client._coordinators()
    tc0 = tcs.tc(0)
    never = TxnID(0, 12345)
    for call in (lambda: tc0.get(never, refresh=True), lambda: tc0.add_partitions(never, ["a"]),
                 lambda: tc0.add_subscriptions(never, [Subscription("t", "s")]),
                 lambda: tc0.end_transaction(never, COMMIT), lambda: tc0.end_transaction(never, ABORT)):
        with pytest.raises(TransactionNotFound, match="never issued"):
            call()
    with pytest.raises(TransactionNotFound):
        client.admin.transactions.get_transaction_metadata(never)
    # an id of TC 1 asked of TC 0
    t1 = tcs.tc(1).new_transaction(60_000).txn_id
    with pytest.raises(TransactionNotFound):
        tc0.get(t1)
    with pytest.raises(TransactionNotFound):
        tc0.end_transaction(t1, ABORT)
    assert tcs.tc(1).get(t1).status is TxnStatus.OPEN
    # coordinators that do not exist
    for bad in (2, 99, -1):
        with pytest.raises(TransactionCoordinatorNotFoundError):
            tcs.tc(bad)
    with pytest.raises(TransactionCoordinatorNotFoundError):
        client.admin.transactions.get_transaction_metadata("(99,0)")
    with pytest.raises(TransactionCoordinatorNotFoundError):
        client.admin.transactions.abort_transaction(TxnID(99, 0))


def test_trimmed_txn_is_not_found_but_not_never_issued(root_url):
    cfg = CoordinatorConfig(finished_retention_ms=0, compact_every=2)
    c = pulsartx.Client(root_url, num_coordinators=1, coordinator_config=cfg)
    tc = c._coordinators().tc(0)
    first = tc.new_transaction(60_000).txn_id
    tc.end_transaction(first, COMMIT)
    for _ in range(2):
        tc.end_transaction(tc.new_transaction(60_000).txn_id, ABORT)
    fresh = pulsartx.Client(root_url, coordinator_config=cfg)._coordinators().tc(0)
    with pytest.raises(TransactionNotFound, match="trimmed"):
        fresh.get(first)
    with pytest.raises(TransactionNotFound, match="never issued"):
        fresh.get(TxnID(0, cfg.id_block_size))  # ids are reserved a block at a time


def test_txnids_strictly_increase_across_restarts(root_url):
    """Even with compaction trimming every finished transaction between restarts. Each life
    reserves a block of ids and skips the unused rest of the previous life's."""
    cfg = CoordinatorConfig(finished_retention_ms=0, compact_every=3)
    ids: list[TxnID] = []
    for life in range(3):
        c = pulsartx.Client(root_url, num_coordinators=1, coordinator_config=cfg)
        for i in range(4):
            txn = c.new_transaction()
            ids.append(txn.id)
            txn.commit() if (life + i) % 2 else txn.abort()
        c.close()
    block = cfg.id_block_size
    assert ids == [TxnID(0, life * block + i) for life in range(3) for i in range(4)]
    assert all(a < b for a, b in zip(ids, ids[1:], strict=False))


# ---- expiration (PIP-31 "TC Transaction Expiration") ----------------------------------------------------


def test_timeout_aborts_via_sweeper(client, root_url):
    parts = partitions(client, "tmo", 1)
    producer = client.create_producer("tmo")
    swept = client.new_transaction(timeout_ms=1000)  # the sweeper aborts it, then commit fails
    late = client.new_transaction(timeout_ms=1000)  # committed after its timeout, before any sweep
    alive = client.new_transaction(timeout_ms=60_000)
    for txn in (swept, late, alive):
        producer.send(b"x", txn=txn)
    started = max(client.admin.transactions.get_transaction_metadata(t.id)["start_time_ms"] for t in (swept, late))
    time.sleep(max(0.0, (started + 1000 + 50 - now_ms()) / 1000))
    with pytest.raises(ExpiredTransactionError):
        late.commit()
    assert late.state is TransactionState.TIME_OUT
    assert client.admin.transactions.get_transaction_metadata(late.id)["status"] == "OPEN"  # not yet swept

    assert client.admin.transactions.sweep() == {"timed_out": 2, "completed": 0, "failed": 0}
    for txn in (swept, late):
        md = client.admin.transactions.get_transaction_metadata(txn.id)
        assert (md["status"], md["reason"], md["partitions"]) == ("ABORTED", "timed out", parts)
        assert markers_of(root_url, "tmo", 1, txn.id) == Counter({(0, "TXN_ABORT"): 1})
    assert client.admin.transactions.get_transaction_metadata(alive.id)["status"] == "OPEN"

    with pytest.raises(ExpiredTransactionError):
        swept.commit()
    assert swept.state is TransactionState.TIME_OUT
    # a send to a partition the transaction already registered fails too
    with pytest.raises(ExpiredTransactionError):
        producer.send(b"y", txn=swept)
    swept.abort()  # aborting a timed-out transaction is fine
    assert swept.state is TransactionState.ABORTED

    assert client.admin.transactions.sweep() == {"timed_out": 0, "completed": 0, "failed": 0}
    assert markers_of(root_url, "tmo", 1, swept.id) == Counter({(0, "TXN_ABORT"): 1})
    alive.commit()
    assert alive.state is TransactionState.COMMITTED


def test_sweep_uses_the_given_clock(client):
    tc = client._coordinators().tc(0)
    t = tc.new_transaction(60_000).txn_id
    assert tc.sweep(now=now_ms()).timed_out == 0
    assert tc.get(t).status is TxnStatus.OPEN
    res = tc.sweep(now=now_ms() + 61_000)
    assert res.timed_out == 1
    m = tc.get(t, refresh=True)
    assert (m.status, m.reason) == (TxnStatus.ABORTED, "timed out")


# ---- opening a TC: snapshot + tail, not the history ------------------------------------------------------


def test_open_replays_snapshot_plus_tail(root_url):
    every = 10
    cfg = CoordinatorConfig(finished_retention_ms=0, compact_every=every)
    c = pulsartx.Client(root_url, num_coordinators=1, coordinator_config=cfg)
    tc = c._coordinators().tc(0)
    still_open = tc.new_transaction(600_000).txn_id
    tc.add_partitions(still_open, ["a"])
    n = 200
    for i in range(n):
        tc.end_transaction(tc.new_transaction(60_000, lazy=True).txn_id, COMMIT if i % 2 else ABORT)
    # the TxnID block lease, NEW, ADD_PARTITION, then for each transaction that registered nothing one
    # write holding only its final entry (begun lazily: no NEW entry, no decision entry of its own)
    assert tc.txlog.log.appended == 3 + n  # every entry was written ...

    fresh = pulsartx.Client(root_url, coordinator_config=cfg)._coordinators().tc(0)
    kl = fresh.txlog.log
    # ... but opening read the last full snapshot, the minor ones since (each the rows of < every
    # commits, and together fewer rows than the full one or than every), plus < every commits
    assert kl.files_since_compaction <= 2 * every
    assert len(kl.rows) <= 3 * every
    m = fresh.get(still_open)
    assert (m.status, m.partitions) == (TxnStatus.OPEN, frozenset({"a"}))  # live txns survive compaction
    assert fresh.txlog.counter == cfg.id_block_size - 1  # the reservation survives compaction
    assert fresh.new_transaction(60_000).txn_id == TxnID(0, cfg.id_block_size)  # a new process: the next block
