"""The Arrow-table client paths mean what the message-by-message calls mean
(docs/design/arrow-tables-in-the-client.md): ``receive_table``, ``acknowledge_table`` and
``send_table`` scenarios on real storage, each with the per-message behaviour it must match."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest
from test_pending_ack import read_all
from test_tables import IN, OUT, receive_rows, seed, stats, values

from pulsartx import ConsumerType, InitialPosition, Timeout
from pulsartx.client.routing import partition_for_key
from pulsartx.exceptions import AlreadyClosed, InvalidConfiguration
from pulsartx.log.partition import PartitionLog
from pulsartx.log.rows import ROW_SCHEMA
from pulsartx.naming import TopicName

pytestmark = pytest.mark.timeout(180)
OTHER = "persistent://public/default/other"


def drain(consumer, timeout_ms: int = 300) -> list[str]:
    """Every message still deliverable to ``consumer`` (per-message path), in order."""
    out = []
    while True:
        try:
            out.append(consumer.receive(timeout_millis=timeout_ms).data().decode())
        except Timeout:
            return out


def per_partition(client, topic: str) -> dict[int, list[str]]:
    """Each partition's committed values in offset order."""
    out: dict[int, list[str]] = {}
    for part in client.admin.partitions_of(topic):
        r = client.create_reader(str(part), __import__("pulsartx").MessageId.earliest)
        vals = []
        while True:
            try:
                vals.append(r.read_next(timeout_millis=300).data().decode())
            except Timeout:
                break
        r.close()
        out[part.partition] = vals
    return out


# ---- receive_table ------------------------------------------------------------------------------------


def test_receive_then_receive_table_then_receive_deliver_each_message_once_in_order(client):
    seed(client, IN, 30)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest, receiver_queue_size=7)
    first = c.receive()  # prefetches a queue of 7
    t = c.receive_table(max_messages=10, timeout_millis=1000)  # 6 from the queue, 4 fetched
    rest = drain(c)
    assert [first.data().decode()] + values(t) + rest == [f"m{i}" for i in range(30)]


def test_receive_table_over_partitions_skips_aborted_and_open_transactions_in_order(client):
    client.admin.create_topic(IN, partitions=3)
    p = client.create_producer(IN)
    keys = ["a", "b", "c", "d", "e", "f"]
    expected: dict[int, list[str]] = {0: [], 1: [], 2: []}
    open_txn = None
    for round_ in range(4):
        aborted, committed = client.new_transaction(), client.new_transaction()
        for k in keys:
            p.send(f"x{round_}{k}".encode(), partition_key=k, txn=aborted)
            p.send(f"c{round_}{k}".encode(), partition_key=k, txn=committed)
            p.send(f"p{round_}{k}".encode(), partition_key=k)
            expected[partition_for_key(k, 3)] += [f"p{round_}{k}"]
        aborted.abort()
        committed.commit()
        for k in keys:
            expected[partition_for_key(k, 3)].append(f"c{round_}{k}")
    open_txn = client.new_transaction()
    p.send(b"open", partition_key="a", txn=open_txn)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    want = sum(len(v) for v in expected.values())
    t = receive_rows(c, want)
    assert c.receive_table(timeout_millis=300).num_rows == 0
    got: dict[int, list[tuple[int, str]]] = {0: [], 1: [], 2: []}
    for r in t.to_pylist():
        got[r["__partition"]].append((r["__offset"], r["value"].decode()))
    for part, rows in got.items():
        assert [o for o, _ in rows] == sorted(o for o, _ in rows)  # offset order per partition
        # Committed data shows at its commit: compare as sets per partition, order by offset above.
        assert sorted(v for _, v in rows) == sorted(expected[part])
    open_txn.abort()


# ---- acknowledge_table ----------------------------------------------------------------------------------


def test_receive_table_of_few_messages_passes_a_large_aborted_transaction_without_waiting(client):
    """receive() passes aborted data a fetch window (the receiver queue) at a time; receive_table's
    window is max_messages, so with a small one it waited for a commit after every offset passed
    (about 0.1 s each: 300 aborted rows took 30 s)."""
    client.admin.create_topic(IN)
    p = client.create_producer(IN, batching_max_messages=100)
    txn = client.new_transaction()
    p.send_table(pa.table({"value": [b"x"] * 300}), txn=txn)
    txn.abort()
    p.send(b"after")
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    t0 = time.monotonic()
    t = c.receive_table(max_messages=1, timeout_millis=20_000)
    assert values(t) == ["after"] and time.monotonic() - t0 < 5
    c.acknowledge_table(t)
    c.close()
    [st] = stats(client, IN, "s")
    assert st["markDeletePosition"] >= t.column("__offset")[0].as_py()  # the aborted rows were passed, acked


def test_receive_with_a_small_queue_passes_a_large_aborted_transaction_without_waiting(client):
    """The per-message path had the same wait per fetch window: receiver_queue_size=1 over 100
    aborted rows took 10 s."""
    client.admin.create_topic(IN)
    p = client.create_producer(IN, batching_max_messages=100)
    txn = client.new_transaction()
    p.send_table(pa.table({"value": [b"x"] * 200}), txn=txn)
    txn.abort()
    p.send(b"after")
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest, receiver_queue_size=1)
    t0 = time.monotonic()
    assert c.receive(timeout_millis=20_000).data() == b"after" and time.monotonic() - t0 < 5
    with pytest.raises(Timeout):
        c.receive(timeout_millis=200)


def test_acknowledge_table_of_an_empty_or_filtered_out_table_acks_nothing(client):
    seed(client, IN, 3)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest, acknowledgment_group_time_ms=0)
    t = receive_rows(c, 3)
    txn = client.new_transaction()
    c.acknowledge_table(ROW_SCHEMA.empty_table())
    c.acknowledge_table(ROW_SCHEMA.empty_table(), txn=txn)
    c.acknowledge_table(t.filter(pa.array([False, False, False])), txn=txn)
    c.acknowledge_table(t.slice(3, 0))
    c.acknowledge_table(t.select(["__messageId"]).slice(0, 0), txn=txn)
    txn.commit()
    c.redeliver_unacknowledged_messages()
    assert values(receive_rows(c, 3)) == ["m0", "m1", "m2"]


def test_acknowledge_table_of_a_reordered_duplicated_concatenation_acks_each_row_once(client):
    seed(client, IN, 12, partitions=2, keyed=True)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    a = c.receive_table(max_messages=5, timeout_millis=1000)
    b = receive_rows(c, 12 - a.num_rows)
    both = pa.concat_tables([b, a, b.slice(0, 3), a]).sort_by([("value", "descending")])
    keep = both.filter(pa.array([v != "m7" for v in values(both)]))
    txn = client.new_transaction()
    c.acknowledge_table(keep, txn=txn)
    txn.commit()
    c.redeliver_unacknowledged_messages()
    assert values(receive_rows(c, 1)) == ["m7"]
    assert c.receive_table(timeout_millis=300).num_rows == 0


def test_acknowledge_table_refuses_rows_of_another_topic(client):
    """Rows received from another topic (same partition index, same offsets) name other messages:
    acknowledging them here would lose this topic's messages at those offsets, never delivered."""
    seed(client, IN, 4)
    seed(client, OTHER, 4)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest, acknowledgment_group_time_ms=0)
    o = client.subscribe(OTHER, "s", initial_position=InitialPosition.Earliest)
    foreign = receive_rows(o, 4)
    with pytest.raises(InvalidConfiguration, match=f"holds rows of {OTHER}, not of {IN}"):
        c.acknowledge_table(foreign)
    txn = client.new_transaction()
    with pytest.raises(InvalidConfiguration, match=f"holds rows of {OTHER}, not of {IN}"):
        c.acknowledge_table(foreign, txn=txn)
    txn.abort()
    assert values(receive_rows(c, 4)) == ["m0", "m1", "m2", "m3"]  # none of this topic's was acked


def test_acknowledge_table_of_a_partitioned_topic_on_a_single_partition_consumer_is_refused(client):
    """A consumer of one partition ("-partition-1") given rows of partition 0: the per-message path
    maps any partition index onto its one partition, and so would ack other messages."""
    client.admin.create_topic(IN, partitions=2)
    p = client.create_producer(IN)
    for i in range(8):
        p.send(f"m{i}".encode(), partition_key=f"k{i}")
    c0 = client.subscribe(f"{IN}-partition-0", "other", initial_position=InitialPosition.Earliest)
    c1 = client.subscribe(f"{IN}-partition-1", "s", initial_position=InitialPosition.Earliest,
                          acknowledgment_group_time_ms=0)
    n0 = len(per_partition(client, IN)[0])
    t0 = receive_rows(c0, n0)
    with pytest.raises(InvalidConfiguration, match="partition 0 is not part of"):
        c1.acknowledge_table(t0)
    n1 = 8 - n0
    assert sorted(values(receive_rows(c1, n1))) == sorted(per_partition(client, IN)[1])


def test_txn_acknowledge_table_on_shared_never_acks_another_consumers_messages(client):
    seed(client, IN, 10)
    a = client.subscribe(IN, "sh", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest,
                         receiver_queue_size=1)
    b = client.subscribe(IN, "sh", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest,
                         receiver_queue_size=1)
    ta = a.receive_table(max_messages=4, timeout_millis=1000)  # m0..m3
    tb = b.receive_table(max_messages=3, timeout_millis=1000)  # m4..m6
    assert values(ta) == ["m0", "m1", "m2", "m3"] and values(tb) == ["m4", "m5", "m6"]
    tb2 = b.receive_table(max_messages=3, timeout_millis=1000)  # m7..m9
    txn = client.new_transaction()
    b.acknowledge_table(tb2, txn=txn)  # after m0..m6, none of which b acks
    txn.commit()
    b.acknowledge_table(tb)  # plain, not cumulative either
    b.close()
    [st] = stats(client, IN, "sh")
    assert st["markDeletePosition"] == -1
    a.close()  # a's messages go back to the subscription, unacked
    c = client.subscribe(IN, "sh", consumer_type=ConsumerType.Shared)
    assert sorted(values(receive_rows(c, 4))) == ["m0", "m1", "m2", "m3"]
    assert c.receive_table(timeout_millis=300).num_rows == 0


def test_aborted_table_ack_comes_back_exactly_once_beside_held_rows(client):
    seed(client, IN, 20)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest)
    t = receive_rows(c, 20)
    txn = client.new_transaction()
    c.acknowledge_table(t.slice(0, 10), txn=txn)  # one pending cumulative ack at m9; m10..m19 held
    txn.abort()
    again = receive_rows(c, 10)
    assert values(again) == [f"m{i}" for i in range(10)]
    assert c.receive_table(timeout_millis=300).num_rows == 0  # m10..m19 still held, not given twice
    c.redeliver_unacknowledged_messages()
    assert values(receive_rows(c, 20)) == [f"m{i}" for i in range(20)]
    assert c.receive_table(timeout_millis=300).num_rows == 0


def test_table_acks_aborted_past_the_dead_letter_limit_go_to_the_dead_letter_topic_once(client):
    from pulsartx import ConsumerDeadLetterPolicy

    seed(client, IN, 5)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest,
                         dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=1))
    for _ in range(2):  # delivered with count 0, then 1: each time acked in a transaction that aborts
        t = receive_rows(c, 5)
        assert values(t) == [f"m{i}" for i in range(5)]
        txn = client.new_transaction()
        c.acknowledge_table(t.slice(0, 3), txn=txn)  # cumulative pending ack at m2
        c.acknowledge_table(t.slice(3, 2), txn=txn)  # individual pending acks
        txn.abort()
        c.redeliver_unacknowledged_messages()
    assert c.receive_table(timeout_millis=500).num_rows == 0  # count 2: moved instead
    assert sorted(read_all(client, f"{IN}-s-DLQ")) == [f"m{i}" for i in range(5)]
    [st] = stats(client, IN, "s")
    assert st["markDeletePosition"] == 4 and st["pendingAckCount"] == 0


def test_txn_acknowledge_table_on_key_shared_is_individual_and_spares_the_other_consumer(client):
    seed(client, IN, 30, keyed=True)
    a = client.subscribe(IN, "ks", consumer_type=ConsumerType.KeyShared, initial_position=InitialPosition.Earliest,
                         lease_ms=600)
    b = client.subscribe(IN, "ks", consumer_type=ConsumerType.KeyShared, initial_position=InitialPosition.Earliest,
                         lease_ms=600)
    time.sleep(0.6)  # a's hash ranges are refreshed with b's join
    ta, tb = a.receive_table(timeout_millis=500), b.receive_table(timeout_millis=500)
    deadline = time.monotonic() + 20
    while ta.num_rows + tb.num_rows < 30:
        assert time.monotonic() < deadline
        ta = pa.concat_tables([ta, a.receive_table(timeout_millis=100)])
        tb = pa.concat_tables([tb, b.receive_table(timeout_millis=100)])
    assert ta.num_rows and tb.num_rows
    txn = client.new_transaction()
    b.acknowledge_table(tb, txn=txn)
    txn.commit()
    [st] = stats(client, IN, "ks")
    assert st["pendingCumulativeAck"] is None
    a.close()
    b.close()
    c = client.subscribe(IN, "ks", consumer_type=ConsumerType.KeyShared)
    assert sorted(values(receive_rows(c, ta.num_rows))) == sorted(values(ta))
    assert c.receive_table(timeout_millis=300).num_rows == 0


def test_a_consumer_closed_with_a_table_outstanding_gives_it_back_exactly_once(client):
    seed(client, IN, 6)
    a = client.subscribe(IN, "sh", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest)
    t = receive_rows(a, 6)
    a.acknowledge_table(t.slice(0, 2))
    a.close()
    with pytest.raises(AlreadyClosed):
        a.acknowledge_table(t)
    b = client.subscribe(IN, "sh", consumer_type=ConsumerType.Shared)
    assert values(receive_rows(b, 4)) == ["m2", "m3", "m4", "m5"]
    assert b.receive_table(timeout_millis=300).num_rows == 0


# ---- send_table -------------------------------------------------------------------------------------------


def test_send_table_keeps_row_order_per_partition_with_keyed_and_unkeyed_rows(client):
    """send() called row by row keeps each partition's messages in the order sent; a table whose
    keyed rows come before unkeyed rows of the same partition must too."""
    client.admin.create_topic(OUT, partitions=2)
    p = client.create_producer(OUT)
    key = next(k for k in (f"k{i}" for i in range(50)) if partition_for_key(k, 2) == 0)
    # The unkeyed batch goes to the router's first partition, 0 on a new producer: check it.
    keys = [key, None, key, None]
    t = pa.table({"value": [b"r0", b"r1", b"r2", b"r3"], "__key": pa.array(keys, pa.string())})
    ids = p.send_table(t)
    by_part: dict[int, list[tuple[int, str]]] = {}
    for i, mid in enumerate(ids):
        by_part.setdefault(mid.partition(), []).append((mid.offset(), f"r{i}"))
    for part, rows in by_part.items():
        assert [v for _, v in sorted(rows)] == [v for _, v in rows], (part, rows)  # row order = offset order
    got = per_partition(client, OUT)
    for part, rows in by_part.items():
        assert got[part] == [v for _, v in rows]


def test_send_table_refuses_null_values_as_send_refuses_none(client):
    client.admin.create_topic(OUT)
    p = client.create_producer(OUT)
    with pytest.raises(InvalidConfiguration):
        p.send(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfiguration, match="'value'"):
        p.send_table(pa.table({"value": pa.array([b"a", None], pa.binary())}))
    assert PartitionLog(client.root, client.admin.partitions_of(OUT)[0]).end_offset() == 0


def test_send_table_refuses_null_property_values_as_send_does(client):
    client.admin.create_topic(OUT)
    p = client.create_producer(OUT)
    with pytest.raises(InvalidConfiguration):
        p.send(b"a", properties={"k": None})  # type: ignore[dict-item]
    props = pa.array([[("k", None)]], pa.map_(pa.string(), pa.string()))
    with pytest.raises(InvalidConfiguration, match="'__messageProperties'"):
        p.send_table(pa.table({"value": [b"a"], "__messageProperties": props}))
    assert PartitionLog(client.root, client.admin.partitions_of(OUT)[0]).end_offset() == 0


def test_a_large_send_table_in_an_aborted_transaction_leaves_nothing_visible(client):
    client.admin.create_topic(OUT, partitions=2)
    p = client.create_producer(OUT, batching_max_messages=100)
    n = 1050
    txn = client.new_transaction()
    ids = p.send_table(pa.table({"value": [f"v{i}".encode() for i in range(n)]}), txn=txn)
    assert len(ids) == n and (ids.offsets >= 0).all()
    txn.abort()
    done = client.new_transaction()
    p.send_table(pa.table({"value": [b"after"]}), txn=done)
    done.commit()
    c = client.subscribe(OUT, "s", initial_position=InitialPosition.Earliest)
    assert values(receive_rows(c, 1)) == ["after"]
    assert c.receive_table(timeout_millis=500).num_rows == 0
    time.sleep(0)
    assert read_all(client, OUT) == ["after"]


def test_acknowledge_table_takes_the_topic_by_any_of_its_names(client):
    """``__topic`` as the short name, or with the partition suffix, is the same topic: accepted."""
    seed(client, IN, 4)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest, acknowledgment_group_time_ms=0)
    rows = receive_rows(c, 4)
    short = TopicName.parse(IN).local_name
    names = pa.array([short, f"{short}-partition-0", str(TopicName.parse(IN)), short], pa.string())
    c.acknowledge_table(rows.set_column(rows.schema.get_field_index("__topic"), "__topic", names))
    c.close()
    again = client.subscribe(IN, "s")
    with pytest.raises(Timeout):
        again.receive(timeout_millis=300)


def test_acknowledge_refuses_a_message_of_another_topic_or_partition(client):
    """The per-message path refuses what acknowledge_table refuses: a received Message of another
    topic, or of another partition on a consumer of one partition, names other messages here."""
    seed(client, IN, 4)
    seed(client, OTHER, 4)
    c = client.subscribe(IN, "s", initial_position=InitialPosition.Earliest, acknowledgment_group_time_ms=0)
    o = client.subscribe(OTHER, "s", initial_position=InitialPosition.Earliest)
    foreign = o.receive(5000)
    with pytest.raises(InvalidConfiguration, match="acknowledge it on the consumer it was received from"):
        c.acknowledge(foreign)
    with pytest.raises(InvalidConfiguration, match="acknowledge it on the consumer it was received from"):
        c.acknowledge_cumulative(foreign)
    assert values(receive_rows(c, 4)) == ["m0", "m1", "m2", "m3"]  # none of this topic's was acked
    client.admin.create_topic("two", partitions=2)
    p = client.create_producer("two")
    for i in range(8):
        p.send(f"m{i}".encode(), partition_key=f"k{i}")
    c0 = client.subscribe("two-partition-0", "a", initial_position=InitialPosition.Earliest)
    c1 = client.subscribe("two-partition-1", "b", initial_position=InitialPosition.Earliest)
    with pytest.raises(InvalidConfiguration, match="partition 0"):
        c1.acknowledge(c0.receive(5000))
