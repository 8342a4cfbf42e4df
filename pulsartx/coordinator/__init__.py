"""The transaction coordinator (PIP-31 "Transaction Coordinator").

- ``txnid``: TxnID;  ``state``: the pure TxnStatus machine;
- ``tclog``: the log-backed state (TC log as a Delta table, snapshot + tail replay);
- ``participants``: the marker/pending-ack channel;  ``coordinator``: request processing,
  timeouts and recovery;  ``completer``: the background end of decided transactions;
  ``keys``: transaction keys and epochs;  ``lease``: which process begins transactions on which
  TC log;  ``registry``: the N TCs and this process's lease.

The protocol records (``txnid``, ``state``) sit below the transaction buffer and the pending-ack
store, which the coordinator itself drives through ``participants``. So importing this package
loads nothing: the names below resolve on first use, and the buffer can import the records
without pulling in the coordinator that imports the buffer.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pulsartx.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
    from pulsartx.coordinator.registry import Coordinators
    from pulsartx.coordinator.state import Subscription, TxnAction, TxnMeta, TxnStatus
    from pulsartx.coordinator.txnid import TxnID

_HOMES = {
    "CoordinatorConfig": "coordinator", "TransactionCoordinator": "coordinator", "Coordinators": "registry",
    "Subscription": "state", "TxnAction": "state", "TxnMeta": "state", "TxnStatus": "state", "TxnID": "txnid",
}
__all__ = ["CoordinatorConfig", "Coordinators", "Subscription", "TransactionCoordinator", "TxnAction", "TxnID",
           "TxnMeta", "TxnStatus"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
