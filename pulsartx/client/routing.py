"""Message routing to partitions, as Pulsar's default router does it."""
from __future__ import annotations

import itertools


def java_string_hash(key: str) -> int:
    """Java's ``String.hashCode`` (Pulsar's default ``HashingScheme.JavaStringHash``): stable across
    processes and languages, unlike Python's salted ``hash``."""
    h = 0
    data = key.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def partition_for_key(key: str, num_partitions: int) -> int:
    """Pulsar's ``signSafeMod(JavaStringHash.makeHash(key), n)``, where ``makeHash`` is
    ``hashCode() & Integer.MAX_VALUE``: the same key always lands on the same partition."""
    return (java_string_hash(key) & 0x7FFFFFFF) % num_partitions


class RoundRobin:
    """Spreads unkeyed messages over partitions in turn."""

    def __init__(self, num_partitions: int, start: int = 0):
        self._cycle = itertools.cycle(range(num_partitions))
        for _ in range(start % max(num_partitions, 1)):
            next(self._cycle)

    def next(self) -> int:
        return next(self._cycle)
