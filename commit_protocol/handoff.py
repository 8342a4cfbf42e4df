"""Handing a micro-batch's input range from the streaming source to the sink's transaction.

The source (``partitions(start, end)``, in the source runner) and the sink (``commit(messages,
batchId)``, in the sink runner) run in different processes and neither sees the other; the sink
alone knows the batch id and the checkpoint. The link is Spark's own offset log: the sink reads
``<checkpoint>/offsets/<batchId>``, whose source lines are exactly the offsets JSON our source
returned, and looks up the record the source left in storage under a hash of that JSON:

    <root>/streaming/handoff/<sha1(end offsets)>/<subscription>.json  -> {start, end, subscription}

With it, the sink's transaction cumulatively acknowledges the batch's input on the subscription,
so outputs and input position commit atomically (Kafka: offsets committed in the transaction).
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from pulsartx.storage.root import StorageRoot, read_url_text

log = logging.getLogger("pulsartx.commit_protocol")
# {topic: {partition: offset, TABLE_IDS: {partition: table id}}}: the ids are optional (offsets
# written before they were recorded have none), see datasource/stream_reader.py.
Offsets = dict[str, dict[str, Any]]
TABLE_IDS = "tableIds"


def positions(parts: dict[str, Any]) -> dict[str, int]:
    """One topic's ``{partition: offset}``, without its table ids."""
    return {p: o for p, o in parts.items() if p != TABLE_IDS}


def canonical(offsets: Offsets) -> str:
    return json.dumps(offsets, sort_keys=True, separators=(",", ":"))


def offsets_key(end: Offsets) -> str:
    return hashlib.sha1(canonical(end).encode()).hexdigest()


def is_offsets(value: Any) -> bool:
    """True for our offsets shape: {topic: {partition: offset}}, with or without table ids."""
    return isinstance(value, dict) and bool(value) and all(
        isinstance(t, str) and isinstance(p, dict) and all(isinstance(o, int) for o in positions(p).values())
        and isinstance(p.get(TABLE_IDS, {}), dict) for t, p in value.items())


@dataclass(frozen=True)
class Handoff:
    subscription: str
    start: Offsets
    end: Offsets


def record(root: StorageRoot, subscription: str, start: Offsets, end: Offsets) -> None:
    """Source side: remember that a batch ending at ``end`` consumed ``start..end`` for ``subscription``."""
    body = {"subscription": subscription, "start": start, "end": end, "created_ms": int(time.time() * 1000)}
    root.write_text(json.dumps(body, sort_keys=True), "streaming", "handoff", offsets_key(end), f"{subscription}.json")


def forget(root: StorageRoot, subscription: str, end: Offsets) -> None:
    """Source side, once the batch ending at ``end`` committed: its record is no longer needed."""
    try:
        root.rm("streaming", "handoff", offsets_key(end), f"{subscription}.json")
    except OSError as e:
        log.debug("hand-off cleanup skipped: %s", e)


def checkpoint_offsets(checkpoint: str, batch_id: int) -> list[Any]:
    """The per-source offsets Spark logged for ``batch_id`` (None where a line is not JSON), or []
    when the offset log has no such batch."""
    try:
        lines = read_url_text(checkpoint.rstrip("/") + f"/offsets/{batch_id}").splitlines()
    except FileNotFoundError:
        return []
    out: list[Any] = []
    for line in lines[2:]:  # "v1", then the batch metadata, then one line per source
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            out.append(None)
    return out


def find(root: StorageRoot, checkpoint: str | None, batch_id: int) -> list[Handoff]:
    """Sink side: the subscriptions whose input this batch consumed, with their ranges."""
    if not checkpoint:
        return []
    found: list[Handoff] = []
    for end in checkpoint_offsets(checkpoint, batch_id):
        if not is_offsets(end):
            continue
        key = offsets_key(end)
        for name in root.listdir("streaming", "handoff", key):
            text = root.read_text("streaming", "handoff", key, name)
            if text is None:
                continue
            body = json.loads(text)
            if canonical(body["end"]) == canonical(end):
                found.append(Handoff(body["subscription"], body["start"], body["end"]))
    return found
