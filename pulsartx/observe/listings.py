"""Walking a listing of topics that may change under the walk: a topic deleted after it was listed
is skipped as if the listing had come after the delete (docs/design/topics-deleted-since-listed.md).

Below the admin layer, so that metrics and the coordinator service, which the admin's own modules
import, can use it too: it needs only something that reads a topic's partition count.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from pulsartx.exceptions import CorruptedLog, TopicNotFound
from pulsartx.naming import TopicName

T = TypeVar("T")


class PartitionCounts(Protocol):
    def get_partitions(self, topic: str) -> int: ...


def unless_deleted(admin: PartitionCounts, topic: str | TopicName, load: Callable[[], T]) -> T | None:
    """``load()``, which reads ``topic``'s metadata or one of its partitions' logs, or None when it
    failed because the topic was deleted after the caller listed it: every caller that walks a
    listing (a ``topicsPattern`` read, the coordinator service, metrics, the CLI) goes on as if the
    listing had come after the delete, rather than failing for a topic nobody asked for by name.

    A delete removes the topic's metadata first, then its tables, so a load racing it finds the
    table gone (TopicNotFound) or a log file gone while reading it (CorruptedLog). Either is taken
    for a delete only when the metadata is gone too, asked again here: a partition table missing or
    damaged under a topic that still exists, or a partition index past the topic's count, still
    fails."""
    try:
        return load()
    except (TopicNotFound, CorruptedLog):
        name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        try:
            admin.get_partitions(str(name.base))
        except TopicNotFound:
            return None
        raise
