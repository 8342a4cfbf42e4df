"""Key_Shared without a broker: sticky-key hashes, the auto-split hash ranges, and the rule that
keeps each key in order across consumers.

Pulsar's broker hashes a message's sticky key (Murmur3_32 of its bytes, ``& 0xFFFF``) and hands it
to the consumer whose range holds that hash (``HashRangeAutoSplitStickyKeyConsumerSelector``). Here
each consumer dispatches to itself from storage, so two things are stored instead of decided by a
broker:

* the **hash ranges** (``<subscription>/hash-ranges``, one KeyedLog row changed by CAS), split and
  merged as Pulsar's auto-split selector does: the first consumer takes ``[0, 65535]``, each newcomer
  the lower half of the biggest range, and a leaver's range goes to the range above it (the top
  range's, to the one below). They only steer where keys go: a stale view of them costs a moment
  of imbalance, never order, because of the next rule;
* the **in-flight keys**: a consumer claims offsets (the Shared claims, see
  :mod:`pulsartx.subscription.store`) together with their keys' hashes, and may not deliver a
  message whose key has an earlier unacknowledged message claimed by another live consumer, in
  PENDING_ACK, or waiting on its own negative-ack delay. So a key changes hands only once what the
  previous owner held of it is acknowledged or back in the backlog, and the new owner then
  receives the returned messages first (Pulsar's rule for a leaving consumer).
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable

import mmh3
import pyarrow as pa

from pulsartx.naming import TopicName
from pulsartx.storage.keyed_log import KeyedLog
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.store import subscription_dir

HASH_SPACE = 1 << 16  # Pulsar's DEFAULT_RANGE_SIZE: hashes are 0..65535
NONE_KEY = b"NONE_KEY"  # Pulsar's sticky key for a message without a key
RANGES = "ranges"
SCHEMA = pa.schema([
    pa.field("seq", pa.int64(), False),
    pa.field("key", pa.string(), False),
    pa.field("updated_ms", pa.int64()),
    pa.field("state", pa.string()),
])


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86_32, unsigned (the hash Pulsar's ``Murmur3_32Hash`` computes), from mmh3's C
    implementation."""
    return mmh3.hash(data, seed, signed=False)


def sticky_key_hash(key: str | bytes | None) -> int:
    """The hash Pulsar's Key_Shared dispatch uses for a key: ``(Murmur3_32(key) & 0x7FFFFFFF) %
    65536``, that is ``& 0xFFFF``."""
    data = NONE_KEY if key is None else key.encode() if isinstance(key, str) else key
    return murmur3_32(data) & 0xFFFF


class HashRanges:
    """Pulsar's auto-split assignment: ``ends`` maps each consumer to the inclusive end of its range;
    a range starts just above the previous end (the first at 0)."""

    def __init__(self, entries: Iterable[tuple[int, str]] = ()):
        self.entries: list[tuple[int, str]] = sorted(entries)

    def consumers(self) -> list[str]:
        return [c for _, c in self.entries]

    def add(self, consumer: str) -> None:
        """The newcomer takes the lower half of the biggest range (Pulsar's ``splitRange``)."""
        if consumer in self.consumers():
            return
        if not self.entries:
            self.entries = [(HASH_SPACE - 1, consumer)]
            return
        best, low = None, -1
        best_low = -1
        for end, _ in self.entries:
            if best is None or end - low > best - best_low:
                best, best_low = end, low
            low = end
        assert best is not None
        if best - best_low < 2:
            raise ValueError(f"no hash range left to split for consumer {consumer}")
        middle = best_low + (best - best_low) // 2
        self.entries = sorted([*self.entries, (middle, consumer)])

    def remove(self, consumer: str) -> None:
        """A leaver's range joins the one above it; the top range's goes to the one below."""
        i = next((i for i, (_, c) in enumerate(self.entries) if c == consumer), None)
        if i is None:
            return
        if i == len(self.entries) - 1 and i > 0:
            end = self.entries[i][0]
            self.entries[i - 1:] = [(end, self.entries[i - 1][1])]
        else:
            del self.entries[i]

    def ranges_of(self, consumer: str) -> list[tuple[int, int]]:
        out, low = [], 0
        for end, c in self.entries:
            if c == consumer:
                out.append((low, end))
            low = end + 1
        return out

    def owner(self, h: int) -> str | None:
        for end, c in self.entries:
            if h <= end:
                return c
        return None


class HashRangeStore:
    """The subscription's stored hash ranges: every change is a CAS, so concurrent joins and
    leaves from different processes each split or merge the latest assignment."""

    def __init__(self, root: StorageRoot, topic: TopicName, subscription: str):
        self.subscription = subscription
        self.log = KeyedLog(root, (*subscription_dir(topic.base, subscription), "hash-ranges"), SCHEMA,
                            key_of=lambda r: r["key"], name=f"sub-{subscription}-hash-ranges", compact_every=100)
        self._lock = threading.RLock()

    def _change(self, fn) -> HashRanges:
        def step(row):
            current = _ranges(row)
            new = HashRanges(current.entries)
            fn(new)
            if new.entries == current.entries:
                return None, current
            state = json.dumps({"ranges": [[e, c] for e, c in new.entries]}, separators=(",", ":"))
            return {"key": RANGES, "updated_ms": int(time.time() * 1000), "state": state}, new

        with self._lock:
            return self.log.cas(RANGES, step, what=f"subscription {self.subscription!r} hash ranges",
                                keep=lambda r: True)

    def join(self, consumer: str, gone: Iterable[str] = ()) -> HashRanges:
        """Add ``consumer`` (if absent), dropping first the consumers known to be gone."""
        gone = list(gone)

        def fn(r: HashRanges) -> None:
            for c in gone:
                r.remove(c)
            r.add(consumer)

        return self._change(fn)

    def leave(self, consumer: str) -> HashRanges:
        return self._change(lambda r: r.remove(consumer))

    def current(self) -> HashRanges:
        with self._lock:
            self.log.refresh()
            return _ranges(self.log.get(RANGES))


def _ranges(row) -> HashRanges:
    if row is None or not row.get("state"):
        return HashRanges()
    return HashRanges((e, c) for e, c in json.loads(row["state"]).get("ranges") or ())
