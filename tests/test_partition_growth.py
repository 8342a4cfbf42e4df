"""Growing a topic's partition count (``update_partitioned_topic``, ``pulsar-admin topics
update-partitioned-topic``): only increases, tables made before the count shows, concurrent
updaters and an updater racing a delete end consistent, and clients, transactions and the Spark
sources see the new partitions."""
from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from _reads import committed_values, drain, offset_numbers  # tests/ is on sys.path (conftest)

import pulsartx
from pulsartx import InitialPosition
from pulsartx.exceptions import InvalidConfiguration, TopicNotFound
from pulsartx.storage import faults
from pulsartx.storage.root import StorageRoot

T = "persistent://public/default/g"


def _table_exists(root: str, topic: str, i: int) -> bool:
    return StorageRoot.resolve(root).exists("topics", "public", "default", topic, f"partition-{i}", "_delta_log",
                                            "00000000000000000000.json")


def _pause_growth_markers(monkeypatch: pytest.MonkeyPatch,
                          gates: dict[str, tuple[threading.Event, threading.Event]]) -> None:
    """Pause the thread named ``k`` just before it writes a growth marker: it sets ``gates[k][0]``
    and waits for ``gates[k][1]``."""
    real = faults.before

    def before(op: Any, path: str) -> Any:
        gate = gates.get(threading.current_thread().name)
        if gate is not None and op in (faults.Op.WRITE, faults.Op.CREATE) and "/_growth/" in path:
            arrived, go = gate
            arrived.set()
            assert go.wait(10)
        return real(op, path)

    monkeypatch.setattr(faults, "before", before)


def _start(name: str, fn: Any, results: dict[str, Any]) -> threading.Thread:
    def body() -> None:
        try:
            results[name] = fn()
        except BaseException as e:  # reported by the assertions
            results[name] = e

    th = threading.Thread(target=body, name=name)
    th.start()
    return th


def test_grow_makes_the_tables_and_new_clients_use_every_partition(client: Any, root: str) -> None:
    client.admin.create_topic("g", 2)
    assert client.admin.update_partitioned_topic("g", 4) == 4
    assert client.admin.get_partitions("g") == 4
    assert [str(p) for p in client.admin.partitions_of("g")] == [f"{T}-partition-{i}" for i in range(4)]
    assert client.admin.get_partitions("g-partition-3") == 4
    assert all(_table_exists(root, "g", i) for i in range(4))
    assert client.admin.list_topics() == [T]
    producer = client.create_producer("g")
    for i in range(40):
        producer.send(f"m{i}".encode(), partition_key=f"k{i}")
    producer.close()
    consumer = client.subscribe("g", "s", initial_position=InitialPosition.Earliest)
    got = drain(consumer)
    assert sorted(m.data() for m in got) == sorted(f"m{i}".encode() for i in range(40))
    assert {m.message_id().partition() for m in got} == {0, 1, 2, 3}


def test_lower_or_equal_counts_are_refused_naming_both(client: Any) -> None:
    client.admin.create_topic("g", 3)
    for n in (3, 2, 1):
        with pytest.raises(InvalidConfiguration, match=rf"has 3 partition\(s\) and cannot go to {n}.*more than 3"):
            client.admin.update_partitioned_topic("g", n)
    with pytest.raises(InvalidConfiguration, match="names one partition"):
        client.admin.update_partitioned_topic("g-partition-0", 5)
    for bad in (0, 10_001, True, "5"):
        with pytest.raises(InvalidConfiguration, match="must be an integer from 1 to 10000"):
            client.admin.update_partitioned_topic("g", bad)
    with pytest.raises(TopicNotFound, match="topic persistent://public/default/nope does not exist"):
        client.admin.update_partitioned_topic("nope", 5)
    assert client.admin.get_partitions("g") == 3


def test_the_count_never_shows_a_partition_without_its_table(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paused just before its marker, the update has made every new table and the old count
    still shows; every count observed while it runs has all its tables."""
    gates = {"grow": (threading.Event(), threading.Event())}
    _pause_growth_markers(monkeypatch, gates)
    with pulsartx.Client(root) as c:
        c.admin.create_topic("g", 1)
        results: dict[str, Any] = {}
        th = _start("grow", lambda: c.admin.update_partitioned_topic("g", 5), results)
        assert gates["grow"][0].wait(10)
        assert c.admin.get_partitions("g") == 1
        assert all(_table_exists(root, "g", i) for i in range(5))
        gates["grow"][1].set()
        th.join(10)
        assert results["grow"] == 5
        assert c.admin.get_partitions("g") == 5


def _no_put_if_absent(monkeypatch: pytest.MonkeyPatch, cas: bool) -> None:
    """``cas=False``: the root behaves as a store without put-if-absent (plain puts only)."""
    if not cas:
        monkeypatch.setattr(StorageRoot, "has_put_if_absent", property(lambda self: False))


@pytest.mark.parametrize("cas", [True, False])
@pytest.mark.parametrize("first", ["to6", "to8"])
def test_concurrent_updaters_never_lower_the_count(root: str, monkeypatch: pytest.MonkeyPatch, first: str,
                                                   cas: bool) -> None:
    """Both updaters passed their check (4 partitions) and made their tables; whichever marker
    lands last, the count is the higher one and stays there, with or without put-if-absent."""
    _no_put_if_absent(monkeypatch, cas)
    gates = {n: (threading.Event(), threading.Event()) for n in ("to6", "to8")}
    _pause_growth_markers(monkeypatch, gates)
    with pulsartx.Client(root) as c:
        c.admin.create_topic("g", 4)
        results: dict[str, Any] = {}
        threads = {n: _start(n, lambda n=n: c.admin.update_partitioned_topic("g", int(n[2:])), results)
                   for n in ("to6", "to8")}
        for n in threads:
            assert gates[n][0].wait(10)
        second = "to8" if first == "to6" else "to6"
        gates[first][1].set()
        threads[first].join(10)
        assert c.admin.get_partitions("g") == int(first[2:])
        gates[second][1].set()
        threads[second].join(10)
        assert results == {"to6": results["to6"], "to8": 8} and results["to6"] in (6, 8)
        assert c.admin.get_partitions("g") == 8
        assert all(_table_exists(root, "g", i) for i in range(8))
        with pytest.raises(InvalidConfiguration, match="has 8 partition"):
            c.admin.update_partitioned_topic("g", 7)


@pytest.mark.parametrize("cas", [True, False])
def test_many_free_running_updaters_end_at_the_highest_count_with_every_table(
        root: str, monkeypatch: pytest.MonkeyPatch, cas: bool) -> None:
    _no_put_if_absent(monkeypatch, cas)
    with pulsartx.Client(root) as c:
        c.admin.create_topic("g", 1)
        results: dict[str, Any] = {}
        threads = [_start(f"u{n}", lambda n=n: c.admin.update_partitioned_topic("g", n), results) for n in range(2, 9)]
        for th in threads:
            th.join(30)
        ok = {n: r for n, r in results.items() if not isinstance(r, BaseException)}
        refused = {n: r for n, r in results.items() if isinstance(r, BaseException)}
        assert "u8" in ok and all(isinstance(e, InvalidConfiguration) for e in refused.values())
        assert c.admin.get_partitions("g") == 8
        assert all(_table_exists(root, "g", i) for i in range(8))


def test_an_update_racing_a_delete_counts_for_no_topic(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The topic is deleted (and re-created with 2 partitions) while an update to 6 is paused
    before its marker: the update reports the topic gone, and its late marker never counts for
    the new topic, which keeps its own 2 partitions and can grow on its own."""
    gates = {"grow": (threading.Event(), threading.Event())}
    _pause_growth_markers(monkeypatch, gates)
    with pulsartx.Client(root) as c:
        c.admin.create_topic("g", 1)
        results: dict[str, Any] = {}
        th = _start("grow", lambda: c.admin.update_partitioned_topic("g", 6), results)
        assert gates["grow"][0].wait(10)
        c.admin.delete_topic("g")
        c.admin.create_topic("g", 2)
        gates["grow"][1].set()
        th.join(10)
        assert isinstance(results["grow"], TopicNotFound) and "deleted while growing" in str(results["grow"])
        assert c.admin.get_partitions("g") == 2
        assert c.admin.update_partitioned_topic("g", 3) == 3
        p = c.create_producer("g-partition-2")
        p.send(b"x")
        p.close()
        assert committed_values(c, "g") == [b"x"]


def test_a_delete_after_a_growth_it_did_not_see_removes_the_new_partitions_subscriptions(
        root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The growth lands between the delete's read of the count and its removal of ``_topic.json``:
    the new partition's subscription is deleted with the topic, not left for a re-created one."""
    with pulsartx.Client(root) as c:
        c.admin.create_topic("g", 1)
        real_rm = StorageRoot.rm

        def rm(self: StorageRoot, *segments: str) -> None:
            if segments[-1:] == ("_topic.json",) and c.admin.get_partitions("g") == 1:
                c.admin.update_partitioned_topic("g", 2)
                c.subscribe("g-partition-1", "late").close()
            real_rm(self, *segments)

        monkeypatch.setattr(StorageRoot, "rm", rm)
        c.admin.delete_topic("g")
        monkeypatch.setattr(StorageRoot, "rm", real_rm)
        c.admin.create_topic("g", 2)
        assert c.admin.list_subscriptions("g") == []


def test_a_live_producer_takes_on_new_partitions_within_its_update_interval(
        client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Routing is deterministic per count: before the growth every key goes to its partition of
    2, after it to its partition of 4 (most keys move, as in Pulsar); unkeyed batches rotate over
    all 4. A named producer's name is taken on the new partitions too."""
    import time

    import pulsartx.client.partition_updates as updates_mod
    from pulsartx.client.routing import partition_for_key
    from pulsartx.exceptions import ProducerBusy

    monkeypatch.setattr(updates_mod, "PARTITIONS_UPDATE_INTERVAL_S", 0.05)
    client.admin.create_topic("g", 2)
    producer = client.create_producer("g", producer_name="live")
    keys = [f"k{i}" for i in range(20)]
    assert [producer.send(b"x", partition_key=k).partition() for k in keys] == [partition_for_key(k, 2) for k in keys]
    client.admin.update_partitioned_topic("g", 4)
    deadline = time.monotonic() + 5
    while len(producer._partitions) < 4:
        assert time.monotonic() < deadline, "the producer did not take on the new partitions"
        time.sleep(0.02)
    assert [producer.send(b"y", partition_key=k).partition() for k in keys] == [partition_for_key(k, 4) for k in keys]
    assert {producer.send(b"z").partition() for _ in range(8)} == {0, 1, 2, 3}
    with pytest.raises(ProducerBusy):
        client.create_producer("g-partition-3", producer_name="live")
    producer.close()
    client.create_producer("g-partition-3", producer_name="live").close()
    assert len(committed_values(client, "g")) == 48


def test_a_listing_that_lags_behind_a_marker_never_lowers_the_count_seen(
        client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    client.admin.create_topic("g", 1)
    client.admin.update_partitioned_topic("g", 3)
    assert client.admin.get_partitions("g") == 3
    real = StorageRoot.listdir
    monkeypatch.setattr(StorageRoot, "listdir",
                        lambda self, *s: [] if s[-1:] == ("_growth",) else real(self, *s))
    assert client.admin.get_partitions("g") == 3
    with pytest.raises(InvalidConfiguration, match="has 3 partition"):
        client.admin.update_partitioned_topic("g", 2)


def test_a_transaction_across_an_old_and_a_new_partition_commits_exactly_once(client: Any) -> None:
    client.admin.create_topic("g", 1)
    client.admin.update_partitioned_topic("g", 2)
    old, new = client.create_producer("g-partition-0"), client.create_producer("g-partition-1")
    consumer = client.subscribe("g", "s", initial_position=InitialPosition.Earliest)
    txn = client.new_transaction()
    old.send(b"a", txn=txn)
    new.send(b"b", txn=txn)
    assert drain(consumer, idle_ms=200) == []
    txn.commit()
    got = drain(consumer, ack=True)
    assert sorted((m.message_id().partition(), m.data()) for m in got) == [(0, b"a"), (1, b"b")]
    assert sorted(committed_values(client, "g")) == [b"a", b"b"]
    assert drain(consumer, idle_ms=200) == []


def test_the_stream_source_reads_a_new_partition_from_its_earliest_offset(root: str) -> None:
    from pulsartx.datasource.options import parse_stream_options
    from pulsartx.datasource.stream_reader import PulsarTxStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    def batch(reader: PulsarTxStreamReader, start: dict) -> tuple[dict, list[bytes]]:
        end = reader.latestOffset(start, ReadAllAvailable())
        return end, sorted(v for part in reader.partitions(start, end) for b in reader.read(part)
                           for v in b.column(b.schema.names.index("value")).to_pylist())

    with pulsartx.Client(root) as c:
        c.admin.create_topic("g", 1)
        p0 = c.create_producer("g")
        p0.send(b"a")
        reader = PulsarTxStreamReader(parse_stream_options({"service.url": root, "topic": "g",
                                                            "startingOffsets": "latest"}))
        start = reader.initialOffset()
        assert offset_numbers(start) == {"public/default/g": {"0": 1}}
        c.admin.update_partitioned_topic("g", 2)
        p1 = c.create_producer("g-partition-1")
        p1.send(b"n0")
        p1.send(b"n1")
        p0.send(b"b")
        end, values = batch(reader, start)
        assert offset_numbers(end) == {"public/default/g": {"0": 2, "1": 2}}
        assert values == [b"b", b"n0", b"n1"]
        # A restarted query replaying the batch from a start that lacks the new partition.
        again = PulsarTxStreamReader(parse_stream_options({"service.url": root, "topic": "g"}))
        assert sorted(v for part in again.partitions(start, end) for b in again.read(part)
                      for v in b.column(b.schema.names.index("value")).to_pylist()) == [b"b", b"n0", b"n1"]


def test_batch_reads_plan_every_partition_after_growth(root: str) -> None:
    from pulsartx.datasource.options import TopicSelection
    from pulsartx.datasource.topics import partitions_to_read

    from pulsartx.naming import TopicName

    with pulsartx.Client(root) as c:
        c.admin.create_topic("g", 1)
        sel = TopicSelection(option="topic", topics=(TopicName.parse("g"),), pattern=None)
        assert len(partitions_to_read(c.root, sel)) == 1
        c.admin.update_partitioned_topic("g", 3)
        assert [p.partition for p in partitions_to_read(c.root, sel)] == [0, 1, 2]


def test_a_subscription_stream_reads_a_new_partition_from_its_earliest_offset(root: str) -> None:
    """As Spark's Kafka source: a partition that appears under a running query is read from its
    earliest offset whatever startingOffsets says (it applies to the query's first batch), with a
    subscription too: the batch plans the partition from its start, absent from the start offsets."""
    from pulsartx.datasource.options import parse_stream_options
    from pulsartx.datasource.stream_reader import PulsarTxStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    with pulsartx.Client(root) as c:
        c.admin.create_topic("g", 1)
        reader = PulsarTxStreamReader(parse_stream_options({"service.url": root, "topic": "g", "subscription": "q",
                                                            "startingOffsets": "latest"}))
        start = reader.initialOffset()
        c.admin.update_partitioned_topic("g", 2)
        p1 = c.create_producer("g-partition-1")
        p1.send(b"n0")
        end = reader.latestOffset(start, ReadAllAvailable())
        assert offset_numbers(end) == {"public/default/g": {"0": 0, "1": 1}}
        assert [v for part in reader.partitions(start, end) for b in reader.read(part)
                for v in b.column(b.schema.names.index("value")).to_pylist()] == [b"n0"]


@pytest.mark.skipif(os.environ.get("PULSARTX_TEST_STORAGE", "local") != "local", reason="local layout")
def test_markers_live_under_the_topic_and_go_with_it(client: Any, root: str) -> None:
    client.admin.create_topic("g", 1)
    client.admin.update_partitioned_topic("g", 2)
    folder = os.path.join(root, "topics", "public", "default", "g", "_growth")
    assert len(os.listdir(folder)) == 1 and os.listdir(folder)[0].startswith("2-")
    client.admin.delete_topic("g")
    assert not os.path.exists(folder)


# ---- open consumers and readers follow growth (auto_update_partitions) ----------------------------
FAST = {"auto_update_partitions_interval_ms": 50}


def _grow_and_send(client: Any, n: int, per_partition: int, tag: str) -> list[bytes]:
    """Grow ``g`` to ``n`` partitions and send ``per_partition`` messages to each through its
    partition's name, at once (before any open client's next count read)."""
    client.admin.update_partitioned_topic("g", n)
    sent = []
    for i in range(n):
        producer = client.create_producer(f"g-partition-{i}")
        for j in range(per_partition):
            data = f"{tag}-{i}-{j}".encode()
            producer.send(data, partition_key=f"k{j}")
            sent.append(data)
        producer.close()
    return sent


def _receive_all(consumers: list[Any], want: int, timeout_s: float = 15.0, ack: bool = True) -> list[Any]:
    """Every message the consumers receive (each acknowledged unless ``ack`` is False), one thread
    per consumer, until ``want`` came or ``timeout_s`` passed, then 300 ms more to catch any
    duplicate."""
    import time

    from pulsartx import Timeout

    got: list[Any] = []
    lock = threading.Lock()
    stop = threading.Event()

    def run(consumer: Any) -> None:
        while not stop.is_set():
            try:
                m = consumer.receive(timeout_millis=100)
            except Timeout:
                continue
            if ack:
                consumer.acknowledge(m)
            with lock:
                got.append(m)

    threads = [threading.Thread(target=run, args=(c,)) for c in consumers]
    for th in threads:
        th.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with lock:
            if len(got) >= want:
                break
        time.sleep(0.02)
    time.sleep(0.3)
    stop.set()
    for th in threads:
        th.join()
    return got


@pytest.mark.parametrize("kind", ["Exclusive", "Failover", "Shared", "KeyShared"])
def test_an_open_consumer_receives_from_new_partitions_exactly_once(client: Any, kind: str) -> None:
    """A consumer subscribed at Latest before the growth: the messages sent to the new partitions
    before it noticed them are received too (the new partitions' subscription starts at their first
    message), once each, and acknowledged for good: a later subscriber gets nothing more. Shared and
    Key_Shared with two consumers, which share the new partitions."""
    from pulsartx import ConsumerType

    client.admin.create_topic("g", 2)
    ctype = ConsumerType[kind]
    count = 2 if ctype in (ConsumerType.Shared, ConsumerType.KeyShared) else 1
    consumers = [client.subscribe("g", "s", consumer_type=ctype, **FAST) for _ in range(count)]
    sent = _grow_and_send(client, 4, 10, "a")
    got = _receive_all(consumers, len(sent))
    assert sorted(m.data() for m in got) == sorted(sent)
    assert {m.message_id().partition() for m in got} == {0, 1, 2, 3}
    assert {m.topic_name() for m in got} == {f"{T}-partition-{i}" for i in range(4)}
    for c in consumers:
        c.close()
    again = client.subscribe("g", "s", consumer_type=ctype, initial_position=InitialPosition.Earliest)
    assert drain(again, idle_ms=300) == []
    assert client.admin.list_subscriptions("g-partition-3") == ["s"]


def test_a_failover_consumer_takes_over_the_new_partitions_too(client: Any) -> None:
    """Failover consumers share a partitioned topic's partitions (an active consumer per partition)
    and follow its growth; once one leaves, the other goes on from where it acknowledged, on the old
    and the new partitions alike, each message once."""
    from pulsartx import ConsumerType

    client.admin.create_topic("g", 2)
    leaving = client.subscribe("g", "s", consumer_type=ConsumerType.Failover, lease_ms=1000, **FAST)
    staying = client.subscribe("g", "s", consumer_type=ConsumerType.Failover, lease_ms=1000, **FAST)
    first = _grow_and_send(client, 3, 2, "f")
    assert sorted(m.data() for m in _receive_all([leaving, staying], len(first))) == sorted(first)
    leaving.close()
    second = _grow_and_send(client, 4, 2, "s")
    assert sorted(m.data() for m in _receive_all([staying], len(second))) == sorted(second)
    staying.close()


def test_a_topic_of_one_partition_grown_under_a_consumer_names_partitions_from_then_on(client: Any) -> None:
    """Subscribed by its name, a topic of one partition counts as non-partitioned (messages carry
    the topic's name); once grown, every message fetched after carries its partition's name."""
    import time

    client.admin.create_topic("g", 1)
    consumer = client.subscribe("g", "s", **FAST)
    client.create_producer("g").send(b"before")
    assert consumer.receive(timeout_millis=5000).topic_name() == T
    client.admin.update_partitioned_topic("g", 2)
    deadline = time.monotonic() + 5
    while len(consumer._parts) < 2:
        assert time.monotonic() < deadline, "the consumer did not take on the new partition"
        time.sleep(0.02)
    sent = [f"n-{i}-{j}".encode() for i in range(2) for j in range(2)]
    for data in sent:
        client.create_producer(f"g-partition-{data.decode().split('-')[1]}").send(data)
    got = _receive_all([consumer], len(sent))
    assert sorted(m.data() for m in got) == sorted(sent)
    assert {m.topic_name() for m in got} == {f"{T}-partition-0", f"{T}-partition-1"}


def test_transactional_acks_and_sends_on_new_partitions_of_an_open_consumer(client: Any) -> None:
    """Consume-transform-produce across a growth: the acks of messages from a new partition are
    pending in the transaction, and its abort gives them back (once), its commit settles them."""
    client.admin.create_topic("g", 1)
    client.admin.create_topic("out", 1)
    consumer = client.subscribe("g", "s", consumer_type=pulsartx.ConsumerType.Shared, **FAST)
    sent = _grow_and_send(client, 2, 3, "t")
    out = client.create_producer("out")
    got = _receive_all([consumer], len(sent), ack=False)
    assert sorted(m.data() for m in got) == sorted(sent)
    txn = client.new_transaction()
    for m in got:
        out.send(m.data(), txn=txn)
        consumer.acknowledge(m, txn=txn)
    txn.abort()
    consumer.redeliver_unacknowledged_messages()
    back = drain(consumer, idle_ms=400)
    assert sorted(m.data() for m in back) == sorted(sent)
    txn = client.new_transaction()
    for m in back:
        out.send(m.data(), txn=txn)
        consumer.acknowledge(m, txn=txn)
    txn.commit()
    assert sorted(committed_values(client, "out")) == sorted(sent)
    consumer.close()
    assert drain(client.subscribe("g", "s", consumer_type=pulsartx.ConsumerType.Shared), idle_ms=300) == []


def test_an_open_reader_reads_new_partitions_from_their_first_message(client: Any) -> None:
    from pulsartx import MessageId

    client.admin.create_topic("g", 1)
    client.create_producer("g").send(b"old")
    reader = client.create_reader("g", MessageId.latest, **FAST)
    idle = client.create_reader("g", MessageId.latest, auto_update_partitions=False)
    sent = _grow_and_send(client, 3, 4, "r")
    got = []
    for _ in sent:
        got.append(reader.read_next(timeout_millis=5000))
    assert sorted(m.data() for m in got) == sorted(sent)
    assert {m.message_id().partition() for m in got} == {0, 1, 2}
    assert not reader.has_message_available()
    assert sorted(m.data() for m in iter(idle)) == sorted(d for d in sent if d.startswith(b"r-0-"))
    assert len(idle._fetchers) == 1


def test_a_reader_seek_after_a_growth_positions_the_new_partitions_too(client: Any) -> None:
    from pulsartx import MessageId

    client.admin.create_topic("g", 1)
    reader = client.create_reader("g", MessageId.earliest, auto_update_partitions_interval_ms=3_600_000)
    _grow_and_send(client, 2, 3, "s")
    reader.seek(MessageId.latest)
    assert not reader.has_message_available()
    client.create_producer("g-partition-1").send(b"after")
    assert reader.read_next(timeout_millis=5000).data() == b"after"


def test_a_consumer_with_auto_update_partitions_off_keeps_its_partitions(client: Any) -> None:
    """It receives nothing of the new partition; re-subscribed at Latest, it receives what was sent
    there since the growth, which made the subscription on the new partition at its first message
    (as Pulsar's update does), and nothing it had received before."""
    import time

    client.admin.create_topic("g", 1)
    consumer = client.subscribe("g", "s", auto_update_partitions=False, auto_update_partitions_interval_ms=50)
    sent = _grow_and_send(client, 2, 3, "o")
    time.sleep(0.3)
    got = drain(consumer, idle_ms=300, ack=True)
    assert sorted(m.data() for m in got) == sorted(d for d in sent if d.startswith(b"o-0-"))
    assert len(consumer._parts) == 1
    consumer.close()
    again = client.subscribe("g", "s", auto_update_partitions=False)
    assert len(again._parts) == 2
    assert sorted(m.data() for m in drain(again, idle_ms=300)) == sorted(d for d in sent if d.startswith(b"o-1-"))


def test_a_growth_makes_the_topics_subscriptions_on_its_new_partitions(client: Any) -> None:
    """Pulsar's update does: a subscription made before the growth, with no consumer open across
    it, still gets every message sent to a new partition after the growth."""
    client.admin.create_topic("g", 2)
    client.subscribe("g", "s").close()
    client.subscribe("g-partition-1", "only-one").close()
    client.admin.update_partitioned_topic("g", 3)
    assert client.admin.list_subscriptions("g-partition-2") == ["only-one", "s"]
    client.create_producer("g-partition-2").send(b"early")
    for name in ("s", "only-one"):
        consumer = client.subscribe("g", name)
        assert [m.data() for m in drain(consumer, idle_ms=300)] == [b"early"]
        consumer.close()


def test_a_topic_deleted_and_created_again_is_not_taken_for_a_growth(client: Any) -> None:
    """Re-created with more partitions, the topic is another one: an open consumer or reader of the
    old one takes none of its partitions (no subscription made on them), and a producer neither."""
    import time

    from pulsartx import MessageId

    client.admin.create_topic("g", 1)
    consumer = client.subscribe("g", "s", **FAST)
    reader = client.create_reader("g", MessageId.earliest, **FAST)
    producer = client.create_producer("g", **FAST)
    client.admin.delete_topic("g")
    client.admin.create_topic("g", 3)
    time.sleep(0.4)
    assert not reader.has_message_available()
    assert len(consumer._parts) == 1 and len(reader._fetchers) == 1 and len(producer._partitions) == 1
    assert [client.admin.list_subscriptions(f"g-partition-{i}") for i in range(3)] == [[], [], []]
    for c in (consumer, reader):
        c.close()
    producer.close()


def test_auto_update_partitions_options_are_checked(client: Any) -> None:
    client.admin.create_topic("g", 1)
    with pytest.raises(InvalidConfiguration, match="auto_update_partitions_interval_ms=0"):
        client.subscribe("g", "s", auto_update_partitions_interval_ms=0)
    with pytest.raises(InvalidConfiguration, match="auto_update_partitions='yes'"):
        client.create_reader("g", pulsartx.MessageId.earliest, auto_update_partitions="yes")
