"""Commit at the decision point: ``commit()``/``abort()`` return once the decision is durable in the
TC log, and the markers, acknowledgement commits and final entry follow in the background.

What must hold, with real processes (SIGKILL) and real storage:
  * read-your-writes across processes: once ``commit()`` returned in process A, process B's
    READ_COMMITTED readers and consumers see all of it, on every partition and subscription, with
    no marker written; an acknowledgement committed in it is never redelivered; after ``abort()``
    nothing of it is visible and its acknowledged messages come back;
  * a process killed right after ``commit()``/``abort()`` returned leaves a transaction that any
    TC opening the log finishes;
  * retrying ``commit()``/``abort()`` after an unknown outcome reports exactly the real outcome;
  * TxnIDs leased in blocks are never issued twice, across processes, kills and compaction;
  * a commit racing a timeout abort from another process: exactly one wins, everywhere;
  * many threads on one TC: their requests share TC-log commits (group commit), and every
    outcome is the one the caller was told.
"""
from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
from _procs import Child, count_markers, read_tc_log
from _reads import committed_values

import pulsartx
from pulsartx import InitialPosition, MessageId
from pulsartx.coordinator.coordinator import now_ms
from pulsartx.coordinator.state import TxnStatus
from pulsartx.coordinator.tclog import tc_segments
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import InvalidTxnStatusError, StorageError, Timeout, TransactionConflict
from pulsartx.log.partition import shared_log
from pulsartx.naming import TopicName
from pulsartx.storage import delta, faults
from pulsartx.storage.faults import Fault, Mode, Op

SOURCE, SINK, SUBS, ACKED, TOTAL = "src", "sink", ["s-cum", "s-list"], 6, 10


pytestmark = pytest.mark.usefixtures("no_faults")  # the fixture is in conftest.py


def _seed(root: str) -> pulsartx.Client:
    client = pulsartx.Client(root)
    client.admin.create_topic(SOURCE, partitions=1)
    client.admin.create_topic(SINK, partitions=3)
    p = client.create_producer(SOURCE)
    for i in range(TOTAL):
        p.send(f"in-{i}".encode())
    for sub in SUBS:  # subscriptions exist before process A acknowledges on them
        client.subscribe(SOURCE, sub, initial_position=InitialPosition.Earliest).close()
    return client


def _drain(consumer, timeout_ms: int = 300) -> list[bytes]:
    out = []
    while True:
        try:
            m = consumer.receive(timeout_ms)
        except Timeout:
            return out
        out.append(m.data())
        consumer.acknowledge(m)


@pytest.mark.parametrize("action", ["COMMIT", "ABORT"])
def test_another_process_sees_the_outcome_at_once_and_recovery_finishes_it(tmp_path, action):
    root = str(tmp_path / "root")
    client = _seed(root)
    go = str(tmp_path / "go")
    a = Child("end_and_hang", root=root, source=SOURCE, sink=SINK, subs=SUBS, acked=ACKED, action=action, go_file=go)
    txn = TxnID(*a.wait_event("sent")["txn"])
    # B polls while the transaction is open: nothing of it shows, and nothing it acknowledged comes
    reader = client.create_reader(SINK, MessageId.earliest)
    assert not reader.has_message_available()
    assert committed_values(client, SINK) == []
    open(go, "w").close()
    ended = a.wait_event("ended")
    assert ended == {"state": "COMMITTED" if action == "COMMIT" else "ABORTED", "stalled": True}
    # A's completer is stalled: no marker exists, the TC log says COMMITTING/ABORTING
    assert count_markers(root, SINK, 3) == Counter()
    assert read_tc_log(root, txn.most_bits)[txn.least_bits].status is (
        TxnStatus.COMMITTING if action == "COMMIT" else TxnStatus.ABORTING)
    expected_out = sorted(f"out-{i}".encode() for i in range(3)) if action == "COMMIT" else []
    # the reader that polled before the decision, a fresh one, and consumers, all at once (no sleep)
    seen = []
    while reader.has_message_available():
        seen.append(reader.read_next(1000).data())
    assert sorted(seen) == expected_out
    assert sorted(committed_values(client, SINK)) == expected_out
    remaining = [f"in-{i}".encode() for i in range(ACKED if action == "COMMIT" else 0, TOTAL)]
    for sub in SUBS:
        c = client.subscribe(SOURCE, sub, initial_position=InitialPosition.Earliest)
        got = _drain(c, timeout_ms=2000 if action == "ABORT" else 300)
        # committed acks never come back; aborted ones all do, once each (redelivered ones may come later)
        assert sorted(got) == sorted(remaining), sub
        c.close()
    a.sigkill()
    # any process that opens the TC log finishes what A left
    fresh = pulsartx.Client(root)
    res = fresh._coordinators().tc(txn.most_bits).sweep(grace_ms=0)
    assert res.completed == 1
    kind = "TXN_COMMIT" if action == "COMMIT" else "TXN_ABORT"
    assert count_markers(root, SINK, 3) == Counter({(i, kind, tuple(txn.as_tuple())): 1 for i in range(3)})
    meta = read_tc_log(root, txn.most_bits)[txn.least_bits]
    assert meta.status is (TxnStatus.COMMITTED if action == "COMMIT" else TxnStatus.ABORTED)
    assert sorted(committed_values(fresh, SINK)) == expected_out
    for sub in SUBS:  # the recovered acknowledgements: the same messages remain, no more, no fewer
        c = fresh.subscribe(SOURCE, sub, initial_position=InitialPosition.Earliest)
        assert _drain(c) == []  # B acknowledged the rest above; recovery brings nothing back
        c.close()
    for c in (client, fresh):
        c.close()


def test_commit_retry_after_a_lost_decision_reply_reports_committed_once(tmp_path, monkeypatch):
    """The COMMITTING entry is written, but its put answers an error and every read-back fails too
    (the commit file and the table): the outcome is unknown, and commit() says so. ``commit()``
    again asks the TC and returns; nothing is duplicated. (With the table readable, the first
    commit() itself re-reads the log and returns: ``test_keyed_log_faults`` covers that.)"""
    root = str(tmp_path / "root")
    client = pulsartx.Client(root, num_coordinators=1)
    client.admin.create_topic("t", partitions=2)
    p = client.create_producer("t")
    txn = client.new_transaction()
    monkeypatch.setenv(delta.RETRY_ENV, "0.5")  # how long the read-back is tried before "unknown"
    for i in range(4):
        p.send(f"m{i}".encode(), partition_key=str(i), txn=txn)
    log_dir = "/".join(tc_segments(0)) + "/_delta_log"
    faults.install([Fault(Op.CREATE, Mode.LOST, match=log_dir), Fault(Op.READ, match=log_dir, times=10_000),
                    Fault(Op.DELTA, match="/".join(tc_segments(0)), times=10_000)])
    with pytest.raises(StorageError, match="unknown|could not be re-read"):
        txn.commit()
    faults.clear()
    assert txn.state.value == "ERROR"
    assert read_tc_log(root, 0)[txn.id.least_bits].status is TxnStatus.COMMITTING  # it did land
    txn.commit()  # the retry learns the real outcome: committed
    assert txn.state.value == "COMMITTED"
    txn.commit()  # and again: quietly
    client.flush()
    assert sorted(committed_values(client, "t")) == [f"m{i}".encode() for i in range(4)]
    assert sum(count_markers(root, "t", 2).values()) == 2
    client.close()


def _commit_whose_decision_write_fails(root: str):
    """A client with a one-message transaction whose commit() failed before COMMITTING was written."""
    client = pulsartx.Client(root, num_coordinators=1)
    client.admin.create_topic("t")
    txn = client.new_transaction()
    client.create_producer("t").send(b"x", txn=txn)
    faults.install([Fault(Op.CREATE, Mode.ERROR, match="/".join(tc_segments(0)) + "/_delta_log")])
    with pytest.raises(StorageError):
        txn.commit()
    faults.clear()
    return client, txn


def test_commit_retry_after_a_failed_decision_write_commits_now(tmp_path):
    """The COMMITTING put failed before anything was written: the retry decides now."""
    root = str(tmp_path / "root")
    client, txn = _commit_whose_decision_write_fails(root)
    assert read_tc_log(root, 0)[txn.id.least_bits].status is TxnStatus.OPEN
    txn.commit()
    client.flush()
    assert committed_values(client, "t") == [b"x"]
    client.close()


def test_commit_retry_after_it_was_aborted_elsewhere_names_the_abort(tmp_path):
    root = str(tmp_path / "root")
    client, txn = _commit_whose_decision_write_fails(root)
    pulsartx.Client(root).admin.transactions.abort_transaction(str(txn.id))
    with pytest.raises(InvalidTxnStatusError, match="ABORT"):
        txn.commit()
    txn.abort()  # what happened: quietly
    client.flush()
    assert committed_values(client, "t") == []
    client.close()


def test_commit_after_an_ack_conflict_raises_the_conflict_again(tmp_path):
    root = str(tmp_path / "root")
    client = pulsartx.Client(root)
    client.admin.create_topic("t")
    client.create_producer("t").send(b"x")
    c = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
    m = c.receive(5000)
    c.acknowledge(m)
    c._flush_acks()
    txn = client.new_transaction()
    with pytest.raises(TransactionConflict):
        c.acknowledge(m, txn=txn)
    for _ in range(2):
        with pytest.raises(TransactionConflict):
            txn.commit()
    txn.abort()
    client.close()


def test_commit_async_and_abort_async_complete_at_the_decision(tmp_path):
    root = str(tmp_path / "root")
    client = pulsartx.Client(root)
    client.admin.create_topic("t")
    p = client.create_producer("t")
    t1, t2 = client.new_transaction(), client.new_transaction()
    p.send(b"keep", txn=t1)
    p.send(b"drop", txn=t2)
    f1, f2 = t1.commit_async(), t2.abort_async()
    assert f1.result(30) is None and f2.result(30) is None
    assert committed_values(client, "t") == [b"keep"]
    assert client.flush(30) is True
    assert count_markers(root, "t", 1) == Counter({(0, "TXN_COMMIT", tuple(t1.id.as_tuple())): 1,
                                                   (0, "TXN_ABORT", tuple(t2.id.as_tuple())): 1})
    client.close()


def test_txnid_blocks_never_reissue_an_id_across_processes_kills_and_compaction(tmp_path):
    root = str(tmp_path / "root")
    setup = pulsartx.Client(root, num_coordinators=2)
    setup.admin.create_topic("ids")
    assert setup._coordinators().count == 2
    cfg = {"id_block_size": 7, "compact_every": 4, "finished_retention_ms": 0}
    seen: list[tuple[int, int]] = []
    rng = random.Random(5)
    for _ in range(3):
        children = [Child("id_worker", root=root, n=20, cfg=cfg) for _ in range(3)]
        victim = children[rng.randrange(3)]
        for _ in range(rng.randrange(2, 9)):  # killed part-way through a block
            seen.append(tuple(victim.wait_event("id")))
        victim.sigkill()
        for c in children:
            if c is not victim:
                seen.extend(tuple(i) for i in c.result())
    assert len(seen) == len(set(seen)), sorted(k for k, n in Counter(seen).items() if n > 1)
    assert {most for most, _ in seen} == {0, 1}
    kept = len(read_tc_log(root, 0)) + len(read_tc_log(root, 1))
    assert kept < len(seen)  # compaction trimmed finished ones, and still no id came back


def test_commit_racing_a_timeout_abort_from_another_process_has_one_winner(tmp_path):
    root = str(tmp_path / "root")
    client = pulsartx.Client(root, num_coordinators=1)
    client.admin.create_topic("race", partitions=2)
    p0, p1 = (client.create_producer(n) for n in client.get_topic_partitions("race"))
    outcomes = Counter()
    for round_ in range(12):
        txn = client.new_transaction(timeout_ms=60_000)
        p0.send(f"a{round_}".encode(), txn=txn)
        p1.send(f"b{round_}".encode(), txn=txn)
        go = str(tmp_path / f"go{round_}")
        sweeper = Child("sweeper", root=root, stop_file=go + ".stop", go_file=go, pause_ms=0,
                        cfg={"recovery_grace_ms": 0})
        open(go, "w").close()  # another process sweeps meanwhile; a third aborts with a clock past the deadline
        try:
            fake = pulsartx.Client(root)._coordinators().tc(0)
            barrier = threading.Barrier(2)
            result = {}

            def abort_it(fake=fake, txn=txn, barrier=barrier, result=result):
                barrier.wait()
                try:
                    result["abort"] = fake.abort_expired(txn.id, now=now_ms() + 120_000).status.value
                except Exception as e:
                    result["abort"] = type(e).__name__

            t = threading.Thread(target=abort_it)
            t.start()
            barrier.wait()
            try:
                txn.commit()
                committed = True
            except InvalidTxnStatusError:
                committed = False
            t.join()
        finally:
            open(go + ".stop", "w").close()
            sweeper.result()
        client.flush()
        final = read_tc_log(root, 0)[txn.id.least_bits].status
        kinds = {k for (_, k, t_), n in count_markers(root, "race", 2).items() if t_ == tuple(txn.id.as_tuple())}
        if committed:
            assert final is TxnStatus.COMMITTED and kinds == {"TXN_COMMIT"}
        else:
            assert final is TxnStatus.ABORTED and kinds == {"TXN_ABORT"}
        outcomes[committed] += 1
    values = committed_values(client, "race")
    assert len(values) == 2 * outcomes[True] and len(set(values)) == len(values)
    client.close()


def test_eight_threads_on_one_tc_each_get_the_true_outcome(tmp_path):
    root = str(tmp_path / "root")
    client = pulsartx.Client(root, num_coordinators=1)
    client.admin.create_topic("g", partitions=4)
    producer = client.create_producer("g")
    told: dict[TxnID, tuple[str, bytes | None]] = {}
    lock = threading.Lock()

    def worker(w: int) -> None:
        rng = random.Random(w)
        for i in range(100):
            txn = client.new_transaction()
            value = None
            if rng.random() < 0.7:
                value = f"{w}:{i}".encode()
                producer.send(value, partition_key=str(rng.randrange(16)), txn=txn)
            action = "commit" if rng.random() < 0.6 else "abort"
            txn.commit() if action == "commit" else txn.abort()
            with lock:
                told[txn.id] = (action, value)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert client.flush(60)
    assert len(told) == 800
    group = client._coordinators().for_txn(TxnID(0, 0))._group
    # Group commit: concurrent requests shared TC-log commits (each still got its own outcome below).
    assert group.commits < group.requests, (group.commits, group.requests)
    markers = [shared_log(client.root, TopicName.parse(f"g-partition-{i}"))._group for i in range(4)]
    # ...and so did the completer threads' markers to the same partition.
    assert sum(m.commits for m in markers) < sum(m.requests for m in markers), [(m.commits, m.requests) for m in markers]
    log = read_tc_log(root, 0)
    for txn_id, (action, _) in told.items():
        m = log.get(txn_id.least_bits)
        assert m is not None and m.status is (TxnStatus.COMMITTED if action == "commit" else TxnStatus.ABORTED)
    expected = sorted(v for action, v in told.values() if action == "commit" and v is not None)
    assert sorted(committed_values(client, "g")) == expected
    client.close()
