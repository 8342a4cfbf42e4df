"""Message routing to partitions, as Pulsar's default router does it."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Keys up to this many characters are remembered (the last MEMO_KEYS of them); longer ones are hashed
# with numpy each time. The memo then holds at most MEMO_KEYS x MEMO_MAX_CHARS characters: about 5 MB
# with its entries for ASCII keys, 11 MB at most (4 bytes a character), where remembering every key
# held up to 160 MB of 10 KB ones.
MEMO_KEYS = 1 << 14
MEMO_MAX_CHARS = 128


def java_string_hash(key: str) -> int:
    """Java's ``String.hashCode`` (Pulsar's default ``HashingScheme.JavaStringHash``): stable across
    processes and languages, unlike Python's salted ``hash``.

    Short keys are remembered: a byte loop in Python costs 4-8 us a key, and a Spark write task
    hashed the same few keys again in every Arrow batch (2 ms of a 50,000-row task). A long key is
    not (the memo would keep it alive); numpy hashes it in 10-30 us (docs/design/bounded-key-hash-memo.md)."""
    if len(key) <= MEMO_MAX_CHARS:
        return _memo_hash(key)
    return _signed(_vector_hash(key))


@functools.lru_cache(maxsize=MEMO_KEYS)
def _memo_hash(key: str) -> int:
    h = 0
    data = key.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return _signed(h)


def _vector_hash(key: str) -> int:
    """``s[0]*31^(n-1) + ... + s[n-1]`` over the UTF-16 code units, mod 2^32: uint32 products and
    sums wrap exactly as Java's int arithmetic does."""
    units = np.frombuffer(key.encode("utf-16-be", "surrogatepass"), dtype=">u2").astype(np.uint32)
    powers = np.full(len(units), 31, dtype=np.uint32)
    powers[0] = 1
    powers = np.cumprod(powers, dtype=np.uint32)[::-1]  # 31^(n-1) ... 31, 1
    return int(np.sum(units * powers, dtype=np.uint32))


def _signed(h: int) -> int:
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
