"""The streaming source's offsets at the edges, driven without Spark (the calls Spark makes, in its
order): an explicit starting offset past a partition's end, a topic a pattern read is deleted, a
topic deleted and re-created under a running query and under a restarted one."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _reads import offset_numbers
from pulsartx.datasource.options import parse_stream_options
from pulsartx.datasource.stream_reader import PulsarTxStreamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable

import pulsartx
import pulsartx.log.partition as partition_mod
from pulsartx.exceptions import InvalidConfiguration
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName

Offsets = dict[str, dict[str, Any]]


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
        assert offset_numbers(logged) == {"public/default/pb-2": {"0": 5}}
        replay = _reader(root, topicsPattern="pb-.*", startingOffsets="earliest")
        assert offset_numbers(end) == {"public/default/pb-1": {"0": 3}, "public/default/pb-2": {"0": 3}}
        planned = replay.partitions(end, {"public/default/pb-1": {"0": 3}, "public/default/pb-2": {"0": 5}})
        assert [v for part in planned for b in replay.read(part)
                for v in b.column(b.schema.names.index("value")).to_pylist()] == [b"x0", b"x1"]
        restarted = _reader(root, topicsPattern="pb-.*", startingOffsets="earliest")
        _send(c, "pb-2", 1, "y")
        end2, values = _batch(restarted, {"public/default/pb-1": {"0": 3}, "public/default/pb-2": {"0": 5}})
        assert (offset_numbers(end2), values) == ({"public/default/pb-2": {"0": 6}}, [b"y0"])
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


def test_a_restarted_source_notices_its_topic_recreated_and_grown_past_its_offset(tmp_path: Path) -> None:
    with _recreated_after_a_batch(tmp_path) as (c, root, _, end):
        _send(c, "rc", 10, "new")
        restarted = _reader(root, topic="rc", startingOffsets="earliest")
        with pytest.raises(InvalidConfiguration, match="re-created"):
            restarted.latestOffset(end, ReadAllAvailable())


def test_a_restarted_source_reads_its_recreated_topic_from_its_start_once(tmp_path: Path) -> None:
    """failOnDataLoss=false: a restarted query reads the re-created topic, grown past the
    checkpoint's offset, from its start, each message once, also when a second restart replays
    that batch. Fails before the fix: it read on from the old offset, skipping new0..new2."""
    with _recreated_after_a_batch(tmp_path) as (c, root, _, end):
        _send(c, "rc", 10, "new")
        restarted = _reader(root, topic="rc", startingOffsets="earliest", failOnDataLoss="false")
        first, values = _batch(restarted, end)
        assert (offset_numbers(first), values) == ({"public/default/rc": {"0": 10}}, [f"new{i}".encode() for i in range(10)])
        replay = _reader(root, topic="rc", startingOffsets="earliest", failOnDataLoss="false")
        assert [v for part in replay.partitions(end, first) for b in replay.read(part)
                for v in b.column(b.schema.names.index("value")).to_pylist()] == values
        _send(c, "rc", 2, "more")
        for source in (restarted, replay):
            assert _batch(source, first)[1] == [b"more0", b"more1"]


def test_offsets_without_table_ids_still_load(tmp_path: Path) -> None:
    """A checkpoint written before offsets recorded their tables: read on from its offsets, and
    a topic re-created since and still shorter than them is noticed as before (by the end)."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("old", 1)
        _send(c, "old", 5)
        reader = _reader(root, topic="old")
        end, values = _batch(reader, {"public/default/old": {"0": 2}})
        assert values == [b"m2", b"m3", b"m4"]
        table = PartitionLog(c.root, TopicName.parse("old").with_partition(0)).table_id
        assert end == {"public/default/old": {"0": 5, "tableIds": {"0": table}}}
        c.admin.delete_topic("old")
        c.admin.create_topic("old", 1)
        _send(c, "old", 1, "new")
        with pytest.raises(InvalidConfiguration, match="re-created.*past the partition's end 1"):
            _reader(root, topic="old").latestOffset({"public/default/old": {"0": 5}}, ReadAllAvailable())
        lenient = _reader(root, topic="old", failOnDataLoss="false")
        assert _batch(lenient, {"public/default/old": {"0": 5}})[1] == [b"new0"]


@pytest.mark.parametrize("fail", ["true", "false"])
def test_a_batch_planned_on_a_table_since_recreated(tmp_path: Path, fail: str) -> None:
    """A logged batch whose end offsets are the old table's, replayed after the topic was
    re-created: those offsets are not read on the new table (whose first messages they would
    skip, then read again once the re-creation is noticed)."""
    with _recreated_after_a_batch(tmp_path, failOnDataLoss=fail) as (c, root, reader, start):
        planned = {"public/default/rc": {**start["public/default/rc"], "0": 5}}  # as logged before the delete
        _send(c, "rc", 8, "new")
        replay = _reader(root, topic="rc", failOnDataLoss=fail)
        if fail == "true":
            with pytest.raises(InvalidConfiguration, match="re-created after this micro-batch was planned"):
                replay.partitions(start, planned)
            return
        assert replay.partitions(start, planned) == []
        assert _batch(replay, planned)[1] == [f"new{i}".encode() for i in range(8)]


def test_starting_offsets_with_or_without_table_ids(tmp_path: Path) -> None:
    """startingOffsets as users write it (no table ids) works as before; one copied from a stream's
    offsets (with them) works on the same table and is refused on a re-created topic, as is the
    same JSON in a batch read's options."""
    from pulsartx.datasource.batch_reader import plan_partitions
    from pulsartx.datasource.options import parse_options

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("so", 1)
        _send(c, "so", 4)
        plain = _reader(root, topic="so", startingOffsets='{"so":{"0":1}}')
        initial = plain.initialOffset()
        assert offset_numbers(initial) == {"public/default/so": {"0": 1}}
        assert _batch(plain, initial)[1] == [b"m1", b"m2", b"m3"]
        copied = json.dumps(initial)
        again = _reader(root, topic="so", startingOffsets=copied)
        assert _batch(again, again.initialOffset())[1] == [b"m1", b"m2", b"m3"]
        c.admin.delete_topic("so")
        c.admin.create_topic("so", 1)
        _send(c, "so", 4, "new")
        with pytest.raises(InvalidConfiguration, match="option startingOffsets: offset 1 .* re-created"):
            _reader(root, topic="so", startingOffsets=copied).initialOffset()
        opts = parse_options({"service.url": root, "topic": "so", "startingOffsets": copied})
        with pytest.raises(InvalidConfiguration, match="option startingOffsets: offset 1 .* re-created"):
            plan_partitions(opts.root, opts)
        plain = _reader(root, topic="so", startingOffsets='{"so":{"0":1}}')
        assert _batch(plain, plain.initialOffset())[1] == [b"new1", b"new2", b"new3"]


def test_table_ids_in_offsets_json_are_checked() -> None:
    from pulsartx.commit_protocol.handoff import is_offsets
    from pulsartx.datasource.offsets import parse_offsets, with_timestamps

    spec = parse_offsets("startingOffsets", '{"t":{"0":3,"1":4,"tableIds":{"0":"a"}}}', -1)
    assert (spec.per_partition, spec.tables) == ({"persistent://public/default/t": {0: 3, 1: 4}},
                                                 {"persistent://public/default/t": {0: "a"}})
    for bad in ('{"t":{"0":3,"tableIds":{"1":"a"}}}', '{"t":{"0":3,"tableIds":["a"]}}',
                '{"t":{"0":3,"tableIds":{"0":7}}}'):
        with pytest.raises(InvalidConfiguration, match="tableIds"):
            parse_offsets("startingOffsets", bad, -1)
    with pytest.raises(InvalidConfiguration, match="partition key 'tableIds'"):  # times are not offsets
        with_timestamps(spec, "startingTimestamp", None, "startingOffsetsByTimestamp", '{"t":{"0":3,"tableIds":{}}}')
    assert is_offsets({"public/default/t": {"0": 3, "tableIds": {"0": "a"}}})
    assert is_offsets({"public/default/t": {"0": 3}})
    assert not is_offsets({"public/default/t": {"0": 3, "tableIds": "a"}})


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
    offsets have the old numbers, on the new table, so Spark (which compares offsets' JSON) runs a
    batch that reads the new topic from its start, and the one after it on from its end. Fails
    before the fix: the new messages were skipped (the offsets named no table, so Spark ran no
    batch, and the next one had to notice that it started at the old offset again)."""
    monkeypatch.setattr(partition_mod, "INCARNATION_CHECK_S", 0.0)
    with _recreated_after_a_batch(tmp_path, failOnDataLoss="false") as (c, _, reader, end):
        _send(c, "rc", 3, "new")
        first = reader.latestOffset(end, ReadAllAvailable())
        assert offset_numbers(first) == offset_numbers(end) and first != end  # a batch runs
        assert [v for part in reader.partitions(end, first) for b in reader.read(part)
                for v in b.column(b.schema.names.index("value")).to_pylist()] == [b"new0", b"new1", b"new2"]
        _send(c, "rc", 2, "more")
        end, values = _batch(reader, first)
        assert (offset_numbers(end), values) == ({"public/default/rc": {"0": 5}}, [b"more0", b"more1"])
        _send(c, "rc", 1, "last")
        end, values = _batch(reader, end)
        assert values == [b"last0"]


@pytest.mark.parametrize("recorded", [True, False], ids=["table ids", "offsets without table ids"])
def test_a_recreated_topics_batch_starting_at_the_old_offset_reads_on(tmp_path: Path, monkeypatch: Any,
                                                                      recorded: bool) -> None:
    """Once a batch read the re-created topic from its start, a later batch that starts at the
    number the old topic's offset had reads on from there (nothing twice), whether the offsets
    record their tables or come from before they did."""
    monkeypatch.setattr(partition_mod, "INCARNATION_CHECK_S", 0.0)

    def batch(start: Offsets) -> tuple[Offsets, list[bytes]]:
        return _batch(reader, start if recorded else offset_numbers(start))

    with _recreated_after_a_batch(tmp_path, failOnDataLoss="false") as (c, _, reader, end):
        _send(c, "rc", 1, "a")
        end, values = batch(end)
        assert (offset_numbers(end), values) == ({"public/default/rc": {"0": 1}}, [b"a0"])
        _send(c, "rc", 2, "b")
        end, values = batch(end)
        assert (offset_numbers(end), values) == ({"public/default/rc": {"0": 3}}, [b"b0", b"b1"])
        _send(c, "rc", 1, "c")
        assert batch(end)[1] == [b"c0"]


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


def _new_topics_subscription_after_an_old_batch_commits(root: str, topic: str, replay: bool) -> list[bytes]:
    """A subscription source (failOnDataLoss=false) reads a first batch of ``topic``, the topic is
    deleted and re-created with subscription ``s`` at its start and 5 new messages, then the old
    batch is committed (after Spark replayed it, with ``replay``): what ``s`` then receives."""
    with pulsartx.Client(root) as c:
        c.admin.create_topic(topic, 1)
        _send(c, topic, 3)
        reader = _reader(root, topic=topic, subscription="s", startingOffsets="earliest", failOnDataLoss="false")
        start = reader.initialOffset()
        end, values = _batch(reader, start)
        assert values == [b"m0", b"m1", b"m2"]
        c.admin.delete_topic(topic)
        c.admin.create_topic(topic, 1)
        c.subscribe(topic, "s", initial_position=pulsartx.InitialPosition.Earliest).close()
        _send(c, topic, 5, "new")
        if replay:  # the batch replayed (its tasks failed): nothing of the new topic
            assert reader.partitions(start, end) == []
        reader.commit(end)  # then Spark commits it
        consumer = c.subscribe(topic, "s")
        got = [m.data() for m in consumer.batch_receive(10, 2000)]
        consumer.close()
        return got


def test_a_commit_whose_end_names_a_replaced_table_leaves_the_new_topics_subscription(tmp_path: Path,
                                                                                   monkeypatch: Any) -> None:
    """failOnDataLoss=false: a batch planned on the old topic (its end names the old table) that ends
    after the topic was re-created reads nothing of the new one, and its commit must not move the
    new topic's subscription to the old topic's offset either: that would acknowledge new messages
    nobody read. Fails before the fix: the subscription lost new0..new2."""
    monkeypatch.setattr(partition_mod, "INCARNATION_CHECK_S", 0.0)
    got = _new_topics_subscription_after_an_old_batch_commits(str(tmp_path / "root"), "rc", replay=True)
    assert got == [b"new0", b"new1", b"new2", b"new3", b"new4"]


def test_a_restarted_source_commits_a_batch_whose_end_names_a_deleted_topic(tmp_path: Path) -> None:
    """On a restart Spark commits the last batch's end (``commit`` of batch N while constructing
    N+1) in a source process that never loaded its partitions. A topic the pattern read and that was
    deleted since has nothing to move (its subscription went with it); its table id, which the end
    records, must not make the commit load the deleted partition and fail the query with
    TopicNotFound."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("pd-1", 1)
        c.admin.create_topic("pd-2", 1)
        _send(c, "pd-1", 3)
        _send(c, "pd-2", 3)
        reader = _reader(root, topicsPattern="pd-.*", subscription="s", startingOffsets="earliest")
        end, values = _batch(reader, reader.initialOffset())
        assert sorted(values) == [b"m0", b"m0", b"m1", b"m1", b"m2", b"m2"]
        assert "tableIds" in end["public/default/pd-1"]
        c.admin.delete_topic("pd-1")
        restarted = _reader(root, topicsPattern="pd-.*", subscription="s", startingOffsets="earliest")
        restarted.latestOffset(end, ReadAllAvailable())  # batch N+1 is planned, then N committed
        restarted.commit(end)
        consumer = c.subscribe("pd-2", "s")
        assert consumer.batch_receive(10, 500) == []  # the live topic's subscription moved past the batch
        consumer.close()


def test_a_commit_right_after_a_recreation_leaves_the_new_topics_subscription(tmp_path: Path) -> None:
    """As above, with the partition log's own incarnation check at its default interval: the topic
    is re-created while the batch runs, and Spark commits it at once. A table id the log checked up
    to INCARNATION_CHECK_S ago still names the old table, and the commit moved the new topic's
    subscription to the old topic's offset: new0..new2 acknowledged, never read."""
    got = _new_topics_subscription_after_an_old_batch_commits(str(tmp_path / "root"), "rn", replay=False)
    assert got == [b"new0", b"new1", b"new2", b"new3", b"new4"]
