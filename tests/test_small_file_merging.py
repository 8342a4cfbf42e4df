"""Small-file merging: runs of a partition's small files become one file each, in the writing
process's background, without changing a row. Readers at both isolation levels, a consumer in the
middle of the topic and a plain Delta reader see exactly what they saw before."""
from __future__ import annotations

import deltalake
import pytest

import pulsartx
from pulsartx import MessageId, TopicName
from pulsartx.exceptions import Timeout
from pulsartx.log.index import DataFile
from pulsartx.log.partition import PartitionLog
from pulsartx.maintenance import merging
from pulsartx.maintenance.merging import FANOUT, merge_small_files, plan_run, tier, wait_for_merges


def _f(lo: int, n: int) -> DataFile:
    return DataFile(lo, lo + n - 1, f"f{lo}", 100, n)


def test_the_plan_merges_the_oldest_run_of_one_tier():
    assert [tier(n) for n in (1, 31, 32, 1023, 1024)] == [0, 0, 1, 1, 2]
    big = [_f(i * 40, 40) for i in range(FANOUT - 1)]  # tier 1, one short of a run
    small = [_f(10_000 + i, 1) for i in range(FANOUT + 5)]
    assert plan_run(big + small) == small[:FANOUT]
    assert plan_run(big + small[:FANOUT - 1]) is None


def _everything(client, topic: str, level: str) -> list[tuple[str, bytes]]:
    with client.create_reader(topic, MessageId.earliest, isolation_level=level) as r:
        return [(str(m.message_id()), m.data()) for m in r]


def test_merging_changes_no_row_and_no_reader_sees_a_difference(tmp_path, monkeypatch):
    monkeypatch.setattr("pulsartx.log.partition.MERGE_EVERY", 0)  # merged below, by hand
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("m", 1)
        part = TopicName.parse("m-partition-0")
        p = c.create_producer("m")
        sub = c.subscribe("m", "s", initial_position=pulsartx.InitialPosition.Earliest)
        expected = []
        for i in range(150):
            if i % 5 == 4:
                p.send(f"plain{i}".encode())
                expected.append(f"plain{i}".encode())
                continue
            t = c.new_transaction()
            p.send(f"t{i}a".encode(), txn=t)
            p.send(f"t{i}b".encode(), txn=t)
            if i % 7 == 3:
                t.abort()
            else:
                t.commit()
                expected += [f"t{i}a".encode(), f"t{i}b".encode()]
        open_txn = c.new_transaction()
        p.send(b"open", txn=open_txn)
        c.flush()
        got = [sub.receive(timeout_millis=5000) for _ in range(40)]
        for m in got:
            sub.acknowledge(m)
        before = {lvl: _everything(c, "m", lvl) for lvl in ("READ_COMMITTED", "READ_UNCOMMITTED")}
        delta_before = deltalake.DeltaTable(str(tmp_path / "root" / "topics" / "public" / "default" / "m"
                                                / "partition-0")).to_pyarrow_table().sort_by("offset")
        files_before = len(PartitionLog(c.root, part).refresh().files)

        merged = 0
        while (n := merge_small_files(c.root, part)):
            merged += n
        files_after = len(PartitionLog(c.root, part).refresh().files)
        assert merged >= FANOUT and files_after == files_before - merged + merged // FANOUT
        assert {lvl: _everything(c, "m", lvl) for lvl in before} == before
        assert [v for _, v in before["READ_COMMITTED"]] == expected
        delta_after = deltalake.DeltaTable(str(tmp_path / "root" / "topics" / "public" / "default" / "m"
                                               / "partition-0")).to_pyarrow_table().sort_by("offset")
        assert delta_after.equals(delta_before)
        # the consumer goes on from where it was, and the open transaction still commits
        open_txn.commit()
        rest = []
        while len(rest) < len(expected) + 1 - len(got):
            m = sub.receive(timeout_millis=5000)
            rest.append(m.data())
            sub.acknowledge(m)
        with pytest.raises(Timeout):
            sub.receive(timeout_millis=300)
        assert [m.data() for m in got] + rest == expected + [b"open"]


def test_the_writing_process_merges_in_the_background(tmp_path, monkeypatch):
    monkeypatch.setattr("pulsartx.log.partition.MERGE_EVERY", 16)
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("bg", 1)
        p = c.create_producer("bg")
        for i in range(4 * FANOUT):
            p.send(f"{i}".encode())
        wait_for_merges()
        files = PartitionLog(c.root, TopicName.parse("bg-partition-0")).refresh().files
        assert len(files) < 2 * FANOUT
        assert [m for _, m in _everything(c, "bg", "READ_COMMITTED")] == [f"{i}".encode() for i in range(4 * FANOUT)]
    assert merging._QUEUED == {}


def test_the_coordinator_service_merges_small_files_on_each_pass(tmp_path, monkeypatch):
    from pulsartx.service import CoordinatorService

    monkeypatch.setattr("pulsartx.log.partition.MERGE_EVERY", 0)  # the service's pass alone merges

    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("svc", 1)
        p = c.create_producer("svc")
        for i in range(3 * FANOUT):
            t = c.new_transaction()
            p.send(f"{i}".encode(), txn=t)
            t.commit()
        c.flush()
        part = TopicName.parse("svc-partition-0")
        before = len(PartitionLog(c.root, part).refresh().files)
        service = CoordinatorService(c)
        service.run_pass()
        after = len(PartitionLog(c.root, part).refresh().files)
        merged = service.stats.merged_files
        assert merged == 3 * FANOUT and after == before - merged + merged // FANOUT
        assert [m for _, m in _everything(c, "svc", "READ_COMMITTED")] == [f"{i}".encode() for i in range(3 * FANOUT)]
