"""Following a topic's growth: when a client of a whole topic re-reads its partition count, and
which partitions a growth added (pulsar-client's ``autoUpdatePartitions``).

One mechanism for producers, consumers and readers: each reads the count at most once per
interval (one small read and one listing, docs/design/partition-growth-markers.md) and takes on
the partitions above the ones it has. The count is bound to the topic's incarnation (the
``_topic.json`` it was read from): a topic deleted and re-created with more partitions is not a
growth of the one the client opened, and its partitions are never taken on.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from pulsartx.exceptions import InvalidConfiguration
from pulsartx.naming import TopicName

if TYPE_CHECKING:
    from pulsartx.admin.topics import TopicsAdmin

log = logging.getLogger(__name__)

# How often a client of a whole topic re-reads the partition count when no interval is given
# (pulsar-client's ``partitionsUpdateInterval`` and ``autoUpdatePartitionsInterval``, 60 s).
PARTITIONS_UPDATE_INTERVAL_S = 60.0


def check_options(auto_update_partitions: bool, interval_ms: int | None) -> None:
    """Refuse option values that would silently mean something else."""
    if not isinstance(auto_update_partitions, bool):
        raise InvalidConfiguration(f"auto_update_partitions={auto_update_partitions!r}: give True or False")
    if interval_ms is not None and (not isinstance(interval_ms, int) or isinstance(interval_ms, bool)
                                    or interval_ms < 1):
        raise InvalidConfiguration(f"auto_update_partitions_interval_ms={interval_ms!r}: must be a positive integer "
                                   f"(milliseconds), or None ({PARTITIONS_UPDATE_INTERVAL_S:g} s)")


class PartitionUpdates:
    """A client's view of its topic's partition count: the partitions it opened with, whether a new
    count is due, and the partitions a growth added since."""

    def __init__(self, admin: TopicsAdmin, topic: str, enabled: bool = True, interval_ms: int | None = None):
        check_options(enabled, interval_ms)
        self._admin = admin
        self._topic = TopicName.parse(topic)
        self.partitions, self._incarnation = admin.partitions_and_incarnation(self._topic)
        self.enabled = enabled and self._topic.partition is None
        self._interval_ms = interval_ms
        self._at = time.monotonic()
        self._other_incarnation = False

    def due(self, now: float | None = None) -> bool:
        """Whether the count is to be read again (never for one partition, nor with the option off).
        The default interval is read at each call, so one constant sets it for every client."""
        if not self.enabled:
            return False
        interval = PARTITIONS_UPDATE_INTERVAL_S if self._interval_ms is None else self._interval_ms / 1000.0
        return (time.monotonic() if now is None else now) - self._at >= interval

    def added(self, have: int) -> list[TopicName]:
        """Read the count now; the partitions from index ``have`` up to it, every table of them in
        place (a marker follows its tables). Empty when the topic has not grown, was deleted (and
        maybe re-created: that topic is another one), or the read failed: the partitions known stay
        valid, since a count never falls while the topic lives, and the next interval reads again."""
        self._at = time.monotonic()
        if not self.enabled:
            return []
        try:
            parts, incarnation = self._admin.partitions_and_incarnation(self._topic)
        except Exception as e:  # a deleted topic, a storage fault: the client's own calls report theirs
            log.debug("partition count of %s not read: %s", self._topic, e)
            return []
        if incarnation != self._incarnation:
            if not self._other_incarnation:
                self._other_incarnation = True
                log.info("topic %s was deleted and created again since a client opened it; that client keeps its "
                         "%d partition(s) and takes none of the new topic's", self._topic, have)
            return []
        return parts[have:]
