"""Acknowledgement-only transactions in real processes, SIGKILLed at each step of their commit.

The child receives three messages, acknowledges them in one transaction (pending acks carrying the
transaction's deadline; nothing in the TC log yet), then stops at a step: after the pending acks,
before or after the one TC entry holding NEW, the subscription and the decision, before the final
entry, or after commit() returned. The parent SIGKILLs it and checks, with the real code, the exact
outcome: the three messages redelivered exactly once each (no decision landed: the id is fenced
once its deadline has passed) or acknowledged exactly once (the decision landed). This file is
also the child's script (``_procs``'s protocol: judged by what children print and by storage).
"""
from __future__ import annotations

import os
import time
from typing import Any

import pytest
from _procs import Child, emit, hang, main, read_tc_log
from reliability.final import subscribe_when_free
from test_consumer import redelivered, seed

pytestmark = pytest.mark.timeout(180)
HERE = os.path.abspath(__file__)
TOPIC = "persistent://public/default/ack-only"
P0 = f"{TOPIC}-partition-0"
N = 3
TIMEOUT_MS = 4000
LEASE_MS = 600  # the killed child's Exclusive lease frees the subscription soon
CFG = {"max_clock_skew_ms": 300, "recovery_grace_ms": 0}


class Proc(Child):
    script = HERE


def _client(root: str):
    import pulsartx
    from pulsartx.coordinator.coordinator import CoordinatorConfig

    return pulsartx.Client(root, num_coordinators=1, coordinator_config=CoordinatorConfig(**CFG))


# ================================ child side ======================================================


def ack_only(root: str, stage: str, go_file: str | None = None) -> Any:
    """Acknowledge N messages in one transaction and stop at ``stage`` (say ``stopped`` and wait to
    be killed), or with ``stage="fenced_owner"`` wait for ``go_file`` and try to commit."""
    from pulsartx.coordinator.state import TxnStatus
    from pulsartx.coordinator.tclog import TransactionLog

    info: dict[str, Any] = {}
    original = TransactionLog.write_many

    def write_many(log, entries):
        statuses = {m.status for m, _, _ in entries}
        deciding = statuses & {TxnStatus.COMMITTING, TxnStatus.ABORTING}
        if stage == "before_decision" and deciding:
            emit("EVENT", "stopped", info)
            hang()
        if stage == "before_final" and TxnStatus.COMMITTED in statuses:
            emit("EVENT", "stopped", info)
            hang()
        original(log, entries)
        if stage in ("after_decision", "after_abort_decision") and deciding:
            emit("EVENT", "stopped", info)
            hang()

    TransactionLog.write_many = write_many  # before the client: its TCs bind the method
    client = _client(root)
    cons = client.subscribe(TOPIC, "s", lease_ms=LEASE_MS)
    msgs = [cons.receive(10_000) for _ in range(N)]
    txn = client.new_transaction(timeout_ms=TIMEOUT_MS)
    meta = client._coordinators().tc(0).get(txn.id)
    info.update(txn=[txn.id.most_bits, txn.id.least_bits], deadline=meta.start_ms + meta.timeout_ms)
    cons.acknowledge(msgs, txn=txn)
    if stage == "acked":
        emit("EVENT", "stopped", info)
        hang()
    if stage == "fenced_owner":
        cons.close()  # gives the subscription up (its pending acks stay): the parent subscribes meanwhile
        emit("EVENT", "acked", info)
        while not os.path.exists(go_file):
            time.sleep(0.01)
        try:
            txn.commit()
        except Exception as e:
            return {"error": [c.__name__ for c in type(e).__mro__], "message": str(e)}
        return {"error": None}
    if stage == "after_abort_decision":
        txn.abort()
    else:
        txn.commit()
    if stage == "committed":
        client.flush()
        emit("EVENT", "stopped", info)
        hang()
    hang()  # the stage's hook stops it before this


COMMANDS = {"ack_only": ack_only}


# ================================ parent side =====================================================


def _seed(root: str) -> None:
    from pulsartx import InitialPosition

    c = _client(root)
    seed(c, TOPIC, N)
    c.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest).close()
    c.close()


def _subscribe(client):
    """The subscription, once the killed child's Exclusive lease has run out."""
    return subscribe_when_free(client, TOPIC, "s", 30, lease_ms=LEASE_MS)


def _wait_past(deadline_ms: int) -> None:
    time.sleep(max(0.0, (deadline_ms + CFG["max_clock_skew_ms"]) / 1000 - time.time()) + 0.1)


def _check_redelivered_once(root: str, info: dict, held_first: bool) -> None:
    from pulsartx.coordinator.state import TxnStatus
    from pulsartx.coordinator.tclog import FENCE_PROPERTY

    client = _client(root)
    reader = _subscribe(client)
    if held_first:  # before its deadline, the transaction may still commit: its messages stay held
        assert redelivered(reader, 300) == []
        assert time.time() * 1000 < info["deadline"], "too slow to see the hold before the deadline"
    _wait_past(info["deadline"])
    assert redelivered(reader) == [(f"m{i}", 1) for i in range(N)]
    assert redelivered(reader, 500) == []
    entry = read_tc_log(client.root.url, 0)[info["txn"][1]]
    assert entry.status is TxnStatus.ABORTED and FENCE_PROPERTY in entry.properties
    [st] = client.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    assert (st["markDeletePosition"], st["pendingAckCount"], st["unregisteredTransactions"]) == (N - 1, 0, {})
    reader.close()
    client.close()


def _check_acknowledged_once(root: str, info: dict, aborted: bool = False) -> None:
    from pulsartx.coordinator.state import Subscription, TxnStatus

    client = _client(root)
    tc = client._coordinators().tc(0)
    tc.open()
    tc.sweep(grace_ms=0)  # whoever opens the TC log next finishes a decided transaction
    reader = _subscribe(client)
    if aborted:
        assert redelivered(reader) == [(f"m{i}", 1) for i in range(N)]
    assert redelivered(reader, 800) == []
    entry = read_tc_log(client.root.url, 0)[info["txn"][1]]
    assert entry.status is (TxnStatus.ABORTED if aborted else TxnStatus.COMMITTED)
    assert entry.subscriptions == frozenset([Subscription(P0, "s")])
    [st] = client.admin.transactions.get_pending_ack_stats(TOPIC, "s")
    assert (st["markDeletePosition"], st["pendingAckCount"], st["unregisteredTransactions"]) == (N - 1, 0, {})
    _wait_past(info["deadline"])  # nothing changes after the deadline either: no fence over a decision
    assert redelivered(reader, 500) == []
    assert read_tc_log(client.root.url, 0)[info["txn"][1]].status is entry.status
    reader.close()
    client.close()


def _killed_at(tmp_path, stage: str) -> tuple[str, dict[str, Any]]:
    """A seeded root whose child was SIGKILLed at ``stage``, and what the child said of its transaction."""
    root = str(tmp_path / "root")
    _seed(root)
    child = Proc("ack_only", root=root, stage=stage)
    info = child.wait_event("stopped")
    child.sigkill()
    return root, info


@pytest.mark.parametrize("stage", ["acked", "before_decision"])
def test_killed_before_its_decision_it_is_fenced_after_its_deadline_and_redelivered_once(tmp_path, stage):
    root, info = _killed_at(tmp_path, stage)
    assert info["txn"][1] not in read_tc_log(root, 0)  # nothing of it in the TC log: only the pending acks
    _check_redelivered_once(root, info, held_first=True)


@pytest.mark.parametrize("stage", ["after_decision", "before_final", "committed"])
def test_killed_after_its_decision_it_is_acknowledged_once(tmp_path, stage):
    root, info = _killed_at(tmp_path, stage)
    _check_acknowledged_once(root, info)


def test_killed_after_its_abort_decision_it_is_redelivered_once(tmp_path):
    root, info = _killed_at(tmp_path, "after_abort_decision")
    _check_acknowledged_once(root, info, aborted=True)


def test_a_fenced_owner_cannot_commit_afterwards(tmp_path):
    """The owner lives on past its deadline; another process fences its id and redelivers; the
    owner's commit then fails with ExpiredTransactionError and changes nothing."""
    root = str(tmp_path / "root")
    _seed(root)
    go = str(tmp_path / "go")
    child = Proc("ack_only", root=root, stage="fenced_owner", go_file=go)
    info = child.wait_event("acked")
    _check_redelivered_once(root, info, held_first=True)
    open(go, "w").close()
    out = child.result()
    assert out["error"] is not None and "ExpiredTransactionError" in out["error"], out
    client = _client(root)
    reader = _subscribe(client)
    assert redelivered(reader, 800) == []  # acknowledged by the reader after the redelivery: once
    from pulsartx.coordinator.tclog import FENCE_PROPERTY

    entry = read_tc_log(root, 0)[info["txn"][1]]
    assert entry.status.value == "ABORTED" and FENCE_PROPERTY in entry.properties
    reader.close()
    client.close()


if __name__ == "__main__":
    main(COMMANDS)
