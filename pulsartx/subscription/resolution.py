"""Returning the pending acks of transactions that can no longer commit them.

A pending ack is normally ended by its transaction's TC (the participant call of COMMIT/ABORT).
It can outlive that call: an acknowledgement that lands after its transaction was aborted
elsewhere (a timeout or a fence racing it), a transaction that died OPEN with no sweeper running,
or one that was decided without this subscription among its participants. Whoever next meets the
subscription (a consumer, or a streaming batch about to acknowledge) asks the TCs and applies the
decided abort here, idempotently, as the TC's participant call would have. Otherwise those
messages stay held, and a pending cumulative ack blocks every later batch of the subscription.

An acknowledgement-only transaction writes its pending acks before its TC log holds it (its NEW
entry, its subscriptions and its decision are one entry). Its pending acks carry its deadline
(``CursorState.deadlines``): while the log does not hold it, it is open until that deadline (plus
the clock-skew allowance), and dead after it, when resolution fences its id in the log
(``TransactionCoordinator.fence_unregistered``) and then returns its acks, unless its owner's
decision landed first, which is then followed.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from pulsartx.buffer.reads import _lookup
from pulsartx.buffer.state import key_txn
from pulsartx.coordinator.state import Subscription, TxnAction, TxnStatus
from pulsartx.coordinator.tclog import TransactionLog
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import PulsarException, StorageError
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.store import end_transaction

log = logging.getLogger(__name__)


def pending_keys(cursor: CursorState, exclude: Iterable[int] = ()) -> set[int]:
    """The transactions holding pending acks (individual or cumulative) on ``cursor``."""
    keys = set(cursor.pending)
    if cursor.pending_cumulative is not None:
        keys.add(cursor.pending_cumulative[0])
    return keys - set(exclude)


def trimmed(root: StorageRoot, key: int, strict: bool = False) -> bool:
    """Whether the transaction was issued and has been trimmed from its TC log, read afresh: a
    process's copy of the log may miss a transaction another process began, and its pending acks
    must not be taken for a dead transaction's."""
    most, least = key_txn(key)
    try:
        fresh = TransactionLog(root, most).open()
    except PulsarException as e:
        if strict:
            raise
        log.debug("cannot read TC %d's log to resolve a pending ack: %s", most, e)
        return False
    return fresh.get(least) is None and least <= fresh.counter


def _fence(coordinators: Any, key: int, deadline_ms: int, strict: bool) -> Any:
    """The log's entry for an unregistered transaction holding pending acks with ``deadline_ms``
    (a fence once it is past it), or None while it may be open or its TC cannot be read."""
    txn_id = TxnID(*key_txn(key))
    try:
        return coordinators.tc(txn_id.most_bits).fence_unregistered(txn_id, deadline_ms)
    except PulsarException as e:
        if strict:
            raise
        log.debug("cannot fence %s to resolve its pending acks: %s", txn_id, e)
        return None


def resolve_pending(root: StorageRoot, coordinators: Any, topic: str, subscription: str, keys: set[int],
                    roll_forward: bool = False, strict: bool = False,
                    deadlines: Mapping[int, int] | None = None) -> int:
    """Abort, on this subscription, the pending acks of the transactions in ``keys`` that their TC
    aborted (an expired one is aborted now), decided without this subscription among its
    participants (the list is fixed once COMMITTING is logged), or forgot (finished and trimmed:
    had it been listed, its end here would have come before COMMITTED). Returns how many ended.

    ``roll_forward``: also commit here those decided COMMIT with this subscription listed, as the
    TC's participant call will (a commit returns at its decision, before that call): the next
    transaction's cumulative ack must not conflict with a predecessor that has already committed.

    ``strict``: a transaction whose TC cannot be read now raises StorageError instead of staying
    pending until the next pass (a redelivery must return an aborted transaction's acks now).

    ``deadlines``: the cursor's deadlines of transactions that acknowledged before their TC log
    held them. Such a transaction the log still does not hold is open until its deadline, and is
    fenced after it (see the module's docstring), never taken for a trimmed one."""
    if not keys:
        return 0
    mine = Subscription(topic, subscription)
    ended = 0
    metas = _lookup(coordinators, keys)
    if strict and keys - metas.keys():
        raise StorageError(f"the TCs of transactions {sorted(TxnID(*key_txn(k)) for k in keys - metas.keys())} "
                           "cannot be read now to resolve their pending acks; retry")
    for k, meta in metas.items():
        if meta is None and deadlines and k in deadlines:
            meta = _fence(coordinators, k, deadlines[k], strict)
            if meta is None:
                continue  # open until its deadline, or its TC cannot be read now
        elif meta is None and not trimmed(root, k, strict):
            continue
        if meta is None or meta.status in (TxnStatus.ABORTING, TxnStatus.ABORTED) or (
                meta.status is not TxnStatus.OPEN and mine not in meta.subscriptions):
            end_transaction(root, topic, subscription, TxnID(*key_txn(k)), TxnAction.ABORT)
            ended += 1
        elif roll_forward and meta.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
            end_transaction(root, topic, subscription, TxnID(*key_txn(k)), TxnAction.COMMIT)
            ended += 1
    return ended
