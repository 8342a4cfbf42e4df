"""RangeSet: a set of offsets kept as sorted, disjoint, inclusive ranges.

Cursors store individually acknowledged and pending offsets this way (Pulsar's
``individuallyDeletedMessages``), so a backlog acknowledged out of order stays a handful of
ranges rather than one entry per message.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator


class RangeSet:
    __slots__ = ("_starts", "_ends")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()):
        self._starts: list[int] = []
        self._ends: list[int] = []
        for a, b in sorted(ranges):
            self.add_range(a, b)

    @classmethod
    def of(cls, offsets: Iterable[int]) -> RangeSet:
        """One pass over the sorted offsets: a consumer builds this from everything it holds on each
        fetch, and adding offsets one by one cost ~3 us each (40,000 held: 0.1 s per fetch)."""
        rs = cls()
        starts, ends = rs._starts, rs._ends
        for o in sorted(set(offsets)):
            if ends and o == ends[-1] + 1:
                ends[-1] = o
            else:
                starts.append(o)
                ends.append(o)
        return rs

    def copy(self) -> RangeSet:
        rs = RangeSet()
        rs._starts, rs._ends = list(self._starts), list(self._ends)
        return rs

    def __contains__(self, offset: int) -> bool:
        i = bisect.bisect_right(self._starts, offset) - 1
        return i >= 0 and offset <= self._ends[i]

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __len__(self) -> int:
        """The number of offsets (not ranges)."""
        return sum(b - a + 1 for a, b in zip(self._starts, self._ends, strict=True))

    def __iter__(self) -> Iterator[int]:
        for a, b in zip(self._starts, self._ends, strict=True):
            yield from range(a, b + 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeSet) and self.ranges() == other.ranges()

    def __repr__(self) -> str:
        return f"RangeSet({self.ranges()})"

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))

    def add_range(self, a: int, b: int) -> None:
        if a > b:
            return
        i = bisect.bisect_left(self._ends, a - 1)  # first range that could touch [a, b]
        j = i
        while j < len(self._starts) and self._starts[j] <= b + 1:
            a, b = min(a, self._starts[j]), max(b, self._ends[j])
            j += 1
        self._starts[i:j] = [a]
        self._ends[i:j] = [b]

    def add(self, offset: int) -> None:
        self.add_range(offset, offset)

    def remove_range(self, a: int, b: int) -> None:
        if a > b or not self._starts:
            return
        out_s: list[int] = []
        out_e: list[int] = []
        for s, e in zip(self._starts, self._ends, strict=True):
            if e < a or s > b:
                out_s.append(s)
                out_e.append(e)
                continue
            if s < a:
                out_s.append(s)
                out_e.append(a - 1)
            if e > b:
                out_s.append(b + 1)
                out_e.append(e)
        self._starts, self._ends = out_s, out_e

    def discard(self, offset: int) -> None:
        self.remove_range(offset, offset)

    def remove_below(self, offset: int) -> None:
        """Drop everything <= ``offset`` (it is covered by the mark-delete position)."""
        self.remove_range(-(2**63), offset)

    def first(self) -> int | None:
        return self._starts[0] if self._starts else None

    def intersects(self, a: int, b: int) -> bool:
        i = bisect.bisect_right(self._starts, b) - 1
        return i >= 0 and self._ends[i] >= a

    def gap_list(self, a: int, b: int, limit: int | None = None) -> list[int]:
        """``list(gaps(a, b, limit))``, built a run at a time: a consumer's fetch takes thousands
        of offsets, which the generator yields at a Python step each."""
        out: list[int] = []
        o = a
        i = max(0, bisect.bisect_right(self._starts, a) - 1)
        starts, ends = self._starts, self._ends
        while o < b and (limit is None or len(out) < limit):
            while i < len(starts) and ends[i] < o:
                i += 1
            if i < len(starts) and starts[i] <= o:
                o = ends[i] + 1
                continue
            stop = b if i >= len(starts) else min(b, starts[i])
            if limit is not None:
                stop = min(stop, o + limit - len(out))
            out.extend(range(o, stop))
            o = stop
        return out

    def gaps(self, a: int, b: int, limit: int | None = None) -> Iterator[int]:
        """Offsets in ``[a, b)`` not in the set, in order (at most ``limit``)."""
        n = 0
        o = a
        i = max(0, bisect.bisect_right(self._starts, a) - 1)
        while o < b and (limit is None or n < limit):
            while i < len(self._starts) and self._ends[i] < o:
                i += 1
            if i < len(self._starts) and self._starts[i] <= o:
                o = self._ends[i] + 1
                continue
            stop = b if i >= len(self._starts) else min(b, self._starts[i])
            while o < stop and (limit is None or n < limit):
                yield o
                o += 1
                n += 1
