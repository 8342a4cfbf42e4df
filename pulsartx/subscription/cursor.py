"""A subscription's cursor on one partition, with its PENDING_ACK state, as a pure value.

PIP-31's acknowledgement state machine per message: unacked → (txn ack) PENDING_ACK →
(TC commit) acked, or → (TC abort) unacked again and redeliverable. Pulsar's conflict rules are
enforced here, on one consistent state, and the store (``store.py``) applies every change as a
compare-and-set, so the rules hold across processes too.

Offsets <= ``mark_delete`` are acknowledged; ``acked`` holds those acknowledged individually above
it. Each transaction's individual pending acks are a RangeSet; one transaction at a time may hold
a pending cumulative ack.

``deadlines`` holds, for a transaction whose TC log did not hold it when it acknowledged here (a
lazily begun transaction that has only acknowledged: it registers this subscription with its
decision), its deadline (start + timeout, ms): what recovery needs to tell an open one from a dead
one without its registration (docs/semantics.md, "An acknowledgement-only transaction").

``incarnation`` names one life of the subscription: a new one each time it is created (after a
deletion too), so a consumer of a deleted subscription, whose object outlives it, can tell the
re-created subscription of the same name from its own and leave it alone.

``reset_epoch`` counts the resets (``reset_subscription``, ``seek``) of this incarnation. A
consumer groups plain acknowledgements and redelivery-count rises before it persists them; it
records the epoch of the cursor it last read with them, and drops them when the cursor it persists
them to was reset since: they were made against the position the reset replaced, and applied
after it they would undo it (docs/design/subscription-incarnations.md).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from pulsartx.exceptions import TransactionConflict
from pulsartx.subscription.ranges import RangeSet


@dataclass
class CursorState:
    mark_delete: int = -1
    acked: RangeSet = field(default_factory=RangeSet)
    pending: dict[int, RangeSet] = field(default_factory=dict)
    pending_cumulative: tuple[int, int] | None = None  # (txn key, position)
    redelivery: dict[int, int] = field(default_factory=dict)
    deleted: bool = False
    deadlines: dict[int, int] = field(default_factory=dict)  # txn key -> deadline ms, unregistered ones only
    incarnation: str = ""  # "" for a cursor created before incarnations were recorded
    reset_epoch: int = 0  # resets of this incarnation; 0 also for a cursor written before it was recorded

    def copy(self) -> CursorState:
        return CursorState(self.mark_delete, self.acked.copy(), {k: v.copy() for k, v in self.pending.items()},
                           self.pending_cumulative, dict(self.redelivery), self.deleted, dict(self.deadlines),
                           self.incarnation, self.reset_epoch)

    def note_deadline(self, txn: int, deadline_ms: int) -> None:
        """Record the deadline of a transaction the TC log does not hold yet, beside its pending acks."""
        if txn in self.pending or (self.pending_cumulative is not None and self.pending_cumulative[0] == txn):
            self.deadlines[txn] = max(deadline_ms, self.deadlines.get(txn, deadline_ms))

    def _drop_deadline(self, txn: int) -> None:
        if txn not in self.pending and not (self.pending_cumulative is not None and self.pending_cumulative[0] == txn):
            self.deadlines.pop(txn, None)

    # ---- queries ---------------------------------------------------------------------------------
    def is_acked(self, offset: int) -> bool:
        return offset <= self.mark_delete or offset in self.acked

    def pending_txn(self, offset: int) -> int | None:
        """The transaction holding ``offset`` in PENDING_ACK, if any."""
        for k, rs in self.pending.items():
            if offset in rs:
                return k
        if self.pending_cumulative is not None and offset <= self.pending_cumulative[1] and not self.is_acked(offset):
            return self.pending_cumulative[0]
        return None

    def is_pending(self, offset: int) -> bool:
        return self.pending_txn(offset) is not None

    def pending_offsets(self) -> RangeSet:
        """Every offset in PENDING_ACK, in any transaction (cumulative acks included)."""
        rs = RangeSet()
        for p in self.pending.values():
            for a, b in p.ranges():
                rs.add_range(a, b)
        if self.pending_cumulative is not None:
            rs.add_range(self.mark_delete + 1, self.pending_cumulative[1])
        return rs

    def _pending_in(self, runs: RangeSet) -> bool:
        """Whether any offset of ``runs`` may be in PENDING_ACK (a superset: a pending cumulative
        ack's whole range counts, acked offsets in it included)."""
        if not self.pending and self.pending_cumulative is None:
            return False
        pending = self.pending_offsets()
        return any(pending.intersects(a, b) for a, b in runs.ranges())

    def unavailable(self) -> RangeSet:
        """Offsets a consumer must not deliver: acked or pending (above the mark-delete position)."""
        rs = self.pending_offsets()
        for a, b in self.acked.ranges():
            rs.add_range(a, b)
        return rs

    def covers(self, offsets: list[int]) -> bool:
        """Whether a cumulative ack at the last of ``offsets`` (sorted, distinct) acknowledges
        exactly them: none is acked yet, every other offset between the mark-delete position and
        it is (markers, aborted data), and nothing in that span is pending or under a pending
        cumulative ack. Then the cumulative ack and the individual ones are the same change, with
        the same conflicts (none)."""
        if not offsets or offsets[0] <= self.mark_delete or self.pending_cumulative is not None:
            return False
        last = offsets[-1]
        if self._pending_in(RangeSet([(self.mark_delete + 1, last)])):
            return False
        others = last - self.mark_delete - len(offsets)  # offsets in the span that are not given
        acked = 0
        for a, b in self.acked.ranges():
            if a > last:
                break
            # An offset given that is acked already: the individual acks would conflict.
            if bisect.bisect_right(offsets, b) != bisect.bisect_left(offsets, a):
                return False
            acked += min(b, last) - a + 1
        return acked == others

    def redelivery_count(self, offset: int) -> int:
        return self.redelivery.get(offset, 0)

    def pending_count(self) -> int:
        n = sum(len(rs) for rs in self.pending.values())
        if self.pending_cumulative is not None:
            n += sum(1 for o in range(self.mark_delete + 1, self.pending_cumulative[1] + 1) if not self.is_acked(o))
        return n

    # ---- plain acknowledgements --------------------------------------------------------------------
    def ack(self, offsets: list[int]) -> None:
        """Individual acks. A message in PENDING_ACK ignores a plain ack (PIP-31).

        Applied range by range when none of them is pending (a table's acks, a grouped flush):
        one message at a time cost microseconds each."""
        runs = RangeSet.of(offsets)
        if not self._pending_in(runs):
            for a, b in runs.ranges():
                self.acked.add_range(max(a, self.mark_delete + 1), b)
        else:
            for o in offsets:
                if not self.is_acked(o) and not self.is_pending(o):
                    self.acked.add(o)
        self._compact()

    def ack_cumulative(self, position: int) -> None:
        if position <= self.mark_delete:
            return
        pending = self.pending_offsets()
        if not pending.intersects(self.mark_delete + 1, position):
            self.mark_delete = position
            self.acked.remove_below(position)
        else:
            for o in pending.gaps(self.mark_delete + 1, position + 1):
                self.acked.add(o)
        self._compact()

    # ---- transactional acknowledgements (PENDING_ACK) ---------------------------------------------
    def txn_ack(self, txn: int, offsets: list[int]) -> None:
        runs = RangeSet.of(offsets)
        if not self._pending_in(runs) and all(a > self.mark_delete and not self.acked.intersects(a, b)
                                              for a, b in runs.ranges()):
            # No offset acked or pending: nothing to refuse, so the ranges go in whole.
            held = self.pending.setdefault(txn, RangeSet())
            for a, b in runs.ranges():
                held.add_range(a, b)
            return
        for o in offsets:  # one by one: the first conflict is named by its offset
            if self.is_acked(o):
                raise TransactionConflict(f"message at offset {o} is already acknowledged")
            holder = self.pending_txn(o)
            if holder is not None:
                same = " by this transaction" if holder == txn else " by another transaction"
                raise TransactionConflict(f"message at offset {o} is already pending acknowledgement{same}")
        self.pending.setdefault(txn, RangeSet())
        for o in offsets:
            self.pending[txn].add(o)

    def txn_ack_cumulative(self, txn: int, position: int) -> None:
        if position <= self.mark_delete:
            raise TransactionConflict(
                f"cumulative ack at offset {position} is at or below the mark-delete position {self.mark_delete}")
        if self.pending_cumulative is not None:
            holder, pos = self.pending_cumulative
            if holder != txn:
                raise TransactionConflict(
                    f"another transaction holds a pending cumulative ack (at offset {pos}) on this subscription")
            if position <= pos:
                raise TransactionConflict(
                    f"cumulative ack at offset {position} is at or below this transaction's pending position {pos}")
        for k, rs in self.pending.items():
            if k != txn and rs.intersects(self.mark_delete + 1, position):
                raise TransactionConflict(
                    f"cumulative ack at offset {position} covers messages pending in another transaction")
        self.pending_cumulative = (txn, position)

    def withdraw(self, txn: int, offsets: list[int] = (), cumulative: int | None = None) -> None:
        """Take back pending acks a transaction has just made, as if never made (no redelivery
        counted): the acknowledgement that made them failed before it returned."""
        rs = self.pending.get(txn)
        if rs is not None:
            for o in offsets:
                rs.discard(o)
            if not rs:
                del self.pending[txn]
        if cumulative is not None and self.pending_cumulative == (txn, cumulative):
            self.pending_cumulative = None
        self._drop_deadline(txn)

    def commit(self, txn: int) -> bool:
        """TC commit: the transaction's pending acks become acknowledgements. Idempotent."""
        changed = False
        rs = self.pending.pop(txn, None)
        if rs is not None:
            for a, b in rs.ranges():
                self.acked.add_range(a, b)
            changed = True
        if self.pending_cumulative is not None and self.pending_cumulative[0] == txn:
            pos = self.pending_cumulative[1]
            self.pending_cumulative = None
            self.ack_cumulative(pos)
            changed = True
        self._drop_deadline(txn)
        self._compact()
        return changed

    def abort(self, txn: int) -> list[int]:
        """TC abort: pending acks go back to unacked and their redelivery count rises. Idempotent.
        Returns the offsets made redeliverable."""
        back: list[int] = []
        rs = self.pending.pop(txn, None)
        if rs is not None:
            back.extend(o for o in rs if not self.is_acked(o))
        if self.pending_cumulative is not None and self.pending_cumulative[0] == txn:
            pos = self.pending_cumulative[1]
            self.pending_cumulative = None
            back.extend(o for o in range(self.mark_delete + 1, pos + 1) if not self.is_acked(o) and not self.is_pending(o))
        self._drop_deadline(txn)
        back = sorted(set(back))  # acked individually and cumulatively in the txn: one redelivery, not two
        self.bump_redelivery(back)
        return back

    def bump_redelivery(self, offsets: list[int]) -> None:
        for o in offsets:
            self.redelivery[o] = self.redelivery.get(o, 0) + 1

    def reset(self, position: int) -> None:
        """Seek: the next message delivered is ``position``; everything before it counts as acked.
        A new reset epoch, so that acknowledgements grouped against the old position are not
        applied to the new one."""
        self.reset_epoch += 1
        self.mark_delete = position - 1
        self.acked = RangeSet()
        self.pending = {}
        self.pending_cumulative = None
        self.redelivery = {}
        self.deadlines = {}

    def _compact(self) -> None:
        """Fold individually acked ranges that touch the mark-delete position into it."""
        first = self.acked.first()
        while first is not None and first <= self.mark_delete + 1:
            end = next(b for a, b in self.acked.ranges() if a == first)
            self.mark_delete = max(self.mark_delete, end)
            self.acked.remove_below(self.mark_delete)
            first = self.acked.first()
        if self.redelivery:
            self.redelivery = {o: c for o, c in self.redelivery.items() if not self.is_acked(o)}
