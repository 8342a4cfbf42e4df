"""A partition's range above maxEntriesPerPartition is split into balanced pieces cut where data
files start (datasource/batch_reader.py, ``split_range``): no piece over the bound, no tiny tail
task, no file read by two tasks when a file start allows it, and the rows read are exactly those of
the unsplit range, in order, for both isolation levels."""
from __future__ import annotations

import itertools
import random

import pytest
from pulsartx.datasource.batch_reader import plan_partitions, read_partition, split_range
from pulsartx.datasource.options import parse_options

import pulsartx


def check_pieces(pieces: list[tuple[int, int]], start: int, end: int, max_entries: int, starts: list[int]) -> None:
    assert pieces[0][0] == start and pieces[-1][1] == end
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    assert all(0 < hi - lo <= max_entries for lo, hi in pieces)
    k = len(pieces)
    assert k == -(-(end - start) // max_entries)  # as few as the bound allows
    for i, ((prev, cut), _) in enumerate(itertools.pairwise(pieces), start=1):
        # A cut inside a file only when no file start lies where the rest still fits the bound.
        lo, hi = max(prev + 1, end - (k - i) * max_entries), min(prev + max_entries, end - (k - i))
        assert cut in starts or not any(lo <= b <= hi for b in starts), (pieces, starts)


def test_pieces_cover_the_range_within_the_bound_on_random_ranges() -> None:
    rnd = random.Random(7)
    for _ in range(3000):
        start, n, max_entries = rnd.randrange(0, 1000), rnd.randrange(1, 3000), rnd.randrange(1, 700)
        starts = sorted(rnd.sample(range(start, start + n + 50), rnd.randrange(0, min(n + 50, 40))))
        check_pieces(split_range(start, start + n, max_entries, starts), start, start + n, max_entries, starts)
    assert split_range(5, 5, 10, [5]) == [(5, 5)]  # an empty range still gets its (empty) piece


def test_a_range_just_over_the_bound_splits_in_halves_at_file_starts() -> None:
    """A job's 500,000 rows plus markers and an aborted attempt: two halves cut where a file
    starts, not 500,000 and a 5,002-entry tail cut inside a file."""
    starts = [0, 60833, 128333, 189166, 250000, 250001, 310834, 371667, 432500, 500000, 500001, 505001]
    pieces = split_range(0, 505_002, 500_000, starts)
    assert pieces == [(0, 250_001), (250_001, 505_002)]
    # Without file starts near the middle, the cut falls at the nearest one within the bound.
    assert split_range(0, 505_002, 500_000, [0, 400_000]) == [(0, 400_000), (400_000, 505_002)]
    # None within the bound: the balanced cut, inside a file.
    assert split_range(0, 1000, 400, [0, 999]) == [(0, 333), (333, 667), (667, 1000)]
    # Exactly the bound, or under it: one piece.
    assert split_range(10, 510, 500, starts) == [(10, 510)]


@pytest.mark.parametrize("level", ["READ_COMMITTED", "READ_UNCOMMITTED"])
def test_split_reads_return_exactly_the_unsplit_rows_and_read_each_file_once(tmp_path, level: str) -> None:
    root = str(tmp_path / "root")
    client = pulsartx.Client(root)
    client.admin.create_topic("t")
    producer = client.create_producer("t", batching_max_messages=7, batching_max_publish_delay_ms=600_000)
    for t in range(6):  # committed and aborted transactions, plain messages between them
        txn = client.new_transaction()
        for i in range(9):
            producer.send(f"txn{t}-{i}".encode(), txn=txn)
        producer.flush()
        txn.commit() if t % 3 else txn.abort()
        for i in range(5):
            producer.send(f"plain{t}-{i}".encode())
        producer.flush()
    producer.close()

    def plan(max_entries: int):
        opts = parse_options({"service.url": root, "topic": "t", "isolationLevel": level,
                              "maxEntriesPerPartition": str(max_entries)})
        return opts, plan_partitions(opts.root, opts)

    def rows(max_entries: int) -> tuple[list[tuple[bytes, int]], int, int]:
        opts, parts = plan(max_entries)
        out = [(v, o) for p in parts for b in read_partition(opts.root, p)
               for v, o in zip(b.column("value").to_pylist(), b.column("__offset").to_pylist(), strict=True)]
        files = [f.path for p in parts for f in p.files]
        return out, len(parts), len(files) - len(set(files))

    whole, tasks, _ = rows(1_000_000)
    assert tasks == 1 and len(whole) == (4 * 9 if level == "READ_COMMITTED" else 6 * 9) + 6 * 5
    assert [o for _, o in whole] == sorted(o for _, o in whole)
    for max_entries in (1, 7, 10, 23, 40, 61):
        split, tasks, shared = rows(max_entries)
        assert split == whole, max_entries
        _, parts = plan(max_entries)
        n = parts[-1].end - parts[0].start
        assert tasks == -(-n // max_entries) and all(p.end - p.start <= max_entries for p in parts)
        assert shared <= tasks - 1  # at most the file a cut falls in, when no file start was in reach
        if max_entries >= 40:  # files of at most 7 records, and room to spare: every cut at a file start
            assert shared == 0, max_entries
    client.close()
