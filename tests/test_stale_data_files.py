"""A writer paused between writing a data file and committing it (a suspended host, a stopped
process) must not commit a file that a vacuum may have deleted meanwhile: a file that old is copied
to a new name first, and one already gone fails the commit, which then writes nothing."""
from __future__ import annotations

import logging
import os
import time

import deltalake as dl
import pyarrow as pa
import pytest

from pulsartx.exceptions import StorageError
from pulsartx.storage import appender as appender_mod
from pulsartx.storage import delta
from pulsartx.storage.appender import DeltaAppender
from pulsartx.storage.root import StorageRoot

SCHEMA = pa.schema([("seq", pa.int64(), False), ("name", pa.string())])
PAUSE_S = 2 * 3600.0


def rows(lo: int, hi: int) -> pa.Table:
    return pa.table({"seq": list(range(lo, hi)), "name": [f"n{i}" for i in range(lo, hi)]}, schema=SCHEMA)


@pytest.fixture
def writer(tmp_path) -> DeltaAppender:
    root = StorageRoot.resolve(str(tmp_path))
    delta.create_table(root, SCHEMA, "t", configuration=delta.stats_config(["seq"]))
    w = DeltaAppender(root, ("t",), delta.open_table(root, "t"), SCHEMA)
    w.append(rows(0, 2))
    return w


def pause(monkeypatch, wall: bool = True, boot: bool = True) -> None:
    """The writer's process sleeps ``PAUSE_S``: its clocks jump, nothing else of it runs."""
    real_time, real_boot = time.time, delta.since_boot
    if wall:
        monkeypatch.setattr(appender_mod.time, "time", lambda: real_time() + PAUSE_S)
    if boot:
        monkeypatch.setattr(delta, "since_boot", lambda: real_boot() + PAUSE_S)


def age_file(w: DeltaAppender, name: str) -> str:
    """The file's modification time, as the store sees it, moved back by the pause."""
    path = os.path.join(w.uri, name)
    old = time.time() - PAUSE_S
    os.utime(path, (old, old))
    return path


def full_vacuum(w: DeltaAppender) -> list[str]:
    """What a full-mode VACUUM at an hour's retention does to the table meanwhile."""
    return dl.DeltaTable(w.uri).vacuum(retention_hours=1, enforce_retention_duration=False, dry_run=False,
                                       full=True)


def test_a_file_vacuumed_while_its_writer_paused_fails_the_commit_and_commits_nothing(writer, monkeypatch):
    files = writer.write_rewrite_files([(rows(10, 13), True)])
    (name,) = [a["path"] for a in files.adds]
    path = age_file(writer, name)
    assert full_vacuum(writer) == [name]  # unreferenced and older than the retention: an orphan to vacuum
    assert not os.path.exists(path)
    before = dl.DeltaTable(writer.uri).version()  # the vacuum's own commits
    pause(monkeypatch)
    with pytest.raises(StorageError, match=rf"data file {name} was written \d+ s ago and is gone.*nothing was "
                                           "committed, write the data again"):
        writer.commit_rewrite(files, removes=[])
    t = dl.DeltaTable(writer.uri)
    assert t.version() == before
    assert t.to_pyarrow_table().sort_by("seq").equals(rows(0, 2))


def test_a_file_older_than_half_an_hour_is_committed_under_a_new_name(writer, monkeypatch, caplog):
    files = writer.write_rewrite_files([(rows(10, 13), True)])
    (name,) = [a["path"] for a in files.adds]
    path = age_file(writer, name)
    pause(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=appender_mod.__name__):
        assert writer.commit_rewrite(files, removes=[]) == 2
    assert f"data file {name} was written" in caplog.text and "copying it to" in caplog.text
    assert not os.path.exists(path)  # the old name is deleted: nothing references it
    monkeypatch.undo()
    t = dl.DeltaTable(writer.uri)
    assert t.to_pyarrow_table().sort_by("seq").equals(pa.concat_tables([rows(0, 2), rows(10, 13)]))
    adds = [a["add"] for a in delta.LogTail(writer.root, writer.segments).read_commit(2) if "add" in a]
    assert [a["path"] for a in adds] != [name] and len(adds) == 1
    # Its modification time is the copy's (the writer's clock after the pause), not the original's.
    assert adds[0]["modificationTime"] >= (time.time() + PAUSE_S - 60) * 1000
    assert full_vacuum(writer) == []  # the copy is referenced: a vacuum leaves it
    assert dl.DeltaTable(writer.uri).to_pyarrow_table().num_rows == 5


def test_a_pause_is_seen_when_the_wall_clock_was_set_back(writer, monkeypatch):
    """The wall clock says no time passed (it was set back); the boot clock saw the pause."""
    files = writer.write_rewrite_files([(rows(10, 11), True)])
    (name,) = [a["path"] for a in files.adds]
    pause(monkeypatch, wall=False)
    writer.commit_rewrite(files, removes=[])
    adds = [a["add"] for a in delta.LogTail(writer.root, writer.segments).read_commit(2) if "add" in a]
    assert [a["path"] for a in adds] != [name]


def test_a_file_committed_promptly_keeps_its_name(writer):
    files = writer.write_rewrite_files([(rows(10, 11), True)])
    (name,) = [a["path"] for a in files.adds]
    writer.commit_rewrite(files, removes=[])
    adds = [a["add"] for a in delta.LogTail(writer.root, writer.segments).read_commit(2) if "add" in a]
    assert [a["path"] for a in adds] == [name]
    assert writer._written == {}  # nothing tracked once committed


def test_an_append_paused_after_writing_its_file_commits_a_copy(writer, monkeypatch):
    """The plain append path (every producer batch, marker and TC entry): the pause falls right
    after the data file's write, before the commit."""
    written: list[str] = []
    real_put = delta.put_parquet

    def put_then_pause(root, segments, name, data, codecs=None):
        size = real_put(root, segments, name, data, codecs)
        written.append(name)
        age_file(writer, name)
        pause(monkeypatch)
        return size

    monkeypatch.setattr(delta, "put_parquet", put_then_pause)
    assert writer.append(rows(20, 22)) == 2
    monkeypatch.undo()
    adds = [a["add"] for a in delta.LogTail(writer.root, writer.segments).read_commit(2) if "add" in a]
    assert len(written) == 1 and len(adds) == 1 and adds[0]["path"] != written[0]
    assert not os.path.exists(os.path.join(writer.uri, written[0]))
    assert dl.DeltaTable(writer.uri).to_pyarrow_table().sort_by("seq").equals(
        pa.concat_tables([rows(0, 2), rows(20, 22)]))


def test_a_rewrite_failing_half_way_through_its_copies_leaves_no_file_behind(writer, monkeypatch):
    """Two stale files: the first is copied, the second was vacuumed. The commit fails, and neither
    the copy nor any original is left on disk unreferenced."""
    files = writer.write_rewrite_files([(rows(10, 12), True), (rows(12, 14), True)])
    first, second = [a["path"] for a in files.adds]
    os.remove(os.path.join(writer.uri, second))
    before = set(os.listdir(writer.uri))
    pause(monkeypatch)
    with pytest.raises(StorageError, match=f"data file {second} .* is gone"):
        writer.commit_rewrite(files, removes=[])
    assert set(os.listdir(writer.uri)) == before - {first}
    assert writer._written == {}
    monkeypatch.undo()
    assert dl.DeltaTable(writer.uri).to_pyarrow_table().sort_by("seq").equals(rows(0, 2))


def test_a_compaction_through_delta_rs_paused_after_writing_its_file_writes_it_again(writer, monkeypatch):
    """Stores without conditional put commit compactions through delta-rs (``replace_files``)."""
    written: list[str] = []
    real_put = delta.put_parquet

    def put_then_pause(root, segments, name, data, codecs=None):
        size = real_put(root, segments, name, data, codecs)
        written.append(name)
        if len(written) == 1:
            pause(monkeypatch)
        return size

    monkeypatch.setattr(delta, "put_parquet", put_then_pause)
    table = dl.DeltaTable(writer.uri)
    removes = [(a["path"], a["size_bytes"]) for a in delta.add_actions(table).to_pylist()]
    delta.replace_files(writer.root, table, writer.segments, removes, rows(0, 2), ["seq"])
    monkeypatch.undo()
    assert len(written) == 2
    t = dl.DeltaTable(writer.uri)
    assert t.file_uris() == [os.path.join(writer.uri, written[1])]
    assert not os.path.exists(os.path.join(writer.uri, written[0]))
    assert t.to_pyarrow_table().sort_by("seq").equals(rows(0, 2))
