"""The pending-ack store's participant call: what a TC runs on a subscription when one of its
transactions commits or aborts."""
from __future__ import annotations

from pulsartx.coordinator.state import TxnAction
from pulsartx.coordinator.txnid import TxnID
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription import store


def end_transaction_on_subscription(root: StorageRoot, topic: str, subscription: str, txn_id: TxnID,
                                    action: TxnAction) -> None:
    """Apply a transaction's outcome to a subscription's pending acks. A subscription with no
    pending-ack store has nothing pending, so there is nothing to do (idempotent by construction)."""
    store.end_transaction(root, topic, subscription, txn_id, action)
