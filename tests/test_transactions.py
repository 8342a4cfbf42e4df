"""Transactions end to end through the public client API: what READ_COMMITTED and READ_UNCOMMITTED
readers see, markers, maxReadPosition and buffer stats, snapshots, and stuck transactions.

Scenarios are Pulsar's (TransactionProduceTest, TransactionBuffer tests, TransactionTest) and
Kafka's (TransactionsTest: "read committed" consumers, interleaved aborted/committed transactions),
rewritten against this API; every read asserts an exact sequence of messages.
"""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from _keys import keys_for  # tests/ is on sys.path (conftest)
from _procs import count_markers

import pulsartx
from pulsartx import MessageId, TopicName
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.markers import write_marker
from pulsartx.buffer.snapshot import SnapshotStore
from pulsartx.buffer.state import FOLD_COLUMNS, BufferState
from pulsartx.client.transaction import TransactionState
from pulsartx.coordinator.participants import end_on_participants
from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.exceptions import ExpiredTransactionError, InvalidTxnStatusError, NotAllowedError
from pulsartx.log.partition import PartitionLog

RC, RU = "READ_COMMITTED", "READ_UNCOMMITTED"


# ---- helpers -------------------------------------------------------------------------------------------




def read(client, topic: str, level: str = RC) -> list[bytes]:
    """Every message visible now (a multi-partition read interleaves partitions by publish time)."""
    with client.create_reader(topic, MessageId.earliest, isolation_level=level) as r:
        return [m.data() for m in r]


def read_parts(client, topic: str, level: str = RC) -> dict[int, list[tuple[int, bytes]]]:
    """Every message visible now, per partition, as (offset, value) in read order."""
    out: dict[int, list[tuple[int, bytes]]] = {}
    with client.create_reader(topic, MessageId.earliest, isolation_level=level) as r:
        for m in r:
            out.setdefault(m.message_id().partition(), []).append((m.message_id().offset(), m.data()))
    return out


def values(parts: dict[int, list[tuple[int, bytes]]]) -> dict[int, list[bytes]]:
    return {p: [v for _, v in ms] for p, ms in parts.items()}


def plog(client, topic: str, partition: int = 0) -> PartitionLog:
    return PartitionLog(client.root, TopicName.parse(f"{topic}-partition-{partition}"))


def txn_markers(client, topic: str, n: int, txn) -> Counter:
    client.flush()  # markers follow the decision in the background
    return Counter({(p, t): c for (p, t, tid), c in count_markers(client.root.url, topic, n).items()
                    if tid == txn.id.as_tuple()})


def sent_async(producer, items, txn=None) -> None:
    for v in items:
        producer.send_async(v, None, txn=txn)
    producer.flush()


def bs(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


# ---- visibility: the classic scenarios ------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_plain_txn_plain(client, outcome):
    """Pulsar: m1 plain, m2 in a transaction, m3 plain. While the transaction is open only m1 is
    visible; commit exposes m1, m2, m3 in append order, abort m1, m3."""
    client.admin.create_topic("t")
    p = client.create_producer("t")
    p.send(b"m1")
    txn = client.new_transaction()
    p.send(b"m2", txn=txn)
    p.send(b"m3")
    assert read(client, "t") == [b"m1"]
    assert read(client, "t", RU) == [b"m1", b"m2", b"m3"]
    txn.commit() if outcome == "commit" else txn.abort()
    assert txn.state is (TransactionState.COMMITTED if outcome == "commit" else TransactionState.ABORTED)
    assert read(client, "t") == ([b"m1", b"m2", b"m3"] if outcome == "commit" else [b"m1", b"m3"])
    assert read(client, "t", RU) == [b"m1", b"m2", b"m3"]


def test_ten_plain_ten_open_ten_plain(client):
    """Pulsar's maxReadPosition test: the open transaction hides itself and everything after it."""
    client.admin.create_topic("t")
    p = client.create_producer("t", batching_max_messages=10)
    sent_async(p, bs("a", 10))
    txn = client.new_transaction()
    sent_async(p, bs("t", 10), txn)
    sent_async(p, bs("b", 10))
    assert read(client, "t") == bs("a", 10)
    assert read(client, "t", RU) == bs("a", 10) + bs("t", 10) + bs("b", 10)
    txn.commit()
    assert read_parts(client, "t") == {0: list(enumerate(bs("a", 10) + bs("t", 10) + bs("b", 10)))}


def test_aborted_then_committed(client):
    """Kafka: txn1 (2 messages) aborted, txn2 (2 messages) committed."""
    client.admin.create_topic("t", 2)
    k = keys_for(2)
    p = client.create_producer("t")
    t1 = client.new_transaction()
    p.send(b"a0", partition_key=k[0], txn=t1)
    p.send(b"a1", partition_key=k[1], txn=t1)
    t1.abort()
    t2 = client.new_transaction()
    p.send(b"c0", partition_key=k[0], txn=t2)
    p.send(b"c1", partition_key=k[1], txn=t2)
    t2.commit()
    assert values(read_parts(client, "t")) == {0: [b"c0"], 1: [b"c1"]}
    assert values(read_parts(client, "t", RU)) == {0: [b"a0", b"c0"], 1: [b"a1", b"c1"]}


def test_large_aborted_then_committed_over_20_partitions(client):
    """Kafka: an aborted transaction of 10,000 records over 20 partitions, then a committed one of
    1,000: a READ_COMMITTED reader sees exactly the 1,000, READ_UNCOMMITTED all 11,000."""
    client.admin.create_topic("big", 20)
    # Unkeyed sends go round-robin by batch: batches of 50 give each transaction at least 20 batches,
    # one per partition in turn.
    p = client.create_producer("big", batching_max_messages=50)
    aborted = client.new_transaction()
    sent_async(p, bs("a", 10_000), aborted)  # flushed: the records are in the partitions
    aborted.abort()
    committed = client.new_transaction()
    sent_async(p, bs("c", 1000), committed)
    committed.commit()
    rc = read_parts(client, "big")
    ru = read_parts(client, "big", RU)
    assert sorted(v for ms in rc.values() for _, v in ms) == sorted(bs("c", 1000))
    assert sum(len(ms) for ms in ru.values()) == 11_000
    assert sorted(v for ms in ru.values() for _, v in ms) == sorted(bs("a", 10_000) + bs("c", 1000))
    for part, ms in rc.items():  # within a partition: the committed records in send order
        assert [int(v[1:]) for _, v in ms] == sorted(int(v[1:]) for _, v in ms), part
        assert [o for o, _ in ms] == sorted(o for o, _ in ms)
    assert len(rc) == 20 and len(ru) == 20


def test_interleaved_aborted_and_committed_keep_offsets(client):
    """Kafka: y1, y2 of an aborted transaction interleaved with x1, x2 of a committed one."""
    client.admin.create_topic("t")
    p = client.create_producer("t")
    tx, ty = client.new_transaction(), client.new_transaction()
    ids = {}
    for v, t in ((b"x1", tx), (b"y1", ty), (b"x2", tx), (b"y2", ty)):
        ids[v] = p.send(v, txn=t).offset()
    assert ids == {b"x1": 0, b"y1": 1, b"x2": 2, b"y2": 3}
    ty.abort()
    assert read_parts(client, "t") == {}  # x is still open, and first
    tx.commit()
    assert read_parts(client, "t") == {0: [(0, b"x1"), (2, b"x2")]}
    assert read_parts(client, "t", RU) == {0: [(0, b"x1"), (1, b"y1"), (2, b"x2"), (3, b"y2")]}


def test_two_transactions_interleave_1000_sends(client):
    """Kafka: two transactions interleave 1,000 sends; nothing is visible before the commits, and
    exactly the 1,000 after both, each transaction in its send order within a partition."""
    client.admin.create_topic("t", 2)
    p1, p2 = client.create_producer("t", batching_max_messages=100), client.create_producer("t", batching_max_messages=100)
    t1, t2 = client.new_transaction(), client.new_transaction()
    for i in range(500):
        p1.send_async(f"x{i}".encode(), None, txn=t1)
        p2.send_async(f"y{i}".encode(), None, txn=t2)
    p1.flush()
    p2.flush()
    assert read(client, "t") == []
    assert len(read(client, "t", RU)) == 1000
    t1.commit()
    t2.commit()
    parts = values(read_parts(client, "t"))
    got = [v for vs in parts.values() for v in vs]
    assert len(got) == 1000 and sorted(got) == sorted(bs("x", 500) + bs("y", 500))
    for vs in parts.values():
        for prefix in (b"x", b"y"):
            mine = [int(v[1:]) for v in vs if v.startswith(prefix)]
            assert mine == sorted(mine)


def test_committed_transaction_visible_while_another_stays_open_elsewhere(client):
    """A transaction open on partition 0 blocks partition 0 only."""
    client.admin.create_topic("t", 2)
    k = keys_for(2)
    p = client.create_producer("t")
    open_txn = client.new_transaction()
    p.send(b"o", partition_key=k[0], txn=open_txn)
    done = client.new_transaction()
    p.send(b"d", partition_key=k[1], txn=done)
    done.commit()
    p.send(b"p0", partition_key=k[0])
    p.send(b"p1", partition_key=k[1])
    assert values(read_parts(client, "t")) == {1: [b"d", b"p1"]}
    open_txn.commit()
    assert values(read_parts(client, "t")) == {0: [b"o", b"p0"], 1: [b"d", b"p1"]}


def test_tailing_reader_sees_the_commit(client):
    """A READ_COMMITTED reader parked on an open transaction returns its messages once committed."""
    client.admin.create_topic("t")
    p = client.create_producer("t")
    txn = client.new_transaction()
    p.send(b"x", txn=txn)
    p.send(b"after")
    r = client.create_reader("t", MessageId.earliest)
    assert not r.has_message_available()
    threading.Timer(0.3, txn.commit).start()
    assert [r.read_next(timeout_millis=5000).data() for _ in range(2)] == [b"x", b"after"]
    assert not r.has_message_available()


# ---- markers ---------------------------------------------------------------------------------------------


def test_one_marker_per_touched_partition_and_never_returned(client):
    client.admin.create_topic("mk", 4)
    k = keys_for(4)
    p = client.create_producer("mk")
    c = client.new_transaction()
    for part, v in ((0, b"c0"), (1, b"c1"), (0, b"c0b"), (2, b"c2")):
        p.send(v, partition_key=k[part], txn=c)
    c.commit()
    client.flush()  # c's markers come from the background completer: in before a's data, on purpose
    a = client.new_transaction()
    for part, v in ((1, b"a1"), (3, b"a3"), (3, b"a3b")):
        p.send(v, partition_key=k[part], txn=a)
    a.abort()
    assert txn_markers(client, "mk", 4, c) == Counter({(0, "TXN_COMMIT"): 1, (1, "TXN_COMMIT"): 1, (2, "TXN_COMMIT"): 1})
    assert txn_markers(client, "mk", 4, a) == Counter({(1, "TXN_ABORT"): 1, (3, "TXN_ABORT"): 1})
    assert values(read_parts(client, "mk")) == {0: [b"c0", b"c0b"], 1: [b"c1"], 2: [b"c2"]}
    assert values(read_parts(client, "mk", RU)) == {0: [b"c0", b"c0b"], 1: [b"c1", b"a1"], 2: [b"c2"],
                                                     3: [b"a3", b"a3b"]}
    # the markers do take offsets: partition 1 is c1, its marker, a1, its marker
    raw = plog(client, "mk", 1).read(0, 10).to_pylist()
    assert [(r["offset"], r["type"]) for r in raw] == [(0, "DATA"), (1, "TXN_COMMIT"), (2, "DATA"), (3, "TXN_ABORT")]


def test_tc_retries_never_double_a_marker(client):
    client.admin.create_topic("mk", 3)
    k = keys_for(3)
    p = client.create_producer("mk")
    txn = client.new_transaction()
    for i in range(3):
        p.send(f"v{i}".encode(), partition_key=k[i], txn=txn)
    txn.commit()
    client.flush()  # markers follow the decision in the background
    expected = Counter({(i, "TXN_COMMIT"): 1 for i in range(3)})
    assert txn_markers(client, "mk", 3, txn) == expected
    tc = client._coordinators().tc(txn.id.tc_id)
    # the client retrying its EndTxn after a lost reply, twice
    for _ in range(2):
        assert tc.end_transaction(txn.id, TxnAction.COMMIT).status is TxnStatus.COMMITTED
    # the TC retrying the whole participant phase (PIP-31's TransactionOpRetryTimer)
    meta = tc.get(txn.id, refresh=True)
    assert end_on_participants(client.root, meta, TxnAction.COMMIT) == []
    # the marker channel called directly: both actions, through fresh and shared logs
    name = f"{TopicName.parse('mk')}-partition-0"
    for action in (TxnAction.COMMIT, TxnAction.ABORT):
        res = write_marker(client.root, name, txn.id, action, plog=plog(client, "mk", 0))
        assert res.version is None and res.duplicates == 1
        assert write_marker(client.root, name, txn.id, action).version is None
    assert txn_markers(client, "mk", 3, txn) == expected
    with pytest.raises(InvalidTxnStatusError):
        tc.end_transaction(txn.id, TxnAction.ABORT)
    assert values(read_parts(client, "mk")) == {0: [b"v0"], 1: [b"v1"], 2: [b"v2"]}


class Stop(Exception):
    pass


def stop_after_decision(meta):
    raise Stop(f"stopped with {meta.txn_id} {meta.status.value}")


def test_racing_marker_writers_write_one_marker(client):
    """The decision is logged but no marker written (the TC stopped); four marker writers with their
    own log handles race: exactly one writes. The TC's retry then completes with no second marker."""
    client.admin.create_topic("mk")
    p = client.create_producer("mk")
    txn = client.new_transaction()
    p.send(b"x", txn=txn)
    tc = client._coordinators().tc(txn.id.tc_id)
    with pytest.raises(Stop):
        tc.end_transaction(txn.id, TxnAction.COMMIT, before_participants=stop_after_decision)
    assert tc.get(txn.id, refresh=True).status is TxnStatus.COMMITTING
    name = str(TopicName.parse("mk-partition-0"))
    barrier = threading.Barrier(4)
    results = []

    def racer():
        log = plog(client, "mk")
        log.end_offset()
        barrier.wait()
        results.append(write_marker(client.root, name, txn.id, TxnAction.COMMIT, plog=log).version)

    threads = [threading.Thread(target=racer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r is not None for r in results) == [False, False, False, True]
    assert tc.end_transaction(txn.id, TxnAction.COMMIT).status is TxnStatus.COMMITTED
    assert txn_markers(client, "mk", 1, txn) == Counter({(0, "TXN_COMMIT"): 1})
    assert read(client, "mk") == [b"x"]


def test_commit_entries_hide_unlisted_data_also_after_a_snapshot(client):
    """A commit that reports its exact entries (as the Spark writer does) hides the transaction's
    messages it does not list, in a partition with no listed entry too, and a buffer snapshot of that
    partition must keep them hidden (regression: an empty entry list was lost in the snapshot)."""
    client.admin.create_topic("ce", 2)
    k = keys_for(2)
    p = client.create_producer("ce")
    txn = client.new_transaction()
    kept = p.send(b"kept", partition_key=k[0], txn=txn)
    p.send(b"unlisted0", partition_key=k[0], txn=txn)
    p.send(b"unlisted1", partition_key=k[1], txn=txn)  # e.g. a failed task attempt's write
    p.send(b"plain1", partition_key=k[1])
    name0 = str(TopicName.parse("ce-partition-0"))
    tc = client._coordinators().tc(txn.id.tc_id)
    tc.end_transaction(txn.id, TxnAction.COMMIT, commit_entries=[(name0, kept.offset(), kept.offset())])
    assert txn_markers(client, "ce", 2, txn) == Counter({(0, "TXN_COMMIT"): 1, (1, "TXN_COMMIT"): 1})
    assert values(read_parts(client, "ce")) == {0: [b"kept"], 1: [b"plain1"]}
    for i in range(2):
        assert TransactionBuffer(plog(client, "ce", i)).take_snapshot() is True
    assert values(read_parts(client, "ce")) == {0: [b"kept"], 1: [b"plain1"]}
    assert values(read_parts(client, "ce", RU)) == {0: [b"kept", b"unlisted0"], 1: [b"unlisted1", b"plain1"]}


# ---- the TC knows every partition before data lands ---------------------------------------------------------


def test_add_partition_precedes_data(client, monkeypatch):
    client.admin.create_topic("t", 3)
    k = keys_for(3)
    admin = client.admin.transactions
    seen: list[tuple[str, bool]] = []
    orig = PartitionLog.submit_append  # what append and the producers' pipelined appends go through

    def spy(self, records, producer_name=None, guard_app_id=None, **kw):
        most = records.column("txn_most_bits")[0].as_py()
        if most is not None and records.column("type")[0].as_py() == "DATA":
            least = records.column("txn_least_bits")[0].as_py()
            meta = admin.get_transaction_metadata(pulsartx.TxnID(most, least))
            seen.append((str(self.topic), str(self.topic) in meta["partitions"]))
        return orig(self, records, producer_name, guard_app_id, **kw)

    monkeypatch.setattr(PartitionLog, "submit_append", spy)
    p = client.create_producer("t")
    txn = client.new_transaction()
    assert admin.get_transaction_metadata(txn.id)["partitions"] == []
    p.send(b"sync", partition_key=k[0], txn=txn)
    names = [str(TopicName.parse(f"t-partition-{i}")) for i in range(3)]
    assert admin.get_transaction_metadata(txn.id)["partitions"] == names[:1]
    for i in (1, 2, 1):
        p.send_async(f"async{i}".encode(), None, partition_key=k[i], txn=txn)
    p.flush()
    assert admin.get_transaction_metadata(txn.id)["partitions"] == names
    assert sorted(set(seen)) == [(n, True) for n in names]
    txn.commit()
    client.flush()  # markers follow the decision in the background
    assert txn_markers(client, "t", 3, txn) == Counter({(i, "TXN_COMMIT"): 1 for i in range(3)})


# ---- status errors ---------------------------------------------------------------------------------------


def test_using_a_committed_transaction_is_invalid(client):
    client.admin.create_topic("t")
    p = client.create_producer("t")
    txn = client.new_transaction()
    p.send(b"x", txn=txn)
    txn.commit()
    for attempt in (lambda: p.send(b"late", txn=txn), lambda: p.send_async(b"late", None, txn=txn), txn.abort):
        with pytest.raises(InvalidTxnStatusError) as e:
            attempt()
        assert type(e.value) is InvalidTxnStatusError  # not "expired": it ended normally
    txn.commit()  # committing again is an idempotent retry (PIP-254): it returns quietly
    assert txn.state is TransactionState.COMMITTED
    assert read(client, "t", RU) == [b"x"] and read(client, "t") == [b"x"]


def test_fenced_transaction_fails_sends_and_its_data_stays_invisible(root):
    old = pulsartx.Client(root, transaction_key="app")
    old.admin.create_topic("t")
    p_old = old.create_producer("t")
    txn = old.new_transaction()
    p_old.send(b"before-fence", txn=txn)
    new = pulsartx.Client(root, transaction_key="app")  # re-claims the key: the old epoch is fenced
    with pytest.raises(ExpiredTransactionError, match="fenced"):
        p_old.send(b"after-fence", txn=txn)
    assert txn.state is TransactionState.ABORTED
    for attempt in (txn.commit, lambda: p_old.send(b"again", txn=txn)):
        with pytest.raises(ExpiredTransactionError, match="fenced"):
            attempt()
    with pytest.raises(NotAllowedError):
        old.new_transaction()
    meta = new.admin.transactions.get_transaction_metadata(txn.id)
    assert meta["status"] == "ABORTED" and meta["reason"].startswith("fenced")
    t2 = new.new_transaction()
    new.create_producer("t").send(b"new", txn=t2)
    t2.commit()
    assert read(new, "t") == [b"new"]
    assert read(new, "t", RU) == [b"before-fence", b"new"]
    assert txn_markers(new, "t", 1, txn) == Counter({(0, "TXN_ABORT"): 1})
    old.close()
    new.close()


# ---- maxReadPosition and buffer stats -----------------------------------------------------------------------


def test_buffer_stats_and_max_read_position(client):
    client.admin.create_topic("st", 2)
    k = keys_for(2)
    p = client.create_producer("st")
    admin = client.admin.transactions
    for v in (b"a0", b"a1", b"a2"):
        p.send(v, partition_key=k[0])
    open_txn = client.new_transaction()
    assert p.send(b"o", partition_key=k[0], txn=open_txn).offset() == 3
    p.send(b"a4", partition_key=k[0])
    p.send(b"b0", partition_key=k[1])
    aborted = client.new_transaction()
    p.send(b"x1", partition_key=k[1], txn=aborted)
    p.send(b"x2", partition_key=k[1], txn=aborted)
    aborted.abort()
    client.flush()  # markers follow the decision in the background: this places the marker at 3
    p.send(b"b4", partition_key=k[1])

    def pick(stats):
        return [{key: s[key] for key in ("maxReadPosition", "lastConfirmedEntry", "ongoingTxnSize", "abortedTxnSize",
                                         "lastSnapshotOffset", "endOffset")} for s in stats]

    stats = admin.get_transaction_buffer_stats("st")
    assert [s["partition"] for s in stats] == [str(TopicName.parse(f"st-partition-{i}")) for i in range(2)]
    assert all(s["state"] == "Ready" for s in stats)
    assert pick(stats) == [
        {"maxReadPosition": 2, "lastConfirmedEntry": 4, "ongoingTxnSize": 1, "abortedTxnSize": 0,
         "lastSnapshotOffset": -1, "endOffset": 5},
        {"maxReadPosition": 4, "lastConfirmedEntry": 4, "ongoingTxnSize": 0, "abortedTxnSize": 1,
         "lastSnapshotOffset": -1, "endOffset": 5},
    ]
    inb = admin.get_transaction_in_buffer_stats(open_txn.id, "st")
    assert [(r["state"], r["startPosition"], r["markerPosition"]) for r in inb] == [("ONGOING", 3, None),
                                                                                     ("NONE", None, None)]
    assert inb[0]["txn_id"] == str(open_txn.id)
    assert [(r["state"], r["markerPosition"]) for r in admin.get_transaction_in_buffer_stats(str(aborted.id), "st")] \
        == [("NONE", None), ("ABORTED", 3)]
    open_txn.commit()
    client.flush()  # marker at 5
    inb = admin.get_transaction_in_buffer_stats(open_txn.id, "st")
    assert [(r["state"], r["startPosition"], r["markerPosition"]) for r in inb] == [("COMMITTED", None, 5),
                                                                                     ("NONE", None, None)]
    assert pick(admin.get_transaction_buffer_stats("st"))[0] == {
        "maxReadPosition": 5, "lastConfirmedEntry": 5, "ongoingTxnSize": 0, "abortedTxnSize": 0,
        "lastSnapshotOffset": -1, "endOffset": 6}
    # a snapshot at the end of partition 0, then one more message after it
    assert TransactionBuffer(plog(client, "st", 0)).take_snapshot() is True
    p.send(b"a6", partition_key=k[0])
    assert pick(admin.get_transaction_buffer_stats("st"))[0] == {
        "maxReadPosition": 6, "lastConfirmedEntry": 6, "ongoingTxnSize": 0, "abortedTxnSize": 0,
        "lastSnapshotOffset": 6, "endOffset": 7}
    assert values(read_parts(client, "st")) == {0: [b"a0", b"a1", b"a2", b"o", b"a4", b"a6"], 1: [b"b0", b"b4"]}


# ---- snapshots ----------------------------------------------------------------------------------------------


def test_rebuild_is_snapshot_plus_tail_and_equals_a_full_fold(client):
    client.admin.create_topic("snap")
    p = client.create_producer("snap")
    tb = TransactionBuffer(plog(client, "snap"), snapshot_every_txns=3)
    snapshots = []
    for i in range(10):
        txn = client.new_transaction()
        p.send(f"t{i}a".encode(), txn=txn)
        p.send(f"p{i}".encode())
        p.send(f"t{i}b".encode(), txn=txn)
        txn.abort() if i % 3 == 1 else txn.commit()
        client.flush()  # the marker, written in the background, before the next transaction's data
        s = tb.state()  # folds and snapshots every 3 markers
        snapshots.append(s.snapshot_offset)
        # Snapshots are written in the background, and one due while the previous is still being
        # written waits for the next fold: on a loaded host the offsets below would then move.
        tb.wait_for_snapshot()
    still_open = client.new_transaction()
    p.send(b"open", txn=still_open)
    p.send(b"tail")
    end = plog(client, "snap").end_offset()
    assert end == 10 * 4 + 2
    # snapshots after the 3rd, 6th and 9th marker: the end offsets at those points
    assert sorted(set(snapshots) - {-1}) == [12, 24, 36]
    assert SnapshotStore(client.root, TopicName.parse("snap-partition-0")).load().end_offset == 36

    fresh_log = plog(client, "snap")
    reads = []
    orig = fresh_log.read

    def counting(start, stop, columns=None, **kw):
        t = orig(start, stop, columns, **kw)
        reads.append((start, stop, t.num_rows))
        return t

    fresh_log.read = counting
    rebuilt = TransactionBuffer(fresh_log, snapshot_every_txns=1000).state()
    # The tail only, and of it only the files holding transactional records (t9a, t9b, its marker,
    # "open"): the plain p9 and "tail" are not read, their statistics say they cannot matter.
    assert reads == [(36, end, 4)]
    full = BufferState().fold(plog(client, "snap").read(0, end, columns=FOLD_COLUMNS))
    for attr in ("end_offset", "ongoing", "aborted", "ended", "ranges", "max_read_position"):
        assert getattr(rebuilt, attr) == getattr(full, attr), attr
    assert rebuilt.snapshot_offset == 36 and len(full.ended) == 10 and len(full.aborted) == 3
    assert rebuilt.max_read_position == 39  # just before "open"
    expect = [v for i in range(10) for v in ((f"t{i}a", f"p{i}", f"t{i}b") if i % 3 != 1 else (f"p{i}",))]
    assert read(client, "snap") == [v.encode() for v in expect]
    still_open.commit()
    assert read(client, "snap") == [v.encode() for v in expect] + [b"open", b"tail"]


# ---- stuck transactions --------------------------------------------------------------------------------------


def test_stuck_transaction_blocks_no_longer_than_its_timeout(root):
    """A client dies with a transaction open (it never commits, nobody sweeps). A READ_COMMITTED reader
    polling the partition gets past it within timeout + ~1 s, and the transaction ends ABORTED
    (reader-side resolution)."""
    timeout_ms = 1000
    dead = pulsartx.Client(root)
    dead.admin.create_topic("stuck")
    p = dead.create_producer("stuck")
    p.send(b"before")
    t0 = time.monotonic()
    txn = dead.new_transaction(timeout_ms=timeout_ms)
    p.send(b"stuck", txn=txn)
    p.send(b"after1")
    p.send(b"after2")
    live = pulsartx.Client(root)
    reader = live.create_reader("stuck", MessageId.earliest)
    assert reader.read_next(timeout_millis=2000).data() == b"before"
    blocked = not reader.has_message_available()
    waited_s = time.monotonic() - t0
    got = [reader.read_next(timeout_millis=5000).data() for _ in range(2)]
    elapsed = time.monotonic() - t0
    assert got == [b"after1", b"after2"]
    assert blocked or waited_s >= timeout_ms / 1000  # blocked while the transaction could still commit
    assert timeout_ms / 1000 <= elapsed < timeout_ms / 1000 + 1.5, elapsed
    meta = live.admin.transactions.get_transaction_metadata(txn.id)
    assert meta["status"] == "ABORTED" and meta["reason"] == "timed out"
    assert txn_markers(live, "stuck", 1, txn) == Counter({(0, "TXN_ABORT"): 1})
    with pytest.raises(ExpiredTransactionError):
        txn.commit()
    assert read(live, "stuck") == [b"before", b"after1", b"after2"]
    assert read(live, "stuck", RU) == [b"before", b"stuck", b"after1", b"after2"]
    live.close()
    dead.close()


def test_a_producer_keeps_nothing_of_its_ended_transactions(client):
    """A long-running producer's per-transaction queue state goes when the transaction ends. Fails
    before the fix: one queue key and flush lock per transaction and partition piled up (holding
    every Transaction alive), and each commit scanned them all, so a process's commits got slower
    the longer it ran."""
    client.admin.create_topic("churn", 2)
    p = client.create_producer("churn")
    for i in range(60):
        txn = client.new_transaction()
        p.send_async(f"a{i}".encode(), None, partition_key="a", txn=txn)
        p.send_async(f"b{i}".encode(), None, partition_key="b", txn=txn)
        txn.commit() if i % 3 else txn.abort()
    p.send(b"plain")
    assert set(p._txn_keys) <= {None}
    assert all(k[1] is None for k in p._flush_locks) and len(p._flush_locks) <= 2
    client.flush()
    values = sorted(m.data() for m in client.create_reader("churn", MessageId.earliest))
    assert values == sorted([b"plain"] + [f"{s}{i}".encode() for i in range(60) if i % 3 for s in "ab"])


@pytest.mark.parametrize("appended", [False, True], ids=["rest-queued", "rest-appended"])
def test_commit_refuses_a_transaction_one_of_whose_sends_failed(client, appended):
    """A send that failed in the background (its callback said so) leaves a hole in the
    transaction: commit() must not decide COMMIT over it. As Pulsar's client fails such a commit
    with TransactionHasOperationFailedException, it aborts and raises, and nothing of it shows."""
    from pulsartx.client.result import Result
    from pulsartx.exceptions import TransactionHasOperationFailed
    from pulsartx.storage import faults

    client.admin.create_topic("opfail")
    p = client.create_producer("opfail", batching_max_messages=1000, batching_max_publish_delay_ms=5)
    txn = client.new_transaction()
    results: list[tuple[bytes, Result]] = []
    faults.install([faults.Fault(faults.Op.WRITE, match="opfail/partition-0/part-")])  # one data file write fails
    try:
        for i in range(5):
            p.send_async(b"a%d" % i, lambda r, m, i=i: results.append((b"a%d" % i, r)), txn=txn)
        deadline = time.monotonic() + 10
        while len(results) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        faults.clear()
    assert sorted(results) == [(b"a%d" % i, Result.UnknownError) for i in range(5)]
    for i in range(5):
        p.send_async(b"b%d" % i, lambda r, m, i=i: results.append((b"b%d" % i, r)), txn=txn)
    if appended:
        with pytest.raises(pulsartx.PulsarException):  # flush() reports the earlier failed batch
            p.flush()
        assert sorted(results[5:]) == [(b"b%d" % i, Result.Ok) for i in range(5)]
    with pytest.raises(TransactionHasOperationFailed, match="opfail"):
        txn.commit()
    assert txn.state is TransactionState.ABORTED
    with pytest.raises(InvalidTxnStatusError):  # a retry reports the real outcome (PIP-254)
        txn.commit()
    assert sorted(m for m, _ in results[5:]) == [b"b%d" % i for i in range(5)]
    if not appended:  # still queued: the abort fails them, and none was appended
        assert all(r is not Result.Ok for _, r in results[5:]), results[5:]
    p.send(b"plain")
    client.flush()
    assert read(client, "opfail") == [b"plain"]
