"""A topic created on first use is logged once, at INFO, naming it and the way to turn auto-creation
off: a misspelt name in ``create_reader`` otherwise creates a topic nobody notices."""
from __future__ import annotations

import logging

import pytest

import pulsartx
from pulsartx import InitialPosition, MessageId, TopicNotFound

HINT = "on first use; Client(..., auto_create_topics=False) turns auto-creation off"


def _about(caplog, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("pulsartx") and name in r.getMessage()]


@pytest.fixture
def client(root):
    c = pulsartx.Client(root)
    yield c
    c.close()


@pytest.mark.parametrize("opener", ["create_producer", "subscribe", "create_reader"])
def test_one_info_line_names_the_created_topic_and_the_switch(client, caplog, opener: str) -> None:
    name = f"made-by-{opener}"
    open_it = {"create_producer": lambda: client.create_producer(name),
               "subscribe": lambda: client.subscribe(name, "s", initial_position=InitialPosition.Earliest),
               "create_reader": lambda: client.create_reader(name, MessageId.earliest)}[opener]
    with caplog.at_level(logging.DEBUG, logger="pulsartx"):
        open_it().close()
        assert [(r.levelname, r.getMessage()) for r in _about(caplog, name)] == [
            ("INFO", f"auto-created topic persistent://public/default/{name} with 1 partition(s) {HINT}")]
        caplog.clear()
        open_it().close()  # it exists now: nothing more to say
        assert [r for r in _about(caplog, "auto-created") if r.levelno >= logging.INFO] == []


def test_a_partitioned_topic_is_named_with_its_count(root, caplog) -> None:
    c = pulsartx.Client(root, auto_create_partitions=3)
    try:
        with caplog.at_level(logging.INFO, logger="pulsartx"):
            c.create_producer("tenant1/ns1/wide").close()
        assert [r.getMessage() for r in _about(caplog, "wide")] == [
            f"auto-created topic persistent://tenant1/ns1/wide with 3 partition(s) {HINT}"]
    finally:
        c.close()


def test_nothing_is_logged_when_auto_creation_is_off(root, caplog) -> None:
    c = pulsartx.Client(root, auto_create_topics=False)
    try:
        with caplog.at_level(logging.DEBUG, logger="pulsartx"), pytest.raises(TopicNotFound):
            c.create_reader("readme-missing", MessageId.earliest)
        assert [r for r in _about(caplog, "readme-missing") if r.levelno >= logging.INFO] == []
    finally:
        c.close()


def test_an_explicit_create_keeps_its_own_line(client, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="pulsartx"):
        client.admin.create_topic("explicit", partitions=2)
    assert [r.getMessage() for r in _about(caplog, "explicit")] == [
        "created topic persistent://public/default/explicit with 2 partition(s)"]
