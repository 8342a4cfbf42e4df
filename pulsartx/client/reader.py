"""Reader (Pulsar's Reader): positioned reads with no subscription state.

Each partition is tailed incrementally: the file index follows new Delta commits, and only the
offsets past the reader's position are fetched, so tailing cost does not grow with the log.
Which records are *visible* is decided by :mod:`pulsartx.buffer.reads` (isolation levels).

A reader stays with the process that made it: in a forked child it raises ForkedProcessError
(docs/design/clients-across-fork.md).
"""
from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

from pulsartx import forks
from pulsartx.buffer.reads import VisibilityReader, check_isolation
from pulsartx.client.idle import IdleWait
from pulsartx.client.message import Message, messages_from_table
from pulsartx.client.partition_updates import PartitionUpdates
from pulsartx.exceptions import AlreadyClosed, InvalidConfiguration, Timeout
from pulsartx.log.message_id import MessageId
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName, is_partitioned, message_topic
from pulsartx.suggest import checked_keywords

if TYPE_CHECKING:
    from pulsartx.client.client import Client

FETCH_MAX = 1000
# While other partitions have messages buffered, a caught-up partition (whose check costs a storage
# refresh) is re-checked at most this often: reading n messages then costs O(n), not O(n x partitions).
RECHECK_S = 0.05
# What deciding visibility needs, to find a partition's last visible message without its payloads.
LAST_COLUMNS = ("offset", "type", "txn_most_bits", "txn_least_bits")


class PartitionFetcher:
    """Reads visible messages of one partition from a position onwards."""

    def __init__(self, client: Client, topic: TopicName, isolation_level: str, message_topic: str | None = None):
        self.topic = topic
        self.message_topic = message_topic or str(topic.base)
        self.log = PartitionLog(client.root, topic)
        self.visible = VisibilityReader(client, self.log, isolation_level)
        self.position = 0
        self.buffer: deque[Message] = deque()
        self.caught_up_at = float("-inf")  # when fill() last found nothing new

    def seek(self, offset: int) -> None:
        self.position = max(0, offset)
        self.buffer.clear()

    def seek_last(self) -> None:
        """At the last message visible now, or at the end when there is none: Pulsar's reader from
        ``MessageId.latest`` with ``start_message_id_inclusive`` returns the topic's last message
        (its clients seek to the last message id). Read backwards in growing windows, the
        visibility columns only, as markers and hidden transactions may end the log."""
        end = self.visible.end_position()
        start = self.visible.log.index.start_offset
        hi, step = end, FETCH_MAX
        while hi > start:
            lo = max(start, hi - step)
            rows = self.visible.visible(self.visible.log.read(lo, hi, columns=LAST_COLUMNS))
            if rows.num_rows:
                self.seek(int(rows.column("offset")[-1].as_py()))
                return
            hi, step = lo, step * 2
        self.seek(end)

    def fill(self) -> bool:
        """Fetch the next visible messages into the buffer; True when anything was added."""
        if self.buffer:
            return True
        while True:
            table, next_pos = self.visible.fetch(self.position, FETCH_MAX)
            self.position = next_pos
            if table.num_rows:
                self.buffer.extend(messages_from_table(table, self.message_topic, self.topic.partition))
                return True
            if not self.visible.more_readable(self.position):
                self.caught_up_at = time.monotonic()
                return False


class Reader:
    @checked_keywords()
    def __init__(self, client: Client, topic: str, start_message_id: MessageId, reader_name: str | None = None,
                 start_message_id_inclusive: bool = False, isolation_level: str = "READ_COMMITTED",
                 idle_poll_max_interval_ms: int | None = None, auto_update_partitions: bool = True,
                 auto_update_partitions_interval_ms: int | None = None):
        """Made by :meth:`Client.create_reader`, whose docstring lists the keywords."""
        self._made = forks.stamp()
        self._idle = IdleWait(idle_poll_max_interval_ms, client.root)
        if not isinstance(start_message_id, MessageId):
            raise InvalidConfiguration(
                f"start_message_id must be a MessageId (MessageId.earliest, MessageId.latest, or a message's id), "
                f"got {start_message_id!r}")
        self._client = client
        self._topic = str(TopicName.parse(topic))
        self._name = reader_name
        self._isolation = check_isolation(isolation_level)
        self._updates = PartitionUpdates(client.admin, topic, auto_update_partitions, auto_update_partitions_interval_ms)
        parts = self._updates.partitions
        partitioned = is_partitioned(topic, len(parts))
        self._fetchers = [PartitionFetcher(client, p, self._isolation, message_topic(p, partitioned)) for p in parts]
        self._closed = False
        self._inclusive = start_message_id_inclusive
        if len(self._fetchers) > 1 and not (start_message_id.is_earliest or start_message_id.is_latest):
            raise InvalidConfiguration(self._one_partitions_start(start_message_id))
        self._position(start_message_id)

    def _follow_growth(self) -> None:
        """Read the partitions a growth of the topic added, each from its first message: they were
        all sent after this reader began (the partition did not exist), whatever position it
        started at. Called by the reading thread (a reader is used by one at a time)."""
        added = self._updates.added(len(self._fetchers))
        if not added:
            return
        fetchers = self._fetchers + [PartitionFetcher(self._client, p, self._isolation, message_topic(p, True))
                                     for p in added]
        if len(self._fetchers) == 1 and not is_partitioned(self._topic, 1):
            # One partition addressed by the topic's name was "non-partitioned"; from now on every
            # message carries its partition's name, as all of a partitioned topic's do.
            self._fetchers[0].message_topic = message_topic(self._fetchers[0].topic, True)
        self._fetchers = fetchers

    def _one_partitions_start(self, message_id: MessageId) -> str:
        """Why a reader of several partitions does not start at one message's id, and what to do.

        An id places a message in its own partition only; reading the others from their beginning
        returned what came before it, and any other position is a guess. Java's client refuses it
        too ("The partitioned topic startMessageId is illegal")."""
        base = TopicName.parse(self._topic)
        one = (str(base.with_partition(message_id.partition()))
               if 0 <= message_id.partition() < len(self._fetchers) else f"{base}-partition-<i>")
        return (f"start_message_id={message_id!r}: a reader of the {len(self._fetchers)} partitions of {self._topic} "
                "starts at MessageId.earliest, MessageId.latest or, with seek(), a publish time; a message's id "
                f"places it in its own partition only: read that partition alone (create_reader({one!r}, ...)), "
                "or start at earliest and seek() to the id, which repositions its partition only")

    def topic(self) -> str:
        return self._topic

    def seek(self, message_id: MessageId | int) -> None:
        """Reposition: earliest, latest, or just after (``start_message_id_inclusive``: at) a message.
        With ``start_message_id_inclusive``, latest is each partition's last visible message, as in
        Pulsar's clients. Given an ``int`` (milliseconds since the epoch), as pulsar-client's
        ``Reader.seek``: on every partition, the first message published at or after that time (the
        partition's end when there is none).

        On a reader of several partitions, a message's id repositions that message's partition only
        and leaves the others where they are, as Pulsar's multi-topic seek to a ``TopicMessageId``
        does: an id says nothing about where the other partitions should be."""
        forks.check(self._made, self._describe)
        if self._updates.enabled:  # a growth not seen yet: its partitions are positioned by this seek too
            self._follow_growth()
        self._position(message_id)

    def _position(self, message_id: MessageId | int) -> None:
        by_time = isinstance(message_id, int) and not isinstance(message_id, bool)
        if not by_time and not isinstance(message_id, MessageId):
            raise InvalidConfiguration(f"seek({message_id!r}): give a MessageId (MessageId.earliest, "
                                       "MessageId.latest or a message's id) or a publish time in epoch milliseconds")
        if not by_time and not (message_id.is_earliest or message_id.is_latest) and len(self._fetchers) > 1:
            owner = [f for f in self._fetchers if f.topic.partition == message_id.partition()]
            if not owner:
                raise InvalidConfiguration(f"seek({message_id!r}): {self._topic} has no partition "
                                           f"{message_id.partition()} (partitions 0 to {len(self._fetchers) - 1})")
            owner[0].seek(message_id.offset() + (0 if self._inclusive else 1))
            return
        for f in self._fetchers:
            if by_time:
                f.seek(f.visible.log.offset_at_time(message_id))
            elif message_id.is_earliest:
                f.seek(0)
            elif message_id.is_latest and self._inclusive:
                f.seek_last()
            elif message_id.is_latest:
                f.seek(f.visible.end_position())
            else:  # the only partition
                f.seek(message_id.offset() + (0 if self._inclusive else 1))

    def has_message_available(self) -> bool:
        self._check_open()
        if self._updates.due():
            self._follow_growth()
        return any(f.buffer for f in self._fetchers) or any(f.fill() for f in self._fetchers)

    def _ready(self) -> list[PartitionFetcher]:
        """Fetchers with a message buffered. When none has one, every partition is checked."""
        if self._updates.due():
            self._follow_growth()
        ready = [f for f in self._fetchers if f.buffer]
        now = time.monotonic()
        for f in self._fetchers:
            if not f.buffer and (not ready or now - f.caught_up_at >= RECHECK_S) and f.fill():
                ready.append(f)
        return ready

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next visible message; waits for one, raising :class:`Timeout` after ``timeout_millis``."""
        self._check_open()
        deadline = float("inf") if timeout_millis is None else time.monotonic() + timeout_millis / 1000.0
        while True:
            ready = self._ready()
            if ready:
                f = min(ready, key=lambda f: (f.buffer[0].publish_timestamp(), f.topic.partition))
                return f.buffer.popleft()
            if time.monotonic() >= deadline:
                raise Timeout(f"no message on {self._topic} within {timeout_millis} ms")
            self._idle.wait([w for f in self._fetchers for w in f.visible.next_commits()], deadline)

    def close(self) -> None:
        self._closed = True

    def is_connected(self) -> bool:
        return not self._closed and not forks.forked(self._made)

    def _describe(self) -> str:
        return f"reader {self._name} on {self._topic}" if self._name else f"reader on {self._topic}"

    def _check_open(self) -> None:
        forks.check(self._made, self._describe)
        if self._closed:
            raise AlreadyClosed(f"reader on {self._topic} is closed")

    def __iter__(self):
        while self.has_message_available():
            yield self.read_next()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
