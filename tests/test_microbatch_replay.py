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
