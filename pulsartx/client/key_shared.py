"""A Key_Shared consumer's dispatch to itself: which messages of a partition it may take now.

It takes, in offset order, the unacknowledged messages whose sticky-key hash is in its hash ranges
and whose key has nothing in flight elsewhere: no earlier unacknowledged message claimed by another
live consumer, none in PENDING_ACK outside its own claims, none waiting on its own negative-ack
delay. It claims them with their hashes in one CAS that re-checks the rule on the latest claims, so
two consumers never hold messages of one key at once. Why these rules: docs/design/key-shared.md.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from pulsartx.client.consumer_state import PartitionState, now_ms
from pulsartx.client.message import Message, Records
from pulsartx.client.reader import FETCH_MAX
from pulsartx.naming import TopicName
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.key_shared import HashRanges, HashRangeStore, sticky_key_hash
from pulsartx.subscription.leases import LeaseStore
from pulsartx.subscription.ranges import RangeSet
from pulsartx.subscription.store import Claim

log = logging.getLogger("pulsartx.client.consumer")
WINDOW = 2 * FETCH_MAX  # offsets above the mark-delete position looked at per fetch
# How stale a fetch's view of the hash ranges may be: a newcomer's keys stop going to their old
# owner within this (the in-flight rule keeps order meanwhile; this is about balance).
RANGES_EVERY_S = 0.5


def in_flight(claim: Claim, cursor: CursorState) -> Iterator[int]:
    """The hashes of a claim's messages not yet acknowledged (as of ``cursor``)."""
    for i, h in enumerate(claim.hashes):
        if h is not None and not cursor.is_acked(claim.first + i):
            yield h


class KeySharedDispatch:
    def __init__(self, root: StorageRoot, topic: TopicName, subscription: str, consumer_id: str, leases: LeaseStore):
        self._id = consumer_id
        self._leases = leases
        self._store = HashRangeStore(root, topic, subscription)
        self._ranges = RangeSet()
        self._lock = threading.Lock()
        self._adopted = 0.0

    def _adopt(self, r: HashRanges) -> None:
        with self._lock:
            self._ranges = RangeSet(r.ranges_of(self._id))
            self._adopted = time.monotonic()

    def ranges(self) -> list[tuple[int, int]]:
        with self._lock:
            return self._ranges.ranges()

    def join(self) -> None:
        """Take a share of the hash space; consumers whose presence ran out (killed) leave it first."""
        current = self._store.current()
        live = set(self._leases.live_members())
        gone = [c for c in current.consumers() if c not in live and c != self._id]
        if gone:
            log.info("Key_Shared subscription %r: consumers %s are gone; their hash ranges are handed on",
                     self._store.subscription, gone)
        self._adopt(self._store.join(self._id, gone))

    def refresh(self) -> None:
        """Renewal tick: rejoin if dropped, drop gone consumers, follow others' joins and leaves."""
        current = self._store.current()
        live = set(self._leases.live_members())
        if self._id not in current.consumers() or any(c not in live for c in current.consumers() if c != self._id):
            self.join()
        else:
            self._adopt(current)

    def leave(self) -> None:
        self._store.leave(self._id)
        self._adopt(HashRanges())

    def fetch(self, part: PartitionState, cursor: CursorState, busy: RangeSet, limit: int, nacked: set[int],
              max_messages: int, expires_ms: int) -> tuple[list[Message], list[int]]:
        """The messages this consumer claimed on ``part``, and the offsets without a message in the
        window (markers, aborted data) to acknowledge as passed."""
        if time.monotonic() - self._adopted >= RANGES_EVERY_S:
            current = self._store.current()
            if self._id in current.consumers():  # else the renewal tick rejoins
                self._adopt(current)
        mine = self._ranges_snapshot()
        start = cursor.mark_delete + 1
        end = min(limit, start + WINDOW)
        if not mine or start >= end:
            return [], []
        records = Records(part.visible.visible(part.visible.log.read(start, end)), part.message_topic or str(part.topic.base),
                          part.index)
        hash_of = {o: sticky_key_hash(k) for o, k in zip(records.offsets, records.column("key"), strict=True)}
        t = now_ms()
        claims = part.store.claims(refresh=False)
        own, taken, blocked = RangeSet(), RangeSet(), set()
        for cl in claims:
            if cl.consumer == self._id:
                own.add_range(cl.first, cl.last)  # ours whatever our clock says (receiving._claim)
            elif cl.expires_ms <= t:
                continue
            else:
                taken.add_range(cl.first, cl.last)
                blocked.update(in_flight(cl, cursor))
        pending = cursor.pending_offsets()
        for a, b in pending.ranges():
            for o in range(max(a, start), min(b, end - 1) + 1):
                if o not in own and o in hash_of:
                    blocked.add(hash_of[o])
        blocked.update(hash_of[o] for o in nacked if o in hash_of)
        take: list[int] = []
        skipped: list[int] = []
        for o in busy.gaps(start, end):
            h = hash_of.get(o)
            if h is None:
                if o not in taken:
                    skipped.append(o)
                continue
            if o in taken:
                blocked.add(h)  # another consumer's (a claim from before hashes were kept)
                continue
            if h in blocked or h not in mine:
                continue
            take.append(o)
            if len(take) >= max_messages:
                break
        if not take:
            return [], skipped
        got = self._claim(part, cursor, take, hash_of, expires_ms)
        index = {o: i for i, o in enumerate(records.offsets)}
        return [Message(records, index[o], o) for o in got], skipped

    def _ranges_snapshot(self) -> RangeSet:
        with self._lock:
            return self._ranges

    def _claim(self, part: PartitionState, cursor: CursorState, take: list[int], hash_of: dict[int, int],
               expires_ms: int) -> list[int]:
        """Claim ``take`` with its hashes, re-checking the latest claims: an offset another consumer
        took meanwhile, or a key it has in flight, is left (and the rest of that key with it)."""
        def change(claims: list[Claim]) -> tuple[list[Claim], list[int]]:
            t = now_ms()
            claims = [c for c in claims if c.last > cursor.mark_delete]
            others = [c for c in claims if c.expires_ms > t and c.consumer != self._id]
            taken = RangeSet((c.first, c.last) for c in others)
            blocked = {h for c in others for h in in_flight(c, cursor)}
            got = []
            for o in take:
                if o in taken or hash_of[o] in blocked:
                    blocked.add(hash_of[o])
                    continue
                got.append(o)
            own = [c for c in claims if c.consumer == self._id]  # ours whatever our clock says (receiving._claim)
            held = RangeSet((c.first, c.last) for c in own)  # kept through a redelivery: not claimed twice
            new = [Claim(self._id, a, b, expires_ms, tuple(hash_of[o] for o in range(a, b + 1)))
                   for a, b in RangeSet.of([o for o in got if o not in held]).ranges()]
            return others + own + new, got

        return part.store.update_claims(change)
