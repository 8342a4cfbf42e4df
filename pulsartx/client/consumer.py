"""Consumer, with pulsar-client's names: durable subscriptions, acknowledgements (plain,
cumulative, negative, transactional), redelivery, and Exclusive / Failover / Shared types.

There is no broker to dispatch, so each consumer dispatches to itself from storage:
  * what it may deliver on a partition is every visible offset above the cursor's mark-delete
    position that is not acked, not in PENDING_ACK, not held by itself and, for Shared, not
    claimed by another live consumer (``store.py`` keeps claims with expiries);
  * offsets it can never deliver (markers, aborted or left-out transactional data) are
    acknowledged as it passes them, so the mark-delete position keeps moving, as Pulsar does;
  * plain acks are grouped and persisted every ``acknowledgment_group_time_ms`` (Pulsar's ack
    grouping); transactional acks are durable in the pending-ack store before the call returns.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from pulsartx.buffer.reads import VisibilityReader, check_isolation
from pulsartx.buffer.state import key_txn, txn_key
from pulsartx.client.message import Message, Records
from pulsartx.client.reader import FETCH_MAX, POLL_MAX_S, POLL_MIN_S
from pulsartx.coordinator.state import Subscription
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import (
    AlreadyClosed,
    InvalidConfiguration,
    NotAllowedError,
    PulsarException,
    StorageError,
    Timeout,
    TransactionConflict,
)
from pulsartx.log.message_id import MessageId
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName, check_subscription_name
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.leases import LeaseStore
from pulsartx.subscription.ranges import RangeSet
from pulsartx.subscription.resolution import pending_keys, resolve_pending
from pulsartx.subscription.store import Claim, SubscriptionStore, shared_store

if TYPE_CHECKING:
    from pulsartx.client.client import Client

log = logging.getLogger(__name__)
RESOLVE_EVERY_S = 0.5
REDELIVER_ATTEMPTS = 5  # returning an aborted transaction's acks on redelivery, through storage faults
SETTLE_WAIT_S = 10.0  # for this process's completion of a decided predecessor, before asking its TC


class ConsumerType(Enum):
    Exclusive = 0
    Shared = 1
    Failover = 2
    KeyShared = 3


class InitialPosition(Enum):
    Latest = 0
    Earliest = 1


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(eq=False)  # identity: used as a dict key
class _Partition:
    """One partition of the subscription, as this consumer sees it."""

    topic: TopicName
    store: SubscriptionStore
    visible: VisibilityReader
    queue: deque[Message] = field(default_factory=deque)
    held: dict[int, float] = field(default_factory=dict)  # delivered, unacked: offset -> delivery time
    nacked: dict[int, float] = field(default_factory=dict)  # offset -> redeliver-not-before (monotonic)
    acks: list[int] = field(default_factory=list)  # grouped plain acks not yet persisted
    cumulative: int | None = None
    redeliver: list[int] = field(default_factory=list)  # redelivery-count bumps not yet persisted
    # Acks taken by a flush whose cursor write has not landed: still not deliverable meanwhile.
    inflight: list[int] = field(default_factory=list)
    inflight_cumulative: int | None = None
    inflight_redeliver: list[int] = field(default_factory=list)
    cursor: CursorState | None = None
    last_resolve: float = 0.0

    @property
    def index(self) -> int:
        assert self.topic.partition is not None
        return self.topic.partition


class Consumer:
    def __init__(self, client: Client, topic: str, subscription_name: str,
                 consumer_type: ConsumerType = ConsumerType.Exclusive,
                 initial_position: InitialPosition = InitialPosition.Latest, isolation_level: str = "READ_COMMITTED",
                 receiver_queue_size: int = 1000, unacked_messages_timeout_ms: int | None = None,
                 negative_ack_redelivery_delay_ms: int = 60000, consumer_name: str | None = None,
                 lease_ms: int = 10_000, acknowledgment_group_time_ms: int = 100, **_ignored: Any):
        check_subscription_name(subscription_name)
        if not isinstance(consumer_type, ConsumerType):
            raise InvalidConfiguration(f"consumer_type={consumer_type!r}: use pulsartx.ConsumerType.Exclusive, "
                                       "Failover or Shared")
        if consumer_type is ConsumerType.KeyShared:
            raise InvalidConfiguration("consumer_type=KeyShared is not supported: use Exclusive, Failover or Shared")
        if not isinstance(initial_position, InitialPosition):
            raise InvalidConfiguration(f"initial_position={initial_position!r}: use pulsartx.InitialPosition.Latest "
                                       "or Earliest")
        if not isinstance(receiver_queue_size, int) or receiver_queue_size < 1:
            raise InvalidConfiguration(f"receiver_queue_size={receiver_queue_size!r}: must be a positive integer")
        if unacked_messages_timeout_ms is not None and unacked_messages_timeout_ms <= 0:
            raise InvalidConfiguration(f"unacked_messages_timeout_ms={unacked_messages_timeout_ms!r}: must be > 0 "
                                       "or None")
        if negative_ack_redelivery_delay_ms < 0 or lease_ms <= 0 or acknowledgment_group_time_ms < 0:
            raise InvalidConfiguration("negative_ack_redelivery_delay_ms and acknowledgment_group_time_ms must be "
                                       ">= 0, lease_ms > 0")
        self._client = client
        self._topic = str(TopicName.parse(topic))
        self._subscription = subscription_name
        self._type = consumer_type
        self._isolation = check_isolation(isolation_level)
        self._queue_size = receiver_queue_size
        self._unacked_timeout = unacked_messages_timeout_ms
        self._nack_delay = negative_ack_redelivery_delay_ms / 1000.0
        self._lease_ms = lease_ms
        self._group_s = acknowledgment_group_time_ms / 1000.0
        self._name = consumer_name or f"pulsartx-consumer-{uuid.uuid4().hex[:12]}"
        self._id = f"{self._name}-{uuid.uuid4().hex[:8]}"
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._closed = False
        # Before any lease: a missing topic must fail as TopicNotFound, not leave an Exclusive lease
        # behind that makes the retry fail with ConsumerBusy until the lease expires.
        partitions = client.admin.partitions_of(topic)
        self._leases = LeaseStore(client.root, TopicName.parse(topic), subscription_name)
        self._leases.register_type(consumer_type.name)
        self._active = consumer_type is ConsumerType.Shared
        try:
            if consumer_type is ConsumerType.Shared:
                self._leases.join_shared(self._id, lease_ms)
            if consumer_type is ConsumerType.Exclusive:
                self._leases.acquire_exclusive(self._id, lease_ms)
                self._active = True
            elif consumer_type is ConsumerType.Failover:
                self._active = self._leases.try_acquire(self._id, lease_ms)
            self._parts = [self._open_partition(p, initial_position) for p in partitions]
        except BaseException:
            # A subscribe that failed half-way (a storage error after the lease was taken, or one
            # whose outcome is unknown) must not leave a lease that makes the retry ConsumerBusy.
            self._drop_leases()
            raise
        self._rr = 0
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._background, name=f"pulsartx-{self._name}", daemon=True)
        self._thread.start()

    def _open_partition(self, p: TopicName, initial: InitialPosition) -> _Partition:
        store = shared_store(self._client.root, p, self._subscription)
        store.revalidate()
        vis = VisibilityReader(self._client, PartitionLog(self._client.root, p), self._isolation)
        cur = store.cursor()
        if cur is None or cur.deleted:
            start = -1 if initial is InitialPosition.Earliest else vis.end_position() - 1
            cur = store.create(start)
        return _Partition(p, store, vis, cursor=cur)

    # ---- pulsar-client API -----------------------------------------------------------------------
    def topic(self) -> str:
        return self._topic

    def subscription_name(self) -> str:
        return self._subscription

    def consumer_name(self) -> str:
        return self._name

    def is_connected(self) -> bool:
        return not self._closed

    def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; waits for one, raising :class:`Timeout` after ``timeout_millis``."""
        self._check_open()
        if self._active and len(self._parts) == 1:
            # The common case, a message already fetched: ~1 us instead of the general path's ~3.
            part = self._parts[0]
            with self._lock:
                if part.queue:
                    msg = part.queue.popleft()
                    part.held[msg._offset] = time.monotonic()
                    return msg
        msg = self._next()
        if msg is not None:
            return msg
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000.0
        sleep = POLL_MIN_S
        while True:
            msg = self._next()
            if msg is not None:
                return msg
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout(f"no message on {self._topic} (subscription {self._subscription!r}) within "
                              f"{timeout_millis} ms")
            wait = sleep if deadline is None else max(0.0, min(sleep, deadline - time.monotonic()))
            time.sleep(wait)
            sleep = min(POLL_MAX_S, sleep * 2)

    def batch_receive(self, max_num_messages: int | None = None, timeout_millis: int = 100) -> list[Message]:
        """Whatever is available within ``timeout_millis`` (at most ``max_num_messages``, default the
        receiver queue size); an empty list when nothing came (Pulsar's BatchReceivePolicy)."""
        self._check_open()
        limit = max_num_messages or self._queue_size
        out: list[Message] = []
        deadline = time.monotonic() + timeout_millis / 1000.0
        while len(out) < limit:
            try:
                msg = self._next()
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
            time.sleep(min(POLL_MIN_S * 4, max(0.0, deadline - time.monotonic())))
        return out

    def acknowledge(self, message: Message | MessageId | Iterable[Message | MessageId], txn: Any = None) -> None:
        """Acknowledge one message (or several). With ``txn`` the acks are PENDING_ACK until the
        transaction ends, durable before this returns, and may raise TransactionConflict."""
        self._check_open()
        by_part = self._group(message)
        if txn is None:
            with self._lock:
                for part, offs in by_part.items():
                    for o in offs:
                        part.held.pop(o, None)
                    part.acks.extend(offs)
            if self._group_s == 0:
                self._flush_acks()
            return
        self._txn_ack(txn, by_part, lambda c, k, offs: c.txn_ack(k, offs))

    def acknowledge_cumulative(self, message: Message | MessageId, txn: Any = None) -> None:
        """Acknowledge everything up to and including ``message`` on its partition."""
        self._check_open()
        if isinstance(message, list | tuple | set):
            raise NotAllowedError("acknowledge_cumulative takes one message or MessageId, not several")
        if self._type is ConsumerType.Shared:
            raise NotAllowedError(f"cumulative acknowledgement is not allowed on a Shared subscription "
                                  f"({self._subscription!r}): acknowledge messages individually")
        (part, offs), = self._group(message).items()
        pos = offs[0]
        if txn is None:
            with self._lock:
                for o in [o for o in part.held if o <= pos]:
                    del part.held[o]
                part.cumulative = pos if part.cumulative is None else max(part.cumulative, pos)
            if self._group_s == 0:
                self._flush_acks()
            return
        self._txn_ack(txn, {part: offs}, lambda c, k, offs: c.txn_ack_cumulative(k, offs[0]), cumulative=pos)

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Redeliver this message after ``negative_ack_redelivery_delay_ms`` (to any consumer)."""
        self._check_open()
        until = time.monotonic() + self._nack_delay
        with self._lock:
            for part, offs in self._group(message).items():
                for o in offs:
                    part.held.pop(o, None)
                    part.nacked[o] = until
                    part.redeliver.append(o)
        self._release_claims()

    def redeliver_unacknowledged_messages(self) -> None:
        """Everything delivered and not acknowledged becomes deliverable again (PENDING_ACK excluded)."""
        self._check_open()
        with self._lock:
            for part in self._parts:
                offs = list(part.held) + [m._offset for m in part.queue]
                part.redeliver.extend(part.held)
                part.held.clear()
                part.queue.clear()
                part.nacked = {o: t for o, t in part.nacked.items() if o not in offs}
        self._flush_acks()
        self._release_claims()
        # An aborted transaction's acks that are still pending (its pass over the subscription
        # failed) come back now, not when resolution next runs: else later offsets go out first.
        for part in self._parts:
            for attempt in range(REDELIVER_ATTEMPTS):
                try:
                    cursor = part.store.cursor()
                    if cursor is not None and pending_keys(cursor):
                        part.last_resolve = 0.0
                        self._resolve_pending(part, cursor, strict=True)
                        part.cursor = None
                    break
                except PulsarException as e:
                    if attempt == REDELIVER_ATTEMPTS - 1:
                        # Resolution runs again on a later fetch, but those messages would then
                        # come after newer ones: say so rather than reorder silently.
                        raise StorageError(
                            f"redelivery on {part.topic}: the acknowledgements of an aborted transaction could not "
                            f"be returned ({e}); they would come back after newer messages: call "
                            "redeliver_unacknowledged_messages() again") from e
                    log.info("returning aborted pending acks of %s on redelivery failed, retrying: %s", part.topic, e)
                    time.sleep(0.02 * (attempt + 1))

    def seek(self, message_id: MessageId) -> None:
        """Reset the subscription: the next message delivered is ``message_id`` (or the
        earliest/latest). Acknowledgement state above that position is dropped."""
        self._check_open()
        self._flush_acks()
        for part in self._parts:
            if message_id.is_earliest:
                pos = part.visible.log.index.start_offset
            elif message_id.is_latest:
                pos = part.visible.end_position()  # READ_COMMITTED end: an open transaction is not skipped
            elif message_id.partition() == part.index or len(self._parts) == 1:
                pos = message_id.offset()
            else:
                continue
            part.store.update(lambda c, pos=pos: c.reset(pos))
            with self._lock:
                part.queue.clear()
                part.held.clear()
                part.nacked.clear()
                part.cursor = None

    def unsubscribe(self) -> None:
        """Delete the subscription and its state; the consumer is closed.

        The cursor is replaced by a tombstone (a CAS, like every change) rather than its table
        removed: other handles on the table (the TC participant's cached store, other consumers,
        other processes) keep working on the table they know, where removing it left them on a
        stale snapshot of a deleted table (after a re-subscribe, a transaction's acks on the new
        subscription were then never committed). A new subscribe starts over from the tombstone."""
        self._check_open()
        self.close()

        def tombstone(c: CursorState) -> None:
            c.reset(0)
            c.deleted = True

        for part in self._parts:
            part.store.update(tombstone)
            part.store.update_claims(lambda claims: ([], None))

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._flush_acks()
            self._release_claims(all_held=True)
        finally:
            self._closed = True
            self._wake.set()
            # A lease renewal still running in the background thread would otherwise re-take the
            # lease right after the release below, blocking the next consumer for lease_ms.
            worker = getattr(self, "_thread", None)
            if worker is not None and worker.is_alive() and worker is not threading.current_thread():
                worker.join(timeout=60)
            self._drop_leases()

    def _drop_leases(self) -> None:
        try:
            if self._type is ConsumerType.Shared:
                self._leases.leave_shared(self._id)
            else:
                self._leases.release(self._id)
        except PulsarException as e:
            log.warning("releasing the lease of %s failed (it will expire): %s", self._name, e)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self):
        while True:
            yield self.receive()

    # ---- acknowledgement internals ------------------------------------------------------------------
    def _group(self, message: Any) -> dict[_Partition, list[int]]:
        items = message if isinstance(message, list | tuple | set) else [message]
        out: dict[_Partition, list[int]] = {}
        for m in items:
            if isinstance(m, Message):  # a received message: a real position, no id object needed
                out.setdefault(self._part(m._rows.partition), []).append(m._offset)
                continue
            if not isinstance(m, MessageId) or m.is_earliest or m.is_latest:
                raise InvalidConfiguration(f"cannot acknowledge {m!r}: give a received Message or its MessageId")
            out.setdefault(self._part(m.partition()), []).append(m.offset())
        return out

    def _part(self, index: int) -> _Partition:
        for p in self._parts:
            if p.index == index:
                return p
        if len(self._parts) == 1:
            return self._parts[0]
        raise InvalidConfiguration(f"partition {index} is not part of {self._topic}")

    def _txn_ack(self, txn: Any, by_part: dict[_Partition, list[int]], apply, cumulative: int | None = None) -> None:
        """ADD_SUBSCRIPTION (to the TC) and the PENDING_ACK writes (to the subscription's store) are
        appends to different tables, so they run side by side: one append of latency, not two.

        Why that is safe, though the pending ack may land before the TC lists the subscription:
        * the ack returns (or the transaction can commit) only after both landed;
        * a registration that fails (the transaction timed out, was fenced or ended; storage)
          withdraws the pending acks this call wrote, as if never made, and the error is raised;
        * a crash in between leaves pending acks of a transaction the TC does not list for this
          subscription: once the TC has ended it (a timeout aborts it), consumer-side resolution
          returns them (``_resolve_pending``), as the TC's participant call would have."""
        txn._check_usable()
        subs = {Subscription(str(part.topic), self._subscription) for part in by_part}
        written = txn._written
        registering = txn._register_subscriptions(subs)
        if not written:
            # The transaction's NEW entry goes with this registration: until it lands no TC knows the
            # transaction, and a pending ack written first could be taken for a dead one's.
            for fut in registering:
                fut.result()
            registering = []
        k = txn_key(*txn.id.as_tuple())
        released: dict[_Partition, dict[int, float]] = {}  # per partition written: what left `held`
        failed = True
        try:
            for part, offs in by_part.items():
                try:
                    try:
                        part.store.update(lambda c, offs=offs: apply(c, k, offs))
                    except TransactionConflict:
                        if not self._settle_decided(part, k):
                            raise
                        part.store.update(lambda c, offs=offs: apply(c, k, offs))
                except TransactionConflict as e:
                    txn._mark_conflict(e)
                    raise
                with self._lock:
                    gone = [o for o in part.held if o <= cumulative] if cumulative is not None else offs
                    released[part] = {o: part.held.pop(o) for o in gone if o in part.held}
                    part.cursor = None
            failed = False
        finally:
            for fut in registering:
                self._await_registration(txn, fut, by_part, released, cumulative, raise_error=not failed)

    def _await_registration(self, txn: Any, registering: Any, by_part: dict[_Partition, list[int]],
                            released: dict[_Partition, dict[int, float]], cumulative: int | None,
                            raise_error: bool) -> None:
        try:
            registering.result()
        except Exception as e:
            # The TC will not end what this call wrote: take it back (only this call's acks, and as
            # if never made: the messages stay with this consumer, no redelivery is counted).
            k = txn_key(*txn.id.as_tuple())
            for part, held in list(released.items()):
                offs = [] if cumulative is not None else by_part[part]
                try:
                    part.store.update(lambda c, offs=offs: c.withdraw(k, offs, cumulative))
                except PulsarException as undo:  # resolution returns them once the TC ended the txn
                    log.warning("taking back the pending acks of %s on %s after its failed registration "
                                "failed (they return when the transaction ends): %s", txn.id, part.topic, undo)
                    continue
                del released[part]  # several registrations to wait for: take back once
                with self._lock:  # held again, as before the call
                    for o, t in held.items():
                        part.held.setdefault(o, t)
                    part.cursor = None
            if raise_error:
                raise e from None
            log.debug("registration of %s's subscription also failed: %s", txn.id, e)

    def _flush_acks(self) -> None:
        # One flush at a time: the background thread and the caller's (close, seek, redeliver,
        # acknowledgment_group_time_ms=0) would otherwise overwrite each other's in-flight lists.
        with self._flush_lock:
            self._flush_acks_locked()

    def _flush_acks_locked(self) -> None:
        for part in self._parts:
            with self._lock:
                acks, cum, bumps = part.acks, part.cumulative, part.redeliver
                part.acks, part.cumulative, part.redeliver = [], None, []
                part.inflight, part.inflight_cumulative, part.inflight_redeliver = acks, cum, bumps
            if not acks and cum is None and not bumps:
                continue

            def apply(c: CursorState, acks=acks, cum=cum, bumps=bumps) -> None:
                if bumps:
                    c.bump_redelivery([o for o in bumps if not c.is_acked(o)])
                if acks:
                    c.ack(acks)
                if cum is not None:
                    c.ack_cumulative(cum)

            try:
                part.cursor = part.store.update(lambda c, f=apply: (f(c), c)[1])
            except PulsarException as e:  # keep them for the next flush: an ack is never dropped
                log.warning("persisting acknowledgements of %s failed, will retry: %s", self._name, e)
                with self._lock:
                    part.acks[:0] = acks
                    part.redeliver[:0] = bumps
                    if cum is not None:
                        part.cumulative = cum if part.cumulative is None else max(part.cumulative, cum)
            finally:
                with self._lock:
                    part.inflight, part.inflight_cumulative, part.inflight_redeliver = [], None, []

    # ---- dispatch ---------------------------------------------------------------------------------
    def _next(self) -> Message | None:
        if not self._ensure_active():
            return None
        with self._lock:
            n = len(self._parts)
            for i in range(n):
                part = self._parts[(self._rr + i) % n]
                if part.queue:
                    self._rr = (self._rr + i + 1) % n
                    msg = part.queue.popleft()
                    part.held[msg._offset] = time.monotonic()
                    return msg
        for part in self._parts:
            self._fill(part)
        with self._lock:
            ready = [p for p in self._parts if p.queue]
            if not ready:
                return None
            part = ready[0] if len(ready) == 1 else min(ready, key=lambda p: (p.queue[0].publish_timestamp(), p.index))
            msg = part.queue.popleft()
            part.held[msg._offset] = time.monotonic()
            return msg

    def _ensure_active(self) -> bool:
        if self._active:
            return True
        if self._leases.try_acquire(self._id, self._lease_ms):
            log.info("consumer %s is now the active consumer of %r", self._name, self._subscription)
            self._active = True
            for part in self._parts:
                part.cursor = None
        return self._active

    def _fill(self, part: _Partition) -> None:
        if part.queue:
            return
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
        cursor = part.store.cursor()
        if cursor is None or cursor.deleted:
            return
        part.cursor = cursor
        self._resolve_pending(part, cursor)
        limit = part.visible.end_position()
        busy = cursor.unavailable()
        for a, b in local.ranges():
            busy.add_range(a, b)
        for cum in cums:
            busy.add_range(cursor.mark_delete + 1, cum)
        if self._type is ConsumerType.Shared:
            # Skip what other live consumers claimed (as of the same snapshot; _claim re-checks):
            # otherwise the first ``receiver_queue_size`` offsets, held by another consumer, would
            # be the only candidates and this consumer would starve behind it.
            t = _now_ms()
            for cl in part.store.claims(refresh=False):
                if cl.consumer != self._id and cl.expires_ms > t:
                    busy.add_range(cl.first, cl.last)
        candidates = list(busy.gaps(cursor.mark_delete + 1, limit, min(self._queue_size, FETCH_MAX)))
        if not candidates:
            return
        if self._type is ConsumerType.Shared:
            candidates = self._claim(part, candidates, cursor.mark_delete)
            if not candidates:
                return
        table = part.visible.log.read(candidates[0], candidates[-1] + 1)
        records = Records(part.visible.visible(table), str(part.topic.base), part.index)
        if candidates[-1] - candidates[0] + 1 == len(candidates):  # no gap: every record read is wanted
            msgs = [Message(records, i, o) for i, o in enumerate(records.offsets)]
        else:
            wanted = set(candidates)
            msgs = [Message(records, i, o) for i, o in enumerate(records.offsets) if o in wanted]
        skipped = []
        if len(msgs) < len(candidates):
            delivered = {m._offset for m in msgs}
            skipped = [o for o in candidates if o not in delivered and o < limit]
        if cursor.redelivery:
            for m in msgs:
                m._redelivery_count = cursor.redelivery_count(m._offset)
        with self._lock:
            if skipped:
                part.acks.extend(skipped)  # markers and invisible data: acked as we pass them
            part.queue.extend(msgs)

    def _settle_decided(self, part: _Partition, own: int) -> bool:
        """Apply here the outcome of decided transactions whose pending acks are in the way of
        ``own``'s (a commit returns at its decision, and its acknowledgements are committed on the
        subscription just after): this process's completions are waited for, others' decisions read
        from their TCs. True if anything changed, so the acknowledgement is worth trying again."""
        cursor = part.store.cursor()
        keys = pending_keys(cursor, exclude=[own]) if cursor is not None else set()
        if not keys:
            return False
        tcs = self._client._coordinators()
        tcs.completer.wait([TxnID(*key_txn(k)) for k in keys], timeout_s=SETTLE_WAIT_S)
        cursor = part.store.cursor()
        left = pending_keys(cursor, exclude=[own]) if cursor is not None else set()
        if left != keys:
            return True
        return resolve_pending(self._client.root, tcs, str(part.topic), self._subscription, left, roll_forward=True) > 0

    def _resolve_pending(self, part: _Partition, cursor: CursorState, strict: bool = False) -> None:
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
                        strict=strict)

    def _claim(self, part: _Partition, candidates: list[int], mark_delete: int) -> list[int]:
        """Shared: atomically claim the candidates no other live consumer holds. Claims expire
        (after the unacked timeout, else the lease period), so a dead consumer's messages return."""
        expires = _now_ms() + (self._unacked_timeout or self._lease_ms)

        def change(claims: list[Claim]) -> tuple[list[Claim], list[int]]:
            t = _now_ms()
            claims = [c for c in claims if c.last > mark_delete]  # fully acknowledged: nothing to hold
            live = [c for c in claims if c.expires_ms > t and c.consumer != self._id]
            taken = RangeSet((c.first, c.last) for c in live)
            mine = [o for o in candidates if o not in taken]
            ranges = RangeSet.of(mine).ranges()
            own = [c for c in claims if c.consumer == self._id and c.expires_ms > t]
            return live + own + [Claim(self._id, a, b, expires) for a, b in ranges], mine

        return part.store.update_claims(change)

    def _renew_claims(self) -> None:
        """Shared: a live consumer keeps its live claims (what it holds or has queued), so they
        expire only when it dies; its own unacked timeout releases them otherwise. Without this, a
        message held longer than one claim period went to a second consumer while the first still
        held it, with no redelivery counted."""
        expires = _now_ms() + (self._unacked_timeout or self._lease_ms)

        def change(claims: list[Claim]) -> tuple[list[Claim], None]:
            t = _now_ms()
            return [Claim(c.consumer, c.first, c.last, expires) if c.consumer == self._id and c.expires_ms > t
                    else c for c in claims], None

        for part in self._parts:
            part.store.update_claims(change)

    def _release_claims(self, all_held: bool = False) -> None:
        """Shared: give up claims on what this consumer no longer holds (or everything, on close)."""
        if self._type is not ConsumerType.Shared:
            return
        for part in self._parts:
            with self._lock:
                keep = set() if all_held else set(part.held) | {m._offset for m in part.queue}

            def change(claims: list[Claim], keep=keep) -> tuple[list[Claim], None]:
                out = [c for c in claims if c.consumer != self._id]
                mine = RangeSet.of(keep)
                out += [Claim(self._id, a, b, c.expires_ms) for c in claims if c.consumer == self._id
                        for a, b in mine.ranges() if c.first <= a and b <= c.last]
                return out, None

            try:
                part.store.update_claims(change)
            except PulsarException as e:
                log.debug("releasing claims failed (they expire): %s", e)

    def _background(self) -> None:
        """Ack grouping, lease renewal and the unacked-message timeout."""
        renew_every = self._lease_ms / 3000.0
        claims_every = (self._unacked_timeout or self._lease_ms) / 3000.0
        last_renew = last_claims = time.monotonic()
        while not self._closed:
            self._wake.wait(max(0.01, self._group_s or 0.05))
            if self._closed:
                return
            try:
                self._flush_acks()
                if self._type is ConsumerType.Shared and time.monotonic() - last_renew >= renew_every:
                    last_renew = time.monotonic()
                    self._leases.join_shared(self._id, self._lease_ms)
                if self._type is ConsumerType.Shared and time.monotonic() - last_claims >= claims_every:
                    last_claims = time.monotonic()
                    self._renew_claims()
                if self._type is not ConsumerType.Shared and self._active and \
                        time.monotonic() - last_renew >= renew_every:
                    last_renew = time.monotonic()
                    if not self._leases.try_acquire(self._id, self._lease_ms):
                        log.warning("consumer %s lost its lease on %r; now standby", self._name, self._subscription)
                        self._active = False
                        with self._lock:
                            for part in self._parts:
                                part.queue.clear()
                                part.held.clear()
                self._expire_unacked()
            except Exception as e:  # the loop must survive storage hiccups
                log.warning("consumer %s background work failed: %s", self._name, e)

    def _expire_unacked(self) -> None:
        if self._unacked_timeout is None:
            return
        cutoff = time.monotonic() - self._unacked_timeout / 1000.0
        expired = False
        with self._lock:
            for part in self._parts:
                old = [o for o, t in part.held.items() if t <= cutoff]
                for o in old:
                    del part.held[o]
                part.redeliver.extend(old)
                expired = expired or bool(old)
        if expired:
            self._release_claims()

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed(f"consumer {self._name} on {self._topic} is closed")
