"""Turn a :class:`~pulsartx.datasource.options.TopicSelection` into the partitions to read.

Runs on the driver (planner workers) only: it reads topic metadata from the storage root.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from pulsartx.datasource.options import TopicSelection

from pulsartx.admin.topics import TopicsAdmin
from pulsartx.exceptions import TopicNotFound
from pulsartx.naming import DEFAULT_NAMESPACE, DEFAULT_TENANT, TopicName
from pulsartx.observe.listings import unless_deleted
from pulsartx.storage.cli_command import cli_command
from pulsartx.storage.presence import root_missing
from pulsartx.storage.root import StorageRoot

T = TypeVar("T")


def pattern_matches(pattern: re.Pattern[str], topic: TopicName) -> bool:
    """A pattern selects a topic when it fully matches any accepted spelling of its name: the full
    ``persistent://`` name, ``tenant/ns/topic``, or (only in public/default, where it is a valid
    name on its own) the bare topic name."""
    names = [str(topic), topic.short]
    if (topic.tenant, topic.namespace) == (DEFAULT_TENANT, DEFAULT_NAMESPACE):
        names.append(topic.local_name)
    return any(pattern.fullmatch(n) for n in names)


def selected_topics(root: StorageRoot, selection: TopicSelection) -> list[TopicName]:
    """The topics (or single partitions) named, in a stable order. Unknown names fail here with
    the name and how to create it; a pattern that matches nothing is an empty read, as in Kafka's
    ``subscribePattern`` (streaming relies on that to pick topics up once they exist)."""
    admin = TopicsAdmin(root)
    if selection.pattern is not None:
        rx = re.compile(selection.pattern)
        return [t for t in (TopicName.parse(n) for n in admin.list_topics()) if pattern_matches(rx, t)]
    for t in selection.topics:
        try:
            admin.get_partitions(str(t))
        except TopicNotFound as e:
            if t.partition is not None and str(t.base) in admin.list_topics(t.namespace_name):
                raise TopicNotFound(f"option {selection.option}: {e}") from None  # the partition index is too high
            if root_missing(root):
                raise TopicNotFound(
                    f"option {selection.option}: topic {t.base} does not exist because the storage root {root.url} "
                    "itself does not exist: check the service.url option, or create the topic first with "
                    f"`{cli_command(root, 'topics', 'create', t.base.short)}`") from None
            raise TopicNotFound(
                f"option {selection.option}: topic {t.base} does not exist under {root.url}: create it first with "
                f"pulsartx.Client(service_url).admin.create_topic({t.base.short!r}, partitions=N) or "
                f"`{cli_command(root, 'topics', 'create', t.base.short)}`, or check the service.url option") from None
    return list(selection.topics)


def partitions_to_read(root: StorageRoot, selection: TopicSelection) -> list[TopicName]:
    """Every partition to read, each once, even if two names overlap (``t`` and ``t-partition-0``).
    A topic a pattern matched and that was deleted before its partitions were read is left out,
    as if the listing had come after the delete: a pattern names no topic in particular."""
    admin = TopicsAdmin(root)
    out: dict[TopicName, None] = {}
    for t in selected_topics(root, selection):
        parts = load_listed(admin, selection, t, partial(admin.partitions_of, t))
        for p in parts or ():
            out[p] = None
    return list(out)


def load_listed(admin: TopicsAdmin, selection: TopicSelection, topic: TopicName, load: Callable[[], T]) -> T | None:
    """``load()`` of a topic the read selected, or None for one a pattern matched that was deleted
    since it was listed (:func:`~pulsartx.observe.listings.unless_deleted`). A topic named by ``topic``
    or ``topics`` fails instead, as it would had it been deleted before the read began."""
    return load() if selection.pattern is None else unless_deleted(admin, topic, load)

