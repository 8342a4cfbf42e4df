"""Message keys that land on chosen partitions, for tests that need one key per partition
(tests/ is on sys.path)."""
from __future__ import annotations

from pulsartx.client.routing import partition_for_key


def keys_for(n: int) -> list[str]:
    """keys[i] routes to partition i of an n-partition topic (Pulsar's key hash)."""
    out: dict[int, str] = {}
    i = 0
    while len(out) < n:
        out.setdefault(partition_for_key(f"k{i}", n), f"k{i}")
        i += 1
    return [out[p] for p in range(n)]
