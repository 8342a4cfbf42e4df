"""One partition's figures for ``topics stats``, after pulsar-admin's ``topics stats``.

Beyond offsets and the transaction buffer's counts: messages and markers counted apart (the
offset range counts both), files and bytes, each producer's last sequence id and write, publish
and consume rates, the transaction holding maxReadPosition back, and per subscription its type,
live consumers, unacknowledged deliveries and consume rate.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow.compute as pc

from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.coordinator.registry import Coordinators
from pulsartx.log.partition import PartitionLog
from pulsartx.log.schema import MessageType
from pulsartx.naming import TopicName
from pulsartx.observe.holdback import holding_back
from pulsartx.observe.producers import producers
from pulsartx.observe.rates import consume_rate, publish_rate
from pulsartx.storage import delta
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.leases import LEASE_SCHEMA, SHARED, is_lease
from pulsartx.subscription.ranges import RangeSet
from pulsartx.subscription.store import SubscriptionStore, subscription_dir


def count_markers(plog: PartitionLog, start: int, end: int) -> int:
    """Marker rows in ``[start, end)``: only files holding transactional rows can have any, and
    only their ``type`` column is read."""
    types = plog.read(start, end, columns=["type"], txn_only=True).column("type")
    return len(types) - pc.sum(pc.equal(types, MessageType.DATA.value).cast("int64")).as_py() if len(types) else 0


def consumers_of(root: StorageRoot, topic: TopicName, subscription: str, now_ms: int
                 ) -> tuple[str | None, list[dict[str, Any]]]:
    """(the subscription's consumer type, its consumers holding a live lease), from its lease
    table; (None, []) when no consumer ever subscribed. Read as it is: nothing is created."""
    segments = (*subscription_dir(topic.base, subscription), "consumers")
    if not root.exists(*segments, "_delta_log"):
        return None, []
    table = delta.open_table(root, *segments)
    if table is None:
        return None, []
    files = delta.add_actions(table).column("path").to_pylist()
    rows: dict[str, dict[str, Any]] = {}
    for r in delta.read_parquet(root, [root.fs_path(*segments, str(f)) for f in files], LEASE_SCHEMA).to_pylist():
        if r["key"] not in rows or r["seq"] > rows[r["key"]]["seq"]:
            rows[r["key"]] = r
    ctype = rows["meta"]["consumer_type"] if "meta" in rows else None
    # A partitioned Failover subscription's consumer has a presence row and a lease per partition it
    # is active on: listed once, with its latest expiry.
    expiry: dict[str, int] = {}
    for k, r in sorted(rows.items()):
        if (is_lease(k) or k.startswith(SHARED)) and r["consumer"] and (r["expires_ms"] or 0) > now_ms:
            expiry[r["consumer"]] = max(expiry.get(r["consumer"], 0), r["expires_ms"])
    live = [{"name": c, "leaseExpiresMs": e} for c, e in expiry.items()]
    return ctype, live


def unacked(store: SubscriptionStore, cursor: CursorState, now_ms: int) -> int:
    """Messages delivered and not acknowledged yet: what Shared consumers hold by live claims,
    less what is acknowledged or in PENDING_ACK. Exclusive and Failover consumers record no
    deliveries in storage, so theirs count 0 (their whole backlog is theirs to read)."""
    held = RangeSet()
    for c in store.claims():
        if c.expires_ms > now_ms and c.last > cursor.mark_delete:
            held.add_range(max(c.first, cursor.mark_delete + 1), c.last)
    for a, b in cursor.unavailable().ranges():
        held.remove_range(a, b)
    return len(held)


def subscription_extras(root: StorageRoot, p: TopicName, name: str, store: SubscriptionStore, cursor: CursorState,
                        now_ms: int) -> dict[str, Any]:
    """A subscription's figures beyond its cursor: type, live consumers, unacked, consume rate."""
    ctype, consumers = consumers_of(root, p, name, now_ms)
    return {"type": ctype, "consumers": consumers, "unackedMessages": unacked(store, cursor, now_ms),
            "msgRateOut": round(consume_rate(root, store.segments, now_ms=now_ms), 3)}


# The fields of a partition_stats row: a partition that cannot be read gets them all, empty.
PARTITION_STATS_KEYS = ("partition", "entries", "messages", "markers", "fileCount", "bytes", "startOffset",
                        "endOffset", "maxReadPosition", "ongoingTxnCount", "abortedTxnCount", "blockingTxn",
                        "msgRateIn", "producers")


def partition_stats(root: StorageRoot, p: TopicName, coordinators: Callable[[], Coordinators],
                    now_ms: int | None = None) -> dict[str, Any]:
    """The partition-wide figures ``topics stats`` shows for ``p`` (its subscriptions are the
    admin's part). ``coordinators`` is called only when a transaction is open in the partition
    (to name it), so a root without TCs gets none created."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    plog = PartitionLog(root, p)
    index = plog.refresh()
    state = TransactionBuffer(plog).state()
    start, end = index.start_offset, index.end_offset
    markers = count_markers(plog, start, end)
    blocker = holding_back(coordinators(), str(p), state) if state.read_limit < state.end_offset else None
    return {"partition": str(p), "entries": end - start,
            "messages": sum(f.num_records for f in index.files) - markers, "markers": markers,
            "fileCount": len(index.files), "bytes": index.size_bytes(), "startOffset": start, "endOffset": end,
            "maxReadPosition": state.max_read_position, "ongoingTxnCount": len(state.ongoing),
            "abortedTxnCount": len(state.aborted),
            "blockingTxn": None if blocker is None else blocker.as_dict(now),
            "msgRateIn": round(publish_rate(root, plog.segments, index, now_ms=now), 3),
            "producers": [s.as_dict() for s in producers(root, plog.segments)]}
