"""Spark option names: a misspelt or misplaced option is refused, naming the nearest valid one or
where it belongs; what Spark adds itself is accepted."""
from __future__ import annotations

import pytest
from pulsartx.datasource.option_table import (
    ANY_READ,
    OPTIONS,
    READ,
    READ_STREAM,
    USES,
    WRITE,
    WRITE_STREAM,
    check_names,
)
from pulsartx.datasource.options import parse_options, parse_stream_options, parse_write_options

from pulsartx.exceptions import InvalidConfiguration, UnknownOption

BASE = {"service.url": "/tmp/pulsartx-option-names-never-created", "topic": "t"}


@pytest.mark.parametrize("given,meant", [("servce.url", "service.url"), ("startingOffset", "startingOffsets"),
                                         ("topicPattern", "topicsPattern"), ("isolationlevel ", "isolationLevel"),
                                         ("maxEntriesPerPartitions", "maxEntriesPerPartition")])
def test_a_misspelt_read_option_names_the_nearest(given: str, meant: str) -> None:
    """Fails before the fix: the misspelt option was ignored and its default used."""
    with pytest.raises(UnknownOption) as err:
        parse_options({**BASE, given.lower(): "x"})  # Spark hands keys over lowercased
    assert str(err.value).startswith(f"unknown option {given.lower()!r} for spark.read.format('pulsartx'): "
                                     f"did you mean {meant!r}?")


def test_write_and_stream_typos_name_their_api() -> None:
    with pytest.raises(UnknownOption, match=r"'createtopc' for df\.write\.format\('pulsartx'\): did you mean 'createTopic'"):
        parse_write_options({**BASE, "createtopc": "true"})
    with pytest.raises(UnknownOption, match=r"for spark\.readStream.*did you mean 'maxEntriesPerTrigger'"):
        parse_stream_options({**BASE, "maxentriespertriger": "5"})
    with pytest.raises(UnknownOption, match=r"for df\.writeStream.*did you mean 'transactionKey'"):
        check_names({**BASE, "transactionky": "k"}, WRITE_STREAM)
    # schema() cannot tell read from readStream: it takes the nearest of both.
    with pytest.raises(UnknownOption, match=r"for spark\.read/readStream.*did you mean 'maxEntriesPerTrigger'"):
        check_names({**BASE, "maxentriespertriger": "5"}, ANY_READ)


def test_a_name_far_from_every_option_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownOption) as err:
        parse_options({**BASE, "qqqzzz.xyz": "x"})  # a Kafka name gets its own answer (test_timestamp_options)
    assert "the spark.read options are service.url, topic, path, topics" in str(err.value)
    assert isinstance(err.value, InvalidConfiguration)


def test_an_option_of_another_api_says_where_it_belongs() -> None:
    with pytest.raises(InvalidConfiguration, match="option maxEntriesPerTrigger is for streaming reads"):
        parse_options({**BASE, "maxentriespertrigger": "5"})
    with pytest.raises(InvalidConfiguration, match="option createTopic is for writing"):
        parse_options({**BASE, "createtopic": "true"})
    with pytest.raises(InvalidConfiguration, match="option subscription is for streaming reads"):
        parse_options({**BASE, "subscription": "s"})
    with pytest.raises(InvalidConfiguration, match="option transactionKey is for streaming writes"):
        parse_write_options({**BASE, "transactionkey": "k"})


def test_spark_keys_and_the_storage_family_are_accepted() -> None:
    for use, parse in [(READ, parse_options), (WRITE, parse_write_options)]:
        opts = {"service.url": BASE["service.url"], "path": "t", "queryname": "q", "checkpointlocation": "/tmp/c",
                "pulsartx.storage.aws_region": "eu-west-1"}
        parse(opts)
        check_names(opts, use)
    assert parse_stream_options({**BASE, "queryname": "q"}).read.selection is not None
    with pytest.raises(InvalidConfiguration, match="has no key"):
        parse_options({**BASE, "pulsartx.storage.": "x"})
    with pytest.raises(InvalidConfiguration, match=r'load\(\) was given several paths.*option\("topics", "a,b"\)'):
        parse_options({"service.url": BASE["service.url"], "paths": '["a","b"]'})


def test_every_table_option_is_accepted_where_the_table_says() -> None:
    for o in OPTIONS:
        key = "pulsartx.storage.x" if o.prefix else o.name.lower()
        for use in USES:
            if use in o.uses or o.name == "checkpointLocation":  # Spark's own: accepted everywhere
                check_names({key: "v"}, use)
            else:
                with pytest.raises(InvalidConfiguration, match=f"option {o.name} is for "):
                    check_names({key: "v"}, use)
    assert {READ, READ_STREAM, WRITE, WRITE_STREAM} == set(USES)
