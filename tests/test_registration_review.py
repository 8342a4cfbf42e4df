"""Adversarial review of a producing transaction's partition registration and of its appends
racing the transaction's own decision: what READ_COMMITTED readers see afterwards."""
from __future__ import annotations

import threading

import pytest

import pulsartx
from pulsartx import MessageId
from pulsartx.client.transaction import Transaction
from pulsartx.exceptions import PulsarException

pytestmark = pytest.mark.parametrize("storage", ["local"], indirect=True)


def read_all(client, topic: str, partitions: int = 1) -> list[bytes]:
    out = []
    for p in range(partitions):
        r = client.create_reader(f"{topic}-partition-{p}", MessageId.earliest)
        while r.has_message_available():
            out.append(r.read_next().data())
    return out


def in_thread(fn):
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def slow_producer(client, topic: str):
    return client.create_producer(topic, batching_max_messages=1000, batching_max_publish_delay_ms=60_000)


def test_send_checked_before_the_decision_and_appended_after_it_is_not_lost(root, monkeypatch):
    """One thread sends a message of the transaction while another commits it. The send passes the
    transaction's OPEN check (and the TC's) after commit() flushed its producers and before the
    decision; its append then lands after the decision and the commit marker. The send reports
    success, so the message must be visible with the transaction; the alternative is that the
    send fails. A success whose message is never visible (a straggler behind its own marker) is a
    lost message."""
    at_decision, decide = threading.Event(), threading.Event()
    checked, append = threading.Event(), threading.Event()
    real_end = Transaction._end
    real_before = Transaction._before_append
    committer_name = "review-committer"

    def end(self, action):
        if threading.current_thread().name == committer_name:
            at_decision.set()
            assert decide.wait(30)
        return real_end(self, action)

    def before(self, partition, registered=False):
        out = real_before(self, partition, registered)
        if threading.current_thread().name == "review-sender":
            checked.set()
            append.wait(30)
        return out

    monkeypatch.setattr(Transaction, "_end", end)
    monkeypatch.setattr(Transaction, "_before_append", before)
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
    visible = read_all(client, "one")
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
