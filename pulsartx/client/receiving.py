"""Receiving: a consumer dispatches to itself from storage.

What it may deliver on a partition is every visible offset above the cursor's mark-delete position
that is not acked, not in PENDING_ACK, not held by itself and, for Shared, not claimed by another
live consumer (the subscription store keeps claims with expiries); Key_Shared adds its keys' rule
(:mod:`pulsartx.client.key_shared`). Offsets it can never deliver
(markers, aborted or left-out transactional data) are acknowledged as it passes them, so the
mark-delete position keeps moving, as Pulsar does."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from pulsartx.client.consumer_state import CLAIMING, ConsumerCore, ConsumerType, PartitionState, now_ms
from pulsartx.client.message import Message, Records
from pulsartx.client.reader import FETCH_MAX
from pulsartx.exceptions import PulsarException, Timeout
from pulsartx.storage.delta import NextCommit
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.ranges import RangeSet
from pulsartx.subscription.resolution import pending_keys, resolve_pending
from pulsartx.subscription.store import Claim

log = logging.getLogger("pulsartx.client.consumer")
RESOLVE_EVERY_S = 0.5


@dataclass
class Fetched:
    """One fetch's deliverable messages: rows of ``records`` by index, or (Key_Shared) messages
    made already; ``skipped``: offsets passed (markers, invisible data), to acknowledge."""

    cursor: CursorState
    skipped: list[int]
    records: Records | None = None
    rows: list[int] = field(default_factory=list)
    msgs: list[Message] | None = None

    def messages(self, rows: list[int] | None = None) -> list[Message]:
        """As Messages (all, or those of ``rows``)."""
        if self.msgs is not None:
            return self.msgs
        assert self.records is not None
        records, offsets = self.records, self.records.offsets
        return [Message(records, i, offsets[i]) for i in (self.rows if rows is None else rows)]


class Receiving(ConsumerCore):
    def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; waits for one, raising :class:`Timeout` after ``timeout_millis``."""
        self._check_open()
        if self._active and len(self._parts) == 1:
            # The common case, a message already fetched: ~1 us instead of the general path's ~3.
            part = self._parts[0]
            with self._lock:
                if part.queue and self._may_deliver(part):
                    msg = part.queue.popleft()
                    part.held[msg._offset] = time.monotonic()
                    return msg
        deadline = float("inf") if timeout_millis is None else time.monotonic() + timeout_millis / 1000.0
        while True:
            msg = self._next(deadline)
            if msg is not None:
                return msg
            if time.monotonic() >= deadline:
                raise Timeout(f"no message on {self._topic} (subscription {self._subscription!r}) within "
                              f"{timeout_millis} ms")
            self._wait_idle(deadline)

    def batch_receive(self, max_num_messages: int | None = None, timeout_millis: int = 100) -> list[Message]:
        """Whatever is available within ``timeout_millis`` (at most ``max_num_messages``, default the
        receiver queue size); an empty list when nothing came (Pulsar's BatchReceivePolicy)."""
        self._check_open()
        limit = max_num_messages or self._queue_size
        out: list[Message] = []
        deadline = time.monotonic() + timeout_millis / 1000.0
        while len(out) < limit:
            try:
                msg = self._next(deadline)
            except PulsarException as e:
                if not out:
                    raise
                # The messages taken are held for this caller: returned, not dropped with the error
                # (they would stay held, undelivered, while later offsets went out). A fault that
                # lasts surfaces on the next call.
                log.info("batch_receive on %s returns %d message(s); fetching more failed: %s", self._topic,
                         len(out), e)
                break
            if msg is not None:
                out.append(msg)
                continue
            if out or time.monotonic() >= deadline:
                break
            self._wait_idle(deadline)
        return out

    def _wait_idle(self, deadline: float) -> None:
        """Wait until something may have become deliverable (see :mod:`pulsartx.client.idle`), at
        most until ``deadline`` or the first negative ack's redelivery delay ends."""
        now = time.monotonic()
        with self._lock:
            nacks = [t for p in self._parts for t in p.nacked.values() if t > now]
        self._idle.wait(self._watches(), min([deadline, *nacks]), self._local_change)

    def _watches(self) -> list[NextCommit]:
        """The logs whose next commit can make a message deliverable: each partition, the TC logs
        of its undecided transactions, and the subscription's cursor log. None for a standby
        (Failover) consumer, whose only way in is the lease the full check tries to take; on a
        partitioned topic, only the partitions it is active on (taking one wakes it)."""
        if self._per_partition:
            parts = [p for p in self._parts if p.owned]
        elif not self._active:
            return []
        else:
            parts = self._parts
        out: list[NextCommit] = []
        for part in parts:
            out.extend(part.visible.next_commits())
            if part.cursor_commit is not None:
                out.append(part.cursor_commit)
        return out

    def __iter__(self):
        while True:
            yield self.receive()

    def _next(self, deadline: float = float("inf")) -> Message | None:
        if not self._ensure_active():
            return None
        with self._lock:
            n = len(self._parts)
            for i in range(n):
                part = self._parts[(self._rr + i) % n]
                if part.queue and self._may_deliver(part):
                    self._rr = (self._rr + i + 1) % n
                    msg = part.queue.popleft()
                    part.held[msg._offset] = time.monotonic()
                    return msg
        # Each partition on its own: one whose fetch fails (a storage fault that lasts) must not
        # starve the others, so its error surfaces only when no partition has anything.
        while True:
            failed: PulsarException | None = None
            passed = False
            for part in self._parts:
                try:
                    passed = self._fill(part) or passed
                except PulsarException as e:
                    failed = failed or e
            if failed is not None or not passed or time.monotonic() >= deadline:
                break
            # Only offsets passed (aborted data, markers), held locally as acks: the next fetch
            # starts after them. Waiting for a commit first would cost a wait per fetch window (one
            # per message with receiver_queue_size=1).
            with self._lock:
                if any(p.queue for p in self._parts):
                    break
        with self._lock:
            ready = [p for p in self._parts if p.queue and self._may_deliver(p)]
            if not ready:
                if failed is not None:
                    raise failed
                return None
            if failed is not None:
                log.info("receiving on %s goes on with the other partitions; a fetch failed: %s", self._topic,
                         failed)
            part = ready[0] if len(ready) == 1 else min(ready, key=lambda p: (p.queue[0].publish_timestamp(), p.index))
            msg = part.queue.popleft()
            part.held[msg._offset] = time.monotonic()
            return msg

    def _ensure_active(self) -> bool:
        if self._per_partition:  # the background thread takes and hands off partitions
            return any(p.owned for p in self._parts)
        if self._active:
            return True
        start = time.monotonic()
        took = self._leases.take(self._id, self._lease_ms, self._lease_key)
        if took is not None:
            log.info("consumer %s is now the active consumer of %r", self._name, self._subscription)
            self._active = True
            for part in self._parts:
                part.cursor = None
            self._took_single_lease(took, start)
        return self._active

    def _fill(self, part: PartitionState) -> bool:
        """Queue what a fetch takes; whether it passed offsets (a fetch after it goes further)."""
        with part.fetching:
            if part.queue:
                return False
            got = self._fetch(part)
            if got is None:
                return False
            self._enqueue(part, got.cursor, got.messages(), got.skipped)
            return bool(got.skipped)

    def _fetch(self, part: PartitionState, max_messages: int | None = None) -> Fetched | None:
        """What this consumer may deliver next on ``part`` (claimed, for Shared and Key_Shared),
        read from storage, at most ``max_messages`` (default: what the receiver queue takes, up to
        FETCH_MAX); None when nothing is. The caller holds ``part.fetching`` until it has queued or
        held what it takes."""
        if not part.owned or time.monotonic() >= part.lease_until:
            # Another consumer's partition (Failover), or its lease is due for renewal: nothing to
            # take. A hand-off waits for a fetch under way (``part.fetching``).
            return None
        most = min(self._queue_size, FETCH_MAX) if max_messages is None else max_messages
        # Local state first, the cursor after: an ack or redelivery-count bump that leaves the local
        # lists before this snapshot has landed in storage, so the cursor read below includes it.
        # (Read the other way round, a flush landing in between made an acked message deliverable
        # again, or a redelivered one carry a stale redelivery count.)
        now = time.monotonic()
        with self._lock:
            local = RangeSet.of([*part.held, *part.acks, *part.inflight, *part.redeliver, *part.inflight_redeliver])
            for o, t in list(part.nacked.items()):
                if t > now:
                    local.add(o)
                else:
                    del part.nacked[o]
            cums = [c for c in (part.cumulative, part.inflight_cumulative) if c is not None]
            recounting = _recounting(part, now)
        part.cursor_commit = part.store.log.next_commit()  # before the read: later changes are awaited
        cursor = part.store.cursor()
        if cursor is None or not part.owns(cursor):
            return None
        if self._see_reset(part, cursor):  # what it dropped was in `local`: once more without it
            return self._fetch(part, max_messages)
        part.cursor = cursor
        self._resolve_pending(part, cursor)
        limit = part.visible.end_position()
        if self._type not in CLAIMING:
            # One consumer has the partition, in offset order: a redelivered message waits for its
            # count to land (above), and nothing after it goes out meanwhile. Else, when that write
            # failed (a storage fault), later offsets went first and the redelivered ones came back
            # after them, once a later flush stored their counts. (Shared and Key_Shared give
            # redelivered messages to any consumer, out of order, as Pulsar does.)
            # docs/design/redelivery-waits-for-its-count.md
            back = [o for o in recounting if not cursor.is_acked(o) and not cursor.is_pending(o)
                    and not any(o <= c for c in cums)]
            if back:
                limit = min(limit, min(back))
        busy = cursor.unavailable()
        for a, b in local.ranges():
            busy.add_range(a, b)
        for cum in cums:
            busy.add_range(cursor.mark_delete + 1, cum)
        if self._type is ConsumerType.Shared:
            # Skip what other live consumers claimed (as of the same snapshot; _claim re-checks):
            # otherwise the first ``receiver_queue_size`` offsets, held by another consumer, would
            # be the only candidates and this consumer would starve behind it.
            t = now_ms()
            for cl in part.store.claims(refresh=False):
                if cl.consumer != self._id and cl.expires_ms > t:
                    busy.add_range(cl.first, cl.last)
        if self._key_shared is not None:
            waiting = {o for o, t in part.nacked.items() if t > now}
            msgs, skipped = self._key_shared.fetch(part, cursor, busy, limit, waiting,
                                                   min(self._queue_size, FETCH_MAX),
                                                   now_ms() + (self._unacked_timeout or self._lease_ms))
            return Fetched(self._as_claimed(part, cursor), skipped, msgs=msgs)
        window = most
        while True:
            candidates = busy.gap_list(cursor.mark_delete + 1, limit, window)
            if not candidates:
                return None
            if self._type is ConsumerType.Shared:
                candidates = self._claim(part, candidates, cursor.mark_delete)
                if not candidates:
                    return None
            table = part.visible.log.read(candidates[0], candidates[-1] + 1)
            records = Records(part.visible.visible(table), part.message_topic or str(part.topic.base), part.index)
            offsets = records.offsets
            if candidates[-1] - candidates[0] + 1 == len(candidates):  # no gap: every record read is wanted
                rows = list(range(len(offsets)))
            else:
                wanted = set(candidates)
                rows = [i for i, o in enumerate(offsets) if o in wanted]
            if rows or self._type is ConsumerType.Shared or len(candidates) < window or window >= FETCH_MAX:
                break
            # Nothing visible in a full window (an aborted run, markers): a wider one in this fetch,
            # not one fetch per receiver queue's worth of invisible offsets (a queue of one passed
            # one offset a fetch, and a receive timed out before a long aborted run ended). Shared
            # consumers keep their window: what they fetch, they claim.
            window = min(FETCH_MAX, window * 16)
        if len(rows) > most:  # a widened window: deliver what was asked, pass only what lies before the rest
            upto = offsets[rows[most]]
            rows = rows[:most]
            candidates = [o for o in candidates if o < upto]
        skipped = []
        if len(rows) < len(candidates):
            delivered = {offsets[i] for i in rows}
            skipped = [o for o in candidates if o not in delivered and o < limit]
        if self._type is ConsumerType.Shared:
            cursor = self._as_claimed(part, cursor)
        return Fetched(cursor, skipped, records, rows)

    @staticmethod
    def _as_claimed(part: PartitionState, cursor: CursorState) -> CursorState:
        """The cursor whose redelivery counts a claimed message carries: as of its claim, not as of
        the fetch's first read. Another consumer stores a raised count and only then releases its
        claim (:meth:`Redelivery._release_claims`); both could land between that read and the
        claim, and the message went out with the count from before it was given back (the
        dead-letter move one delivery late). The claim's compare-and-set refreshed the log both
        keys live in, so the cached cursor is at least as new as the claims it saw: no I/O."""
        return part.store.cursor(refresh=False) or cursor

    def _enqueue(self, part: PartitionState, cursor: CursorState, msgs: list[Message], skipped: list[int]) -> None:
        if cursor.redelivery:
            for m in msgs:
                m._redelivery_count = cursor.redelivery_count(m._offset)
            if self._dead_letters is not None:
                msgs = self._dead_letters.divert(self, msgs)
        with self._lock:
            if skipped:
                part.acks.extend(skipped)  # markers and invisible data: acked as we pass them
            part.queue.extend(msgs)

    def _resolve_pending(self, part: PartitionState, cursor: CursorState, strict: bool = False) -> None:
        """Consumer-side resolution: a pending ack of a transaction past its timeout would hold its
        messages forever if no sweeper ran, so ask the TC (which aborts it) now and then.

        A pending ack can also land *after* its transaction was aborted elsewhere (a timeout or a
        fence racing ``acknowledge(txn=...)``): the abort's pass over the subscription came too
        early to return it, and nobody would again. Apply the decided abort here (idempotent, as
        the TC's participant call)."""
        keys = pending_keys(cursor)
        if not keys or time.monotonic() - part.last_resolve < RESOLVE_EVERY_S:
            return
        part.last_resolve = time.monotonic()
        resolve_pending(self._client.root, self._client._coordinators(), str(part.topic), self._subscription, keys,
                        strict=strict, deadlines=cursor.deadlines)

    def _claim(self, part: PartitionState, candidates: list[int], mark_delete: int) -> list[int]:
        """Shared: atomically claim the candidates no other live consumer holds. Claims expire
        (after the unacked timeout, else the lease period), so a dead consumer's messages return."""
        expires = now_ms() + (self._unacked_timeout or self._lease_ms)

        def change(claims: list[Claim]) -> tuple[list[Claim], list[int]]:
            t = now_ms()
            claims = [c for c in claims if c.last > mark_delete]  # fully acknowledged: nothing to hold
            live = [c for c in claims if c.expires_ms > t and c.consumer != self._id]
            taken = RangeSet((c.first, c.last) for c in live)
            mine = [o for o in candidates if o not in taken]
            # Our own claims stay whatever our clock says of them: we are alive and hold them (an
            # expired one another consumer took over is gone from the row: its claim dropped it).
            own = [c for c in claims if c.consumer == self._id]
            held = RangeSet((c.first, c.last) for c in own)  # kept through a redelivery: not claimed twice
            ranges = RangeSet.of([o for o in mine if o not in held]).ranges()
            return live + own + [Claim(self._id, a, b, expires) for a, b in ranges], mine

        return part.store.update_claims(change)

    def _renew_claims(self) -> None:
        """Shared: a live consumer keeps its live claims (what it holds or has queued), so they
        expire only when it dies; its own unacked timeout releases them otherwise. Without this, a
        message held longer than one claim period went to a second consumer while the first still
        held it, with no redelivery counted."""
        expires = now_ms() + (self._unacked_timeout or self._lease_ms)

        def change(claims: list[Claim]) -> tuple[list[Claim], None]:
            # Every claim of ours that is still in the row, even one our clock calls expired: a
            # clock stepped forward would otherwise hand what we hold to another consumer.
            return [replace(c, expires_ms=expires) if c.consumer == self._id else c for c in claims], None

        for part in self._parts:
            part.store.update_claims(change)


def _recounting(part: PartitionState, now: float) -> list[int]:
    """Offsets given back for redelivery (``redeliver_unacknowledged_messages``, the unacked
    timeout, a negative ack whose delay is over) whose redelivery count is not stored yet: they are
    deliverable as soon as it is, so they bound what may go out before them. Called under the lock."""
    acked = {*part.acks, *part.inflight}
    return [o for o in {*part.redeliver, *part.inflight_redeliver}
            if o not in acked and part.nacked.get(o, now) <= now]
