"""The vectorised fold, READ_COMMITTED filter and producer dedup equal their per-row definitions.

``BufferState.fold``, ``VisibilityFilter.apply`` and ``new_message_keep`` work on
whole columns (numpy / pyarrow.compute) because they run over every record a reader or an append
touches. The per-row versions below are the definitions they replaced, kept as the reference: on
random logs (many transactions of several TCs, repeated and contradicting markers, stragglers,
entry lists that overlap, are empty or inverted, folds in random chunks on top of a random prior
state) both must agree on every field, including the order of ``plain_ended``, which decides what
the bounded ended set forgets.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsartx.buffer.state import (
    MAX_SLICED_RUNS,
    BufferState,
    Cut,
    VisibilityFilter,
    _merged,
    keep_rows,
    txn_key,
    txn_key_column,
)
from pulsartx.log.dedup import new_message_keep, new_message_mask
from pulsartx.log.schema import MARKER_ENTRIES, MessageType

# ---- the per-row definitions -------------------------------------------------------------------------


def fold_rows(s: BufferState, records: pa.Table) -> BufferState:
    """BufferState.fold as first written: one Python step per transactional row."""
    if records.num_rows == 0:
        return s
    txn_rows = records.filter(pc.is_valid(records.column("txn_most_bits")))
    if txn_rows.num_rows:
        keys = txn_key_column(txn_rows).to_pylist()
        types = txn_rows.column("type").to_pylist()
        offs = txn_rows.column("offset").to_pylist()
        entries = txn_rows.column("marker_entries").to_pylist()
        for k, t, o, e in zip(keys, types, offs, entries, strict=True):
            if t == MessageType.DATA.value:
                if k in s.ended:
                    s.add_stragglers([(o, o)])
                    continue
                if k not in s.ongoing:
                    s.ongoing[k] = o
                s.last_data[k] = o
            else:
                s.ongoing.pop(k, None)
                if k in s.ended:
                    continue
                s.ended[k] = o
                s.markers_since_snapshot += 1
                if t == MessageType.TXN_ABORT.value:
                    s.aborted[k] = o
                elif e is not None:
                    s.ranges[k] = [(r["first_offset"], r["last_offset"]) for r in e]
                else:
                    s.plain_ended.append(k)
        s._trim()
    s.end_offset = int(pc.max(records.column("offset")).as_py()) + 1
    return s


def straggler_and_range_mask_rows(f: VisibilityFilter, data: pa.Table, keys: pa.Array, mask: pa.Array) -> list:
    """The per-row straggler and entry-list check apply() used."""
    offs = data.column("offset").to_pylist()
    ks = keys.to_pylist()
    m = mask.to_pylist()
    for i, (k, o) in enumerate(zip(ks, offs, strict=True)):
        if k is None or not m[i]:
            continue
        end = f.ended.get(k)
        if end is not None and o > end:
            m[i] = False
            continue
        rs = f.ranges.get(k)
        if rs is not None and not any(a <= o <= b for a, b in rs):
            m[i] = False
    return m


def apply_rows(f: VisibilityFilter, table: pa.Table) -> pa.Table:
    """VisibilityFilter.apply as first written: filter DATA rows, then mask them step by step."""
    data = table.filter(pc.equal(table.column("type"), MessageType.DATA.value))
    if f.min_offset > 0:
        data = data.filter(pc.greater_equal(data.column("offset"), f.min_offset))
    if data.num_rows == 0 or data.column("txn_most_bits").null_count == data.num_rows:
        return data
    keys = txn_key_column(data)
    mask = pc.or_kleene(pc.is_null(keys), pc.invert(pc.is_in(keys, value_set=pa.array(list(f.aborted), pa.int64()))))
    if f.cut is not None:
        mask = pc.and_kleene(mask, f.cut.mask(keys))
    mask = pa.array(straggler_and_range_mask_rows(f, data, keys, mask), pa.bool_())
    return data.filter(pc.fill_null(mask, True))


def new_message_mask_rows(seqs: list[int], last: int | None) -> list[bool]:
    high = -1 if last is None else last
    keep = []
    for seq in seqs:
        keep.append(seq > high)
        high = max(high, seq)
    return keep


# ---- random logs ---------------------------------------------------------------------------------------

TXNS = [(tc, 100 + i) for tc in (0, 1, 3) for i in range(4)]


@st.composite
def logs(draw) -> list[tuple]:
    """(type, txn or None, entries) rows; offsets are the row indexes."""
    rows: list[tuple] = []
    for _ in range(draw(st.integers(0, 80))):
        op = draw(st.sampled_from(["p", "d", "d", "d", "c", "a", "ce"]))
        txn = draw(st.sampled_from(TXNS))
        if op == "p":
            rows.append(("DATA", None, None))
        elif op == "d":
            rows.append(("DATA", txn, None))
        elif op == "a":
            rows.append(("TXN_ABORT", txn, None))
        elif op == "c":
            rows.append(("TXN_COMMIT", txn, None))
        else:
            n = len(rows) + 1
            entries = draw(st.lists(st.tuples(st.integers(0, n), st.integers(0, n)), max_size=4))
            rows.append(("TXN_COMMIT", txn, entries))
    return rows


def table(rows: list[tuple], start: int = 0, chunks: int = 1) -> pa.Table:
    n = len(rows)
    t = pa.table({
        "offset": pa.array(range(start, start + n), pa.int64()),
        "type": pa.array([r[0] for r in rows], pa.string()),
        "value": pa.array([f"v{start + i}".encode() for i in range(n)], pa.binary()),
        "txn_most_bits": pa.array([r[1][0] if r[1] else None for r in rows], pa.int64()),
        "txn_least_bits": pa.array([r[1][1] if r[1] else None for r in rows], pa.int64()),
        "marker_entries": pa.array([None if r[2] is None else [{"first_offset": a, "last_offset": b} for a, b in r[2]]
                                    for r in rows], MARKER_ENTRIES),
    })
    if chunks > 1 and n > 1:  # several chunks, as a dataset read of several files returns
        step = max(1, n // chunks)
        t = pa.concat_tables([t.slice(i, step) for i in range(0, n, step)])
    return t


def fields(s: BufferState) -> dict:
    return {"end_offset": s.end_offset, "ongoing": s.ongoing, "aborted": s.aborted, "ended": s.ended,
            "ranges": s.ranges, "last_data": s.last_data, "markers": s.markers_since_snapshot,
            "plain_ended": list(s.plain_ended), "stragglers": s.stragglers}


@settings(max_examples=120, deadline=None)
@given(logs(), st.lists(st.integers(0, 80), max_size=5), st.integers(1, 3), st.integers(1, 6))
def test_vectorised_fold_equals_per_row_fold(rows, cuts, chunks, max_ended):
    import pulsartx.buffer.state as state_mod

    saved = state_mod.MAX_ENDED, state_mod.MAX_REMEMBERED
    state_mod.MAX_ENDED = state_mod.MAX_REMEMBERED = max_ended  # small, so trimming the ended set happens too
    try:
        fast, ref = BufferState(), BufferState()
        bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            t = table(rows[lo:hi], start=lo, chunks=chunks)
            fast.fold(t)
            fold_rows(ref, t)
            assert fields(fast) == fields(ref)
    finally:
        state_mod.MAX_ENDED, state_mod.MAX_REMEMBERED = saved


@settings(max_examples=120, deadline=None)
@given(logs(), st.integers(0, 80), st.integers(1, 3), st.data())
def test_vectorised_filter_equals_per_row_filter(rows, cut, chunks, data):
    f, t, bounded = fold_and_compare(rows, cut, chunks)
    # With a retention horizon and a cut across partitions.
    g = dataclasses.replace(f, cut=drawn_cut(f, data), min_offset=data.draw(st.integers(0, 10)))
    assert g.apply(bounded).column("offset").to_pylist() == apply_rows(g, bounded).column("offset").to_pylist()


def fold_and_compare(rows: list[tuple], cut: int, chunks: int):
    """Fold the first ``cut`` rows, and check the filter against the per-row definition below the
    read limit (what readers pass) and over the whole log (stragglers, unfolded markers)."""
    cut = min(cut, len(rows))
    s = BufferState().fold(table(rows[:cut]))
    t = table(rows, chunks=chunks)
    f = s.filter()
    bounded = t.filter(pc.less(t.column("offset"), f.read_limit))
    assert f.apply(bounded).column("offset").to_pylist() == apply_rows(f, bounded).column("offset").to_pylist()
    assert f.apply(t).column("offset").to_pylist() == apply_rows(f, t).column("offset").to_pylist()
    return f, t, bounded


def drawn_cut(f, data) -> Cut:
    """A consistent cut across partitions that shows a drawn part of the transactions ``f`` knows ended."""
    visible = frozenset(k for k in f.ended if data.draw(st.booleans()))
    return Cut(visible, frozenset(f.ended.keys() - visible), {0: 101, 1: 102, 3: 100})


@st.composite
def run_logs(draw) -> list[tuple]:
    """Like :func:`logs`, but a transaction's data comes in runs (as it does in a Spark job's
    files), and entry lists and markers cut into runs, so runs wholly visible, wholly hidden and
    cut in two all occur."""
    rows: list[tuple] = []
    runs: dict[tuple, list[tuple[int, int]]] = {}
    for _ in range(draw(st.integers(0, 12))):
        op = draw(st.sampled_from(["p", "d", "d", "d", "c", "a", "ce", "ce"]))
        txn = draw(st.sampled_from(TXNS[:4] if draw(st.booleans()) else TXNS))
        if op in ("p", "d"):
            n = draw(st.integers(1, 30))
            if op == "d":
                runs.setdefault(txn, []).append((len(rows), len(rows) + n - 1))
            rows.extend([("DATA", None if op == "p" else txn, None)] * n)
        elif op == "a":
            rows.append(("TXN_ABORT", txn, None))
        elif op == "c":
            rows.append(("TXN_COMMIT", txn, None))
        else:  # entries: mostly its own runs (appends), some cut short or anywhere
            n = len(rows) + 1
            entries = [(a, b - draw(st.integers(0, 3))) for a, b in runs.get(txn, []) if draw(st.booleans())]
            entries += [(a, a + draw(st.integers(-1, 12))) for a in draw(st.lists(st.integers(0, n), max_size=2))]
            rows.append(("TXN_COMMIT", txn, entries))
    return rows


@settings(max_examples=150, deadline=None)
@given(run_logs(), st.integers(0, 400), st.integers(1, 3), st.data())
def test_filter_by_runs_equals_per_row_filter(rows, cut, chunks, data):
    """apply() decides whole runs of one transaction from their first and last offsets; on long
    runs that entry lists, markers (stragglers past them) and the read limit cut anywhere it keeps
    exactly the rows the per-row definition keeps."""
    f, t, _ = fold_and_compare(rows, cut, chunks)
    g = dataclasses.replace(f, cut=drawn_cut(f, data))
    assert g.apply(t).column("offset").to_pylist() == apply_rows(g, t).column("offset").to_pylist()


@settings(max_examples=150, deadline=None)
@given(run_logs(), st.integers(0, 400), st.data())
def test_a_span_shown_whole_is_kept_whole_by_apply(rows, cut, data):
    """shows_all(lo, hi) lets a Spark read skip the filter of a file: wherever it says yes and the
    span holds what a commit entry holds (DATA records of that one transaction), apply() keeps
    every record of the span; with a cut across partitions and a retention horizon too."""
    cut = min(cut, len(rows))
    f = BufferState().fold(table(rows[:cut])).filter()
    visible = frozenset(k for k in f.ended if data.draw(st.booleans()))
    g = dataclasses.replace(f, cut=Cut(visible, frozenset(f.ended.keys() - visible), {0: 101, 1: 102, 3: 100}),
                            min_offset=data.draw(st.integers(0, 10)))
    t = table(rows)
    for flt in (f, g):
        kept = set(flt.apply(t).column("offset").to_pylist())
        for lo in range(len(rows)):
            for hi in range(lo, min(len(rows), lo + 40)):
                span = rows[lo:hi + 1]
                covering = {k for k, rs in flt.ranges.items() if any(a <= lo and hi <= b for a, b in _merged(rs))}
                one_append = (span[0][1] is not None and covering == {txn_key(*span[0][1])}
                              and all(r[0] == "DATA" and r[1] == span[0][1] for r in span))
                if one_append and flt.shows_all(lo, hi):
                    assert set(range(lo, hi + 1)) <= kept
    assert not f.shows_all(0, len(rows) + 5) and not f.shows_all(3, 2)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(TXNS + [(0, 200), (5, 1)]), max_size=10), st.data())
def test_cut_shows_one_key_as_its_mask_does(keys, data):
    ks = [txn_key(*t) for t in keys]
    visible = frozenset(k for k in ks if data.draw(st.booleans()))
    invisible = frozenset(k for k in ks if k not in visible and data.draw(st.booleans()))
    cut = Cut(visible, invisible, {0: 101, 1: 102, 3: 100})
    assert [cut.shows(k) for k in ks] == cut.mask(pa.array(ks, pa.int64())).to_pylist()


def test_a_span_is_shown_whole_only_inside_one_shown_entry():
    """Rows 0-9 one append of a (listed), 10-14 an unlisted attempt of a, marker at 15; b's append
    16-20, committed at 21 without entries."""
    a, b = TXNS[0], TXNS[1]
    ka = txn_key(*a)
    rows = [("DATA", a, None)] * 15 + [("TXN_COMMIT", a, [(0, 9)])] + [("DATA", b, None)] * 5
    rows += [("TXN_COMMIT", b, None)]
    f = BufferState().fold(table(rows)).filter()
    assert f.shows_all(0, 9) and f.shows_all(2, 5)
    assert not f.shows_all(0, 10) and not f.shows_all(10, 14) and not f.shows_all(16, 20)  # unlisted; no entries
    assert not dataclasses.replace(f, min_offset=3).shows_all(0, 9)
    assert dataclasses.replace(f, min_offset=3).shows_all(3, 9)
    assert not dataclasses.replace(f, stragglers=((4, 4),)).shows_all(0, 9)
    assert not dataclasses.replace(f, read_limit=9).shows_all(0, 9)
    assert not dataclasses.replace(f, ended={**f.ended, ka: 5}).shows_all(0, 9)
    assert not dataclasses.replace(f, cut=Cut(frozenset(), frozenset({ka}), {0: 1000})).shows_all(0, 9)
    assert dataclasses.replace(f, cut=Cut(frozenset({ka}), frozenset(), {0: 0})).shows_all(0, 9)
    assert f.apply(table(rows)).column("offset").to_pylist() == [*range(10), *range(16, 21)]


def test_a_file_is_read_unfiltered_only_when_its_statistics_show_the_entry_s_transaction_alone():
    """A commit entry decides for a file's span only when the file's txn_most_bits statistics show
    that every row carries the transaction's most bits: a file holding another TC's rows, rows
    without a TxnID, or no statistics at all is filtered."""
    from datasource.visibility import READ_COMMITTED, Visibility
    from pulsartx.log.index import DataFile

    a = TXNS[4]  # TC 1
    rows = [("DATA", a, None)] * 10 + [("TXN_COMMIT", a, [(0, 9)])]
    vis = Visibility(READ_COMMITTED, BufferState().fold(table(rows)).filter())

    def file(most_min, most_max, nulls):
        return DataFile(0, 9, "f", 100, 10, txn_most_min=most_min, txn_most_max=most_max, txn_most_nulls=nulls)

    assert vis.shows_file(file(a[0], a[0], 0), 0, 11)
    other = TXNS[8][0]
    for f in (file(a[0], other, 0), file(other, other, 0), file(a[0], a[0], 1), file(None, None, None),
              file(a[0], a[0], None)):
        assert not vis.shows_file(f, 0, 11), f


def shows_all_per_transaction(f: VisibilityFilter, lo: int, hi: int) -> bool:
    """shows_all's definition: the first transaction (in listing order) with an entry holding
    ``lo..hi`` decides."""
    if lo > hi or lo < f.min_offset or hi >= f.read_limit:
        return False
    if any(a <= hi and b >= lo for a, b in f.stragglers):
        return False
    for k, rs in f.ranges.items():
        if any(a <= lo and hi <= b for a, b in _merged(rs)):
            return k not in f.aborted and hi <= f.ended.get(k, hi) and (f.cut is None or f.cut.shows(k))
    return False


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_shows_all_searching_one_sorted_entry_list_equals_the_per_transaction_loop(data):
    """shows_all bisects one sorted list of every transaction's merged entries, built once per
    filter (and rebuilt after pickling); it must decide as the per-transaction loop, disjoint
    entries or overlapping ones."""
    import pickle

    keys = data.draw(st.lists(st.integers(0, 12), min_size=0, max_size=6, unique=True))
    span = st.tuples(st.integers(0, 40), st.integers(0, 40))
    ranges = {k: data.draw(st.lists(span, min_size=1, max_size=4)) for k in keys}
    f = VisibilityFilter(
        data.draw(st.integers(0, 45)), {k: 40 for k in keys if data.draw(st.booleans())},
        {k: data.draw(st.integers(0, 40)) for k in keys if data.draw(st.booleans())}, ranges,
        cut=Cut(frozenset(k for k in keys if data.draw(st.booleans())), frozenset(), {0: -1})
        if data.draw(st.booleans()) else None,
        min_offset=data.draw(st.integers(0, 5)), stragglers=tuple(data.draw(st.lists(span, max_size=2))))
    spans = [(lo, hi) for lo in range(-1, 43, 3) for hi in range(lo - 1, 43, 2)]
    expected = [shows_all_per_transaction(f, lo, hi) for lo, hi in spans]
    assert [f.shows_all(lo, hi) for lo, hi in spans] == expected
    shipped = pickle.loads(pickle.dumps(f))
    assert "_entries" not in shipped.__dict__ and shipped == f
    assert [shipped.shows_all(lo, hi) for lo, hi in spans] == expected


def test_filter_cuts_a_run_at_its_entry_list_and_at_its_marker():
    """One transaction's run cut by its entry list (rows 5-9 of 0-19 listed), and a run that goes on
    past its own marker (the rows after it are stragglers): only the listed rows, and the rows
    before the marker, are shown."""
    a, b = TXNS[0], TXNS[1]
    rows = [("DATA", a, None)] * 20 + [("TXN_COMMIT", a, [(5, 9)])] + [("DATA", b, None)] * 5
    rows += [("TXN_COMMIT", b, None)] + [("DATA", b, None)] * 5  # 27-31 past its marker at 26
    f = BufferState().fold(table(rows)).filter()
    t = table(rows)
    assert f.apply(t).column("offset").to_pylist() == [5, 6, 7, 8, 9, 21, 22, 23, 24, 25]
    assert f.apply(t).column("offset").to_pylist() == apply_rows(f, t).column("offset").to_pylist()


def test_filter_drops_stragglers_and_out_of_range_rows_of_a_large_read():
    """A concrete large case: 100k rows of three transactions (one ranged, one with stragglers)
    in runs of 7, one aborted, plus plain rows."""
    k1, k2, k3, k4 = txn_key(1, 1), txn_key(1, 2), txn_key(2, 1), txn_key(2, 2)
    n = 100_000
    offs = np.arange(n, dtype=np.int64)
    which = (offs // 7) % 5
    most = np.select([which == 0, which == 1, which == 2, which == 3], [1, 1, 2, 2], 0)
    least = np.select([which == 0, which == 1, which == 2, which == 3], [1, 2, 1, 2], 0)
    t = pa.table({"offset": offs, "type": pa.array(["DATA"] * n),
                  "txn_most_bits": pa.array(most, mask=which == 4), "txn_least_bits": pa.array(least, mask=which == 4)})
    f = VisibilityFilter(n, {k4: n}, {k1: 50_000, k2: n, k3: n, k4: n}, {k2: [(10, 19), (15, 30), (90_000, 90_009)]})
    got = np.array(f.apply(t).column("offset").to_pylist())
    want = offs[np.select([which == 0, which == 1, which == 2, which == 3],
                          [offs <= 50_000, ((offs >= 10) & (offs <= 30)) | ((offs >= 90_000) & (offs <= 90_009)),
                           True, False], True)]
    assert got.tolist() == want.tolist()
    assert len(got) and got.tolist() == apply_rows(f, t).column("offset").to_pylist()


@settings(max_examples=120, deadline=None)
@given(st.lists(st.integers(-5, 40), max_size=50), st.one_of(st.none(), st.integers(-5, 40)))
def test_vectorised_dedup_equals_per_row_dedup(seqs, last):
    assert new_message_mask(seqs, last) == new_message_mask_rows(seqs, last)
    assert new_message_keep(np.array(seqs, np.int64), last).tolist() == new_message_mask_rows(seqs, last)


def test_buffer_snapshots_every_n_folded_records_without_markers(client):
    """A partition without markers (plain, or one large Spark transaction) still gets snapshots, so
    a new reader folds only the tail: every Spark query plans with fresh buffers."""
    from pulsartx.buffer.buffer import TransactionBuffer
    from pulsartx.buffer.snapshot import SnapshotStore
    from pulsartx.log.partition import PartitionLog, build_records
    from pulsartx.naming import TopicName

    client.admin.create_topic("plain")
    part = TopicName.parse("plain-partition-0")
    plog = PartitionLog(client.root, part)
    for i in range(3):
        plog.append(build_records([b"x"] * 40, producer_name="p", sequence_ids=list(range(40 * i, 40 * i + 40))),
                    producer_name="p")
        buf = TransactionBuffer(PartitionLog(client.root, part), snapshot_every_records=100)
        buf.state()
        buf.wait_for_snapshot()  # written in the background
    assert SnapshotStore(client.root, part).load().end_offset == 120  # not at 40 or 80: below 100 records
    reads = []
    fresh = PartitionLog(client.root, part)
    orig = fresh.read
    fresh.read = lambda start, stop, columns=None, **kw: reads.append((start, stop)) or orig(start, stop, columns, **kw)
    plog.append(build_records([b"y"] * 5, producer_name="p", sequence_ids=list(range(120, 125))), producer_name="p")
    s = TransactionBuffer(fresh, snapshot_every_records=100).state()
    assert (reads, s.end_offset, s.snapshot_offset) == ([(120, 125)], 125, 120)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.booleans(), max_size=300), st.integers(0, 3), st.sampled_from([0, 1, 4]))
def test_keep_rows_equals_filter(keep, split, run):
    """Slicing out runs of kept rows (or filtering, past MAX_SLICED_RUNS runs) keeps exactly the
    rows, in order, that Table.filter keeps, whatever the table's chunking."""
    keep = [k for k in keep for _ in range(max(1, run))]
    n = len(keep)
    t = pa.table({"offset": pa.array(range(n), pa.int64()), "value": pa.array([b"v%d" % i for i in range(n)])})
    if split and n:
        t = pa.concat_tables([t.slice(0, n // (split + 1)), t.slice(n // (split + 1))])
    mask = np.array(keep, dtype=bool)
    expected = t.filter(pa.array(mask, pa.bool_())).to_pydict()
    assert keep_rows(t, mask).to_pydict() == expected
    assert keep_rows(t, pa.array(mask, pa.bool_())).to_pydict() == expected


def test_keep_rows_slices_without_copying_payloads():
    values = pa.array([b"x" * 100] * 10_000)
    t = pa.table({"value": values})
    keep = np.ones(10_000, dtype=bool)
    keep[[0, 5_000, 9_999]] = False  # three dropped rows (markers): four runs, sliced
    out = keep_rows(t, keep)
    assert out.num_rows == 9_997
    base = values.buffers()[2].address
    assert all(c.buffers()[2].address == base for c in out.column("value").chunks)
    many = np.arange(10_000) % 3 != 0  # more runs than MAX_SLICED_RUNS: one filter
    assert keep_rows(t, many).num_rows == int(many.sum()) and MAX_SLICED_RUNS < 3_000
