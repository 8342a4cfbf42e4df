"""The transaction coordinator (PIP-31 "Transaction Coordinator").

- ``txnid``: TxnID;  ``state``: the pure TxnStatus machine;
- ``tclog``: the log-backed state (TC log as a Delta table, snapshot + tail replay);
- ``participants``: the marker/pending-ack channel;  ``coordinator``: request processing,
  timeouts and recovery;  ``keys``: transaction keys and epochs;  ``registry``: the N TCs.
"""
from pulsartx.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.state import Subscription, TxnAction, TxnMeta, TxnStatus
from pulsartx.coordinator.txnid import TxnID

__all__ = ["CoordinatorConfig", "Coordinators", "Subscription", "TransactionCoordinator", "TxnAction", "TxnID",
           "TxnMeta", "TxnStatus"]
