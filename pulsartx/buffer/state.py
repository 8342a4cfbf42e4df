"""The transaction buffer's state as a pure fold over a partition's records (PIP-31 marker
approach, as Pulsar shipped it: maxReadPosition plus an aborted-transaction set).

Folding a record batch in offset order maintains:
  * ``ongoing``: transactions with data in the partition and no marker yet, with their first offset;
  * ``aborted``: transactions whose TXN_ABORT marker is in the partition (offset of the marker);
  * ``ended``: every transaction whose marker was seen (commit or abort), with the marker offset:
    data of a transaction after its own marker (a straggler) is never visible. Plain commits are
    forgotten only once their TC confirms them finished (:meth:`BufferState.forget`), so a straggler
    met later is told apart from new data through the TC (``reads.settle``);
  * ``ranges``: for commit markers that list their entries, the exact visible offset ranges;
  * ``stragglers``: offset ranges of data written after its own transaction's marker, recorded
    when folded (while the marker is known), so they stay hidden after the bounded ended set
    forgets the transaction.
maxReadPosition is the offset just before the first message of the earliest ongoing transaction,
or the last offset of the log when none is ongoing.
"""
from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pulsartx.log.schema import MessageType

# Transactions are keyed as one int64 so visibility filters vectorise: TC id in the high bits.
TC_SHIFT = 40
# Committed transactions without entry lists are remembered only to drop their stragglers (data
# written after their own marker, e.g. by a zombie producer); the most recent ones cover that, and
# keeping all of them would make snapshots, and so rebuilding the state, grow with history. Older
# ones are forgotten once their TC confirms them finished (COMMITTED, or trimmed from its log): a
# straggler of one is then known for one by its TC. One still COMMITTING is kept, as its TC cannot
# tell its straggler from data its commit covers (docs/design/forgetting-finished-transactions.md).
MAX_ENDED = 1000
# A state that no TC-aware reader settles (nothing but folds) still forgets past this many.
MAX_REMEMBERED = 10_000


def txn_key(most: int, least: int) -> int:
    return (most << TC_SHIFT) | least


def key_txn(key: int) -> tuple[int, int]:
    return key >> TC_SHIFT, key & ((1 << TC_SHIFT) - 1)


def txn_key_column(table: pa.Table) -> pa.Array:
    most = table.column("txn_most_bits").cast(pa.int64())
    least = table.column("txn_least_bits").cast(pa.int64())
    return pc.add(pc.shift_left(most, TC_SHIFT), least)


FOLD_COLUMNS = ["offset", "type", "txn_most_bits", "txn_least_bits", "marker_entries"]


def _int64s(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A null-free int64 column as numpy (zero-copy when it is one chunk)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _bools(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col.to_numpy(zero_copy_only=False).astype(bool, copy=False)


# Up to this many runs of kept rows, a filter is done by slicing (zero-copy) instead of copying.
MAX_SLICED_RUNS = 64


def keep_rows(table: pa.Table, keep: np.ndarray | pa.Array | pa.ChunkedArray) -> pa.Table:
    """``table`` reduced to the rows where ``keep`` is true.

    The rows a reader drops come in runs (a marker row, an aborted transaction's entry), so the
    kept rows are usually a few long runs: those are sliced out without copying, where
    ``Table.filter`` would copy every payload byte of the read."""
    if not isinstance(keep, np.ndarray):
        keep = _bools(keep)
    if keep.all():
        return table
    edges = np.flatnonzero(np.diff(np.concatenate(([False], keep, [False])).astype(np.int8)))
    if len(edges) // 2 > MAX_SLICED_RUNS:
        return table.filter(pa.array(keep))
    starts, ends = edges[0::2], edges[1::2]
    if not len(starts):
        return table.slice(0, 0)
    return pa.concat_tables([table.slice(int(a), int(b - a)) for a, b in zip(starts, ends, strict=True)])


@dataclass
class BufferState:
    end_offset: int = 0  # next offset to fold
    ongoing: dict[int, int] = field(default_factory=dict)
    aborted: dict[int, int] = field(default_factory=dict)
    ended: dict[int, int] = field(default_factory=dict)
    ranges: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    # Last DATA offset of each transaction (before its marker): a consistent cut must not show a
    # transaction that has data past some partition's read limit.
    last_data: dict[int, int] = field(default_factory=dict)
    markers_since_snapshot: int = 0
    # Offsets below this were deleted by retention and their transactions forgotten: never shown.
    trimmed_below: int = 0
    # Plain committed transactions (neither aborted nor range-limited), oldest marker first.
    plain_ended: deque[int] = field(default_factory=deque, repr=False, compare=False)
    # Data written after its own transaction's marker: merged, sorted (first, last) offset ranges.
    stragglers: list[tuple[int, int]] = field(default_factory=list)
    snapshot_offset: int = -1

    @property
    def max_read_position(self) -> int:
        """Last offset a READ_COMMITTED reader may see (inclusive); -1 for nothing."""
        if self.ongoing:
            return min(self.ongoing.values()) - 1
        return self.end_offset - 1

    @property
    def read_limit(self) -> int:
        return self.max_read_position + 1

    def fold(self, records: pa.Table) -> BufferState:
        """Advance over ``records`` (offsets ``end_offset`` onwards, in order). Only rows that carry
        a transaction matter; plain rows just move the end.

        Vectorised, yet equal to folding row by row (the definition, kept in tests/test_buffer_vectorised.py): per
        transaction, what a batch changes depends only on its rows before its first marker in the
        batch, so data rows are reduced per transaction with numpy and only markers, which are
        few, are walked in Python (in offset order, which the bounded ``plain_ended`` needs)."""
        if records.num_rows == 0:
            return self
        offsets = records.column("offset")
        has_txn = pc.is_valid(records.column("txn_most_bits"))
        if pc.any(has_txn).as_py():
            txn_rows = records.filter(has_txn)
            keys = _int64s(txn_key_column(txn_rows))
            offs = _int64s(txn_rows.column("offset"))
            is_data = _bools(pc.equal(txn_rows.column("type"), MessageType.DATA.value))
            # Runs of consecutive rows of one transaction and kind: a transaction's data mostly comes
            # in long runs, so everything below is per run. A run of markers acts as its first one
            # (the others repeat it), and no data run spans a marker of its own transaction.
            n = len(keys)
            brk = np.flatnonzero((keys[1:] != keys[:-1]) | (is_data[1:] != is_data[:-1])) + 1
            starts = np.concatenate(([0], brk))
            run_keys, run_data = keys[starts], is_data[starts]
            run_first, run_last = offs[starts], offs[np.concatenate((brk, [n])) - 1]
            marker_runs = np.flatnonzero(~run_data)
            first_marker: dict[int, int] = {}
            for k, o in zip(run_keys[marker_runs].tolist(), run_first[marker_runs].tolist(), strict=True):
                first_marker.setdefault(k, o)
            data_runs = np.flatnonzero(run_data)
            if len(data_runs):
                uniq, inv = np.unique(run_keys[data_runs], return_inverse=True)
                ukeys = uniq.tolist()
                big = np.iinfo(np.int64).max
                # Data counts only before the transaction's first marker here, and not at all once
                # it ended earlier (stragglers).
                cutoff = np.array([-1 if k in self.ended else first_marker.get(k, big) for k in ukeys], np.int64)
                live = run_first[data_runs] < cutoff[inv]
                if not live.all():
                    # The rows themselves: a run of one transaction's rows may span other rows' offsets.
                    late_run = np.zeros(len(starts), dtype=bool)
                    late_run[data_runs[~live]] = True
                    late = offs[np.repeat(late_run, np.diff(np.concatenate((starts, [n]))))].tolist()
                    self.add_stragglers((o, o) for o in late)
                if live.any():
                    lk = inv[live]
                    first = np.full(len(ukeys), big, np.int64)
                    last = np.full(len(ukeys), -1, np.int64)
                    np.minimum.at(first, lk, run_first[data_runs][live])
                    np.maximum.at(last, lk, run_last[data_runs][live])
                    for j in np.unique(lk).tolist():
                        k = ukeys[j]
                        if k not in self.ongoing:
                            self.ongoing[k] = int(first[j])
                        self.last_data[k] = int(last[j])
            if len(marker_runs):
                at = np.zeros(n, dtype=bool)
                at[starts[marker_runs]] = True
                markers = txn_rows.select(["type", "marker_entries"]).filter(pa.array(at))
                for k, t, o, e in zip(run_keys[marker_runs].tolist(), markers.column("type").to_pylist(),
                                      run_first[marker_runs].tolist(), markers.column("marker_entries").to_pylist(),
                                      strict=True):
                    self._end_txn(k, t, o, e)
            self._trim()
        self.end_offset = int(pc.max(offsets).as_py()) + 1
        return self

    def _end_txn(self, k: int, t: str, o: int, e: list[dict] | None) -> None:
        """One marker: the first one of a transaction decides it, later ones change nothing."""
        self.ongoing.pop(k, None)
        if k in self.ended:
            return  # a repeated marker can never change an outcome
        self.ended[k] = o
        self.markers_since_snapshot += 1
        if t == MessageType.TXN_ABORT.value:
            self.aborted[k] = o
        elif e is not None:
            self.ranges[k] = [(r["first_offset"], r["last_offset"]) for r in e]
        else:
            self.plain_ended.append(k)

    def _trim(self) -> None:
        """Keep at most MAX_REMEMBERED plain committed transactions, confirmed or not: only a state
        that nobody settles through the TCs gets there (aborted and range-limited ones are kept:
        they decide visibility of data below maxReadPosition)."""
        while len(self.plain_ended) > MAX_REMEMBERED:
            self._forget_plain(self.plain_ended.popleft())

    def _forget_plain(self, k: int) -> None:
        if k not in self.aborted and k not in self.ranges:
            self.ended.pop(k, None)
            self.last_data.pop(k, None)

    def overdue(self) -> list[int]:
        """Plain committed transactions past the MAX_ENDED most recent ones, oldest first: to be
        forgotten once their TCs confirm them finished."""
        n = len(self.plain_ended) - MAX_ENDED
        return [self.plain_ended[i] for i in range(n)] if n > 0 else []

    @property
    def forget_due(self) -> bool:
        """MAX_ENDED plain commits are overdue: worth asking their TCs (once per that many, not per read)."""
        return len(self.plain_ended) >= 2 * MAX_ENDED

    def forget(self, finished: Iterable[int]) -> int:
        """Forget the overdue plain commits among ``finished`` (their TCs logged them COMMITTED, so
        every marker is written, or trimmed them). Returns how many were forgotten."""
        done = set(finished).intersection(self.overdue())
        if done:
            self.plain_ended = deque(k for k in self.plain_ended if k not in done)
            for k in done:
                self._forget_plain(k)
        return len(done)

    def settle_stragglers(self, keys: Iterable[int], offsets: Iterable[int]) -> None:
        """``keys`` are ongoing here, yet finished for good by their TCs, with no marker here: their
        data here (at ``offsets``) came after a marker this state forgot or retention deleted, or
        lies in a partition they never registered. None of it is ever visible, so it is recorded
        as stragglers, and they stop holding maxReadPosition."""
        for k in keys:
            self.ongoing.pop(k, None)
            self.last_data.pop(k, None)
        self.add_stragglers((o, o) for o in offsets)
        self.markers_since_snapshot += 1  # worth a snapshot, as a marker is

    def rebuild_plain_ended(self) -> None:
        """After loading a snapshot: the plain committed transactions in marker order, bounded."""
        plain = [(o, k) for k, o in self.ended.items() if k not in self.aborted and k not in self.ranges]
        if any(a[0] > b[0] for a, b in zip(plain, plain[1:], strict=False)):  # a snapshot keeps marker order
            plain.sort()
        self.plain_ended = deque(k for _, k in plain)
        self._trim()

    def add_stragglers(self, runs: Iterable[tuple[int, int]]) -> None:
        """Record offset ranges of data past its own marker (kept merged and sorted)."""
        merged: list[list[int]] = []
        for a, b in sorted([*self.stragglers, *runs]):
            if merged and a <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.stragglers = [(a, b) for a, b in merged]

    def trim_below(self, start_offset: int) -> int:
        """Forget aborted/ranged transactions whose data retention removed (PIP-196's lesson: the
        aborted set must not grow forever). Returns how many entries were dropped."""
        self.trimmed_below = max(self.trimmed_below, start_offset)
        self.stragglers = [(a, b) for a, b in self.stragglers if b >= start_offset]
        drop = [k for k, m in self.ended.items() if m < start_offset]
        for k in drop:
            self.ended.pop(k, None)
            self.aborted.pop(k, None)
            self.ranges.pop(k, None)
            self.last_data.pop(k, None)
        return len(drop)

    def filter(self, decided: dict[int, Decision] | None = None) -> VisibilityFilter:
        """The READ_COMMITTED filter. ``decided``: outcomes the TC already logged for transactions
        still ongoing here (markers not written yet); they no longer block maxReadPosition."""
        if not decided:
            return VisibilityFilter(self.read_limit, dict(self.aborted), dict(self.ended), dict(self.ranges),
                                    min_offset=self.trimmed_below, stragglers=tuple(self.stragglers))
        aborted = dict(self.aborted)
        ranges = dict(self.ranges)
        ended = dict(self.ended)
        commits = set()
        for k, d in decided.items():
            if k not in self.ongoing:
                continue
            if d.commit:
                commits.add(k)
                if d.ranges is not None:
                    ranges[k] = list(d.ranges)
            else:
                aborted[k] = self.end_offset
        blocking = [o for k, o in self.ongoing.items() if k not in decided]
        limit = min(blocking) if blocking else self.end_offset
        return VisibilityFilter(limit, aborted, ended, ranges, frozenset(commits), min_offset=self.trimmed_below,
                                stragglers=tuple(self.stragglers))


@dataclass(frozen=True)
class Decision:
    """A TC outcome for a transaction whose marker a partition does not hold yet."""

    commit: bool
    ranges: tuple[tuple[int, int], ...] | None = None  # the commit's entries in this partition


@dataclass(frozen=True)
class Cut:
    """The TC state at one instant T0, which makes a read of several partitions consistent:
    a transaction is shown only if it was decided COMMIT at T0, or is older than its TC's counter
    at T0 and therefore finished before it. Everything else (decided later, created later, cut by
    some partition's read limit) is hidden in every partition alike."""

    visible: frozenset[int]
    invisible: frozenset[int]
    counters: dict[int, int]  # TC id -> last TxnID counter at T0

    def shows(self, key: int) -> bool:
        """:meth:`mask` for one transaction, without arrays (a Spark read asks it per file)."""
        if key in self.visible:
            return True
        if key in self.invisible:
            return False
        tc, least = key_txn(key)
        return least <= self.counters.get(tc, -1)

    def mask(self, keys: pa.Array) -> pa.Array:
        if not len(keys):
            return pa.array([], pa.bool_())
        valid = _bools(pc.is_valid(keys))
        k = _int64s(pc.fill_null(keys, 0))
        tc = k >> TC_SHIFT
        least = k & ((1 << TC_SHIFT) - 1)
        size = max([*self.counters.keys(), int(tc.max()) if len(tc) else 0]) + 1
        table = np.full(size, -1, dtype=np.int64)
        for t, c in self.counters.items():
            table[t] = c
        old = least <= table[tc]
        vis = np.isin(k, np.fromiter(self.visible, np.int64, len(self.visible)))
        inv = np.isin(k, np.fromiter(self.invisible, np.int64, len(self.invisible)))
        return pa.array(~valid | vis | (~inv & old), pa.bool_())


_UNBUILT = object()


@dataclass(frozen=True)
class VisibilityFilter:
    """What READ_COMMITTED may return, as a small picklable value: the Spark driver computes it once
    and ships it to executors, which then never need the partition's history."""

    read_limit: int
    aborted: dict[int, int]
    ended: dict[int, int]
    ranges: dict[int, list[tuple[int, int]]]
    # Transactions decided COMMIT in the TC whose marker is not written yet (no fractured reads).
    decided_commits: frozenset[int] = frozenset()
    cut: Cut | None = None  # set for reads of several partitions that must agree (Spark batch reads)
    # Retention horizon: rows below it belong to deleted files whose aborted transactions the state
    # no longer remembers, so a reader still holding those files must not show them.
    min_offset: int = 0
    stragglers: tuple[tuple[int, int], ...] = ()  # offsets never shown: data past its own marker

    def apply(self, table: pa.Table) -> pa.Table:
        """Keep visible DATA rows of ``table`` (already bounded by ``read_limit``).

        Executors run this over every record they read, so it works per run of rows of one
        transaction (a transaction's data comes in long runs): each distinct transaction is decided
        once, in Python, and the decisions are spread back over the rows with numpy. One filter at
        the end (every filter copies the payloads), and none when every row is visible."""
        keep = _bools(pc.equal(table.column("type"), MessageType.DATA.value))
        if table.num_rows and (self.min_offset > 0 or table.column("txn_most_bits").null_count != table.num_rows):
            offs = _int64s(table.column("offset"))
            if self.min_offset > 0:
                keep &= offs >= self.min_offset
            keys = txn_key_column(table)
            if keys.null_count != len(keys):
                keep &= self._txn_rows_visible(offs, keys, keep)
                if self.stragglers:
                    s = np.array(self.stragglers, np.int64)
                    i = np.searchsorted(s[:, 0], offs, side="right") - 1
                    keep &= ~((i >= 0) & (offs <= s[np.maximum(i, 0), 1]))
        return keep_rows(table, keep)

    def shows_all(self, lo: int, hi: int) -> bool:
        """Whether :meth:`apply` keeps every record at offsets ``lo..hi``, known without reading
        them: the span lies inside one commit entry of a transaction this filter shows (not
        aborted, in the cut, the span before its marker, not below the retention horizon, no
        straggler in it). A commit entry is the offsets of one append of that transaction, so every
        record in it is a DATA record of it (docs/semantics.md, "Commit markers carry their
        entries"). A Spark read then reads such a file without the filter's columns and mask."""
        return self.shown_by(lo, hi) is not None

    def shown_by(self, lo: int, hi: int) -> int | None:
        """:meth:`shows_all`, naming the transaction (its key) whose commit entry holds ``lo..hi``;
        None where the span is not shown whole."""
        if lo > hi or lo < self.min_offset or hi >= self.read_limit:
            return None
        if any(a <= hi and b >= lo for a, b in self.stragglers):
            return None
        entries = self._entry_index()
        if entries is None:  # entries of several transactions overlap: the first listed decides
            k = next((k for k, rs in self.ranges.items() if any(a <= lo and hi <= b for a, b in _merged(rs))), None)
        else:
            starts, ends, keys = entries
            i = bisect.bisect_right(starts, lo) - 1
            k = keys[i] if i >= 0 and hi <= ends[i] else None
        if k is None or k in self.aborted or hi > self.ended.get(k, hi) or not (self.cut is None or self.cut.shows(k)):
            return None
        return k

    def _entry_index(self) -> tuple[list[int], list[int], list[int]] | None:
        """Every transaction's merged entries as one sorted list (starts, ends, keys), built once per
        filter: a Spark read asks :meth:`shows_all` per file, and re-merging every transaction's
        entries each time cost O(transactions) a file. None when entries of different transactions
        overlap (one append per entry makes that impossible), where the search would not be exact.
        Kept out of the pickle: executors build their own."""
        cached = self.__dict__.get("_entries", _UNBUILT)
        if cached is _UNBUILT:
            flat = sorted((a, b, k) for k, rs in self.ranges.items() for a, b in _merged(rs))
            disjoint = all(flat[i][0] > flat[i - 1][1] for i in range(1, len(flat)))
            cached = ([a for a, _, _ in flat], [b for _, b, _ in flat], [k for _, _, k in flat]) if disjoint else None
            object.__setattr__(self, "_entries", cached)
        return cached

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_entries"}

    def _txn_rows_visible(self, offs: np.ndarray, keys: pa.Array | pa.ChunkedArray, rows: np.ndarray) -> np.ndarray:
        """Per row: a plain row, or a row of a transaction that is not aborted, passes the cut,
        is not a straggler (past its own marker) and lies in its commit's entries, if listed.

        Decided per run of rows of one transaction, from the run's lowest and highest offset: a
        run wholly visible or wholly hidden costs nothing per row, and only the rare run that an
        entry list or its marker cuts in two is checked row by row (a Spark read task checked
        every row of every file against the entry lists: a third of its filtering time). Only the
        ``rows`` the caller still keeps count (a marker row would make its transaction's run reach
        past the run's last entry: those rows are answered as plain, the caller drops them anyway)."""
        valid = _bools(pc.is_valid(keys)) & rows
        if not valid.any():
            return np.ones(len(valid), dtype=bool)
        kf = _int64s(pc.fill_null(keys, 0))
        brk = np.flatnonzero((kf[1:] != kf[:-1]) | (valid[1:] != valid[:-1])) + 1
        starts = np.concatenate(([0], brk))
        lengths = np.diff(np.concatenate((starts, [len(kf)])))
        run_valid = valid[starts]
        uniq, inv = np.unique(kf[starts][run_valid], return_inverse=True)
        ukeys = uniq.tolist()
        run_ids = np.zeros(len(starts), np.int64)
        run_ids[run_valid] = inv
        shown = np.array([k not in self.aborted for k in ukeys], dtype=bool)
        if self.cut is not None:
            shown &= _bools(self.cut.mask(pa.array(uniq)))
        big = np.iinfo(np.int64).max
        end = np.array([self.ended.get(k, big) for k in ukeys], np.int64)
        lo, hi = np.minimum.reduceat(offs, starts), np.maximum.reduceat(offs, starts)
        run_shown, run_end = shown[run_ids], end[run_ids]
        whole = run_shown & (hi <= run_end)
        mixed = run_shown & (lo <= run_end) & ~whole
        ranged = {j: self.ranges[k] for j, k in enumerate(ukeys) if k in self.ranges}
        if ranged:
            inside = _in_one_range(lo, hi, run_ids, ranged)
            mixed |= whole & ~inside
            whole &= inside
        ok = np.repeat(~run_valid | whole, lengths)
        mixed &= run_valid
        if mixed.any():
            rows = np.flatnonzero(np.repeat(mixed, lengths))
            rid, o = np.repeat(run_ids, lengths)[rows], offs[rows]
            row_ok = shown[rid] & (o <= end[rid])
            if ranged:
                row_ok &= _in_ranges(o, rid, ranged)
            ok[rows] = row_ok
        return ok


def _merged(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges (inclusive; inverted ones are empty) merged into disjoint, sorted, non-adjacent ones."""
    merged: list[list[int]] = []
    for a, b in sorted(r for r in ranges if r[0] <= r[1]):
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _range_bands(ranges: dict[int, list[tuple[int, int]]], lo: int, hi: int
                 ) -> tuple[np.ndarray, np.ndarray, int]:
    """Each id's ranges merged into disjoint sorted ones and placed in a band of their own
    (``id * span + offset``), so one binary search over all bands answers many queries at once:
    (band starts, band ends, span). Offsets from ``lo`` to ``hi`` map to 1..span-2; 0 and
    span-1 stand for "below" and "above"."""
    span = hi - lo + 3
    starts: list[int] = []
    ends: list[int] = []
    for j in sorted(ranges):
        for a, b in _merged(ranges[j]):
            starts.append(j * span + min(max(a - lo + 1, 0), span - 1))
            ends.append(j * span + min(max(b - lo + 1, 0), span - 1))
    return np.array(starts, np.int64), np.array(ends, np.int64), span


def _band_index(s: np.ndarray, e: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Index of the merged range holding each band position, -1 where none does."""
    i = np.searchsorted(s, pos, side="right") - 1
    inside = (i >= 0) & (pos <= e[np.maximum(i, 0)])
    return np.where(inside, i, -1)


def _in_ranges(offsets: np.ndarray, ids: np.ndarray, ranges: dict[int, list[tuple[int, int]]]) -> np.ndarray:
    """For each row: ``any(a <= o <= b for a, b in ranges[id])``, True where ``id`` has no ranges."""
    limited = np.isin(ids, np.fromiter(ranges, np.int64, len(ranges)))
    base = int(offsets.min())
    s, e, span = _range_bands(ranges, base, int(offsets.max()))
    if not len(s):
        return ~limited
    return ~limited | (_band_index(s, e, ids * span + (offsets - base + 1)) >= 0)


def _in_one_range(lo: np.ndarray, hi: np.ndarray, ids: np.ndarray, ranges: dict[int, list[tuple[int, int]]]
                  ) -> np.ndarray:
    """For each run of rows with offsets from ``lo`` to ``hi``: True where ``id`` has no ranges or
    one range holds all of ``lo..hi``. Merged ranges are disjoint and never adjacent, so that is
    when both ends lie in the same one."""
    limited = np.isin(ids, np.fromiter(ranges, np.int64, len(ranges)))
    base = int(lo.min())
    s, e, span = _range_bands(ranges, base, int(hi.max()))
    if not len(s):
        return ~limited
    a = _band_index(s, e, ids * span + (lo - base + 1))
    b = _band_index(s, e, ids * span + (hi - base + 1))
    return ~limited | ((a >= 0) & (a == b))
