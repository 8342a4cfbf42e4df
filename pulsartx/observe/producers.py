"""Who writes to a partition: each producer's last sequence id and when it last wrote.

Read from the partition table's Delta log, not its data: every append sets the app transaction
``pulsartx.producer.<name>`` (the dedup state, see :mod:`pulsartx.log.dedup`) with its commit time
as ``lastUpdated``, and the last checkpoint keeps them, so this costs the checkpoint's ``txn``
column and the commits after it. A producer idle longer than the table's app-id retention (7
days) is forgotten, as Pulsar forgets an inactive producer's dedup state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq

from pulsartx.log.dedup import producer_app_id
from pulsartx.storage import delta
from pulsartx.storage.delta import LogTail
from pulsartx.storage.root import StorageRoot

PREFIX = producer_app_id("")


@dataclass(frozen=True)
class ProducerState:
    name: str
    last_sequence_id: int
    last_publish_ms: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"producerName": self.name, "lastSequenceId": self.last_sequence_id,
                "lastPublishTime": self.last_publish_ms}


def _checkpoint_apps(root: StorageRoot, segments: tuple[str, ...]) -> tuple[int, dict[str, tuple[int, Any]]]:
    """(checkpoint version, app id -> (version, lastUpdated)); (-1, {}) without a usable checkpoint."""
    try:
        info = delta.read_last_checkpoint(root, segments)
    except ValueError:
        return -1, {}
    if info is None or info.get("parts"):
        return -1, {}
    version = info["version"]
    path = root.fs_path(*segments, "_delta_log", f"{version:020d}.checkpoint.parquet")
    try:
        with root.arrow_fs.open_input_file(path) as f:
            txn = pq.read_table(f, columns=["txn"]).column("txn")
    except (OSError, KeyError, ValueError):
        return -1, {}  # an unexpected layout: the commits from version 0 say the same
    apps = {t["appId"]: (int(t["version"]), t.get("lastUpdated")) for t in txn.filter(txn.is_valid()).to_pylist()}
    return version, apps


def producers(root: StorageRoot, segments: tuple[str, ...]) -> list[ProducerState]:
    """The producers of the partition table at ``segments``, by name."""
    version, apps = _checkpoint_apps(root, segments)
    for _, actions in LogTail(root, segments).commits_after(version):
        for a in actions:
            if "txn" in a:
                apps[a["txn"]["appId"]] = (int(a["txn"]["version"]), a["txn"].get("lastUpdated"))
    return [ProducerState(app[len(PREFIX):], v, None if ts is None else int(ts))
            for app, (v, ts) in sorted(apps.items()) if app.startswith(PREFIX)]
