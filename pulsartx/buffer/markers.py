"""Writing TXN_COMMIT / TXN_ABORT markers into a partition: the TC's marker channel (Kafka's
TransactionMarkerChannelManager, PIP-31's CommandEndTxnOnPartition).

A marker is appended like any record, taking an offset, and is guarded by the app id
``pulsartx.marker.<most>.<least>``: the guard is checked on the writer's snapshot and set in the
same commit, and every append conflicts with every other one on the partition's offset key, so
a marker is written at most once however many TCs retry it concurrently. The guard lives an hour
(``partition.GUARD_LIFETIME_MS``), not the table's week of app-id retention: past that, only a
recovery an hour late could repeat a marker, and readers ignore a repeated one.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa

from pulsartx.coordinator.state import TxnAction
from pulsartx.coordinator.txnid import TxnID
from pulsartx.log.partition import AppendResult, PartitionLog, build_records, shared_log
from pulsartx.log.schema import MARKER_ENTRIES, MessageType
from pulsartx.naming import TopicName
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)
MARKER_PRODUCER = "__pulsartx_tc"


def marker_app_id(txn_id: TxnID) -> str:
    return f"pulsartx.marker.{txn_id.most_bits}.{txn_id.least_bits}"


def write_marker(root: StorageRoot, partition: str, txn_id: TxnID, action: TxnAction,
                 entries: Sequence[tuple[int, int]] | None = None, plog: PartitionLog | None = None) -> AppendResult:
    """Append the marker of ``txn_id``'s outcome to ``partition`` (idempotent).

    ``entries``: for a commit, the exact (first, last) offset ranges that belong to the transaction
    in this partition; messages of the transaction outside them stay invisible forever.
    """
    plog = plog or shared_log(root, TopicName.parse(partition))
    mtype = MessageType.TXN_COMMIT if action is TxnAction.COMMIT else MessageType.TXN_ABORT
    marker_entries = None
    if entries is not None and action is TxnAction.COMMIT:
        marker_entries = pa.array([[{"first_offset": a, "last_offset": b} for a, b in sorted(entries)]], MARKER_ENTRIES)
    records = build_records([b""], producer_name=MARKER_PRODUCER, txn=txn_id.as_tuple(), msg_type=mtype,
                            marker_entries=marker_entries)
    res = plog.append_marker(records, marker_app_id(txn_id))
    if res.version is not None:
        log.debug("wrote %s marker for %s at %s offset %s", mtype.value, txn_id, partition, res.first_offset)
    return res
