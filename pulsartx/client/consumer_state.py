"""What every part of a consumer shares: its types and per-partition state.

The consumer is one object whose concerns live in separate modules: receiving (dispatch from
storage), acknowledgement (plain, cumulative, transactional) and redelivery (negative acks,
redelivery, the unacked timeout). They work on the state declared here, set up by
:class:`pulsartx.client.consumer.Consumer`.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from pulsartx import forks
from pulsartx.buffer.reads import VisibilityReader
from pulsartx.client.idle import IdleWait
from pulsartx.client.message import Message
from pulsartx.exceptions import AlreadyClosed, NotAllowedError
from pulsartx.naming import TopicName
from pulsartx.storage.delta import NextCommit
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.leases import TAKEN, LeaseStore
from pulsartx.subscription.store import SubscriptionStore

log = logging.getLogger("pulsartx.client.consumer")

if TYPE_CHECKING:
    from pulsartx.client.client import Client
    from pulsartx.client.dead_letter import DeadLetters
    from pulsartx.client.key_shared import KeySharedDispatch


class ConsumerType(Enum):
    Exclusive = 0
    Shared = 1
    Failover = 2
    KeyShared = 3


# Types whose consumers share the subscription, each claiming the messages it takes.
CLAIMING = frozenset({ConsumerType.Shared, ConsumerType.KeyShared})

# Exclusive, Failover: the share of a lease period, from the start of its last take or renewal, during
# which a partition's messages may go out. Renewals come every third of the period; the rest is margin for a
# slow renewal and for clocks that disagree between processes, since another consumer takes the
# lease once its expiry has passed by its own clock.
DELIVERY_SHARE = 0.75


class InitialPosition(Enum):
    Latest = 0
    Earliest = 1


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(eq=False)  # identity: used as a dict key
class PartitionState:
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
    # The cursor log's next commit as of before the last cursor read: what an idle receive() awaits.
    cursor_commit: NextCommit | None = None
    message_topic: str = ""  # what Message.topic_name() says (pulsartx.naming.message_topic)
    # Held from a fetch until what it took is queued or held: receive() may be called from several
    # threads, and two fetches at once would both take the offsets neither had marked yet.
    fetching: threading.Lock = field(default_factory=threading.Lock, repr=False)
    incarnation: str = ""  # the subscription's life this consumer opened (CursorState.incarnation)
    # The cursor's reset epoch as this consumer last read it: what ``acks``, ``cumulative`` and
    # ``redeliver`` were made against (CursorState.reset_epoch).
    reset_epoch: int = 0
    # Failover on a partitioned topic: whether this consumer is the partition's active consumer.
    # Exclusive and Failover: until when (``time.monotonic()``) its lease lets it deliver without a
    # renewal. Shared and Key_Shared consumers own each of their partitions for good.
    owned: bool = True
    lease_until: float = math.inf

    def owns(self, cursor: CursorState) -> bool:
        """Whether ``cursor`` is still the subscription this consumer opened. A subscription deleted
        under a live consumer (``delete_subscription(force=True)``) may be re-created with the same
        name: that one is not this consumer's, and its acks, pending acks and deliveries, all for
        the deleted one, must not touch it. A cursor without an incarnation was last written by a
        version that did not record one (it drops the field): taken as this consumer's, so that
        such a process sharing the root does not stop every consumer of the subscription."""
        return not cursor.deleted and (cursor.incarnation == self.incarnation or not cursor.incarnation)

    @staticmethod
    def reset_since(epoch: int, cursor: CursorState) -> bool:
        """Whether ``cursor`` was reset since this consumer read it at ``epoch``: what it grouped
        then is for the position the reset replaced. Epochs only grow, so a stale read is never
        taken for a reset. A cursor last written by a version that does not record the epoch reads
        as epoch 0 (it drops the field, as the incarnation): not a reset either, and the resets
        after it are seen once the count passes what the consumer saw."""
        return cursor.reset_epoch > epoch

    @property
    def index(self) -> int:
        assert self.topic.partition is not None
        return self.topic.partition


class ConsumerCore:
    """The state the consumer's concerns share (set in ``Consumer.__init__``)."""

    _client: Client
    _topic: str
    _subscription: str
    _type: ConsumerType
    _name: str
    _id: str
    _queue_size: int
    _unacked_timeout: int | None
    _nack_delay: float
    _lease_ms: int
    _group_s: float
    _lock: threading.RLock
    _flush_lock: threading.Lock
    _idle: IdleWait
    _local_change: threading.Event  # set when this consumer's own state made a message deliverable
    _closed: bool
    _made: int  # forks.stamp() when made: a forked child must not receive or ack as this consumer
    _active: bool
    # Failover on a partitioned topic: an active consumer per partition (its lease
    # ``partition_lease(i)``), not one for the subscription (docs/design/failover-per-partition.md).
    _per_partition: bool
    _lease_key: str  # Exclusive, and Failover on a topic of one partition: the lease it takes
    _leases: LeaseStore
    _parts: list[PartitionState]
    _rr: int
    _key_shared: KeySharedDispatch | None  # Key_Shared only
    _dead_letters: DeadLetters | None
    # Shared, Key_Shared: when claims kept for a pending redelivery (its count not stored yet, its
    # negative-ack delay not over) are due to be released; None when none are kept.
    _release_at: float | None

    def _may_deliver(self, part: PartitionState) -> bool:
        """Whether a message of ``part`` may go out now: not while another consumer may be the
        partition's active one (Exclusive, Failover: its lease may have run out). Called under the lock, which a
        hand-off holds while it drops what was queued."""
        return part.owned and (part.lease_until == math.inf or time.monotonic() < part.lease_until)

    def _took_single_lease(self, took: str, start: float) -> None:
        """Exclusive, and Failover with one lease for the subscription (a topic of one partition, a
        partition by name): its messages go out only within DELIVERY_SHARE of the lease from
        ``start``, as under per-partition leases, so a consumer whose renewal stalls stops before
        another can take the lease (an Exclusive subscriber once it ran out, a Failover standby). A
        lease taken back after it ran out (``TAKEN``) drops what was queued or held under
        it: another consumer may have been active and delivered it meanwhile."""
        lapsed = False
        for part in self._parts:
            with part.fetching, self._lock:
                if took == TAKEN:
                    part.queue.clear()
                    part.held.clear()
                    part.nacked.clear()
                    part.cursor = None
                lapsed = lapsed or part.lease_until <= time.monotonic()
                part.lease_until = start + self._lease_ms * DELIVERY_SHARE / 1000.0
        if lapsed:
            self._local_change.set()  # a waiting receive() may deliver what it queued again

    def _check_open(self) -> None:
        if self._made != forks.generation:
            forks.check(self._made, f"consumer {self._name} of subscription {self._subscription!r} on {self._topic}")
        if self._closed:
            raise AlreadyClosed(f"consumer {self._name} on {self._topic} is closed")

    def _see_reset(self, part: PartitionState, cursor: CursorState) -> bool:
        """Take in a reset of ``cursor`` this consumer had not seen yet (an operator's
        ``reset_subscription``, another consumer's ``seek``). What it grouped and has not persisted
        was made against the position the reset replaced: dropped, with the delays of its negative
        acknowledgements, as the reset redelivers from its own position. Queued and held messages
        stay (docs/semantics.md, "Administration under live consumers"). True if it was new here."""
        if not part.reset_since(part.reset_epoch, cursor):
            return False
        with self._lock:
            if not part.reset_since(part.reset_epoch, cursor):
                return False
            acks, cum, bumps = part.acks, part.cumulative, part.redeliver
            part.acks, part.cumulative, part.redeliver = [], None, []
            part.nacked.clear()
            part.reset_epoch = cursor.reset_epoch
        if acks or cum is not None or bumps:
            log.info("consumer %s: subscription %r on %s was reset; dropping what was grouped before it "
                     "(%d acknowledgements, cumulative to %s, %d redelivery-count rises)",
                     self._name, self._subscription, part.topic, len(acks), cum, len(bumps))
        return True

    def _require_own(self, part: PartitionState, cursor: CursorState) -> None:
        """Refuse a change to a cursor this consumer did not open (:meth:`PartitionState.owns`)."""
        if not part.owns(cursor):
            raise NotAllowedError(f"subscription {self._subscription!r} on {part.topic} was deleted under consumer "
                                  f"{self._name} (it may have been re-created since, as another subscription): "
                                  "close this consumer and subscribe again")
