"""``startingOffsets`` / ``endingOffsets``: Spark's Kafka-source syntax over pulsartx partitions.

Accepted forms: ``"earliest"``, ``"latest"``, or JSON ``{"<topic>": {"<partition>": <offset>}}``
where ``-2`` means earliest and ``-1`` latest. Topic keys may use any accepted topic-name form
(``t``, ``tenant/ns/t``, ``persistent://tenant/ns/t``); they are normalised to the full name, so
two spellings of one topic in the same JSON are rejected as a duplicate. Partitions a JSON does
not list read from the option's default (earliest for the start, latest for the end), which is
friendlier than the Kafka source's "you must specify all partitions". A topic's object may also
hold ``"tableIds": {"<partition>": "<Delta table id>"}``, as a stream's own offsets do (its progress
reports and checkpoint): an offset is then refused when its partition's table is another one, the
topic having been deleted and re-created since the offset was taken.

Publish times, as Spark's Kafka source names them: ``startingTimestamp`` (every partition),
``startingOffsetsByTimestamp`` (JSON per partition, values in epoch milliseconds) and, for batch
reads, ``endingTimestamp``. A partition starts (or ends) at its first message published at or after
the time, or at its end when there is none yet (Kafka's ``latest`` strategy). They take precedence
over offsets, the all-partition one first, as in Spark's Kafka source.

Parsing here is purely syntactic, so it can run before any storage is touched; checking keys
against real topics is :meth:`OffsetSpec.check_against`.
"""
from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from pulsartx.commit_protocol.handoff import TABLE_IDS

from pulsartx.exceptions import InvalidConfiguration, InvalidTopicName
from pulsartx.naming import TopicName

EARLIEST = -2
LATEST = -1
_SHAPE = ('"earliest", "latest", or JSON per topic and partition like '
          '{"public/default/my-topic":{"0":23,"1":-2}} (-2 = earliest, -1 = latest)')


@dataclass(frozen=True)
class OffsetSpec:
    """Where a read starts or ends on each partition: an explicit offset, or EARLIEST/LATEST."""

    option: str
    default: int
    # full base topic name -> partition index -> offset (or EARLIEST/LATEST)
    per_partition: dict[str, dict[int, int]] = field(default_factory=dict)
    # Publish times (epoch ms) that win over offsets: one for every partition, or per partition.
    timestamp: int | None = None
    timestamps: dict[str, dict[int, int]] = field(default_factory=dict)
    timestamps_option: str | None = None  # the option ``timestamps`` came from, for messages
    timestamp_option: str | None = None  # the option ``timestamp`` came from, for messages
    # full base topic name -> partition index -> the Delta table id its offset was taken on
    tables: dict[str, dict[int, str]] = field(default_factory=dict)

    def for_partition(self, topic: TopicName) -> int:
        assert topic.partition is not None
        return self.per_partition.get(str(topic.base), {}).get(topic.partition, self.default)

    def time_for(self, topic: TopicName) -> int | None:
        """The publish time this partition starts (or ends) at, if one was given."""
        if self.timestamp is not None:
            return self.timestamp
        assert topic.partition is not None
        return self.timestamps.get(str(topic.base), {}).get(topic.partition)

    def position(self, topic: TopicName, offset_at_time: Callable[[int], int]) -> int:
        """An offset, or EARLIEST/LATEST: a publish time is resolved through ``offset_at_time``
        (:meth:`pulsartx.log.partition.PartitionLog.offset_at_time`)."""
        t = self.time_for(topic)
        return self.for_partition(topic) if t is None else offset_at_time(t)

    def source(self, topic: TopicName) -> str:
        """The option that decides this partition's position, as :meth:`position` picks it: an
        error must name the option the user set, not the one a time overrode."""
        if self.timestamp is not None:
            return self.timestamp_option or self.option
        if self.time_for(topic) is not None:
            return self.timestamps_option or self.option
        return self.option

    def check_table(self, topic: TopicName, table_id: str) -> None:
        """An offset given with its partition's table id (JSON copied from a stream's offsets) is
        refused on another table: the topic was re-created since, and the number is the old one's."""
        assert topic.partition is not None
        given = self.tables.get(str(topic.base), {}).get(topic.partition)
        if given is None or given == table_id or self.time_for(topic) is not None or not self.is_explicit(topic):
            return
        raise InvalidConfiguration(
            f"option {self.option}: offset {self.for_partition(topic)} for {topic} was taken on its table {given}, "
            f"but the topic was deleted and re-created since (its table is now {table_id}); give an offset of the "
            f"new topic without \"{TABLE_IDS}\", or -2 (earliest) to read it from its start")

    def is_explicit(self, topic: TopicName) -> bool:
        """True when the user gave a real offset (not earliest/latest) for this partition."""
        return self.for_partition(topic) >= 0

    def check_against(self, partitions: list[TopicName]) -> None:
        """Every topic and partition the JSON names must be one the read covers: a typo in a key
        would otherwise silently read from the default position."""
        known: dict[str, set[int]] = {}
        for p in partitions:
            assert p.partition is not None
            known.setdefault(str(p.base), set()).add(p.partition)
        for option, per_partition in ((self.option, self.per_partition),
                                      (self.timestamps_option, self.timestamps)):
            for topic, parts in per_partition.items():
                if topic not in known:
                    raise InvalidConfiguration(
                        f"option {option}: topic {topic!r} is not one of the topics this read covers "
                        f"({', '.join(sorted(known)) or 'none'}); remove it or add it to the "
                        "topic/topics/topicsPattern option")
                missing = sorted(set(parts) - known[topic])
                if missing:
                    raise InvalidConfiguration(
                        f"option {option}: topic {topic} has no partition {missing[0]} in this read "
                        f"(partitions read: {sorted(known[topic])}); fix the partition number")


def parse_offsets(option: str, raw: str | None, default: int) -> OffsetSpec:
    """Parse one offsets option; errors name the option and show the expected shape."""
    if raw is None:
        return OffsetSpec(option, default)
    text = raw.strip()
    if text.lower() == "earliest":
        return OffsetSpec(option, EARLIEST)
    if text.lower() == "latest":
        return OffsetSpec(option, LATEST)

    def bad(why: str) -> InvalidConfiguration:
        return InvalidConfiguration(f"option {option}={raw!r} is invalid: {why}; expected {_SHAPE}")

    if not text.startswith(("{", "[")):  # a word, not JSON: say what is valid first
        nearest = difflib.get_close_matches(text.lower(), ["earliest", "latest"], n=1, cutoff=0.6)
        hint = f"did you mean {nearest[0]!r}? " if nearest else ""
        raise InvalidConfiguration(f"option {option}={raw!r} is invalid: {hint}expected {_SHAPE}")

    def offset(key: str, pkey: str, off: object) -> int:
        if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
            raise bad(f"offset {off!r} for {key!r} partition {pkey} must be an integer >= 0, "
                      "or -2 (earliest) / -1 (latest)")
        return off

    tables: dict[str, dict[int, str]] = {}
    return OffsetSpec(option, default, _per_partition(text, bad, offset, "offset", tables), tables=tables)


def _per_partition(text: str, bad: Callable[[str], InvalidConfiguration],
                   value: Callable[[str, str, object], int], noun: str,
                   tables: dict[str, dict[int, str]] | None = None) -> dict[str, dict[int, int]]:
    """``{"<topic>": {"<partition>": <value>}}``, topics normalised; ``value(topic key, partition
    key, value)`` checks each value, which messages call ``noun``. With ``tables``, a topic may
    also hold ``"tableIds"``, collected there."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad(f"not valid JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(doc, dict):
        raise bad(f"the JSON is a {type(doc).__name__}, not an object of topics")
    out: dict[str, dict[int, int]] = {}
    for key, parts in doc.items():
        try:
            topic = TopicName.parse(key)
        except InvalidTopicName as e:
            raise bad(f"topic key {key!r} is not a topic name ({e})") from None
        if topic.partition is not None:
            raise bad(f"topic key {key!r} names a partition; use the topic name {topic.base.short!r} "
                      "and put the partition number in the inner object")
        name = str(topic)
        if name in out:
            raise bad(f"topic {name} appears twice (under different spellings)")
        if not isinstance(parts, dict):
            raise bad(f"the value for topic {key!r} must be an object of partition -> {noun}")
        values: dict[int, int] = {}
        for pkey, v in parts.items():
            if pkey == TABLE_IDS and tables is not None:
                tables[name] = _table_ids(key, v, bad)
                continue
            if not (isinstance(pkey, str) and pkey.isascii() and pkey.isdigit()):
                raise bad(f"partition key {pkey!r} of topic {key!r} is not a non-negative integer")
            values[int(pkey)] = value(key, pkey, v)
        out[name] = values
    for name, ids in tables.items() if tables is not None else ():
        unknown = sorted(set(ids) - set(out[name]))
        if unknown:
            raise bad(f"{TABLE_IDS} of topic {name} names partition {unknown[0]}, which has no offset there")
    return out


def _table_ids(key: str, ids: object, bad: Callable[[str], InvalidConfiguration]) -> dict[int, str]:
    if not isinstance(ids, dict):
        raise bad(f"{TABLE_IDS} of topic {key!r} must be an object of partition -> table id")
    out: dict[int, str] = {}
    for pkey, v in ids.items():
        if not (isinstance(pkey, str) and pkey.isascii() and pkey.isdigit()) or not isinstance(v, str):
            raise bad(f"{TABLE_IDS} of topic {key!r}: {pkey!r}: {v!r} is not a partition number and a table id")
        out[int(pkey)] = v
    return out


_TIME_SHAPE = "a time in epoch milliseconds, a whole number >= 0 (e.g. 1700000000000)"
_TIMES_SHAPE = ('JSON per topic and partition of epoch-millisecond times like '
                '{"public/default/my-topic":{"0":1700000000000,"1":1700000000000}}')


def parse_timestamp(option: str, raw: str | None) -> int | None:
    """``startingTimestamp`` / ``endingTimestamp``: epoch milliseconds."""
    if raw is None:
        return None
    text = raw.strip()
    if not (text.isascii() and text.isdigit()):
        raise InvalidConfiguration(f"option {option}={raw!r} is invalid: expected {_TIME_SHAPE}")
    return int(text)


def with_timestamps(spec: OffsetSpec, all_option: str, all_raw: str | None, per_option: str | None = None,
                    per_raw: str | None = None) -> OffsetSpec:
    """``spec`` with the publish times of ``all_option`` (every partition) and ``per_option``
    (``startingOffsetsByTimestamp``'s JSON) added."""
    timestamps: dict[str, dict[int, int]] = {}
    if per_raw is not None:
        assert per_option is not None

        def bad(why: str) -> InvalidConfiguration:
            return InvalidConfiguration(f"option {per_option}={per_raw!r} is invalid: {why}; expected {_TIMES_SHAPE}")

        def time(key: str, pkey: str, v: object) -> int:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise bad(f"time {v!r} for {key!r} partition {pkey} must be epoch milliseconds, a whole number >= 0")
            return v

        text = per_raw.strip()
        if not text.startswith("{"):
            raise bad("not a JSON object")
        timestamps = _per_partition(text, bad, time, "time")
    return OffsetSpec(spec.option, spec.default, spec.per_partition, parse_timestamp(all_option, all_raw),
                      timestamps, per_option, all_option, spec.tables)
