"""A writing process merges small files through its own partition writer, from the rows it still
holds for the files it wrote: the merged file is the one a read-back merge writes, files another
process wrote are read from storage, appends and markers of other threads meanwhile lose and
duplicate nothing, the rows held stay within their bound, and a merge that loses its commit to a
compaction changes nothing."""
from __future__ import annotations

import gc
import os
import shutil
import threading

import deltalake
import pyarrow.parquet as pq
import pytest

import pulsartx
from pulsartx import MessageId, TopicName
from pulsartx.exceptions import StorageError
from pulsartx.log import partition as partition_mod
from pulsartx.log.partition import PartitionLog, build_records, shared_log
from pulsartx.log.remembered import RememberedRows
from pulsartx.maintenance import merging
from pulsartx.maintenance.compaction import compact_partition
from pulsartx.maintenance.merging import FANOUT, merge_small_files, merge_through, plan_run
from pulsartx.storage import appender, delta
from pulsartx.storage.root import StorageRoot

PART = TopicName.parse("wm-partition-0")


@pytest.fixture(autouse=True)
def _remember_but_merge_by_hand(monkeypatch):
    """Writers keep their rows (merging is on) but no background merge runs: each test merges
    itself, when it means to. Each test starts with no rows held in the process (one budget)."""
    monkeypatch.setattr(partition_mod, "MERGE_EVERY", 10**9)
    monkeypatch.setattr(partition_mod, "REMEMBERED", RememberedRows())


def _no_reads(*args, **kwargs):
    raise AssertionError("a run whose rows are all in memory was read back from storage")


def _table_dir(root: str) -> str:
    return f"{root}/topics/public/default/wm/partition-0"


def _delta_rows(root: str):
    return deltalake.DeltaTable(_table_dir(root)).to_pyarrow_table().sort_by("offset")


def _new_file(root: StorageRoot, version: int) -> str:
    commit = delta.LogTail(root, partition_mod.partition_segments(PART)).read_commit(version)
    assert commit is not None
    adds = [a["add"]["path"] for a in commit if "add" in a]
    assert len(adds) == 1
    return adds[0]


def _small_files(tmp_path, n: int = FANOUT) -> tuple[str, StorageRoot, PartitionLog]:
    """A fresh store with topic ``wm`` and a log of this process that appended ``n`` one-message
    files ``m0``, ``m1``...: one run's worth of small files by default."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("wm", 1)
        croot = c.root
    plog = PartitionLog(croot, PART)
    for i in range(n):
        plog.append(build_records([f"m{i}".encode()]))
    return root, croot, plog


def _everything(client, level: str) -> list[tuple[str, bytes]]:
    with client.create_reader("wm", MessageId.earliest, isolation_level=level) as r:
        return [(str(m.message_id()), m.data()) for m in r]


def test_a_run_merged_from_memory_is_the_file_a_read_back_merge_writes(tmp_path, monkeypatch):
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("wm", 1)
        p = c.create_producer("wm")
        for i in range(40):  # transactions (data and markers), aborted ones, plain messages with keys and properties
            if i % 4 == 3:
                p.send(f"plain{i}".encode(), partition_key=f"k{i}", properties={"i": str(i)}, event_timestamp=1000 + i)
                continue
            t = c.new_transaction()
            p.send(f"t{i}".encode(), txn=t, properties={"n": str(i)})
            t.abort() if i % 5 == 1 else t.commit()
        c.flush()
        appender.wait_for_checkpoints()
        plog = shared_log(c.root, PART)
        run = plan_run(plog.refresh().files)
        assert run is not None and len(run) == FANOUT
        assert plog.remembered_rows(run) is not None
        shutil.copytree(root, str(tmp_path / "copy"))
        copy = StorageRoot.resolve(str(tmp_path / "copy"))

        with monkeypatch.context() as m:
            m.setattr(merging, "read_files", _no_reads)
            assert merge_through(plog, max_runs=1) == FANOUT
        assert merge_small_files(copy, PART, max_runs=1) == FANOUT  # a fresh log: read back
        version = plog.index.version
        assert PartitionLog(copy, PART).refresh().version == version
        from_memory = pq.read_table(f"{_table_dir(root)}/{_new_file(c.root, version)}")
        read_back = pq.read_table(f"{_table_dir(str(tmp_path / 'copy'))}/{_new_file(copy, version)}")
        assert from_memory.num_rows == sum(f.num_records for f in run)
        assert from_memory.equals(read_back, check_metadata=True)
        assert _delta_rows(root).equals(_delta_rows(str(tmp_path / "copy")))
        assert [f.path for f in PartitionLog(c.root, PART).refresh().files] == [f.path for f in plog.index.files]


def test_a_run_with_a_file_another_process_wrote_is_read_from_storage(tmp_path, monkeypatch):
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("wm", 1)
        croot = c.root
    ours, theirs = PartitionLog(croot, PART), PartitionLog(croot, PART)  # theirs: as another process's
    for i in range(FANOUT + 8):
        (theirs if i == 10 else ours).append(build_records([f"m{i}".encode()]))
    ours.sync_writer()  # catches up on their file: a foreign commit, whose rows ours never held
    run = plan_run(ours.refresh().files)
    assert run is not None and ours.remembered_rows(run) is None
    assert ours.remembered_rows(run[11:]) is not None
    reads = []
    real = merging.read_files

    def counted(*args, **kwargs):
        reads.append(args[2])
        return real(*args, **kwargs)

    before = _delta_rows(root)
    monkeypatch.setattr(merging, "read_files", counted)
    assert merge_through(ours, max_runs=1) == FANOUT
    assert reads == [run]
    assert _delta_rows(root).equals(before)
    assert ours.read(0, FANOUT + 8, ["value"]).column("value").to_pylist() == [
        f"m{i}".encode() for i in range(FANOUT + 8)]
    assert len(ours.refresh().files) == 1 + 8


def test_merges_among_concurrent_appends_and_markers_lose_and_duplicate_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(partition_mod, "MERGE_EVERY", 8)  # background merges, and one by hand below
    threads, per_thread = 4, 60
    with pulsartx.Client(str(tmp_path / "root")) as c:
        c.admin.create_topic("wm", 1)
        committed: list[set[bytes]] = [set() for _ in range(threads)]
        sent: list[set[bytes]] = [set() for _ in range(threads)]
        acked: list[list[tuple[int, bytes]]] = [[] for _ in range(threads)]  # (offset acked, message), in send order
        errors: list[BaseException] = []

        def produce(w: int) -> None:
            try:
                p = c.create_producer("wm")
                for i in range(per_thread):
                    msg = f"w{w}-{i}".encode()
                    sent[w].add(msg)
                    if i % 3 == 2:
                        acked[w].append((p.send(msg).offset(), msg))
                        committed[w].add(msg)
                        continue
                    t = c.new_transaction()
                    acked[w].append((p.send(msg, txn=t).offset(), msg))
                    if i % 7 == 0:
                        t.abort()
                    else:
                        t.commit()
                        committed[w].add(msg)
            except BaseException as e:
                errors.append(e)

        done = threading.Event()
        merged = []

        def merge() -> None:
            try:
                while not done.is_set():
                    merged.append(merge_through(shared_log(c.root, PART)))
            except BaseException as e:
                errors.append(e)

        workers = [threading.Thread(target=produce, args=(w,)) for w in range(threads)]
        merger = threading.Thread(target=merge)
        merger.start()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        c.flush()
        done.set()
        merger.join()
        merging.wait_for_merges()
        assert errors == []
        assert sum(merged) > 0
        for level, expected in (("READ_COMMITTED", set().union(*committed)), ("READ_UNCOMMITTED", set().union(*sent))):
            got = [m for _, m in _everything(c, level)]
            assert len(got) == len(expected) and set(got) == expected, level
        fresh = PartitionLog(c.root, PART).refresh()
        offsets = PartitionLog(c.root, PART).read(0, fresh.end_offset, ["offset"]).column("offset").to_pylist()
        assert offsets == list(range(fresh.end_offset))  # every offset once: no row lost or doubled
        # each message where its ack said, and each producer's messages in the order it sent them
        with c.create_reader("wm", MessageId.earliest, isolation_level="READ_UNCOMMITTED") as r:
            final = {(m.message_id().offset(), m.data()) for m in r}
        assert final == {pair for w in range(threads) for pair in acked[w]}
        for w in range(threads):
            assert [o for o, _ in acked[w]] == sorted(o for o, _ in acked[w])
            assert [m for _, m in sorted(acked[w])] == [f"w{w}-{i}".encode() for i in range(per_thread)]
        assert [f.path for f in shared_log(c.root, PART).refresh().files] == [f.path for f in fresh.files]


def test_the_rows_held_stay_within_their_bound(tmp_path, monkeypatch):
    with pulsartx.Client(str(tmp_path / "root")) as c:
        c.admin.create_topic("wm", 1)
        croot = c.root
    plog = PartitionLog(croot, PART)
    one = plog.append(build_records([b"x" * 1000]))
    assert one.version is not None
    size = plog.remembered_bytes
    assert size >= 1000
    monkeypatch.setattr(partition_mod, "REMEMBER_MAX_BYTES", 10 * size)
    for _ in range(30):
        plog.append(build_records([b"x" * 1000]))
    assert plog.remembered_bytes <= 10 * size
    files = [f.path for f in plog.refresh().files]
    assert plog.remembered_paths() == files[-10:]  # the newest, the oldest forgotten
    monkeypatch.setattr(partition_mod, "REMEMBER_MAX_RECORDS", 5)
    plog.append(build_records([b"y"] * 5))  # too many records to keep
    assert plog.remembered_paths() == files[-10:]
    # a removal by another writer (a foreign merge) drops the rows of the files it removed
    assert merge_small_files(croot, PART) == FANOUT
    for _ in range(3):
        plog.append(build_records([b"z"]))
    files = [f.path for f in plog.refresh().files]
    assert len(files) == 1 + 3 and plog.remembered_paths() == files[1:]
    assert plog.remembered_bytes == sum(plog.remembered_rows([f]).get_total_buffer_size() for f in plog.index.files[1:])
    # a file merged from memory is remembered in their place
    monkeypatch.setattr(merging, "FANOUT", 3)
    assert merge_through(plog) == 3
    merged = plog.refresh().files[-1]
    assert plog.remembered_paths() == [merged.path]
    assert plog.remembered_bytes == plog.remembered_rows([merged]).get_total_buffer_size() <= 10 * size


def test_a_merge_that_loses_its_commit_to_a_compaction_changes_nothing(tmp_path, monkeypatch):
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("wm", 1)
        p = c.create_producer("wm")
        for i in range(FANOUT + 4):
            t = c.new_transaction()
            p.send(f"t{i}".encode(), txn=t)
            t.abort() if i % 3 == 0 else t.commit()
        c.flush()
        plog = shared_log(c.root, PART)
        run = plan_run(plog.refresh().files)
        assert run is not None
        rows = plog.remembered_rows(run)
        assert rows is not None
        compactions = []
        real = delta.put_parquet

        def compact_first(*args, **kwargs):  # the compaction commits while the merge writes its file
            if not compactions:
                compactions.append(None)
                compactions[0] = compact_partition(c.root, PART)
            return real(*args, **kwargs)

        monkeypatch.setattr(delta, "put_parquet", compact_first)
        assert plog.merge_files(run, rows) is None
        monkeypatch.setattr(delta, "put_parquet", real)
        assert compactions[0].skipped is None
        after_compaction = PartitionLog(c.root, PART).refresh()
        assert plog.index.version == after_compaction.version  # no commit of ours
        assert [f.path for f in plog.index.files] == [f.path for f in after_compaction.files]
        ever_added = {a["add"]["path"] for _, actions in delta.LogTail(c.root, plog.segments).commits_after(-1)
                      for a in actions if "add" in a}
        assert {n for n in os.listdir(_table_dir(root)) if n.endswith(".parquet")} == ever_added  # ours deleted
        # and it merges nothing twice afterwards: the compacted file is no small run
        assert merge_through(plog) == 0
        got = [m for _, m in _everything(c, "READ_COMMITTED")]
        assert got == [f"t{i}".encode() for i in range(FANOUT + 4) if i % 3 != 0]


def test_a_writer_reloaded_onto_a_re_created_partition_merges_it_and_never_the_old_rows(tmp_path):
    with pulsartx.Client(str(tmp_path / "root")) as c:
        c.admin.create_topic("wm", 1)
        croot = c.root
        plog = PartitionLog(croot, PART)
        for i in range(FANOUT):
            plog.append(build_records([f"old{i}".encode()]))
        old_run = plan_run(plog.refresh().files)
        assert old_run is not None
        old_rows = plog.remembered_rows(old_run)
        assert old_rows is not None
        c.admin.delete_topic("wm")
        c.admin.create_topic("wm", 1)
        # what a writer does when its snapshot is too old or a commit changed the table's metadata:
        # it starts over from the latest snapshot, here the new table's
        plog._appender().reload()
        assert plog.remembered_paths() == []
        assert plog.merge_files(old_run, old_rows) is None  # the old table's run: never into the new one
        for i in range(FANOUT):
            plog.append(build_records([f"new{i}".encode()]))
        assert merge_through(plog) == FANOUT
        fresh = PartitionLog(croot, PART).refresh()
        assert len(fresh.files) == 1
        assert [f.path for f in plog.refresh().files] == [f.path for f in fresh.files]
        assert plog.remembered_paths() == [fresh.files[0].path]
    assert _delta_rows(str(tmp_path / "root")).column("value").to_pylist() == [f"new{i}".encode() for i in range(FANOUT)]


def test_appends_of_other_threads_do_not_wait_for_a_merge_writing_its_file(tmp_path, monkeypatch):
    root, croot, plog = _small_files(tmp_path)
    writing, appended = threading.Event(), threading.Event()
    real = delta.put_parquet

    def slow_merge_file(root, segments, name, data, codecs=None):
        if data.num_rows == FANOUT:  # the merge's file: held until the append below is done
            writing.set()
            appended.wait(30)
        return real(root, segments, name, data, codecs)

    monkeypatch.setattr(delta, "put_parquet", slow_merge_file)
    merged: list[int] = []
    merger = threading.Thread(target=lambda: merged.append(merge_through(plog, max_runs=1)))
    merger.start()
    assert writing.wait(30)
    results = []
    appender_thread = threading.Thread(target=lambda: results.append(plog.append(build_records([b"during"]))))
    appender_thread.start()
    appender_thread.join(20)
    done_meanwhile = not appender_thread.is_alive()
    appended.set()
    appender_thread.join()
    merger.join()
    assert done_meanwhile, "an append waited for the merge's data-file write"
    assert results[0].first_offset == FANOUT and merged == [FANOUT]
    fresh = PartitionLog(croot, PART)
    assert fresh.read(0, FANOUT + 1, ["value"]).column("value").to_pylist() == [
        f"m{i}".encode() for i in range(FANOUT)] + [b"during"]
    assert [f.num_records for f in fresh.refresh().files] == [FANOUT, 1]


def test_the_rows_held_are_bounded_per_process_the_least_recently_written_partition_forgotten_first(
        tmp_path, monkeypatch):
    with pulsartx.Client(str(tmp_path / "root")) as c:
        c.admin.create_topic("wm2", 3)
        croot = c.root
    p0, p1, p2 = (PartitionLog(croot, TopicName.parse(f"wm2-partition-{i}")) for i in range(3))
    p0.append(build_records([b"x" * 1000]))
    size = p0.remembered_bytes
    monkeypatch.setattr(partition_mod, "REMEMBER_MAX_BYTES", 10 * size)
    for _ in range(5):
        p0.append(build_records([b"x" * 1000]))
    for _ in range(4):
        p1.append(build_records([b"x" * 1000]))
    assert (len(p0.remembered_paths()), len(p1.remembered_paths())) == (6, 4)
    for _ in range(3):  # over the bound: the rows of p0, written least recently, go first, oldest first
        p2.append(build_records([b"x" * 1000]))
    assert (len(p0.remembered_paths()), len(p1.remembered_paths()), len(p2.remembered_paths())) == (3, 4, 3)
    assert p0.remembered_paths() == [f.path for f in p0.refresh().files][-3:]
    p0.append(build_records([b"x" * 1000]))  # p0 now written last: p1's go
    assert (len(p0.remembered_paths()), len(p1.remembered_paths()), len(p2.remembered_paths())) == (4, 3, 3)
    for _ in range(4):  # an idle partition is emptied before a written one loses any
        p2.append(build_records([b"x" * 1000]))
    assert (len(p0.remembered_paths()), len(p1.remembered_paths()), len(p2.remembered_paths())) == (3, 0, 7)
    assert p0.remembered_bytes + p1.remembered_bytes + p2.remembered_bytes == 10 * size
    for _ in range(5):  # the partition being written alone: its own oldest go, as before
        p2.append(build_records([b"x" * 1000]))
    assert (len(p0.remembered_paths()), len(p2.remembered_paths())) == (0, 10)
    assert p2.remembered_paths() == [f.path for f in p2.refresh().files][-10:]
    del p0, p1, p2
    gc.collect()
    assert partition_mod.REMEMBERED.total_bytes == 0  # a log's rows go with it


def test_a_failure_after_a_commit_landed_is_logged_and_drops_the_rows_held_not_the_commit(tmp_path, monkeypatch, caplog):
    root, croot, plog = _small_files(tmp_path)
    plog.refresh()
    real_remember, real_apply = PartitionLog._remember_rows, partition_mod.FileIndex.apply_commit

    def broken(*args, **kwargs):
        raise RuntimeError("bookkeeping broke")

    # an append: landed once, reported landed, the rows held dropped
    monkeypatch.setattr(PartitionLog, "_remember_rows", broken)
    with caplog.at_level("WARNING", logger="pulsartx.log.partition"):
        result = plog.append(build_records([b"after"]))
    assert (result.version, result.first_offset, result.attempts) == (FANOUT + 1, FANOUT, 1)
    assert plog.remembered_paths() == [] and plog.remembered_bytes == 0
    assert any("bookkeeping broke" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(PartitionLog, "_remember_rows", real_remember)
    for i in range(FANOUT - 1):
        plog.append(build_records([f"n{i}".encode()]))
    # a merge: read back (its rows were dropped), landed, reported landed; the index, whose update
    # failed, starts over rather than miss the commit
    monkeypatch.setattr(partition_mod.FileIndex, "apply_commit",
                        lambda self, version, actions, next_only=False:
                        broken() if next_only else real_apply(self, version, actions, next_only))
    assert merge_through(plog, max_runs=1) == FANOUT
    monkeypatch.setattr(partition_mod.FileIndex, "apply_commit", real_apply)
    fresh = PartitionLog(croot, PART).refresh()
    assert fresh.version == 2 * FANOUT + 1  # one merge commit, not repeated
    assert [f.path for f in plog.refresh().files] == [f.path for f in fresh.files]
    assert [f.num_records for f in fresh.files] == [FANOUT] + [1] * FANOUT
    assert plog.remembered_paths() == []
    assert PartitionLog(croot, PART).read(0, 2 * FANOUT, ["value"]).column("value").to_pylist() == [
        f"m{i}".encode() for i in range(FANOUT)] + [b"after"] + [f"n{i}".encode() for i in range(FANOUT - 1)]


def test_a_log_collected_while_its_process_remembers_rows_does_not_hang_and_its_rows_go(tmp_path, monkeypatch):
    """The cyclic garbage collector frees a PartitionLog (it sits in reference cycles) wherever an
    allocation triggers it, also inside RememberedRows while its lock is held and the thread holds
    a partition's append lock: the log's release of its rows must not wait for that lock."""
    with pulsartx.Client(str(tmp_path / "root")) as c:
        c.admin.create_topic("wm2", 2)
        croot = c.root
    gone = PartitionLog(croot, TopicName.parse("wm2-partition-0"))
    live = PartitionLog(croot, TopicName.parse("wm2-partition-1"))
    gone.append(build_records([b"gone"]))
    key, released = gone._rows_key, gone._rows_finalizer
    remembered = partition_mod.REMEMBERED
    assert remembered.bytes_of(key) > 0 and released is not None
    real_drop = RememberedRows._drop
    collected: list[int] = []

    def drop_after_a_collection(self, owner, path):
        if not collected:  # what an allocation here may do: a collection, with the lock held
            collected.append(gc.collect())
        return real_drop(self, owner, path)

    gc.disable()  # the collection is the forced one, not one at a random point before it
    try:
        del gone
        monkeypatch.setattr(RememberedRows, "_drop", drop_after_a_collection)
        results = []
        t = threading.Thread(target=lambda: results.append(live.append(build_records([b"live"]))), daemon=True)
        t.start()
        t.join(30)
        assert not t.is_alive(), "the collected log's release of its rows deadlocked on the rows' lock"
    finally:
        gc.enable()
    assert collected and not released.alive  # the log was collected inside remember()
    assert (results[0].first_offset, results[0].version) == (0, 1)
    assert remembered.bytes_of(key) == 0
    assert live.remembered_paths() == [f.path for f in live.refresh().files]
    assert remembered.total_bytes == live.remembered_bytes > 0


def test_a_throwaway_log_that_merges_remembers_no_rows(tmp_path):
    root, croot, writer = _small_files(tmp_path)
    held = writer.remembered_bytes
    assert held > 0
    gc.disable()  # the pass's log, garbage after it, is not collected: what it holds stays held
    try:
        assert merge_small_files(croot, PART) == FANOUT  # a coordinator's pass: its log is dropped after
        assert partition_mod.REMEMBERED.total_bytes == held  # the writer's alone: the pass kept no rows
    finally:
        gc.enable()
    writer.sync_writer()  # the foreign merge removed the files whose rows the writer held
    assert writer.remembered_paths() == [] and partition_mod.REMEMBERED.total_bytes == 0


def test_a_merge_from_memory_after_the_tables_first_commits_were_cleaned_up(tmp_path, monkeypatch):
    """Delta's expired-log cleanup removes the commits a checkpoint covers, version 0 (which holds
    the table's id) among them: the writer keeps its table and the rows it holds."""
    root, croot, plog = _small_files(tmp_path)
    deltalake.DeltaTable(_table_dir(root)).create_checkpoint()
    for v in range(FANOUT):  # what expired-log cleanup removes: every commit below the checkpoint's
        os.unlink(f"{_table_dir(root)}/_delta_log/{v:020d}.json")
    writer = plog._writer
    monkeypatch.setattr(merging, "read_files", _no_reads)
    assert merge_through(plog) == FANOUT
    assert plog._writer is writer
    fresh = PartitionLog(croot, PART)
    assert [f.num_records for f in fresh.refresh().files] == [FANOUT] and fresh.index.version == FANOUT + 1
    rows = fresh.read(0, FANOUT, ["offset", "value"])
    assert rows.column("offset").to_pylist() == list(range(FANOUT))
    assert rows.column("value").to_pylist() == [f"m{i}".encode() for i in range(FANOUT)]
    assert plog.append(build_records([b"after"])).first_offset == FANOUT


def test_a_merge_whose_index_is_current_reads_the_log_only_to_catch_up_under_the_append_lock(tmp_path, monkeypatch):
    with pulsartx.Client(str(tmp_path / "root")) as c:
        c.admin.create_topic("wm", 1)
        croot = c.root
    plog = PartitionLog(croot, PART)
    plog.refresh()  # loaded: fed by the writer's commits from here on
    for i in range(FANOUT):
        plog.append(build_records([f"m{i}".encode()]))
    run = plan_run(plog.index.files)
    rows = plog.remembered_rows(run) if run is not None else None
    assert run is not None and rows is not None
    reads: list[int] = []
    real_read = delta.LogTail._read
    monkeypatch.setattr(delta.LogTail, "_read", lambda self, version: reads.append(version) or real_read(self, version))
    assert plog.merge_files(run, rows) == FANOUT + 1
    assert reads == [0, FANOUT + 1]  # the table's identity, and the commit after the writer's: none else


def test_a_store_without_put_if_absent_plans_and_reads_no_merge(tmp_path, monkeypatch):
    monkeypatch.setattr(StorageRoot, "has_put_if_absent", property(lambda self: False))
    root, croot, plog = _small_files(tmp_path)

    def no_planning(files):
        raise AssertionError("a merge was planned where it cannot be committed")

    monkeypatch.setattr(merging, "plan_run", no_planning)
    monkeypatch.setattr(merging, "read_files", _no_reads)
    assert merge_through(plog) == 0
    assert merge_small_files(croot, PART) == 0
    assert len(PartitionLog(croot, PART).refresh().files) == FANOUT


def test_last_sequence_id_takes_the_writer_under_the_append_lock(tmp_path, monkeypatch):
    with pulsartx.Client(str(tmp_path / "root")) as c:
        c.admin.create_topic("wm", 1)
        croot = c.root
    plog = PartitionLog(croot, PART)
    plog.append(build_records([b"a", b"b"], producer_name="p", sequence_ids=[4, 5]), producer_name="p")
    real = PartitionLog._appender

    def locked_only(self):
        assert self._append_lock._is_owned(), "the writer was taken outside the append lock"
        return real(self)

    monkeypatch.setattr(PartitionLog, "_appender", locked_only)
    assert plog.last_sequence_id("p") == 5


def test_a_merge_whose_commit_put_failed_keeps_its_file_for_vacuum(tmp_path, monkeypatch):
    """A put whose slot reads back empty may still land later on an object store: a commit naming
    a deleted file would break every reader, an orphaned file only costs space until vacuum."""
    root, croot, plog = _small_files(tmp_path)
    run = plan_run(plog.refresh().files)
    rows = plog.remembered_rows(run) if run is not None else None
    assert run is not None and rows is not None

    def refused(self, body, *segments):
        raise PermissionError("access denied")

    monkeypatch.setattr(StorageRoot, "put_if_absent", refused)
    with pytest.raises(StorageError) as e:
        plog.merge_files(run, rows)
    assert not isinstance(e.value, delta.OutcomeUnknown)
    monkeypatch.undo()
    assert PartitionLog(croot, PART).refresh().version == FANOUT  # nothing committed
    ever_added = {a["add"]["path"] for _, actions in delta.LogTail(croot, plog.segments).commits_after(-1)
                  for a in actions if "add" in a}
    left = {n for n in os.listdir(_table_dir(root)) if n.endswith(".parquet")}
    assert ever_added <= left and len(left - ever_added) == 1  # the merged file, kept as an orphan


def test_a_background_merge_of_unknown_outcome_says_so(tmp_path, monkeypatch, caplog):
    with pulsartx.Client(str(tmp_path / "root")) as c:
        c.admin.create_topic("wm", 1)
        croot = c.root

    def unknown(plog, max_runs=merging.MAX_RUNS_PER_PASS):
        raise delta.OutcomeUnknown("the commit's answer was lost and reading it back failed")

    monkeypatch.setattr(merging, "merge_through", unknown)
    with caplog.at_level("INFO", logger="pulsartx.maintenance.merging"):
        merging.schedule_merge(croot, PART, PartitionLog(croot, PART))
        merging.wait_for_merges()
    said = [r.getMessage() for r in caplog.records if "merging small files" in r.getMessage()]
    assert len(said) == 1 and "outcome unknown" in said[0] and "nothing changed" not in said[0]


def test_a_superseded_writer_reloading_keeps_the_current_writers_rows(tmp_path):
    with pulsartx.Client(str(tmp_path / "root")) as c:
        c.admin.create_topic("wm", 1)
        plog = PartitionLog(c.root, PART)
        plog.append(build_records([b"old"]))
        old = plog._writer
        c.admin.delete_topic("wm")
        c.admin.create_topic("wm", 1)
        plog.sync_writer()  # notices the re-created table: a new writer
        assert plog._writer is not old and old is not None
        plog.append(build_records([b"new"]))
        held = plog.remembered_paths()
        assert held == [f.path for f in plog.refresh().files]
        old.reload()  # the old writer, still held somewhere, starts over
        assert plog.remembered_paths() == held


def test_a_merge_through_an_index_behind_the_writer_merges_nothing(tmp_path, monkeypatch):
    """A long-lived log whose file index stopped behind its writer (the commits after the index's
    version were cleaned up while it was idle, and it has not looked again): the files it lists as
    live may have been merged elsewhere since. Fails without the check: the run was committed a
    second time, and readers saw its offsets twice."""
    monkeypatch.setattr(partition_mod, "INCARNATION_CHECK_S", 10**9)  # it has not looked again
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("wm", 1)
        croot = c.root
    other = PartitionLog(croot, PART, remember_rows=False)  # another process's writer
    for i in range(FANOUT):
        other.append(build_records([f"m{i}".encode()]))
    idle = PartitionLog(croot, PART)
    run = plan_run(idle.refresh().files)
    assert run is not None and len(run) == FANOUT
    rows = merging.read_files(croot, idle.segments, run, run[0].min_offset, run[-1].max_offset + 1)
    assert merge_small_files(croot, PART) == FANOUT  # merged elsewhere meanwhile
    other.append(build_records([b"after"]))
    deltalake.DeltaTable(_table_dir(root)).create_checkpoint()
    last = deltalake.DeltaTable(_table_dir(root)).version()
    for v in range(last):  # expired-log cleanup: the idle index's next commit is gone
        os.unlink(f"{_table_dir(root)}/_delta_log/{v:020d}.json")
    assert idle.merge_files(run, rows) is None
    fresh = PartitionLog(croot, PART)
    got = fresh.read(0, FANOUT + 1, ["offset", "value"])
    assert got.column("offset").to_pylist() == list(range(FANOUT + 1))
    assert got.column("value").to_pylist() == [f"m{i}".encode() for i in range(FANOUT)] + [b"after"]
