"""The transaction buffer's pure fold and READ_COMMITTED filter (PIP-31 "Transaction Buffer",
marker approach): no storage, records are built in memory.

What is pinned down here:
  * maxReadPosition (inclusive, -1 for nothing) is the offset just before the first message of the
    earliest transaction still ongoing, else the log's last offset;
  * aborted data is hidden, committed data is shown, markers are never returned, a repeated or
    contradicting marker never changes an outcome, a transaction's data after its own marker (a
    straggler) is never visible, and a commit marker that lists entries shows only those;
  * TC decisions for transactions whose marker is not written yet (``Decision``) stop them from
    blocking maxReadPosition and decide their visibility;
  * folding in chunks equals folding at once (what snapshot + tail relies on), and a snapshot's
    table form round-trips.
"""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsartx.buffer import state as state_mod
from pulsartx.buffer.snapshot import state_to_table, table_to_state
from pulsartx.buffer.state import BufferState, Decision, VisibilityFilter, key_txn, txn_key
from pulsartx.log.schema import MARKER_ENTRIES

T1, T2, T3 = (1, 7), (2, 7), (1, 8)  # (TC id, counter): T1 and T2 share a counter, not a TC
K1, K2, K3 = (txn_key(*t) for t in (T1, T2, T3))


def P(value: str) -> tuple:
    """A plain (non-transactional) message."""
    return ("DATA", value, None, None)


def D(value: str, txn: tuple[int, int]) -> tuple:
    """A message of transaction ``txn``."""
    return ("DATA", value, txn, None)


def C(txn: tuple[int, int], entries: list[tuple[int, int]] | None = None) -> tuple:
    return ("TXN_COMMIT", None, txn, entries)


def A(txn: tuple[int, int]) -> tuple:
    return ("TXN_ABORT", None, txn, None)


def records(spec: list[tuple], start: int = 0) -> pa.Table:
    """Rows with dense offsets from ``start``, in the columns the fold and the filter use."""
    n = len(spec)
    return pa.table({
        "offset": pa.array(range(start, start + n), pa.int64()),
        "type": pa.array([s[0] for s in spec], pa.string()),
        "value": pa.array([s[1].encode() if s[1] is not None else b"" for s in spec], pa.binary()),
        "txn_most_bits": pa.array([s[2][0] if s[2] else None for s in spec], pa.int64()),
        "txn_least_bits": pa.array([s[2][1] if s[2] else None for s in spec], pa.int64()),
        "marker_entries": pa.array([None if s[3] is None else [{"first_offset": a, "last_offset": b} for a, b in s[3]]
                                    for s in spec], MARKER_ENTRIES),
    })


def fold(spec: list[tuple]) -> tuple[BufferState, pa.Table]:
    t = records(spec)
    return BufferState().fold(t), t


def visible(f: VisibilityFilter, table: pa.Table) -> list[str]:
    """What READ_COMMITTED returns: the filter applied to the rows below its read limit."""
    bounded = table.filter(pa.compute.less(table.column("offset"), f.read_limit))
    return [v.decode() for v in f.apply(bounded).column("value").to_pylist()]


def uncommitted(table: pa.Table) -> list[str]:
    return [r["value"].decode() for r in table.to_pylist() if r["type"] == "DATA"]


# ---- keys ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("most,least", [(0, 0), (1, 7), (4095, 2**40 - 1), (15, 123456789)])
def test_txn_key_round_trips(most, least):
    assert key_txn(txn_key(most, least)) == (most, least)


def test_txn_keys_of_different_tcs_differ():
    assert len({K1, K2, K3}) == 3


# ---- maxReadPosition -------------------------------------------------------------------------------------


def test_empty_partition_reads_nothing():
    s = BufferState()
    assert (s.max_read_position, s.read_limit, s.end_offset) == (-1, 0, 0)
    s.fold(records([]))
    assert (s.max_read_position, s.end_offset) == (-1, 0)


def test_plain_messages_are_all_readable():
    s, t = fold([P("a"), P("b"), P("c")])
    assert (s.max_read_position, s.read_limit, s.end_offset) == (2, 3, 3)
    assert visible(s.filter(), t) == ["a", "b", "c"]
    assert not s.ongoing and not s.ended and not s.aborted


def test_open_transaction_bounds_max_read_position_at_its_first_message():
    # Pulsar's TransactionBuffer: m1, txn m2, m3 -> maxReadPosition is m1.
    s, t = fold([P("m1"), D("m2", T1), P("m3")])
    assert s.ongoing == {K1: 1}
    assert s.max_read_position == 0
    assert visible(s.filter(), t) == ["m1"]
    assert uncommitted(t) == ["m1", "m2", "m3"]


def test_earliest_of_several_open_transactions_bounds():
    s, t = fold([P("a"), D("x1", T2), P("b"), D("y1", T1), D("x2", T2), P("c")])
    assert s.ongoing == {K2: 1, K1: 3}
    assert s.max_read_position == 0
    s.fold(records([C(T2)], start=6))
    assert s.ongoing == {K1: 3}
    assert s.max_read_position == 2
    assert visible(s.filter(), records([P("a"), D("x1", T2), P("b"), D("y1", T1), D("x2", T2), P("c"), C(T2)])) \
        == ["a", "x1", "b"]
    s.fold(records([A(T1)], start=7))
    assert not s.ongoing
    assert s.max_read_position == 7  # the last offset, a marker: readers skip it


def test_transaction_starting_at_offset_zero_reads_nothing():
    s, t = fold([D("x", T1), P("a")])
    assert s.max_read_position == -1 and s.read_limit == 0
    assert visible(s.filter(), t) == []


# ---- outcomes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("end,expected", [(C, ["m1", "m2", "m3"]), (A, ["m1", "m3"])])
def test_commit_shows_and_abort_hides(end, expected):
    s, t = fold([P("m1"), D("m2", T1), P("m3"), end(T1)])
    assert visible(s.filter(), t) == expected
    assert s.ended == {K1: 3}
    assert s.aborted == ({K1: 3} if end is A else {})
    assert uncommitted(t) == ["m1", "m2", "m3"]  # markers are never data


def test_ten_plain_ten_open_ten_plain():
    spec = [P(f"a{i}") for i in range(10)] + [D(f"t{i}", T1) for i in range(10)] + [P(f"b{i}") for i in range(10)]
    s, t = fold(spec)
    assert s.max_read_position == 9
    assert visible(s.filter(), t) == [f"a{i}" for i in range(10)]
    s.fold(records([C(T1)], start=30))
    assert visible(s.filter(), records([*spec, C(T1)])) == [r[1] for r in spec]


def test_aborted_and_committed_interleaved_keep_their_offsets():
    # Kafka's "aborted y1, y2 interleaved with committed x1, x2".
    spec = [D("x1", T1), D("y1", T2), D("x2", T1), D("y2", T2), A(T2), C(T1)]
    s, t = fold(spec)
    f = s.filter()
    bounded = f.apply(t.filter(pa.compute.less(t.column("offset"), f.read_limit)))
    assert list(zip(bounded.column("offset").to_pylist(), bounded.column("value").to_pylist(), strict=True)) \
        == [(0, b"x1"), (2, b"x2")]


def test_markers_are_never_returned():
    s, t = fold([D("x", T1), C(T1), D("y", T2), A(T2), P("p")])
    out = s.filter().apply(t)
    assert out.column("type").to_pylist() == ["DATA", "DATA"]
    assert out.column("value").to_pylist() == [b"x", b"p"]


def test_repeated_or_contradicting_marker_changes_nothing():
    s, t = fold([D("x", T1), C(T1), C(T1), A(T1), D("y", T2), A(T2), C(T2), A(T2)])
    assert s.ended == {K1: 1, K2: 5}
    assert s.aborted == {K2: 5}
    assert s.markers_since_snapshot == 2
    assert visible(s.filter(), t) == ["x"]


def test_straggler_after_its_marker_is_never_visible():
    s, t = fold([D("x1", T1), C(T1), D("late", T1), P("p")])
    assert not s.ongoing  # a straggler does not reopen the transaction
    assert s.max_read_position == 3
    assert visible(s.filter(), t) == ["x1", "p"]


def test_commit_marker_entries_limit_what_is_visible():
    # Entries (0, 0) and (2, 2): the message at 1 was written by the transaction but not listed.
    s, t = fold([D("x0", T1), D("x1", T1), D("x2", T1), C(T1, [(0, 0), (2, 2)])])
    assert s.ranges == {K1: [(0, 0), (2, 2)]}
    assert visible(s.filter(), t) == ["x0", "x2"]


def test_commit_marker_with_no_entries_shows_nothing_even_after_a_snapshot():
    # A commit whose entries list nothing in this partition (e.g. only a failed task attempt wrote
    # here) shows none of the transaction's messages, also once the state went through a snapshot.
    s, t = fold([D("x0", T1), P("p"), C(T1, [])])
    assert s.ranges == {K1: []}
    assert visible(s.filter(), t) == ["p"]
    restored = table_to_state(state_to_table(s))
    assert restored.ranges == {K1: []}
    assert visible(restored.filter(), t) == ["p"]


def test_transactions_of_different_tcs_with_the_same_counter_are_distinct():
    s, t = fold([D("a", T1), D("b", T2), A(T2), C(T1)])
    assert visible(s.filter(), t) == ["a"]


# ---- TC decisions (markers not written yet) ------------------------------------------------------------


def test_decided_commit_no_longer_blocks_and_is_visible():
    s, t = fold([P("p0"), D("x", T1), D("y", T2), P("p1")])
    assert visible(s.filter(), t) == ["p0"]
    f = s.filter({K1: Decision(True)})
    assert f.decided_commits == frozenset({K1})
    assert f.read_limit == 2  # T2 is still undecided
    assert visible(f, t) == ["p0", "x"]
    f = s.filter({K1: Decision(True), K2: Decision(False)})
    assert f.read_limit == s.end_offset
    assert visible(f, t) == ["p0", "x", "p1"]


def test_decided_commit_with_entries_limits_visibility():
    s, t = fold([D("x0", T1), D("x1", T1), P("p")])
    assert visible(s.filter({K1: Decision(True, ((1, 1),))}), t) == ["x1", "p"]


@pytest.mark.parametrize("ranges,expected", [(None, ["x0", "x1", "p"]), (((1, 1),), ["x1", "p"]), ((), ["p"])])
def test_reader_keeps_decisions_between_tc_checks(ranges, expected):
    """``VisibilityReader._refold`` reuses the last TC decisions while the TC is not asked again:
    it must keep a decided commit's entries exactly, an empty list included."""
    from pulsartx.buffer.reads import VisibilityReader

    s, t = fold([D("x0", T1), D("x1", T1), P("p")])
    reader = object.__new__(VisibilityReader)
    reader._filter = s.filter({K1: Decision(True, ranges)})
    assert visible(reader._filter, t) == expected
    assert visible(reader._refold(s), t) == expected


def test_decisions_for_unknown_or_ended_transactions_are_ignored():
    s, t = fold([D("x", T1), A(T1), P("p")])
    f = s.filter({K1: Decision(True), K3: Decision(True)})
    assert visible(f, t) == ["p"]
    assert f.decided_commits == frozenset()


def test_filter_is_a_snapshot_of_the_state():
    s, t = fold([D("x", T1)])
    f = s.filter()
    s.fold(records([A(T1)], start=1))
    assert f.aborted == {} and f.read_limit == 0
    assert s.filter().aborted == {K1: 1}


# ---- bounded memory ------------------------------------------------------------------------------------


def test_trim_below_forgets_transactions_retention_removed():
    s, _ = fold([D("x", T1), A(T1), D("y", T2), C(T2, [(2, 2)]), D("z", T3), C(T3)])
    assert s.trim_below(4) == 2
    assert s.ended == {K3: 5} and s.aborted == {} and s.ranges == {}


def test_ended_set_is_bounded_but_keeps_aborted_and_ranged(monkeypatch):
    """A state nobody settles through the TCs forgets plain commits past MAX_REMEMBERED."""
    monkeypatch.setattr(state_mod, "MAX_ENDED", 4)
    monkeypatch.setattr(state_mod, "MAX_REMEMBERED", 4)
    spec = []
    for i in range(10):
        t = (1, i)
        spec += [D(f"v{i}", t), A(t) if i == 1 else C(t, [(2 * i, 2 * i)]) if i == 2 else C(t)]
    s, t = fold(spec)
    assert txn_key(1, 1) in s.ended and txn_key(1, 2) in s.ended  # aborted and ranged survive
    assert len(s.ended) <= 6
    assert txn_key(1, 9) in s.ended
    assert visible(s.filter(), t) == [f"v{i}" for i in range(10) if i != 1]


# ---- incremental folding and snapshots -------------------------------------------------------------------


def random_log(draw) -> list[tuple]:
    """A random partition history: plain messages, transactions (some listing entries, some with
    repeated markers or stragglers)."""
    n_txns = draw(st.integers(0, 4))
    ops = draw(st.lists(st.tuples(st.sampled_from(["p", "d", "c", "a", "ce"]), st.integers(0, max(n_txns - 1, 0))),
                        max_size=30))
    spec: list[tuple] = []
    for op, i in ops:
        txn = (i % 2, 100 + i)
        if op == "p" or n_txns == 0:
            spec.append(P(f"p{len(spec)}"))
        elif op == "d":
            spec.append(D(f"d{len(spec)}", txn))
        elif op == "c":
            spec.append(C(txn))
        elif op == "a":
            spec.append(A(txn))
        else:
            own = [o for o, r in enumerate(spec) if r[0] == "DATA" and r[2] == txn]
            spec.append(C(txn, [(o, o) for o in own[::2]]))
    return spec


@st.composite
def logs_and_cuts(draw):
    spec = random_log(draw)
    cuts = sorted(draw(st.lists(st.integers(0, len(spec)), max_size=4)))
    return spec, cuts


def model_visible(spec: list[tuple]) -> list[str]:
    """READ_COMMITTED straight from the definition, independent of the fold."""
    outcome: dict = {}
    first: dict = {}
    for o, (typ, _v, txn, entries) in enumerate(spec):
        if txn is None:
            continue
        if typ == "DATA":
            first.setdefault(txn, o)
        elif txn not in outcome:
            outcome[txn] = (typ, o, entries)
    open_firsts = [o for txn, o in first.items() if txn not in outcome]
    limit = min(open_firsts) if open_firsts else len(spec)
    out = []
    for o, (typ, v, txn, _e) in enumerate(spec[:limit]):
        if typ != "DATA":
            continue
        if txn is not None:
            kind, at, entries = outcome[txn]
            if kind == "TXN_ABORT" or o > at or (entries is not None and not any(a <= o <= b for a, b in entries)):
                continue
        out.append(v)
    return out


@settings(max_examples=200, deadline=None)
@given(logs_and_cuts())
def test_chunked_fold_equals_whole_fold_and_the_model(arg):
    spec, cuts = arg
    whole, t = fold(spec)
    chunked = BufferState()
    bounds = [0, *cuts, len(spec)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        chunked.fold(records(spec[lo:hi], start=lo))
    for attr in ("end_offset", "ongoing", "aborted", "ended", "ranges", "markers_since_snapshot"):
        assert getattr(chunked, attr) == getattr(whole, attr), attr
    assert visible(whole.filter(), t) == model_visible(spec)


@settings(max_examples=100, deadline=None)
@given(logs_and_cuts())
def test_snapshot_table_round_trips_and_resumes(arg):
    spec, cuts = arg
    cut = cuts[0] if cuts else len(spec) // 2
    head = BufferState().fold(records(spec[:cut]))
    restored = table_to_state(state_to_table(head))
    for attr in ("end_offset", "ongoing", "aborted", "ended", "ranges"):
        assert getattr(restored, attr) == getattr(head, attr), attr
    assert restored.snapshot_offset == head.end_offset
    restored.fold(records(spec[cut:], start=cut))
    whole, t = fold(spec)
    for attr in ("end_offset", "ongoing", "aborted", "ended", "ranges"):
        assert getattr(restored, attr) == getattr(whole, attr), attr
    assert visible(restored.filter(), t) == visible(whole.filter(), t)


def test_only_overdue_plain_commits_confirmed_finished_are_forgotten(monkeypatch):
    """Past the MAX_ENDED latest plain commits, one is forgotten only once its TC confirmed it
    finished: a straggler of one still COMMITTING stays a straggler, which its TC could not tell."""
    monkeypatch.setattr(state_mod, "MAX_ENDED", 2)
    spec = []
    for i in range(6):
        spec += [D(f"v{i}", (1, i)), A((1, i)) if i == 1 else C((1, i))]
    s, _ = fold(spec)
    keys = [txn_key(1, i) for i in range(6)]
    assert list(s.plain_ended) == [keys[i] for i in (0, 2, 3, 4, 5)]  # all kept by the fold
    assert s.overdue() == [keys[0], keys[2], keys[3]] and s.forget_due
    assert s.forget([keys[0], keys[1], keys[3], keys[5]]) == 2  # keys[2] still COMMITTING; 5 not overdue
    assert list(s.plain_ended) == [keys[2], keys[4], keys[5]]
    assert set(s.ended) == {keys[1], keys[2], keys[4], keys[5]} and s.aborted == {keys[1]: 3}
    s.fold(records([D("late", (1, 2)), D("late", (1, 3))], start=12))
    assert s.stragglers == [(12, 12)]  # keys[2]'s, known by its marker
    assert s.ongoing == {keys[3]: 13}  # keys[3]'s looks new: its TC tells (reads.settle)
    s.settle_stragglers([keys[3]], [13])
    assert (s.ongoing, s.last_data.get(keys[3]), s.stragglers, s.read_limit) == ({}, None, [(12, 13)], 14)
