"""Message routing to partitions, as Pulsar's default router does it."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@functools.lru_cache(maxsize=1 << 14)
def java_string_hash(key: str) -> int:
    """Java's ``String.hashCode`` (Pulsar's default ``HashingScheme.JavaStringHash``): stable across
    processes and languages, unlike Python's salted ``hash``.

    Remembered for the last 16,384 keys: a byte loop in Python costs 4-8 us a key, and a Spark
    write task hashed the same few keys again in every Arrow batch (2 ms of a 50,000-row task)."""
    h = 0
    data = key.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def partition_for_key(key: str, num_partitions: int) -> int:
    """Pulsar's ``signSafeMod(JavaStringHash.makeHash(key), n)``, where ``makeHash`` is
    ``hashCode() & Integer.MAX_VALUE``: the same key always lands on the same partition."""
    return (java_string_hash(key) & 0x7FFFFFFF) % num_partitions


def partitions_for_keys(keys: pa.Array | pa.ChunkedArray, num_partitions: int) -> np.ndarray:
    """:func:`partition_for_key` of a whole key column (int64), -1 where the key is null: each
    distinct key is hashed once, so a batch costs its distinct keys, not its rows, in Python."""
    uniq = pc.unique(keys)
    table = np.array([-1 if k is None else partition_for_key(k, num_partitions) for k in uniq.to_pylist()],
                     dtype=np.int64)
    idx: Any = pc.index_in(keys, value_set=uniq)  # null keys find the null in ``uniq``
    return table[idx.to_numpy(zero_copy_only=False).astype(np.int64)] if len(uniq) else np.zeros(0, np.int64)


class RoundRobin:
    """Pulsar's round-robin over partitions for unkeyed messages. With batching (always on here)
    Pulsar's ``RoundRobinPartitionMessageRouter`` does not rotate per message: it "is set to the
    same boundary of batching delay", so every unkeyed message of one batch goes to one partition
    and the next batch to the next. The caller says where a batch ends: :meth:`current` is the
    partition of the batch being filled, :meth:`advance` ends it, :meth:`next` is a batch of its own.
    """

    def __init__(self, num_partitions: int, start: int = 0):
        self._n = max(num_partitions, 1)
        self._i = start % self._n

    def current(self) -> int:
        return self._i

    def advance(self) -> None:
        self._i = (self._i + 1) % self._n

    def next(self) -> int:
        i = self._i
        self.advance()
        return i
