"""A decided transaction whose markers cannot be written for a while is completed once storage
heals, in the process that decided it, with no coordinator service and no new client: its data
would otherwise stay "committing" for good (markers never written, compaction and retention held
at its data). A client closed while the completion still fails leaves it to the next client that
opens its TC, however soon after the decision that client comes."""
from __future__ import annotations

import time

import pytest
from _reads import committed_values  # tests/ is on sys.path (conftest)

import pulsartx
import pulsartx.buffer.state as state_mod
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.coordinator.completer import ATTEMPTS
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.coordinator.state import TxnStatus
from pulsartx.log.partition import PartitionLog, partition_segments
from pulsartx.naming import TopicName
from pulsartx.storage import faults
from pulsartx.storage.faults import Fault, Mode, Op

pytestmark = pytest.mark.usefixtures("no_faults")  # the fixture is in conftest.py

P0 = TopicName.parse("t-partition-0")
P1 = TopicName.parse("t-partition-1")
# No sweep finishes the transaction at the grace: what completes it is the completer's retrying.
NO_SWEEP = CoordinatorConfig(recovery_grace_ms=10**9)


def _decided_with_failing_markers(c: pulsartx.Client, action: str) -> tuple[pulsartx.Transaction, Fault, list[bytes]]:
    """A transaction over both partitions of ``t``, decided while partition 1's commits fail; the
    messages READ_COMMITTED readers must show from its decision on."""
    c.admin.create_topic("t", partitions=2)
    p0, p1 = c.create_producer(str(P0)), c.create_producer(str(P1))
    p0.send(b"plain")
    txn = c.new_transaction()
    p0.send(b"a0", txn=txn)
    p1.send(b"a1", txn=txn)
    fault = Fault(Op.CREATE, match="/".join(partition_segments(P1)) + "/_delta_log", times=10**6)
    faults.install([fault])
    getattr(txn, action)()
    return txn, fault, sorted([b"plain", b"a0", b"a1"] if action == "commit" else [b"plain"])


def _read(c: pulsartx.Client) -> list[bytes]:
    return sorted(committed_values(c, "t"))


def _finished(c: pulsartx.Client, txn: pulsartx.Transaction, tc) -> bool:
    """Final in its TC, and its marker in both partitions."""
    if not tc.get(txn.id, refresh=True).status.is_final:
        return False
    key = state_mod.txn_key(*txn.id.as_tuple())
    return all(key in TransactionBuffer(PartitionLog(c.root, p)).state().ended for p in (P0, P1))


def _wait_finished(reader: pulsartx.Client, txn: pulsartx.Transaction, tc, expected: list[bytes],
                   within_s: float) -> None:
    """Wait for ``txn`` to finish, ``reader`` showing exactly ``expected`` all along."""
    deadline = time.monotonic() + within_s
    while not _finished(reader, txn, tc):
        assert time.monotonic() < deadline, f"{txn.id} is still {tc.get(txn.id, refresh=True).status.value}"
        assert _read(reader) == expected
        time.sleep(0.1)
    assert _read(reader) == expected


@pytest.mark.parametrize("action", ["commit", "abort"])
def test_a_decided_transaction_completes_once_storage_heals(tmp_path, action):
    """Fails before the fix: the completer gave up after its ATTEMPTS, flush() then reported
    success, and the transaction stayed COMMITTING/ABORTING with partition 1's marker unwritten
    until some other process swept the TC."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root, coordinator_config=NO_SWEEP) as c:
        txn, fault, expected = _decided_with_failing_markers(c, action)
        tc = c._coordinators().for_txn(txn.id)
        deadline = time.monotonic() + 15
        while fault.fired <= ATTEMPTS:  # tries go on past the first ATTEMPTS
            assert time.monotonic() < deadline, f"the completer stopped after {fault.fired} tries"
            assert _read(c) == expected
            time.sleep(0.1)
        t0 = time.monotonic()
        assert c.flush(1) is False  # bounded, and not reported done
        assert time.monotonic() - t0 < 5
        decided = TxnStatus.COMMITTING if action == "commit" else TxnStatus.ABORTING
        assert tc.get(txn.id, refresh=True).status is decided
        faults.clear()  # storage heals
        _wait_finished(c, txn, tc, expected, within_s=10)
        final = TxnStatus.COMMITTED if action == "commit" else TxnStatus.ABORTED
        assert tc.get(txn.id, refresh=True).status is final
        assert c.flush(5)
    with pulsartx.Client(root) as fresh:
        assert _read(fresh) == expected


@pytest.mark.parametrize("opened", ["after the close", "before the decision"])
def test_a_client_closed_while_completion_fails_leaves_it_to_the_next_opener(tmp_path, opened):
    """The deciding client closes while partition 1 still fails: close() returns (it does not wait
    on storage that keeps failing), and the transaction stays decided. Storage heals; a second
    client, opened within ``recovery_grace_ms`` of the decision (so its opening sweep leaves the
    transaction alone: its decider may still be writing the markers), or one that had opened the
    TC before the decision and only reads, finishes it once the grace has passed. Fails before the
    fix: the second client skipped it at its one sweep and its reads never completed it."""
    root = str(tmp_path / "root")
    grace = CoordinatorConfig(recovery_grace_ms=4_000)
    other = None
    if opened == "before the decision":
        other = pulsartx.Client(root, coordinator_config=grace, num_coordinators=1)
        with other.new_transaction() as t:  # it opens the root's one TC (and sweeps it) now
            other.create_producer("u").send(b"u", txn=t)
    try:
        c = pulsartx.Client(root, coordinator_config=grace, num_coordinators=1)
        txn, fault, expected = _decided_with_failing_markers(c, "commit")
        if other is not None:
            assert _read(other) == expected  # through the TC log, already open: no sweep
        t0 = time.monotonic()
        c.close()
        assert time.monotonic() - t0 < 10
        assert fault.fired >= ATTEMPTS
        faults.clear()
        if other is None:
            other = pulsartx.Client(root, coordinator_config=grace)
        tc = other._coordinators().for_txn(txn.id)
        assert tc.get(txn.id, refresh=True).status is TxnStatus.COMMITTING
        _wait_finished(other, txn, tc, expected, within_s=10)
    finally:
        if other is not None:
            other.close()


def test_a_transaction_decided_longer_ago_than_the_grace_is_finished_by_the_next_opener(tmp_path):
    """The decision is older than ``recovery_grace_ms`` when a new client first opens the TC: its
    opening sweep finishes it at once."""
    root = str(tmp_path / "root")
    c = pulsartx.Client(root, coordinator_config=CoordinatorConfig(recovery_grace_ms=300))
    txn, _, expected = _decided_with_failing_markers(c, "commit")
    c.close()
    faults.clear()
    time.sleep(0.4)
    with pulsartx.Client(root, coordinator_config=CoordinatorConfig(recovery_grace_ms=300)) as fresh:
        assert _read(fresh) == expected  # the read opens the TC, whose sweep finishes the transaction
        tc = fresh._coordinators().for_txn(txn.id)
        assert _finished(fresh, txn, tc)


def test_close_waits_for_an_adopted_completion_it_is_running(tmp_path):
    """A reader's client adopted a transaction whose decider closed before its markers landed, and
    is writing them when the client closes: close() returns only once that write is over, since
    nothing of a closed client writes any more (its topics can then be deleted and re-created).
    Fails before the fix: close() waited for the client's own completions only, and the adopted
    one wrote partition 1's marker after close() had returned."""
    root = str(tmp_path / "root")
    grace = CoordinatorConfig(recovery_grace_ms=500)
    reader = pulsartx.Client(root, coordinator_config=grace, num_coordinators=1)
    with reader.new_transaction() as t:  # it opens the root's one TC (and sweeps it) now
        reader.create_producer("u").send(b"u", txn=t)
    decider = pulsartx.Client(root, coordinator_config=grace, num_coordinators=1)
    txn, _, expected = _decided_with_failing_markers(decider, "commit")
    decider.close()
    faults.clear()
    slow = Fault(Op.CREATE, Mode.DELAY, match="/".join(partition_segments(P1)) + "/_delta_log", delay_s=3.0)
    faults.install([slow])
    tc = reader._coordinators().for_txn(txn.id)
    assert _read(reader) == expected  # resolved through the TC log, and adopted
    deadline = time.monotonic() + 10
    while not slow.fired:  # the adopted completion is writing partition 1's marker
        assert time.monotonic() < deadline, "the reader's client never tried to complete the transaction"
        time.sleep(0.05)
    reader.close()
    key = state_mod.txn_key(*txn.id.as_tuple())
    at_close = key in TransactionBuffer(PartitionLog(reader.root, P1)).state().ended
    time.sleep(3.5)
    assert (key in TransactionBuffer(PartitionLog(reader.root, P1)).state().ended) == at_close, \
        "the closed client wrote a marker after close() returned"
    assert tc.get(txn.id, refresh=True).status is TxnStatus.COMMITTING or at_close


def test_adopting_many_transactions_does_not_wake_the_retry_thread_for_each():
    """A reader tailing a busy topic adopts every transaction it meets before its markers, each due
    a grace later than the one before: the thread that holds them is woken only by one due before
    the time it waits for. Fails before the fix: each adoption woke it, and each wake scanned every
    adopted transaction (CPU growing with the square of the transaction rate)."""
    from types import SimpleNamespace

    from pulsartx.coordinator.completer import Completer
    from pulsartx.coordinator.txnid import TxnID

    c = Completer()
    wakes = [0]
    wait = c._wake.wait

    def counting(timeout=None):
        wakes[0] += 1
        return wait(timeout)
    c._wake.wait = counting
    now_ms = int(time.time() * 1000)
    try:
        for i in range(500):
            c.adopt(SimpleNamespace(), SimpleNamespace(txn_id=TxnID(0, i)), now_ms + 60_000 + i)
            time.sleep(0.002)  # transactions arrive one by one: the thread waits in between
        time.sleep(0.2)
        assert wakes[0] < 50
    finally:
        c.close(0)


@pytest.mark.parametrize("end", ["commit in the foreground", "abort past its timeout"])
def test_a_transaction_decided_without_the_completer_is_retried_by_it(tmp_path, end):
    """A Spark job's commit ends its transaction in the foreground (no completer queue), and a
    reader or sweep aborts one past its timeout: when its markers fail there, the process's
    completer retries it once storage heals, as it does a client's own. Fails before the fix: it
    stayed COMMITTING/ABORTING in a long-lived driver with no coordinator service until some other
    process swept its TC."""
    from pulsartx.coordinator.state import TxnAction

    root = str(tmp_path / "root")
    with pulsartx.Client(root, coordinator_config=NO_SWEEP, num_coordinators=1) as c:
        c.admin.create_topic("t", partitions=2)
        tc = c._coordinators().tc(0)
        timeout_ms = 60_000 if end.startswith("commit") else 1
        meta = tc.new_transaction(timeout_ms, partitions=[str(P0), str(P1)])
        time.sleep(0.01)
        faults.install([Fault(Op.CREATE, match="/".join(partition_segments(P1)) + "/_delta_log", times=10**6)])
        if end.startswith("commit"):
            decided = tc.end_transaction(meta.txn_id, TxnAction.COMMIT)
        else:
            decided = tc.abort_expired(meta.txn_id)
        assert not decided.status.is_final
        faults.clear()
        deadline = time.monotonic() + 10
        while not tc.get(meta.txn_id, refresh=True).status.is_final:
            assert time.monotonic() < deadline, f"{meta.txn_id} is still {decided.status.value}"
            time.sleep(0.1)


def test_a_sweep_that_fails_to_finish_a_transaction_retries_it_a_second_later(tmp_path):
    """The opening sweep of a short-lived process (a CLI command) fails to finish a decided
    transaction: its retry comes a second later, as after a completer's failed round, not at once,
    so the process can exit first instead of waiting at exit for a try against storage that has
    just failed (a try on a store giving transient errors lasts the whole storage retry budget).
    Fails before the fix: the sweep handed it to the completer due at once."""
    root = str(tmp_path / "root")
    config = CoordinatorConfig(recovery_grace_ms=300)
    c = pulsartx.Client(root, coordinator_config=config)
    txn, fault, expected = _decided_with_failing_markers(c, "commit")
    c.close()
    time.sleep(0.4)
    with pulsartx.Client(root, coordinator_config=config) as fresh:
        fired = fault.fired
        assert _read(fresh) == expected  # the read opens the TC, whose sweep fails to finish it
        swept = fault.fired
        assert swept > fired
        time.sleep(0.5)
        assert fault.fired == swept, "the sweep's failure was retried at once"
        deadline = time.monotonic() + 5
        while fault.fired == swept:  # ...but it is retried
            assert time.monotonic() < deadline, "the sweep's failure was never retried"
            time.sleep(0.05)


def test_a_completion_that_finds_the_transaction_finished_by_another_process_counts_nothing(tmp_path):
    """Two processes complete one decided transaction (its decider and one that adopted or swept
    it): the one whose final record is written counts it in pulsar_txn_committed_count, the other,
    which finds it final, does not (the count is per process, and dashboards add them up). Fails
    before the fix: both counted it."""
    from pulsartx import metrics
    from pulsartx.coordinator.state import TxnAction

    root = str(tmp_path / "root")
    with pulsartx.Client(root, coordinator_config=NO_SWEEP, num_coordinators=1) as c, \
            pulsartx.Client(root, coordinator_config=NO_SWEEP, num_coordinators=1) as other:
        c.admin.create_topic("t", partitions=2)
        tc = c._coordinators().tc(0)
        meta = tc.new_transaction(60_000, partitions=[str(P0), str(P1)])
        faults.install([Fault(Op.CREATE, match="/".join(partition_segments(P1)) + "/_delta_log", times=10**6)])
        decided = tc.end_transaction(meta.txn_id, TxnAction.COMMIT)
        assert decided.status is TxnStatus.COMMITTING
        faults.clear()
        tc2 = other._coordinators().tc(0)
        assert tc2._complete(tc2.get(meta.txn_id, refresh=True)).status is TxnStatus.COMMITTED
        metrics.reset()
        assert tc._complete(decided).status is TxnStatus.COMMITTED  # on its stale copy of the log
        assert metrics._counts.get(("committed", 0), 0) == 0
