"""Who may consume a subscription, without a broker: leases in storage.

``<root>/subscriptions/<tenant>/<namespace>/<topic>/<subscription>/consumers`` is a KeyedLog with
  * ``meta``: the subscription's consumer type (set by its first consumer);
  * ``active``: the Exclusive or Failover owner, with a lease expiry; on a partitioned topic, the
    Failover owner of partition 0, and ``active:<i>`` the Failover owner of partition ``i``
    (:func:`partition_lease`);
  * ``shared:<consumer>``: each live Shared or Key_Shared consumer, and each Failover consumer of a
    partitioned topic, with a lease expiry (renewed like ``active``);
  * ``incarnation``: the subscription's current life, a random id in its ``consumer`` column.
Taking or renewing the lease is a compare-and-set on ``active``. An owner renews well before
expiry; a crashed owner's lease simply runs out, so a standby (Failover) or a new consumer
(Exclusive) takes over after at most one lease period. Closing releases the lease at once.

The table outlives the subscription (it is kept by name, and a deleted topic's subscriptions are
tombstoned, not removed), so deleting a subscription ends its leases: a new ``incarnation``, and
every lease and presence row emptied. A consumer adopts the incarnation with its first lease write,
and each later take or renewal is a compare-and-set on ``incarnation`` as well as on its own row:
a consumer of a deleted subscription, still open in some process, is refused instead of holding
the lease (or a presence) of the subscription re-created under its name
(docs/design/leases-per-subscription-incarnation.md).
"""
from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pyarrow as pa

from pulsartx.exceptions import ConsumerBusy, InvalidConfiguration
from pulsartx.naming import TopicName
from pulsartx.storage.keyed_log import KeyedLog
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.store import subscription_dir

SHARED = "shared:"  # key prefix of consumers' presence rows (Shared, Key_Shared, partitioned Failover)
ACTIVE = "active"  # key of the Exclusive or Failover owner's lease (partition 0's, partitioned)
PARTITION_ACTIVE = "active:"  # key prefix of the Failover owner's lease of one partition above 0
RENEWED, TAKEN = "renewed", "taken"  # LeaseStore.take: the lease was this consumer's throughout, or not
INCARNATION = "incarnation"  # key of the row naming the subscription's current life (``consumer``)
MEMBER_TYPES = ("Shared", "KeyShared")  # the types whose consumers are present side by side
LEASE_SCHEMA = pa.schema([
    pa.field("seq", pa.int64(), False),
    pa.field("key", pa.string(), False),
    pa.field("consumer", pa.string()),
    pa.field("consumer_type", pa.string()),
    pa.field("expires_ms", pa.int64()),
    pa.field("updated_ms", pa.int64()),
])


def now_ms() -> int:
    return int(time.time() * 1000)


def _new_incarnation() -> dict[str, Any]:
    """An ``incarnation`` row naming a new life of the subscription."""
    return {"key": INCARNATION, "consumer": uuid.uuid4().hex, "consumer_type": None, "expires_ms": None,
            "updated_ms": now_ms()}


class SubscriptionEnded(Exception):
    """A lease write refused because the subscription was deleted after its consumer opened it."""


def partition_lease(index: int | None) -> str:
    """The key of the Failover lease of partition ``index`` (None: a topic addressed as one). Partition
    0's is ``active``, the one lease a consumer of a one-partition topic takes: when the topic grows,
    that consumer and those that subscribed after the growth contend for partition 0 on one row,
    whichever way each assigns partitions (docs/design/failover-per-partition.md)."""
    return ACTIVE if not index else f"{PARTITION_ACTIVE}{index}"


def is_lease(key: str) -> bool:
    return key == ACTIVE or key.startswith(PARTITION_ACTIVE)


def failover_order(consumers: list[str]) -> list[str]:
    """Pulsar's order for picking a partition's active consumer: by consumer name (a consumer id
    here is its name, a dash and 8 hex digits), then id so that equal names still sort the same in
    every process."""
    return sorted(set(consumers), key=lambda c: (c[:-9] if len(c) > 9 and c[-9] == "-" else c, c))


def consumers_table(topic: TopicName, subscription: str) -> tuple[str, ...]:
    return (*subscription_dir(topic.base, subscription), "consumers")


class LeaseStore:
    def __init__(self, root: StorageRoot, topic: TopicName, subscription: str):
        self.subscription = subscription
        self.topic = topic.base
        self.log = KeyedLog(root, consumers_table(topic, subscription), LEASE_SCHEMA,
                            key_of=lambda r: r["key"], name=f"sub-{subscription}-consumers", compact_every=100)
        self._lock = threading.RLock()
        # The subscription's life this store's consumer belongs to: None until its first lease
        # write adopts the current one.
        self.incarnation: str | None = None
        self.ended = False  # the subscription was deleted since: no lease is taken or renewed any more

    def _ensure(self) -> None:
        with self._lock:
            self.log.refresh()  # opens the log on first use

    def _cas(self, key: str, change, *, own: bool = False) -> Any:
        """``change(row)`` returns (the fields to store, result); unnamed fields take their defaults.

        ``own``: a consumer's take or renewal, made within the incarnation it adopted (the first
        one adopts the current incarnation). Raises :class:`SubscriptionEnded`, writing nothing,
        when the subscription was deleted since."""
        def step(row):
            if own:
                current = self.log.rows.get(INCARNATION)
                life = "" if current is None else current["consumer"] or ""
                if self.incarnation is not None and life != self.incarnation:
                    raise SubscriptionEnded()
            new, out = change(row)
            if own:
                out = (out, life)
            if new is None:
                return None, out
            return {"key": key, "consumer": None, "consumer_type": None, "expires_ms": None,
                    "updated_ms": now_ms(), **new}, out

        # On compaction, gone Shared consumers' rows are dropped.
        with self._lock:  # a consumer's own threads (renewal, close) share this store
            if own and self.ended:
                raise SubscriptionEnded()
            if own and self.incarnation is None:
                self._begin_incarnation()
            try:
                out = self.log.cas(key, step, what=f"subscription {self.subscription!r} lease",
                                   also=(INCARNATION,) if own else (),
                                   keep=lambda r: not r["key"].startswith(SHARED) or r["expires_ms"] > now_ms())
            except SubscriptionEnded:
                self.ended = True
                raise
            if not own:
                return out
            out, life = out
            if self.incarnation is None:
                self.incarnation = life
            return out

    def _begin_incarnation(self) -> None:
        """The subscription's first consumer names its first life (a table written before
        incarnations existed gets one the same way)."""
        self.log.cas(INCARNATION, lambda row: (None if row is not None else _new_incarnation(), None),
                     what=f"subscription {self.subscription!r} incarnation")

    def end(self, incarnation: str | None = None) -> bool:
        """The subscription was deleted: a new incarnation, so its consumers' takes and renewals are
        refused from now on, then every lease and presence row emptied. ``incarnation``: only if it is
        still that one (a consumer unsubscribing must not end a re-created subscription's leases).
        Whether it ended them."""
        with self._lock:
            def renew(row):
                if incarnation is not None and (row["consumer"] if row is not None else "") != incarnation:
                    return None, False
                return _new_incarnation(), True

            if not self.log.cas(INCARNATION, renew, what=f"subscription {self.subscription!r} incarnation"):
                return False
            # Rows written before the new incarnation landed: every later write of an old consumer is refused.
            for key, row in list(self.log.rows.items()):
                if (is_lease(key) or key.startswith(SHARED)) and row["consumer"]:
                    self._cas(key, lambda r: (None if r is None or not r["consumer"] else
                                              {"consumer": None, "consumer_type": r["consumer_type"], "expires_ms": 0},
                                              None))
            return True

    def register_type(self, consumer_type: str) -> None:
        """The first consumer fixes the subscription's type; a different type is refused while a
        lease of the old one is live (as Pulsar refuses a consumer of another type)."""
        def change(row):
            if row is None or row["consumer_type"] == consumer_type:
                return ({"consumer_type": consumer_type} if row is None else None), None
            if self._live_leases() or self._live_shared():
                raise InvalidConfiguration(
                    f"subscription {self.subscription!r} on {self.topic} is {row['consumer_type']} and has a live "
                    f"consumer; a {consumer_type} consumer cannot join it (use another subscription name)")
            return {"consumer_type": consumer_type}, None

        self._cas("meta", change)

    def _live_shared(self, consumer_type: str | None = None) -> list[str]:
        t = now_ms()
        return [r["consumer"] for k, r in self.log.rows.items()
                if k.startswith(SHARED) and r["consumer"] and r["expires_ms"] > t
                and (consumer_type is None or r["consumer_type"] == consumer_type)]

    def _live_leases(self) -> list[str]:
        t = now_ms()
        return [r["consumer"] for k, r in self.log.rows.items()
                if is_lease(k) and r["consumer"] and r["expires_ms"] > t]

    def live_members(self, consumer_type: str | None = None) -> list[str]:
        """The consumers whose presence is live (of ``consumer_type`` only, if given), as of now in storage."""
        self._ensure()
        return self._live_shared(consumer_type)

    def live_consumers(self) -> list[str]:
        """Every consumer holding a live lease or presence, each once, as of now in storage."""
        self._ensure()
        return list(dict.fromkeys(self._live_leases() + self._live_shared()))

    def join_shared(self, consumer: str, lease_ms: int, consumer_type: str = "Shared") -> bool:
        """A Shared (or Key_Shared) consumer's presence (taken and renewed like a lease): while one
        is live, a consumer of another type is refused, as for the Exclusive/Failover ``active``
        lease. False, writing nothing, once the subscription was deleted since the consumer joined."""
        try:
            self._cas(SHARED + consumer, lambda row: ({"consumer": consumer, "consumer_type": consumer_type,
                                                       "expires_ms": now_ms() + lease_ms}, None), own=True)
        except SubscriptionEnded:
            return False
        return True

    def leave_shared(self, consumer: str) -> None:
        self._cas(SHARED + consumer, lambda row: (None if row is None else {"consumer": None, "expires_ms": 0}, None))

    def try_acquire(self, consumer: str, lease_ms: int, key: str = ACTIVE) -> bool:
        """Take (or renew) the ``active`` lease (or another, ``key``: :func:`partition_lease`); False
        when another live consumer holds it, or when the subscription was deleted since this
        consumer opened it (``ended``)."""
        return self.take(consumer, lease_ms, key) is not None

    def take(self, consumer: str, lease_ms: int, key: str = ACTIVE) -> str | None:
        """As :meth:`try_acquire`, saying how: ``RENEWED`` when ``consumer`` held the lease, live,
        until this write (no other consumer can have been active meanwhile), ``TAKEN`` when it
        was free (never taken, released, or run out, this consumer's own included: another may
        have held it in between), None when it was not taken. What a consumer fetched under a
        lease that ran out is stale once it takes the lease again."""
        seen: list[str] = []  # one per attempt: a retry sees this call's own earlier write

        def change(row):
            t = now_ms()
            if row is not None and row["consumer"] and row["consumer"] != consumer and row["expires_ms"] > t:
                return None, None
            live = row is not None and row["consumer"] == consumer and row["expires_ms"] > t
            seen.append(RENEWED if live else TAKEN)
            return {"consumer": consumer, "expires_ms": t + lease_ms}, TAKEN if TAKEN in seen else RENEWED

        try:
            return self._cas(key, change, own=True)
        except SubscriptionEnded:
            return None

    def acquire_exclusive(self, consumer: str, lease_ms: int) -> str:
        """Take the ``active`` lease for an Exclusive consumer, saying how (:meth:`take`); raises
        ConsumerBusy while another live consumer holds it."""
        took = self.take(consumer, lease_ms)
        if took is None:
            holder = self.log.get("active")
            raise ConsumerBusy(
                f"subscription {self.subscription!r} on {self.topic} is Exclusive and consumer "
                f"{holder['consumer'] if holder else '?'} holds it: use another subscription name, ConsumerType.Shared "
                "or Failover, or close the other consumer")
        return took

    def release(self, consumer: str, key: str = ACTIVE) -> None:
        def change(row):
            if row is None or row["consumer"] != consumer:
                return None, None
            return {"consumer": None, "expires_ms": 0}, None

        self._cas(key, change)

    def held_by(self, consumer: str) -> list[str]:
        """The leases ``consumer`` holds (live or not), as of now in storage."""
        self._ensure()
        return [k for k, r in self.log.rows.items() if is_lease(k) and r["consumer"] == consumer]

    def holder(self, key: str = ACTIVE) -> str | None:
        self._ensure()
        row = self.log.get(key)
        if row is None or not row["consumer"] or row["expires_ms"] <= now_ms():
            return None
        return row["consumer"]


def end_leases(root: StorageRoot, topic: TopicName, subscription: str) -> None:
    """End a deleted subscription's leases (see :meth:`LeaseStore.end`), creating no table when
    no consumer ever opened it."""
    if root.exists(*consumers_table(topic, subscription), "_delta_log"):
        LeaseStore(root, topic, subscription).end()
