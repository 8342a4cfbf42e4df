"""Transaction keep-alive without Spark: ``TransactionCoordinator.extend`` (a compare-and-set that
moves an OPEN transaction's deadline and never resurrects an expired one), and the keeper process
of commit_protocol/keepalive.py, driven by a stand-in "driver" process that the test kills.

Spark-level behaviour (micro-batches, write jobs, a SIGKILLed driver) is in test_streaming_keepalive.py."""
from __future__ import annotations

import os
import subprocess
import time

import pytest
from pulsartx.commit_protocol import keepalive

import pulsartx
from pulsartx.coordinator.coordinator import CoordinatorConfig, now_ms
from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.exceptions import ExpiredTransactionError, InvalidTxnStatusError
from pulsartx.naming import TopicName
from pulsartx.storage.root import StorageRoot

KEEP = CoordinatorConfig(compact_every=10**6, recovery_grace_ms=0)


@pytest.fixture
def client(root):
    c = pulsartx.Client(root, num_coordinators=2, coordinator_config=KEEP)
    c.admin.create_topic("kt", 1)
    yield c
    c.close()


P = str(TopicName.parse("kt-partition-0"))


def test_extend_moves_the_deadline_of_an_open_transaction(client):
    tc = client._coordinators().tc(0)
    m = tc.new_transaction(1_000)
    tc.add_partitions(m.txn_id, [P])
    before = now_ms()
    e = tc.extend(m.txn_id, 60_000)
    assert e.status is TxnStatus.OPEN and e.seq == 2 and e.start_ms == m.start_ms
    assert before + 60_000 <= e.start_ms + e.timeout_ms <= now_ms() + 60_000
    # durable: another process's view has the new deadline
    other = pulsartx.Client(client.root.url, num_coordinators=2, coordinator_config=KEEP)
    try:
        assert other._coordinators().tc(0).get(m.txn_id).timeout_ms == e.timeout_ms
    finally:
        other.close()
    # never shortens: a smaller extension writes nothing
    assert tc.extend(m.txn_id, 10) == e
    time.sleep(1.2)  # past the original timeout: the extension holds it open
    assert tc.sweep().timed_out == 0
    assert tc.end_transaction(m.txn_id, TxnAction.COMMIT).status is TxnStatus.COMMITTED


def test_extend_refuses_an_expired_or_ended_transaction(client):
    tc = client._coordinators().tc(1)
    expired = tc.new_transaction(200, partitions=[P])
    time.sleep(0.3)
    with pytest.raises(ExpiredTransactionError, match="passed its timeout"):
        tc.extend(expired.txn_id, 60_000)
    assert tc.get(expired.txn_id).status is TxnStatus.OPEN  # not resurrected: still past its deadline
    assert tc.abort_expired(expired.txn_id).status is TxnStatus.ABORTED
    with pytest.raises(ExpiredTransactionError, match="timed out"):
        tc.extend(expired.txn_id, 60_000)
    ended = tc.new_transaction(60_000, partitions=[P])
    tc.end_transaction(ended.txn_id, TxnAction.COMMIT)
    with pytest.raises(InvalidTxnStatusError, match="it is COMMITTED.*only OPEN transactions can be kept alive"):
        tc.extend(ended.txn_id, 60_000)
    with pytest.raises(ValueError):
        tc.extend(ended.txn_id, 0)


def _driver_and_worker(client) -> tuple[Coordinators, Coordinators]:
    """Two processes' views of one root (each its own cached TC rows): the driver's keeper, and a
    reused pyspark worker whose tasks register partitions (``Coordinators.shared`` there)."""
    client.admin.create_topic("kw", 2)
    return (Coordinators(StorageRoot.resolve(client.root.url), config=KEEP),
            Coordinators(StorageRoot.resolve(client.root.url), config=KEEP))


KW = [str(TopicName.parse(f"kw-partition-{i}")) for i in range(2)]


def test_a_worker_holding_a_row_from_before_a_keep_alive_still_registers(client):
    """The worker's row says OPEN past its deadline; the log, extended since by the keeper, says
    OPEN for another minute: the log's word is taken, on the first try and on a retry."""
    driver, worker = _driver_and_worker(client)
    t = driver.tc(0).new_transaction(500).txn_id
    worker.for_txn(t).add_partitions(t, [KW[0]])  # task A: the worker now holds the row, deadline 500 ms
    driver.tc(0).extend(t, 60_000)  # the keeper
    time.sleep(0.7)  # past the deadline the worker's row holds, well before the log's
    assert worker.for_txn(t).add_partitions(t, [KW[1]]).partitions == frozenset(KW)  # task B, same worker
    assert worker.for_txn(t).add_partitions(t, [KW[1]]).partitions == frozenset(KW)  # a retry: a no-op
    logged = driver.tc(0).get(t, refresh=True)
    assert (logged.status, logged.partitions) == (TxnStatus.OPEN, frozenset(KW))
    assert driver.tc(0).end_transaction(t, TxnAction.COMMIT).status is TxnStatus.COMMITTED


def test_a_commit_from_a_process_holding_a_row_from_before_a_keep_alive(client):
    driver, committer = _driver_and_worker(client)
    t = driver.tc(0).new_transaction(500, partitions=[KW[0]]).txn_id
    assert committer.for_txn(t).get(t).timeout_ms == 500  # the committer now holds the row
    driver.tc(0).extend(t, 60_000)
    time.sleep(0.7)
    assert committer.for_txn(t).end_transaction(t, TxnAction.COMMIT).status is TxnStatus.COMMITTED
    assert driver.tc(0).get(t, refresh=True).status is TxnStatus.COMMITTED


def test_a_transaction_the_log_holds_expired_is_still_refused_after_the_re_read(client):
    driver, worker = _driver_and_worker(client)
    t = driver.tc(0).new_transaction(300).txn_id
    worker.for_txn(t).add_partitions(t, [KW[0]])
    time.sleep(0.4)  # no keep-alive: the log's deadline passed too
    for _ in range(2):
        with pytest.raises(ExpiredTransactionError, match="passed its timeout"):
            worker.for_txn(t).add_partitions(t, [KW[1]])
    logged = driver.tc(0).get(t, refresh=True)
    assert (logged.status, logged.partitions) == (TxnStatus.OPEN, frozenset(KW[:1]))
    assert driver.tc(0).abort_expired(t).status is TxnStatus.ABORTED
    with pytest.raises(ExpiredTransactionError, match="timed out"):  # the decision, read from the log
        worker.for_txn(t).add_partitions(t, [KW[1]])


def _stand_in_driver() -> tuple[subprocess.Popen, keepalive.Driver]:
    """A process playing the driver JVM: the keeper watches its pid and start time."""
    proc = subprocess.Popen(["sleep", "600"])
    start = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[19]
    return proc, keepalive.Driver(os.uname().nodename, proc.pid, start)


def _status_after(tc, txn_id) -> TxnStatus:
    """What a READ_COMMITTED reader resolves: an OPEN transaction past its deadline is aborted."""
    meta = tc.get(txn_id, refresh=True)
    if meta.expired(now_ms()):
        meta = tc.abort_expired(txn_id)
    return meta.status


def test_keeper_process_keeps_a_transaction_alive_while_its_driver_lives(client):
    """Timeout 5 s: the keeper process starts in about 1-2 s (more on a loaded machine) and must
    extend the transaction before it ends. The keeper process, which knows the transaction only
    from the TC log (no thread of this process helps), holds it OPEN for 11 s; once the driver is
    killed the transaction aborts within the timeout."""
    proc, driver = _stand_in_driver()
    try:
        tc = client._coordinators().tc(0)
        m = tc.new_transaction(5_000, partitions=[P], properties=keepalive.properties(5_000, driver))
        pid = keepalive.ensure_keeper(client.root, driver, 5_000)
        assert pid is not None
        assert keepalive.ensure_keeper(client.root, driver, 5_000) is None  # exactly one keeper
        end = time.monotonic() + 11
        while time.monotonic() < end:
            assert _status_after(tc, m.txn_id) is TxnStatus.OPEN
            time.sleep(0.2)
        proc.kill()
        proc.wait()
        killed = time.monotonic()
        while _status_after(tc, m.txn_id) is TxnStatus.OPEN:
            assert time.monotonic() - killed < 5.0 + 1.0, "not aborted within the timeout after the driver died"
            time.sleep(0.05)
        assert tc.get(m.txn_id).status is TxnStatus.ABORTED and tc.get(m.txn_id).reason == "timed out"
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1][:3]:
            assert time.monotonic() < deadline, "the keeper outlived its driver"
            time.sleep(0.1)
    finally:
        proc.kill()


def test_an_idle_keeper_leaves_and_hands_its_lock_on(client, monkeypatch):
    """With nothing to keep for IDLE_EXIT_S the keeper releases its lock and leaves (the next
    transaction starts a new one); while one of its driver's transactions is OPEN it stays."""
    import fcntl
    import threading

    monkeypatch.setattr(keepalive, "IDLE_EXIT_S", 0.5)
    proc, driver = _stand_in_driver()
    try:
        fd = os.open(keepalive.lock_path(client.root, driver), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        tc = client._coordinators().tc(0)
        m = tc.new_transaction(3_000, partitions=[P], properties=keepalive.properties(3_000, driver))
        stop = threading.Event()
        t = threading.Thread(target=keepalive.keeper_loop, args=(client.root, driver, 3_000, fd, stop.is_set))
        t.start()
        t.join(4.0)
        assert t.is_alive() and _status_after(tc, m.txn_id) is TxnStatus.OPEN  # kept: past its 3 s
        tc.end_transaction(m.txn_id, TxnAction.COMMIT)
        t.join(10.0)
        assert not t.is_alive(), "an idle keeper did not leave"
        assert keepalive.ensure_keeper(client.root, driver, 3_000) is not None  # the lock was released
        os.close(fd)
    finally:
        proc.kill()



HOUR = 3_600_000


def test_a_long_timeout_does_not_starve_a_later_shorter_one_in_the_keeper_process(client, monkeypatch):
    """The keeper process slept a third of the first timeout it saw before looking again: after a
    job with transactionTimeoutMs of an hour (20 min asleep), a later transaction of the same driver
    with a short timeout was never extended and expired."""
    import threading

    monkeypatch.setattr(keepalive, "MAX_SCAN_S", 0.3, raising=False)  # its cap on that sleep, shortened
    proc, driver = _stand_in_driver()
    try:
        tc = client._coordinators().tc(0)
        tc.new_transaction(HOUR, partitions=[P], properties=keepalive.properties(HOUR, driver))
        stop = threading.Event()
        t = threading.Thread(target=keepalive.keeper_loop, args=(client.root, driver, HOUR, None, stop.is_set))
        t.start()
        time.sleep(0.5)  # it has looked once and gone to sleep
        a = tc.new_transaction(1_500, partitions=[P], properties=keepalive.properties(1_500, driver))
        time.sleep(3.0)
        assert _status_after(tc, a.txn_id) is TxnStatus.OPEN
        stop.set()
        t.join(5)
    finally:
        proc.kill()


def test_a_long_timeout_does_not_starve_a_later_shorter_one_in_the_local_thread(client):
    """The thread of the process that began the transactions slept a third of the shortest timeout
    it had, and was not woken by a new one; a huge timeout also crashed it (``time.sleep``
    overflow), ending the keep-alive of every later transaction of its process."""
    proc, driver = _stand_in_driver()
    try:
        tc = client._coordinators().tc(0)
        local = keepalive._LocalKeeper(client.root, driver)
        local.add(tc.new_transaction(HOUR, properties=keepalive.properties(HOUR, driver)).txn_id, HOUR)
        local.add(tc.new_transaction(10**20, properties=keepalive.properties(10**20, driver)).txn_id, 10**20)
        time.sleep(0.5)
        a = tc.new_transaction(1_500, partitions=[P], properties=keepalive.properties(1_500, driver))
        local.add(a.txn_id, 1_500)
        time.sleep(3.0)
        assert _status_after(tc, a.txn_id) is TxnStatus.OPEN
    finally:
        proc.kill()
