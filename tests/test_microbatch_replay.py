"""A replayed micro-batch is recognised as committed however many transactions its key began
since (a query in a crash loop begins one per restart)."""
from __future__ import annotations

import json

from commit_protocol.microbatch import MicroBatchTransaction
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
    import pulsartx
    from commit_protocol import handoff
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
