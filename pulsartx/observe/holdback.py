"""The open transaction holding a partition's maxReadPosition back, with what the TC knows of it.

READ_COMMITTED readers stop just before the first entry of the earliest transaction still open in
a partition, plain messages after it included. Pulsar users find that transaction by hand
(``transaction-in-buffer-stats`` on each candidate); here the buffer names it (the ongoing
transaction whose first offset is the read limit) and its TC adds owner, age and timeout.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pulsartx.buffer.state import BufferState, key_txn
from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.state import TxnMeta
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import PulsarException, TransactionNotFound
from pulsartx.observe.failures import one_line


@dataclass(frozen=True)
class HoldBack:
    """One partition held back by one transaction. TC fields are None when its TC no longer knows
    the transaction (trimmed after it finished: the partition's marker is then being written)."""

    partition: str
    txn_id: TxnID
    first_offset: int  # the transaction's first entry here: maxReadPosition + 1
    end_offset: int  # the partition's end: entries from first_offset on are held back
    status: str | None = None
    owner: str | None = None
    transaction_key: str | None = None
    start_ms: int | None = None
    timeout_ms: int | None = None
    tc_error: str | None = None  # why its TC could not be asked (a damaged log, storage down)

    @property
    def max_read_position(self) -> int:
        return self.first_offset - 1

    @property
    def held_entries(self) -> int:
        return self.end_offset - self.first_offset

    def age_ms(self, now_ms: int | None = None) -> int | None:
        if self.start_ms is None:
            return None
        return (int(time.time() * 1000) if now_ms is None else now_ms) - self.start_ms

    def as_dict(self, now_ms: int | None = None) -> dict[str, Any]:
        out = {"txnId": str(self.txn_id), "status": self.status, "owner": self.owner,
               "transactionKey": self.transaction_key, "firstOffset": self.first_offset,
               "heldEntries": self.held_entries, "ageMs": self.age_ms(now_ms), "timeoutMs": self.timeout_ms}
        if self.tc_error is not None:
            out["tcError"] = self.tc_error
        return out

    def describe(self, now_ms: int | None = None) -> str:
        """One line: which transaction, whose, how old against its timeout."""
        who = f"owner {self.owner!r}" if self.owner else "no owner"
        if self.transaction_key:
            who += f", transaction key {self.transaction_key!r}"
        age = self.age_ms(now_ms)
        if self.tc_error is not None:
            when = f"its TC's log cannot be read: {self.tc_error}"
        elif age is None or self.timeout_ms is None:
            when = "unknown to its TC (finished and trimmed; its marker is on the way)"
        else:
            when = f"{self.status}, open {age / 1000:.1f} s of its {self.timeout_ms / 1000:g} s timeout"
        return f"transaction {self.txn_id} ({who}; {when})"


def lookup(tcs: Coordinators, txn_id: TxnID) -> TxnMeta | str | None:
    """The TC's metadata for ``txn_id``, None when the TC no longer knows it, or why the TC could
    not be asked (its log unreadable, storage down): a view still names the transaction then."""
    try:
        return tcs.for_txn(txn_id).get(txn_id, refresh=True)
    except TransactionNotFound:
        return None
    except PulsarException as e:
        return one_line(e)


def holding_back(tcs: Coordinators, partition: str, state: BufferState, read_limit: int | None = None
                 ) -> HoldBack | None:
    """The transaction whose first entry is at ``read_limit`` (the buffer's own maxReadPosition + 1
    by default; a read's limit may be higher when the TC already decided the earliest ones), or
    None when nothing is held back."""
    limit = state.read_limit if read_limit is None else read_limit
    if limit >= state.end_offset:
        return None
    keys = [k for k, first in state.ongoing.items() if first == limit]
    if not keys:
        return None
    txn_id = TxnID(*key_txn(keys[0]))
    meta = lookup(tcs, txn_id)
    if meta is None or isinstance(meta, str):
        return HoldBack(partition, txn_id, limit, state.end_offset, tc_error=meta)
    return HoldBack(partition, txn_id, limit, state.end_offset, meta.status.value, meta.owner,
                    meta.transaction_key, meta.start_ms, meta.timeout_ms)
