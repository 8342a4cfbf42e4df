"""Client, Producer, Reader and topic administration against a real storage root."""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

import pulsartx
from pulsartx import Client, InvalidConfiguration, MessageId, Result, Timeout, TopicNotFound
from pulsartx.client.routing import partition_for_key
from pulsartx.exceptions import AlreadyClosed, InvalidTopicName, TopicAlreadyExists


@pytest.fixture
def cl(root):
    c = Client(root)  # local directory or RGW bucket (conftest's storage fixture)
    yield c
    c.close()


def _read_all(client: Client, topic: str, start: MessageId = MessageId.earliest, **kw) -> list:
    reader = client.create_reader(topic, start, **kw)
    out = []
    while True:
        try:
            out.append(reader.read_next(timeout_millis=100))
        except Timeout:
            break
    reader.close()
    return out


# ---- admin --------------------------------------------------------------------------------------


def test_create_topic_twice(cl):
    t = cl.admin.create_topic("orders", partitions=3)
    assert str(t) == "persistent://public/default/orders"
    with pytest.raises(TopicAlreadyExists, match=r"topic persistent://public/default/orders already exists"):
        cl.admin.create_topic("persistent://public/default/orders")
    with pytest.raises(TopicAlreadyExists, match="already exists"):
        cl.admin.create_topic("public/default/orders", partitions=1)
    assert cl.admin.get_partitions("orders") == 3  # untouched by the failed creates


@pytest.mark.parametrize("bad", [0, -1, "x", 1.5, True, None, 10_001])
def test_create_topic_bad_partitions(cl, bad):
    with pytest.raises(InvalidConfiguration) as ei:
        cl.admin.create_topic("t", partitions=bad)
    assert f"partitions={bad!r}" in str(ei.value)
    assert "must be an integer from 1 to 10000" in str(ei.value)
    assert cl.admin.list_topics() == []


def test_create_topic_rejects_partition_name_and_bad_names(cl):
    with pytest.raises(InvalidConfiguration, match="without '-partition-2'"):
        cl.admin.create_topic("t-partition-2")
    with pytest.raises(InvalidTopicName, match=r"rule: no '\.\.' in a name"):
        cl.admin.create_topic("t/../escape")


def test_get_partitions_list_and_delete(cl):
    cl.admin.create_topic("a", partitions=2)
    cl.admin.create_topic("tenant1/ns1/b")
    cl.admin.create_topic("persistent://tenant1/ns2/c", partitions=4)
    n = cl.admin.get_partitions("a")
    assert n == 2 and type(n) is int
    assert cl.admin.get_partitions("a-partition-1") == 2
    with pytest.raises(TopicNotFound, match="has 2 partition"):
        cl.admin.get_partitions("a-partition-2")
    assert cl.admin.get_partitions("tenant1/ns2/c") == 4
    assert cl.get_topic_partitions("a") == ["persistent://public/default/a-partition-0",
                                            "persistent://public/default/a-partition-1"]
    assert cl.get_topic_partitions("a-partition-1") == ["persistent://public/default/a-partition-1"]

    assert cl.admin.list_topics() == ["persistent://public/default/a", "persistent://tenant1/ns1/b",
                                      "persistent://tenant1/ns2/c"]
    assert cl.admin.list_topics(namespace=None) == cl.admin.list_topics()
    assert cl.admin.list_topics("public/default") == ["persistent://public/default/a"]
    assert cl.admin.list_topics("tenant1/ns2") == ["persistent://tenant1/ns2/c"]
    assert cl.admin.list_topics("nobody/here") == []

    cl.admin.delete_topic("tenant1/ns1/b")
    assert cl.admin.list_topics() == ["persistent://public/default/a", "persistent://tenant1/ns2/c"]
    with pytest.raises(TopicNotFound, match="tenant1/ns1/b does not exist"):
        cl.admin.get_partitions("tenant1/ns1/b")
    with pytest.raises(TopicNotFound):
        cl.admin.delete_topic("tenant1/ns1/b")
    with pytest.raises(TopicNotFound):
        cl.admin.delete_topic("never-created")

    # A deleted topic can be created again, empty.
    cl.admin.create_topic("tenant1/ns1/b", partitions=2)
    assert cl.admin.get_partitions("tenant1/ns1/b") == 2
    assert _read_all(cl, "tenant1/ns1/b") == []


def test_delete_then_recreate_drops_messages(cl):
    cl.admin.create_topic("t")
    with cl.create_producer("t") as p:
        p.send(b"old")
    cl.admin.delete_topic("t")
    cl.admin.create_topic("t")
    with cl.create_producer("t") as p:
        assert p.send(b"new") == MessageId(0, 0)
    assert [m.data() for m in _read_all(cl, "t")] == [b"new"]


def test_delete_topic_deletes_its_subscriptions(cl):
    """As in Pulsar: a re-created topic starts without the old cursors, so a subscriber of the
    same name gets the new topic's messages from the start instead of skipping the first ones."""
    cl.admin.create_topic("d", partitions=2)
    with cl.create_producer("d") as p:
        for i in range(6):
            p.send(f"old-{i}".encode(), partition_key=f"k{i}")
    c = cl.subscribe("d", "s", initial_position=pulsartx.InitialPosition.Earliest)
    for _ in range(6):
        c.acknowledge(c.receive(timeout_millis=5000))
    c.close()
    assert cl.admin.list_subscriptions("d") == ["s"]
    cl.admin.delete_topic("d")
    cl.admin.create_topic("d", partitions=2)
    assert cl.admin.list_subscriptions("d") == []
    with cl.create_producer("d") as p:
        for i in range(4):
            p.send(f"new-{i}".encode(), partition_key=f"k{i}")
    c = cl.subscribe("d", "s", initial_position=pulsartx.InitialPosition.Earliest)
    got = sorted(c.receive(timeout_millis=5000).data() for _ in range(4))
    assert got == [f"new-{i}".encode() for i in range(4)]
    with pytest.raises(pulsartx.Timeout):
        c.receive(timeout_millis=300)
    c.close()


def test_missing_topic_without_auto_creation(root):
    with Client(root, auto_create_topics=False) as c:
        with pytest.raises(TopicNotFound, match="persistent://public/default/ghost does not exist"):
            c.create_producer("ghost")
        with pytest.raises(TopicNotFound, match="ghost"):
            c.create_reader("ghost", MessageId.earliest)
        with pytest.raises(TopicNotFound, match="persistent://public/default/ghost does not exist"):
            c.subscribe("ghost", "s")
        with pytest.raises(TopicNotFound):
            c.get_topic_partitions("ghost")
        assert c.admin.list_topics() == []
    assert issubclass(TopicNotFound, pulsartx.PulsarException)


def test_missing_topics_are_created_on_first_use_by_default(cl):
    """Pulsar's broker default (allowAutoTopicCreation=true, non-partitioned): producing,
    subscribing or reading creates the topic, with one partition."""
    assert cl.auto_create_topics is True and cl.auto_create_partitions == 1
    with cl.create_producer("made-by-producer") as p:
        assert p.send(b"first") == MessageId(0, 0)
    c = cl.subscribe("made-by-consumer", "s", initial_position=pulsartx.InitialPosition.Earliest)
    r = cl.create_reader("made-by-reader", MessageId.earliest)
    assert cl.admin.list_topics() == ["persistent://public/default/made-by-consumer",
                                      "persistent://public/default/made-by-producer",
                                      "persistent://public/default/made-by-reader"]
    assert [cl.admin.get_partitions(t) for t in ("made-by-producer", "made-by-consumer", "made-by-reader")] == [1, 1, 1]
    assert [m.data() for m in _read_all(cl, "made-by-producer")] == [b"first"]
    assert cl.admin.list_subscriptions("made-by-consumer") == ["s"]
    c.close()
    r.close()
    # An existing topic keeps its partition count; a -partition-N name is never auto-created.
    cl.admin.create_topic("wide", partitions=3)
    cl.create_producer("wide").close()
    assert cl.admin.get_partitions("wide") == 3
    with pytest.raises(TopicNotFound, match="has 3 partition"):
        cl.create_producer("wide-partition-5")
    with pytest.raises(TopicNotFound, match="ghost does not exist"):
        cl.create_producer("ghost-partition-0")


def test_auto_created_topics_take_the_configured_partition_count(root):
    with Client(root, auto_create_partitions=4) as c:
        with c.create_producer("four") as p:
            for i in range(8):
                p.send(f"m{i}".encode(), partition_key=f"k{i}")
        assert c.admin.get_partitions("four") == 4
        assert sorted(m.data() for m in _read_all(c, "four")) == [f"m{i}".encode() for i in range(8)]
        c.subscribe("four-b", "s").close()
        assert c.admin.get_partitions("four-b") == 4


@pytest.mark.parametrize("kw, match", [
    ({"auto_create_topics": "yes"}, r"auto_create_topics='yes': must be True or False"),
    ({"auto_create_partitions": 0}, r"auto_create_partitions=0: must be an integer from 1 to 10000"),
    ({"auto_create_partitions": True}, r"auto_create_partitions=True: must be an integer"),
])
def test_auto_creation_keywords_are_checked(root, kw, match):
    with pytest.raises(InvalidConfiguration, match=match):
        Client(root, **kw)


# ---- producer -----------------------------------------------------------------------------------


def test_send_returns_message_ids(cl):
    cl.admin.create_topic("t")
    p = cl.create_producer("t", producer_name="prod-1")
    assert (p.topic(), p.producer_name(), p.last_sequence_id()) == ("persistent://public/default/t", "prod-1", -1)
    ids = [p.send(b"m%d" % i) for i in range(5)]
    assert ids == [MessageId(0, i) for i in range(5)]
    assert [(m.partition(), m.offset()) for m in ids] == [(0, i) for i in range(5)]
    assert p.last_sequence_id() == 4
    p.close()
    assert not p.is_connected()


def test_send_async_callbacks_and_flush(cl):
    cl.admin.create_topic("t")
    p = cl.create_producer("t", batching_max_messages=4, batching_max_publish_delay_ms=10_000)
    got: list[tuple[Result, MessageId]] = []
    lock = threading.Lock()

    def cb(res, mid):
        with lock:
            got.append((res, mid))

    for i in range(10):
        p.send_async(b"a%d" % i, cb)
    # Two full batches of 4 were appended by send_async itself; 2 messages still wait for the delay.
    assert got == [(Result.Ok, MessageId(0, i)) for i in range(8)]
    p.flush()
    assert got == [(Result.Ok, MessageId(0, i)) for i in range(10)]
    p.flush()  # nothing queued: a no-op
    assert len(got) == 10
    assert [m.data() for m in _read_all(cl, "t")] == [b"a%d" % i for i in range(10)]


def test_flush_waits_for_a_batch_the_timer_already_took(cl):
    cl.admin.create_topic("t")
    p = cl.create_producer("t", batching_max_publish_delay_ms=0)
    for i in range(10):
        got = []
        p.send_async(b"x%d" % i, lambda r, m, got=got: got.append((r, m)))
        time.sleep(0.003)  # let the timer thread pop the batch first
        p.flush()
        assert got == [(Result.Ok, MessageId(0, i))]
    p.close()


def test_close_flushes_pending(cl):
    cl.admin.create_topic("t")
    p = cl.create_producer("t", batching_max_publish_delay_ms=60_000)
    got = []
    for i in range(3):
        p.send_async(b"c%d" % i, lambda r, m: got.append(m))
    p.close()
    assert got == [MessageId(0, i) for i in range(3)]
    assert [m.data() for m in _read_all(cl, "t")] == [b"c0", b"c1", b"c2"]


def test_closed_producer_raises(cl):
    cl.admin.create_topic("t")
    p = cl.create_producer("t")
    p.send(b"x")
    p.close()
    p.close()  # idempotent
    with pytest.raises(AlreadyClosed, match="is closed"):
        p.send(b"y")
    with pytest.raises(AlreadyClosed, match="is closed"):
        p.send_async(b"y", None)


@pytest.mark.parametrize("content", ["text", 123, None, ["b"]])
def test_non_bytes_content(cl, content):
    cl.admin.create_topic("t")
    p = cl.create_producer("t")
    with pytest.raises(InvalidConfiguration, match="content must be bytes"):
        p.send(content)
    with pytest.raises(InvalidConfiguration, match="content must be bytes"):
        p.send_async(content, None)
    assert p.send(b"ok") == MessageId(0, 0)  # nothing was queued by the failed sends


def test_bad_properties_and_options(cl):
    cl.admin.create_topic("t")
    p = cl.create_producer("t")
    with pytest.raises(InvalidConfiguration, match="properties must map str to str"):
        p.send(b"x", properties={"a": 1})
    with pytest.raises(InvalidConfiguration, match="batching_max_messages=0"):
        cl.create_producer("t", batching_max_messages=0)
    with pytest.raises(InvalidConfiguration, match="batching_max_publish_delay_ms=-1"):
        cl.create_producer("t", batching_max_publish_delay_ms=-1)


def test_bytes_like_content(cl):
    cl.admin.create_topic("t")
    p = cl.create_producer("t")
    p.send(bytearray(b"ba"))
    p.send(memoryview(b"mv"))
    p.send(b"")
    assert [m.data() for m in _read_all(cl, "t")] == [b"ba", b"mv", b""]


def test_client_close_closes_children(tmp_path):
    c = Client(str(tmp_path / "root"))
    c.admin.create_topic("t")
    p = c.create_producer("t")
    r = c.create_reader("t", MessageId.earliest)
    c.close()
    assert not p.is_connected() and not r.is_connected()
    with pytest.raises(AlreadyClosed):
        c.create_producer("t")
    with pytest.raises(AlreadyClosed):
        r.read_next(timeout_millis=10)


# ---- message fields round trip ------------------------------------------------------------------


def test_fields_round_trip_through_reader(cl):
    cl.admin.create_topic("t")
    p = cl.create_producer("t")
    sent = [
        (b"v0", {"a": "1"}, "k0", 1_700_000_000_001),
        (b"v1", None, None, None),
        (b"v2", {"x": "", "unicode-\u00e9": "\u65e5\u672c"}, "k\U0001F600", 1),
        (b"\x00\xff", {}, "", 1_800_000_000_999),
    ]
    before = int(time.time() * 1000)
    for value, props, key, ev in sent:
        p.send(value, properties=props, partition_key=key, event_timestamp=ev)
    after = int(time.time() * 1000)
    msgs = _read_all(cl, "t")
    assert [m.data() for m in msgs] == [b"v0", b"v1", b"v2", b"\x00\xff"]
    assert [m.value() for m in msgs] == [m.data() for m in msgs]
    assert [m.properties() for m in msgs] == [{"a": "1"}, {}, {"x": "", "unicode-\u00e9": "\u65e5\u672c"}, {}]
    assert [m.partition_key() for m in msgs] == ["k0", None, "k\U0001F600", ""]
    assert [m.event_timestamp() for m in msgs] == [1_700_000_000_001, 0, 1, 1_800_000_000_999]
    assert [m.message_id() for m in msgs] == [MessageId(0, i) for i in range(4)]
    assert [m.topic_name() for m in msgs] == ["persistent://public/default/t"] * 4
    assert all(before - 1 <= m.publish_timestamp() <= after + 1 for m in msgs)
    assert [m.publish_timestamp() for m in msgs] == sorted(m.publish_timestamp() for m in msgs)


# ---- reader positioning -------------------------------------------------------------------------


@pytest.fixture
def ten(cl):
    cl.admin.create_topic("t")
    with cl.create_producer("t") as p:
        for i in range(10):
            p.send(b"m%d" % i)
    return cl


def test_read_next_timeout_on_empty_topic(cl):
    cl.admin.create_topic("empty")
    r = cl.create_reader("empty", MessageId.earliest)
    assert not r.has_message_available()
    t0 = time.monotonic()
    with pytest.raises(Timeout, match="within 200 ms"):
        r.read_next(timeout_millis=200)
    assert 0.19 <= time.monotonic() - t0 < 5.0
    assert issubclass(Timeout, pulsartx.PulsarException)


def test_reader_from_earliest_and_has_message_available(ten):
    r = ten.create_reader("t", MessageId.earliest)
    assert r.topic() == "persistent://public/default/t"
    seen = []
    while r.has_message_available():
        seen.append(r.read_next(timeout_millis=1000).data())
    assert seen == [b"m%d" % i for i in range(10)]
    assert not r.has_message_available()
    with pytest.raises(Timeout):
        r.read_next(timeout_millis=50)
    # Iteration yields what is available, then stops.
    r.seek(MessageId(0, 6))
    assert [m.data() for m in r] == [b"m7", b"m8", b"m9"]


def test_start_message_id_exclusive_and_inclusive(ten):
    assert [m.data() for m in _read_all(ten, "t", MessageId(0, 4))] == [b"m%d" % i for i in range(5, 10)]
    assert [m.data() for m in _read_all(ten, "t", MessageId(0, 4), start_message_id_inclusive=True)] == [
        b"m%d" % i for i in range(4, 10)]
    assert _read_all(ten, "t", MessageId(0, 9)) == []
    assert [m.data() for m in _read_all(ten, "t", MessageId(0, 9), start_message_id_inclusive=True)] == [b"m9"]
    assert [m.message_id() for m in _read_all(ten, "t", MessageId(0, 0))] == [MessageId(0, i) for i in range(1, 10)]


def test_seek(ten):
    r = ten.create_reader("t", MessageId.earliest)
    assert [r.read_next(1000).data() for _ in range(3)] == [b"m0", b"m1", b"m2"]
    r.seek(MessageId(0, 7))
    assert r.read_next(1000).message_id() == MessageId(0, 8)
    r.seek(MessageId.earliest)
    assert r.read_next(1000).data() == b"m0"
    r.seek(MessageId(0, 1))
    assert r.read_next(1000).data() == b"m2"
    r.seek(MessageId.latest)
    assert not r.has_message_available()
    with pytest.raises(Timeout):
        r.read_next(timeout_millis=50)


def test_reader_seeks_by_publish_time(cl):
    """pulsar-client's Reader.seek takes a message id or a publish time (epoch ms), as Consumer.seek
    does: the reader goes on from the first message published at or after it, on every partition
    (markers and aborted messages passed), and from the end when there is none yet."""
    cl.admin.create_topic("t", 2)
    parts = [cl.create_producer(f"t-partition-{i}") for i in range(2)]
    parts[0].send(b"a0")
    parts[1].send(b"b0")
    time.sleep(0.01)
    aborted = cl.new_transaction()
    parts[0].send(b"aborted", txn=aborted)
    aborted.abort()
    parts[0].send(b"a1")
    parts[1].send(b"b1")
    times = {m.data(): m.publish_timestamp() for m in cl.create_reader("t", MessageId.earliest,
                                                                      isolation_level="READ_UNCOMMITTED")}
    r = cl.create_reader("t", MessageId.earliest)
    r.seek(times[b"aborted"])
    assert sorted(m.data() for m in r) == [b"a1", b"b1"]
    r.seek(times[b"a0"])
    assert sorted(m.data() for m in r) == [b"a0", b"a1", b"b0", b"b1"]
    r.seek(max(times.values()) + 60_000)
    assert not r.has_message_available()
    parts[1].send(b"later")
    assert r.read_next(1000).data() == b"later"
    for bad in ("1700000000000", True, 1.5):
        with pytest.raises(InvalidConfiguration, match="MessageId"):
            r.seek(bad)


def test_seek_inclusive_reader(ten):
    r = ten.create_reader("t", MessageId(0, 3), start_message_id_inclusive=True)
    assert r.read_next(1000).data() == b"m3"
    r.seek(MessageId(0, 8))
    assert [m.data() for m in r] == [b"m8", b"m9"]


def test_latest_inclusive_reader_starts_at_the_last_message(ten):
    """Pulsar's way to read a topic's last message: MessageId.latest with start_message_id_inclusive
    (Java and C++ seek to the last message id). The reader returns it, then what comes after, and
    seek(latest) on such a reader lands there again."""
    r = ten.create_reader("t", MessageId.latest, start_message_id_inclusive=True)
    assert r.has_message_available()
    assert r.read_next(1000).message_id() == MessageId(0, 9)
    assert not r.has_message_available()
    with ten.create_producer("t") as p:
        p.send(b"later")
    assert r.read_next(1000).data() == b"later"
    r.seek(MessageId.latest)
    assert [m.data() for m in r] == [b"later"]
    ten.admin.create_topic("empty")
    e = ten.create_reader("empty", MessageId.latest, start_message_id_inclusive=True)
    assert not e.has_message_available()


def test_latest_inclusive_reader_skips_what_read_committed_hides(cl):
    """The last message of a READ_COMMITTED reader is the last visible one: not a marker, an aborted
    transaction's message, nor one behind an open transaction; on a partitioned topic, each
    partition's last."""
    cl.admin.create_topic("p", 2)
    parts = {i: cl.create_producer(f"p-partition-{i}") for i in range(2)}
    parts[0].send(b"a")
    parts[0].send(b"b")
    t = cl.new_transaction()
    parts[0].send(b"aborted", txn=t)
    t.abort()
    parts[1].send(b"c")
    open_txn = cl.new_transaction()
    parts[1].send(b"open", txn=open_txn)
    parts[1].send(b"held back")
    cl.flush()
    r = cl.create_reader("p", MessageId.latest, start_message_id_inclusive=True)
    assert sorted(m.data() for m in r) == [b"b", b"c"]
    ru = cl.create_reader("p", MessageId.latest, start_message_id_inclusive=True, isolation_level="READ_UNCOMMITTED")
    assert sorted(m.data() for m in ru) == [b"aborted", b"held back"]
    open_txn.commit()
    assert [m.data() for m in r] == [b"open", b"held back"]


def test_latest_reader_sees_only_later_messages(ten):
    r = ten.create_reader("t", MessageId.latest)
    assert not r.has_message_available()
    with ten.create_producer("t") as p:
        p.send(b"later-0")
        p.send(b"later-1")
    msgs = [r.read_next(timeout_millis=1000) for _ in range(2)]
    assert [(m.data(), m.message_id()) for m in msgs] == [(b"later-0", MessageId(0, 10)), (b"later-1", MessageId(0, 11))]
    with pytest.raises(Timeout):
        r.read_next(timeout_millis=50)


def test_reader_waits_for_a_message_sent_later(ten):
    r = ten.create_reader("t", MessageId.latest)

    def send_later():
        time.sleep(0.2)
        with ten.create_producer("t") as p:
            p.send(b"late")

    th = threading.Thread(target=send_later)
    th.start()
    try:
        assert r.read_next(timeout_millis=10_000).data() == b"late"
    finally:
        th.join()


def test_reader_rejects_bad_start(ten):
    with pytest.raises(InvalidConfiguration, match="start_message_id must be a MessageId"):
        ten.create_reader("t", "earliest")
    with pytest.raises(InvalidConfiguration, match="isolation_level='DIRTY'"):
        ten.create_reader("t", MessageId.earliest, isolation_level="DIRTY")


def _two_partitions(cl) -> dict[bytes, MessageId]:
    cl.admin.create_topic("mp", 2)
    ids = {}
    for i in range(2):
        with cl.create_producer(f"mp-partition-{i}") as p:
            for j in range(3):
                ids[f"p{i}m{j}".encode()] = p.send(f"p{i}m{j}".encode())
    return ids


def test_multi_partition_reader_refuses_one_partitions_message_id_as_start(cl):
    """A message id locates a message in its own partition only: as Java's client ("The partitioned
    topic startMessageId is illegal"), a reader of several partitions starts from earliest, latest
    or a publish time, never from one partition's id, which said nothing about where to start the
    others (they were read from their beginning: messages before the id came back)."""
    ids = _two_partitions(cl)
    for inclusive in (False, True):
        with pytest.raises(InvalidConfiguration, match="mp-partition-1"):
            cl.create_reader("mp", ids[b"p1m1"], start_message_id_inclusive=inclusive)
    r = cl.create_reader("persistent://public/default/mp-partition-1", ids[b"p1m1"])
    assert [m.data() for m in r] == [b"p1m2"]


def test_multi_partition_reader_seek_to_a_message_id_moves_its_partition_only(cl):
    """Seeking a reader of several partitions to a message's id repositions that message's partition
    and leaves the others where they were, as Pulsar's multi-topic seek to a TopicMessageId does."""
    ids = _two_partitions(cl)
    r = cl.create_reader("mp", MessageId.earliest)
    assert sorted(m.data() for m in r) == sorted(ids)
    r.seek(ids[b"p0m1"])
    assert [m.data() for m in r] == [b"p0m2"]
    r.seek(MessageId.earliest)
    r.seek(ids[b"p1m2"])
    assert sorted(m.data() for m in r) == [b"p0m0", b"p0m1", b"p0m2"]
    with pytest.raises(InvalidConfiguration, match="partition 5"):
        r.seek(MessageId(5, 0))


# ---- routing ------------------------------------------------------------------------------------


def test_keyed_messages_land_on_partition_for_key(cl):
    cl.admin.create_topic("k", partitions=4)
    p = cl.create_producer("k")
    keys = [f"user-{i}" for i in range(40)] + ["polygenelubricants", "hello", "\U0001F600"]
    ids = {key: p.send(key.encode(), partition_key=key) for key in keys}
    p.close()
    assert {key: mid.partition() for key, mid in ids.items()} == {key: partition_for_key(key, 4) for key in keys}
    assert ids["polygenelubricants"].partition() == 0
    assert len({mid.partition() for mid in ids.values()}) == 4
    for part in range(4):
        msgs = _read_all(cl, f"k-partition-{part}")
        expected = [key for key in keys if partition_for_key(key, 4) == part]
        assert [m.partition_key() for m in msgs] == expected
        assert [m.message_id() for m in msgs] == [MessageId(part, i) for i in range(len(expected))]
    # A reader of the whole topic sees every message exactly once.
    assert Counter(m.partition_key() for m in _read_all(cl, "k")) == Counter(keys)


def test_unkeyed_round_robin(cl):
    cl.admin.create_topic("rr", partitions=4)
    p = cl.create_producer("rr")
    parts = [p.send(b"u%d" % i).partition() for i in range(12)]
    p.close()
    assert parts == [(parts[0] + i) % 4 for i in range(12)]
    assert Counter(parts) == {0: 3, 1: 3, 2: 3, 3: 3}
    msgs = _read_all(cl, "rr")
    assert sorted(m.data() for m in msgs) == sorted(b"u%d" % i for i in range(12))
    for part in range(4):
        assert [m.message_id() for m in _read_all(cl, f"rr-partition-{part}")] == [MessageId(part, i) for i in range(3)]


def test_unkeyed_async_batches_spread_evenly(cl):
    cl.admin.create_topic("rr", partitions=3)
    p = cl.create_producer("rr", batching_max_messages=10, batching_max_publish_delay_ms=10_000)
    got = []
    for i in range(30):
        p.send_async(b"%d" % i, lambda r, m: got.append(m))
    p.flush()
    assert Counter(m.partition() for m in got) == {0: 10, 1: 10, 2: 10}
    assert sorted(got) == sorted(MessageId(part, i) for part in range(3) for i in range(10))


def test_unkeyed_async_sends_go_round_robin_by_batch(cl):
    # Pulsar's router with batching: every unkeyed message of a batch to one partition, the next
    # batch to the next; a batch ends when full or when sent (publish delay, flush, a sync send).
    cl.admin.create_topic("rb", partitions=3)
    p = cl.create_producer("rb", batching_max_messages=4, batching_max_publish_delay_ms=60_000)
    got: dict[bytes, MessageId] = {}

    def send(data: bytes, key: str | None = None) -> None:
        p.send_async(data, lambda r, m, data=data: got.__setitem__(data, m), partition_key=key)

    for i in range(10):  # batches of 4, 4, then 2 ended by flush()
        send(b"a%d" % i)
    p.flush()
    send(b"b0")
    send(b"k", key="hello")  # a keyed message goes by its key and leaves the batch open
    send(b"b1")
    p.flush()
    s0 = p.send(b"c0").partition()  # a sync send is a batch of its own
    s1 = p.send(b"c1").partition()
    p.close()
    first = got[b"a0"].partition()
    assert {d: m.partition() for d, m in got.items() if d.startswith(b"a")} == {
        b"a%d" % i: (first + i // 4) % 3 for i in range(10)}
    assert got[b"b0"].partition() == got[b"b1"].partition() == (first + 3) % 3
    assert got[b"k"].partition() == partition_for_key("hello", 3)
    assert (s0, s1) == ((first + 4) % 3, (first + 5) % 3)
    assert Counter(m.data() for m in _read_all(cl, "rb")) == Counter(
        [b"a%d" % i for i in range(10)] + [b"b0", b"k", b"b1", b"c0", b"c1"])


def test_producer_to_single_partition_name(cl):
    cl.admin.create_topic("sp", partitions=3)
    p = cl.create_producer("sp-partition-2")
    assert [p.send(b"x%d" % i) for i in range(3)] == [MessageId(2, i) for i in range(3)]
    p.close()
    assert [m.data() for m in _read_all(cl, "sp-partition-2")] == [b"x0", b"x1", b"x2"]
    assert _read_all(cl, "sp-partition-0") == []
