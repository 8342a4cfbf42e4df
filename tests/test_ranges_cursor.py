"""Pure unit tests of RangeSet and CursorState (PIP-31's PENDING_ACK state machine): no disk.

Every conflict rule of Pulsar's pending-ack handle (PendingAckHandleImpl) is exercised on the pure
value, together with the TC commit/abort outcomes and their idempotency, and the row codec the
store uses (replaying the latest row must restore PENDING_ACK exactly).
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsartx.exceptions import TransactionConflict
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.ranges import RangeSet
from pulsartx.subscription.store import cursor_to_row, row_to_cursor

A, B, C = 101, 202, 303  # transaction keys


# ================================ RangeSet ========================================================


def test_rangeset_merges_adjacent_and_overlapping():
    rs = RangeSet()
    for o in (5, 3, 4, 10, 12, 11, 0):
        rs.add(o)
    assert rs.ranges() == [(0, 0), (3, 5), (10, 12)]
    rs.add_range(1, 2)
    assert rs.ranges() == [(0, 5), (10, 12)]
    rs.add_range(4, 11)
    assert rs.ranges() == [(0, 12)]
    rs.add_range(20, 19)  # empty range: nothing
    assert rs.ranges() == [(0, 12)]
    assert len(rs) == 13 and list(rs) == list(range(13))


def test_rangeset_constructor_of_copy_eq():
    assert RangeSet([(5, 6), (1, 2), (3, 4)]).ranges() == [(1, 6)]
    assert RangeSet.of([7, 1, 2, 2, 9, 8]).ranges() == [(1, 2), (7, 9)]
    a = RangeSet.of([1, 2, 3])
    b = a.copy()
    b.add(10)
    assert a.ranges() == [(1, 3)] and b.ranges() == [(1, 3), (10, 10)]
    assert a == RangeSet([(1, 3)]) and a != b and a != [(1, 3)]
    assert not RangeSet() and RangeSet.of([0])
    assert RangeSet().first() is None and b.first() == 1
    assert repr(a) == "RangeSet([(1, 3)])"


def test_rangeset_contains():
    rs = RangeSet([(2, 4), (8, 8)])
    assert [o for o in range(-1, 11) if o in rs] == [2, 3, 4, 8]
    assert 0 not in RangeSet()


def test_rangeset_remove_splits_and_trims():
    rs = RangeSet([(0, 10), (20, 30)])
    rs.remove_range(3, 5)
    assert rs.ranges() == [(0, 2), (6, 10), (20, 30)]
    rs.remove_range(9, 21)
    assert rs.ranges() == [(0, 2), (6, 8), (22, 30)]
    rs.discard(0)
    rs.discard(30)
    rs.discard(100)
    assert rs.ranges() == [(1, 2), (6, 8), (22, 29)]
    rs.remove_below(6)
    assert rs.ranges() == [(7, 8), (22, 29)]
    rs.remove_range(5, 4)  # empty: nothing
    assert rs.ranges() == [(7, 8), (22, 29)]
    rs.remove_below(100)
    assert rs.ranges() == [] and len(rs) == 0
    RangeSet().remove_range(0, 5)  # on an empty set


def test_rangeset_intersects():
    rs = RangeSet([(5, 7), (20, 20)])
    assert rs.intersects(0, 5) and rs.intersects(7, 9) and rs.intersects(6, 6) and rs.intersects(0, 100)
    assert rs.intersects(20, 20) and rs.intersects(19, 21)
    assert not rs.intersects(0, 4) and not rs.intersects(8, 19) and not rs.intersects(21, 99)
    assert not RangeSet().intersects(0, 100)


def test_rangeset_gaps():
    rs = RangeSet([(2, 3), (6, 6)])
    assert list(rs.gaps(0, 10)) == [0, 1, 4, 5, 7, 8, 9]
    assert list(rs.gaps(0, 10, limit=3)) == [0, 1, 4]
    assert list(rs.gaps(3, 7)) == [4, 5]
    assert list(rs.gaps(2, 4)) == []
    assert list(rs.gaps(5, 5)) == []
    assert list(rs.gaps(0, 10, limit=0)) == []
    assert list(RangeSet().gaps(3, 6)) == [3, 4, 5]
    assert list(RangeSet([(0, 99)]).gaps(0, 100)) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "below"]), st.integers(0, 60), st.integers(0, 8)),
                max_size=40),
       st.integers(0, 70), st.integers(0, 70), st.integers(0, 10))
def test_rangeset_matches_a_python_set(ops, a, b, limit):
    rs, model = RangeSet(), set()
    for op, x, w in ops:
        if op == "add":
            rs.add_range(x, x + w)
            model |= set(range(x, x + w + 1))
        elif op == "remove":
            rs.remove_range(x, x + w)
            model -= set(range(x, x + w + 1))
        else:
            rs.remove_below(x)
            model = {o for o in model if o > x}
        # invariant: sorted, disjoint, non-adjacent inclusive ranges
        rng = rs.ranges()
        assert all(s <= e for s, e in rng)
        assert all(rng[i][1] + 1 < rng[i + 1][0] for i in range(len(rng) - 1))
    assert list(rs) == sorted(model) and len(rs) == len(model)
    assert all((o in rs) == (o in model) for o in range(-1, 75))
    lo, hi = min(a, b), max(a, b)
    assert rs.intersects(lo, hi) == any(lo <= o <= hi for o in model)
    assert list(rs.gaps(lo, hi)) == [o for o in range(lo, hi) if o not in model]
    assert list(rs.gaps(lo, hi, limit)) == [o for o in range(lo, hi) if o not in model][:limit]


# ================================ CursorState: plain acks =========================================


def test_plain_individual_acks_fold_into_mark_delete():
    c = CursorState()
    c.ack([2, 3, 7])
    assert c.mark_delete == -1 and c.acked.ranges() == [(2, 3), (7, 7)]
    c.ack([0])
    assert c.mark_delete == 0 and c.acked.ranges() == [(2, 3), (7, 7)]
    c.ack([1])
    assert c.mark_delete == 3 and c.acked.ranges() == [(7, 7)]
    c.ack([4, 5, 6])
    assert c.mark_delete == 7 and not c.acked
    c.ack([2, 7])  # already acked: no-op
    assert c.mark_delete == 7 and not c.acked
    assert all(c.is_acked(o) for o in range(8)) and not c.is_acked(8)


def test_plain_cumulative_ack():
    c = CursorState()
    c.ack([6, 9])
    c.ack_cumulative(4)
    assert c.mark_delete == 4 and c.acked.ranges() == [(6, 6), (9, 9)]
    c.ack_cumulative(2)  # below: no-op
    assert c.mark_delete == 4
    c.ack_cumulative(5)  # touches 6: folds
    assert c.mark_delete == 6 and c.acked.ranges() == [(9, 9)]
    c.ack_cumulative(12)
    assert c.mark_delete == 12 and not c.acked


def test_plain_ack_of_pending_message_is_ignored():
    c = CursorState()
    c.txn_ack(A, [1])
    c.ack([0, 1, 2])
    assert c.mark_delete == 0 and c.acked.ranges() == [(2, 2)]
    assert c.pending_txn(1) == A and not c.is_acked(1)
    # A plain cumulative ack over a pending message acks around it and leaves it PENDING_ACK.
    c.ack_cumulative(5)
    assert c.mark_delete == 0 and c.acked.ranges() == [(2, 5)] and c.pending_txn(1) == A
    c.commit(A)
    assert c.mark_delete == 5 and not c.acked and not c.pending


def test_plain_cumulative_ack_over_a_pending_cumulative_ack():
    c = CursorState()
    c.txn_ack_cumulative(A, 3)
    c.ack_cumulative(6)
    assert c.mark_delete == -1 and c.acked.ranges() == [(4, 6)]
    assert [c.pending_txn(o) for o in range(8)] == [A, A, A, A, None, None, None, None]
    c.abort(A)
    assert c.mark_delete == -1 and [c.redelivery_count(o) for o in range(5)] == [1, 1, 1, 1, 0]
    c.ack([0, 1, 2, 3])
    assert c.mark_delete == 6 and not c.redelivery


# ================================ CursorState: transactional acks =================================


def test_txn_individual_ack_is_pending_then_commit():
    c = CursorState()
    c.txn_ack(A, [1, 2, 5])
    assert c.pending == {A: RangeSet([(1, 2), (5, 5)])}
    assert [c.is_pending(o) for o in range(7)] == [False, True, True, False, False, True, False]
    assert c.pending_count() == 3 and c.unavailable().ranges() == [(1, 2), (5, 5)]
    assert not any(c.is_acked(o) for o in range(7))
    assert c.commit(A) is True
    assert c.pending == {} and c.acked.ranges() == [(1, 2), (5, 5)] and c.mark_delete == -1
    assert c.commit(A) is False  # idempotent
    assert c.acked.ranges() == [(1, 2), (5, 5)]


def test_txn_individual_ack_abort_makes_redeliverable_and_counts():
    c = CursorState()
    c.txn_ack(A, [1, 2])
    assert c.abort(A) == [1, 2]
    assert c.pending == {} and c.redelivery == {1: 1, 2: 1} and not c.is_acked(1)
    assert c.abort(A) == []  # idempotent: no second bump
    assert c.redelivery == {1: 1, 2: 1}
    c.txn_ack(B, [1])  # can be acked again, in another transaction
    c.abort(B)
    assert c.redelivery == {1: 2, 2: 1}
    c.ack([0, 1, 2])
    assert c.mark_delete == 2 and c.redelivery == {}  # acked offsets forget their counts


def test_conflict_individual_ack_of_acked_message():
    c = CursorState()
    c.ack([0, 1, 3])
    with pytest.raises(TransactionConflict, match="offset 0 is already acknowledged"):
        c.txn_ack(A, [0])  # below mark-delete
    with pytest.raises(TransactionConflict, match="offset 3 is already acknowledged"):
        c.txn_ack(A, [2, 3])  # individually acked; the whole call changes nothing
    assert c.pending == {}


def test_conflict_individual_ack_of_message_pending_in_another_txn():
    c = CursorState()
    c.txn_ack(A, [4])
    with pytest.raises(TransactionConflict, match="offset 4 is already pending acknowledgement by another"):
        c.txn_ack(B, [3, 4])
    assert c.pending == {A: RangeSet([(4, 4)])}


def test_conflict_individual_ack_twice_in_the_same_txn():
    c = CursorState()
    c.txn_ack(A, [4])
    with pytest.raises(TransactionConflict, match="offset 4 is already pending acknowledgement by this"):
        c.txn_ack(A, [4])


def test_conflict_individual_ack_inside_a_pending_cumulative_ack():
    c = CursorState()
    c.txn_ack_cumulative(A, 5)
    with pytest.raises(TransactionConflict, match="offset 3 is already pending acknowledgement by another"):
        c.txn_ack(B, [3])
    with pytest.raises(TransactionConflict, match="by this transaction"):
        c.txn_ack(A, [5])
    c.txn_ack(B, [6])  # above the cumulative position: fine
    assert c.pending_txn(6) == B


def test_txn_cumulative_ack_commit():
    c = CursorState()
    c.ack([1])
    c.txn_ack_cumulative(A, 4)
    assert c.pending_cumulative == (A, 4)
    assert [c.pending_txn(o) for o in range(6)] == [A, None, A, A, A, None]  # 1 is acked already
    assert c.pending_count() == 4 and c.unavailable().ranges() == [(0, 4)]
    c.txn_ack_cumulative(A, 6)  # the same txn moves its own position forward
    assert c.pending_cumulative == (A, 6)
    assert c.commit(A) is True
    assert c.mark_delete == 6 and c.pending_cumulative is None and not c.acked
    assert c.commit(A) is False and c.mark_delete == 6


def test_txn_cumulative_ack_abort():
    c = CursorState()
    c.ack([1])
    c.txn_ack_cumulative(A, 3)
    assert c.abort(A) == [0, 2, 3]
    assert c.pending_cumulative is None and c.mark_delete == -1 and c.redelivery == {0: 1, 2: 1, 3: 1}
    assert c.abort(A) == [] and c.redelivery == {0: 1, 2: 1, 3: 1}
    c.txn_ack_cumulative(B, 3)  # another transaction may take it now
    c.commit(B)
    assert c.mark_delete == 3 and c.redelivery == {}


def test_conflict_cumulative_ack_at_or_below_mark_delete():
    c = CursorState()
    c.ack_cumulative(5)
    for pos in (5, 2, -1):
        with pytest.raises(TransactionConflict, match=rf"offset {pos} is at or below the mark-delete position 5"):
            c.txn_ack_cumulative(A, pos)
    assert c.pending_cumulative is None


def test_conflict_cumulative_ack_while_another_txn_holds_one():
    c = CursorState()
    c.txn_ack_cumulative(A, 2)
    for pos in (1, 2, 9):
        with pytest.raises(TransactionConflict, match=r"another transaction holds a pending cumulative ack \(at offset 2\)"):
            c.txn_ack_cumulative(B, pos)
    assert c.pending_cumulative == (A, 2)


def test_conflict_cumulative_ack_at_or_below_own_pending_position():
    c = CursorState()
    c.txn_ack_cumulative(A, 5)
    for pos in (5, 3):
        with pytest.raises(TransactionConflict, match=r"at or below this transaction's pending position 5"):
            c.txn_ack_cumulative(A, pos)
    assert c.pending_cumulative == (A, 5)


def test_conflict_cumulative_ack_over_another_txns_individual_pending_acks():
    c = CursorState()
    c.txn_ack(B, [7])
    with pytest.raises(TransactionConflict, match="covers messages pending in another transaction"):
        c.txn_ack_cumulative(A, 7)
    with pytest.raises(TransactionConflict, match="covers messages pending in another transaction"):
        c.txn_ack_cumulative(A, 10)
    c.txn_ack_cumulative(A, 6)  # stops short of it
    c.txn_ack(A, [8])
    with pytest.raises(TransactionConflict, match="covers messages pending in another transaction"):
        c.txn_ack_cumulative(A, 9)  # moving past B's message is refused too
    assert c.pending_cumulative == (A, 6) and c.pending == {B: RangeSet([(7, 7)]), A: RangeSet([(8, 8)])}
    c.commit(B)
    c.txn_ack_cumulative(A, 9)  # once B committed, A may move past it
    c.commit(A)
    assert c.mark_delete == 9 and not c.pending and not c.acked


def test_cumulative_ack_over_own_individual_pending_acks():
    c = CursorState()
    c.txn_ack(A, [1, 3])
    c.txn_ack_cumulative(A, 4)
    assert c.commit(A) and c.mark_delete == 4 and not c.pending and not c.acked


def test_abort_of_individual_and_cumulative_in_one_txn_counts_each_message_once():
    c = CursorState()
    c.txn_ack(A, [1, 3])
    c.txn_ack_cumulative(A, 4)
    back = c.abort(A)
    assert sorted(back) == [0, 1, 2, 3, 4]
    assert c.redelivery == {o: 1 for o in range(5)}


def test_abort_cumulative_does_not_bump_messages_pending_elsewhere():
    c = CursorState()
    c.txn_ack_cumulative(A, 2)
    c.txn_ack(B, [4])
    c.txn_ack_cumulative(A, 3)
    assert c.abort(A) == [0, 1, 2, 3]
    assert c.pending == {B: RangeSet([(4, 4)])} and 4 not in c.redelivery


def test_commit_or_abort_of_unknown_txn_changes_nothing():
    c = CursorState()
    c.txn_ack(A, [0])
    before = c.copy()
    assert c.commit(C) is False and c.abort(C) == []
    assert c == before


def test_several_txns_resolve_independently():
    c = CursorState()
    c.txn_ack(A, [0, 2])
    c.txn_ack(B, [1, 3])
    c.txn_ack(C, [5])
    with pytest.raises(TransactionConflict, match="covers messages pending in another transaction"):
        c.txn_ack_cumulative(C, 6)
    c.abort(B)
    c.commit(A)
    assert c.mark_delete == 0 and c.acked.ranges() == [(2, 2)] and c.redelivery == {1: 1, 3: 1}
    assert c.pending == {C: RangeSet([(5, 5)])}
    c.txn_ack(B, [1, 3])  # aborted acks may be acked again
    c.commit(B)
    c.commit(C)
    assert c.mark_delete == 3 and c.acked.ranges() == [(5, 5)] and not c.pending and not c.redelivery


def test_copy_is_deep():
    c = CursorState()
    c.txn_ack(A, [1])
    c.ack([3])
    c.bump_redelivery([1])
    d = c.copy()
    d.txn_ack(A, [2])
    d.txn_ack_cumulative(B, 0)
    d.ack([4])
    d.bump_redelivery([1])
    assert c.pending[A].ranges() == [(1, 1)] and c.acked.ranges() == [(3, 3)] and c.redelivery == {1: 1}
    assert c.mark_delete == -1 and c.pending_cumulative is None


def test_reset_drops_everything_above():
    c = CursorState()
    c.ack([0, 1, 5])
    c.txn_ack(A, [3])
    c.txn_ack_cumulative(B, 2)
    c.bump_redelivery([4])
    c.reset(0)
    assert c == CursorState(mark_delete=-1, reset_epoch=1)
    c.reset(10)
    assert c.mark_delete == 9 and c.reset_epoch == 2  # each reset is a new epoch, even one going forward


def test_reset_epoch_roundtrips_and_reads_as_zero_when_absent():
    """A row written before the epoch was recorded (no ``reset_epoch`` in its state) reads as
    epoch 0, as one of a cursor never reset; a never-reset cursor's row is written without it."""
    import json

    c = CursorState(mark_delete=4, incarnation="i")
    row = cursor_to_row(0, c)
    assert "reset_epoch" not in json.loads(row["state"])
    c.reset(2)
    c.reset(3)
    assert row_to_cursor(cursor_to_row(0, c)).reset_epoch == 2
    old = cursor_to_row(0, c)
    state = json.loads(old["state"])
    del state["reset_epoch"]
    old["state"] = json.dumps(state)
    assert row_to_cursor(old) == CursorState(mark_delete=2, incarnation="i")


# ================================ the store's row codec ===========================================


def test_row_roundtrip_restores_pending_ack_exactly():
    # TxnID bits as the TC issues them (most = TC id, least = counter), keyed like the buffer does.
    from pulsartx.buffer.state import txn_key

    ka, kb = txn_key(0, 7), txn_key(3, 2**40 + 5)
    c = CursorState()
    c.ack([0, 1, 2, 10, 11, 20])
    c.txn_ack(ka, [5, 6, 8])
    c.txn_ack(kb, [30])
    c.txn_ack_cumulative(kb, 4)  # covers 3 and 4
    c.bump_redelivery([4, 4, 9])
    back = row_to_cursor(cursor_to_row(3, c))
    assert back == c
    assert back.pending_cumulative == (kb, 4) and back.pending == {ka: RangeSet([(5, 6), (8, 8)]),
                                                                    kb: RangeSet([(30, 30)])}
    assert back.mark_delete == 2 and back.redelivery == {4: 2, 9: 1}
    empty = row_to_cursor(cursor_to_row(0, CursorState()))
    assert empty == CursorState()
