"""Fencing the older epochs of a transaction key (the fencing proposal; Kafka's InitProducerId).

A new epoch may act only once no transaction of an older one can still commit. Each listed
transaction is decided on its TC entry: an OPEN one is aborted (``TransactionCoordinator.fence``),
a decided one is rolled forward. The fence and the old producer's commit are both compare-and-sets
on that entry, so exactly one of them wins: if the commit did, it linearizes before the new epoch
(whose replay logic then sees it committed); if the fence did, the commit raises TransactionFenced.
A fence that cannot be written is retried, then the claim fails: it must never be assumed.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import PulsarException, StorageError, TransactionNotFound, short_cause
from pulsartx.storage import delta

log = logging.getLogger(__name__)
FENCE_ATTEMPTS = 5


def fence_all(tcs: Any, txn_ids: Iterable[TxnID], reason: str) -> None:
    """Decide every transaction of ``txn_ids``; StorageError naming the first that stays undecided."""
    ids = list(txn_ids)
    failed = [(t, e) for t in ids if (e := _fence_one(tcs, t, reason)) is not None]
    if failed:
        t, e = failed[0]
        raise StorageError(
            f"could not fence transaction {t} ({len(failed)} of {len(ids)} left undecided after {FENCE_ATTEMPTS} "
            f"attempts each: {short_cause(e)}): it could still commit, so the new epoch may not begin; retry once "
            "storage answers again") from e


def _fence_one(tcs: Any, t: TxnID, reason: str) -> PulsarException | None:
    last: PulsarException | None = None
    for attempt in range(FENCE_ATTEMPTS):
        try:
            tc = tcs.for_txn(t)
            meta = tc.fence(t, reason)
        except TransactionNotFound:
            return None  # trimmed from its TC log: it ended long ago
        except PulsarException as e:
            last = e
            log.info("fencing %s failed (attempt %d of %d): %s", t, attempt + 1, FENCE_ATTEMPTS, e)
            delta.backoff(attempt, base=0.05, cap=0.5)
            continue
        if meta.status in (TxnStatus.COMMITTING, TxnStatus.ABORTING):
            # Decided but unfinished (a killed run's batch): roll it forward now rather than wait for
            # a sweep, so its markers and acknowledgements come before the new epoch's work.
            action = TxnAction.COMMIT if meta.status is TxnStatus.COMMITTING else TxnAction.ABORT
            try:
                tc.end_transaction(t, action)
            except PulsarException as e:  # decided: recovery completes it
                log.info("completing fenced %s deferred to recovery: %s", t, e)
        return None
    return last
