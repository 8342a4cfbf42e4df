"""The one parser for ``spark.read/readStream/write.format("pulsartx")`` options.

Option names follow Spark's Kafka source and the pulsar-spark connector. Spark hands them over as
a case-insensitive mapping with lowercased keys and string values; every error names the option as
users write it (``topicsPattern``, not ``topicspattern``) and says what to write instead.

Names, defaults and where each option applies come from the declarative table in
:mod:`pulsartx.datasource.option_table`; every parse first refuses names that table does not list for its use
(``read``, ``readStream``, ``write``, ``writeStream``), so a misspelt option fails instead of being
ignored. Parsing is syntactic and never touches storage, so it can run anywhere; resolving topics
against the storage root is :mod:`pulsartx.datasource.topics`.

The storage root is resolved here, in the driver-side planner worker, to an absolute path or URL,
and executors only ever receive that resolved value. ``spark.pulsartx.service.url`` cannot be
honoured: pyspark's Python workers receive neither the Spark conf nor the SQL conf (only a
hand-picked list of runtime settings), and ``PythonDataSourceV2`` does not implement
``SessionConfigSupport``, so ``spark.datasource.pulsartx.*`` is not forwarded as options either.
The fallbacks are therefore the ``PULSARTX_SERVICE_URL`` environment variable as seen by the
driver's Python workers (set it before the SparkSession starts, or through
``spark.executorEnv.PULSARTX_SERVICE_URL``, which reaches them), then ``./pulsartx-data`` relative to
the driver's working directory.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from pulsartx.datasource.offsets import EARLIEST, LATEST, OffsetSpec, parse_offsets, with_timestamps
from pulsartx.datasource.option_table import (
    READ,
    READ_STREAM,
    STORAGE_PREFIX,
    WRITE,
    OptionSpec,
    check_names,
    spec,
)

from pulsartx.exceptions import InvalidConfiguration, InvalidTopicName
from pulsartx.log.compression import CompressionType
from pulsartx.naming import TopicName, check_subscription_name
from pulsartx.storage.root import StorageRoot

# The names code refers to, looked up in the table (a name missing there fails at import).
SERVICE_URL = spec("service.url").name
TOPIC = spec("topic").name
TOPICS = spec("topics").name
TOPICS_PATTERN = spec("topicsPattern").name
PATH = spec("path").name
STARTING_OFFSETS = spec("startingOffsets").name
ENDING_OFFSETS = spec("endingOffsets").name
STARTING_TIMESTAMP = spec("startingTimestamp").name
STARTING_OFFSETS_BY_TIMESTAMP = spec("startingOffsetsByTimestamp").name
ENDING_TIMESTAMP = spec("endingTimestamp").name
ISOLATION_LEVEL = spec("isolationLevel").name
MAX_ENTRIES_PER_PARTITION = spec("maxEntriesPerPartition").name
FAIL_ON_DATA_LOSS = spec("failOnDataLoss").name
PATHS = "paths"  # what Spark sets for load([a, b])

ISOLATION_LEVELS = ("READ_COMMITTED", "READ_UNCOMMITTED")


@dataclass(frozen=True)
class TopicSelection:
    """Which topics a query names: exactly one of the three options (``path`` counts as ``topic``)."""

    option: str  # TOPIC, TOPICS or TOPICS_PATTERN, as users spell it
    topics: tuple[TopicName, ...] = ()
    pattern: str | None = None

    def describe(self) -> str:
        if self.pattern is not None:
            return f"{TOPICS_PATTERN}={self.pattern!r}"
        return f"{self.option}={','.join(str(t) for t in self.topics)!r}"


@dataclass(frozen=True)
class PulsarTxOptions:
    """Everything the options say, validated. Picklable: it travels inside readers to executors."""

    root: StorageRoot
    selection: TopicSelection | None
    starting_offsets: OffsetSpec
    ending_offsets: OffsetSpec
    isolation_level: str
    max_entries_per_partition: int
    # Offsets asked for but deleted by retention fail the read (True) or are skipped with a warning.
    fail_on_data_loss: bool = True


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    # Spark already lowercases; plain dicts from tests or other callers may not.
    return {str(k).lower(): str(v) for k, v in options.items()}


def storage_options(options: Mapping[str, str]) -> dict[str, str]:
    """``pulsartx.storage.<KEY>`` entries as ``{KEY: value}``. Spark lowercased the keys; upper-casing
    them gives the canonical form of object_store/delta-rs keys (``AWS_ACCESS_KEY_ID``), which are
    matched case-insensitively anyway."""
    return {k[len(STORAGE_PREFIX):].upper(): v for k, v in _lower(options).items()
            if k.startswith(STORAGE_PREFIX) and len(k) > len(STORAGE_PREFIX)}


def resolve_root(options: Mapping[str, str]) -> StorageRoot:
    opts = _lower(options)
    url = opts.get(SERVICE_URL)
    if url is not None and not url.strip():
        raise InvalidConfiguration(f"option {SERVICE_URL} is empty: give the storage root, e.g. /data/pulsartx or "
                                   "s3://bucket/prefix, or leave it out to use $PULSARTX_SERVICE_URL")
    try:
        return StorageRoot.resolve(url, storage_options(opts))
    except InvalidConfiguration as e:
        raise InvalidConfiguration(f"option {SERVICE_URL}: {e}") from None


def _parse_topic(option: str, name: str) -> TopicName:
    try:
        return TopicName.parse(name.strip())
    except InvalidTopicName as e:
        raise InvalidConfiguration(f"option {option}: {e}") from None


def parse_selection(options: Mapping[str, str], *, required: bool = True) -> TopicSelection | None:
    opts = _lower(options)
    given = [(name, opts[name.lower()]) for name in (TOPIC, TOPICS, TOPICS_PATTERN) if name.lower() in opts]
    if PATH in opts:
        given.append((f"{TOPIC} (the load()/save() path)", opts[PATH]))
    choices = f"{TOPIC}, {TOPICS} or {TOPICS_PATTERN}"
    if PATHS in opts:
        raise InvalidConfiguration(
            f"load() was given several paths ({opts[PATHS]}): pass one topic to load(), or name several with "
            f'.option("{TOPICS}", "a,b")')
    if len(given) > 1:
        raise InvalidConfiguration(
            f"options {' and '.join(n for n, _ in given)} were all given: set exactly one of {choices} "
            "(a load(path) argument counts as topic)")
    if not given:
        if not required:
            return None
        raise InvalidConfiguration(
            f"no topic given: set exactly one of the options {choices}, e.g. "
            f'.option("{TOPIC}", "my-topic"), .option("{TOPICS}", "a,b") or .option("{TOPICS_PATTERN}", "public/default/t-.*"), '
            "or pass the topic to load()")
    option, value = given[0]
    if option == TOPICS_PATTERN:
        try:
            re.compile(value)
        except re.error as e:
            raise InvalidConfiguration(f"option {TOPICS_PATTERN}={value!r} is not a valid regular expression: {e}") from None
        return TopicSelection(TOPICS_PATTERN, pattern=value)
    if option == TOPICS:
        names = value.split(",")
        if any(not n.strip() for n in names):
            raise InvalidConfiguration(f"option {TOPICS}={value!r} has an empty entry: give comma-separated topic names")
        topics = tuple(dict.fromkeys(_parse_topic(TOPICS, n) for n in names))
        return TopicSelection(TOPICS, topics)
    if not value.strip():
        raise InvalidConfiguration(f"option {TOPIC} is empty: give a topic name such as 'my-topic'")
    return TopicSelection(TOPIC, (_parse_topic(TOPIC, value),))


def parse_isolation(options: Mapping[str, str]) -> str:
    raw = _lower(options).get(ISOLATION_LEVEL.lower(), str(spec(ISOLATION_LEVEL).default))
    level = raw.strip().upper()
    if level not in ISOLATION_LEVELS:
        raise InvalidConfiguration(f"option {ISOLATION_LEVEL}={raw!r} is invalid: use {' or '.join(ISOLATION_LEVELS)}")
    return level


def _parse_int(options: Mapping[str, str], option: str, default: int, minimum: int, expected: str) -> int:
    """An integer option of at least ``minimum``; anything else names the option and ``expected``."""
    raw = _lower(options).get(option.lower())
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise InvalidConfiguration(f"option {option}={raw!r} is invalid: give {expected}")
    return value


def parse_positive_int(options: Mapping[str, str], option: str, default: int) -> int:
    return _parse_int(options, option, default, 1, "a positive integer")


def parse_non_negative_int(options: Mapping[str, str], option: str, default: int) -> int:
    return _parse_int(options, option, default, 0, "a whole number, 0 or more")


def table_int(options: Mapping[str, str], option: str, use: str) -> int:
    """An integer option with the table's default for ``use`` and the table's minimum."""
    entry: OptionSpec = spec(option)
    default = entry.default_for(use)
    assert isinstance(default, int) and entry.minimum is not None, f"{option} has no integer default in the table"
    parse = parse_positive_int if entry.minimum == 1 else parse_non_negative_int
    return parse(options, entry.name, default)


def table_bool(options: Mapping[str, str], option: str, use: str) -> bool:
    entry = spec(option)
    return parse_bool(options, entry.name, bool(entry.default_for(use)))


def parse_options(options: Mapping[str, str], *, require_topic: bool = True, use: str = READ) -> PulsarTxOptions:
    """Validate every option at once, so a bad one fails at ``load()`` rather than in a task.
    ``use``: READ for batch reads, READ_STREAM for streams, ANY_READ where it is not known which
    (``DataSource.schema()``)."""
    opts = _lower(options)
    check_names(opts, use)
    return PulsarTxOptions(
        root=resolve_root(opts),
        selection=parse_selection(opts, required=require_topic),
        starting_offsets=with_timestamps(
            parse_offsets(STARTING_OFFSETS, opts.get(STARTING_OFFSETS.lower()), EARLIEST),
            STARTING_TIMESTAMP, opts.get(STARTING_TIMESTAMP.lower()),
            STARTING_OFFSETS_BY_TIMESTAMP, opts.get(STARTING_OFFSETS_BY_TIMESTAMP.lower())),
        ending_offsets=with_timestamps(parse_offsets(ENDING_OFFSETS, opts.get(ENDING_OFFSETS.lower()), LATEST),
                                       ENDING_TIMESTAMP, opts.get(ENDING_TIMESTAMP.lower())),
        isolation_level=parse_isolation(opts),
        max_entries_per_partition=table_int(opts, MAX_ENTRIES_PER_PARTITION, use),
        fail_on_data_loss=table_bool(opts, FAIL_ON_DATA_LOSS, use),
    )


# ---- write options ------------------------------------------------------------------------------
PRODUCER_NAME = spec("producerName").name
TRANSACTION_TIMEOUT_MS = spec("transactionTimeoutMs").name
TRANSACTION_KEEP_ALIVE = spec("transactionKeepAlive").name
CREATE_TOPIC = spec("createTopic").name
PARTITIONS = spec("partitions").name
TRANSACTIONAL = spec("transactional").name
SAVE_MODE = spec("saveMode").name
COMPRESSION_TYPE = spec("compressionType").name
SAVE_MODES = ("append", "errorifexists", "ignore")


def parse_bool(options: Mapping[str, str], option: str, default: bool) -> bool:
    raw = _lower(options).get(option.lower())
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise InvalidConfiguration(f"option {option}={raw!r} is invalid: use true or false")


@dataclass(frozen=True)
class WriteOptions:
    root: StorageRoot
    topic: TopicName | None  # None: every row names its topic in __topic
    producer_name: str | None
    transaction_timeout_ms: int
    create_topic: bool
    partitions: int
    transactional: bool
    save_mode: str
    compression: str = "NONE"  # CompressionType name: the payload column's parquet codec
    keep_alive: bool = True  # the driver extends transaction_timeout_ms while it lives
    partitions_given: bool = False  # option partitions was set: an existing topic's count must match it


def parse_write_options(options: Mapping[str, str], use: str = WRITE) -> WriteOptions:
    """Options of ``df.write.format("pulsartx")`` (and, with ``use=WRITE_STREAM``, of the streaming sink)."""
    opts = _lower(options)
    check_names(opts, use)
    selection = parse_selection(opts, required=False)
    if selection is not None and (selection.option != TOPIC and not selection.option.startswith(TOPIC + " ")
                                  or len(selection.topics) != 1):
        raise InvalidConfiguration(f"option {selection.option} is for reading: a write takes one {TOPIC} option "
                                   "(or a __topic column to route rows to several topics)")
    topic = selection.topics[0] if selection is not None else None
    if topic is not None and topic.partition is not None:
        raise InvalidConfiguration(f"option {TOPIC}={str(topic)!r} names a single partition: give the topic, and use "
                                   "a __partition column to choose partitions")
    save_mode = opts.get(SAVE_MODE.lower(), str(spec(SAVE_MODE).default)).strip().lower()
    if save_mode not in SAVE_MODES:
        raise InvalidConfiguration(f"option {SAVE_MODE}={save_mode!r} is invalid: use {', '.join(SAVE_MODES)}")
    producer = opts.get(PRODUCER_NAME.lower())
    if producer is not None and (not producer.strip() or "&" in producer):
        raise InvalidConfiguration(f"option {PRODUCER_NAME}={producer!r} is invalid: give a non-empty name without '&'")
    create_topic = table_bool(opts, CREATE_TOPIC, use)
    partitions = table_int(opts, PARTITIONS, use)
    partitions_given = PARTITIONS.lower() in opts
    return WriteOptions(
        root=resolve_root(opts), topic=topic, producer_name=producer,
        transaction_timeout_ms=table_int(opts, TRANSACTION_TIMEOUT_MS, use),
        keep_alive=table_bool(opts, TRANSACTION_KEEP_ALIVE, use),
        create_topic=create_topic, partitions=partitions, partitions_given=partitions_given,
        transactional=table_bool(opts, TRANSACTIONAL, use), save_mode=save_mode,
        compression=CompressionType.parse(opts.get(COMPRESSION_TYPE.lower()), option=f"option {COMPRESSION_TYPE}").value)


# ---- streaming options --------------------------------------------------------------------------
MAX_ENTRIES_PER_TRIGGER = spec("maxEntriesPerTrigger").name
SUBSCRIPTION = spec("subscription").name
TRANSACTION_KEY = spec("transactionKey").name
CHECKPOINT_LOCATION = spec("checkpointLocation").name
MIN_ENTRIES_PER_TASK = spec("minEntriesPerTask").name
# Smaller per-partition ranges of a micro-batch share a task (as Spark's file source packs small
# files by spark.sql.files.openCostInBytes): a Python task's fixed cost (worker hand-off, input and
# output streams, one append per output partition) outweighs reading a few thousand entries.
# Measured (bench/streaming.py, 100k-row batches over 4 partitions, 2 cores, docs/design/streaming-task-packing.md):
# consume-transform-produce at 25,000 (4 tasks, two waves) ran at 0.48-0.70 of Spark's parquet
# pipeline, at 50,000 (2 tasks) 0.73-0.81, at 100,000 (1 task, one core idle) 0.64.
DEFAULT_MIN_ENTRIES_PER_TASK = spec(MIN_ENTRIES_PER_TASK).default


@dataclass(frozen=True)
class StreamOptions:
    read: PulsarTxOptions
    max_entries_per_trigger: int | None
    fail_on_data_loss: bool
    subscription: str | None
    min_entries_per_task: int = DEFAULT_MIN_ENTRIES_PER_TASK


def parse_stream_options(options: Mapping[str, str]) -> StreamOptions:
    """``spark.readStream.format("pulsartx")``: the batch options, plus admission control, data-loss
    policy and the durable subscription. startingOffsets defaults to latest, as in Kafka's source."""
    opts = _lower(options)
    check_names(opts, READ_STREAM)  # endingOffsets: "is for batch reads: a stream has no end ..."
    if STARTING_OFFSETS.lower() not in opts:
        opts[STARTING_OFFSETS.lower()] = "latest"
    read = parse_options(opts, use=READ_STREAM)
    sub = opts.get(SUBSCRIPTION.lower())
    if sub is not None:
        try:
            check_subscription_name(sub)
        except InvalidTopicName as e:
            raise InvalidConfiguration(f"option {SUBSCRIPTION}: {e}") from None
    limit = opts.get(MAX_ENTRIES_PER_TRIGGER.lower())
    return StreamOptions(
        read=read,
        max_entries_per_trigger=None if limit is None else parse_positive_int(opts, MAX_ENTRIES_PER_TRIGGER, 1),
        fail_on_data_loss=read.fail_on_data_loss,
        subscription=sub,
        min_entries_per_task=table_int(opts, MIN_ENTRIES_PER_TASK, READ_STREAM))
