"""Paused owners (zombies) that resume after another process finished their transaction.

A child process stops at an exact step (a patched hook waits for a go file, as SIGSTOP would hold
it), the parent finishes or aborts its transaction from another client, then lets the child go on.
What the zombie writes afterwards must change nothing anyone sees:
  * a send that passed its checks before the abort lands behind the abort marker: it stays hidden,
    for a reader of a new process and after the coordinator service snapshots the partition;
  * a background completion that resumes after a sweep completed its transaction writes no second
    marker and ends no acknowledgement twice.
Also: three processes recovering one half-marked transaction at the same instant apply it once, and
a SIGKILL inside a TC-log compaction (file written, commit not) loses and reissues nothing.
This file is also the children's script (``_procs``'s protocol).
"""
from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import pytest
from _procs import BIG_RETENTION_MS, Child, _wait_for, count_markers, data_rows, emit, hang, main, read_tc_log
from _reads import committed_values

pytestmark = pytest.mark.timeout(120)
HERE = os.path.abspath(__file__)
TOPIC = "zombie"
SOURCE = "zsrc"
NPARTS = 2
CFG = {"finished_retention_ms": BIG_RETENTION_MS, "recovery_grace_ms": 0}


class Proc(Child):
    script = HERE


def _client(root: str):
    import pulsartx
    from pulsartx.coordinator.coordinator import CoordinatorConfig

    return pulsartx.Client(root, num_coordinators=1, coordinator_config=CoordinatorConfig(**CFG))


# ================================ child side ======================================================


def late_send(root: str, go_file: str, timeout_ms: int) -> Any:
    """Send and flush one message in a transaction, then send a second one whose append stops right
    after the transaction let it through (``_before_append``) until ``go_file`` exists."""
    from pulsartx.client import transaction as transaction_mod

    client = _client(root)
    producer = client.create_producer(f"{TOPIC}-partition-0")
    txn = client.new_transaction(timeout_ms=timeout_ms)
    producer.send(b"t0", txn=txn)
    info = {"txn": list(txn.id.as_tuple())}
    original = transaction_mod.Transaction._before_append

    def before_append(self, partition, registered=False):
        out = original(self, partition, registered)
        emit("EVENT", "paused", info)
        _wait_for(go_file)
        return out

    transaction_mod.Transaction._before_append = before_append
    try:
        producer.send(b"t1", txn=txn)
        sent = "ok"
    except Exception as e:
        sent = type(e).__name__
    return {"sent": sent}


def late_completion(root: str, go_file: str, action: str = "COMMIT") -> Any:
    """Acknowledge one message and send one to each partition in a transaction, ``action`` it (returns
    at the decision), with the background completion stopped until ``go_file`` exists; then let it
    run and report the final status it reached."""
    import pulsartx
    from pulsartx.coordinator.coordinator import TransactionCoordinator

    original = TransactionCoordinator._complete
    info: dict[str, Any] = {}

    def complete(self, meta):
        emit("EVENT", "decided", info)
        _wait_for(go_file)
        return original(self, meta)

    client = _client(root)
    consumer = client.subscribe(SOURCE, "s", consumer_type=pulsartx.ConsumerType.Shared,
                                initial_position=pulsartx.InitialPosition.Earliest)
    msg = consumer.receive(10_000)
    txn = client.new_transaction(timeout_ms=600_000)
    info["txn"] = list(txn.id.as_tuple())
    consumer.acknowledge(msg, txn=txn)
    consumer.close()  # returns what it received beyond ``msg``
    for i, name in enumerate(client.get_topic_partitions(TOPIC)):
        client.create_producer(name).send(f"out-{i}".encode(), txn=txn)
    TransactionCoordinator._complete = complete
    txn.commit() if action == "COMMIT" else txn.abort()
    fut = client._coordinators().completer
    assert fut.flush(60)
    return {"status": read_tc_log(root, txn.id.most_bits)[txn.id.least_bits].status.value}


def compaction_kill(root: str, compact_every: int) -> Any:
    """Commit one-message transactions until a TC-log compaction has written its file, then stop
    before its commit (say ``compacting`` with every transaction committed so far) and wait."""
    import pulsartx
    from pulsartx.coordinator.coordinator import CoordinatorConfig
    from pulsartx.coordinator.tclog import tc_segments
    from pulsartx.storage.appender import DeltaAppender

    done: list[list[int]] = []
    original = DeltaAppender.commit_rewrite

    def commit_rewrite(self, files, removes, *a, **kw):
        if tuple(self.segments) == tc_segments(0):
            emit("EVENT", "compacting", {"committed": done})
            hang()
        return original(self, files, removes, *a, **kw)

    DeltaAppender.commit_rewrite = commit_rewrite
    cfg = CoordinatorConfig(compact_every=compact_every, finished_retention_ms=0, lease_ms=0)
    client = pulsartx.Client(root, num_coordinators=1, coordinator_config=cfg)
    producer = client.create_producer(f"{TOPIC}-partition-0")
    for i in range(10 * compact_every):
        txn = client.new_transaction()
        producer.send(f"c{i}".encode(), txn=txn)
        txn.commit()
        done.append(list(txn.id.as_tuple()))
    raise AssertionError("no compaction came")


COMMANDS = {"late_send": late_send, "late_completion": late_completion, "compaction_kill": compaction_kill}


# ================================ parent side =====================================================


def _root(tmp_path) -> str:
    import pulsartx

    root = str(tmp_path / "root")
    os.mkdir(root)
    c = _client(root)
    c.admin.create_topic(TOPIC, NPARTS)
    c.admin.create_topic(SOURCE, 1)
    p = c.create_producer(SOURCE)
    for i in range(3):
        p.send(f"in-{i}".encode())
    c.subscribe(SOURCE, "s", consumer_type=pulsartx.ConsumerType.Shared,
                initial_position=pulsartx.InitialPosition.Earliest).close()
    c.close()
    return root


def test_a_send_of_a_paused_owner_landing_after_its_abort_stays_hidden(tmp_path):
    from pulsartx.service import CoordinatorService

    root = _root(tmp_path)
    go = str(tmp_path / "go")
    timeout_ms = 1500
    child = Proc("late_send", root=root, go_file=go, timeout_ms=timeout_ms)
    try:
        txn = tuple(child.wait_event("paused")["txn"])
        time.sleep(timeout_ms / 1000 + 0.3)
        reader = _client(root)
        assert committed_values(reader, TOPIC) == []  # the reader aborts the expired transaction
        reader.close()
        open(go, "w").close()
        assert child.result(60) == {"sent": "ok"}  # it passed its checks before the abort
    finally:
        child.kill()
    # the late message is in the partition, behind the abort marker
    assert count_markers(root, TOPIC, NPARTS) == Counter({(0, "TXN_ABORT", txn): 1})
    assert data_rows(root, TOPIC, NPARTS)[(0, txn)] == 2
    fresh = _client(root)
    assert committed_values(fresh, TOPIC) == []
    svc = CoordinatorService(fresh, grace_ms=0)
    svc.run_pass()  # settles and snapshots the partition
    fresh.create_producer(f"{TOPIC}-partition-0").send(b"plain")
    fresh.close()
    again = _client(root)
    assert committed_values(again, TOPIC) == [b"plain"]
    again.close()


@pytest.mark.parametrize("action", ["COMMIT", "ABORT"])
def test_a_background_completion_resuming_after_a_sweep_finished_it_changes_nothing(tmp_path, action):
    """Between the sweep and the zombie's resumption, the returned messages (after an abort) are
    received and acknowledged again: the zombie's late participant calls must not return them."""
    from test_consumer import redelivered

    import pulsartx

    root = _root(tmp_path)
    go = str(tmp_path / "go")
    child = Proc("late_completion", root=root, go_file=go, action=action)
    final = "COMMITTED" if action == "COMMIT" else "ABORTED"
    out_values = [b"out-0", b"out-1"] if action == "COMMIT" else []
    try:
        info = child.wait_event("decided")
        txn = tuple(info["txn"])
        other = _client(root)
        other.admin.transactions.sweep(grace_ms=0)  # the child is "dead": another process finishes
        assert read_tc_log(root, txn[0])[txn[1]].status.value == final
        assert sorted(committed_values(other, TOPIC)) == out_values
        c = other.subscribe(SOURCE, "s", consumer_type=pulsartx.ConsumerType.Shared,
                            initial_position=pulsartx.InitialPosition.Earliest)
        got = sorted(v for v, _ in redelivered(c, 800))
        assert got == (["in-1", "in-2"] if action == "COMMIT" else ["in-0", "in-1", "in-2"])
        c.close()
        other.close()
        open(go, "w").close()
        out = child.result(60)
    finally:
        child.kill()
    assert out == {"status": final}
    kind = "TXN_COMMIT" if action == "COMMIT" else "TXN_ABORT"
    markers = Counter({(p, t): n for (p, t, tid), n in count_markers(root, TOPIC, NPARTS).items() if tid == txn})
    assert markers == Counter({(0, kind): 1, (1, kind): 1})
    fresh = _client(root)
    assert sorted(committed_values(fresh, TOPIC)) == out_values
    c = fresh.subscribe(SOURCE, "s", consumer_type=pulsartx.ConsumerType.Shared,
                        initial_position=pulsartx.InitialPosition.Earliest)
    assert redelivered(c, 800) == []  # everything was acknowledged once, nothing comes back
    [st] = fresh.admin.transactions.get_pending_ack_stats(f"persistent://public/default/{SOURCE}", "s")
    assert st["pendingAckCount"] == 0, st
    c.close()
    fresh.close()


@pytest.mark.parametrize("action", ["COMMIT", "ABORT"])
def test_recovery_in_several_processes_at_once_applies_the_outcome_once(tmp_path, action):
    """A child killed with half its markers written; three processes sweep it at the same instant."""
    root = _root(tmp_path)
    child = Child("crash_txn", root=root, topic=TOPIC, partitions=NPARTS, stage="mid", action=action, stop_after=1,
                  cfg={"finished_retention_ms": BIG_RETENTION_MS})
    try:
        txn = tuple(child.wait_event("mid", timeout=60)["txn"])
    finally:
        child.sigkill()
    go, stop = str(tmp_path / "go"), str(tmp_path / "stop")
    sweepers = [Child("sweeper", root=root, stop_file=stop, go_file=go, pause_ms=1, cfg=CFG) for _ in range(3)]
    try:
        open(go, "w").close()
        deadline = time.monotonic() + 30
        while read_tc_log(root, txn[0])[txn[1]].status.value in ("COMMITTING", "ABORTING"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)  # the others keep sweeping the finished transaction
        open(stop, "w").close()
        done = [s.result(60) for s in sweepers]
    finally:
        for s in sweepers:
            s.kill()
    assert sum(d.get("completed", 0) for d in done) <= 1 and sum(d.get("failed", 0) for d in done) == 0, done
    kind = "TXN_COMMIT" if action == "COMMIT" else "TXN_ABORT"
    markers = Counter({(p, t): n for (p, t, tid), n in count_markers(root, TOPIC, NPARTS).items() if tid == txn})
    assert markers == Counter({(i, kind): 1 for i in range(NPARTS)}), (done, read_tc_log(root, txn[0]))
    assert read_tc_log(root, txn[0])[txn[1]].status.value == ("COMMITTED" if action == "COMMIT" else "ABORTED")
    fresh = _client(root)
    expected = sorted(f"m{i}".encode() for i in range(NPARTS)) if action == "COMMIT" else []
    assert sorted(committed_values(fresh, TOPIC)) == expected
    fresh.close()


def test_killed_during_a_tc_log_compaction_loses_and_repeats_nothing(tmp_path):
    """SIGKILL after a TC-log compaction wrote its file and before its commit: every transaction
    committed before stays committed and readable once, the log opens and compacts again, and new
    transactions get new ids."""
    import pulsartx
    from pulsartx.coordinator.coordinator import CoordinatorConfig

    root = _root(tmp_path)
    child = Proc("compaction_kill", root=root, compact_every=5)
    try:
        committed = [tuple(t) for t in child.wait_event("compacting")["committed"]]
    finally:
        child.sigkill()
    assert committed
    cfg = CoordinatorConfig(compact_every=5, finished_retention_ms=0, lease_ms=0)
    fresh = pulsartx.Client(root, coordinator_config=cfg)
    values = committed_values(fresh, TOPIC)
    assert values[:len(committed)] == [f"c{i}".encode() for i in range(len(committed))], values
    assert len(values) - len(committed) <= 1  # the one being committed when the kill came, at most
    producer = fresh.create_producer(f"{TOPIC}-partition-0")
    ids = set()
    for i in range(12):  # enough for compactions to run again
        txn = fresh.new_transaction()
        producer.send(f"n{i}".encode(), txn=txn)
        txn.commit()
        ids.add(txn.id.as_tuple())
    assert not ids & set(committed)
    assert committed_values(fresh, TOPIC)[-12:] == [f"n{i}".encode() for i in range(12)]
    assert fresh.admin.transactions.sweep(grace_ms=0)["failed"] == 0
    fresh.close()


if __name__ == "__main__":
    main(COMMANDS)
