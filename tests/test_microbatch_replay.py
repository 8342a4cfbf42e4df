"""A replayed micro-batch is recognised as committed however many transactions its key began
since (a query in a crash loop begins one per restart)."""
from __future__ import annotations

import json
import zlib

import pytest
from pulsartx.commit_protocol.microbatch import MicroBatchTransaction

from pulsartx.coordinator.keys import MAX_TXNS_PER_KEY
from pulsartx.storage.root import StorageRoot


def test_a_batch_committed_before_more_than_32_restarts_is_still_known_committed(tmp_path):
    """Fails before the fix: committed_by looked only at the key's last 32 transactions, so after
    a crash loop (each restart begins the replayed batch's transaction and dies before committing)
    the batch's committing transaction fell off the list and the batch was written again."""
    root = StorageRoot.resolve(str(tmp_path / "root"))
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "metadata").write_text(json.dumps({"id": "query-1"}) + "\n")
    first = MicroBatchTransaction.begin(root, "k", str(ck), timeout_ms=600_000, connection="run-0")
    first.commit([], batch_id=7)
    for run in range(1, MAX_TXNS_PER_KEY + 3):  # each restart: a new run replays batch 7, then dies
        MicroBatchTransaction.begin(root, "k", str(ck), timeout_ms=600_000, connection=f"run-{run}")
    replay = MicroBatchTransaction.begin(root, "k", str(ck), timeout_ms=600_000, connection="run-last")
    assert replay.committed_by(7) == str(first.job.txn_id)
    assert replay.committed_by(8) is None


def test_a_zombie_batchs_late_cumulative_ack_does_not_block_the_next_batch(tmp_path):
    """A fenced batch's cumulative ack that lands after the fence aborted its transaction (the
    abort's pass over the subscription came first) is orphaned. Fails before the fix: every later
    batch's acknowledgement conflicted with it (TransactionConflict) and the stream could not
    commit until something else resolved it; now the batch returns it, as a consumer would."""
    from pulsartx.commit_protocol import handoff

    import pulsartx
    from pulsartx.buffer.state import txn_key
    from pulsartx.coordinator.registry import Coordinators
    from pulsartx.coordinator.state import Subscription, TxnAction
    from pulsartx.naming import TopicName
    from pulsartx.subscription.store import shared_store

    url = str(tmp_path / "root")
    with pulsartx.Client(url) as c:
        c.admin.create_topic("in", partitions=1)
        p = c.create_producer("in")
        for i in range(10):
            p.send(f"m{i}".encode())
    root = StorageRoot.resolve(url)
    part = TopicName.parse("in-partition-0")
    store = shared_store(root, part, "s")
    store.create(-1)
    tcs = Coordinators.shared(root)
    zombie = tcs.tc(0).new_transaction(600_000)
    tcs.tc(0).add_subscriptions(zombie.txn_id, [Subscription(str(part), "s")])
    tcs.tc(0).end_transaction(zombie.txn_id, TxnAction.ABORT)  # the fence, before the zombie's ack
    zk = txn_key(zombie.txn_id.most_bits, zombie.txn_id.least_bits)
    store.update(lambda cur: cur.txn_ack_cumulative(zk, 4))  # the zombie's late write
    ck = tmp_path / "ck"
    (ck / "offsets").mkdir(parents=True)
    (ck / "metadata").write_text(json.dumps({"id": "query-2"}) + "\n")
    start, end = {"public/default/in": {"0": 0}}, {"public/default/in": {"0": 10}}
    (ck / "offsets" / "0").write_text("v1\n{}\n" + json.dumps(end) + "\n")
    handoff.record(root, "s", start, end)
    batch = MicroBatchTransaction.begin(root, "k2", str(ck), timeout_ms=600_000, connection="run")
    batch.commit([], batch_id=0)
    cursor = store.cursor()
    assert (cursor.mark_delete, cursor.pending_cumulative, cursor.pending) == (9, None, {})


def test_a_batch_committed_on_another_tc_before_a_crash_loop_is_still_known_committed(tmp_path, monkeypatch):
    """Micro-batches begin on the TC their driver leases, so the runs of one query spread over
    several TC logs while the key's epoch stays on the TC the key hashes to. A run that committed
    batch 7 on one TC, then more than 32 restarts under other drivers (other leases), and the replay
    still finds the commit: the key row keeps naming every TC the key used."""
    from pulsartx.commit_protocol import driver

    from pulsartx.coordinator.keys import full_key
    from pulsartx.coordinator.registry import Coordinators

    root = StorageRoot.resolve(str(tmp_path / "root"))
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "metadata").write_text(json.dumps({"id": "query-3"}) + "\n")
    monkeypatch.setattr(driver, "driver_lease_owner", lambda: "host:1:spark-driver-first")
    first = MicroBatchTransaction.begin(root, "k3", str(ck), timeout_ms=600_000, connection="run-0")
    first.commit([], batch_id=7)
    committed_tc = first.job.txn_id.most_bits
    tcs_used = {committed_tc}
    for run in range(1, MAX_TXNS_PER_KEY + 8):
        monkeypatch.setattr(driver, "driver_lease_owner", lambda run=run: f"host:{run + 1}:spark-driver-{run}")
        batch = MicroBatchTransaction.begin(root, "k3", str(ck), timeout_ms=600_000, connection=f"run-{run}")
        tcs_used.add(batch.job.txn_id.most_bits)
    assert len(tcs_used) > 1  # the runs did spread over several TC logs
    tcs = Coordinators.shared(root)
    listed = tcs.key_store_of(full_key("spark-streaming", "k3")).txn_ids("spark-streaming", "k3")
    assert {t.most_bits for t in listed} == tcs_used and len(listed) <= MAX_TXNS_PER_KEY + tcs.count
    replay = MicroBatchTransaction.begin(root, "k3", str(ck), timeout_ms=600_000, connection="run-last")
    assert replay.committed_by(7) == str(first.job.txn_id)
    assert replay.committed_by(8) is None
    # Steady state: the previous batch is found by the walk over the key row.
    replay.commit([], batch_id=8)
    nxt = MicroBatchTransaction.begin(root, "k3", str(ck), timeout_ms=600_000, connection="run-last")
    assert nxt.committed_by(8) == str(replay.job.txn_id) and nxt.committed_by(9) is None


def test_a_batch_on_the_drivers_tc_commits_only_while_its_run_holds_the_key(tmp_path, monkeypatch):
    """The TC a batch began on checks the key's epoch on the key's own TC: a newer run whose claim
    died before it could fence the batch still stops the batch from committing."""
    from pulsartx.commit_protocol import driver

    from pulsartx.coordinator.keys import full_key
    from pulsartx.coordinator.registry import Coordinators
    from pulsartx.exceptions import TransactionFenced

    root = StorageRoot.resolve(str(tmp_path / "root"))
    tcs = Coordinators.shared(root)
    home = tcs.pick(full_key("spark-streaming", "k4"))
    owner = next(o for o in (f"host:9:spark-driver-{i}" for i in range(100))
                 if zlib.crc32(o.encode()) % tcs.count != home)
    monkeypatch.setattr(driver, "driver_lease_owner", lambda: owner)
    ok = MicroBatchTransaction.begin(root, "k4", None, timeout_ms=600_000, connection="run-0")
    assert ok.job.txn_id.most_bits != home
    ok.commit([], batch_id=0)
    batch = MicroBatchTransaction.begin(root, "k4", None, timeout_ms=600_000, connection="run-0")
    tcs.key_store_of(full_key("spark-streaming", "k4")).claim_connection("spark-streaming", "k4", "run-1")
    with pytest.raises(TransactionFenced):
        batch.commit([], batch_id=1)


def test_a_batch_begun_in_another_planner_worker_is_still_known_committed_after_tc_compaction(tmp_path):
    """pyspark begins each micro-batch in a planner worker, and its workers are processes, each
    issuing TxnIDs from a block of its own. Fails before the fix: batch 5 began in a worker whose
    block was higher than the one batch 6 then began in, so batch 6's transaction had the lower id;
    the TC log's compaction, which keeps a key's committed transaction with the highest id, kept
    batch 5's and trimmed batch 6's, and a replay of batch 6 did not find it: it was written twice."""
    import time

    from pulsartx.commit_protocol.driver import driver_coordinators

    from pulsartx.coordinator.tclog import TransactionLog

    root = StorageRoot.resolve(str(tmp_path / "root"))
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "metadata").write_text(json.dumps({"id": "query-4"}) + "\n")
    b4 = MicroBatchTransaction.begin(root, "k4", str(ck), timeout_ms=600_000, connection="run")
    b4.commit([], batch_id=4)
    tc = driver_coordinators(root).tc(b4.job.txn_id.most_bits)
    first_worker = tc._ids
    tc._ids = tc.txlog.lease_block(1000)  # batch 5 is planned in another worker: a later, higher block
    b5 = MicroBatchTransaction.begin(root, "k4", str(ck), timeout_ms=600_000, connection="run")
    b5.commit([], batch_id=5)
    tc._ids = first_worker  # batch 6 in the first worker again, its block not used up
    b6 = MicroBatchTransaction.begin(root, "k4", str(ck), timeout_ms=600_000, connection="run")
    b6.commit([], batch_id=6)
    assert b6.job.txn_id.most_bits != b5.job.txn_id.most_bits or b6.job.txn_id.least_bits > b5.job.txn_id.least_bits
    tl = TransactionLog(root, b6.job.txn_id.most_bits, compact_every=1, finished_retention_ms=0).open()
    tl.log.files_since_compaction = 1
    assert tl.maybe_compact(int(time.time() * 1000) + 1000)  # a full one: every finished entry is past retention
    replay = MicroBatchTransaction.begin(root, "k4", str(ck), timeout_ms=600_000, connection="run")
    assert replay.committed_by(6) == str(b6.job.txn_id)
