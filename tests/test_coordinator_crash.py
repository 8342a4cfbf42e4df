"""The TC with real processes: SIGKILL at every step of ending a transaction, and many processes
racing transactions against a sweeper.

PIP-31: once COMMITTING/ABORTING is in the TC log the outcome is decided, and whoever plays the TC
next rolls it forward ("TC Transaction Expiration" 2 and 3); an OPEN transaction of a dead client is
aborted after its timeout. Markers are written at most once per partition and transaction however
often recovery runs. Children are fresh interpreters (tests/_procs.py explains the protocol).
"""
from __future__ import annotations

import os
import time
from collections import Counter

import pytest
from _procs import BIG_RETENTION_MS, Child, count_markers, data_rows, read_tc_log

import pulsartx
from pulsartx.coordinator.coordinator import CoordinatorConfig, now_ms
from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import InvalidTxnStatusError

NPARTS = 4
CHILD_CFG = {"finished_retention_ms": BIG_RETENTION_MS}
RECOVER = CoordinatorConfig(finished_retention_ms=BIG_RETENTION_MS, recovery_grace_ms=0)
MARKER = {TxnAction.COMMIT: "TXN_COMMIT", TxnAction.ABORT: "TXN_ABORT"}


@pytest.fixture
def root_url(tmp_path) -> str:
    path = tmp_path / "crash-root"
    path.mkdir()
    c = pulsartx.Client(str(path), num_coordinators=2, coordinator_config=RECOVER)
    c.admin.create_topic("crash", NPARTS)
    c.close()
    return str(path)


def txn_markers(root_url: str, txn: TxnID) -> Counter:
    return Counter({(p, t): n for (p, t, tid), n in count_markers(root_url, "crash", NPARTS).items()
                    if tid == txn.as_tuple()})


def crash_at(root_url: str, stage: str, action: TxnAction = TxnAction.COMMIT, **kw) -> tuple[TxnID, dict]:
    child = Child("crash_txn", root=root_url, topic="crash", partitions=NPARTS, stage=stage, action=action.value,
                  cfg=CHILD_CFG, **kw)
    try:
        event = child.wait_event(stage, timeout=90)
        txn = TxnID(*event["txn"])
        # The child is parked at the step: look at the durable state before killing it.
        before = read_tc_log(root_url, txn.tc_id)[txn.least_bits]
        event["before"] = before
        event["markers_before"] = txn_markers(root_url, txn)
    finally:
        if child.proc.poll() is None:
            child.sigkill()
    return txn, event


def recover(root_url: str, txn: TxnID):
    """Open the TC in a new client (open sweeps with recovery_grace_ms=0), then sweep again."""
    c = pulsartx.Client(root_url, coordinator_config=RECOVER)
    tc = c._coordinators().tc(txn.tc_id)
    first = tc.get(txn, refresh=True)
    c.admin.transactions.sweep(grace_ms=0)
    return c, tc, first


def assert_recovery_is_stable(root_url, c, tc, txn, action):
    """Repeated sweeps (also by other clients) and a client retry change nothing and write no marker."""
    expected = Counter({(i, MARKER[action]): 1 for i in range(NPARTS)})
    assert txn_markers(root_url, txn) == expected
    other = pulsartx.Client(root_url, coordinator_config=RECOVER)
    for sweeper in (c, other, c):
        assert sweeper.admin.transactions.sweep(grace_ms=0) == {"timed_out": 0, "completed": 0, "failed": 0}
    assert tc.end_transaction(txn, action).status is action.final_status
    with pytest.raises(InvalidTxnStatusError):
        tc.end_transaction(txn, TxnAction.ABORT if action is TxnAction.COMMIT else TxnAction.COMMIT)
    assert txn_markers(root_url, txn) == expected
    assert data_rows(root_url, "crash", NPARTS) == Counter({(i, txn.as_tuple()): 1 for i in range(NPARTS)})
    assert read_tc_log(root_url, txn.tc_id)[txn.least_bits].status is action.final_status


# ---- SIGKILL at each step ---------------------------------------------------------------------------------


def test_killed_after_new_is_aborted_after_its_timeout(root_url):
    timeout_ms = 3000
    txn, ev = crash_at(root_url, "open", timeout_ms=timeout_ms)
    before = ev["before"]
    assert before.status is TxnStatus.OPEN and len(before.partitions) == NPARTS
    assert ev["markers_before"] == Counter()
    c, tc, first = recover(root_url, txn)
    if now_ms() < before.start_ms + timeout_ms - 200:  # (not asserted on a machine too slow to get here in time)
        assert first.status is TxnStatus.OPEN
        assert tc.get(txn, refresh=True).status is TxnStatus.OPEN  # a sweep before the timeout leaves it alone
    time.sleep(max(0.0, (before.start_ms + timeout_ms + 50 - now_ms()) / 1000))
    res = c.admin.transactions.sweep(grace_ms=0)
    assert res["timed_out"] == (1 if first.status is TxnStatus.OPEN else 0)
    m = tc.get(txn, refresh=True)
    assert (m.status, m.reason) == (TxnStatus.ABORTED, "timed out")
    assert_recovery_is_stable(root_url, c, tc, txn, TxnAction.ABORT)


@pytest.mark.parametrize("action", [TxnAction.COMMIT, TxnAction.ABORT])
def test_killed_after_decision_is_rolled_forward(root_url, action):
    txn, ev = crash_at(root_url, "decided", action)
    assert ev["status"] == action.ending_status.value
    assert ev["before"].status is action.ending_status
    assert ev["markers_before"] == Counter()  # no participant touched yet
    c, tc, first = recover(root_url, txn)
    assert first.status is action.final_status  # opening the TC finished it
    assert_recovery_is_stable(root_url, c, tc, txn, action)


@pytest.mark.parametrize("action", [TxnAction.COMMIT, TxnAction.ABORT])
def test_killed_in_the_middle_of_participants(root_url, action):
    txn, ev = crash_at(root_url, "mid", action, stop_after=2)
    assert ev["before"].status is action.ending_status
    assert ev["markers_before"] == Counter({(0, MARKER[action]): 1, (1, MARKER[action]): 1})  # 2 of 4 written
    c, tc, first = recover(root_url, txn)
    assert first.status is action.final_status
    assert_recovery_is_stable(root_url, c, tc, txn, action)


@pytest.mark.parametrize("action", [TxnAction.COMMIT, TxnAction.ABORT])
def test_killed_before_the_final_status(root_url, action):
    txn, ev = crash_at(root_url, "participants_done", action)
    assert ev["failures"] == 0
    assert ev["before"].status is action.ending_status
    assert ev["markers_before"] == Counter({(i, MARKER[action]): 1 for i in range(NPARTS)})
    c, tc, first = recover(root_url, txn)
    assert first.status is action.final_status
    assert_recovery_is_stable(root_url, c, tc, txn, action)


def test_grace_period_protects_a_live_tc(root_url):
    """With the default grace a sweeper leaves a fresh COMMITTING alone (a live TC is still writing)."""
    txn, ev = crash_at(root_url, "decided", TxnAction.COMMIT)
    c = pulsartx.Client(root_url, coordinator_config=CoordinatorConfig(finished_retention_ms=BIG_RETENTION_MS,
                                                                        recovery_grace_ms=60_000))
    tc = c._coordinators().tc(txn.tc_id)
    assert c.admin.transactions.sweep() == {"timed_out": 0, "completed": 0, "failed": 0}
    assert tc.get(txn, refresh=True).status is TxnStatus.COMMITTING
    assert txn_markers(root_url, txn) == Counter()
    assert c.admin.transactions.sweep(grace_ms=0)["completed"] == 1
    assert_recovery_is_stable(root_url, c, tc, txn, TxnAction.COMMIT)


# ---- many processes against one sweeper --------------------------------------------------------------------

N_WORKERS = 4
N_TXNS = int(os.environ.get("PULSARTX_TEST_TXNS_PER_PROC", "100"))
TINY_TIMEOUT_MS = 50


def test_concurrent_transactions_racing_a_sweeper(tmp_path):
    root_url = str(tmp_path / "race-root")
    os.mkdir(root_url)
    setup = pulsartx.Client(root_url, num_coordinators=16, coordinator_config=RECOVER)
    for w in range(N_WORKERS):
        setup.admin.create_topic(f"w{w}", 1)
    go, stop = str(tmp_path / "go"), str(tmp_path / "stop")
    workers = [Child("txn_worker", root=root_url, topic=f"w{w}", wid=w, n=N_TXNS, tiny_timeout_ms=TINY_TIMEOUT_MS,
                     seed=1000 + w, go_file=go, cfg=CHILD_CFG) for w in range(N_WORKERS)]
    sweeper = Child("sweeper", root=root_url, stop_file=stop, go_file=go, cfg=CHILD_CFG)
    try:
        open(go, "w").close()
        records = [r for w in workers for r in w.result(timeout=240)]
        open(stop, "w").close()
        swept = sweeper.result(timeout=60)
    finally:
        for ch in (*workers, sweeper):
            ch.kill()
    assert len(records) == N_WORKERS * N_TXNS
    assert swept["passes"] > 0

    # A last sweep once every tiny timeout has passed: nothing may stay unfinished.
    time.sleep(TINY_TIMEOUT_MS / 1000 + 0.05)
    final = pulsartx.Client(root_url, coordinator_config=RECOVER)
    final.admin.transactions.sweep(grace_ms=0)

    # TxnIDs: unique across processes (each reserves its own blocks, so there are gaps), and every
    # logged one is a transaction a worker began (no orphan entry). One that registered nothing writes
    # at most one entry, none if it ended past its timeout (nothing of it existed to abort).
    ids = [TxnID(*r["txn"]) for r in records]
    assert len(set(ids)) == len(ids)
    logged = {}
    for tc_id in range(16):
        log = read_tc_log(root_url, tc_id)
        logged.update({m.txn_id: m for m in log.values()})
    assert set(logged) <= set(ids)
    unlogged = [r for r, t in zip(records, ids, strict=True) if t not in logged]
    assert all(r["send"] != "ok" and r["tiny"] and r["observed"] != "ok" for r in unlogged), unlogged
    records = [r for r, t in zip(records, ids, strict=True) if t in logged]
    ids = [t for t in ids if t in logged]
    # exactly one final status each
    assert Counter(m.status for m in logged.values()).keys() <= {TxnStatus.COMMITTED, TxnStatus.ABORTED}

    outcomes: Counter = Counter()
    for r, t in zip(records, ids, strict=True):
        status = logged[t].status
        outcomes[(r["action"], r["observed"], status.value)] += 1
        if r["observed"] == "ok":
            expected = TxnStatus.COMMITTED if r["action"] == "commit" else TxnStatus.ABORTED
            assert status is expected, (r, logged[t])
            assert r["state"] == expected.value
        else:
            # only commits fail, only on a tiny timeout, and the transaction is then aborted
            assert (r["action"], r["observed"], r["tiny"]) == ("commit", "ExpiredTransactionError", True), r
            assert status is TxnStatus.ABORTED and r["state"] == "TIME_OUT", (r, logged[t])
        if r["send"] not in (None, "ok"):
            assert (r["send"], r["tiny"]) == ("ExpiredTransactionError", True), r
        if r["send"] == "ok":
            assert len(logged[t].partitions) == 1

    # Markers: one per transaction that registered its partition, of the logged outcome; no other.
    expected_markers: Counter = Counter()
    got: Counter = Counter()
    for w in range(N_WORKERS):
        for (_, mtype, tid), n in count_markers(root_url, f"w{w}", 1).items():
            got[(w, mtype, tid)] += n
    for m in logged.values():
        if m.partitions:
            mtype = "TXN_COMMIT" if m.status is TxnStatus.COMMITTED else "TXN_ABORT"
            expected_markers[(_worker_of(m), mtype, m.txn_id.as_tuple())] += 1
    assert got == expected_markers
    # the race really happened: both outcomes of a commit, and timeouts
    assert outcomes[("commit", "ok", "COMMITTED")] > 0 and outcomes[("abort", "ok", "ABORTED")] > 0
    assert outcomes[("commit", "ExpiredTransactionError", "ABORTED")] > 0, outcomes
    print(f"\n{len(records)} transactions; outcomes {dict(outcomes)}; sweeper {swept}")


def _worker_of(meta) -> int:
    (partition,) = meta.partitions
    return int(partition.rsplit("/", 1)[1].split("-partition-")[0][1:])
