"""Topic administration: create, delete, list, grow, partition counts.

Layout: ``<root>/topics/<tenant>/<namespace>/<topic>/`` holds ``_topic.json`` (the partition count
at creation) and one Delta table ``partition-<i>`` per partition. Creating partition-0's table is
the atomic claim (delta-rs makes version 0 a create-if-absent on every backend); ``_topic.json`` is
written last, if absent, and marks the topic complete. A crash between the two is repaired by the
next create. Growth adds ``_growth/<count>-<incarnation>.json`` markers, never rewritten: the count
is the highest of the creation count and the markers of this ``_topic.json``
(docs/design/partition-growth-markers.md).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import uuid
from typing import Any

from pulsartx import forks
from pulsartx.admin.subscriptions import cursor_backlog, live_cursor, subscription_names, tombstone_topic
from pulsartx.buffer.snapshot import topic_snapshots
from pulsartx.coordinator.registry import Coordinators
from pulsartx.exceptions import (
    CorruptedLog,
    InvalidConfiguration,
    StorageError,
    TopicAlreadyExists,
    TopicNotFound,
)
from pulsartx.log.partition import forget_shared, partition_segments, partition_table_properties
from pulsartx.log.schema import RECORD_SCHEMA
from pulsartx.maintenance.merging import wait_for_background_writes
from pulsartx.naming import TopicName, parse_namespace
from pulsartx.observe.failures import one_line, unreadable_row
from pulsartx.observe.stats import PARTITION_STATS_KEYS, partition_stats, subscription_extras
from pulsartx.storage import delta
from pulsartx.storage.cli_command import cli_command
from pulsartx.storage.retry import StorageUnavailable
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.store import SubscriptionStore, forget_shared_stores, shared_store

log = logging.getLogger(__name__)
TOPIC_META = "_topic.json"
GROWTH_DIR = "_growth"
MAX_PARTITIONS = 10_000
# The highest count this process has seen per (root, topic incarnation): a listing that lags
# behind a marker (a store whose listings are not read-after-write) never shows this process a
# count below one it already acted on. One int per incarnation seen.
_SEEN_COUNTS: forks.ProcessCache[tuple[str, str], int] = forks.ProcessCache()


def _topic_dir(t: TopicName) -> tuple[str, ...]:
    return ("topics", *t.path_segments())


def _incarnation(meta_text: str) -> str:
    """Names the ``_topic.json`` a growth marker extends: markers an update wrote after a delete
    removed that file (the update raced it) never count for a topic re-created under the name."""
    return hashlib.sha256(meta_text.encode("utf-8")).hexdigest()[:16]


def _grown_count(names: list[str], incarnation: str) -> int:
    """The highest count among the growth markers of one incarnation (0 when none)."""
    best = 0
    for name in names:
        count, _, rest = name.partition("-")
        if rest == f"{incarnation}.json" and count.isdigit():
            best = max(best, int(count))
    return best


class TopicsAdmin:
    def __init__(self, root: StorageRoot):
        self.root = root

    def create_topic(self, topic: str, partitions: int = 1) -> TopicName:
        t = self._create_topic(topic, partitions)
        log.info("created topic %s with %d partition(s)", t, partitions)
        return t

    def _create_topic(self, topic: str, partitions: int = 1) -> TopicName:
        """:meth:`create_topic` without its log line, for a caller that reports the creation in its
        own words (the client's auto-creation says how to turn it off), so it is logged once."""
        t = TopicName.parse(topic)
        if t.partition is not None:
            raise InvalidConfiguration(f"create_topic({topic!r}): give the topic name without '-partition-{t.partition}'")
        if not isinstance(partitions, int) or isinstance(partitions, bool) or not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidConfiguration(f"partitions={partitions!r} for topic {t}: must be an integer from 1 to {MAX_PARTITIONS}")
        if self._read_meta(t) is not None:
            raise TopicAlreadyExists(f"topic {t} already exists: delete it first or use it as it is")
        properties = partition_table_properties()
        claimed = delta.create_table(self.root, RECORD_SCHEMA, *partition_segments(t.with_partition(0)),
                                     configuration=properties, name=f"{t.short}-partition-0")
        if not claimed and self._read_meta(t) is not None:
            raise TopicAlreadyExists(f"topic {t} already exists: delete it first or use it as it is")
        for i in range(1, partitions):
            delta.create_table(self.root, RECORD_SCHEMA, *partition_segments(t.with_partition(i)),
                               configuration=properties, name=f"{t.short}-partition-{i}")
        # "id" makes every creation's text unique, so growth markers bound to it (their name holds
        # a hash of the text) never count for a topic re-created under the name.
        meta = {"partitions": partitions, "created_ms": int(time.time() * 1000), "format": 1, "id": uuid.uuid4().hex}
        self._publish_meta(t, json.dumps(meta))
        return t

    def _publish_meta(self, t: TopicName, text: str) -> None:
        """Write ``_topic.json`` only if no creator wrote one meanwhile. A creator whose claim lost
        and who found no marker repairs the topic as if its creator had crashed; but that creator
        may just be slow, and may publish its count, and its producers write to every partition,
        before the repairer's write: a plain put would then replace the count (4 by 1, say) and
        hide the messages already acknowledged on the partitions beyond it. The first marker
        stands; its partitions all exist, since every creator makes its tables first."""
        if not self.root.has_put_if_absent:
            self.root.write_text(text, *_topic_dir(t), TOPIC_META)
            return
        try:
            if self.root.put_if_absent(text.encode("utf-8"), *_topic_dir(t), TOPIC_META):
                return
        except (StorageError, OSError):
            # Landed or not: unknown, so the marker is read back, never guessed. Reported as a
            # failure when it had landed, the caller's retry would be told the topic exists.
            if self.root.read_text(*_topic_dir(t), TOPIC_META) is None:
                raise
        if self.root.read_text(*_topic_dir(t), TOPIC_META) != text:  # equal: ours, its first response lost
            raise TopicAlreadyExists(f"topic {t} already exists: delete it first or use it as it is")

    def ensure_topic(self, topic: str, partitions: int = 1) -> int:
        """Create the topic unless it exists (racing creators agree); returns its partition count."""
        # Created by someone else, possibly with another count: the stored one wins.
        with contextlib.suppress(TopicAlreadyExists):
            self.create_topic(topic, partitions)
        return self.get_partitions(topic)

    def _read_meta(self, t: TopicName) -> dict | None:
        text = self.root.read_text(*_topic_dir(t), TOPIC_META)
        return None if text is None else json.loads(text)

    def _count(self, t: TopicName, meta_text: str) -> int:
        """The partition count of the incarnation ``meta_text`` describes: its creation count, or
        the highest growth marker of it. A marker is written after its partitions' tables, so every
        partition below the count returned exists."""
        incarnation = _incarnation(meta_text)
        n = max(int(json.loads(meta_text)["partitions"]),
                _grown_count(self.root.listdir(*_topic_dir(t), GROWTH_DIR), incarnation))
        key = (self.root.url, incarnation)
        with _SEEN_COUNTS.lock:
            n = _SEEN_COUNTS[key] = max(n, _SEEN_COUNTS.get(key, 0))
        return n

    def _not_found(self, t: TopicName) -> TopicNotFound:
        return TopicNotFound(f"topic {t} does not exist under {self.root.url}: create it with "
                             "client.admin.create_topic() or "
                             f"`{cli_command(self.root, 'topics', 'create', t.short)}`")

    def get_partitions(self, topic: str) -> int:
        """The topic's partition count (a ``-partition-i`` name counts as one partition)."""
        return self._counted(TopicName.parse(topic))[0]

    def _counted(self, t: TopicName) -> tuple[int, str]:
        """The partition count of ``t``'s topic and the ``_topic.json`` it was read from (one
        read); TopicNotFound for a missing topic or a partition index past the count."""
        text = self.root.read_text(*_topic_dir(t.base), TOPIC_META)
        if text is None:
            raise self._not_found(t.base)
        n = self._count(t.base, text)
        if t.partition is not None and t.partition >= n:
            raise TopicNotFound(f"topic {t} does not exist: {t.base} has {n} partition(s), 0..{n - 1}")
        return n, text

    def partitions_of(self, topic: str | TopicName) -> list[TopicName]:
        """The partition names to read or write for a topic, or the one partition it names."""
        return self.partitions_and_incarnation(topic)[0]

    def partitions_and_incarnation(self, topic: str | TopicName) -> tuple[list[TopicName], str]:
        """:meth:`partitions_of`, with the incarnation of the topic they were read from (from one
        read of ``_topic.json``): a client that follows growth compares it with the one it opened,
        so a topic deleted and re-created with more partitions is never taken for a growth."""
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        n, text = self._counted(t)
        return ([t] if t.partition is not None else [t.with_partition(i) for i in range(n)]), _incarnation(text)

    def update_partitioned_topic(self, topic: str, partitions: int) -> int:
        """Grow the topic to ``partitions`` partitions (``pulsar-admin topics
        update-partitioned-topic -p N``); returns the count after the update. Only increases, as in
        Pulsar: the partitions hold offsets that readers and subscriptions refer to, so none is
        ever taken away. The new partitions' tables are made before the marker that makes the
        count visible, so no reader or producer is ever told of a partition without its table.
        Concurrent updates never lower the count: the highest marker wins, and an update whose
        count a concurrent one overtook still returns the (higher) count in force."""
        named = TopicName.parse(topic)
        if named.partition is not None:
            raise InvalidConfiguration(
                f"update_partitioned_topic({topic!r}) names one partition: give the topic name without "
                f"'-partition-{named.partition}'")
        t = named.base
        if not isinstance(partitions, int) or isinstance(partitions, bool) or not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidConfiguration(f"partitions={partitions!r} for topic {t}: must be an integer from 1 to "
                                       f"{MAX_PARTITIONS}")
        text = self.root.read_text(*_topic_dir(t), TOPIC_META)
        if text is None:
            raise self._not_found(t)
        current = self._count(t, text)
        if partitions <= current:
            raise InvalidConfiguration(
                f"topic {t} has {current} partition(s) and cannot go to {partitions}: the count only increases; "
                f"give more than {current}")
        properties = partition_table_properties()
        for i in range(current, partitions):
            # False: made by a concurrent update, or by one that failed before its marker (empty).
            delta.create_table(self.root, RECORD_SCHEMA, *partition_segments(t.with_partition(i)),
                               configuration=properties, name=f"{t.short}-partition-{i}")
        # As Pulsar's update does, the topic's subscriptions are made on the new partitions before
        # anyone can see them, at their first message: a consumer that subscribes at Latest later
        # then finds the subscription's cursor there, rather than making it at the end and skipping
        # what producers sent to the partition since the growth.
        subscriptions = subscription_names(self.root, [t.with_partition(i) for i in range(current)])
        for i in range(current, partitions):
            for name in subscriptions:
                shared_store(self.root, t.with_partition(i), name).create(-1)
        incarnation = _incarnation(text)
        marker = {"partitions": partitions, "from": current, "created_ms": int(time.time() * 1000)}
        self.root.write_text(json.dumps(marker), *_topic_dir(t), GROWTH_DIR, f"{partitions}-{incarnation}.json")
        if self.root.read_text(*_topic_dir(t), TOPIC_META) != text:
            # Deleted (maybe re-created) meanwhile: this marker belongs to no live topic and never
            # counts; the tables made for it are empty and go with the topic directory's next delete.
            raise TopicNotFound(f"topic {t} was deleted while growing to {partitions} partition(s): "
                                f"create it again with `{cli_command(self.root, 'topics', 'create', t.short)}`")
        n = self._count(t, text)
        log.info("grew topic %s from %d to %d partition(s)", t, current, n)
        return n

    def delete_topic(self, topic: str) -> None:
        """Delete the topic's data and its subscriptions (as Pulsar does): a cursor outliving its
        topic would make a re-created topic's subscriber skip the new topic's first
        mark-delete + 1 messages. Subscriptions are tombstoned like ``delete_subscription``, not
        removed, since open consumers elsewhere may still hold handles on their tables.
        A partition's name is refused: it deleted the whole topic, every partition of it."""
        named = TopicName.parse(topic)
        if named.partition is not None:
            raise InvalidConfiguration(
                f"delete_topic({topic!r}) names one partition, and a partition cannot be deleted alone: give the "
                f"topic name without '-partition-{named.partition}' to delete the whole topic, all its partitions "
                "and subscriptions")
        t = named.base
        text = self.root.read_text(*_topic_dir(t), TOPIC_META)
        if text is None:
            raise self._not_found(t)
        parts = [t.with_partition(i) for i in range(self._count(t, text))]
        subs = tombstone_topic(self.root, parts)
        # No merge or checkpoint this process's writers scheduled may land in a table being removed.
        wait_for_background_writes()
        # Remove the marker first so the topic disappears atomically for readers of metadata.
        self.root.rm(*_topic_dir(t), TOPIC_META)
        # A growth that landed since the count was read: its partitions' subscriptions go too. One
        # landing later is never seen by anyone (its updater finds the topic gone).
        grown = self._count(t, text)
        if grown > len(parts):
            subs += tombstone_topic(self.root, [t.with_partition(i) for i in range(len(parts), grown)])
        self.root.rm(*_topic_dir(t))
        # Snapshots are per table (incarnation), so a re-created topic never loads these; they go too.
        self.root.rm(*topic_snapshots(t))
        forget_shared(self.root, t)
        forget_shared_stores(self.root, t)
        log.info("deleted topic %s and its %d subscription(s)", t, subs)

    def list_topics(self, namespace: str | None = None) -> list[str]:
        """Full names of every complete topic, optionally within one ``tenant/namespace``."""
        if namespace is not None:
            tenants_ns = [parse_namespace(namespace)]
        else:
            tenants_ns = [(tn, ns) for tn in self.root.listdir("topics") for ns in self.root.listdir("topics", tn)]
        out = []
        for tn, ns in tenants_ns:
            for name in self.root.listdir("topics", tn, ns):
                if self.root.exists("topics", tn, ns, name, TOPIC_META):
                    out.append(str(TopicName(tn, ns, name)))
        return sorted(out)

    # ---- stats (pulsar-admin topics stats) -----------------------------------------------------------
    def topic_stats(self, topic: str) -> list[dict[str, Any]]:
        """Per partition of ``topic`` (or the one it names): offsets and entries (end - start, markers
        included), messages and markers apart, files and bytes, maxReadPosition and the transaction
        holding it back, the transaction buffer's counts, producers, publish/consume rates, and
        each subscription's cursor, backlog (``end offset - (markDeletePosition + 1)`` minus the
        offsets acknowledged individually above it), type, consumers and unacked messages.

        A partition whose table cannot be read (a damaged or missing commit file) is a row with
        the same fields, empty (no producers, no subscriptions), and an ``error`` naming it,
        logged at WARNING: the other partitions are still returned, as the coordinator views
        list the readable TCs beside an unreadable one. An unreachable store still raises, and a
        topic deleted while its partitions are read raises TopicNotFound (gone, not damaged)."""
        parts = self.partitions_of(topic)
        names = subscription_names(self.root, parts)
        now = int(time.time() * 1000)
        out = []
        for p in parts:
            try:
                row = self._partition_stats(p, names, now)
            except StorageUnavailable:
                raise
            except Exception as e:  # one damaged partition must not hide the others
                if isinstance(e, TopicNotFound | CorruptedLog) and not self._still_exists(p):
                    # Deleted since it was listed (its table gone, or a log file gone while read):
                    # gone, as for a topic deleted a moment earlier, not damaged.
                    raise TopicNotFound(f"topic {p.base} was deleted while its stats were read") from e
                error = one_line(e)
                log.warning("partition %s cannot be read; topic stats list it without figures: %s", p, error)
                row = unreadable_row((*PARTITION_STATS_KEYS, "msgRateOut"), error, partition=str(p), producers=[],
                                     subscriptions={})
            out.append(row)
        return out

    def _still_exists(self, p: TopicName) -> bool:
        """Whether ``p``'s topic still has its metadata: a delete removes it first, so a partition
        that cannot be read under a topic without it was deleted, not damaged."""
        try:
            self.get_partitions(str(p.base))
        except TopicNotFound:
            return False
        return True

    def _partition_stats(self, p: TopicName, names: list[str], now: int) -> dict[str, Any]:
        row = partition_stats(self.root, p, self._stats_coordinators, now)
        subs: dict[str, dict[str, Any]] = {}
        for name in names:
            store = SubscriptionStore(self.root, p, name)
            c = live_cursor(store)
            if c is None:
                continue
            subs[name] = {"markDeletePosition": c.mark_delete,
                          "individuallyAckedCount": len(c.acked), "pendingAckCount": c.pending_count(),
                          "backlog": cursor_backlog(c, row["startOffset"], row["endOffset"]),
                          **subscription_extras(self.root, p, name, store, c, now)}
        row["msgRateOut"] = round(sum(s["msgRateOut"] for s in subs.values()), 3)
        row["subscriptions"] = subs
        return row

    def _stats_coordinators(self) -> Coordinators:
        """The TCs that name a blocking transaction: the client's when there is one."""
        client = getattr(self, "client", None)
        return client._coordinators() if client is not None else Coordinators.shared(self.root)
