"""Threads of one process share a partition's PartitionLog (``shared_log``: producers, the TC's
marker channel, Spark tasks), and so its file index. A merge of small files commits a remove of
many files and an add of one; a thread that catches the index up on that commit while another
reads must leave the reader either the files before the merge or the files after it, never a
mix, and two threads catching up at once must apply each commit once."""
from __future__ import annotations

import sys
import threading

import pulsartx
from pulsartx.log.partition import PartitionLog, build_records
from pulsartx.maintenance import merging
from pulsartx.naming import TopicName

PART = TopicName.parse("idx-partition-0")
ROUNDS = 3
ROWS_PER_ROUND = 32
READERS = 4


def test_readers_sharing_a_partition_log_see_every_row_while_merges_land(tmp_path, monkeypatch):
    """Fails before the fix: readers of the shared log read offsets twice (two threads applied the
    same merge commit, so the merged file was listed twice, for good) or missed the merged rows
    (a reader looked between the removal of the run's files and the insertion of the merged one)."""
    monkeypatch.setattr(merging, "FANOUT", 2)  # a merge every two files: many merge commits
    # merged below, by hand: a background merge of the writer's (every 64th version) would take
    # some runs first, and the pass counted below would stop at its first lost race
    monkeypatch.setattr("pulsartx.log.partition.MERGE_EVERY", 0)
    with pulsartx.Client(str(tmp_path / "root")) as c:
        c.admin.create_topic("idx", partitions=1)
        root = c.root
    writer = PartitionLog(root, PART)
    shared = PartitionLog(root, PART)
    bad: list[list[int]] = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    try:
        for r in range(ROUNDS):
            for i in range(ROWS_PER_ROUND):
                writer.append(build_records([f"r{r}m{i}".encode()]))
            end = (r + 1) * ROWS_PER_ROUND
            expected = list(range(end))
            assert shared.refresh().end_offset == end
            done = threading.Event()

            def read(expected: list[int] = expected, end: int = end, done: threading.Event = done) -> None:
                while not done.is_set():
                    shared.refresh()
                    got = shared.read(0, end, ["offset"]).column("offset").to_pylist()
                    if got != expected:
                        bad.append(got)
                        return

            readers = [threading.Thread(target=read) for _ in range(READERS)]
            for t in readers:
                t.start()
            merged = 0
            while n := merging.merge_small_files(root, PART):
                merged += n
            done.set()
            for t in readers:
                t.join()
            assert merged >= ROWS_PER_ROUND  # every new file took part in some merge
            fresh = PartitionLog(root, PART).refresh()
            assert [f.path for f in shared.refresh().files] == [f.path for f in fresh.files]
            assert shared.index.version == fresh.version
            assert shared.read(0, end, ["offset"]).column("offset").to_pylist() == expected
    finally:
        sys.setswitchinterval(old)
    assert bad == []
