"""A commit marker's guard app id lives an hour, not the table's week: Delta forgets it (and leaves
it out of checkpoints) while producers' dedup ids stay; a marker repeated after that, by a late
recovery, changes nothing any reader sees."""
from __future__ import annotations

import time

import deltalake as dl
from _reads import committed_values

import pulsartx
from pulsartx.buffer.markers import marker_app_id, write_marker
from pulsartx.coordinator.state import TxnAction
from pulsartx.log.dedup import producer_app_id
from pulsartx.log.partition import GUARD_LIFETIME_MS, PartitionLog
from pulsartx.naming import TopicName
from pulsartx.storage.root import StorageRoot

WEEK_MS = 7 * 86_400_000


def _txn_actions(path: str) -> dict[str, dict]:
    import json
    import os

    out = {}
    log_dir = os.path.join(path, "_delta_log")
    for name in sorted(os.listdir(log_dir)):
        if name.endswith(".json"):
            for line in open(os.path.join(log_dir, name)):
                a = json.loads(line)
                if "txn" in a:
                    out[a["txn"]["appId"]] = a["txn"]
    return out


def test_a_marker_guard_expires_after_an_hour_and_a_repeated_marker_changes_nothing(tmp_path, monkeypatch):
    root = str(tmp_path / "root")
    client = pulsartx.Client(root)
    client.admin.create_topic("g", partitions=1)
    producer = client.create_producer("g", producer_name="p1")
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 2 * GUARD_LIFETIME_MS / 1000)  # all this, two hours ago
    txn = client.new_transaction()
    producer.send(b"once", txn=txn)
    txn.commit()
    assert client.flush()
    monkeypatch.setattr(time, "time", real)
    partition = client.get_topic_partitions("g")[0]
    path = StorageRoot.resolve(root).fs_path(*PartitionLog(StorageRoot.resolve(root), TopicName.parse(partition)).segments)
    acts = _txn_actions(path)
    guard, dedup = acts[marker_app_id(txn.id)], acts[producer_app_id("p1")]
    # the guard was written an hour short of the week's retention; the producer's id as it was
    assert abs(guard["lastUpdated"] - (dedup["lastUpdated"] - WEEK_MS + GUARD_LIFETIME_MS)) < 5_000
    table = dl.DeltaTable(path)
    assert table.transaction_version(marker_app_id(txn.id)) is None  # forgotten two hours later
    assert table.transaction_version(producer_app_id("p1")) is not None  # dedup state kept
    table.create_checkpoint()  # and the checkpoint leaves it out
    assert dl.DeltaTable(path).transaction_version(marker_app_id(txn.id)) is None
    # a late recovery in another process repeats the marker: it is appended again (the guard is
    # gone), and nothing anyone reads changes
    fresh = pulsartx.Client(root)
    late = PartitionLog(fresh.root, TopicName.parse(partition))
    res = write_marker(fresh.root, partition, txn.id, TxnAction.COMMIT, plog=late)
    assert res.version is not None
    assert committed_values(fresh, "g") == [b"once"]
    later = fresh.new_transaction()
    fresh.create_producer("g").send(b"later", txn=later)
    later.commit()
    assert committed_values(fresh, "g") == [b"once", b"later"]
    # within the hour, the guard holds, for a fresh writer as for the one that wrote the marker
    assert fresh.flush()
    assert write_marker(fresh.root, partition, later.id, TxnAction.COMMIT).version is None
    again = PartitionLog(fresh.root, TopicName.parse(partition))
    assert write_marker(fresh.root, partition, later.id, TxnAction.COMMIT, plog=again).version is None
    for c in (client, fresh):
        c.close()
