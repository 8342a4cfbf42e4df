"""Background maintenance (compaction, retention, snapshots) against live clients: nothing a reader
has seen, or may yet see, changes under it."""
from __future__ import annotations

import time

import pulsartx
from pulsartx import MessageId
from pulsartx.log.partition import PartitionLog, build_records, forget_shared
from pulsartx.maintenance.compaction import compact_partition
from pulsartx.naming import TopicName

PART = TopicName.parse("m-partition-0")
DAY_S = 86_400.0


def _trailing_straggler(c: pulsartx.Client) -> PartitionLog:
    """p0, an aborted transaction's message and its marker, then a zombie's late append of that
    transaction as the log's last record (offsets 0-3)."""
    c.admin.create_topic("m", partitions=1)
    p = c.create_producer("m")
    p.send(b"p0")
    txn = c.new_transaction()
    p.send(b"t", txn=txn)
    txn.abort()
    assert c.flush()
    plog = PartitionLog(c.root, PART)
    plog.append(build_records([b"straggler"], txn=txn.id.as_tuple()))
    assert plog.refresh().end_offset == 4
    return plog


def test_compaction_keeps_the_end_of_the_log(tmp_path):
    """Fails before the fix: the compaction dropped the straggler, the log's last record, and with
    it the newest file, so the log's end went back from 4 to 3. Only the offset app id then kept
    the next append from reusing offset 3 (below)."""
    with pulsartx.Client(str(tmp_path / "root")) as c:
        _trailing_straggler(c)
        assert compact_partition(c.root, PART).rows_dropped >= 1
        assert PartitionLog(c.root, PART).refresh().end_offset == 4


def test_an_offset_a_reader_passed_is_never_reused_after_compaction(tmp_path, monkeypatch):
    """Fails before the fix: the topic is idle past the table's app-id retention (7 days) after a
    compaction that dropped its last record, so the next append finds the end in the files'
    statistics alone (offset 3) and reuses an offset a reader had already passed: the reader never
    returns that message."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 8 * DAY_S)  # all of it 8 days ago
    c = pulsartx.Client(str(tmp_path / "root"))
    _trailing_straggler(c)
    reader = c.create_reader("m", MessageId.earliest)
    assert [m.data() for m in reader] == [b"p0"]  # now past offset 3
    compact_partition(c.root, PART)
    monkeypatch.setattr(time, "time", real)
    forget_shared(c.root, PART)  # the late producer's process holds no writer of the partition
    with pulsartx.Client(str(tmp_path / "root")) as late:
        with late.create_producer("m") as p:
            sent = p.send(b"new")
    assert reader.has_message_available(), f"the reader passed offset 3 before {sent} was appended there"
    assert reader.read_next(timeout_millis=3000).data() == b"new"
    assert sent.offset() >= 4
    c.close()
