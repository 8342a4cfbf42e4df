"""Topic names: Pulsar's three accepted forms, partition addressing, and the rules that keep every
name inside the storage root.

A name becomes directory segments under ``<root>/topics/``. Validation is therefore a security
boundary, not a nicety: a segment may only use a conservative character set, so no name can
climb out of the root or collide with our own layout (``_delta_log``, ``_pulsartx``).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from pulsartx.exceptions import InvalidTopicName, PulsarException

DOMAIN = "persistent"
DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
PARTITION_SUFFIX = "-partition-"
MAX_SEGMENT_LENGTH = 200
MAX_NAME_LENGTH = 512
_SEGMENT_CHARS = re.compile(r"^[A-Za-z0-9_\-=:.]+$")
_PARTITION_RE = re.compile(r"^(?P<base>.+)-partition-(?P<index>[0-9]+)$")


def _check_segment(full: str, segment: str, what: str) -> None:
    if not segment:
        raise InvalidTopicName(f"topic name {full!r}: the {what} is empty (rule: no empty name or segment)")
    if any(ord(c) < 32 or ord(c) == 127 for c in segment):
        raise InvalidTopicName(f"topic name {full!r}: the {what} contains a control character (rule: no control characters)")
    if ".." in segment:
        raise InvalidTopicName(f"topic name {full!r}: the {what} contains '..' (rule: no '..' in a name)")
    if "/" in segment or "\\" in segment:
        raise InvalidTopicName(
            f"topic name {full!r}: the {what} contains a path separator (rule: '/' only separates tenant/namespace/topic)")
    if len(segment) > MAX_SEGMENT_LENGTH:
        raise InvalidTopicName(
            f"topic name {full!r}: the {what} is {len(segment)} characters long (rule: at most {MAX_SEGMENT_LENGTH})")
    if segment.startswith((".", "_")):
        raise InvalidTopicName(f"topic name {full!r}: the {what} starts with '.' or '_' (rule: reserved for storage)")
    if not _SEGMENT_CHARS.match(segment):
        bad = sorted({c for c in segment if not _SEGMENT_CHARS.match(c)})
        raise InvalidTopicName(
            f"topic name {full!r}: the {what} contains {''.join(bad)!r} (rule: only letters, digits and _ - = : .)")


@dataclass(frozen=True, order=True)
class TopicName:
    """A parsed topic, optionally narrowed to one partition (``partition`` is None for the whole topic)."""

    tenant: str
    namespace: str
    local_name: str
    partition: int | None = None

    @classmethod
    def parse(cls, name: str) -> TopicName:
        if cls is TopicName and isinstance(name, str):
            return _parse_cached(name)  # a TopicName is immutable: one per name is shared
        return cls._parse(name)

    @classmethod
    def _parse(cls, name: str) -> TopicName:
        if not isinstance(name, str):
            raise InvalidTopicName(f"topic name must be a string, got {type(name).__name__}")
        full = name
        if not name:
            raise InvalidTopicName("topic name '' is empty (rule: no empty name)")
        if len(name) > MAX_NAME_LENGTH:
            raise InvalidTopicName(f"topic name {name[:40]!r}... is {len(name)} characters long (rule: at most {MAX_NAME_LENGTH})")
        if "://" in name:
            domain, _, name = name.partition("://")
            if domain not in (DOMAIN, "non-persistent"):
                raise InvalidTopicName(f"topic name {full!r}: unknown domain {domain!r} (rule: use persistent://)")
        parts = name.split("/")
        if len(parts) == 1:
            tenant, namespace, local = DEFAULT_TENANT, DEFAULT_NAMESPACE, parts[0]
        elif len(parts) == 3:
            tenant, namespace, local = parts
        else:
            raise InvalidTopicName(
                f"topic name {full!r} contains a path separator where none belongs "
                "(rule: 'topic', 'tenant/namespace/topic' or 'persistent://tenant/namespace/topic')")
        _check_segment(full, tenant, "tenant")
        _check_segment(full, namespace, "namespace")
        partition = None
        m = _PARTITION_RE.match(local)
        if m:
            # The topic's own name is what the segment rules bound, not with its partition suffix:
            # a topic named to the length limit has partitions too (their markers name them).
            local, partition = m.group("base"), int(m.group("index"))
        _check_segment(full, local, "topic")
        return cls(tenant, namespace, local, partition)

    @property
    def base(self) -> TopicName:
        return TopicName(self.tenant, self.namespace, self.local_name)

    def with_partition(self, index: int) -> TopicName:
        return TopicName(self.tenant, self.namespace, self.local_name, index)

    @property
    def namespace_name(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    def __str__(self) -> str:
        local = self.local_name if self.partition is None else f"{self.local_name}{PARTITION_SUFFIX}{self.partition}"
        return f"{DOMAIN}://{self.tenant}/{self.namespace}/{local}"

    @property
    def short(self) -> str:
        """``tenant/namespace/topic[-partition-i]``: the form used as keys in offsets JSON."""
        return str(self)[len(DOMAIN) + 3:]

    def path_segments(self) -> tuple[str, ...]:
        """Storage segments below ``<root>/topics``; partitions live in ``partition-<i>`` sub-tables."""
        return (self.tenant, self.namespace, self.local_name)


# Every marker, cursor and send names its partition by string: parsing and checking it each time
# cost 0.1-0.3 ms per transaction. Invalid names raise, and lru_cache keeps no exceptions.
_parse_cached = functools.lru_cache(maxsize=4096)(TopicName._parse)


def message_topic(partition: TopicName, partitioned: bool) -> str:
    """What ``Message.topic_name()`` says, as pulsar-client: a partitioned topic's messages carry
    their partition's name (``...-partition-2``), a non-partitioned topic's the topic's own. Every
    topic here is stored as partitions, so a topic of one partition, addressed by its base name,
    counts as non-partitioned."""
    return str(partition) if partitioned else str(partition.base)


def names_topic(name: str, topic: TopicName) -> bool:
    """Whether ``name`` (short or full, with or without a partition suffix, as a message or a row's
    ``__topic`` carries it) names ``topic``'s topic; False for a name that is not a topic name."""
    try:
        return TopicName.parse(name).base == topic.base
    except PulsarException:
        return False


def is_partitioned(requested: str | TopicName, partitions: int) -> bool:
    """Whether ``requested`` (as given to subscribe or create_reader) names a partitioned topic or
    one partition of it: the rule :func:`message_topic` is given."""
    t = requested if isinstance(requested, TopicName) else TopicName.parse(requested)
    return partitions > 1 or t.partition is not None


def parse_namespace(namespace: str) -> tuple[str, str]:
    parts = namespace.split("/")
    if len(parts) != 2:
        raise InvalidTopicName(f"namespace {namespace!r} must be 'tenant/namespace'")
    for seg, what in zip(parts, ("tenant", "namespace"), strict=True):
        _check_segment(namespace, seg, what)
    return parts[0], parts[1]


def check_subscription_name(name: str) -> str:
    """Subscription names become a storage segment too, so they follow the same rules."""
    if not isinstance(name, str):
        raise InvalidTopicName(f"subscription name must be a string, got {type(name).__name__}")
    _check_segment(name, name, "subscription name")
    return name
