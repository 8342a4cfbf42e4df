"""A micro-batch acknowledges its input on every input partition inside its transaction: the
per-partition pending acks run side by side, and the batch commits only once all of them landed."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pulsartx.commit_protocol import handoff
from pulsartx.commit_protocol.microbatch import MicroBatchTransaction

import pulsartx
from pulsartx.buffer.state import txn_key
from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.state import Subscription, TxnStatus
from pulsartx.exceptions import StorageError
from pulsartx.naming import TopicName
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.store import shared_store

PARTITIONS = 4
TOPIC = "public/default/in"


def _setup(tmp_path: Path, query: str) -> tuple[StorageRoot, Path, list[Any]]:
    url = str(tmp_path / "root")
    with pulsartx.Client(url) as c:
        c.admin.create_topic("in", partitions=PARTITIONS)
        for p in range(PARTITIONS):
            prod = c.create_producer(f"in-partition-{p}")
            for i in range(20):
                prod.send(f"p{p}-m{i}".encode())
            prod.close()
    root = StorageRoot.resolve(url)
    stores = [shared_store(root, TopicName.parse(f"in-partition-{p}"), "s") for p in range(PARTITIONS)]
    for s in stores:
        s.create(-1)
    ck = tmp_path / "ck"
    (ck / "offsets").mkdir(parents=True)
    (ck / "metadata").write_text(json.dumps({"id": query}) + "\n")
    return root, ck, stores


def _hand_off(root: StorageRoot, ck: Path, batch_id: int, start: int, end: int) -> None:
    """What the source and Spark leave for the sink: the offset log's line and the hand-off record."""
    begin = {TOPIC: {str(p): start for p in range(PARTITIONS)}}
    until = {TOPIC: {str(p): end for p in range(PARTITIONS)}}
    (ck / "offsets" / str(batch_id)).write_text("v1\n{}\n" + json.dumps(until) + "\n")
    handoff.record(root, "s", begin, until)


def _positions(stores: list[Any]) -> list[tuple[int, Any, dict]]:
    out = []
    for s in stores:
        c = s.cursor()
        out.append((c.mark_delete, c.pending_cumulative, dict(c.pending)))
    return out


def test_every_input_partition_is_acknowledged_once_with_the_batch(tmp_path: Path) -> None:
    root, ck, stores = _setup(tmp_path, "query-ack-1")
    tcs = Coordinators.shared(root)
    for batch_id, (start, end) in enumerate([(0, 10), (10, 20)]):
        _hand_off(root, ck, batch_id, start, end)
        batch = MicroBatchTransaction.begin(root, "k-ack-1", str(ck), timeout_ms=600_000, connection="run")
        batch.commit([], batch_id=batch_id)
        meta = tcs.for_txn(batch.job.txn_id).get(batch.job.txn_id, refresh=True)
        assert meta.status is TxnStatus.COMMITTED
        assert meta.subscriptions == {Subscription(f"persistent://{TOPIC}-partition-{p}", "s")
                                      for p in range(PARTITIONS)}
        assert _positions(stores) == [(end - 1, None, {})] * PARTITIONS


def test_a_failed_partition_ack_fails_the_batch_and_its_replay_acknowledges_everything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One partition's pending ack fails: the commit raises only after the other partitions'
    updates have ended (none lands after the abort), nothing is acknowledged, the abort returns the
    pending acks that landed, and the replayed batch acknowledges every partition exactly once."""
    root, ck, stores = _setup(tmp_path, "query-ack-2")
    _hand_off(root, ck, 0, 0, 10)
    failing = stores[2]
    real_update = failing.update
    calls = []

    def refuse_once(fn: Any) -> Any:
        calls.append(fn)
        if len(calls) == 1:
            raise StorageError("injected: the pending ack's write failed")
        return real_update(fn)

    monkeypatch.setattr(failing, "update", refuse_once)
    batch = MicroBatchTransaction.begin(root, "k-ack-2", str(ck), timeout_ms=600_000, connection="run")
    k = txn_key(batch.job.txn_id.most_bits, batch.job.txn_id.least_bits)
    with pytest.raises(StorageError, match="injected"):
        batch.commit([], batch_id=0)
    assert _positions(stores) == [(-1, (k, 9), {}), (-1, (k, 9), {}), (-1, None, {}), (-1, (k, 9), {})]
    batch.abort([], batch_id=0)  # what Spark does with a batch whose commit failed
    tcs = Coordinators.shared(root)
    assert tcs.for_txn(batch.job.txn_id).get(batch.job.txn_id, refresh=True).status is TxnStatus.ABORTED
    assert _positions(stores) == [(-1, None, {})] * PARTITIONS

    replay = MicroBatchTransaction.begin(root, "k-ack-2", str(ck), timeout_ms=600_000, connection="run")
    replay.commit([], batch_id=0)
    assert _positions(stores) == [(9, None, {})] * PARTITIONS
    assert replay.committed_by(0) is None and MicroBatchTransaction.begin(
        root, "k-ack-2", str(ck), timeout_ms=600_000, connection="run").committed_by(0) == str(replay.job.txn_id)


def test_an_input_range_on_a_replaced_table_is_not_acknowledged(tmp_path: Path) -> None:
    """The source's offsets name each partition's table: a batch planned on a topic deleted and
    re-created since (read nothing of the new one, with failOnDataLoss=false) must not acknowledge
    the new topic's messages at the old topic's offsets. Fails before the fix: every new
    partition's subscription moved to offset 9, messages nobody read."""
    root, ck, stores = _setup(tmp_path, "query-ack-gone")
    begin = {TOPIC: {str(p): 0 for p in range(PARTITIONS)}}
    until = {TOPIC: {**{str(p): 10 for p in range(PARTITIONS)},
                     handoff.TABLE_IDS: {str(p): "a-table-deleted-since" for p in range(PARTITIONS)}}}
    (ck / "offsets" / "0").write_text("v1\n{}\n" + json.dumps(until) + "\n")
    handoff.record(root, "s", begin, until)
    batch = MicroBatchTransaction.begin(root, "k-ack-gone", str(ck), timeout_ms=600_000, connection="run")
    batch.commit([], batch_id=0)
    assert _positions(stores) == [(-1, None, {})] * PARTITIONS


def test_an_input_range_on_the_current_table_is_acknowledged(tmp_path: Path) -> None:
    root, ck, stores = _setup(tmp_path, "query-ack-same")
    from pulsartx.log.partition import PartitionLog

    ids = {str(p): PartitionLog(root, TopicName.parse(f"in-partition-{p}")).table_id for p in range(PARTITIONS)}
    begin = {TOPIC: {str(p): 0 for p in range(PARTITIONS)}}
    until = {TOPIC: {**{str(p): 10 for p in range(PARTITIONS)}, handoff.TABLE_IDS: ids}}
    (ck / "offsets" / "0").write_text("v1\n{}\n" + json.dumps(until) + "\n")
    handoff.record(root, "s", begin, until)
    batch = MicroBatchTransaction.begin(root, "k-ack-same", str(ck), timeout_ms=600_000, connection="run")
    batch.commit([], batch_id=0)
    assert _positions(stores) == [(9, None, {})] * PARTITIONS
