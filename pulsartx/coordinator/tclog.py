"""The TC log: PIP-31's TransactionMetadataEntry as rows of a Delta table, one table per TC.

Each entry restates the transaction's whole metadata after the operation (as Kafka's transaction
log does), so the log is a :class:`KeyedLog`: replay keeps the latest entry per TxnID, a status
update is a compare-and-set on the TxnID, and compaction (the TC snapshot) rewrites only the live
transactions. Finished transactions are trimmed once ``finished_retention_ms`` has passed, so
opening a TC costs its open transactions plus the entries since the last compaction.

The TxnID counter is the Delta app-transaction ``pulsartx.tc.counter``: a NEW entry sets it, so
two processes allocating on the same TC conflict and one retries with the next value. Ids never
repeat, across restarts and processes, and compaction does not reset them.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from pulsartx.coordinator.state import MetadataOp, Subscription, TxnMeta, TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.storage.keyed_log import KeyedLog
from pulsartx.storage.root import StorageRoot

COUNTER_APP_ID = "pulsartx.tc.counter"

ENTRY_SCHEMA = pa.schema([
    pa.field("seq", pa.int64(), False),
    pa.field("metadata_op", pa.string(), False),
    pa.field("txnid_most_bits", pa.int64(), False),
    pa.field("txnid_least_bits", pa.int64(), False),
    pa.field("expected_status", pa.string()),
    pa.field("new_status", pa.string(), False),
    pa.field("partitions", pa.list_(pa.string())),
    pa.field("subscriptions", pa.list_(pa.struct([("topic", pa.string()), ("subscription", pa.string())]))),
    pa.field("txn_timeout_ms", pa.int64()),
    pa.field("txn_start_time", pa.int64()),
    pa.field("txn_last_modification_time", pa.int64()),
    pa.field("owner", pa.string()),
    pa.field("transaction_key", pa.string()),
    pa.field("epoch", pa.int64()),
    pa.field("reason", pa.string()),
    pa.field("commit_entries", pa.list_(pa.struct([("partition", pa.string()), ("first_offset", pa.int64()),
                                                    ("last_offset", pa.int64())]))),
    pa.field("properties", pa.map_(pa.string(), pa.string())),
])


def tc_segments(tc_id: int) -> tuple[str, ...]:
    return ("coordinator", f"tc-{tc_id}", "log")


def meta_to_row(meta: TxnMeta, op: MetadataOp, expected: TxnStatus | None) -> dict[str, Any]:
    return {
        "seq": meta.seq, "metadata_op": op.value,
        "txnid_most_bits": meta.txn_id.most_bits, "txnid_least_bits": meta.txn_id.least_bits,
        "expected_status": expected.value if expected else None, "new_status": meta.status.value,
        "partitions": sorted(meta.partitions),
        "subscriptions": [{"topic": s.topic, "subscription": s.subscription} for s in sorted(meta.subscriptions, key=str)],
        "txn_timeout_ms": meta.timeout_ms, "txn_start_time": meta.start_ms,
        "txn_last_modification_time": meta.last_modified_ms, "owner": meta.owner,
        "transaction_key": meta.transaction_key, "epoch": meta.epoch, "reason": meta.reason,
        "commit_entries": None if meta.commit_entries is None else
        [{"partition": p, "first_offset": a, "last_offset": b} for p, a, b in meta.commit_entries],
        "properties": list(meta.properties.items()) if meta.properties else None,
    }


def row_to_meta(r: dict[str, Any]) -> TxnMeta:
    ce = r.get("commit_entries")
    props = r.get("properties")
    return TxnMeta(
        txn_id=TxnID(r["txnid_most_bits"], r["txnid_least_bits"]), status=TxnStatus(r["new_status"]),
        timeout_ms=r["txn_timeout_ms"], start_ms=r["txn_start_time"], last_modified_ms=r["txn_last_modification_time"],
        seq=r["seq"], partitions=frozenset(r.get("partitions") or ()),
        subscriptions=frozenset(Subscription(s["topic"], s["subscription"]) for s in r.get("subscriptions") or ()),
        owner=r.get("owner"), transaction_key=r.get("transaction_key"), epoch=r.get("epoch"), reason=r.get("reason"),
        commit_entries=None if ce is None else tuple((e["partition"], e["first_offset"], e["last_offset"]) for e in ce),
        properties=dict(props) if props else {},
    )


class TransactionLog:
    """Log-backed state of one TC (Kafka's TransactionStateManager): load, CAS-append, compact."""

    def __init__(self, root: StorageRoot, tc_id: int, compact_every: int = 200, finished_retention_ms: int = 300_000):
        self.tc_id = tc_id
        self.finished_retention_ms = finished_retention_ms
        self.log = KeyedLog(root, tc_segments(tc_id), ENTRY_SCHEMA,
                            key_of=lambda r: str(r["txnid_least_bits"]), name=f"tc-{tc_id}-log",
                            compact_every=compact_every)

    def open(self) -> TransactionLog:
        self.log.open()
        return self

    def refresh(self) -> list[TxnMeta]:
        return [row_to_meta(r) for r in self.log.refresh()]

    def get(self, least_bits: int) -> TxnMeta | None:
        r = self.log.get(str(least_bits))
        return None if r is None else row_to_meta(r)

    def all(self) -> list[TxnMeta]:
        return [row_to_meta(r) for r in self.log.rows.values()]

    @property
    def counter(self) -> int:
        """The last TxnID counter value issued by this TC (-1 before the first)."""
        v = self.log.app_version(COUNTER_APP_ID)
        return -1 if v is None else v

    def write_new(self, meta: TxnMeta) -> None:
        self.log.put([meta_to_row(meta, MetadataOp.NEW, None)], extra_app_ids={COUNTER_APP_ID: meta.txn_id.least_bits})

    def write(self, meta: TxnMeta, op: MetadataOp, expected: TxnStatus | None) -> None:
        self.write_many([(meta, op, expected)])

    def write_many(self, entries: list[tuple[TxnMeta, MetadataOp, TxnStatus | None]]) -> None:
        """Several entries of one transaction in one atomic commit (e.g. COMMITTING + COMMITTED)."""
        self.log.put([meta_to_row(m, op, exp) for m, op, exp in entries])

    def maybe_compact(self, now_ms: int) -> bool:
        if not self.log.needs_compaction():
            return False

        # The latest transaction of each transaction key, and its latest committed one, are kept
        # whatever their age: a streaming sink replaying its last batch asks whether it committed.
        latest: dict[str, int] = {}
        committed: dict[str, int] = {}
        for r in self.log.rows.values():
            if r["transaction_key"] is not None:
                k = f"{r['owner']}&{r['transaction_key']}"
                latest[k] = max(latest.get(k, -1), r["txnid_least_bits"])
                if r["new_status"] in (TxnStatus.COMMITTING.value, TxnStatus.COMMITTED.value):
                    committed[k] = max(committed.get(k, -1), r["txnid_least_bits"])
        keep_ids = set(latest.values()) | set(committed.values())

        def keep(r: dict[str, Any]) -> bool:
            final = TxnStatus(r["new_status"]).is_final
            return (not final or now_ms - r["txn_last_modification_time"] < self.finished_retention_ms
                    or r["txnid_least_bits"] in keep_ids)

        return self.log.compact(keep)
