"""The streaming source's offsets at the edges, driven without Spark (the calls Spark makes, in its
order): an explicit starting offset past a partition's end, a topic a pattern read is deleted, a
topic deleted and re-created under a running query and under a restarted one."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pulsartx.datasource.options import parse_stream_options
from pulsartx.datasource.stream_reader import PulsarTxStreamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable

import pulsartx
import pulsartx.log.partition as partition_mod
from pulsartx.exceptions import InvalidConfiguration

Offsets = dict[str, dict[str, int]]


def _send(client: Any, topic: str, n: int, prefix: str = "m") -> None:
    p = client.create_producer(topic)
    for i in range(n):
        p.send(f"{prefix}{i}".encode())
    p.close()


def _reader(root: str, **options: str) -> PulsarTxStreamReader:
    return PulsarTxStreamReader(parse_stream_options({"service.url": root, **options}))


def _batch(reader: PulsarTxStreamReader, start: Offsets) -> tuple[Offsets, list[bytes]]:
    """One micro-batch from ``start``: its end offsets and the values it reads."""
    end = reader.latestOffset(start, ReadAllAvailable())
    values = [v for part in reader.partitions(start, end) for b in reader.read(part)
              for v in b.column(b.schema.names.index("value")).to_pylist()]
    return end, values


@contextlib.contextmanager
def _recreated_after_a_batch(tmp_path: Path, **options: str) -> Iterator[tuple[Any, str, PulsarTxStreamReader,
                                                                                Offsets]]:
    """Topic ``rc`` with 3 messages, all read by a first micro-batch of a source (``options``), then
    deleted and re-created empty: (client, root, source, that batch's end offsets)."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("rc", 1)
        _send(c, "rc", 3)
        reader = _reader(root, topic="rc", startingOffsets="earliest", **options)
        end, values = _batch(reader, reader.initialOffset())
        assert values == [b"m0", b"m1", b"m2"]
        c.admin.delete_topic("rc")
        c.admin.create_topic("rc", 1)
        yield c, root, reader, end


@pytest.mark.parametrize("fail", ["true", "false"])
def test_a_starting_offset_past_the_end_is_refused_naming_the_option(tmp_path: Path, fail: str) -> None:
    """Fails before the fix: the first batch took the offset for a checkpoint of a re-created
    topic and said so ("this query's checkpoint is at offset 50"), or, with failOnDataLoss=false,
    read the partition from its earliest offset, which the option asked to skip."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("a", 1)
        _send(c, "a", 5)
    reader = _reader(root, topic="a", startingOffsets='{"a":{"0":50}}', failOnDataLoss=fail)
    with pytest.raises(InvalidConfiguration, match=r"option startingOffsets: offset 50 .* past the partition's end 5"):
        reader.initialOffset()
    at_end = _reader(root, topic="a", startingOffsets='{"a":{"0":5}}', failOnDataLoss=fail)
    assert _batch(at_end, at_end.initialOffset())[1] == []


def test_a_deleted_pattern_topic_leaves_the_offsets_and_a_restarted_source_plans_on(tmp_path: Path) -> None:
    """Fails before the fix: the deleted topic stayed in every later batch's offsets, and a source
    process that had not loaded it before the delete (any restart of the query) failed every
    batch with TopicNotFound, forever. A topic re-created under the name is read from its start."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("pb-1", 1)
        c.admin.create_topic("pb-2", 1)
        _send(c, "pb-1", 3)
        _send(c, "pb-2", 3)
        reader = _reader(root, topicsPattern="pb-.*", startingOffsets="earliest")
        end, _ = _batch(reader, reader.initialOffset())
        # A batch Spark logged before the delete, replayed by a restarted query after it.
        c.admin.delete_topic("pb-1")
        _send(c, "pb-2", 2, "x")
        logged = reader.latestOffset(end, ReadAllAvailable())
        assert logged == {"public/default/pb-2": {"0": 5}}
        replay = _reader(root, topicsPattern="pb-.*", startingOffsets="earliest")
        assert end == {"public/default/pb-1": {"0": 3}, "public/default/pb-2": {"0": 3}}
        planned = replay.partitions(end, {"public/default/pb-1": {"0": 3}, "public/default/pb-2": {"0": 5}})
        assert [v for part in planned for b in replay.read(part)
                for v in b.column(b.schema.names.index("value")).to_pylist()] == [b"x0", b"x1"]
        restarted = _reader(root, topicsPattern="pb-.*", startingOffsets="earliest")
        _send(c, "pb-2", 1, "y")
        end2, values = _batch(restarted, {"public/default/pb-1": {"0": 3}, "public/default/pb-2": {"0": 5}})
        assert (end2, values) == ({"public/default/pb-2": {"0": 6}}, [b"y0"])
        c.admin.create_topic("pb-1", 1)
        _send(c, "pb-1", 1, "new")
        assert _batch(restarted, end2)[1] == [b"new0"]


@pytest.mark.parametrize("fail", ["true", "false"])
def test_a_running_source_notices_its_topic_recreated_and_grown_past_its_offset(tmp_path: Path, monkeypatch: Any,
                                                                                 fail: str) -> None:
    """The topic is deleted and re-created under a running query, and holds more messages than the
    query had read before it looks. Fails before the fix: the source read the new topic on from the
    old one's offset, skipping its first messages silently, with failOnDataLoss=true too."""
    monkeypatch.setattr(partition_mod, "INCARNATION_CHECK_S", 0.0)
    with _recreated_after_a_batch(tmp_path, failOnDataLoss=fail) as (c, _, reader, end):
        _send(c, "rc", 10, "new")
        if fail == "true":
            with pytest.raises(InvalidConfiguration, match="re-created.*up to offset 3.*failOnDataLoss=false"):
                reader.latestOffset(end, ReadAllAvailable())
            return
        end, values = _batch(reader, end)
        assert values == [f"new{i}".encode() for i in range(10)]
        _send(c, "rc", 2, "more")
        assert _batch(reader, end)[1] == [b"more0", b"more1"]


@pytest.mark.xfail(strict=True, reason="the offsets JSON ({topic: {partition: offset}}) does not record the "
                   "partition's table (incarnation): a restarted query cannot tell a re-created topic that grew past "
                   "its checkpoint's offset from the old one, and reads it on from that offset")
def test_a_restarted_source_notices_its_topic_recreated_and_grown_past_its_offset(tmp_path: Path) -> None:
    with _recreated_after_a_batch(tmp_path) as (c, root, _, end):
        _send(c, "rc", 10, "new")
        restarted = _reader(root, topic="rc", startingOffsets="earliest")
        with pytest.raises(InvalidConfiguration, match="re-created"):
            restarted.latestOffset(end, ReadAllAvailable())


def test_max_entries_per_trigger_starves_no_partition_beside_a_large_backlog() -> None:
    """A partition fed faster than maxEntriesPerTrigger keeps a large backlog beside another with a
    few entries. Fails before the fix: the small one's proportional share rounded down to nothing
    and the remainders went to the large one, batch after batch, so its entries were never read."""
    from pulsartx.datasource.stream_reader import spread

    backlog = {"big": 100_000, "small": 5}
    for _ in range(10):  # micro-batches while "big" receives 200 entries a batch
        taken = spread(100, backlog)
        assert sum(taken.values()) == 100 and all(taken[k] <= backlog[k] for k in backlog)
        backlog = {"big": backlog["big"] - taken["big"] + 200, "small": backlog["small"] - taken["small"]}
    assert backlog["small"] == 0
    assert spread(10, {"a": 3, "b": 3, "c": 3, "d": 30}) == {"a": 1, "b": 1, "c": 1, "d": 7}
    assert spread(1, {"a": 1000, "b": 1}) == {"a": 0, "b": 1}
    assert spread(50, {"a": 20, "b": 10}) == {"a": 20, "b": 10}


def test_a_recreated_topic_read_up_to_the_old_offset_is_not_read_again(tmp_path: Path, monkeypatch: Any) -> None:
    """The new topic holds as many messages as the query had read of the old one: its first end
    offsets equal the old ones, so Spark runs no batch, and the next batch starts at the old offset
    again. That batch reads the new topic from its start, and the one after it on from its end.
    Fails before the fix: the new messages were skipped."""
    monkeypatch.setattr(partition_mod, "INCARNATION_CHECK_S", 0.0)
    with _recreated_after_a_batch(tmp_path, failOnDataLoss="false") as (c, _, reader, end):
        _send(c, "rc", 3, "new")
        assert reader.latestOffset(end, ReadAllAvailable()) == end  # no batch
        _send(c, "rc", 2, "more")
        end, values = _batch(reader, end)
        assert (end, values) == ({"public/default/rc": {"0": 5}}, [b"new0", b"new1", b"new2", b"more0", b"more1"])
        _send(c, "rc", 1, "last")
        end, values = _batch(reader, end)
        assert values == [b"last0"]
        _send(c, "rc", 2, "x")
        assert _batch(reader, end)[1] == [b"x0", b"x1"]


def test_a_recreated_topics_batch_starting_at_the_old_offset_reads_on(tmp_path: Path, monkeypatch: Any) -> None:
    """Once a batch read the re-created topic from its start, a later batch that starts at the
    number the old topic's offset had reads on from there (nothing twice)."""
    monkeypatch.setattr(partition_mod, "INCARNATION_CHECK_S", 0.0)
    with _recreated_after_a_batch(tmp_path, failOnDataLoss="false") as (c, _, reader, end):
        _send(c, "rc", 1, "a")
        end, values = _batch(reader, end)
        assert (end, values) == ({"public/default/rc": {"0": 1}}, [b"a0"])
        _send(c, "rc", 2, "b")
        end, values = _batch(reader, end)
        assert (end, values) == ({"public/default/rc": {"0": 3}}, [b"b0", b"b1"])
        _send(c, "rc", 1, "c")
        assert _batch(reader, end)[1] == [b"c0"]


def test_a_pattern_topic_missing_from_one_listing_keeps_its_offsets(tmp_path: Path, monkeypatch: Any) -> None:
    """A topic that still exists but one listing left out is not taken for deleted: dropped from
    the offsets, it would be read again from its start at the next batch."""
    from pulsartx.admin.topics import TopicsAdmin

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("pl-1", 1)
        c.admin.create_topic("pl-2", 1)
        _send(c, "pl-1", 2)
        _send(c, "pl-2", 2)
        reader = _reader(root, topicsPattern="pl-.*", startingOffsets="earliest")
        end, _ = _batch(reader, reader.initialOffset())
        listing = TopicsAdmin.list_topics
        with monkeypatch.context() as m:
            m.setattr(TopicsAdmin, "list_topics", lambda self, ns=None: [t for t in listing(self, ns) if "pl-1" not in t])
            assert reader.latestOffset(end, ReadAllAvailable()) == end
        _send(c, "pl-1", 1, "x")
        assert _batch(reader, end)[1] == [b"x0"]
