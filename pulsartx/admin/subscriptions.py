"""Subscription administration, after ``pulsar-admin topics subscriptions | reset-cursor | skip |
unsubscribe``: the methods of ``client.admin`` that work on durable subscriptions.

A subscription lives under ``<root>/subscriptions/<tenant>/<namespace>/<topic>/<subscription>/``:
one cursor table per partition (``partition-<i>``, see :mod:`pulsartx.subscription.store`) and the
consumers' lease table (``consumers``). Every change here goes through
:meth:`SubscriptionStore.update`, the same compare-and-set the consumers use, with the cursor's own
operations (:meth:`CursorState.reset`, :meth:`CursorState.ack_cumulative`), so an admin change and a
live consumer's acknowledgement never overwrite each other.

Deleting a subscription writes a tombstone cursor, exactly as ``Consumer.unsubscribe`` does, rather
than removing its tables: other processes may hold handles on them (see the consumer's docstring).
A later ``subscribe`` with the same name starts over from the tombstone.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pulsartx.admin.host import AdminHost
from pulsartx.buffer.reads import VisibilityReader
from pulsartx.exceptions import InvalidConfiguration, NotAllowedError, PulsarException, StorageError
from pulsartx.log.message_id import MessageId
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName, check_subscription_name
from pulsartx.storage.cli_command import cli_command
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.leases import LeaseStore, end_leases
from pulsartx.subscription.store import SubscriptionStore, subscription_dir

if TYPE_CHECKING:
    from pulsartx.log.partition import PartitionLog

SKIP_CHUNK = 10_000  # offsets read per step while looking for the next deliverable messages
MAX_SKIP_ATTEMPTS = 50


class SubscriptionNotFound(PulsarException):
    """The subscription does not exist on the topic (never created, or deleted)."""


def _partition_by_partition(what: str, stores: list[SubscriptionStore], step: Any) -> list[dict[str, Any]]:
    """``step(store)`` on each partition in turn; rows of those done. Partitions are separate
    tables, so a storage failure part-way leaves the first ones changed: the error names which,
    since retrying the whole call would apply it twice there (a skip skips again)."""
    out: list[dict[str, Any]] = []
    for store in stores:
        try:
            out.append(step(store))
        except StorageError as e:
            if not out:
                raise
            done = ", ".join(r["partition"] for r in out)
            left = ", ".join(str(s.partition) for s in stores[len(out):])
            raise StorageError(f"{what}: applied on {done} only; failed on {store.partition}: {e}. Retry on "
                               f"{left} alone (name the partition as the topic), after checking with `topics stats` "
                               f"that the failed write to {store.partition} did not land anyway") from e
    return out


class _CursorMoved(Exception):
    """The cursor went backwards (a concurrent reset) while skip was planning: plan again."""


def live_cursor(store: SubscriptionStore) -> CursorState | None:
    """The partition's cursor, or None when the subscription has none there (never created or
    deleted). Never creates a table, as ``store.cursor()`` on a missing one would."""
    if not store.exists():
        return None
    c = store.cursor()
    return None if c is None or c.deleted else c


def _subscription_dirs(root: StorageRoot, partitions: list[TopicName]) -> list[str]:
    """Names of the directories under ``<root>/subscriptions/<tenant>/<ns>/<topic>/`` that are
    subscriptions of ours (live or deleted)."""
    names = []
    for name in root.listdir("subscriptions", *partitions[0].base.path_segments()):
        try:
            check_subscription_name(name)
        except PulsarException:
            continue  # not a subscription directory of ours
        names.append(name)
    return names


def subscription_names(root: StorageRoot, partitions: list[TopicName]) -> list[str]:
    """The subscriptions with a live cursor on any of ``partitions``, sorted; deleted ones are
    left out."""
    return [name for name in _subscription_dirs(root, partitions)
            if any(live_cursor(SubscriptionStore(root, p, name)) is not None for p in partitions)]


def cursor_backlog(cursor: CursorState, start_offset: int, end_offset: int) -> int:
    """Messages not acknowledged yet: ``end - (markDelete + 1)``, minus the offsets acknowledged
    individually above the mark-delete position (offsets below ``start_offset`` no longer exist)."""
    first = max(cursor.mark_delete + 1, start_offset)
    if first >= end_offset:
        return 0
    acked = sum(min(b, end_offset - 1) - max(a, first) + 1
                for a, b in cursor.acked.ranges() if b >= first and a < end_offset)
    return end_offset - first - acked


class SubscriptionsAdmin:
    """Mixed into :class:`pulsartx.admin.Admin` (which provides ``root``, ``client`` and
    ``partitions_of``)."""

    client: AdminHost

    # ---- helpers -------------------------------------------------------------------------------------
    def _store(self, partition: TopicName, subscription: str) -> SubscriptionStore:
        return SubscriptionStore(self.client.root, partition, subscription)

    def _subscription_stores(self, topic: str, subscription: str) -> list[tuple[SubscriptionStore, CursorState]]:
        """(store, cursor) of every partition of ``topic`` where ``subscription`` exists; raises
        :class:`SubscriptionNotFound`, naming both and how to fix it, when it exists nowhere."""
        check_subscription_name(subscription)
        parts = self.partitions_of(topic)  # TopicNotFound names the topic and how to create it
        out = []
        for p in parts:
            store = self._store(p, subscription)
            c = live_cursor(store)
            if c is not None:
                out.append((store, c))
        if not out:
            t = TopicName.parse(topic)
            listing = cli_command(self.client.root, "subscriptions", "list", t)
            raise SubscriptionNotFound(
                f"subscription {subscription!r} does not exist on topic {t}: list the topic's subscriptions with "
                f"`{listing}`, or create it by subscribing (client.subscribe({str(t.base)!r}, {subscription!r}))")
        return out

    def _plog(self, partition: TopicName) -> PartitionLog:
        return PartitionLog(self.client.root, partition)

    # ---- pulsar-admin topics subscriptions ------------------------------------------------------------
    def list_subscriptions(self, topic: str) -> list[str]:
        """Names of the subscriptions on ``topic`` (on the one partition, if it names one), sorted.
        Deleted subscriptions are not listed."""
        return subscription_names(self.client.root, self.partitions_of(topic))

    # ---- pulsar-admin topics reset-cursor ---------------------------------------------------------------
    def reset_subscription(self, topic: str, subscription: str, message_id: MessageId | None = None,
                           timestamp_ms: int | None = None) -> list[dict[str, Any]]:
        """Move the subscription's cursor so that the next message delivered is:

        * ``message_id=MessageId.earliest``: the first message still stored, on every partition;
        * ``message_id=MessageId.latest``: the next one to become readable (READ_COMMITTED end, as a new
          subscription at ``InitialPosition.Latest``), on every partition;
        * ``message_id=<MessageId(p, o)>``: offset ``o`` of partition ``p`` (only that partition moves);
        * ``timestamp_ms=t``: on every partition, the first message published at or after ``t``
          (the end of the partition when there is none).

        Acknowledgement state above the new position is dropped, pending acks included (their
        transactions' commit or abort then changes nothing), and so are the plain acknowledgements
        and redelivery-count rises live consumers grouped against the old position (the reset
        starts a new reset epoch of the cursor). Returns one row per partition moved.
        """
        if (message_id is None) == (timestamp_ms is None):
            raise InvalidConfiguration(
                f"reset of subscription {subscription!r} on {topic}: give exactly one of message_id (a MessageId, "
                "MessageId.earliest or MessageId.latest) and timestamp_ms")
        if message_id is not None and not isinstance(message_id, MessageId):
            raise InvalidConfiguration(
                f"message_id={message_id!r}: must be a MessageId (MessageId.earliest, MessageId.latest or "
                "MessageId(partition, offset))")
        if timestamp_ms is not None and (not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool)):
            raise InvalidConfiguration(f"timestamp_ms={timestamp_ms!r}: must be an integer (milliseconds since the epoch)")
        stores = self._subscription_stores(topic, subscription)
        specific = message_id is not None and not message_id.is_earliest and not message_id.is_latest
        if specific:
            chosen = [(s, c) for s, c in stores if s.partition.partition == message_id.partition()]
            if not chosen and message_id.partition() == -1 and len(stores) == 1 and len(self.partitions_of(topic)) == 1:
                # A one-partition topic: Pulsar's partition index of a non-partitioned topic's message
                # (-1) means its one partition. Any other index there is a typo, refused below.
                chosen = stores
            if not chosen:
                n = self.get_partitions(topic)
                where = (f"partition {message_id.partition()} does not exist: {TopicName.parse(topic).base} has "
                         f"partitions 0..{n - 1}") if not 0 <= message_id.partition() < n else \
                    f"subscription {subscription!r} has no cursor on partition {message_id.partition()}"
                raise InvalidConfiguration(f"cannot reset subscription {subscription!r} on {TopicName.parse(topic)} to "
                                           f"{message_id}: {where}")
            stores = chosen
        out = []
        for store, _ in stores:
            plog = self._plog(store.partition)
            index = plog.refresh()
            if timestamp_ms is not None:
                pos = plog.offset_at_time(timestamp_ms)
            elif message_id.is_earliest:
                pos = index.start_offset
            elif message_id.is_latest:
                pos = self._readable_end(plog)
            else:
                pos = message_id.offset()
                if pos > index.end_offset:
                    raise InvalidConfiguration(
                        f"cannot reset subscription {subscription!r} on {store.partition} to {message_id}: the "
                        f"partition ends at offset {index.end_offset - 1}; use 'latest' to skip everything")
                pos = max(pos, index.start_offset)  # before the first stored message: the earliest
            store.update(lambda c, pos=pos: c.reset(pos))
            store.release_claims()
            out.append({"partition": str(store.partition), "subscription": subscription, "position": pos,
                        "markDeletePosition": pos - 1})
        return out

    def _readable_end(self, plog: PartitionLog) -> int:
        """The READ_COMMITTED end: everything before it is decided, everything from it on is not
        delivered yet, so a reset there skips no message of a transaction still open."""
        return VisibilityReader(self.client, plog, "READ_COMMITTED").end_position()

    # ---- pulsar-admin topics skip -------------------------------------------------------------------
    def skip_messages(self, topic: str, subscription: str, n: int) -> list[dict[str, Any]]:
        """Skip the next ``n`` deliverable messages on every partition, as ``pulsar-admin topics skip``:
        the cursor is acknowledged cumulatively up to the ``n``-th message a consumer would receive
        next (READ_COMMITTED, not acknowledged, not in PENDING_ACK), so markers and invisible data
        before it are passed too. Messages in PENDING_ACK stay pending. With fewer than ``n``
        deliverable, everything readable is skipped. Returns per partition how many were skipped."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidConfiguration(f"skip of subscription {subscription!r} on {topic}: n={n!r} must be a "
                                       "positive integer")
        def step(store: SubscriptionStore) -> dict[str, Any]:
            skipped, cursor = self._skip_partition(store, n)
            return {"partition": str(store.partition), "subscription": subscription, "skipped": skipped,
                    "markDeletePosition": cursor.mark_delete}

        return _partition_by_partition(f"skip of {n} on subscription {subscription!r}",
                                       [s for s, _ in self._subscription_stores(topic, subscription)], step)

    def _skip_partition(self, store: SubscriptionStore, n: int) -> tuple[int, CursorState]:
        vis = VisibilityReader(self.client, self._plog(store.partition), "READ_COMMITTED")
        for _ in range(MAX_SKIP_ATTEMPTS):
            c0 = store.cursor()
            if c0 is None or c0.deleted:
                raise SubscriptionNotFound(f"subscription {store.subscription!r} was deleted on {store.partition} "
                                           "while skipping")
            limit = vis.end_position()
            busy = c0.unavailable()
            targets: list[int] = []
            pos = c0.mark_delete + 1
            while pos < limit and len(targets) < n:
                upto = min(limit, pos + SKIP_CHUNK)
                rows = vis.visible(vis.log.read(pos, upto, columns=["type", "txn_most_bits", "txn_least_bits"]))
                for o in rows.column("offset").to_pylist():
                    if o not in busy:
                        targets.append(o)
                        if len(targets) == n:
                            break
                pos = upto
            # Fewer than n deliverable: skip everything readable (markers and invisible data included).
            upto_pos = targets[-1] if len(targets) == n else limit - 1

            def apply(c: CursorState, c0=c0, upto_pos=upto_pos, targets=targets) -> tuple[int, CursorState]:
                if c.deleted or c.mark_delete < c0.mark_delete:
                    raise _CursorMoved()
                skipped = sum(1 for o in targets if o <= upto_pos and not c.is_acked(o) and not c.is_pending(o))
                c.ack_cumulative(upto_pos)
                return skipped, c

            try:
                return store.update(apply)
            except _CursorMoved:
                continue
        raise NotAllowedError(f"skip on subscription {store.subscription!r} of {store.partition}: the cursor kept being "
                              "reset concurrently; retry when nothing else resets it")

    # ---- pulsar-admin topics unsubscribe ---------------------------------------------------------------
    def delete_subscription(self, topic: str, subscription: str, force: bool = False) -> dict[str, Any]:
        """Delete the subscription (all its partitions): its cursor, acknowledgements and pending
        acks are gone, and a later subscribe with the same name starts afresh.

        Refused while a consumer holds a live lease on it, unless ``force``: there is no broker to
        disconnect that consumer, which then stops receiving (its cursor is gone) until it is
        closed, and whose lease or presence ends with the subscription (a new subscription of the
        same name is free at once). A pending ack dropped here makes its transaction's commit or abort a no-op here."""
        stores = self._subscription_stores(topic, subscription)
        base = stores[0][0].partition.base
        if not force and self.client.root.exists(*subscription_dir(base, subscription), "consumers", "_delta_log"):
            leases = LeaseStore(self.client.root, base, subscription)
            live = leases.live_consumers()
            if live:
                raise NotAllowedError(
                    f"subscription {subscription!r} on {base} has {len(live)} live consumer(s) ({', '.join(live)}): "
                    "close them first, or force the deletion "
                    f"(`{cli_command(self.client.root, 'subscriptions', 'delete', base, subscription, '--force')}`, "
                    "force=True)")

        tombstone(store for store, _ in stores)
        if TopicName.parse(topic).partition is None:  # the whole subscription, not one partition's cursor
            end_leases(self.client.root, base, subscription)
        return {"topic": str(base), "subscription": subscription, "partitions": len(stores)}


def tombstone(stores: Iterable[SubscriptionStore]) -> None:
    """Delete subscriptions as ``Consumer.unsubscribe`` does: a tombstone cursor through the usual
    compare-and-set (a racing acknowledgement re-reads it) and the claims released. The tables
    stay, since other processes may hold handles on them; a later subscribe starts afresh."""
    def mark(c: CursorState) -> None:
        c.reset(0)
        c.deleted = True

    for store in stores:
        store.update(mark)
        store.release_claims()


def tombstone_topic(root: StorageRoot, partitions: list[TopicName]) -> int:
    """Delete every subscription of a topic being deleted (as Pulsar deletes them with the topic),
    leases included: a consumer left open on the old topic must not hold the lease of the
    re-created topic's subscription of the same name. Returns how many there were."""
    live = [(name, store) for name in _subscription_dirs(root, partitions) for p in partitions
            if live_cursor(store := SubscriptionStore(root, p, name)) is not None]  # each cursor read once
    tombstone(store for _, store in live)
    names = sorted({name for name, _ in live})
    for name in names:
        end_leases(root, partitions[0].base, name)
    return len(names)
