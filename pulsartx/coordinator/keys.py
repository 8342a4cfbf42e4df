"""Transaction keys and connection epochs (the fencing proposal, seed 001).

For each ``owner&key`` the responsible TC keeps (epoch, transactions of that epoch) in its own
KeyedLog table, not in the TC log, because finished TC-log entries are trimmed. Constructing a
Client with a key is the proposal's "connection": it bumps the epoch (a CAS on the key row) and
aborts the previous epoch's open transaction. A transaction is attached to its key with a CAS that
requires the epoch to be unchanged, so either the new epoch's claim sees it and aborts it, or the
old client sees the new epoch and is refused: no transaction of a fenced epoch survives.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import InvalidConfiguration, NotAllowedError
from pulsartx.storage.keyed_log import KeyedLog
from pulsartx.storage.root import StorageRoot

MAX_TXNS_PER_KEY = 32

KEY_SCHEMA = pa.schema([
    pa.field("seq", pa.int64(), False),
    pa.field("owner", pa.string(), False),
    pa.field("transaction_key", pa.string(), False),
    pa.field("epoch", pa.int64(), False),
    pa.field("txn_ids", pa.list_(pa.struct([("most_bits", pa.int64()), ("least_bits", pa.int64())]))),
    pa.field("claimed_ms", pa.int64()),
    pa.field("updated_ms", pa.int64()),
    pa.field("deleted", pa.bool_()),
    # The connection holding the current epoch, and connections it superseded (never re-admitted).
    pa.field("connection", pa.string()),
    pa.field("fenced_connections", pa.list_(pa.string())),
])
MAX_FENCED_CONNECTIONS = 64


def full_key(owner: str | None, key: str) -> str:
    """The proposal's ``owner&key``; '&' is therefore forbidden inside a key."""
    if not isinstance(key, str) or not key:
        raise InvalidConfiguration(f"transaction_key={key!r}: must be a non-empty string")
    if "&" in key:
        raise InvalidConfiguration(f"transaction_key={key!r} contains '&', which separates owner and key: remove it")
    if owner is not None and "&" in owner:
        raise InvalidConfiguration(f"owner={owner!r} contains '&', which separates owner and key: remove it")
    return f"{owner or ''}&{key}"


def _keep_every_row(row: dict[str, Any]) -> bool:
    return True


class _Unchanged(Exception):
    def __init__(self, row: dict[str, Any]):
        self.row = row


@dataclass(frozen=True)
class TransactionKeyInfo:
    owner: str
    transaction_key: str
    epoch: int
    txn_ids: list[TxnID]
    claimed_ms: int
    age_ms: int

    def as_dict(self) -> dict[str, Any]:
        return {"owner": self.owner, "transaction_key": self.transaction_key, "epoch": self.epoch,
                "txn_ids": [str(t) for t in self.txn_ids], "claimed_ms": self.claimed_ms, "age_ms": self.age_ms}


def key_segments(tc_id: int) -> tuple[str, ...]:
    return ("coordinator", f"tc-{tc_id}", "transaction-keys")


class TransactionKeyStore:
    def __init__(self, root: StorageRoot, tc_id: int):
        self.tc_id = tc_id
        self.log = KeyedLog(root, key_segments(tc_id), KEY_SCHEMA,
                            key_of=lambda r: f"{r['owner']}&{r['transaction_key']}", name=f"tc-{tc_id}-keys")

    def _ensure(self) -> None:
        self.log.refresh()  # opens the log on first use

    def _update(self, k: str, change) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """One compare-and-set of key ``k``: ``change(old row)`` returns the new row; (old, new)."""
        def step(old):
            new = change(old)
            return new, (old, new)

        # Every key's row is kept (an epoch is never reused, even after a delete): compaction only
        # folds the table's files, one more per write (a streaming query attaches every micro-batch),
        # into one, so that opening the table does not read one file per batch ever run.
        return self.log.cas(k, step, what=f"transaction key {k!r}", keep=_keep_every_row)

    def claim(self, owner: str | None, key: str) -> tuple[int, list[TxnID]]:
        """Bump the epoch; returns the new epoch and the previous epoch's transactions to abort."""
        k = full_key(owner, key)
        o, name = k.split("&", 1)
        now = int(time.time() * 1000)

        def change(old):
            # Never reused, even after a delete: a client fenced before it must stay fenced.
            epoch = 0 if old is None else old["epoch"] + 1
            # The older epochs' transactions stay listed until the claimant has fenced them
            # (:meth:`forget`): a claim whose fence failed leaves them for the next claim.
            return {"seq": (old["seq"] + 1) if old else 0, "owner": o, "transaction_key": name, "epoch": epoch,
                    "txn_ids": (old or {}).get("txn_ids") or [], "claimed_ms": now, "updated_ms": now,
                    "deleted": False, "connection": None,
                    "fenced_connections": (old or {}).get("fenced_connections") or []}

        old, new = self._update(k, change)
        stale = [TxnID(t["most_bits"], t["least_bits"]) for t in (old or {}).get("txn_ids") or []]
        return new["epoch"], stale

    def forget(self, owner: str | None, key: str, epoch: int, txn_ids: list[TxnID]) -> None:
        """Drop fenced transactions of older epochs from the key (if ``epoch`` is still current)."""
        k = full_key(owner, key)
        gone = {(t.most_bits, t.least_bits) for t in txn_ids}
        if not gone:
            return

        def change(old):
            if old is None or old["deleted"] or old["epoch"] != epoch:
                raise _Unchanged(old or {})
            kept = [t for t in old["txn_ids"] or [] if (t["most_bits"], t["least_bits"]) not in gone]
            if len(kept) == len(old["txn_ids"] or []):
                raise _Unchanged(old)
            return {**old, "seq": old["seq"] + 1, "txn_ids": kept, "updated_ms": int(time.time() * 1000)}

        with contextlib.suppress(_Unchanged):  # nothing to drop, or the key moved on
            self._update(k, change)

    def claim_connection(self, owner: str | None, key: str, connection: str) -> tuple[int, list[TxnID]]:
        """Claim the key for a long-lived connection (a streaming query run) that cannot keep the
        epoch in memory: the same connection keeps its epoch; a new one bumps it and fences the
        previous connection forever (a zombie query is refused with NotAllowedError)."""
        k = full_key(owner, key)
        o, name = k.split("&", 1)
        now = int(time.time() * 1000)

        def change(old):
            if old is not None and not old["deleted"] and old["connection"] == connection:
                raise _Unchanged(old)
            fenced = list((old or {}).get("fenced_connections") or [])
            if connection in fenced:
                raise NotAllowedError(
                    f"transaction key {key!r} (owner {owner!r}) was taken over by a newer run; this run is a zombie "
                    "and may not write: stop it")
            if old is not None and old["connection"]:
                fenced = (fenced + [old["connection"]])[-MAX_FENCED_CONNECTIONS:]
            epoch = 0 if old is None else old["epoch"] + 1
            # The previous runs' transactions stay listed: a new run replaying a batch must be able
            # to find the transaction that already committed it.
            return {"seq": (old["seq"] + 1) if old else 0, "owner": o, "transaction_key": name, "epoch": epoch,
                    "txn_ids": (old or {}).get("txn_ids") or [], "claimed_ms": now, "updated_ms": now,
                    "deleted": False, "connection": connection, "fenced_connections": fenced}

        try:
            old, new = self._update(k, change)
        except _Unchanged as u:
            return u.row["epoch"], []
        stale = [TxnID(t["most_bits"], t["least_bits"]) for t in (old or {}).get("txn_ids") or []]
        return new["epoch"], stale

    def txn_ids(self, owner: str | None, key: str, refresh: bool = True) -> list[TxnID]:
        """The transactions begun under the key's current epoch (most recent last); ``refresh``
        False: as of this store's last read or write (e.g. the claim just made)."""
        if refresh:
            self._ensure()
        row = self.log.get(full_key(owner, key))
        return [] if row is None else [TxnID(t["most_bits"], t["least_bits"]) for t in row["txn_ids"] or []]

    def attach(self, owner: str | None, key: str, epoch: int, txn_id: TxnID) -> list[TxnID]:
        """Record ``txn_id`` under the key if ``epoch`` is still current; returns the key's earlier
        transactions, which the caller aborts (one active transaction per key)."""
        k = full_key(owner, key)
        now = int(time.time() * 1000)

        def change(old):
            if old is None or old["deleted"] or old["epoch"] != epoch:
                current = None if old is None or old["deleted"] else old["epoch"]
                raise NotAllowedError(
                    f"transaction key {key!r} (owner {owner!r}) is at epoch {current}, this client holds epoch {epoch}: "
                    "a newer client claimed the key, so this one may not begin transactions")
            txns = (old["txn_ids"] or []) + [{"most_bits": txn_id.most_bits, "least_bits": txn_id.least_bits}]
            return {**old, "seq": old["seq"] + 1, "txn_ids": _trimmed(txns), "updated_ms": now}

        old, _ = self._update(k, change)
        return [TxnID(t["most_bits"], t["least_bits"]) for t in old["txn_ids"] or []]

    def connection(self, owner: str | None, key: str) -> tuple[int, str] | None:
        """(epoch, connection) of the run that holds the key now, None when none does."""
        self._ensure()
        row = self.log.get(full_key(owner, key))
        return None if row is None or row["deleted"] else (row["epoch"], row.get("connection") or "")

    def current_epoch(self, owner: str | None, key: str) -> int | None:
        self._ensure()
        row = self.log.get(full_key(owner, key))
        return None if row is None or row["deleted"] else row["epoch"]

    def delete(self, owner: str | None, key: str) -> list[TxnID]:
        k = full_key(owner, key)

        def change(old):
            if old is None or old["deleted"]:
                raise InvalidConfiguration(f"transaction key {key!r} (owner {owner!r}) does not exist")
            return {**old, "seq": old["seq"] + 1, "deleted": True, "updated_ms": int(time.time() * 1000)}

        old, _ = self._update(k, change)
        return [TxnID(t["most_bits"], t["least_bits"]) for t in old["txn_ids"] or []]

    def list(self) -> list[TransactionKeyInfo]:
        self._ensure()
        now = int(time.time() * 1000)
        return [TransactionKeyInfo(r["owner"], r["transaction_key"], r["epoch"],
                                   [TxnID(t["most_bits"], t["least_bits"]) for t in r["txn_ids"] or []],
                                   r["claimed_ms"], now - r["claimed_ms"])
                for r in self.log.rows.values() if not r["deleted"]]


def _trimmed(txns: list[dict[str, int]]) -> list[dict[str, int]]:
    """The key's last ``MAX_TXNS_PER_KEY`` transactions, plus the latest one on each other TC its
    transactions began on (oldest first). The TCs a key ever used stay named, so a search for the
    batch it committed last knows every TC log to look in, however many restarts came since."""
    kept = txns[-MAX_TXNS_PER_KEY:]
    tcs = {t["most_bits"] for t in kept}
    older = []
    for t in reversed(txns[:-MAX_TXNS_PER_KEY]):
        if t["most_bits"] not in tcs:
            tcs.add(t["most_bits"])
            older.append(t)
    return older[::-1] + kept
