"""Consumer, with pulsar-client's names: durable subscriptions, acknowledgements (plain,
cumulative, negative, transactional), redelivery, and Exclusive / Failover / Shared / Key_Shared types.

There is no broker to dispatch, so each consumer dispatches to itself from storage. Its concerns
live in their own modules: :mod:`~pulsartx.client.receiving`, :mod:`~pulsartx.client.acknowledgement`,
:mod:`~pulsartx.client.redelivery` and :mod:`~pulsartx.client.tables` (Arrow tables); this one holds the subscription's lifecycle (subscribe,
leases, seek, unsubscribe, close) and the background work (ack grouping, lease renewal, the
unacked timeout).

A consumer stays with the process that made it: in a forked child it raises ForkedProcessError
(its lease and the messages it holds are the parent's; docs/design/clients-across-fork.md).
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from pulsartx import forks
from pulsartx.buffer.reads import VisibilityReader, check_isolation
from pulsartx.client.acknowledgement import Acknowledgement
from pulsartx.client.consumer_state import (
    CLAIMING,
    DELIVERY_SHARE,
    ConsumerType,
    InitialPosition,
    PartitionState,
)
from pulsartx.client.dead_letter import ConsumerDeadLetterPolicy, DeadLetters
from pulsartx.client.idle import IdleWait
from pulsartx.client.key_shared import KeySharedDispatch
from pulsartx.client.partition_updates import PartitionUpdates
from pulsartx.client.receiving import Receiving
from pulsartx.client.redelivery import Redelivery
from pulsartx.client.tables import TableConsumer
from pulsartx.exceptions import InvalidConfiguration, PulsarException
from pulsartx.log.message_id import MessageId
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName, check_subscription_name, is_partitioned, message_topic
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.leases import ACTIVE, TAKEN, LeaseStore, failover_order, partition_lease
from pulsartx.subscription.store import shared_store
from pulsartx.suggest import checked_keywords

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pulsartx.client.client import Client

__all__ = ["Consumer", "ConsumerDeadLetterPolicy", "ConsumerType", "InitialPosition"]

class Consumer(Receiving, Acknowledgement, Redelivery, TableConsumer):
    @checked_keywords()
    def __init__(self, client: Client, topic: str, subscription_name: str,
                 consumer_type: ConsumerType = ConsumerType.Exclusive,
                 initial_position: InitialPosition = InitialPosition.Latest, isolation_level: str = "READ_COMMITTED",
                 receiver_queue_size: int = 1000, unacked_messages_timeout_ms: int | None = None,
                 negative_ack_redelivery_delay_ms: int = 60000, consumer_name: str | None = None,
                 lease_ms: int = 10_000, acknowledgment_group_time_ms: int = 100,
                 idle_poll_max_interval_ms: int | None = None,
                 dead_letter_policy: ConsumerDeadLetterPolicy | None = None,
                 auto_update_partitions: bool = True, auto_update_partitions_interval_ms: int | None = None):
        """Made by :meth:`Client.subscribe`, whose docstring lists the keywords."""
        check_subscription_name(subscription_name)
        self._made = forks.stamp()
        self._idle = IdleWait(idle_poll_max_interval_ms, client.root)
        self._local_change = threading.Event()
        if not isinstance(consumer_type, ConsumerType):
            raise InvalidConfiguration(f"consumer_type={consumer_type!r}: use pulsartx.ConsumerType.Exclusive, "
                                       "Failover, Shared or KeyShared")
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
        self._dead_letters = None if dead_letter_policy is None else \
            DeadLetters(client, dead_letter_policy, topic, subscription_name)
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
        self._growing = threading.Lock()
        self._closed = False
        # Before any lease: a missing topic must fail as TopicNotFound, not leave an Exclusive lease
        # behind that makes the retry fail with ConsumerBusy until the lease expires.
        self._updates = PartitionUpdates(client.admin, topic, auto_update_partitions, auto_update_partitions_interval_ms)
        partitions = self._updates.partitions
        named_topic = TopicName.parse(topic)
        # Failover: one active consumer per partition on a partitioned topic, as Pulsar's broker picks
        # (docs/design/failover-per-partition.md); one for the subscription on a topic of one partition.
        self._per_partition = consumer_type is ConsumerType.Failover and named_topic.partition is None and \
            len(partitions) > 1
        self._lease_key = partition_lease(named_topic.partition) if consumer_type is ConsumerType.Failover else ACTIVE
        self._reconciling = threading.Lock()
        self._leases = LeaseStore(client.root, named_topic, subscription_name)
        self._leases.register_type(consumer_type.name)
        self._active = consumer_type in CLAIMING
        self._key_shared = None
        took: str | None = None  # Exclusive, Failover with one lease: how its take went (LeaseStore.take)
        start = time.monotonic()
        try:
            if consumer_type in CLAIMING or self._per_partition:
                self._leases.join_shared(self._id, lease_ms, consumer_type.name)
            if consumer_type is ConsumerType.KeyShared:
                self._key_shared = KeySharedDispatch(client.root, TopicName.parse(topic), subscription_name,
                                                     self._id, self._leases)
                self._key_shared.join()
            if consumer_type is ConsumerType.Exclusive:
                start = time.monotonic()
                took = self._leases.acquire_exclusive(self._id, lease_ms)
                self._active = True
            elif consumer_type is ConsumerType.Failover and not self._per_partition:
                start = time.monotonic()
                took = self._leases.take(self._id, lease_ms, self._lease_key)
                self._active = took is not None
            self._parts = [self._open_partition(p, initial_position) for p in partitions]
            if took is not None:
                self._took_single_lease(took, start)
            named = is_partitioned(topic, len(partitions))
            for part in self._parts:
                part.message_topic = message_topic(part.topic, named)
            if self._per_partition:
                self._reconcile()  # the partitions that are this consumer's now, taken before it returns
        except BaseException:
            # A subscribe that failed half-way (a storage error after the lease was taken, or one
            # whose outcome is unknown) must not leave a lease that makes the retry ConsumerBusy.
            self._drop_leases()
            raise
        self._rr = 0
        self._release_at = None
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._background, name=f"pulsartx-{self._name}", daemon=True)
        self._thread.start()

    def _open_partition(self, p: TopicName, initial: InitialPosition) -> PartitionState:
        store = shared_store(self._client.root, p, self._subscription)
        store.revalidate()
        vis = VisibilityReader(self._client, PartitionLog(self._client.root, p), self._isolation)
        cur = store.cursor()
        if cur is None or cur.deleted:
            start = -1 if initial is InitialPosition.Earliest else vis.end_position() - 1
            cur = store.create(start)
        part = PartitionState(p, store, vis, cursor=cur, incarnation=cur.incarnation, reset_epoch=cur.reset_epoch)
        if self._per_partition:  # active on it once its lease is taken (_reconcile)
            part.owned, part.lease_until = False, 0.0
        return part

    def _follow_growth(self) -> None:
        """Subscribe to the partitions a growth of the topic added, as pulsar-client's consumers do
        (``autoUpdatePartitions``). Each joins the subscription as subscribe's partitions did: the
        leases, Shared membership and Key_Shared hash ranges are the topic's, so they cover it
        already. Its cursor is the one the growth made (``update_partitioned_topic`` makes the
        topic's subscriptions on its new partitions) or, for a subscription it did not see, one
        made now at the partition's first message: its messages were all sent after the
        subscription began (the partition did not exist), and up to an interval may have passed
        since (docs/design/consumers-follow-growth.md)."""
        with self._growing:  # the background thread's check and a seek's
            self._follow_growth_once()

    def _follow_growth_once(self) -> None:
        added = self._updates.added(len(self._parts))
        if not added or self._closed or self._leases.ended:
            return
        opened = [self._open_partition(p, InitialPosition.Earliest) for p in added]
        failover = self._type is ConsumerType.Failover and TopicName.parse(self._topic).partition is None
        if failover:  # nothing of them goes out before their leases are taken
            for part in opened:
                part.owned, part.lease_until = False, 0.0
        elif self._type is ConsumerType.Exclusive:  # under the one lease, within its window
            for part in opened:
                part.lease_until = self._parts[0].lease_until
        with self._lock:
            if self._closed:
                return
            parts = self._parts + opened
            named = is_partitioned(self._topic, len(parts))
            for part in parts:
                part.message_topic = message_topic(part.topic, named)
            self._parts = parts
        if failover:
            if not self._per_partition:
                self._go_per_partition()
            self._reconcile()  # the new partitions go by the rule the others went by
        self._local_change.set()  # an idle receive() starts watching the new partitions now
        log.info("consumer %s: %s grew to %d partitions; subscription %r now receives from all of them",
                 self._name, self._topic, len(parts), self._subscription)

    def _go_per_partition(self) -> None:
        """A Failover consumer of a topic of one partition that grew: from now on an active
        consumer per partition, as for a consumer that subscribed after the growth. Partition 0's
        lease is the ``active`` row this consumer held or waited for, so it stays with whoever
        holds it until the rule moves it (a renewal, or a hand-off, in ``_reconcile``)."""
        self._leases.join_shared(self._id, self._lease_ms, self._type.name)
        with self._lock:
            first = self._parts[0]
            first.owned, first.lease_until = self._active, 0.0  # delivers again once renewed
            if not first.owned:
                first.queue.clear()
                first.held.clear()
            self._per_partition = True
            self._active = False

    def _reconcile(self) -> None:
        """Failover on a partitioned topic: renew this consumer's presence, then take, keep or hand
        off each partition by Pulsar's rule (partition ``i`` goes to the consumer at ``i mod n`` of
        the live Failover consumers in name order). Each partition changes hands only through its
        lease, a compare-and-set in storage, so two consumers whose views of who is live differ
        never both deliver it: the one the rule now names takes it once the other let it go
        (handed off, or its lease ran out). docs/design/failover-per-partition.md"""
        with self._reconciling:  # the background thread's and a seek's (growth)
            if self._closed:
                return
            if not self._leases.join_shared(self._id, self._lease_ms, self._type.name):
                log.warning("consumer %s: subscription %r was deleted; it receives nothing more, close it",
                            self._name, self._subscription)
                for part in self._parts:
                    if part.owned:
                        self._drop_partition(part)
                return
            members = failover_order([*self._leases.live_members(self._type.name), self._id])
            gained = False
            for part in list(self._parts):
                key = partition_lease(part.index)
                chosen = members[part.index % len(members)]
                if chosen != self._id:
                    if part.owned:
                        self._hand_off(part, key, chosen)
                    continue
                start = time.monotonic()
                took = self._leases.take(self._id, self._lease_ms, key)
                if took is not None:
                    if took == TAKEN and part.owned:
                        # Its lease had run out (a pause, a slow store): another consumer may have
                        # been active there meanwhile and delivered what this one had queued.
                        self._drop_partition(part)
                    with self._lock:
                        gained = gained or not part.owned or part.lease_until <= time.monotonic()
                        if not part.owned:
                            part.owned, part.cursor = True, None
                            log.info("consumer %s is now the active consumer of %s on subscription %r", self._name,
                                     part.topic, self._subscription)
                        part.lease_until = start + self._lease_ms * DELIVERY_SHARE / 1000.0
                elif part.owned:
                    log.warning("consumer %s lost its lease on %s (subscription %r); now standby there", self._name,
                                part.topic, self._subscription)
                    self._drop_partition(part)
            if gained:
                self._local_change.set()  # a waiting receive() looks at what it may deliver now

    def _drop_partition(self, part: PartitionState) -> None:
        """Stop being ``part``'s active consumer: nothing of it goes out from here on, and what was
        fetched or delivered and not acknowledged is the next active consumer's to deliver (Pulsar
        redelivers it to the new active consumer). A fetch under way finishes first."""
        with part.fetching, self._lock:
            part.owned, part.lease_until = False, 0.0
            part.queue.clear()
            part.held.clear()
            part.nacked.clear()
            part.cursor = None

    def _hand_off(self, part: PartitionState, key: str, to: str) -> None:
        """Give ``part`` up to the consumer the rule names: delivery stops, the acknowledgements
        made so far land, and only then the lease is released, so the next active consumer's first
        read of the cursor has them (no acknowledged message goes out twice). When they cannot land
        now, the lease is left to run out, and the flushes go on meanwhile."""
        self._drop_partition(part)
        self._flush_acks()
        with self._lock:
            pending = bool(part.acks or part.redeliver or part.cumulative is not None)
        if pending:
            log.warning("consumer %s: acknowledgements on %s not stored yet; its lease runs out instead of being "
                        "handed to %s", self._name, part.topic, to)
            return
        self._leases.release(self._id, key)
        log.info("consumer %s hands %s (subscription %r) to %s", self._name, part.topic, self._subscription, to)

    def topic(self) -> str:
        return self._topic

    def subscription_name(self) -> str:
        return self._subscription

    def consumer_name(self) -> str:
        return self._name

    def is_connected(self) -> bool:
        return not self._closed and not forks.forked(self._made)

    def seek(self, message_id: MessageId | int) -> None:
        """Reset the subscription, as pulsar-client: the next message delivered is ``message_id``
        (or the earliest/latest), or, given an ``int`` (milliseconds since the epoch), on every
        partition the first message published at or after that time (the partition's end when
        there is none). Acknowledgement state above that position is dropped, and so are the
        acknowledgements this consumer grouped that were not persisted before the reset (another
        thread's, made while it runs)."""
        self._check_open()
        by_time = isinstance(message_id, int) and not isinstance(message_id, bool)
        if not by_time and not isinstance(message_id, MessageId):
            raise InvalidConfiguration(f"seek({message_id!r}): give a MessageId (MessageId.earliest, "
                                       "MessageId.latest or a message's id) or a publish time in epoch milliseconds")
        if self._updates.enabled:  # a growth not seen yet: its partitions are positioned by this seek too
            self._follow_growth()
        self._flush_acks()
        for part in self._parts:
            if by_time:
                pos = part.visible.log.offset_at_time(message_id)
            elif message_id.is_earliest:
                pos = part.visible.log.index.start_offset
            elif message_id.is_latest:
                pos = part.visible.end_position()  # READ_COMMITTED end: an open transaction is not skipped
            elif message_id.partition() == part.index or len(self._parts) == 1:
                pos = message_id.offset()
            else:
                continue
            def reset(c: CursorState, pos: int = pos, part: PartitionState = part) -> CursorState:
                self._require_own(part, c)
                c.reset(pos)
                return c

            # A fetch under way read the cursor before the reset: it queues what it took first, and
            # the clear below drops it (else it queued after the clear, and messages from before
            # the position went out after seek returned). None starts until the reset is stored.
            with part.fetching:
                # Acknowledgements another thread grouped after the flush above are for the position
                # this replaces: dropped here, or at their flush if that one took them already.
                self._see_reset(part, part.store.update(reset))
                part.store.release_claims()
                with self._lock:
                    part.queue.clear()
                    part.held.clear()
                    part.nacked.clear()
                    part.cursor = None
        self._local_change.set()

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

        def tombstone_own(c: CursorState, part: PartitionState) -> bool:
            # Not a subscription of the same name re-created since this consumer's was deleted.
            if not part.owns(c):
                return False
            tombstone(c)
            return True

        ended = False
        for part in self._parts:
            if part.store.update(lambda c, part=part: tombstone_own(c, part)):
                part.store.release_claims()
                ended = True
        if ended and TopicName.parse(self._topic).partition is None and self._leases.incarnation is not None:
            # The other consumers of the subscription stop with it, leases and presences included.
            self._leases.end(self._leases.incarnation)

    def close(self) -> None:
        if self._closed:
            return
        if forks.forked(self._made):  # the parent's copy: its acks and lease are the parent's
            self._closed = True
            return
        self._closing = True  # a failed last flush says it is not retried
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
            self._drop_leases(self._unstored_leases())
            if self._dead_letters is not None:
                self._dead_letters.close()

    def _unstored_leases(self) -> set[str]:
        """The leases a closing consumer keeps, left to run out: those of partitions whose
        acknowledgements (or redelivery counts) its last flush could not store. Released, they let
        the next active consumer read the cursor at once, without them, and deliver acknowledged
        messages again; as in ``_hand_off``, the lease runs out instead, which also gives a write
        whose outcome was unknown the time to land first."""
        if self._type in CLAIMING:
            return set()
        with self._lock:
            unstored = [p for p in self._parts if p.acks or p.redeliver or p.cumulative is not None]
        if not unstored:
            return set()
        log.warning("consumer %s closes with acknowledgements on %s not stored; its lease on subscription %r runs "
                    "out (lease_ms) instead of being released, and the next consumer may receive them again",
                    self._name, ", ".join(str(p.topic) for p in unstored), self._subscription)
        if self._per_partition:
            return {partition_lease(p.index) for p in unstored}
        return {self._lease_key}

    def _drop_leases(self, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Release this consumer's leases and presence, except the leases in ``keep``."""
        try:
            if self._key_shared is not None:
                self._key_shared.leave()  # after the claims' release in close(): keys move with nothing held
            if self._type in CLAIMING:
                self._leases.leave_shared(self._id)
            elif self._per_partition:
                for key in self._leases.held_by(self._id):
                    if key not in keep:
                        self._leases.release(self._id, key)
                self._leases.leave_shared(self._id)
            elif self._lease_key not in keep:
                self._leases.release(self._id, self._lease_key)
        except PulsarException as e:
            log.warning("releasing the lease of %s failed (it will expire): %s", self._name, e)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _background(self) -> None:
        """Ack grouping, lease renewal and the unacked-message timeout."""
        renew_every = self._lease_ms / 3000.0
        claims_every = (self._unacked_timeout or self._lease_ms) / 3000.0
        # Woken at least as often as the renewals are due: an acknowledgment_group_time_ms longer
        # than a third of the lease (or of the unacked timeout) let the lease or the claims lapse,
        # and another consumer received what this one still held.
        tick = max(0.01, min(self._group_s or 0.05, renew_every, claims_every))
        last_renew = last_claims = last_flush = time.monotonic()
        while not self._closed:
            self._wake.wait(tick)
            if self._closed:
                return
            try:
                if time.monotonic() - last_flush >= self._group_s:
                    last_flush = time.monotonic()
                    self._flush_acks()
                if self._type in CLAIMING and not self._leases.ended and time.monotonic() - last_renew >= renew_every:
                    last_renew = time.monotonic()
                    if not self._leases.join_shared(self._id, self._lease_ms, self._type.name):
                        log.warning("consumer %s: subscription %r was deleted; it receives nothing more, close it",
                                    self._name, self._subscription)
                    elif self._key_shared is not None:
                        self._key_shared.refresh()
                if self._release_at is not None and time.monotonic() >= self._release_at and \
                        not any(p.redeliver for p in self._parts):
                    self._release_claims()  # once a flush stored the redelivery counts
                if self._type in CLAIMING and time.monotonic() - last_claims >= claims_every:
                    last_claims = time.monotonic()
                    self._renew_claims()
                if self._per_partition and not self._leases.ended and time.monotonic() - last_renew >= renew_every:
                    last_renew = time.monotonic()
                    self._reconcile()
                elif self._type not in CLAIMING and self._active and not self._per_partition and \
                        time.monotonic() - last_renew >= renew_every:
                    last_renew = start = time.monotonic()
                    took = self._leases.take(self._id, self._lease_ms, self._lease_key)
                    if took is not None:
                        self._took_single_lease(took, start)
                    if took is None:
                        if self._leases.ended:
                            log.warning("consumer %s: subscription %r was deleted; it receives nothing more, close it",
                                        self._name, self._subscription)
                        else:
                            log.warning("consumer %s lost its lease on %r; now standby", self._name, self._subscription)
                        self._active = False
                        for part in self._parts:
                            with part.fetching, self._lock:  # a fetch under way queues nothing after this
                                part.queue.clear()
                                part.held.clear()
                                part.nacked.clear()
                                part.cursor = None
                self._expire_unacked()
                if self._updates.due():
                    self._follow_growth()
            except Exception as e:  # the loop must survive storage hiccups
                log.warning("consumer %s background work failed: %s", self._name, e)
