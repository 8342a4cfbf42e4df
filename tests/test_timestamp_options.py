"""Spark's Kafka-source time options (``startingTimestamp``, ``startingOffsetsByTimestamp``,
``endingTimestamp``), their refusals, and the errors for Kafka option names pulsartx spells
differently."""
from __future__ import annotations

import time
from typing import Any

import pytest
from pulsartx.datasource.option_table import READ, READ_STREAM, check_names
from pulsartx.datasource.options import parse_options, parse_stream_options

import pulsartx
from pulsartx.exceptions import InvalidConfiguration, UnknownOption
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName


def _two_waves(root: str, topic: str = "tt", partitions: int = 2) -> tuple[int, list[bytes], list[bytes]]:
    """Messages sent before and after a time ``t`` (a gap of tens of ms around it): every
    partition holds some of each."""
    c = pulsartx.Client(root)
    c.admin.create_topic(topic, partitions)
    p = c.create_producer(topic)
    early = [f"early-{i}".encode() for i in range(6)]
    late = [f"late-{i}".encode() for i in range(6)]
    for i, v in enumerate(early):
        p.send(v, partition_key=f"k{i}")
    time.sleep(0.05)
    t = int(time.time() * 1000)
    time.sleep(0.05)
    for i, v in enumerate(late):
        p.send(v, partition_key=f"k{i}")
    c.close()
    return t, early, late


def test_offset_at_time_is_the_first_message_published_at_or_after_it(tmp_path):
    root = str(tmp_path / "root")
    t, early, late = _two_waves(root, partitions=1)
    plog = PartitionLog(pulsartx.Client(root).root, TopicName.parse("tt-partition-0"))
    assert plog.offset_at_time(0) == 0
    assert plog.offset_at_time(t) == len(early)
    assert plog.offset_at_time(t + 3_600_000) == plog.end_offset() == len(early) + len(late)


@pytest.mark.spark
def test_batch_reads_start_and_end_at_publish_times(spark: Any, tmp_path):
    root = str(tmp_path / "root")
    t, early, late = _two_waves(root)

    def read(**options: str) -> list[bytes]:
        df = spark.read.format("pulsartx").option("service.url", root).option("topic", "tt").options(**options)
        return sorted(r.value for r in df.load().select("value").collect())

    assert read(startingTimestamp=str(t)) == sorted(late)
    assert read(endingTimestamp=str(t)) == sorted(early)
    assert read(startingTimestamp="0", endingTimestamp=str(t)) == sorted(early)
    assert read(startingTimestamp=str(t + 3_600_000)) == []
    # Per partition: partition 0 from t, partition 1 from its start; startingTimestamp wins over both.
    by_partition = read(startingOffsetsByTimestamp=f'{{"tt":{{"0":{t}}}}}')
    p1 = [r.value for r in spark.read.format("pulsartx").option("service.url", root)
          .option("topic", "tt-partition-1").load().select("value").collect()]
    assert by_partition == sorted(set(late) | set(p1))
    assert read(startingOffsetsByTimestamp='{"tt":{"0":0,"1":0}}', startingTimestamp=str(t)) == sorted(late)


@pytest.mark.spark
def test_a_stream_starts_at_a_publish_time(spark: Any, tmp_path):
    root = str(tmp_path / "root")
    t, _early, late = _two_waves(root)
    q = (spark.readStream.format("pulsartx").option("service.url", root).option("topic", "tt")
         .option("startingTimestamp", str(t)).load().select("value")
         .writeStream.format("memory").queryName("from_time").trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert sorted(r.value for r in spark.sql("select value from from_time").collect()) == sorted(late)


@pytest.mark.parametrize(("option", "value", "says"), [
    ("startingTimestamp", "yesterday", "option startingTimestamp='yesterday' is invalid: expected a time in epoch "
                                       "milliseconds"),
    ("startingTimestamp", "-5", "option startingTimestamp='-5' is invalid"),
    ("endingTimestamp", "1.5", "option endingTimestamp='1.5' is invalid"),
    ("startingOffsetsByTimestamp", "1700000000000", "is invalid: not a JSON object; expected JSON per topic"),
    ("startingOffsetsByTimestamp", '{"tt":{"0":-1}}', "time -1 for 'tt' partition 0 must be epoch milliseconds"),
    ("startingOffsetsByTimestamp", '{"tt":{"x":1}}', "partition key 'x' of topic 'tt' is not a non-negative"),
    ("startingOffsetsByTimestamp", '{"tt":{"0":1}', "not valid JSON"),
])
def test_bad_times_are_refused_naming_the_option(option, value, says):
    with pytest.raises(InvalidConfiguration) as err:
        parse_options({"topic": "tt", option: value})
    assert says in str(err.value)


def test_a_time_for_a_topic_the_read_does_not_cover_is_refused(tmp_path):
    root = str(tmp_path / "root")
    _two_waves(root)
    opts = parse_options({"service.url": root, "topic": "tt", "startingOffsetsByTimestamp": '{"other":{"0":1}}'})
    from pulsartx.datasource.batch_reader import plan_partitions

    with pytest.raises(InvalidConfiguration, match="option startingOffsetsByTimestamp: topic 'persistent://public/"
                                                   "default/other' is not one of the topics this read covers"):
        plan_partitions(opts.root, opts)


def test_ending_timestamp_is_for_batch_reads():
    with pytest.raises(InvalidConfiguration, match="option endingTimestamp is for batch reads: a stream has no end"):
        parse_stream_options({"topic": "tt", "endingTimestamp": "1"})


@pytest.mark.parametrize(("kafka", "says"), [
    ("subscribe", "pulsartx reads the topic named by `topic`"),
    ("subscribePattern", "pulsartx calls it `topicsPattern`"),
    ("kafka.bootstrap.servers", "`service.url` names the storage root"),
    ("maxOffsetsPerTrigger", "pulsartx calls it `maxEntriesPerTrigger`"),
    ("startingOffsetsByTimestampStrategy", "starts at its end (the Kafka source's `latest` strategy); remove it"),
    ("kafka.security.protocol", "pulsartx has no Kafka client settings"),
])
def test_kafka_option_names_say_what_pulsartx_calls_them(kafka, says):
    """Fails before: ``subscribe`` was answered with "did you mean 'subscription'?", another thing."""
    for use in (READ, READ_STREAM):
        with pytest.raises(UnknownOption) as err:
            check_names({kafka.lower(): "x", "topic": "tt"}, use)
        assert says in str(err.value)
        assert "did you mean" not in str(err.value)
