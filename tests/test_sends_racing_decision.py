"""Sends racing their own transaction's commit() from other threads: each belongs to the
transaction or fails, and READ_COMMITTED readers see exactly the sends that reported success."""
from __future__ import annotations

import threading
import time

import pytest
from test_txn_produce import read_all, slow_producer  # tests/ is on sys.path (conftest)

import pulsartx
from pulsartx.client.transaction import Transaction
from pulsartx.exceptions import PulsarException

pytestmark = pytest.mark.parametrize("storage", ["local"], indirect=True)


def hold_decision_and_sender(monkeypatch, committer: str, sender: str
                             ) -> tuple[threading.Event, threading.Event, threading.Event, threading.Event]:
    """Hold the thread named ``committer`` just before its transaction's commit decision
    (``Transaction._end``), and the thread named ``sender`` just after its append's last check
    (``Transaction._before_append``). Returns (at_decision, decide, checked, append): each hold
    sets the first of its pair and waits for the second."""
    at_decision, decide = threading.Event(), threading.Event()
    checked, append = threading.Event(), threading.Event()
    real_end, real_before = Transaction._end, Transaction._before_append

    def end(self, action):
        if threading.current_thread().name == committer and action.value == "COMMIT":
            at_decision.set()
            assert decide.wait(30)
        return real_end(self, action)

    def before(self, partition, registered=False):
        out = real_before(self, partition, registered)
        if threading.current_thread().name == sender:
            checked.set()
            assert append.wait(30)
        return out

    monkeypatch.setattr(Transaction, "_end", end)
    monkeypatch.setattr(Transaction, "_before_append", before)
    return at_decision, decide, checked, append


def test_send_checked_before_the_decision_and_appended_after_it_is_not_lost(root, monkeypatch):
    """One thread sends a message of the transaction while another commits it. The send passes the
    transaction's OPEN check (and the TC's) after commit() flushed its producers and before the
    decision; its append then lands after the decision and the commit marker. The send reports
    success, so the message must be visible with the transaction; the alternative is that the
    send fails. A success whose message is never visible (a straggler behind its own marker) is a
    lost message."""
    committer_name = "review-committer"
    at_decision, decide, checked, append = hold_decision_and_sender(monkeypatch, committer_name, "review-sender")
    client = pulsartx.Client(root)
    prod = slow_producer(client, "one")
    txn = client.new_transaction()
    prod.send(b"first", txn=txn)  # registered and appended

    committer = threading.Thread(target=lambda: out_commit.append(_catch(txn.commit)), name=committer_name)
    out_commit: list[object] = []
    committer.start()
    assert at_decision.wait(30)  # commit() flushed its producers; its decision is next
    out_send: list[object] = []
    sender = threading.Thread(target=lambda: out_send.append(_catch(lambda: prod.send(b"late", txn=txn))),
                              name="review-sender")
    sender.start()
    assert checked.wait(30)  # the send found the transaction OPEN, here and at the TC
    decide.set()
    committer.join(2)  # the decision (a fixed commit may wait for the append in flight instead)
    if not committer.is_alive():
        client.flush()  # the commit marker is written
    append.set()
    sender.join(30)
    committer.join(30)
    client.flush()
    assert out_commit == [None] and txn.state.value == "COMMITTED"
    visible = read_all(client, "one", 1)
    if isinstance(out_send[0], BaseException):
        assert isinstance(out_send[0], PulsarException) and visible == [b"first"]
    else:
        assert visible == [b"first", b"late"], "the send succeeded, but its message is not visible"
    client.close()


def _catch(fn):
    try:
        return fn()
    except BaseException as e:
        return e


def test_senders_racing_commit_see_exactly_their_successes(root):
    """Several threads, some sharing a producer, send synchronously and asynchronously to one
    transaction over 3 partitions (keyed, so batches fill side by side and early registrations
    fire), and keep sending while another thread commits. Afterwards READ_COMMITTED shows exactly
    the messages whose send reported success, each once; every other send was reported failed."""
    client = pulsartx.Client(root)
    client.admin.create_topic("race", 3)
    shared = client.create_producer("race", batching_max_messages=150, batching_max_publish_delay_ms=5)
    own = [client.create_producer("race", batching_max_messages=150, batching_max_publish_delay_ms=5)
           for _ in range(2)]
    expected: list[bytes] = []
    for r in range(3):
        expected += _race_round(client, r, [("s1", shared, 37), ("s2", shared, 53), ("o1", own[0], 41),
                                            ("o2", own[1], 10_000)])
    visible = read_all(client, "race", 3)
    assert len(visible) == len(set(visible))
    assert sorted(visible) == sorted(expected)
    client.close()


def _race_round(client, r: int, senders) -> list[bytes]:
    """One transaction sent to by ``senders`` (name, producer, every how many a sync send) while
    it commits; the messages whose send reported success."""
    txn = client.new_transaction()
    results: dict[bytes, object] = {}
    attempted: list[bytes] = []
    lock = threading.Lock()
    committing = threading.Event()

    def record(v: bytes, res: object) -> None:
        with lock:
            results[v] = res

    def sender(name: str, prod, sync_every: int) -> None:
        i = 0
        while not (committing.is_set() and i > 2000):
            v = b"%d-%s-%d" % (r, name.encode(), i)
            with lock:
                attempted.append(v)
            try:
                if i % sync_every == 0:
                    prod.send(v, partition_key=v.decode(), txn=txn)
                    record(v, pulsartx.Result.Ok)
                else:
                    prod.send_async(v, lambda res, _mid, v=v: record(v, res), partition_key=v.decode(), txn=txn)
            except PulsarException as e:
                record(v, e)
                return
            i += 1

    threads = [threading.Thread(target=sender, args=s) for s in senders]
    for t in threads:
        t.start()
    time.sleep(0.3)
    committing.set()
    txn.commit()
    for t in threads:
        t.join(60)
    for prod in {id(s[1]): s[1] for s in senders}.values():
        try:
            prod.flush()
        except PulsarException:
            pass
    client.flush()
    with lock:
        assert sorted(results) == sorted(attempted)  # every send was answered
        return [v for v, res in results.items() if res == pulsartx.Result.Ok]


def test_an_append_in_flight_that_fails_while_commit_waits_for_it_aborts_the_transaction(root, monkeypatch):
    """A send passes its checks after commit() flushed the producers and before the decision, so
    the decision waits for its append; that append then fails (a storage error, its sender told
    so). The transaction must not commit without it: commit() raises
    TransactionHasOperationFailed, and nothing of the transaction is visible."""
    from pulsartx.exceptions import TransactionHasOperationFailed
    from pulsartx.storage import faults
    from pulsartx.storage.faults import Fault, Op

    at_decision, decide, checked, append = hold_decision_and_sender(monkeypatch, "committer", "failing-sender")
    client = pulsartx.Client(root)
    prod = slow_producer(client, "one")
    txn = client.new_transaction()
    prod.send(b"first", txn=txn)
    out_commit: list[object] = []
    committer = threading.Thread(target=lambda: out_commit.append(_catch(txn.commit)), name="committer")
    committer.start()
    assert at_decision.wait(30)  # the producers are flushed; the decision is next
    out_send: list[object] = []
    sender = threading.Thread(target=lambda: out_send.append(_catch(lambda: prod.send(b"late", txn=txn))),
                              name="failing-sender")
    sender.start()
    assert checked.wait(30)  # past its checks, counted: the decision waits for it
    faults.install([Fault(Op.WRITE, match="partition-0/part-")])
    try:
        decide.set()
        time.sleep(0.5)
        assert committer.is_alive()  # waiting for the append in flight
        append.set()
        sender.join(30)
        committer.join(30)
    finally:
        faults.clear()
    assert isinstance(out_send[0], PulsarException)
    assert isinstance(out_commit[0], TransactionHasOperationFailed), out_commit
    assert txn.state.value == "ABORTED"
    client.flush()
    assert read_all(client, "one", 1) == []
    client.close()
