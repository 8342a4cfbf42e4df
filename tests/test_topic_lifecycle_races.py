"""Topic lifecycle operations racing live clients: concurrent creation (admin and auto-creation),
deletion while consumers, producers and transactions are at work, re-creation under the same
name, and the names a topic may and may not have. Each test names what it checks on what
READ_COMMITTED readers show."""
from __future__ import annotations

import threading
import time

import pytest
from _reads import committed_values  # tests/ is on sys.path (conftest)

import pulsartx
from pulsartx.exceptions import TopicAlreadyExists
from pulsartx.storage import faults


def _pause_meta_writes(monkeypatch, gates: dict[str, tuple[threading.Event, threading.Event]]) -> None:
    """Pause the thread named ``k`` just before it writes a topic's ``_topic.json`` (by a put or a
    put-if-absent): it sets ``gates[k][0]`` and waits for ``gates[k][1]``."""
    real = faults.before

    def before(op, path):
        gate = gates.get(threading.current_thread().name)
        if gate is not None and op in (faults.Op.WRITE, faults.Op.CREATE) and path.endswith("_topic.json"):
            arrived, go = gate
            arrived.set()
            assert go.wait(10)
        return real(op, path)

    monkeypatch.setattr(faults, "before", before)


def test_racing_creators_with_different_partition_counts_lose_no_acknowledged_message(tmp_path, monkeypatch):
    """``topics create orders -p 4`` while a producer auto-creates ``orders`` with one partition.
    The auto-creator's claim of partition-0 fails (the admin's won) and it finds no ``_topic.json``
    yet, so it repairs the topic as if its creator had crashed; the admin then writes its count (4)
    and returns, a producer sends to all four partitions, and the auto-creator's late write of
    ``partitions: 1`` replaced the admin's. Fails before the fix: the topic then had one partition,
    and the three messages acknowledged on partitions 1..3 were never shown to any reader."""
    root = str(tmp_path / "root")
    gates = {n: (threading.Event(), threading.Event()) for n in ("admin", "auto")}
    _pause_meta_writes(monkeypatch, gates)
    errors: dict[str, BaseException] = {}

    def run(name, fn):
        def body():
            try:
                fn()
            except BaseException as e:  # reported by the assertions below
                errors[name] = e
        t = threading.Thread(target=body, name=name)
        t.start()
        return t

    with pulsartx.Client(root) as admin_client, pulsartx.Client(root) as auto_client:
        admin = run("admin", lambda: admin_client.admin.create_topic("orders", partitions=4))
        assert gates["admin"][0].wait(10)  # partitions 0..3 created, _topic.json not yet written
        auto_producer: list = []
        auto = run("auto", lambda: auto_producer.append(auto_client.create_producer("orders")))
        assert gates["auto"][0].wait(10)  # its claim lost, it found no _topic.json: about to write one
        gates["admin"][1].set()
        admin.join(10)
        assert "admin" not in errors
        p = admin_client.create_producer("orders")
        sent = []
        for i in range(8):
            v = f"m-{i}".encode()
            p.send(v, partition_key=f"k{i}")
            sent.append(v)
        gates["auto"][1].set()
        auto.join(10)
        assert not auto.is_alive()
        assert isinstance(errors.get("auto"), TopicAlreadyExists | type(None))
    with pulsartx.Client(root) as fresh:
        assert fresh.admin.get_partitions("orders") == 4
        assert sorted(committed_values(fresh, "orders")) == sorted(sent)


def test_a_topic_named_to_the_length_limit_has_addressable_partitions_and_completes_transactions(tmp_path):
    """A topic name of 200 characters is valid (the segment limit), but each of its partitions'
    names (``<name>-partition-i``) was checked whole against that limit. Fails before the fix:
    the topic was created and written, yet a transaction's markers could never be written (the
    TC's ending of it failed on parsing its partition's name, forever COMMITTING) and
    ``TopicName.parse`` refused the names ``get_topic_partitions`` returns."""
    from pulsartx.naming import MAX_SEGMENT_LENGTH, TopicName

    name = "t" * MAX_SEGMENT_LENGTH
    assert TopicName.parse(f"{name}-partition-1").partition == 1
    with pytest.raises(pulsartx.exceptions.InvalidTopicName, match="201 characters"):
        TopicName.parse("t" * (MAX_SEGMENT_LENGTH + 1) + "-partition-0")
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic(name, partitions=2)
        assert [TopicName.parse(p).partition for p in c.get_topic_partitions(name)] == [0, 1]
        p = c.create_producer(name)
        txn = c.new_transaction()
        p.send(b"in-txn", txn=txn, partition_key="k")
        txn.commit()
        assert c.flush(10)
        assert committed_values(c, name) == [b"in-txn"]
        assert c.admin.transactions.list_transactions() == []  # ended: its markers written
        assert c.admin.transactions.get_transaction_metadata(txn.txn_id)["status"] == "COMMITTED"


def test_an_idle_producer_of_a_deleted_and_re_created_topic_does_not_corrupt_the_new_topic(tmp_path):
    """Not a commit in flight (tests/test_merging_faults.py has those): the producer is idle while
    another process deletes and re-creates its topic, and sends afterwards. Before the fix its
    send succeeded, writing version 4 of a table at version 1, and every reader of the new topic
    then failed with CorruptedLog. Now an append after ``IDENTITY_CHECK_IDLE_S`` without a commit
    checks the table first, as markers do: the send lands in the new table, or raises
    TopicNotFound."""
    import subprocess
    import sys
    import time

    from pulsartx.log.partition import IDENTITY_CHECK_IDLE_S

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("idle", partitions=1)
        p = c.create_producer("idle")
        for i in range(3):
            p.send(f"old-{i}".encode())
        code = ("import pulsartx\n"
                f"with pulsartx.Client({root!r}) as other:\n"
                "    other.admin.delete_topic('idle')\n"
                "    other.admin.create_topic('idle', partitions=1)\n"
                "    other.create_producer('idle').send(b'new-0')\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        time.sleep(IDENTITY_CHECK_IDLE_S + 0.2)  # idle, as a producer between two bursts
        late = None
        try:
            p.send(b"late")
            late = b"late"
        except pulsartx.exceptions.TopicNotFound:
            pass
        with pulsartx.Client(root) as fresh:
            assert committed_values(fresh, "idle") == [b"new-0", *([late] if late else [])]


def _delete_and_recreate(root: str, topic: str, *data: bytes) -> None:
    """What another process does to ``topic`` while a consumer of the old one stays open."""
    with pulsartx.Client(root) as other:
        other.admin.delete_topic(topic)
        other.admin.create_topic(topic, partitions=1)
        p = other.create_producer(topic)
        for d in data:
            p.send(d, partition_key=d.decode())  # keyed: a Key_Shared subscription spreads them


def _renewals_pass(lease_ms: int) -> None:
    """Long enough for an old consumer to try renewing its lease or presence twice."""
    time.sleep(2 * lease_ms / 3000 + 0.3)


def test_a_deleted_topics_exclusive_consumer_does_not_hold_the_re_created_topics_subscription(tmp_path):
    """A consumer of the old topic stays open (in another process) while its topic is deleted and
    re-created. Its subscription went with the old topic, and its Exclusive lease goes too: a
    consumer of the new topic's subscription of the same name takes it, and the old one, whose
    renewals are refused, does not take it back. Failed before the fix with ConsumerBusy, for as
    long as the old consumer lived (leases were kept per subscription name and outlived it)."""
    from pulsartx import ConsumerType, InitialPosition

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("lease", partitions=1)
        c.create_producer("lease").send(b"old-0")
        old = c.subscribe("lease", "s", consumer_type=ConsumerType.Exclusive,
                          initial_position=InitialPosition.Earliest, lease_ms=2000)
        old.acknowledge(old.receive(timeout_millis=3000))
        _delete_and_recreate(root, "lease", b"new-0")
        _renewals_pass(2000)
        with pulsartx.Client(root) as other:
            new = other.subscribe("lease", "s", consumer_type=ConsumerType.Exclusive,
                                  initial_position=InitialPosition.Earliest)
            assert new.receive(timeout_millis=3000).data() == b"new-0"
            _renewals_pass(2000)
            assert new._leases.holder() == new._id
            with pytest.raises(pulsartx.exceptions.Timeout):
                old.receive(timeout_millis=200)


def test_a_deleted_topics_failover_consumers_leave_the_re_created_topics_subscription_alone(tmp_path):
    """Failover: the old topic's active consumer and its standby stay open across the delete and
    re-creation. The active one's renewals are refused, and once it closes the standby does not
    take the freed lease (its subscription is gone): the new topic's consumer becomes active and
    receives. Failed before the fix: the old active consumer kept the lease (the new one waited as
    its standby), and after its close the old standby took it."""
    from pulsartx import ConsumerType, InitialPosition

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("lease", partitions=1)
        c.create_producer("lease").send(b"old-0")
        kw = dict(consumer_type=ConsumerType.Failover, initial_position=InitialPosition.Earliest, lease_ms=2000)
        active = c.subscribe("lease", "s", **kw)
        standby = c.subscribe("lease", "s", **kw)
        active.acknowledge(active.receive(timeout_millis=3000))
        _delete_and_recreate(root, "lease", b"new-0")
        _renewals_pass(2000)
        active.close()
        with pytest.raises(pulsartx.exceptions.Timeout):
            standby.receive(timeout_millis=300)  # tries to take the free lease
        with pulsartx.Client(root) as other:
            new = other.subscribe("lease", "s", **kw)
            assert new.receive(timeout_millis=3000).data() == b"new-0"
            _renewals_pass(2000)
            assert new._leases.holder() == new._id
        standby.close()


@pytest.mark.parametrize("consumer_type", ["Shared", "KeyShared"])
def test_a_deleted_topics_shared_consumer_is_not_present_on_the_re_created_topics_subscription(
        tmp_path, consumer_type):
    """A Shared or Key_Shared consumer of the old topic stays open across the delete and
    re-creation. Its presence ends with its subscription and is not renewed: the new topic's
    subscription of the same name takes a consumer of another type, and a Key_Shared newcomer
    gets the whole hash space. Failed before the fix: the old presence, renewed for as long as the
    consumer lived, refused an Exclusive consumer (InvalidConfiguration) and kept half the hash
    space (its keys' messages went to no consumer)."""
    from pulsartx import ConsumerType, InitialPosition

    root = str(tmp_path / "root")
    kind = ConsumerType[consumer_type]
    with pulsartx.Client(root) as c:
        c.admin.create_topic("lease", partitions=1)
        old = c.subscribe("lease", "s", consumer_type=kind, initial_position=InitialPosition.Earliest,
                          lease_ms=2000)
        _delete_and_recreate(root, "lease", *[f"k{i}".encode() for i in range(20)])
        _renewals_pass(2000)
        with pulsartx.Client(root) as other:
            if kind is ConsumerType.KeyShared:
                new = other.subscribe("lease", "s", consumer_type=kind, initial_position=InitialPosition.Earliest)
                _renewals_pass(2000)
                assert new._key_shared.ranges() == [(0, 65535)]
            else:
                new = other.subscribe("lease", "s", consumer_type=ConsumerType.Exclusive,
                                      initial_position=InitialPosition.Earliest)
            got = []
            while len(got) < 20:
                got.append(new.receive(timeout_millis=3000).data())
            assert sorted(got) == sorted(f"k{i}".encode() for i in range(20))
            assert old._id not in new._leases.live_members()
        old.close()


def test_a_force_deleted_subscriptions_consumer_does_not_hold_its_re_subscription(tmp_path):
    """``delete_subscription(force=True)`` with an Exclusive consumer open: a new subscription of
    the same name is free at once, as for a deleted topic's."""
    from pulsartx import ConsumerType

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("lease", partitions=1)
        old = c.subscribe("lease", "s", consumer_type=ConsumerType.Exclusive, lease_ms=2000)
        c.admin.delete_subscription("lease", "s", force=True)
        _renewals_pass(2000)
        new = c.subscribe("lease", "s", consumer_type=ConsumerType.Exclusive)
        _renewals_pass(2000)
        assert new._leases.holder() == new._id
        new.close()
        old.close()


def test_a_transaction_whose_topic_was_deleted_before_its_commit_ends_and_leaves_no_marker_behind(tmp_path):
    """A transaction writes to topics ``t`` and ``u``; ``t`` is deleted, then the transaction
    commits. Its ``u`` message is shown, its ``t`` message went with the topic. Fails before the
    fix: its ending on ``t``'s partition failed with TopicNotFound at every retry, so it stayed
    COMMITTING until a topic ``t`` was created again, and the recovery sweep then wrote the old
    transaction's commit marker into the new topic's log."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("t", partitions=1)
        c.admin.create_topic("u", partitions=1)
        pt, pu = c.create_producer("t"), c.create_producer("u")
        txn = c.new_transaction()
        pt.send(b"txn-t", txn=txn)
        pu.send(b"txn-u", txn=txn)
        pt.close()
        c.admin.delete_topic("t")
        txn.commit()
        assert c.flush(10)
        assert committed_values(c, "u") == [b"txn-u"]
        assert c.admin.transactions.list_transactions() == []
        c.admin.create_topic("t", partitions=1)
        c.admin.transactions.sweep(grace_ms=0)
        assert [(s["endOffset"], s["markers"]) for s in c.admin.topic_stats("t")] == [(0, 0)]
        assert committed_values(c, "t") == []


def test_a_marker_not_found_by_a_lagging_listing_is_retried_not_skipped(tmp_path, monkeypatch):
    """A partition reported missing while its Delta log is there (a store whose listings lag, the
    one way delta-rs answers "no table" for a table that exists) is not taken for a deleted topic:
    the marker is written on a later attempt, and the committed message is shown."""
    from pulsartx.coordinator import participants
    from pulsartx.exceptions import TopicNotFound

    real = participants.write_marker
    missed: list[str] = []

    def lagging(root, partition, *a, **kw):
        if not missed:
            missed.append(partition)
            raise TopicNotFound(f"topic partition {partition} does not exist (a lagging listing)")
        return real(root, partition, *a, **kw)

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("t", partitions=1)
        p = c.create_producer("t")
        txn = c.new_transaction()
        p.send(b"m", txn=txn)
        monkeypatch.setattr(participants, "write_marker", lagging)
        txn.commit()
        assert c.flush(30)
        assert missed == ["persistent://public/default/t-partition-0"]
        assert committed_values(c, "t") == [b"m"]
        assert [s["markers"] for s in c.admin.topic_stats("t")] == [1]


def test_a_load_is_skipped_only_when_its_topic_was_deleted_since_it_was_listed(tmp_path):
    """``unless_deleted`` is what every listing walker (topicsPattern reads, the coordinator
    service, metrics, the CLI) uses to go on past a topic deleted under it. A partition table
    missing under a topic that still exists is damage, not a delete: it must still fail, or a
    read would return the other partitions as if they were the whole topic."""
    import shutil

    from pulsartx.exceptions import TopicNotFound
    from pulsartx.log.partition import PartitionLog, partition_segments
    from pulsartx.observe.listings import unless_deleted

    client = pulsartx.Client(str(tmp_path / "root"))
    admin = client.admin
    for name in ("gone", "damaged"):
        admin.create_topic(name, 2)
    gone = admin.partitions_of("gone")
    admin.delete_topic("gone")
    assert unless_deleted(admin, gone[1], PartitionLog(client.root, gone[1]).refresh) is None
    assert unless_deleted(admin, "gone", lambda: admin.partitions_of("gone")) is None
    damaged = admin.partitions_of("damaged")[1]
    shutil.rmtree(tmp_path / "root" / "/".join(partition_segments(damaged)))
    with pytest.raises(TopicNotFound, match="damaged-partition-1"):
        unless_deleted(admin, damaged, PartitionLog(client.root, damaged).refresh)
    with pytest.raises(TopicNotFound, match="0..1"):  # a partition index past the count is no delete
        unless_deleted(admin, "damaged-partition-5", lambda: admin.partitions_of("damaged-partition-5"))
    assert unless_deleted(admin, "damaged", lambda: 42) == 42
    client.close()
