"""The pure TxnStatus machine (pulsartx.coordinator.state) and TxnID: no storage involved.

PIP-31 "TC Request Processing": OPEN -> COMMITTING -> COMMITTED and OPEN -> ABORTING -> ABORTED are
the only moves; CommandEndTxn repeated with the same action on a decided transaction succeeds, the
opposite action fails; partitions and subscriptions are only added while OPEN.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from pulsartx.coordinator.state import (
    VALID_PREVIOUS,
    MetadataOp,
    Subscription,
    TxnAction,
    TxnMeta,
    TxnStatus,
    end_request,
)
from pulsartx.coordinator.tclog import meta_to_row, row_to_meta
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import ExpiredTransactionError, InvalidConfiguration, InvalidTxnStatusError

S = TxnStatus
LEGAL = {(S.OPEN, S.COMMITTING), (S.OPEN, S.ABORTING), (S.COMMITTING, S.COMMITTED), (S.ABORTING, S.ABORTED)}
ALL_PAIRS = list(itertools.product(S, S))
ILLEGAL = [p for p in ALL_PAIRS if p not in LEGAL]


def meta(status: TxnStatus = S.OPEN, **kw) -> TxnMeta:
    base = dict(txn_id=TxnID(3, 7), status=status, timeout_ms=1000, start_ms=10_000, last_modified_ms=10_000, seq=4,
                partitions=frozenset({"p0"}), subscriptions=frozenset({Subscription("t", "s")}), owner="alice",
                transaction_key="k", epoch=2, reason=None)
    base.update(kw)
    return TxnMeta(**base)


# ---- the transition table ---------------------------------------------------------------------------


def test_valid_previous_is_exactly_pip31():
    assert VALID_PREVIOUS == {
        S.OPEN: frozenset(),
        S.COMMITTING: frozenset({S.OPEN}),
        S.COMMITTED: frozenset({S.COMMITTING}),
        S.ABORTING: frozenset({S.OPEN}),
        S.ABORTED: frozenset({S.ABORTING}),
    }
    assert {(p, n) for n, prevs in VALID_PREVIOUS.items() for p in prevs} == LEGAL
    assert len(ILLEGAL) == 21


@pytest.mark.parametrize(("old", "new"), sorted(LEGAL))
def test_legal_transition(old, new):
    m = meta(old)
    out = m.transition(new, 20_000, reason="why")
    assert out.status is new
    assert out.seq == m.seq + 1
    assert out.last_modified_ms == 20_000
    assert out.reason == "why"
    # everything else is carried over, and the input is untouched (prepared, applied only once durable)
    assert replace(out, status=old, seq=m.seq, last_modified_ms=m.last_modified_ms, reason=None) == m
    assert m.status is old and m.seq == 4


@pytest.mark.parametrize(("old", "new"), ILLEGAL)
def test_every_illegal_transition_raises(old, new):
    m = meta(old)
    with pytest.raises(InvalidTxnStatusError) as ei:
        m.transition(new, 20_000)
    assert type(ei.value) is InvalidTxnStatusError
    assert old.value in str(ei.value) and new.value in str(ei.value)
    assert m.status is old and m.seq == 4


def test_transition_keeps_reason_unless_given_and_applies_changes():
    m = meta(S.OPEN, reason=None).transition(S.ABORTING, 1, reason="timed out")
    assert m.transition(S.ABORTED, 2).reason == "timed out"
    c = meta(S.OPEN).transition(S.COMMITTING, 1, commit_entries=(("p0", 1, 3),))
    assert c.commit_entries == (("p0", 1, 3),)


def test_full_paths():
    m = meta(S.OPEN)
    committed = m.transition(S.COMMITTING, 1).transition(S.COMMITTED, 2)
    aborted = m.transition(S.ABORTING, 1).transition(S.ABORTED, 2)
    assert (committed.status, committed.seq) == (S.COMMITTED, 6)
    assert (aborted.status, aborted.seq) == (S.ABORTED, 6)
    for final in (committed, aborted):
        for target in S:
            with pytest.raises(InvalidTxnStatusError):
                final.transition(target, 3)


def test_status_and_action_properties():
    assert {s for s in S if s.is_final} == {S.COMMITTED, S.ABORTED}
    assert {s for s in S if s.is_decided} == {S.COMMITTING, S.COMMITTED, S.ABORTING, S.ABORTED}
    assert (TxnAction.COMMIT.ending_status, TxnAction.COMMIT.final_status) == (S.COMMITTING, S.COMMITTED)
    assert (TxnAction.ABORT.ending_status, TxnAction.ABORT.final_status) == (S.ABORTING, S.ABORTED)
    assert [o.value for o in MetadataOp] == ["NEW", "ADD_PARTITION", "ADD_SUBSCRIPTION", "UPDATE"]


# ---- end_request: PIP-31 CommandEndTxn ----------------------------------------------------------------

END_EXPECTED = {
    (S.OPEN, TxnAction.COMMIT): True, (S.OPEN, TxnAction.ABORT): True,
    (S.COMMITTING, TxnAction.COMMIT): False, (S.COMMITTED, TxnAction.COMMIT): False,
    (S.ABORTING, TxnAction.ABORT): False, (S.ABORTED, TxnAction.ABORT): False,
    (S.COMMITTING, TxnAction.ABORT): InvalidTxnStatusError, (S.COMMITTED, TxnAction.ABORT): InvalidTxnStatusError,
    (S.ABORTING, TxnAction.COMMIT): InvalidTxnStatusError, (S.ABORTED, TxnAction.COMMIT): InvalidTxnStatusError,
}


def test_end_request_table_is_complete():
    assert set(END_EXPECTED) == set(itertools.product(S, TxnAction))


@pytest.mark.parametrize(("status", "action"), sorted(END_EXPECTED))
def test_end_request(status, action):
    expected = END_EXPECTED[(status, action)]
    m = meta(status, reason="fenced by epoch 3" if status is S.ABORTED else None)
    if expected is InvalidTxnStatusError:
        with pytest.raises(InvalidTxnStatusError) as ei:
            end_request(m, action)
        assert status.value in str(ei.value)
    else:
        assert end_request(m, action) is expected


# ---- partitions and subscriptions -----------------------------------------------------------------------


def test_with_partitions_and_subscriptions_union_while_open():
    m = meta(S.OPEN)
    m2 = m.with_partitions({"p0", "p1"}, 11_000)
    assert m2.partitions == frozenset({"p0", "p1"}) and m2.seq == 5 and m2.last_modified_ms == 11_000
    m3 = m2.with_subscriptions({Subscription("t", "s"), Subscription("t", "s2")}, 12_000)
    assert m3.subscriptions == frozenset({Subscription("t", "s"), Subscription("t", "s2")})
    assert m3.partitions == m2.partitions and m3.seq == 6
    assert m.partitions == frozenset({"p0"})  # immutable
    assert str(Subscription("persistent://a/b/c", "sub")) == "persistent://a/b/c:sub"


@pytest.mark.parametrize("status", [s for s in S if s is not S.OPEN])
def test_adding_is_rejected_unless_open(status):
    m = meta(status)
    with pytest.raises(InvalidTxnStatusError) as ei:
        m.with_partitions({"p9"}, 1)
    assert status.value in str(ei.value)
    with pytest.raises(InvalidTxnStatusError):
        m.with_partitions(set(m.partitions), 1)  # even a repeat
    with pytest.raises(InvalidTxnStatusError):
        m.with_subscriptions({Subscription("t", "s9")}, 1)


def test_expired():
    m = meta(S.OPEN, start_ms=1000, timeout_ms=500)
    assert not m.expired(1499)
    assert m.expired(1500) and m.expired(10**12)
    for s in S:
        if s is not S.OPEN:
            assert not meta(s, start_ms=1000, timeout_ms=500).expired(10**12)


# ---- TxnID ---------------------------------------------------------------------------------------------


def test_txnid_text_and_parse():
    assert str(TxnID(1, 2)) == "(1,2)"
    assert TxnID(1, 2).tc_id == 1 and TxnID(1, 2).as_tuple() == (1, 2)
    for text in ["(1,2)", "1,2", "( 1 , 2 )", "1:2", "(1:2)", (1, 2), TxnID(1, 2)]:
        assert TxnID.parse(text) == TxnID(1, 2)
    for bad in ["", "1", "(a,b)", "1,2,3", "1:2:3", "1;2"]:
        with pytest.raises(InvalidConfiguration, match="'most,least', 'most:least' or '\\(most,least\\)'"):
            TxnID.parse(bad)


def test_txnid_order_and_hash():
    ids = [TxnID(1, 10), TxnID(0, 99), TxnID(1, 2), TxnID(0, 3)]
    assert sorted(ids) == [TxnID(0, 3), TxnID(0, 99), TxnID(1, 2), TxnID(1, 10)]
    assert len({TxnID(1, 2), TxnID(1, 2), TxnID(2, 1)}) == 2


def test_expired_error_is_an_invalid_status_error():
    assert issubclass(ExpiredTransactionError, InvalidTxnStatusError)


# ---- the TC log row format ----------------------------------------------------------------------------


def test_log_row_round_trip():
    m = meta(S.COMMITTING, commit_entries=(("p0", 0, 4), ("p1", 7, 7)), properties={"a": "b"}, reason="x")
    row = meta_to_row(m, MetadataOp.UPDATE, S.OPEN)
    assert (row["metadata_op"], row["expected_status"], row["new_status"]) == ("UPDATE", "OPEN", "COMMITTING")
    back = row_to_meta(row)
    assert back == m and back.properties == {"a": "b"}
    bare = meta(S.OPEN, partitions=frozenset(), subscriptions=frozenset(), owner=None, transaction_key=None,
                epoch=None)
    assert row_to_meta(meta_to_row(bare, MetadataOp.NEW, None)) == bare
