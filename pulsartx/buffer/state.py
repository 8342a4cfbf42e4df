"""The transaction buffer's state as a pure fold over a partition's records (PIP-31 marker
approach, as Pulsar shipped it: maxReadPosition plus an aborted-transaction set).

Folding a record batch in offset order maintains:
  * ``ongoing``: transactions with data in the partition and no marker yet, with their first offset;
  * ``aborted``: transactions whose TXN_ABORT marker is in the partition (offset of the marker);
  * ``ended``: every transaction whose marker was seen (commit or abort), with the marker offset:
    data of a transaction after its own marker (a straggler) is never visible;
  * ``ranges``: for commit markers that list their entries, the exact visible offset ranges.
maxReadPosition is the offset just before the first message of the earliest ongoing transaction,
or the last offset of the log when none is ongoing.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pulsartx.log.schema import MessageType

# Transactions are keyed as one int64 so visibility filters vectorise: TC id in the high bits.
TC_SHIFT = 40
# Committed transactions without entry lists are remembered only to drop their stragglers (data
# written after their own marker, e.g. by a zombie producer); the most recent ones cover that, and
# keeping all of them would make snapshots, and so rebuilding the state, grow with history.
MAX_ENDED = 1000


def txn_key(most: int, least: int) -> int:
    return (most << TC_SHIFT) | least


def key_txn(key: int) -> tuple[int, int]:
    return key >> TC_SHIFT, key & ((1 << TC_SHIFT) - 1)


def txn_key_column(table: pa.Table) -> pa.Array:
    most = table.column("txn_most_bits").cast(pa.int64())
    least = table.column("txn_least_bits").cast(pa.int64())
    return pc.add(pc.shift_left(most, TC_SHIFT), least)


FOLD_COLUMNS = ["offset", "type", "txn_most_bits", "txn_least_bits", "marker_entries"]


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
        a transaction matter; plain rows just move the end."""
        if records.num_rows == 0:
            return self
        offsets = records.column("offset")
        has_txn = pc.is_valid(records.column("txn_most_bits"))
        txn_rows = records.filter(has_txn)
        if txn_rows.num_rows:
            keys = txn_key_column(txn_rows).to_pylist()
            types = txn_rows.column("type").to_pylist()
            offs = txn_rows.column("offset").to_pylist()
            entries = txn_rows.column("marker_entries").to_pylist()
            for k, t, o, e in zip(keys, types, offs, entries, strict=True):
                if t == MessageType.DATA.value:
                    if k in self.ended:
                        continue  # a straggler after its transaction's marker: never visible
                    if k not in self.ongoing:
                        self.ongoing[k] = o
                    self.last_data[k] = o
                else:
                    self.ongoing.pop(k, None)
                    if k in self.ended:
                        continue  # a repeated marker can never change an outcome
                    self.ended[k] = o
                    self.markers_since_snapshot += 1
                    if t == MessageType.TXN_ABORT.value:
                        self.aborted[k] = o
                    elif e is not None:
                        self.ranges[k] = [(r["first_offset"], r["last_offset"]) for r in e]
                    else:
                        self.plain_ended.append(k)
            self._trim()
        self.end_offset = int(pc.max(offsets).as_py()) + 1
        return self

    def _trim(self) -> None:
        """Keep only the MAX_ENDED most recent plain committed transactions (aborted and
        range-limited ones are kept: they decide visibility of data below maxReadPosition)."""
        while len(self.plain_ended) > MAX_ENDED:
            k = self.plain_ended.popleft()
            if k not in self.aborted and k not in self.ranges:
                self.ended.pop(k, None)
                self.last_data.pop(k, None)

    def rebuild_plain_ended(self) -> None:
        """After loading a snapshot: the plain committed transactions in marker order, bounded."""
        plain = sorted((o, k) for k, o in self.ended.items() if k not in self.aborted and k not in self.ranges)
        self.plain_ended = deque(k for _, k in plain)
        self._trim()

    def trim_below(self, start_offset: int) -> int:
        """Forget aborted/ranged transactions whose data retention removed (PIP-196's lesson: the
        aborted set must not grow forever). Returns how many entries were dropped."""
        self.trimmed_below = max(self.trimmed_below, start_offset)
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
                                    min_offset=self.trimmed_below)
        aborted = dict(self.aborted)
        ranges = dict(self.ranges)
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
        return VisibilityFilter(limit, aborted, dict(self.ended), ranges, frozenset(commits),
                                min_offset=self.trimmed_below)


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

    def mask(self, keys: pa.Array) -> pa.Array:
        if not len(keys):
            return pa.array([], pa.bool_())
        k = keys.to_numpy(zero_copy_only=False)
        valid = ~np.isnan(k) if k.dtype.kind == "f" else np.ones(len(k), dtype=bool)
        k = np.nan_to_num(k.astype(np.float64), nan=0).astype(np.int64)
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

    def apply(self, table: pa.Table) -> pa.Table:
        """Keep visible DATA rows of ``table`` (already bounded by ``read_limit``)."""
        data = table.filter(pc.equal(table.column("type"), MessageType.DATA.value))
        if self.min_offset > 0:
            data = data.filter(pc.greater_equal(data.column("offset"), self.min_offset))
        if data.num_rows == 0 or data.column("txn_most_bits").null_count == data.num_rows:
            return data
        keys = txn_key_column(data)
        plain = pc.is_null(keys)
        visible = pc.invert(pc.is_in(keys, value_set=pa.array(list(self.aborted), pa.int64())))
        if self.cut is not None:
            visible = pc.and_kleene(visible, self.cut.mask(keys))
        mask = pc.or_kleene(plain, visible)
        special = (self.ended.keys() - self.aborted.keys()) | self.ranges.keys()
        if special and not special.isdisjoint(pc.unique(keys.filter(pc.is_valid(keys))).to_pylist()):
            mask = self._straggler_and_range_mask(data, keys, mask)
        return data.filter(pc.fill_null(mask, True))

    def _straggler_and_range_mask(self, data: pa.Table, keys: pa.Array, mask: pa.Array) -> pa.Array:
        offs = data.column("offset").to_pylist()
        ks = keys.to_pylist()
        m = mask.to_pylist()
        for i, (k, o) in enumerate(zip(ks, offs, strict=True)):
            if k is None or not m[i]:
                continue
            end = self.ended.get(k)
            if end is not None and o > end:
                m[i] = False
                continue
            rs = self.ranges.get(k)
            if rs is not None and not any(a <= o <= b for a, b in rs):
                m[i] = False
        return pa.array(m, pa.bool_())
