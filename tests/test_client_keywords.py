"""Client, producer, reader and consumer keywords: a misspelt one is refused, naming the nearest,
and every keyword a method accepts is listed with its default in its docstring."""
from __future__ import annotations

import enum
import inspect
import re
from typing import Any

import pytest

import pulsartx
from pulsartx.client.producer import Producer
from pulsartx.exceptions import InvalidConfiguration, UnknownOption

# The public methods whose keywords are checked, and whose docstrings list them.
DOCUMENTED = [pulsartx.Client.__init__, pulsartx.Client.create_producer, pulsartx.Client.create_reader,
              pulsartx.Client.subscribe, pulsartx.Client.new_transaction]
SENDS = [Producer.send, Producer.send_async]


def _shown(default: Any) -> str | None:
    if default is inspect.Parameter.empty:
        return None
    if isinstance(default, enum.Enum):
        return f"{type(default).__name__}.{default.name}"
    return repr(default)


def _documented(fn: Any) -> dict[str, str | None]:
    doc = inspect.getdoc(fn) or ""
    assert "Keywords:" in doc, f"{fn.__qualname__} has no Keywords: section"
    section = doc.split("Keywords:", 1)[1]
    return {m.group(1): m.group(2) for m in re.finditer(r"^ {4}(\w+)(?:=(\S+?))?: ", section, re.MULTILINE)}


@pytest.mark.parametrize("fn", DOCUMENTED + SENDS, ids=lambda f: f.__qualname__)
def test_every_keyword_is_documented_with_its_default(fn: Any) -> None:
    """Fails when a keyword is added, renamed or re-defaulted without its docstring line."""
    keywords = getattr(fn, "keywords", None)
    if keywords is None:  # send/send_async: checked inline, the signature is the list
        keywords = {n: p.default for n, p in inspect.signature(fn).parameters.items()
                    if n != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD}
    expected = {n: _shown(d) for n, d in keywords.items() if n != "client"}
    assert _documented(fn) == expected


def test_a_misspelt_client_keyword_names_the_nearest(tmp_path: Any) -> None:
    with pytest.raises(UnknownOption) as err:
        pulsartx.Client(str(tmp_path), auto_create_partition=4)
    assert str(err.value) == ("Client() got an unexpected keyword argument 'auto_create_partition': "
                              "did you mean 'auto_create_partitions'?")
    # Still what Python raises for an unexpected keyword, and still a configuration error.
    assert isinstance(err.value, TypeError) and isinstance(err.value, InvalidConfiguration)
    with pytest.raises(UnknownOption, match="'zzz': its keywords are auto_create_partitions, "):
        pulsartx.Client(str(tmp_path), zzz=1)


def test_producer_consumer_reader_and_send_keywords(tmp_path: Any) -> None:
    client = pulsartx.Client(str(tmp_path), num_coordinators=1)
    with pytest.raises(UnknownOption, match="create_producer.*'compresion_type': did you mean 'compression_type'"):
        client.create_producer("typo", compresion_type="ZSTD")
    assert client.admin.list_topics() == []  # refused before the topic was auto-created
    with pytest.raises(UnknownOption, match="subscribe.*'initial_positon': did you mean 'initial_position'"):
        client.subscribe("typo", "s", initial_positon=pulsartx.InitialPosition.Earliest)
    with pytest.raises(UnknownOption, match="create_reader.*'isolation': did you mean 'isolation_level'"):
        client.create_reader("typo", pulsartx.MessageId.earliest, isolation="READ_UNCOMMITTED")
    with pytest.raises(UnknownOption, match="new_transaction.*'timeout': did you mean 'timeout_ms'"):
        client.new_transaction(timeout=5000)
    producer = client.create_producer("t", "p", 10, 0)  # positional arguments still work
    with pytest.raises(UnknownOption, match=r"Producer\.send\(\) .*'partition': did you mean 'partition_key'"):
        producer.send(b"x", partition=0)
    with pytest.raises(UnknownOption, match=r"Producer\.send_async\(\) .*'event_time': did you mean 'event_timestamp'"):
        producer.send_async(b"x", None, event_time=1)
    assert producer.send(b"ok", None, "k").offset() == 0
    client.close()
