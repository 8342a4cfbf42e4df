"""What pulsar-client users call and expect: MessageId's ledger/entry/batch accessors and its
serialized form, Message.topic_name() on partitioned and non-partitioned topics, and
Consumer.seek() by publish time. Real Delta tables under tmp_path, public API only."""
from __future__ import annotations

import struct
import time

import pytest
from test_consumer import drain

import pulsartx.exceptions as ex
from pulsartx import Client, InitialPosition, InvalidConfiguration, MessageId, Timeout

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def client(tmp_path):
    c = Client(str(tmp_path), num_coordinators=1)
    yield c
    c.close()


# ---- MessageId -----------------------------------------------------------------------------------


def test_message_id_maps_to_pulsar_fields(client):
    client.admin.create_topic("ids", partitions=2)
    p = client.create_producer("ids")
    sent = [p.send(f"v{i}".encode(), partition_key=f"k{i}") for i in range(6)]
    p.close()
    for mid in sent:
        assert mid.ledger_id() == 0
        assert mid.entry_id() == mid.offset()
        assert mid.batch_index() == -1
        assert mid.partition() in (0, 1)
    # Pulsar's sentinels.
    assert (MessageId.earliest.ledger_id(), MessageId.earliest.entry_id(), MessageId.earliest.partition(),
            MessageId.earliest.batch_index()) == (-1, -1, -1, -1)
    assert (MessageId.latest.ledger_id(), MessageId.latest.entry_id(), MessageId.latest.partition()) == \
        (2**63 - 1, 2**63 - 1, -1)


def test_serialized_ids_of_received_messages_round_trip_and_seek(client):
    client.admin.create_topic("rt", partitions=3)
    p = client.create_producer("rt")
    for i in range(9):
        p.send(f"v{i}".encode(), partition_key=f"k{i}")
    p.close()
    c = client.subscribe("rt", "s", initial_position=InitialPosition.Earliest)
    got = drain(c, idle_ms=300)
    assert len(got) == 9
    for m in got:
        data = m.message_id().serialize()
        back = MessageId.deserialize(data)
        assert back == m.message_id() and back.serialize() == data
        assert (back.partition(), back.entry_id()) == (m.message_id().partition(), m.message_id().entry_id())
    # A stored id is as good as the original: acknowledging by it sticks across a restart.
    c.acknowledge([MessageId.deserialize(m.message_id().serialize()) for m in got])
    c.close()
    c = client.subscribe("rt", "s")
    with pytest.raises(Timeout):
        c.receive(timeout_millis=300)
    c.close()


@pytest.mark.parametrize("bad,why", [
    (struct.pack(">Biq", 1, -2, 5), "no message's position"),
    (struct.pack(">Biq", 1, 0, -7), "no message's position"),
    (struct.pack(">Biq", 9, 0, 0), "unknown format version 9"),
    (b"\x01" * 12, "expected the 13 bytes"),
    (MessageId(0, 1).serialize() + b"\x00", "expected the 13 bytes"),
    ("(0,1)", "from a str"),
])
def test_deserialize_refuses_bad_bytes_clearly(bad, why):
    with pytest.raises(InvalidConfiguration, match="cannot deserialize MessageId") as err:
        MessageId.deserialize(bad)
    assert why in str(err.value)


# ---- Message.topic_name() ------------------------------------------------------------------------


def test_topic_name_is_the_partition_on_a_partitioned_topic(client):
    client.admin.create_topic("orders", partitions=3)
    p = client.create_producer("orders")
    for i in range(12):
        p.send(b"x", partition_key=f"k{i}")
    p.close()
    c = client.subscribe("orders", "s", initial_position=InitialPosition.Earliest)
    got = drain(c, idle_ms=300, ack=True)
    assert {m.topic_name() for m in got} == {f"persistent://public/default/orders-partition-{i}" for i in range(3)}
    for m in got:
        assert m.topic_name() == f"persistent://public/default/orders-partition-{m.message_id().partition()}"
    r = client.create_reader("orders", MessageId.earliest)
    read = [r.read_next(timeout_millis=2000) for _ in range(12)]
    assert {(m.message_id(), m.topic_name()) for m in read} == {(m.message_id(), m.topic_name()) for m in got}
    r.close()
    # One partition named explicitly: still the partition's name.
    one = client.subscribe("orders-partition-2", "s2", initial_position=InitialPosition.Earliest)
    assert {m.topic_name() for m in drain(one, idle_ms=300, ack=True)} <= {"persistent://public/default/orders-partition-2"}


def test_topic_name_is_the_topic_on_a_non_partitioned_topic(client):
    client.admin.create_topic("plain")
    p = client.create_producer("plain")
    p.send(b"x")
    p.close()
    c = client.subscribe("plain", "s", initial_position=InitialPosition.Earliest)
    assert c.receive(timeout_millis=2000).topic_name() == "persistent://public/default/plain"
    r = client.create_reader("plain", MessageId.earliest)
    assert r.read_next(timeout_millis=2000).topic_name() == "persistent://public/default/plain"


# ---- Consumer.seek(timestamp_ms) -----------------------------------------------------------------


def test_seek_by_time_moves_every_partition(client):
    client.admin.create_topic("timed", partitions=3)
    p = client.create_producer("timed")
    for i in range(6):
        p.send(f"old{i}".encode(), partition_key=f"k{i}")
    time.sleep(0.02)
    cut = int(time.time() * 1000)
    time.sleep(0.02)
    for i in range(6):
        p.send(f"new{i}".encode(), partition_key=f"k{i}")
    p.close()
    c = client.subscribe("timed", "s", initial_position=InitialPosition.Earliest)
    assert len(drain(c, idle_ms=300, ack=True)) == 12  # everything acknowledged
    c.seek(cut)
    again = drain(c, idle_ms=300, ack=True)
    assert sorted(m.data().decode() for m in again) == sorted(f"new{i}" for i in range(6))
    assert all(m.publish_timestamp() >= cut for m in again)
    assert len({m.message_id().partition() for m in again}) > 1
    c.seek(0)  # before everything: the whole topic again
    assert len(drain(c, idle_ms=300, ack=True)) == 12
    c.seek(int(time.time() * 1000) + 60_000)  # after everything: nothing until a new message
    with pytest.raises(Timeout):
        c.receive(timeout_millis=300)
    c.seek(MessageId.earliest)  # a MessageId seeks as before
    assert len(drain(c, idle_ms=300)) == 12


@pytest.mark.parametrize("bad", [1.5, "0", True, None])
def test_seek_refuses_what_is_neither_a_message_id_nor_a_time(client, bad):
    client.admin.create_topic("t")
    c = client.subscribe("t", "s")
    with pytest.raises(InvalidConfiguration, match="seek"):
        c.seek(bad)


# ---- Result codes of send callbacks ----------------------------------------------------------------


def test_result_members_keep_their_values():
    """Callers store and compare these values: the nine original members are a contract."""
    from pulsartx import Result

    assert {m.name: m.value for m in Result if m.value in (0, 1, 5, 15, 19, 20, 30, 31, 32)} == {
        "Ok": 0, "UnknownError": 1, "Timeout": 5, "TopicNotFound": 15, "ProducerBusy": 19, "AlreadyClosed": 20,
        "InvalidTxnStatus": 30, "TransactionConflict": 31, "NotAllowed": 32}
    values = [m.value for m in Result]
    assert len(values) == len(set(values))


@pytest.mark.parametrize("exc,expected", [
    (None, "Ok"),
    (ex.Timeout("t"), "Timeout"),
    (TimeoutError("t"), "Timeout"),
    (ex.TopicNotFound("t"), "TopicNotFound"),
    (ex.ProducerBusy("t"), "ProducerBusy"),
    (ex.AlreadyClosed("t"), "AlreadyClosed"),
    (ex.InvalidTxnStatusError("t"), "InvalidTxnStatus"),
    (ex.TransactionConflict("t"), "TransactionConflict"),
    (ex.NotAllowedError("t"), "NotAllowed"),
    # A fenced transaction is a ProducerFenced first (Kafka's producer epoch), as its class says.
    (ex.TransactionFenced("t"), "ProducerFenced"),
    (ex.ProducerFenced("t"), "ProducerFenced"),
    # Expired and failed-operation transactions are no longer OPEN: InvalidTxnStatusError subclasses.
    (ex.ExpiredTransactionError("t"), "InvalidTxnStatus"),
    (ex.TransactionHasOperationFailed("t"), "InvalidTxnStatus"),
    (ex.TransactionNotFound("t"), "TransactionNotFound"),
    (ex.TransactionCoordinatorNotFoundError("t"), "TransactionCoordinatorNotFoundError"),
    (ex.InvalidConfiguration("t"), "InvalidConfiguration"),
    (ex.UnknownOption("t"), "InvalidConfiguration"),
    (ex.InvalidTopicName("t"), "InvalidTopicName"),
    (ex.ConsumerBusy("t"), "ConsumerBusy"),
    (ex.StorageError("t"), "UnknownError"),
    (ex.PulsarException("t"), "UnknownError"),
    (RuntimeError("t"), "UnknownError"),
])
def test_result_of_maps_by_exception_class(exc, expected):
    from pulsartx import Result

    assert Result.of(exc) is Result[expected]


def test_result_of_ignores_look_alike_class_names():
    """A class is mapped by what it is, not by words in its name."""
    from pulsartx import Result

    class NotAllowedTimeoutLookalike(Exception):
        pass

    assert Result.of(NotAllowedTimeoutLookalike("x")) is Result.UnknownError


def test_result_has_pulsar_client_spellings():
    """Code written against pulsar-client compares with its spellings; they name the same codes."""
    from pulsartx import Result

    assert Result.InvalidTxnStatusError is Result.InvalidTxnStatus
    assert Result.NotAllowedError is Result.NotAllowed
