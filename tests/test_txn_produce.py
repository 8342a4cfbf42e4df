"""What a transaction of full batches costs beside plain produce: its Delta commits per table, the
partition registration begun while the batch fills, and that the per-message checks still refuse."""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

import pulsartx
from pulsartx import MessageId
from pulsartx.client import producer as producer_mod
from pulsartx.coordinator.coordinator import TransactionCoordinator
from pulsartx.exceptions import (
    ExpiredTransactionError,
    InvalidTxnStatusError,
    PulsarException,
)
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName
from pulsartx.storage.appender import DeltaAppender
from pulsartx.storage.retry import OutcomeUnknown

pytestmark = pytest.mark.parametrize("storage", ["local"], indirect=True)


@pytest.fixture
def commits(monkeypatch) -> Counter:
    """Delta commits attempted per table, by kind: "tc" (a TC log) or the partition's name."""
    seen: Counter = Counter()
    real = DeltaAppender._commit

    def counting(self, *a, **kw):
        uri = str(self.uri)
        seen["tc" if "/coordinator/" in uri else uri.rsplit("/", 2)[-2] + "/" + uri.rsplit("/", 1)[-1]] += 1
        return real(self, *a, **kw)

    monkeypatch.setattr(DeltaAppender, "_commit", counting)
    return seen


def read_all(client, topic: str, partitions: int) -> list[bytes]:
    out = []
    for p in range(partitions):
        r = client.create_reader(f"{topic}-partition-{p}", MessageId.earliest)
        while r.has_message_available():
            out.append(r.read_next().data())
    return out


def test_full_batch_transaction_commits_like_the_protocol(root, commits):
    """A 1,000-message transaction to 4 partitions with batches of 1,000: one data commit and one
    marker commit in one partition, and in the TC log the registration (NEW + ADD_PARTITION),
    the decision and the final entry: nothing more than the protocol's steps."""
    client = pulsartx.Client(root)
    client.admin.create_topic("t", 4)
    prod = slow_producer(client, "t")
    warm = client.new_transaction()  # the TC's lease and TxnID block, the partition handles
    prod.send(b"warm", txn=warm)
    warm.commit()
    client.flush()
    values = [b"m%04d" % i for i in range(1000)]
    txn = client.new_transaction()  # a lease renewal or a TxnID block would be written here
    commits.clear()
    for v in values:
        prod.send_async(v, None, txn=txn)
    txn.commit()
    client.flush()
    parts = {k: n for k, n in commits.items() if k != "tc"}
    assert list(parts.values()) == [2], parts  # the data, then the marker, in one partition
    assert commits["tc"] == 3
    assert sorted(read_all(client, "t", 4)) == sorted([b"warm", *values])
    client.close()


def test_registration_starts_while_the_batch_fills(root, monkeypatch):
    """The partition is registered once its queue reaches EARLY_REGISTRATION_AT messages, on a
    helper thread, and the batch's append waits for it: data never precedes its registration."""
    order: list[str] = []
    real_add = TransactionCoordinator.add_partitions
    real_write = producer_mod.Producer._write

    def add(self, txn_id, partitions):
        order.append(f"add:{threading.current_thread() is threading.main_thread()}")
        return real_add(self, txn_id, partitions)

    def write(self, *a, **kw):
        order.append("append")
        return real_write(self, *a, **kw)

    monkeypatch.setattr(TransactionCoordinator, "add_partitions", add)
    monkeypatch.setattr(producer_mod.Producer, "_write", write)
    client = pulsartx.Client(root)
    prod = slow_producer(client, "one")
    txn = client.new_transaction()
    for i in range(producer_mod.EARLY_REGISTRATION_AT - 1):
        prod.send_async(b"%d" % i, None, txn=txn)
    assert order == []  # a small transaction registers its partitions together at its flush
    prod.send_async(b"%d" % (producer_mod.EARLY_REGISTRATION_AT - 1), None, txn=txn)
    # The helper is started at the threshold; on a loaded host it may not run before the batch is
    # full, and the append would then make the call itself. Wait for it to begin, so the assertion
    # below is about where the call runs, not about the scheduler.
    deadline = time.monotonic() + 30
    while not order and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(producer_mod.EARLY_REGISTRATION_AT, 1000):
        prod.send_async(b"%d" % i, None, txn=txn)
    txn.commit()
    client.flush()
    assert order == ["add:False", "append"]  # once, beside the sender, before the data
    assert len(read_all(client, "one", 1)) == 1000
    client.close()


def test_failed_early_registration_fails_the_batch_and_aborts(root, monkeypatch):
    """Registrations that fail: the batch is never appended, commit() raises, the transaction
    aborts, every message is reported failed and nothing of it is ever visible."""
    refuse_registrations(monkeypatch)
    client = pulsartx.Client(root)
    prod = slow_producer(client, "one")
    txn = client.new_transaction()
    results = []
    for i in range(500):
        prod.send_async(b"%d" % i, lambda res, _mid: results.append(res), txn=txn)
    with pytest.raises(PulsarException):
        txn.commit()
    client.flush()
    assert txn.state.value == "ABORTED"
    assert len(results) == 500 and pulsartx.Result.Ok not in results
    monkeypatch.undo()
    assert read_all(client, "one", 1) == []
    client.close()


def test_early_registration_failed_then_registered_again(root, monkeypatch):
    """A registration begun beside the batch that failed is made again by the batch's flush
    (data still after it): the transaction commits, each message once."""
    calls = registrations_failing_once(monkeypatch, "not written")
    client = pulsartx.Client(root)
    prod = slow_producer(client, "one")
    txn = client.new_transaction()
    fill(prod, txn, 500)
    deadline = time.monotonic() + 30
    while txn._registering_parts and time.monotonic() < deadline:  # the failure has come back
        time.sleep(0.01)
    assert not txn._registering_parts and len(calls) == 1
    txn.commit()
    client.flush()
    assert len(calls) == 2
    assert sorted(read_all(client, "one", 1)) == sorted(b"%d" % i for i in range(500))
    client.close()


def test_abort_waits_for_a_registration_under_way(root):
    """An abort while a partition's registration runs beside the batch: the decision follows it,
    the queued messages are dropped, and the partition holds nothing."""
    client = pulsartx.Client(root)
    prod = slow_producer(client, "one")
    txn = client.new_transaction()
    for i in range(300):
        prod.send_async(b"%d" % i, None, txn=txn)
    txn.abort()
    client.flush()
    assert txn.state.value == "ABORTED"
    assert read_all(client, "one", 1) == []
    client.close()


def test_sends_on_an_ended_transaction_still_raise(root):
    """The per-message check's fast path only passes an OPEN transaction."""
    client = pulsartx.Client(root)
    prod = client.create_producer("one")
    txn = client.new_transaction()
    prod.send_async(b"x", None, txn=txn)
    txn.commit()
    with pytest.raises(InvalidTxnStatusError):
        prod.send_async(b"late", None, txn=txn)
    t2 = client.new_transaction()
    t2.abort()
    with pytest.raises(InvalidTxnStatusError):
        prod.send(b"late", txn=t2)
    assert read_all(client, "one", 1) == [b"x"]
    client.close()


# ---- registrations begun close together share one call; their failure paths --------------------------------


@pytest.fixture
def data_after_registration(monkeypatch) -> list[tuple[str, bool]]:
    """Every transactional data append, with whether the TC log durably listed its partition in
    the transaction when the append was submitted (must always be True)."""
    seen: list[tuple[str, bool]] = []
    real = PartitionLog.submit_append

    def spy(self, records, *a, **kw):
        most = records.column("txn_most_bits")[0].as_py()
        if most is not None and records.column("type")[0].as_py() == "DATA":
            txn_id = pulsartx.TxnID(most, records.column("txn_least_bits")[0].as_py())
            tc = TransactionCoordinator(self.root, most).open(recover=False)  # a fresh reader of the log
            meta = tc.txlog.get(txn_id.least_bits)
            seen.append((str(self.topic), meta is not None and str(self.topic) in meta.partitions))
        return real(self, records, *a, **kw)

    monkeypatch.setattr(PartitionLog, "submit_append", spy)
    return seen


def refuse_registrations(monkeypatch) -> None:
    """Every ADD_PARTITION fails, as when the TC log cannot be written."""
    def failing(self, txn_id, partitions):
        raise PulsarException("injected: TC log unavailable")

    monkeypatch.setattr(TransactionCoordinator, "add_partitions", failing)


def registrations_failing_once(monkeypatch, failure: str) -> list[set[str]]:
    """The first ADD_PARTITION fails: ``not written``, ``outcome unknown`` (not written, and the
    read-back failed too) or ``written, answer lost``; later ones go through. Returns every call's
    partitions, in order."""
    real_add = TransactionCoordinator.add_partitions
    calls: list[set[str]] = []

    def add(self, txn_id, partitions):
        calls.append(set(partitions))
        if len(calls) == 1:
            if failure == "not written":
                raise PulsarException("injected: TC log unavailable")
            if failure == "outcome unknown":
                raise OutcomeUnknown("injected: the write failed and could not be read back")
            real_add(self, txn_id, partitions)
            raise OutcomeUnknown("injected: written, then the answer was lost")
        return real_add(self, txn_id, partitions)

    monkeypatch.setattr(TransactionCoordinator, "add_partitions", add)
    return calls


def slow_producer(client, topic: str):
    """A producer whose batches are cut only by a flush or at 1,000 messages (never by time)."""
    return client.create_producer(topic, batching_max_messages=1000, batching_max_publish_delay_ms=60_000)


def fill(prod, txn, n: int = 300) -> list[bytes]:
    """Queue ``n`` messages of ``txn`` (past the early-registration threshold); their values."""
    values = [b"%d" % i for i in range(n)]
    for v in values:
        prod.send_async(v, None, txn=txn)
    return values


class Gate:
    """Holds the first ADD_PARTITION call (before it reaches the TC) until released, and records
    every call's partitions."""

    def __init__(self, monkeypatch):
        self.calls: list[set[str]] = []
        self.threads: list[str] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        real = TransactionCoordinator.add_partitions
        gate = self

        def add(tc, txn_id, partitions):
            gate.calls.append(set(partitions))
            gate.threads.append(threading.current_thread().name)
            if len(gate.calls) == 1:
                gate.entered.set()
                assert gate.release.wait(30)
            return real(tc, txn_id, partitions)

        monkeypatch.setattr(TransactionCoordinator, "add_partitions", add)

    def held(self) -> None:
        assert self.entered.wait(30)


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def names(topic: str, n: int) -> list[str]:
    return [str(TopicName.parse(f"{topic}-partition-{i}")) for i in range(n)]


def test_partitions_filling_together_register_in_one_call(root, commits, monkeypatch, data_after_registration):
    """Keyed messages fill 4 partitions side by side: when the first reaches the threshold, all 4
    are registered in one call (one TC commit, with NEW), not one call each as each reaches it."""
    real_add = TransactionCoordinator.add_partitions
    calls: list[set[str]] = []

    def add(self, txn_id, partitions):
        calls.append(set(partitions))
        return real_add(self, txn_id, partitions)

    monkeypatch.setattr(TransactionCoordinator, "add_partitions", add)
    client = pulsartx.Client(root)
    client.admin.create_topic("t", 4)
    prod = slow_producer(client, "t")
    warm = client.new_transaction()
    prod.send(b"warm", txn=warm)
    warm.commit()
    client.flush()
    values = [b"m%04d" % i for i in range(1000)]
    txn = client.new_transaction()
    calls.clear()
    commits.clear()
    for v in values:
        prod.send_async(v, None, partition_key=v.decode(), txn=txn)
    txn.commit()
    client.flush()
    assert calls == [set(names("t", 4))]
    assert commits["tc"] == 3  # NEW + ADD_PARTITION of all 4, the decision, the final entry
    assert sorted(read_all(client, "t", 4)) == sorted([b"warm", *values])
    assert data_after_registration and all(ok for _, ok in data_after_registration)
    client.close()


def test_registrations_asked_during_a_call_share_the_next(root, monkeypatch, data_after_registration):
    """While one registration call is in flight, partitions asked for beside other batches wait
    for it and then go to the TC together, in one call."""
    gate = Gate(monkeypatch)
    client = pulsartx.Client(root)
    a, b, c = (slow_producer(client, t) for t in ("a", "b", "c"))
    txn = client.new_transaction()
    for i in range(producer_mod.EARLY_REGISTRATION_AT):
        a.send_async(b"a%d" % i, None, txn=txn)
    gate.held()  # a's registration, held
    for prod, name in ((b, "b"), (c, "c")):
        for i in range(producer_mod.EARLY_REGISTRATION_AT):
            prod.send_async(b"%s%d" % (name.encode(), i), None, txn=txn)
    time.sleep(0.05)
    assert len(gate.calls) == 1
    gate.release.set()
    txn.commit()
    client.flush()
    assert gate.calls == [{names("a", 1)[0]}, {names(t, 1)[0] for t in "bc"}]
    for t in "abc":
        assert len(read_all(client, t, 1)) == producer_mod.EARLY_REGISTRATION_AT
    assert all(ok for _, ok in data_after_registration) and len(data_after_registration) == 3
    client.close()


def test_commit_racing_a_registration_under_way(root, monkeypatch, data_after_registration):
    """commit() while the registration begun beside the batch is held: its flush waits for that
    call (no second one), appends after it, and only then decides."""
    gate = Gate(monkeypatch)
    ends = []
    real_end = TransactionCoordinator.end_transaction

    def end(self, *a, **kw):
        ends.append(len(data_after_registration))
        return real_end(self, *a, **kw)

    monkeypatch.setattr(TransactionCoordinator, "end_transaction", end)
    client = pulsartx.Client(root)
    prod = slow_producer(client, "one")
    txn = client.new_transaction()
    values = fill(prod, txn)
    gate.held()
    committer, out = in_thread(txn.commit)
    committer.join(0.3)
    assert committer.is_alive() and data_after_registration == [] and ends == []
    gate.release.set()
    committer.join(30)
    assert out == [None] and txn.state.value == "COMMITTED"
    client.flush()
    assert len(gate.calls) == 1 and ends == [1]
    assert data_after_registration == [(names("one", 1)[0], True)]
    assert sorted(read_all(client, "one", 1)) == sorted(values)
    client.close()


def test_abort_decides_after_the_registration_under_way(root, monkeypatch, data_after_registration):
    """abort() while a registration is held: queued messages are dropped at once, but the decision
    waits for the call, so the TC's ABORTED entry lists the partition it registered."""
    gate = Gate(monkeypatch)
    ends = []
    real_end = TransactionCoordinator.end_transaction

    def end(self, *a, **kw):
        ends.append(gate.release.is_set())
        return real_end(self, *a, **kw)

    monkeypatch.setattr(TransactionCoordinator, "end_transaction", end)
    client = pulsartx.Client(root)
    prod = slow_producer(client, "one")
    txn = client.new_transaction()
    results = []
    for i in range(300):
        prod.send_async(b"%d" % i, lambda res, _mid: results.append(res), txn=txn)
    gate.held()
    aborter, out = in_thread(txn.abort)
    aborter.join(0.3)
    assert aborter.is_alive() and ends == []
    gate.release.set()
    aborter.join(30)
    assert out == [None] and txn.state.value == "ABORTED" and ends == [True]
    client.flush()
    meta = client.admin.transactions.get_transaction_metadata(txn.id)
    assert meta["status"] == "ABORTED" and meta["partitions"] == [names("one", 1)[0]]
    assert len(results) == 300 and pulsartx.Result.Ok not in results
    assert data_after_registration == [] and read_all(client, "one", 1) == []
    client.close()


def test_producer_closed_during_a_registration(root, monkeypatch, data_after_registration):
    """close() while the registration is held: its flush waits for the call, then appends; the
    transaction then commits every message once."""
    gate = Gate(monkeypatch)
    client = pulsartx.Client(root)
    prod = slow_producer(client, "one")
    txn = client.new_transaction()
    values = fill(prod, txn)
    gate.held()
    closer, out = in_thread(prod.close)
    closer.join(0.3)
    assert closer.is_alive() and data_after_registration == []
    gate.release.set()
    closer.join(30)
    assert out == [None]
    txn.commit()
    client.flush()
    assert len(gate.calls) == 1 and data_after_registration == [(names("one", 1)[0], True)]
    assert sorted(read_all(client, "one", 1)) == sorted(values)
    client.close()


def test_transaction_timing_out_during_a_registration(root, monkeypatch, data_after_registration):
    """The transaction passes its timeout while its registration is held: the TC refuses the call,
    the transaction is TIME_OUT, its messages are reported failed and nothing is appended."""
    gate = Gate(monkeypatch)
    client = pulsartx.Client(root)
    prod = slow_producer(client, "one")
    txn = client.new_transaction(timeout_ms=300)
    results = []
    for i in range(150):
        prod.send_async(b"%d" % i, lambda res, _mid: results.append(res), txn=txn)
    gate.held()
    time.sleep(0.5)
    gate.release.set()
    deadline = time.monotonic() + 30
    while txn.state.value == "OPEN" and time.monotonic() < deadline:  # the refusal came back
        time.sleep(0.01)
    with pytest.raises(ExpiredTransactionError):
        txn.commit()
    assert txn.state.value == "TIME_OUT"
    with pytest.raises(ExpiredTransactionError):
        prod.send_async(b"late", None, txn=txn)
    client.flush()
    assert len(results) == 150 and pulsartx.Result.Ok not in results
    assert data_after_registration == [] and read_all(client, "one", 1) == []
    client.close()


@pytest.mark.parametrize("failure", ["not written", "outcome unknown", "written, answer lost"])
def test_registration_whose_outcome_is_unknown_is_asked_again(root, monkeypatch, data_after_registration, failure):
    """The first registration fails: not written, or with an unknown outcome (not written, or
    written and its answer lost). The client never takes the partition as registered on it: the
    batch's flush registers again (the TC re-reads its log, and a call that had landed is a no-op)
    before any data, and the transaction commits each message once."""
    calls = registrations_failing_once(monkeypatch, failure)
    client = pulsartx.Client(root)
    prod = slow_producer(client, "one")
    txn = client.new_transaction()
    values = fill(prod, txn, 500)
    deadline = time.monotonic() + 30
    while (not calls or txn._registering_parts) and time.monotonic() < deadline:  # the failure came back
        time.sleep(0.01)
    assert not txn._partitions  # the failed call registered nothing in the client's view
    txn.commit()
    client.flush()
    assert len(calls) == 2
    assert data_after_registration == [(names("one", 1)[0], True)]
    assert sorted(read_all(client, "one", 1)) == sorted(values)
    assert client.admin.transactions.get_transaction_metadata(txn.id)["status"] == "COMMITTED"
    client.close()


def test_lazily_begun_transaction_acknowledges_then_registers_early(root, data_after_registration):
    """A transaction begun lazily acknowledges first (its subscription noted, not written), then
    produces enough for an early registration: that registration writes the NEW entry with the
    subscription, and the commit makes both the acknowledgement and the messages effective."""
    client = pulsartx.Client(root)
    client.admin.create_topic("in")
    cons = client.subscribe("in", "s")
    client.create_producer("in").send(b"input")
    prod = slow_producer(client, "out")
    txn = client.new_transaction()
    cons.acknowledge(cons.receive(5000), txn=txn)
    values = fill(prod, txn)
    deadline = time.monotonic() + 30
    while not txn._partitions and time.monotonic() < deadline:
        time.sleep(0.01)
    meta = client.admin.transactions.get_transaction_metadata(txn.id)
    assert meta["status"] == "OPEN" and meta["partitions"] == [names("out", 1)[0]]
    assert len(meta["subscriptions"]) == 1
    txn.commit()
    client.flush()
    assert sorted(read_all(client, "out", 1)) == sorted(values)
    cons.redeliver_unacknowledged_messages()
    with pytest.raises(pulsartx.Timeout):
        cons.receive(300)
    assert all(ok for _, ok in data_after_registration)
    client.close()


def test_keyed_transaction_fenced_during_a_registration(root, monkeypatch, data_after_registration):
    """A keyed transaction whose key is claimed by a newer client while its early registration is
    held: the TC refuses the call, the transaction is fenced and aborted, and nothing of it is
    ever appended or visible."""
    gate = Gate(monkeypatch)
    old = pulsartx.Client(root, transaction_key="app")
    prod = slow_producer(old, "one")
    txn = old.new_transaction()
    results = []
    for i in range(150):
        prod.send_async(b"%d" % i, lambda res, _mid: results.append(res), txn=txn)
    gate.held()
    new = pulsartx.Client(root, transaction_key="app")  # fences the old epoch's open transaction
    gate.release.set()
    with pytest.raises(ExpiredTransactionError, match="fenced"):
        txn.commit()
    assert txn.state.value == "ABORTED"
    with pytest.raises(ExpiredTransactionError, match="fenced"):
        prod.send_async(b"late", None, txn=txn)
    old.flush()
    assert len(results) == 150 and pulsartx.Result.Ok not in results
    assert data_after_registration == [] and read_all(new, "one", 1) == []
    meta = new.admin.transactions.get_transaction_metadata(txn.id)
    assert meta["status"] == "ABORTED" and meta["reason"].startswith("fenced")
    old.close()
    new.close()


def test_full_batch_whose_registration_fails_fails_through_its_callbacks(root, monkeypatch, data_after_registration):
    """A registration failing when a send_async fills the batch: send_async does not raise (the
    message is queued, and a sender told otherwise would send it again), the batch fails through
    its callbacks, each message once, and nothing is appended or visible."""
    refuse_registrations(monkeypatch)
    client = pulsartx.Client(root)
    prod = slow_producer(client, "one")
    txn = client.new_transaction()
    results: list[tuple[bytes, pulsartx.Result]] = []
    values = [b"%d" % i for i in range(1000)]
    for v in values:
        prod.send_async(v, lambda res, _mid, v=v: results.append((v, res)), txn=txn)
    assert sorted(v for v, _ in results) == sorted(values)  # the full batch failed, each message once
    assert pulsartx.Result.Ok not in {r for _, r in results}
    with pytest.raises(PulsarException):
        prod.flush()  # the failure is reported by flush() too, once
    prod.flush()
    txn.abort()
    monkeypatch.undo()
    assert data_after_registration == [] and read_all(client, "one", 1) == []
    client.close()


# ---- progress without a free helper; a finished registration is no TC check for a later append -------------


def test_queued_registration_runs_on_its_waiter_when_no_helper_is_free(root, monkeypatch, one_helper,
                                                                       data_after_registration):
    """Two producers' flush loops append batches of one transaction: A's makes the registration
    call, B's waits for the next one, queued behind it. commit() flushes the producers beside each
    other, and its helper blocks on B's flush lock. When A's call ends, the next call must not wait
    for a free helper (there is none: the only one waits for B, B for the call): B's append makes
    it itself, and the commit goes through with every message once."""
    gate = Gate(monkeypatch)
    on_helper = threading.Event()
    real_flush = producer_mod.Producer._flush_queue

    def flush_queue(self, *a, **kw):
        if threading.current_thread().name.startswith("test-txn-helper"):
            on_helper.set()
        return real_flush(self, *a, **kw)

    monkeypatch.setattr(producer_mod.Producer, "_flush_queue", flush_queue)
    client = pulsartx.Client(root)
    a, b = (slow_producer(client, t) for t in ("a", "b"))
    txn = client.new_transaction()
    results: list[pulsartx.Result] = []
    for i in range(5):
        a.send_async(b"a%d" % i, lambda res, _mid: results.append(res), txn=txn)
        b.send_async(b"b%d" % i, lambda res, _mid: results.append(res), txn=txn)
    ka, kb = (next(k for k in p._queues if k[1] is txn) for p in (a, b))
    flush_a, _ = in_thread(lambda: a._flush_queue(ka))  # what each flush loop does at its publish delay
    gate.held()
    flush_b, _ = in_thread(lambda: b._flush_queue(kb))
    deadline = time.monotonic() + 30
    while txn._next_registration is None and time.monotonic() < deadline:  # B waits behind A's call
        time.sleep(0.01)
    committer, out = in_thread(txn.commit)
    assert on_helper.wait(30)  # the commit's helper flushes B: it waits for B's flush lock
    gate.release.set()
    committer.join(30)
    stuck = committer.is_alive()
    if stuck:
        txn._run_registrations()  # break the cycle, so that the test ends instead of hanging
    assert not stuck, "deadlock: the queued registration waited for a free helper"
    flush_a.join(30)
    flush_b.join(30)
    assert out == [None] and txn.state.value == "COMMITTED"
    client.flush()
    assert gate.calls == [{names("a", 1)[0]}, {names("b", 1)[0]}]
    assert not gate.threads[1].startswith("test-txn-helper")  # made by B's append: the helper was busy
    assert results == [pulsartx.Result.Ok] * 10
    assert sorted(data_after_registration) == [(names("a", 1)[0], True), (names("b", 1)[0], True)]
    assert sorted(read_all(client, "a", 1) + read_all(client, "b", 1)) == sorted(
        [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)])
    client.close()


@pytest.mark.parametrize("end", ["flush", "commit", "abort"])
def test_early_registration_runs_on_its_waiter_when_no_helper_is_free(root, one_helper, data_after_registration,
                                                                      end):
    """The registration begun beside a filling batch waits for a helper, and every helper is busy
    (here: the only one, held): the batch's flush, the commit or the abort (whose decision waits
    for the registrations under way) makes the call itself instead of waiting."""
    busy, free = threading.Event(), threading.Event()
    one_helper.get().submit(lambda: (busy.set(), free.wait(60)))
    try:
        assert busy.wait(30)
        client = pulsartx.Client(root)
        prod = slow_producer(client, "one")
        txn = client.new_transaction()
        values = [b"%d" % i for i in range(producer_mod.EARLY_REGISTRATION_AT + 50)]
        for v in values:
            prod.send_async(v, None, txn=txn)
        assert txn._registering_parts  # the early registration is queued for the helper
        worker, out = in_thread({"flush": prod.flush, "commit": txn.commit, "abort": txn.abort}[end])
        worker.join(30)
        assert not worker.is_alive(), "the registration waited for a free helper"
        assert out == [None]
        assert data_after_registration == ([] if end == "abort" else [(names("one", 1)[0], True)])
        assert client.admin.transactions.get_transaction_metadata(txn.id)["partitions"] == names("one", 1)
    finally:
        free.set()
    if end == "flush":
        txn.commit()
    client.flush()
    assert sorted(read_all(client, "one", 1)) == ([] if end == "abort" else sorted(values))
    client.close()


def test_admin_abort_after_an_early_registration_fails_the_flush(root, data_after_registration):
    """The early registration ended long ago; an admin aborts the transaction; the batch's flush
    must still ask the TC, so its messages fail with InvalidTxnStatus and nothing is appended (an
    old registration is no check for a later append)."""
    client = pulsartx.Client(root)
    prod = slow_producer(client, "s")
    txn = client.new_transaction()
    results: list[pulsartx.Result] = []
    for i in range(150):
        prod.send_async(b"t%d" % i, lambda res, _mid: results.append(res), txn=txn)
    deadline = time.monotonic() + 30
    while not (txn._partitions and all(f.done() for f in list(txn._registering_parts.values()))) \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert txn._partitions == {names("s", 1)[0]}
    assert client.admin.transactions.abort_transaction(str(txn.id))["status"] == "ABORTED"
    with pytest.raises(InvalidTxnStatusError):
        prod.flush()
    assert results == [pulsartx.Result.InvalidTxnStatus] * 150
    assert data_after_registration == []
    with pytest.raises(InvalidTxnStatusError):
        txn.commit()
    client.flush()
    assert read_all(client, "s", 1) == []
    client.close()


def test_an_abort_keeps_an_earlier_background_failure_for_flush(root):
    """A batch that failed in the background is reported by the next ``flush()``, even if a
    transaction's abort dropped its own queued messages in between (their failure is the abort's,
    and is not flush()'s to report)."""
    from pulsartx.storage import faults
    from pulsartx.storage.faults import Fault, Op

    client = pulsartx.Client(root)
    client.admin.create_topic("e", partitions=1)
    prod = client.create_producer("e", batching_max_messages=2, batching_max_publish_delay_ms=60_000)
    prod.send(b"warm")
    results: list[object] = []
    faults.install([Fault(Op.WRITE, match="partition-0/part-")])
    try:
        prod.send_async(b"a", lambda r, m: results.append(r))
        prod.send_async(b"b", lambda r, m: results.append(r))  # the full batch is appended, and fails
    finally:
        faults.clear()
    assert len(results) == 2 and all(r is not pulsartx.Result.Ok for r in results)
    txn = client.new_transaction()
    prod.send_async(b"t", None, txn=txn)  # queued: the batch is not full, and never cut by time
    txn.abort()
    with pytest.raises(pulsartx.PulsarException, match="injected I/O error"):
        prod.flush()
    prod.flush()  # reported once
    assert read_all(client, "e", 1) == [b"warm"]
    client.close()
