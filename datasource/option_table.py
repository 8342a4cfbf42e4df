"""Every ``format("pulsartx")`` option, declared once: the parser takes names and defaults from
here, refuses names that are not here, and ``docs/options.md`` is generated from here
(``python -m pulsartx.datasource.options_doc``), so the reference cannot drift from the code.

A Spark option reaches us lowercased (``startingoffsets``), so names are matched without case and
every message spells the option as users write it. Keys that Spark adds itself (``path`` for
``load(x)``/``save(x)``/``start(x)``, ``paths`` for ``load([x, y])``, ``checkpointLocation``,
``queryName``) are accepted wherever Spark may add them.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pulsartx.exceptions import InvalidConfiguration, UnknownOption
from pulsartx.suggest import nearest

READ, READ_STREAM, WRITE, WRITE_STREAM = "read", "readStream", "write", "writeStream"
USES = (READ, READ_STREAM, WRITE, WRITE_STREAM)
# DataSource.schema() runs for spark.read and spark.readStream alike and cannot tell which: it
# checks names against both, and reader() / streamReader() check their own use afterwards.
ANY_READ = "read or readStream"
_USE_SETS = {**{u: frozenset({u}) for u in USES}, ANY_READ: frozenset({READ, READ_STREAM})}
# How an unknown-option message names the API the options were given to.
API = {READ: "spark.read", READ_STREAM: "spark.readStream", WRITE: "df.write", WRITE_STREAM: "df.writeStream",
       ANY_READ: "spark.read/readStream"}
_ALL = frozenset(USES)
_READS = frozenset({READ, READ_STREAM})
_WRITES = frozenset({WRITE, WRITE_STREAM})
# How a message names a set of uses ("option endingOffsets is for batch reads").
_USE_WORDS = {_READS: "reading", _WRITES: "writing", frozenset({READ}): "batch reads",
              frozenset({READ_STREAM}): "streaming reads", frozenset({WRITE}): "batch writes",
              frozenset({WRITE_STREAM}): "streaming writes"}
STORAGE_PREFIX = "pulsartx.storage."


@dataclass(frozen=True)
class OptionSpec:
    """One option. ``default`` is the parsed value used when the option is absent (None: no
    default, or one computed at parse time, which ``default_text`` then describes); ``defaults``
    overrides it per use. ``wrong_use`` is said when the option is given where it does not apply."""

    name: str
    uses: frozenset[str]
    type: str
    meaning: str
    default: object = None
    default_text: str | None = None
    defaults: tuple[tuple[str, object], ...] = ()
    minimum: int | None = None  # integer options: the smallest valid value
    wrong_use: str = "remove it"
    prefix: bool = False  # a family: ``pulsartx.storage.<KEY>``

    def default_for(self, use: str) -> object:
        """The default where ``use`` applies; ANY_READ (schema()) takes the plain default."""
        return dict(self.defaults).get(use, self.default)

    def used_by(self) -> str:
        return ", ".join(u for u in USES if u in self.uses)


OPTIONS: tuple[OptionSpec, ...] = (
    # ---- where and what -----------------------------------------------------------------------
    OptionSpec("service.url", _ALL, "path or URL",
               "The storage root: a local directory or `s3://bucket/prefix`.",
               default_text="`$PULSARTX_SERVICE_URL`, else `./pulsartx-data`"),
    OptionSpec("pulsartx.storage.<KEY>", _ALL, "string",
               "An object-store setting passed to the storage layer as `KEY` (matched without case), e.g. "
               "`pulsartx.storage.AWS_ENDPOINT_URL`, `pulsartx.storage.AWS_REGION`.", prefix=True),
    OptionSpec("topic", _ALL, "topic name",
               "Reads: the topic to read. Writes: the topic to write to; without it, each row's `__topic` "
               "column names its topic. With both, a row's non-null `__topic` wins and the option is the topic "
               "of rows whose `__topic` is null (Spark's Kafka sink lets the option win): drop `__topic` to "
               "write rows read from another topic to this one. A `-partition-N` name reads one partition."),
    OptionSpec("path", _ALL, "topic name",
               "Set by Spark from `load(topic)`, `save(topic)` or `start(topic)`: the same as `topic`."),
    OptionSpec("topics", _READS, "comma-separated topic names", "Several topics to read.",
               wrong_use="a write takes one topic option (or a __topic column to route rows to several topics)"),
    OptionSpec("topicsPattern", _READS, "regular expression",
               "Read every topic one of whose names (`persistent://tenant/ns/t`, `tenant/ns/t`, or `t` in "
               "public/default) the pattern fully matches; a stream picks up matching topics created later "
               "(from their start) and stops reading deleted ones.",
               wrong_use="a write takes one topic option (or a __topic column to route rows to several topics)"),
    OptionSpec("subscription", frozenset({READ_STREAM}), "subscription name",
               "Keep the stream's position in this durable subscription, acknowledged in the sink's "
               "transaction when the sink is pulsartx; a query without a checkpoint resumes from it."),
    # ---- how much -----------------------------------------------------------------------------
    OptionSpec("startingOffsets", _READS, "`earliest`, `latest` or JSON",
               "Where reading starts: `earliest`, `latest`, or "
               '`{"topic":{"0":23,"1":-2}}` per partition (-2 = earliest, -1 = latest). A stream refuses an '
               "offset past its partition's end. A topic may also hold `\"tableIds\":{\"0\":\"<id>\"}`, as a "
               "stream's own offsets do: an offset whose partition has another table now (the topic was "
               "re-created since) is refused.",
               default=None, default_text="read: `earliest`; readStream: `latest`"),
    OptionSpec("endingOffsets", frozenset({READ}), "`latest` or JSON",
               "Where a batch read ends (exclusive), in the same syntax as `startingOffsets`.",
               default_text="`latest`",
               wrong_use="a stream has no end (use Trigger.AvailableNow to stop at the data present when it starts)"),
    OptionSpec("startingTimestamp", _READS, "epoch milliseconds",
               "Start every partition at its first message published at or after this time (its end when "
               "there is none yet); wins over `startingOffsetsByTimestamp` and `startingOffsets`, as in "
               "Spark's Kafka source.", default_text="none"),
    OptionSpec("startingOffsetsByTimestamp", _READS, "JSON",
               'Per partition, the publish time to start at: `{"topic":{"0":1700000000000}}` (epoch '
               "milliseconds; a partition with no message at or after it starts at its end); partitions it "
               "does not list follow `startingOffsets`. Wins over `startingOffsets`.", default_text="none"),
    OptionSpec("endingTimestamp", frozenset({READ}), "epoch milliseconds",
               "End every partition (exclusive) at its first message published at or after this time; wins "
               "over `endingOffsets`.", default_text="none",
               wrong_use="a stream has no end (use Trigger.AvailableNow to stop at the data present when it starts)"),
    OptionSpec("maxEntriesPerTrigger", frozenset({READ_STREAM}), "integer >= 1",
               "At most this many entries per micro-batch, shared among partitions by backlog (each partition "
               "with a backlog gets at least one while the limit allows).",
               default_text="no limit", minimum=1),
    OptionSpec("maxEntriesPerPartition", _READS, "integer >= 1",
               "A partition's range larger than this is split over several Spark tasks, as few as keep each "
               "within it, of about equal size and cut where data files start.",
               default=1_000_000, minimum=1),
    OptionSpec("minEntriesPerTask", frozenset({READ_STREAM}), "integer >= 0",
               "A micro-batch's smaller partition ranges share a task of about this many entries; `0`: one "
               "task per partition range.", default=50_000, minimum=0),
    OptionSpec("failOnDataLoss", _READS, "boolean",
               "Fail when offsets the query has not read were deleted (retention) or its topic was "
               "re-created; `false` skips to what is there, with a warning. A batch read fails (or skips) "
               "when a `startingOffsets` offset lies below its partition's first offset, as in Spark's "
               "Kafka source.", default=True),
    OptionSpec("isolationLevel", _READS, "`READ_COMMITTED` or `READ_UNCOMMITTED`",
               "`READ_COMMITTED` returns only committed messages; `READ_UNCOMMITTED` also open and aborted "
               "ones.", default="READ_COMMITTED"),
    # ---- writes -------------------------------------------------------------------------------
    OptionSpec("transactional", _WRITES, "boolean",
               "`true`: the job (or micro-batch) is one transaction. `false` (batch writes only): rows are "
               "visible as tasks append them, and stay visible if the job fails; a retried task attempt may append its rows "
               "again (at least once).", default=True),
    OptionSpec("transactionKey", frozenset({WRITE_STREAM}), "string without `&`",
               "The key that fences an older run of the same query. When absent: `query-<id>`, Spark's query id "
               "(`StreamingQuery.id`, kept in the checkpoint), the same for every spelling of the checkpoint's path; "
               "a query that already ran under the older key, derived from its checkpoint's path as written, "
               "keeps that one while its query-id key is unused. Given without `checkpointLocation` (the "
               "checkpoint then comes from the session's `spark.sql.streaming.checkpointLocation`), the sink learns "
               "the query id from its tasks, so a replayed batch is still told from another query's batch of the "
               "same id under the key; the input's acknowledgement (`subscription`) joins the batch's transaction "
               "only with `checkpointLocation`.",
               default_text="Spark's query id"),
    OptionSpec("checkpointLocation", frozenset({WRITE_STREAM}), "path",
               "Spark's query checkpoint; the sink needs it for exactly-once. Give it on `writeStream`: "
               "pyspark does not pass the session's `spark.sql.streaming.checkpointLocation` to data sources.",
               default_text="none"),
    OptionSpec("transactionTimeoutMs", _WRITES, "integer >= 1",
               "The transaction's timeout in milliseconds. With `transactionKeepAlive` the driver extends it "
               "while the job or micro-batch runs, so it bounds how long a dead driver's transaction holds "
               "READ_COMMITTED readers back, not how long a job may run.",
               default=30_000, minimum=1, default_text="30000 (30 s)"),
    OptionSpec("transactionKeepAlive", _WRITES, "boolean",
               "`true`: a keeper on the driver's host extends the transaction by `transactionTimeoutMs` every "
               "third of it while the driver JVM lives. `false`: `transactionTimeoutMs` is the job's or "
               "micro-batch's whole budget.", default=True),
    OptionSpec("producerName", _WRITES, "string without `&`",
               "The producer name recorded with the written messages.", default_text="generated"),
    OptionSpec("createTopic", _WRITES, "boolean",
               "Create the topic when it does not exist (with `partitions` partitions).", default=False),
    OptionSpec("partitions", _WRITES, "integer >= 1",
               "The partition count of a topic this write creates (with `createTopic=true`, or saveMode "
               "`ignore` or `errorifexists`). A `topic` that exists with another count is refused, before the write "
               "begins: its rows would be spread over a count other than the one asked for. A `__topic` column's topic "
               "that exists with another count is written as it is, with a WARNING in the task's log naming both "
               "counts: one write may route to topics made before, each with its own count, and to topics it "
               "creates, and a refusal would leave such a write no way to run.", default=1, minimum=1),
    OptionSpec("compressionType", _WRITES, "`NONE`, `LZ4`, `ZLib`, `ZSTD` or `SNAPPY`",
               "The parquet codec of the written `value` column.", default="NONE"),
    OptionSpec("saveMode", _WRITES, "`append`, `errorifexists` or `ignore`",
               "With `mode(\"append\")`: `errorifexists` fails if the topic exists, `ignore` writes nothing if "
               "it exists (Spark refuses those modes themselves for Python data sources). Both need the `topic` "
               "option and no `__topic` column.", default="append"),
)

# Keys Spark adds on its own that no pulsartx code reads: accepted, so Spark's API keeps working.
SPARK_KEYS = ("paths", "queryName")

_BY_KEY = {o.name.lower(): o for o in OPTIONS if not o.prefix}
_ACCEPTED_EVERYWHERE = {k.lower() for k in SPARK_KEYS} | {"path", "checkpointlocation"}


def spec(name: str) -> OptionSpec:
    """The table's entry for ``name``: a KeyError at import time if code names an option the table lacks."""
    return _BY_KEY[name.lower()]


# Spark's Kafka-source options that pulsartx spells differently, or has no use for: the nearest
# pulsartx name would mislead (``subscribe`` is not ``subscription``), so each says what to write.
KAFKA_NAMES: dict[str, str] = {
    "subscribe": "Spark's Kafka source calls it subscribe; pulsartx reads the topic named by `topic` "
                 "(`topics` for several, comma-separated)",
    "subscribepattern": "Spark's Kafka source calls it subscribePattern; pulsartx calls it `topicsPattern`",
    "assign": "Spark's Kafka source calls it assign; pulsartx reads one partition as "
              "`topic` = `<topic>-partition-<N>`, or several through `startingOffsets` JSON per partition",
    "kafka.bootstrap.servers": "pulsartx has no brokers: `service.url` names the storage root (a directory or "
                               "s3://bucket/prefix)",
    "maxoffsetspertrigger": "Spark's Kafka source calls it maxOffsetsPerTrigger; pulsartx calls it "
                            "`maxEntriesPerTrigger`",
    "startingoffsetsbytimestampstrategy": "pulsartx has no such option: a partition with no message at or "
                                          "after the time starts at its end (the Kafka source's `latest` "
                                          "strategy); remove it",
    "endingoffsetsbytimestamp": "pulsartx ends every partition at one time with `endingTimestamp`",
    "includeheaders": "pulsartx always returns message properties, in the `__messageProperties` column",
}


def kafka_name(key: str) -> str | None:
    """What pulsartx calls a Kafka-source option ``key`` (lowercased), or None for other names.
    Any other ``kafka.*`` key is a Kafka client setting, which pulsartx has none of."""
    if key in KAFKA_NAMES:
        return KAFKA_NAMES[key]
    if key.startswith("kafka."):
        return ("pulsartx has no Kafka client settings: `service.url` names the storage root, and "
                f"object-store settings go in {STORAGE_PREFIX}<KEY>")
    return None


def _describe(uses: frozenset[str]) -> str:
    return _USE_WORDS.get(uses) or " and ".join(u for u in USES if u in uses)


def check_names(options: Mapping[str, str], use: str) -> None:
    """Refuse every option the table does not list for ``use``. Unknown names get the nearest valid
    one; known names given where they do not apply say where they belong."""
    uses = _USE_SETS[use]
    valid = [o.name for o in OPTIONS if uses & o.uses and not o.prefix]
    for key in sorted(str(k).lower() for k in options):
        if key in _ACCEPTED_EVERYWHERE:
            continue
        if key.startswith(STORAGE_PREFIX):
            if len(key) == len(STORAGE_PREFIX):
                raise InvalidConfiguration(f"option {STORAGE_PREFIX!r} has no key: write it as {STORAGE_PREFIX}<KEY>, "
                                           f"e.g. {STORAGE_PREFIX}AWS_REGION")
            continue
        known = _BY_KEY.get(key)
        if known is not None and uses & known.uses:
            continue
        if known is not None:
            raise InvalidConfiguration(f"option {known.name} is for {_describe(known.uses)}: {known.wrong_use}")
        kafka = kafka_name(key)
        if kafka is not None:
            raise UnknownOption(f"unknown option {key!r} for {API[use]}.format('pulsartx'): {kafka} "
                                "(every option: docs/options.md)")
        guess = nearest(key, valid + [STORAGE_PREFIX + "<KEY>"])
        if guess is not None:
            hint = f"did you mean {guess!r}?"
        else:
            hint = f"the {API[use]} options are {', '.join(valid)} and {STORAGE_PREFIX}<KEY>"
        raise UnknownOption(f"unknown option {key!r} for {API[use]}.format('pulsartx'): {hint} "
                            "(every option: docs/options.md)")
