"""Group commit: requests queued by several threads while one holds the log's lock are written in
one Delta commit by the next holder, and each keeps its own check (a failing one fails alone).

Each test holds the lock itself, starts 8 threads, waits until all 8 requests are queued, then
lets go: what follows is deterministic (one group), unlike racing threads. The last section runs
transactions in flight together and bounds their commits instead.
"""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from _procs import count_markers, read_tc_log

import pulsartx
from pulsartx import InitialPosition
from pulsartx.buffer.markers import write_marker
from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import InvalidTxnStatusError, TransactionConflict
from pulsartx.log.partition import build_records, shared_log
from pulsartx.naming import TopicName
from pulsartx.subscription.store import shared_store


def run_queued(lock, queue_len, jobs) -> list:
    """Run ``jobs`` in threads while holding ``lock``; release once all are queued. Returns each
    job's result or exception, in order."""
    out: list = [None] * len(jobs)

    def run(i: int) -> None:
        try:
            out[i] = jobs[i]()
        except Exception as e:
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    with lock:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while queue_len() < len(jobs):
            assert time.monotonic() < deadline, f"{queue_len()} of {len(jobs)} requests queued"
            time.sleep(0.005)
    for t in threads:
        t.join()
    return out


@pytest.fixture
def client(tmp_path):
    c = pulsartx.Client(str(tmp_path / "root"), num_coordinators=1)
    yield c
    c.close()


def test_tc_requests_share_one_commit_and_fail_alone(client):
    tc = client._coordinators().for_txn(TxnID(0, 0))
    tc.open()
    metas = [tc.new_transaction(60_000) for _ in range(8)]
    done = tc.end_transaction(metas[3].txn_id, TxnAction.ABORT)  # registering on it must fail, alone
    assert done.status is TxnStatus.ABORTED
    commits = tc._group.commits
    parts = [f"persistent://public/default/t{i}-partition-0" for i in range(8)]
    jobs = [lambda i=i: tc.add_partitions(metas[i].txn_id, [parts[i]]) for i in range(8)]
    out = run_queued(tc._lock, lambda: len(tc._group._queue), jobs)
    assert tc._group.commits == commits + 1  # seven requests, one commit
    assert isinstance(out[3], InvalidTxnStatusError) and "ABORTED" in str(out[3])
    log = read_tc_log(client.root.url, 0)
    for i, m in enumerate(metas):
        logged = log.get(m.txn_id.least_bits)
        if i == 3:
            assert (logged.status, logged.partitions) == (TxnStatus.ABORTED, frozenset())
        else:
            assert out[i].partitions == frozenset([parts[i]])
            assert (logged.status, logged.partitions) == (TxnStatus.OPEN, frozenset([parts[i]]))


def test_appends_and_markers_to_one_partition_share_one_commit_each_checked_alone(client):
    client.admin.create_topic("m", 1)
    partition = "persistent://public/default/m-partition-0"
    txns = [TxnID(0, 100 + i) for i in range(8)]
    write_marker(client.root, partition, txns[5], TxnAction.COMMIT)  # already there: not written again
    plog = shared_log(client.root, TopicName.parse(partition))
    commits = plog._group.commits
    jobs = [lambda i=i: write_marker(client.root, partition, txns[i], TxnAction.ABORT if i % 2 else TxnAction.COMMIT)
            for i in range(8)]
    # ...and a producer's data append, whose dedup drops what it already persisted (sequence id 0).
    plog.append(build_records([b"d0"], producer_name="p", sequence_ids=[0]), producer_name="p")
    jobs.append(lambda: plog.append(build_records([b"d0", b"d1", b"d2"], producer_name="p", sequence_ids=[0, 1, 2]),
                                    producer_name="p"))
    out = run_queued(plog._append_lock, lambda: len(plog._group._queue), jobs)
    assert plog._group.commits == commits + 2  # the lone data append before, then one group
    assert out[5].version is None and out[5].duplicates == 1
    assert (out[8].offsets[0], out[8].duplicates) == (None, 1)
    offsets = sorted([r.first_offset for i, r in enumerate(out[:8]) if i != 5] + out[8].offsets[1:])
    assert offsets == list(range(2, 11))  # the earlier marker and d0 are 0 and 1; nine more, dense
    assert len({r.version for i, r in enumerate(out) if i != 5}) == 1
    found = Counter({tid: t for (_p, t, tid), _n in count_markers(client.root.url, "m", 1).items()})
    assert found == Counter({t.as_tuple(): ("TXN_ABORT" if i % 2 and i != 5 else "TXN_COMMIT")
                             for i, t in enumerate(txns)})
    assert sum(count_markers(client.root.url, "m", 1).values()) == 8
    values = plog.read(0, plog.end_offset(), columns=["value", "type"]).to_pylist()
    assert [r["value"] for r in values if r["type"] == "DATA"] == [b"d0", b"d1", b"d2"]


def test_cursor_updates_share_one_write_and_fail_alone(client):
    client.admin.create_topic("c", 1)
    p = client.create_producer("c")
    for i in range(8):
        p.send(f"m{i}".encode())
    consumer = client.subscribe("c", "s", initial_position=InitialPosition.Earliest)
    store = shared_store(client.root, TopicName.parse("c").with_partition(0), "s")
    writes = store._cursor_updates.commits
    def pend(i: int):
        def change(c):
            if i == 6:
                raise TransactionConflict("planted conflict")
            c.txn_ack(1000 + i, [i])  # offset i pending in transaction key 1000 + i
            return i
        return lambda: store.update(change)

    out = run_queued(store._lock, lambda: len(store._cursor_updates._queue), [pend(i) for i in range(8)])
    assert store._cursor_updates.commits == writes + 1
    assert isinstance(out[6], TransactionConflict)
    assert [o for i, o in enumerate(out) if i != 6] == [0, 1, 2, 3, 4, 5, 7]
    cursor = store.cursor()
    assert sorted(o for rs in cursor.pending.values() for a, b in rs.ranges() for o in range(a, b + 1)) == [
        0, 1, 2, 3, 4, 5, 7]
    consumer.close()


# ---- background requests linger for company ---------------------------------------------------------
def _recording_group():
    from pulsartx.storage.group_commit import GroupCommit, Write

    commits: list[list] = []
    group = GroupCommit("test", threading.RLock(), commits.append, lambda: None)
    return group, commits, lambda key: group.run(key, lambda: Write([key], key))


def test_a_background_request_rides_in_the_next_foreground_commit():
    """A decided transaction's completion (background) waits up to LINGER_S for the next request of
    its log and shares its commit, instead of a commit of its own."""
    from pulsartx.storage import group_commit

    group, commits, request = _recording_group()

    def completion() -> None:
        with group_commit.background():
            request("final of T1")

    t = threading.Thread(target=completion)
    t.start()
    time.sleep(group_commit.LINGER_S / 4)
    assert commits == []  # still lingering
    request("registration of T2")
    t.join()
    assert commits == [["final of T1", "registration of T2"]]


def test_a_lone_background_request_is_written_after_lingering_and_at_once_when_someone_waits():
    from pulsartx.storage import group_commit

    group, commits, request = _recording_group()
    t0 = time.monotonic()
    with group_commit.background():
        request("alone")
    assert commits == [["alone"]] and time.monotonic() - t0 >= group_commit.LINGER_S * 0.9

    def completion() -> None:
        with group_commit.background():
            request("awaited")

    with group_commit.urgent():  # a flush is waiting: nothing lingers
        t0 = time.monotonic()
        t = threading.Thread(target=completion)
        t.start()
        t.join()
        assert time.monotonic() - t0 < group_commit.LINGER_S
    assert commits[-1] == ["awaited"]


def test_back_to_back_transactional_acks_fold_the_previous_completion_into_the_next_commits(client):
    """A consumer acknowledging in transactions back to back: the previous transaction's
    pending-ack commit and final record ride in the next transaction's acknowledgement and TC
    writes, so each transaction costs its three commits on the critical path and nearly nothing after."""
    client.admin.create_topic("ft", 1)
    p = client.create_producer("ft")
    for i in range(41):
        p.send(f"m{i}".encode())
    cons = client.subscribe("ft", "s", initial_position=InitialPosition.Earliest)
    tc = client._coordinators().tc(0)
    store = shared_store(client.root, TopicName.parse("ft").with_partition(0), "s")
    txn = client.new_transaction()
    cons.acknowledge_cumulative(cons.receive(5000), txn=txn)
    txn.commit()
    client.flush()
    tc_commits, cursor_commits = tc._group.commits, store._cursor_updates.commits
    for _ in range(40):
        txn = client.new_transaction()
        cons.acknowledge_cumulative(cons.receive(5000), txn=txn)
        txn.commit()
    client.flush()
    # 2 TC commits (registration, decision) and 1 cursor write per transaction; the completions'
    # own commits (2 more per transaction when each is written alone: 80 and 120) are a few at most
    assert tc._group.commits - tc_commits <= 2 * 40 + 10
    assert store._cursor_updates.commits - cursor_commits <= 40 + 10
    [st] = client.admin.transactions.get_pending_ack_stats("ft", "s")
    assert (st["markDeletePosition"], st["pendingAckCount"]) == (40, 0)


# ---- transactions in flight together share commits ------------------------------------------------------
def test_one_producers_batches_queued_together_share_a_commit_each_deduplicated_behind_the_ones_before(client):
    """A producer's batches of different transactions, queued one after the other while a commit
    is in flight, are written in the next commit together; each is deduplicated against the ones
    before it in that commit as if they had been committed one by one."""
    client.admin.create_topic("pp", 1)
    plog = shared_log(client.root, TopicName.parse("persistent://public/default/pp-partition-0"))
    plog.append(build_records([b"x"], producer_name="p", sequence_ids=[0]), producer_name="p")
    commits = plog._group.commits
    batches = [([b"a1", b"a2"], [1, 2]), ([b"b2", b"b3"], [2, 3]), ([b"c3"], [3]), ([b"d4"], [4])]
    with plog._append_lock:  # a commit in flight: the batches queue behind it
        requests = [plog.submit_append(build_records(v, producer_name="p", sequence_ids=s), producer_name="p")
                    for v, s in batches]
    out = [plog.wait_append(r) for r in requests]
    assert plog._group.commits == commits + 1
    assert [(r.offsets, r.duplicates) for r in out] == [([1, 2], 0), ([None, 3], 1), ([None], 1), ([4], 0)]
    assert out[0].version == out[1].version == out[3].version and out[2].version is None
    assert plog.last_sequence_id("p") == 4
    values = plog.read(0, plog.end_offset(), columns=["value"]).column("value").to_pylist()
    assert values == [b"x", b"a1", b"a2", b"b3", b"d4"]


def test_many_transactions_through_one_producer_share_partition_commits(client):
    """Eight transactions sending through one producer to one partition at once: their data
    appends queue together behind a commit in flight and are written in one commit (a producer's
    appends used to wait for each other's round trips, one commit each)."""
    client.admin.create_topic("mt", 1)
    producer = client.create_producer("mt", batching_max_publish_delay_ms=60_000)
    plog = shared_log(client.root, TopicName.parse("persistent://public/default/mt-partition-0"))
    txns = [client.new_transaction() for _ in range(8)]
    for i, txn in enumerate(txns):
        producer.send_async(f"m{i}".encode(), None, txn=txn)
        txn._register_partitions({str(plog.topic)})  # registered now: the flushes below only append
    commits = plog._group.commits
    jobs = [lambda t=t: producer.flush_transaction(t, registered=True) for t in txns]
    out = run_queued(plog._append_lock, lambda: len(plog._group._queue), jobs)
    assert out == [None] * 8
    assert plog._group.commits == commits + 1
    for txn in txns:
        txn.commit()
    client.flush()
    reader = client.create_reader("mt", pulsartx.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(5000).data())
    assert sorted(got) == [f"m{i}".encode() for i in range(8)]


class _CountingLock:
    """An RLock that counts the threads that took it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.taken: Counter = Counter()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        ok = self._lock.acquire(blocking, timeout)
        if ok:
            self.taken[threading.current_thread().name] += 1
        return ok

    def release(self) -> None:
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self.release()


@pytest.mark.parametrize("combiner", ["group commit", "cursor combiner"])
def test_requests_written_by_another_threads_commit_return_without_taking_the_lock(combiner):
    """Flat combining: of eight requests queued behind a commit in flight, one thread leads the next
    commit and the other seven return once it has written theirs, without taking the log's lock
    one after the other (that convoy put a thread switch per request between two commits)."""
    from pulsartx.storage.group_commit import Combiner, GroupCommit, Write

    lock = _CountingLock()
    commits: list[list] = []
    if combiner == "group commit":
        group = GroupCommit("test", lock, commits.append, lambda: None)
        request = lambda i: group.run(i, lambda: Write([i], i))  # noqa: E731
    else:
        def apply_all(changes: list) -> list:
            commits.append(changes)
            return [(True, c) for c in changes]
        group = Combiner(lock, apply_all)
        request = group.run
    names = [f"request-{i}" for i in range(8)]
    out: list = [None] * 8

    def run(i: int) -> None:
        out[i] = request(i)

    threads = [threading.Thread(target=run, args=(i,), name=names[i]) for i in range(8)]
    with lock:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len(group._queue) < 8:
            assert time.monotonic() < deadline
            time.sleep(0.005)
    for t in threads:
        t.join()
    assert out == list(range(8)) and commits == [list(range(8))]
    # the leader; at most one more if a waiter's safety-net poll found the lock free first
    assert 1 <= sum(lock.taken[n] for n in names) <= 2


def test_transactions_in_flight_together_share_tc_and_partition_commits(tmp_path):
    """Sixteen threads running transactions back to back through one client, under a store latency
    that makes their requests overlap (as on an object store): their registrations, decisions and
    final records share TC-log commits, their data and markers partition commits, and every message
    is read exactly once. Bounds, not exact counts (threads race): one commit per transaction
    written alone is 3 on the TC log and 2 per partition."""
    from pulsartx.storage import faults

    c = pulsartx.Client(str(tmp_path / "root"), num_coordinators=1)
    try:
        for t in ("fa", "fb"):
            c.admin.create_topic(t, 1)
        producers = [c.create_producer(t) for t in ("fa", "fb")]
        tc = c._coordinators().tc(0)
        tc.open()
        logs = [shared_log(c.root, TopicName.parse(f"persistent://public/default/{t}-partition-0")) for t in ("fa", "fb")]
        for p in producers:  # open the partitions' writers
            p.send(b"warm")
        before = tc._group.commits, [lg._group.commits for lg in logs]
        sent: list[bytes] = []

        def loop(i: int) -> None:
            for j in range(3):
                txn = c.new_transaction()
                for k in range(4):
                    body = f"{i}:{j}:{k}".encode()
                    producers[k % 2].send_async(body, None, txn=txn)
                    sent.append(body)
                txn.commit()

        faults.install(faults.store_latency(10, 30))
        try:
            threads = [threading.Thread(target=loop, args=(i,)) for i in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            c.flush()
        finally:
            faults.clear()
        txns = 16 * 3
        tc_commits = tc._group.commits - before[0]
        part_commits = [lg._group.commits - b for lg, b in zip(logs, before[1], strict=True)]
        assert tc_commits <= txns, tc_commits  # 3 per transaction alone
        assert all(n <= txns for n in part_commits), part_commits  # 2 per transaction alone
        got = Counter()
        for t in ("fa", "fb"):
            reader = c.create_reader(t, pulsartx.MessageId.earliest)
            while reader.has_message_available():
                got[reader.read_next(5000).data()] += 1
        assert got == Counter(sent + [b"warm", b"warm"])
    finally:
        c.close()


def test_many_threads_requests_are_each_written_once_whoever_leads():
    """Leadership under churn: threads submitting back to back (some from inside the log's lock,
    as a TC's own locked paths do) each get their answer, and each request is written exactly once."""
    import random

    from pulsartx.storage.group_commit import GroupCommit, Write

    lock = threading.RLock()
    written: list = []

    def write(items: list) -> None:
        time.sleep(random.random() / 1000)
        written.extend(items)

    group = GroupCommit("test", lock, write, lambda: None)
    errors: list = []

    def loop(t: int) -> None:
        for j in range(100):
            key = (t, j)
            try:
                if j % 10 == 0:
                    with lock:
                        got = group.run(key, lambda k=key: Write([k], k))
                else:
                    got = group.run(key, lambda k=key: Write([k], k))
                assert got == key
            except Exception as e:
                errors.append(e)

    threads = [threading.Thread(target=loop, args=(t,)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(written) == [(t, j) for t in range(16) for j in range(100)]
    assert group.requests == 1600


def test_an_unknown_outcome_reaches_every_request_of_its_commit_and_a_failed_check_only_its_own():
    """Whoever leads, each waiter gets its own request's answer: the commit's unknown outcome for
    every request written in it, a failed check's own error for that one request alone."""
    from pulsartx.storage import delta
    from pulsartx.storage.group_commit import GroupCommit, Write

    lock = threading.RLock()
    unknown = delta.OutcomeUnknown("planted: the commit may or may not have landed")

    def write(items: list) -> None:
        raise unknown

    group = GroupCommit("test", lock, write, lambda: None)

    def plan(i: int):
        if i == 2:
            raise InvalidTxnStatusError("planted: request 2's own check")
        return Write([i], i)

    out = run_queued(lock, lambda: len(group._queue), [lambda i=i: group.run(i, lambda: plan(i)) for i in range(8)])
    assert isinstance(out[2], InvalidTxnStatusError)
    assert all(out[i] is unknown for i in range(8) if i != 2)
    assert group.commits == 0


def test_markers_asking_together_share_one_catch_up_probe(client, monkeypatch):
    """A marker probes, outside the append lock, whether other writers appended since our last look
    (two requests). Markers that ask while a probe is running wait for the next one and share it:
    eight markers at once cost two probes, not eight."""
    import types

    from pulsartx.log import partition as partition_mod

    client.admin.create_topic("pr", 1)
    plog = shared_log(client.root, TopicName.parse("persistent://public/default/pr-partition-0"))
    plog.append(build_records([b"x"]))  # opens the writer
    waiting = [0]

    class CountingEvent(threading.Event):
        def wait(self, timeout=None):
            waiting[0] += 1
            return super().wait(timeout)

    monkeypatch.setattr(partition_mod, "threading", types.SimpleNamespace(Lock=threading.Lock, Event=CountingEvent))
    release, probes = threading.Event(), []
    plain = partition_mod.PartitionLog._probe_behind

    def probe(self):
        probes.append(threading.current_thread().name)
        if len(probes) == 1:
            assert release.wait(30)
        return plain(self)

    monkeypatch.setattr(partition_mod.PartitionLog, "_probe_behind", probe)
    out: list = [None] * 8

    def ask(i: int) -> None:
        out[i] = plog._behind()

    first = threading.Thread(target=ask, args=(0,), name="marker-0")
    first.start()
    deadline = time.monotonic() + 30
    while not probes:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    others = [threading.Thread(target=ask, args=(i,), name=f"marker-{i}") for i in range(1, 8)]
    for t in others:
        t.start()
    while waiting[0] < 7:  # all seven wait on the running probe, which began before they asked
        assert time.monotonic() < deadline
        time.sleep(0.005)
    release.set()
    for t in [first, *others]:
        t.join()
    assert len(probes) == 2 and out == [False] * 8  # nobody else appended: no catch-up needed
