"""Packing a micro-batch's small topic-partition ranges into fewer tasks (pulsartx.datasource.batch_reader)."""
from __future__ import annotations

from pulsartx.datasource.batch_reader import OffsetRangePartition, PackedPartition, pack_ranges
from pulsartx.datasource.visibility import Visibility


def rng(partition: int, start: int, end: int) -> OffsetRangePartition:
    return OffsetRangePartition("persistent://public/default/t", partition, ("topics", str(partition)), start, end,
                                (), Visibility("READ_UNCOMMITTED"))


def flat(parts) -> list[tuple[int, int, int]]:
    out = []
    for p in parts:
        for r in (p.ranges if isinstance(p, PackedPartition) else (p,)):
            out.append((r.partition, r.start, r.end))
    return sorted(out)


def test_small_ranges_share_tasks_and_every_range_is_read_exactly_once():
    ranges = [rng(i, 100 * i, 100 * i + 12_500) for i in range(4)]
    packed = pack_ranges(ranges, 25_000)
    assert len(packed) == 2 and all(isinstance(p, PackedPartition) and len(p.ranges) == 2 for p in packed)
    assert flat(packed) == flat(ranges)


def test_large_ranges_keep_a_task_each_and_zero_disables_packing():
    big = [rng(i, 0, 30_000) for i in range(4)]
    assert pack_ranges(big, 25_000) == big
    small = [rng(i, 0, 10) for i in range(4)]
    assert pack_ranges(small, 0) == small
    assert pack_ranges(small[:1], 25_000) == small[:1]


def test_uneven_ranges_are_balanced_largest_first():
    ranges = [rng(0, 0, 20_000), rng(1, 0, 15_000), rng(2, 0, 10_000), rng(3, 0, 5_000)]
    packed = pack_ranges(ranges, 25_000)
    loads = sorted(sum(r.end - r.start for r in (p.ranges if isinstance(p, PackedPartition) else (p,)))
                   for p in packed)
    assert loads == [25_000, 25_000] and flat(packed) == flat(ranges)


def test_packing_never_exceeds_max_entries_per_partition():
    """maxEntriesPerPartition bounds a task's memory: packing must not undo its splits."""
    ranges = [rng(0, 0, 10_000), rng(0, 10_000, 20_000), rng(1, 0, 10_000), rng(1, 10_000, 20_000)]
    assert pack_ranges(ranges, 25_000, max_entries=10_000) == ranges
    packed = pack_ranges(ranges, 25_000, max_entries=20_000)
    assert len(packed) == 2 and flat(packed) == flat(ranges)


def test_task_count_rounds_to_nearest_so_commit_markers_do_not_add_a_half_empty_task():
    """Four 25,000-row ranges with a commit marker each at 50,000 a task: two tasks, not three."""
    ranges = [rng(i, 0, 25_001) for i in range(4)]
    packed = pack_ranges(ranges, 50_000)
    assert len(packed) == 2 and all(isinstance(p, PackedPartition) and len(p.ranges) == 2 for p in packed)
    assert flat(packed) == flat(ranges)
    assert len(pack_ranges(ranges, 50_000, max_entries=40_000)) == 4  # two per task would exceed it
    assert len(pack_ranges([rng(i, 0, 20_000) for i in range(3)], 50_000, max_entries=50_000)) == 2  # 40k + 20k


def loads(parts) -> list[int]:
    return sorted(sum(r.end - r.start for r in (p.ranges if isinstance(p, PackedPartition) else (p,))) for p in parts)


def test_no_cliff_below_twice_the_minimum_and_large_ranges_keep_their_own_task():
    assert loads(pack_ranges([rng(0, 0, 49_999), rng(1, 0, 49_999)], 50_000)) == [49_999, 49_999]
    assert loads(pack_ranges([rng(0, 0, 50_000), rng(1, 0, 40_000)], 50_000)) == [40_000, 50_000]
    assert loads(pack_ranges([rng(0, 0, 60_000), rng(1, 0, 10_000)], 50_000)) == [70_000]  # a small one may join
    assert loads(pack_ranges([rng(0, 0, 60_000), rng(1, 0, 20_000), rng(2, 0, 20_000)], 50_000)) == [40_000, 60_000]
    assert loads(pack_ranges([rng(0, 0, 30_000), rng(1, 0, 30_000)], 50_000)) == [60_000]  # 1.2 tasks: one
