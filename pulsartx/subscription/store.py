"""Durable subscription state on one partition: the cursor and its pending-ack store.

Both live in one KeyedLog table per (subscription, partition) under
``<root>/subscriptions/<tenant>/<namespace>/<topic>/<subscription>/partition-<i>``:
  * key ``cursor``: mark-delete offset, individually acked ranges, pending acks per transaction
    (PENDING_ACK), the pending cumulative ack, redelivery counts;
  * key ``claims``: which Shared consumer holds which offsets, until when.
Every change is a read-validate-write compare-and-set on its key, so Pulsar's ack-conflict rules
and the "nobody holds a message twice" rule hold across processes. Each row restates the whole
state, so the table is a redo log: replaying its latest row restores PENDING_ACK exactly, and
compaction drops the history (finished transactions vanish from the state when they end).
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pyarrow as pa

from pulsartx import forks, metrics
from pulsartx.buffer.state import key_txn, txn_key
from pulsartx.coordinator.state import TxnAction
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import PulsarException, StorageError
from pulsartx.naming import TopicName, check_subscription_name
from pulsartx.storage.group_commit import Combiner
from pulsartx.storage.keyed_log import KeyedLog
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.ranges import RangeSet

log = logging.getLogger(__name__)
T = TypeVar("T")
CURSOR, CLAIMS = "cursor", "claims"

# One flat row per change: the whole state is one JSON document (``state``), with the fields an
# operator filters on beside it. Encoding the nested columns this replaced (ranges, pending acks,
# redeliveries, claims as lists of structs) cost 1.0 ms per one-row parquet file against 0.14 ms
# flat, and every acknowledgement flush, pending ack and transaction end is such a file.
STATE_SCHEMA = pa.schema([
    pa.field("seq", pa.int64(), False),
    pa.field("key", pa.string(), False),
    pa.field("mark_delete", pa.int64()),
    pa.field("deleted", pa.bool_()),
    pa.field("updated_ms", pa.int64()),
    pa.field("state", pa.string()),
])


def _key(most: int, least: int) -> int:
    return txn_key(most, least)


def _bits(key: int) -> tuple[int, int]:
    return key_txn(key)


def subscription_dir(topic: TopicName, subscription: str) -> tuple[str, ...]:
    return ("subscriptions", *topic.path_segments(), check_subscription_name(subscription))


def _row(seq: int, key: str, state: dict[str, Any], mark_delete: int | None = None, deleted: bool = False
         ) -> dict[str, Any]:
    return {"seq": seq, "key": key, "mark_delete": mark_delete, "deleted": deleted,
            "updated_ms": int(time.time() * 1000), "state": json.dumps(state, separators=(",", ":"))}


def _state(r: dict[str, Any]) -> dict[str, Any]:
    return json.loads(r["state"]) if r.get("state") else {}


def cursor_to_row(seq: int, c: CursorState) -> dict[str, Any]:
    """The cursor as a row. ``state``: ``acked`` ranges ``[first, last]``, ``pending`` acks
    ``[txn most bits, txn least bits, first, last]`` (PENDING_ACK), ``pending_cumulative``
    ``[most, least, position]``, ``redelivery`` ``[offset, count]``, ``incarnation`` and
    ``reset_epoch`` when set (absent: ``""`` and 0, as written before they existed), and only when some
    transaction acknowledged before its TC log held it, ``deadlines`` ``[most, least, deadline ms]``."""
    cum = c.pending_cumulative
    state = {
        "acked": [[a, b] for a, b in c.acked.ranges()],
        "pending": [[*_bits(k), a, b] for k, rs in c.pending.items() for a, b in rs.ranges()],
        "pending_cumulative": None if cum is None else [*_bits(cum[0]), cum[1]],
        "redelivery": [[o, n] for o, n in sorted(c.redelivery.items())],
    }
    if c.incarnation:
        state["incarnation"] = c.incarnation
    if c.reset_epoch:
        state["reset_epoch"] = c.reset_epoch
    if c.deadlines:
        state["deadlines"] = [[*_bits(k), d] for k, d in sorted(c.deadlines.items())]
    return _row(seq, CURSOR, state, mark_delete=c.mark_delete, deleted=c.deleted)


def row_to_cursor(r: dict[str, Any]) -> CursorState:
    st = _state(r)
    c = CursorState(mark_delete=r["mark_delete"], acked=RangeSet((a, b) for a, b in st.get("acked") or ()),
                    deleted=bool(r["deleted"]), incarnation=st.get("incarnation") or "",
                    reset_epoch=st.get("reset_epoch") or 0)
    for most, least, a, b in st.get("pending") or ():
        c.pending.setdefault(_key(most, least), RangeSet()).add_range(a, b)
    cum = st.get("pending_cumulative")
    if cum is not None:
        c.pending_cumulative = (_key(cum[0], cum[1]), cum[2])
    c.redelivery = {o: n for o, n in st.get("redelivery") or ()}
    c.deadlines = {_key(most, least): d for most, least, d in st.get("deadlines") or ()}
    return c


@dataclass(frozen=True)
class Claim:
    consumer: str
    first: int
    last: int
    expires_ms: int
    # Key_Shared: the sticky-key hash of each offset ``first..last`` (None for an offset without a
    # message), so other consumers see which keys are in flight (pulsartx.subscription.key_shared).
    hashes: tuple[int | None, ...] = ()

    def narrowed(self, first: int, last: int) -> Claim:
        """The part ``first..last`` of this claim, hashes included."""
        hashes = self.hashes[first - self.first:last - self.first + 1] if self.hashes else ()
        return replace(self, first=first, last=last, hashes=hashes)


class SubscriptionStore:
    """One subscription's durable state on one partition."""

    def __init__(self, root: StorageRoot, partition: TopicName, subscription: str):
        assert partition.partition is not None
        self.root = root
        self.partition = partition
        self.subscription = subscription
        self.segments = (*subscription_dir(partition, subscription), f"partition-{partition.partition}")
        self.log = KeyedLog(root, self.segments, STATE_SCHEMA, key_of=lambda r: r["key"],
                            name=f"sub-{subscription}-{partition.partition}", compact_every=100)
        self._lock = threading.RLock()
        self._opened = False
        self._cursor_updates = Combiner(self._lock, self._apply_cursor_changes)

    def _ensure(self, refresh: bool = True) -> None:
        if not self._opened:
            self.log.open()
            self._opened = True
        elif refresh:
            self.log.refresh()

    def revalidate(self) -> None:
        """Start over if the table was deleted and re-created since this store loaded it (by
        another process: same-process deletes drop the shared stores). Called when a consumer
        subscribes, so a store cached in the process never continues another table's log."""
        with self._lock:
            if self._opened and self.log.replaced():
                log.info("subscription %r on %s was re-created since this process loaded it: reloading",
                         self.subscription, self.partition)
                self.log.open()  # now, under the lock: no other user writes through the old table

    def exists(self) -> bool:
        return self.root.exists(*self.segments, "_delta_log")

    def cursor(self, refresh: bool = True) -> CursorState | None:
        with self._lock:
            self._ensure(refresh)
            r = self.log.get(CURSOR)
            return None if r is None else row_to_cursor(r)

    def create(self, mark_delete: int) -> CursorState:
        """Create the cursor at ``mark_delete`` unless it exists (the first subscriber decides), as a
        new incarnation of the subscription."""
        def change(c: CursorState | None) -> tuple[CursorState, CursorState]:
            if c is not None and not c.deleted:
                return c, c
            new = CursorState(mark_delete=mark_delete, incarnation=uuid.uuid4().hex)
            return new, new

        return self._update_cursor(change)

    def update(self, fn: Callable[[CursorState], T]) -> T:
        """Apply ``fn`` to a copy of the latest cursor and store the result with a CAS; re-run on a
        lost race. ``fn`` may raise (e.g. TransactionConflict) to change nothing."""
        def change(c: CursorState | None):
            if c is None:
                raise StorageError(f"subscription {self.subscription!r} on {self.partition} has no cursor")
            new = c.copy()
            out = fn(new)
            return (c if new == c else new), out  # unchanged: nothing to write

        return self._update_cursor(change)

    def _update_cursor(self, change):
        """``change(cursor or None)`` returns (new cursor, or the same object for "no change"; result).
        Concurrent updates from this process's threads (acks, pending-ack commits) share one write."""
        return self._cursor_updates.run(change)

    def _apply_cursor_changes(self, changes: list) -> list[tuple[bool, Any]]:
        """Optimistic for an open store (KeyedLog.cas_many): cursor updates are the hot path of acks."""
        def step(change):
            def run(row):
                cur = None if row is None else row_to_cursor(row)
                new, out = change(cur)
                return (None if new is cur else cursor_to_row(0, new)), out
            return run

        optimistic, self._opened = self._opened, True
        return self.log.cas_many(CURSOR, [step(c) for c in changes],
                                 what=f"subscription {self.subscription!r} on {self.partition}",
                                 optimistic=optimistic, keep=lambda r: True)

    # ---- Shared consumers' claims -------------------------------------------------------------------
    def claims(self, refresh: bool = True) -> list[Claim]:
        with self._lock:
            self._ensure(refresh)
            r = self.log.get(CLAIMS)
            return [] if r is None else _claims(r)

    def update_claims(self, fn: Callable[[list[Claim]], tuple[list[Claim], T]]) -> T:
        def step(row):
            current = [] if row is None else _claims(row)
            new, out = fn(current)
            if new == current:
                return None, out
            return _row(0, CLAIMS, {"claims": [[c.consumer, c.first, c.last, c.expires_ms,
                                                 *([list(c.hashes)] if c.hashes else [])] for c in new]}), out

        with self._lock:
            self._opened = True
            return self.log.cas(CLAIMS, step, what=f"subscription {self.subscription!r} on {self.partition} claims",
                                keep=lambda r: True)


    def release_claims(self) -> None:
        """Drop every Shared / Key_Shared claim: on a deletion, and on a reset, as Pulsar disconnects
        the consumers then. A claim outlives the acknowledgement of its messages until the
        mark-delete position passes them, and its live consumer renews it, so after a reset
        backwards the replayed messages stayed with a consumer that had already acknowledged them,
        out of every other consumer's reach while it lived."""
        self.update_claims(lambda claims: ([], None))


def _claims(r: dict[str, Any]) -> list[Claim]:
    return [Claim(consumer, first, last, expires, tuple(rest[0]) if rest else ())
            for consumer, first, last, expires, *rest in _state(r).get("claims") or ()]


# A forked child starts without its parent's stores (their handles, locks and combiners are the parent's).
_SHARED: forks.ProcessCache[tuple[str, str, str], SubscriptionStore] = forks.ProcessCache()


def shared_store(root: StorageRoot, partition: TopicName, subscription: str) -> SubscriptionStore:
    """A process-wide store per (partition, subscription), shared by the consumers of this process
    and the TC's participant calls: with one store each sees the other's writes as its own, where
    two stores each lost the next CAS to the other's last write and re-read its file (measured:
    a transactional ack + commit did two failed appends and two reads more, ~5 ms of ~20)."""
    return _SHARED.get_or_make((root.url, str(partition), subscription),
                               lambda: SubscriptionStore(root, partition, subscription), keep=lambda s: s.root == root)


def forget_shared_stores(root: StorageRoot, topic: TopicName) -> None:
    """Drop the cached stores of a deleted topic's subscriptions (tombstoned with the topic; a
    re-created topic's subscribers must read the tombstone, not a cached cursor)."""
    prefix = f"{topic.base}-partition-"
    _SHARED.drop(lambda k: k[0] == root.url and k[1].startswith(prefix))


def end_transaction(root: StorageRoot, topic: str, subscription: str, txn_id: TxnID, action: TxnAction) -> None:
    """TC participant: apply a transaction's outcome to its pending acks on one partition.
    Idempotent: a transaction with nothing pending changes nothing."""
    partition = TopicName.parse(topic)
    store = shared_store(root, partition, subscription)
    if not store.exists():
        return
    k = _key(txn_id.most_bits, txn_id.least_bits)

    back: list[int] = []

    def apply(c: CursorState) -> bool:
        if action is TxnAction.COMMIT:
            return c.commit(k)
        back[:] = c.abort(k)  # the last attempt's (a lost compare-and-set runs this again)
        return bool(back)

    t0 = time.monotonic()
    if store.update(apply):  # writes only if the transaction had something pending here
        metrics.record_pending_ack(action is TxnAction.COMMIT, 1000 * (time.monotonic() - t0))
        if back:
            _unclaim(store, back)


def _unclaim(store: SubscriptionStore, offsets: list[int]) -> None:
    """Drop the Shared claims on messages an aborted transaction gave back: the consumer that
    acknowledged them no longer holds them, yet renews its claims while it lives, so they went to
    it alone, however long it left them, where Pulsar redelivers them to any consumer. Key_Shared
    claims (with hashes) stay: they keep their keys' order, and the key's consumer gets them anyway.
    A failure leaves them with that consumer, as before (logged)."""
    back = RangeSet.of(offsets)

    def change(claims: list[Claim]) -> tuple[list[Claim], None]:
        out: list[Claim] = []
        for c in claims:
            if c.hashes or not back.intersects(c.first, c.last):
                out.append(c)
                continue
            kept = RangeSet([(c.first, c.last)])
            for a, b in back.ranges():
                kept.remove_range(a, b)
            out += [c.narrowed(a, b) for a, b in kept.ranges()]
        return out, None

    try:
        store.update_claims(change)
    except PulsarException as e:
        log.warning("releasing the claims on %d message(s) an aborted transaction gave back on %s failed (they "
                    "stay with the consumer that acknowledged them): %s", len(offsets), store.partition, e)
