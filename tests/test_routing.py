"""Key routing: Java's String.hashCode and Pulsar's default key-to-partition rule."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsartx.client.routing import RoundRobin, java_string_hash, partition_for_key


def reference_java_hash(s: str) -> int:
    """Java's algorithm written out independently: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code
    units, in 32-bit two's complement."""
    units = []
    for ch in s:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    n = len(units)
    h = sum(u * pow(31, n - 1 - i, 2**32) for i, u in enumerate(units)) % 2**32
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize("key,expected", [
    ("", 0),
    ("a", 97),
    ("hello", 99162322),
    ("Aa", 2112),
    ("BB", 2112),  # the classic Java collision
    ("polygenelubricants", -(2**31)),  # hashCode() == Integer.MIN_VALUE
    ("\u00e9", 233),
    ("\u65e5\u672c", 26085 * 31 + 26412),  # "日本" = 835047
    ("\U0001F600", 0xD83D * 31 + 0xDE00),  # an emoji is a surrogate pair in UTF-16: 1772899
])
def test_java_string_hash_known_values(key, expected):
    assert java_string_hash(key) == expected
    assert reference_java_hash(key) == expected


def test_java_string_hash_wraps_negative():
    # "hello world".hashCode() in Java.
    assert java_string_hash("hello world") == 1794106052
    assert java_string_hash("The quick brown fox") == -1739336029


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_java_string_hash_matches_reference(s):
    h = java_string_hash(s)
    assert h == reference_java_hash(s)
    assert -(2**31) <= h < 2**31


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16])
def test_partition_for_key_matches_pulsar(n):
    # Pulsar: signSafeMod(JavaStringHash.makeHash(key), n), with makeHash = hashCode() & Integer.MAX_VALUE.
    for key in ["", "hello", "polygenelubricants", "The quick brown fox", "\U0001F600", "user-42"]:
        assert partition_for_key(key, n) == (reference_java_hash(key) & 0x7FFFFFFF) % n
    # Integer.MIN_VALUE & MAX_VALUE == 0: always partition 0.
    assert partition_for_key("polygenelubricants", n) == 0


def test_partition_for_key_known_partitions():
    assert [partition_for_key("hello", n) for n in (1, 2, 3, 4, 5)] == [0, 0, 1, 2, 2]
    # hashCode -1739336029 masks to 408147619 (a plain Python modulo of the negative hash would give 2, 3, 1).
    assert [partition_for_key("The quick brown fox", n) for n in (3, 4, 5)] == [1, 3, 4]


@settings(max_examples=300, deadline=None)
@given(key=st.text(max_size=30), n=st.integers(1, 10_000))
def test_partition_for_key_stable_and_in_range(key, n):
    p = partition_for_key(key, n)
    assert 0 <= p < n
    assert partition_for_key(key, n) == p


def test_keys_spread_over_partitions():
    counts = Counter(partition_for_key(f"key-{i}", 8) for i in range(8000))
    assert set(counts) == set(range(8))
    assert min(counts.values()) > 700


def test_round_robin():
    rr = RoundRobin(3)
    assert [rr.next() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    rr = RoundRobin(3, start=2)
    assert [rr.next() for _ in range(4)] == [2, 0, 1, 2]
    rr = RoundRobin(1)
    assert [rr.next() for _ in range(3)] == [0, 0, 0]


def test_round_robin_moves_only_at_batch_boundaries():
    rr = RoundRobin(3, start=1)
    assert [rr.current() for _ in range(4)] == [1, 1, 1, 1]  # one batch: one partition
    rr.advance()
    assert rr.current() == 2
    rr.advance()
    assert (rr.current(), rr.next(), rr.current()) == (0, 0, 1)


def _task_routes(batches, n: int, task_id: int = 0, prefix: str = "p"):
    """What a Spark write task (pulsartx.commit_protocol.task.TaskAppender) routes where, batch by
    batch, and the task's first round-robin partition."""
    import pyarrow as pa
    from pulsartx.commit_protocol.job import JobTransaction
    from pulsartx.commit_protocol.task import TaskAppender

    from pulsartx.naming import TopicName
    from pulsartx.storage.root import StorageRoot

    topic = TopicName.parse("t")
    job = JobTransaction(StorageRoot.resolve("/nonexistent-root"), None, prefix, 0)  # routing needs no storage
    ta = TaskAppender(job, topic, {str(topic): n}, None, task_id, 0)
    first = ta.round_robin % n
    out = []
    for cols in batches:
        batch = pa.RecordBatch.from_pydict(cols)
        out.append([(int(p.rsplit("-", 1)[1]), rows.column("value").to_pylist()) for p, rows in ta._route(batch)])
    return out, first


def test_task_sends_each_unkeyed_batch_whole_to_one_partition_rotating_per_batch():
    # Pulsar's round-robin router with batching: all of a batch to one partition, the next batch
    # to the next partition (not a slice of every batch per partition).
    values = [b"%d" % i for i in range(10)]
    batches = [{"value": values}, {"value": values[:3]}, {"value": values[3:8]}, {"value": values[8:]},
               {"value": values[:1], "__key": [None]}]
    routed, s = _task_routes(batches, 4, task_id=1)
    assert routed == [[(s, values)], [((s + 1) % 4, values[:3])], [((s + 2) % 4, values[3:8])],
                      [((s + 3) % 4, values[8:])], [(s, values[:1])]]
    # The job's other tasks start at the next partitions, so one wave of tasks spreads its batches.
    assert [_task_routes(batches[:1], 4, task_id=t)[1] for t in range(4)] == [(s - 1 + t) % 4 for t in range(4)]
    # And the start moves from job to job (each micro-batch is a job): not every job starts at one partition.
    assert len({_task_routes(batches[:1], 4, prefix=f"job{j}")[1] for j in range(16)}) > 1
    single, _ = _task_routes(batches[:2], 1)
    assert single == [[(0, values)], [(0, values[:3])]]


def test_task_routes_keys_by_hash_and_the_unkeyed_rows_of_a_batch_together():
    cols = {"value": [b"a", b"b", b"c", b"d", b"e"], "__key": ["k1", None, "k1", None, "k2"]}
    [keyed], s = _task_routes([cols], 4)
    p1, p2 = partition_for_key("k1", 4), partition_for_key("k2", 4)
    expected: dict[int, list[bytes]] = {}
    for part, v in [(p1, b"a"), (s, b"b"), (p1, b"c"), (s, b"d"), (p2, b"e")]:
        expected.setdefault(part, []).append(v)
    assert keyed == sorted(expected.items())
    given_parts, _ = _task_routes([{"value": [b"x", b"y"], "__partition": [3, 0]}], 4)
    assert sorted(given_parts[0]) == [(0, [b"y"]), (3, [b"x"])]
    # A null __partition falls back to the key, then to the batch's partition.
    [mixed], s = _task_routes([{"value": [b"x", b"y", b"z"], "__partition": [2, None, None],
                                "__key": [None, "k1", None]}], 4)
    expected = {}
    for part, v in [(2, b"x"), (p1, b"y"), (s, b"z")]:
        expected.setdefault(part, []).append(v)
    assert mixed == sorted(expected.items())


def test_task_split_keeps_each_partitions_rows_in_order_with_their_columns():
    # One sort and one take cut a batch: every row lands once, in its partition, in batch order,
    # with its own key beside its value.
    import numpy as np
    import pyarrow as pa
    from pulsartx.commit_protocol.task import split_by_partition

    keys = [f"k{i % 7}" if i % 5 else None for i in range(200)]
    values = [b"%03d" % i for i in range(200)]
    [routed], s = _task_routes([{"value": values, "__key": keys}], 4)
    expected: dict[int, list[bytes]] = {}
    for k, v in zip(keys, values, strict=True):
        expected.setdefault(s if k is None else partition_for_key(k, 4), []).append(v)
    assert routed == sorted(expected.items())
    table = pa.table({"value": values, "__key": keys})
    idx = np.array([s if k is None else partition_for_key(k, 4) for k in keys])
    for p, part in split_by_partition(table, idx):
        assert part.column("__key").to_pylist() == [k for k, i in zip(keys, idx, strict=True) if i == p]
    # All rows of one partition: the batch itself, uncut.
    [(p, whole)] = list(split_by_partition(table, np.full(200, 3)))
    assert p == 3 and whole is table
    assert list(split_by_partition(table.slice(0, 0), np.zeros(0, np.int64))) == []


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=129, max_size=600))
def test_long_keys_hash_as_java_does(s):
    # Keys past the memo's limit take the vectorised path: the same hash, wrapped the same way.
    assert java_string_hash(s) == reference_java_hash(s)


def test_long_keys_are_not_kept_alive():
    """A producer routing by 10 KB keys must not keep the last 16,384 of them (160 MB) in memory."""
    import gc
    import tracemalloc

    java_string_hash("warm-up")  # the memo's own structures exist before measuring
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(300):  # 3 MB of keys, each dropped right after routing it
            key = f"{i:06d}" + "k" * 10_000
            h = java_string_hash(key)
            if i < 3:
                assert h == reference_java_hash(key)
        del key
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 200_000
