"""A deleted and re-created topic is a new topic: nothing of the old one (transaction-buffer
snapshots, cursors, cached handles) shapes what the new one shows."""
from __future__ import annotations

import contextlib

from _reads import committed_values  # tests/ is on sys.path (conftest)

import pulsartx
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName

PART = TopicName.parse("inc-partition-0")


def test_a_recreated_topic_never_trusts_the_old_topics_buffer_snapshot(tmp_path):
    """Fails before the fix: the snapshot of the old topic (folded to offset 10) survived the
    delete, and the new topic's readers trusted its horizon: the new topic's aborted and still
    open transactions' messages below offset 10 were shown."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("inc", partitions=1)
        p = c.create_producer("inc")
        for i in range(10):
            p.send(f"old-{i}".encode())
        buf = TransactionBuffer(PartitionLog(c.root, PART))
        assert buf.state().end_offset == 10 and buf.take_snapshot()
        p.close()
        c.admin.delete_topic("inc")
        c.admin.create_topic("inc", partitions=1)
        p = c.create_producer("inc")
        p.send(b"plain")
        aborted = c.new_transaction()
        p.send(b"aborted", txn=aborted)
        aborted.abort()
        still_open = c.new_transaction(timeout_ms=600_000)
        p.send(b"open", txn=still_open)
        p.flush()
    with pulsartx.Client(root) as fresh:
        assert committed_values(fresh, "inc") == [b"plain"]
        state = TransactionBuffer(PartitionLog(fresh.root, PART)).state()
        assert (state.end_offset, len(state.ongoing), len(state.aborted)) == (4, 1, 1)


def test_a_long_lived_partition_handle_notices_a_recreated_topic(tmp_path, monkeypatch):
    """A reader process that loaded the partition before another process deleted and re-created
    the topic. Fails before the fix: it applied the new table's commits as if they continued the
    old log, and kept the old end (10), so it showed nothing of the new topic."""
    import pulsartx.log.partition as partition_mod

    monkeypatch.setattr(partition_mod, "INCARNATION_CHECK_S", 0.0)
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("inc", partitions=1)
        p = c.create_producer("inc")
        for i in range(10):
            p.send(f"old-{i}".encode())
        p.close()
        reader_side = PartitionLog(c.root, PART)
        assert reader_side.end_offset() == 10
    with pulsartx.Client(root) as other:  # another process's doing
        other.admin.delete_topic("inc")
        other.admin.create_topic("inc", partitions=1)
        other.create_producer("inc").send(b"new-0")
    assert reader_side.end_offset() == 1
    assert reader_side.read(0, 1, ["value"]).column("value").to_pylist() == [b"new-0"]


def test_a_consumer_across_a_delete_and_recreate_shows_nothing_stale(tmp_path):
    """A consumer subscribed while another process deletes and re-creates its topic: its
    subscription went with the old topic, so it receives nothing more (never the new topic's
    messages through the old cursor, nor old ones again), and subscribing again starts the new
    topic's subscription from the beginning."""
    from pulsartx import ConsumerType, InitialPosition, Timeout

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("inc", partitions=1)
        p = c.create_producer("inc")
        for i in range(3):
            p.send(f"old-{i}".encode())
        cons = c.subscribe("inc", "s", consumer_type=ConsumerType.Exclusive, initial_position=InitialPosition.Earliest)
        first = cons.receive(timeout_millis=3000)
        cons.acknowledge(first)
        with pulsartx.Client(root) as other:  # another process's doing
            other.admin.delete_topic("inc")
            other.admin.create_topic("inc", partitions=1)
            q = other.create_producer("inc")
            for v in (b"new-0", b"new-1"):
                q.send(v)
        late = []
        with contextlib.suppress(Timeout):  # the end of what it still delivers
            while True:
                late.append(cons.receive(timeout_millis=1500).data())
        assert all(v.startswith(b"old-") for v in late) and b"old-0" not in late
        cons.close()
    with pulsartx.Client(root) as fresh:
        again = fresh.subscribe("inc", "s", consumer_type=ConsumerType.Exclusive,
                                initial_position=InitialPosition.Earliest)
        got = [again.receive(timeout_millis=3000).data() for _ in range(2)]
        assert got == [b"new-0", b"new-1"]
        assert committed_values(fresh, "inc") == [b"new-0", b"new-1"]


def test_a_long_lived_partition_handle_reads_past_commits_cleaned_up_since(tmp_path, monkeypatch):
    """A reader idle on a partition longer than delta.logRetentionDuration: meanwhile others
    appended, a checkpoint was written and the commits below it, the reader's next one among them,
    were cleaned up. Fails before the fix: its catch-up stopped at the missing commit and it never
    saw anything new again."""
    import deltalake as dl

    import pulsartx.log.partition as partition_mod

    monkeypatch.setattr(partition_mod, "INCARNATION_CHECK_S", 0.0)
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("gap", partitions=1)
        p = c.create_producer("gap")
        p.send(b"m-0")
        reader_side = PartitionLog(c.root, TopicName.parse("gap-partition-0"))
        assert reader_side.end_offset() == 1
        for i in range(1, 5):
            p.send(f"m-{i}".encode())
        p.close()
        uri = c.root.uri(*reader_side.segments)
        seen = reader_side.index.version
    dl.DeltaTable(uri).create_checkpoint()
    last = dl.DeltaTable(uri).version()
    log_dir = tmp_path.joinpath("root", *reader_side.segments, "_delta_log")
    for v in range(last):  # what expired-log cleanup removes: the commits below the checkpoint's
        (log_dir / f"{v:020d}.json").unlink()
    assert seen + 1 < last
    assert reader_side.end_offset() == 5
    assert reader_side.read(0, 5, ["value"]).column("value").to_pylist() == [f"m-{i}".encode() for i in range(5)]
