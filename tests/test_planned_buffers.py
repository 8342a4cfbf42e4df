"""A batch read's planner keeps each partition's transaction buffer for its next plan
(datasource/visibility.py): a later plan folds only what was appended since, and must decide
exactly what a plan with fresh buffers decides, across commits, aborts, still-open transactions
and a re-created topic."""
from __future__ import annotations

from pulsartx.datasource import visibility
from pulsartx.datasource.batch_reader import plan_partitions, read_partition
from pulsartx.datasource.options import parse_options

import pulsartx


def read(root: str, fresh: bool = False) -> list[bytes]:
    if fresh:
        saved = dict(visibility._PLANNED)
        visibility._PLANNED.clear()
    try:
        opts = parse_options({"service.url": root, "topic": "t"})
        parts = plan_partitions(opts.root, opts)
    finally:
        if fresh:
            visibility._PLANNED.clear()
            visibility._PLANNED.update(saved)
    return sorted(v for part in parts for b in read_partition(opts.root, part) for v in b.column("value").to_pylist())


def mine(root: str) -> dict:
    """This test's cached buffers (other tests in the process plan reads of their own roots)."""
    url = parse_options({"service.url": root, "topic": "t"}).root.url
    return {k: b for k, b in visibility._PLANNED.items() if k[0] == url}


def test_a_later_plan_folds_on_from_the_last_and_decides_as_a_fresh_one(tmp_path):
    root = str(tmp_path / "root")
    client = pulsartx.Client(root)
    client.admin.create_topic("t", 2)
    producer = client.create_producer("t")
    a, b = client.new_transaction(), client.new_transaction()
    for key in ("p0", "p1"):
        producer.send(b"a-" + key.encode(), txn=a, partition_key=key)
        producer.send(b"b-" + key.encode(), txn=b, partition_key=key)
    a.commit()
    producer.send(b"plain")
    producer.flush()

    # b is open and holds the read limit in both partitions: a's rows only, from before b's.
    first = read(root)
    assert first == read(root, fresh=True) == [b"a-p0", b"a-p1"]
    buffers = mine(root)
    ends = {k: buf.state(refresh=False).end_offset for k, buf in buffers.items()}
    assert len(buffers) == 2 and all(ends.values())

    b.abort()
    c = client.new_transaction()
    for key in ("p0", "p1"):
        producer.send(b"c-" + key.encode(), txn=c, partition_key=key)
    c.commit()
    producer.send(b"plain-2")
    producer.flush()

    second = read(root)
    assert second == read(root, fresh=True) == [b"a-p0", b"a-p1", b"c-p0", b"c-p1", b"plain", b"plain-2"]
    # The same buffers, folded on from where the first plan left them.
    assert mine(root) == buffers
    assert all(buf.state(refresh=False).end_offset > ends[k] for k, buf in buffers.items())

    # A re-created topic is a new table: its buffers start over, nothing of the old one shows.
    producer.close()
    client.admin.delete_topic("t")
    client.admin.create_topic("t", 2)
    producer = client.create_producer("t")
    d = client.new_transaction()
    producer.send(b"d", txn=d, partition_key="p0")
    d.commit()
    producer.send(b"plain-3", partition_key="p1")
    producer.flush()
    assert read(root) == read(root, fresh=True) == [b"d", b"plain-3"]
    assert len(mine(root)) == 4
    client.close()


def test_a_kept_buffer_forgets_what_retention_deleted_as_a_fresh_one_does(tmp_path):
    """Fails before the fix: retention trims only its own buffer and snapshot, so the planner's
    kept buffer still listed the deleted aborted transactions and the old horizon (a filter unlike
    a fresh plan's), and its next snapshot put them back for every later reader."""
    from pulsartx.buffer.buffer import TransactionBuffer
    from pulsartx.buffer.snapshot import SnapshotStore
    from pulsartx.log.partition import PartitionLog
    from pulsartx.maintenance.retention import apply_retention
    from pulsartx.naming import TopicName

    root = str(tmp_path / "root")
    client = pulsartx.Client(root)
    client.admin.create_topic("t", 1)
    part = TopicName.parse("t-partition-0")
    producer = client.create_producer("t")
    for i in range(3):
        txn = client.new_transaction()
        producer.send(b"aborted-%d" % i, txn=txn)
        txn.abort()
    assert client.flush()
    for v in (b"p1", b"p2"):
        producer.send(v)
    producer.flush()

    assert read(root) == [b"p1", b"p2"]
    (buf,) = mine(root).values()
    assert len(buf.state(refresh=False).aborted) == 3

    files = PartitionLog(client.root, part).refresh().files
    res = apply_retention(client.root, part, max_bytes=sum(f.size for f in files[-2:]), force=True)
    assert res.files_deleted == len(files) - 2
    trimmed = SnapshotStore(client.root, part, buf.log.table_id).load()
    assert trimmed is not None and trimmed.aborted == {}

    assert read(root) == read(root, fresh=True) == [b"p1", b"p2"]
    assert mine(root) == {next(iter(mine(root))): buf}  # the kept buffer, not a new one
    kept = buf.state(refresh=False)
    fresh = TransactionBuffer(PartitionLog(client.root, part)).state()
    assert (kept.aborted, kept.ended, kept.ranges, kept.trimmed_below) == (
        fresh.aborted, fresh.ended, fresh.ranges, fresh.trimmed_below) == ({}, {}, {}, res.new_start_offset)
    assert buf.take_snapshot()
    written = SnapshotStore(client.root, part, buf.log.table_id).load()
    assert written is not None and written.aborted == {} and written.trimmed_below == res.new_start_offset
    client.close()


def test_a_plan_whose_listing_lags_the_kept_buffer_folds_afresh(tmp_path):
    """A plan lists its files from its own log, which may have been refreshed before the last plan
    folded further: a filter decided past that listing could show part of a transaction whose
    other rows the plan does not list. The kept buffer is then set aside for a new one."""
    from pulsartx.log.partition import PartitionLog
    from pulsartx.naming import TopicName

    root = str(tmp_path / "root")
    client = pulsartx.Client(root)
    client.admin.create_topic("t", 1)
    producer = client.create_producer("t")
    producer.send(b"p1")
    producer.flush()
    lagging = PartitionLog(client.root, TopicName.parse("t-partition-0"))
    lagging.refresh()
    txn = client.new_transaction()
    producer.send(b"t1", txn=txn)
    txn.commit()
    assert client.flush()
    assert read(root) == [b"p1", b"t1"]
    ((key, kept),) = mine(root).items()
    assert kept.state(refresh=False).end_offset > lagging.end_offset(refresh=False) == 1

    opts = parse_options({"service.url": root, "topic": "t"})
    with visibility._PLANNED.lock:
        buf = visibility.planned_buffer(opts.root, key[2], lagging)
    assert buf is not kept and visibility._PLANNED[key] is buf
    client.close()


def test_a_file_inside_a_listed_entry_is_planned_as_shown_whole_from_its_statistics(tmp_path):
    """The files a writer lands carry the txn_most_bits statistics the plan trusts an entry list
    by: a file inside a listed entry is shown whole, one with the unlisted rows is not."""
    from pulsartx.coordinator.state import TxnAction
    from pulsartx.naming import TopicName

    root = str(tmp_path / "root")
    client = pulsartx.Client(root)
    client.admin.create_topic("t", 1)
    producer = client.create_producer("t")
    txn = client.new_transaction()
    kept = producer.send(b"kept", txn=txn)
    producer.send(b"unlisted", txn=txn)
    producer.flush()
    tc = client._coordinators().tc(txn.id.tc_id)
    tc.end_transaction(txn.id, TxnAction.COMMIT,
                       commit_entries=[(str(TopicName.parse("t-partition-0")), kept.offset(), kept.offset())])
    assert client.flush()
    assert read(root) == [b"kept"]
    opts = parse_options({"service.url": root, "topic": "t"})
    (part,) = plan_partitions(opts.root, opts)
    shown = [f.min_offset for f in part.files if part.visibility.shows_file(f, part.start, part.end)]
    assert shown == [kept.offset()]
    client.close()
