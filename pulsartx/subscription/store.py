"""Where pending acks live; the subscriptions issue replaces this with the redo-log store."""
from __future__ import annotations

from pulsartx.coordinator.state import TxnAction
from pulsartx.coordinator.txnid import TxnID
from pulsartx.storage.root import StorageRoot


def end_transaction(root: StorageRoot, topic: str, subscription: str, txn_id: TxnID, action: TxnAction) -> None:
    return None
