"""Two-level compaction of a keyed log: minor compactions rewrite only the rows of the commits
since the last compaction, full ones every live row; after each, a fresh open reads exactly the
writer's state, and a row dropped by a full compaction never comes back from an older file."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pulsartx.storage.keyed_log import MAX_MINOR_FILES, KeyedLog
from pulsartx.storage.root import StorageRoot

SCHEMA = pa.schema([("seq", pa.int64(), False), ("key", pa.string(), False), ("v", pa.string())])


def _log(root: StorageRoot, every: int = 10) -> KeyedLog:
    return KeyedLog(root, ("kl",), SCHEMA, key_of=lambda r: r["key"], name="kl", compact_every=every).open()


def _rows_added_by_last_commit(table: Path) -> int:
    last = max((table / "_delta_log").glob("*.json"))
    adds = [json.loads(line)["add"] for line in last.read_text().splitlines() if '"add"' in line]
    return sum(json.loads(a["stats"])["numRecords"] for a in adds)


def _state(log: KeyedLog) -> dict[str, str]:
    return {k: r["v"] for k, r in log.rows.items()}


def _update(log: KeyedLog, key: str, v: str, keep) -> None:
    log.cas(key, lambda cur: ({"seq": 0, "key": key, "v": v}, None), what=key, keep=keep)


def test_minor_compactions_rewrite_the_recent_rows_and_full_ones_trim(tmp_path):
    root = StorageRoot.resolve(str(tmp_path))
    log = _log(root)
    keep = lambda r: r["v"] != "dead"  # noqa: E731
    for i in range(300):  # a large live set, as a TC log retaining finished transactions
        _update(log, f"k{i:03d}", "v0", keep)
    rng = random.Random(7)
    kinds, rewritten = [], []
    model = _state(log)
    for step in range(1200):
        key = f"k{rng.randrange(300):03d}"
        v = "dead" if rng.random() < 0.1 else f"v{step}"
        before = (log._minor_files, log._live_at_full)
        _update(log, key, v, keep)
        model[key] = v
        if log.files_since_compaction == 0:  # it compacted
            full = log._minor_files == 0
            kinds.append("full" if full else "minor")
            rewritten.append(_rows_added_by_last_commit(tmp_path / "kl"))
            if full:
                model = {k: v for k, v in model.items() if v != "dead"}
            assert _state(log) == model
            assert _state(_log(root)) == model, f"a fresh open disagrees after a {kinds[-1]} compaction"
            assert before[0] < MAX_MINOR_FILES
    assert kinds.count("minor") > 2 * kinds.count("full") > 0
    minor_sizes = [n for k, n in zip(kinds, rewritten, strict=True) if k == "minor"]
    assert max(minor_sizes) <= 10  # the rows of the commits since the last compaction, not the live set
    assert not any(v == "dead" for v in _state(_log(root)).values()) or kinds[-1] == "minor"


def _last_commit(table: Path) -> list[dict]:
    last = max((table / "_delta_log").glob("*.json"))
    return [json.loads(line) for line in last.read_text().splitlines()]


def test_a_reader_drops_the_rows_another_writers_full_compaction_dropped(tmp_path):
    """A key a full compaction dropped is gone for a reader that catches up over it too, so the key
    written again (from seq 0) is the reader's live row, not the old one it still held."""
    root = StorageRoot.resolve(str(tmp_path))
    keep = lambda r: r["v"] != "dead"  # noqa: E731
    writer, reader = _log(root, every=5), _log(root, every=1000)
    _update(writer, "k0", "x", keep)
    _update(writer, "k0", "dead", keep)  # seq 1
    reader.refresh()
    assert reader.rows["k0"]["seq"] == 1
    for i in range(1, 4):
        _update(writer, f"k{i}", "v", keep)  # the 5th file: a full compaction (the first since opening)
    assert writer.files_since_compaction == 0 and "k0" not in writer.rows
    compaction = _last_commit(tmp_path / "kl")
    reader.refresh()
    assert _state(reader) == {"k1": "v", "k2": "v", "k3": "v"}
    assert {a["commitInfo"].get("pulsartx.compaction") for a in compaction if "commitInfo" in a} == {"full"}
    _update(writer, "k0", "again", keep)  # a new row at seq 0
    assert writer.rows["k0"]["seq"] == 0
    reader.refresh()
    assert _state(reader) == {"k0": "again", "k1": "v", "k2": "v", "k3": "v"} == _state(_log(root))
    # The same where the catch-up is a write's own, stepping over the compaction to its commit slot.
    late = _log(root, every=1000)
    _update(writer, "k1", "dead", keep)
    late.refresh()
    fresh = _log(root, every=1)  # its first compaction is a full one
    _update(fresh, "k2", "v2", keep)
    assert "k1" not in fresh.rows
    _update(fresh, "k1", "new", keep)  # seq 0 again
    late.cas("k9", lambda cur: ({"seq": 0, "key": "k9", "v": "late"}, None), what="k9", optimistic=True)
    assert _state(late) == {"k0": "again", "k1": "new", "k2": "v2", "k3": "v", "k9": "late"}
    assert _state(late) == _state(_log(root))


def test_a_readers_catch_up_over_a_minor_compaction_reads_only_the_new_files(tmp_path):
    """A minor compaction keeps every key, and says so: a reader applies its file on top of what it
    holds, without re-reading the full compaction's file."""
    root = StorageRoot.resolve(str(tmp_path))
    keep = lambda r: r["v"] != "dead"  # noqa: E731
    writer, reader = _log(root, every=5), _log(root, every=1000)
    for i in range(5):
        _update(writer, f"k{i}", "v0", keep)  # a full compaction
    [base] = writer._active
    reader.refresh()
    for i in range(5):
        _update(writer, f"k{i}", "v1", keep)  # a minor one
    assert writer._minor_files == 1
    assert {a["commitInfo"]["pulsartx.compaction"] for a in _last_commit(tmp_path / "kl") if "commitInfo" in a} == {"minor"}
    reads: list[list[str]] = []
    read = reader._read_files

    def spy(files):
        files = list(files)
        reads.append(files)
        return read(files)

    reader._read_files = spy
    reader.refresh()
    assert len(reads) == 1 and base not in reads[0] and len(reads[0]) == 6  # the 5 appends and the minor file
    assert _state(reader) == {f"k{i}": "v1" for i in range(5)} == _state(_log(root))


def test_writers_without_conditional_put_keep_writing_over_each_others_compactions(tmp_path, monkeypatch):
    """Without conditional put every write goes through delta-rs, which checks a commit against its
    handle's snapshot: a handle left behind another writer's compaction conflicted on every retry
    (ConcurrentCommit until the write gave up), however far the writer had caught up."""
    monkeypatch.setattr(StorageRoot, "has_put_if_absent", property(lambda self: False))
    root = StorageRoot.resolve(str(tmp_path))
    keep = lambda r: r["v"] != "dead"  # noqa: E731
    first, second = _log(root, every=5), _log(root, every=5)
    assert not first._appender.fast
    model: dict[str, str] = {}
    for i in range(30):
        log = first if i % 2 == 0 else second
        v = "dead" if i % 9 == 4 else f"v{i}"
        _update(log, f"k{i % 7}", v, keep)
        model[f"k{i % 7}"] = v
    overwrites = [f for f in (tmp_path / "kl" / "_delta_log").glob("*.json") if '"Overwrite"' in f.read_text()]
    assert len(overwrites) >= 4
    live = {k: v for k, v in model.items() if v != "dead"}
    for log in (first, second, _log(root)):
        log.refresh()
        assert {k: v for k, v in _state(log).items() if v != "dead"} == live
        assert set(_state(log)) - set(live) <= {k for k, v in model.items() if v == "dead"}
    assert _state(first) == _state(second) == _state(_log(root))


def test_a_reader_takes_a_key_written_again_up_to_the_seq_it_held(tmp_path):
    """A key a full compaction dropped starts over at seq 0 when written again (a lease store reuses
    its keys): a reader that catches up over both in one go meets the new row at the seq of the old
    one it still holds, and must take the new row; a row still as it was keeps its object."""
    root = StorageRoot.resolve(str(tmp_path))
    keep = lambda r: r["v"] != "dead"  # noqa: E731
    writer, reader = _log(root, every=1000), _log(root, every=1000)
    _update(writer, "k", "dead", keep)  # seq 0
    _update(writer, "other", "v", keep)
    reader.refresh()
    held = reader.rows["other"]
    assert _state(reader) == {"k": "dead", "other": "v"}
    assert writer.compact(keep)  # the first since opening: full, drops k
    assert _state(writer) == {"other": "v"}
    _update(writer, "k", "new", keep)  # seq 0 again
    assert writer.rows["k"]["seq"] == 0
    reader.refresh()  # over the compaction and the new row at once
    assert _state(reader) == {"k": "new", "other": "v"} == _state(_log(root))
    assert reader.rows["k"] == {"seq": 0, "key": "k", "v": "new"}
    assert reader.rows["other"] is held


def _without_conditional_put_a_write_lands_within_anothers_overwrite(monkeypatch, root, during):
    """Another writer's full compaction through delta-rs (an overwrite), with ``during`` committed
    after that writer's last look at the table and before its overwrite's commit."""
    from pulsartx.storage import delta

    real = delta.write
    done = []

    def write(table, data, **kw):
        if kw.get("mode") == "overwrite" and not done:
            done.append(True)
            during()
        return real(table, data, **kw)

    monkeypatch.setattr(delta, "write", write)
    assert _log(root, every=1000).compact(lambda r: True)
    monkeypatch.setattr(delta, "write", real)
    assert done


def test_without_conditional_put_a_writer_keeps_its_own_rows_over_anothers_overwrite(tmp_path, monkeypatch):
    """Without conditional put a writer's own commits go through delta-rs; its rows must survive its
    catch-up over another writer's overwrite (the live files it re-reads include its own), and its
    next compare-and-set must start from its last durable row: from stale rows it wrote a key's
    seq a second time over a lost acknowledgement."""
    from pulsartx.storage import delta

    monkeypatch.setattr(StorageRoot, "has_put_if_absent", property(lambda self: False))
    root = StorageRoot.resolve(str(tmp_path))
    a = _log(root, every=1000)
    assert not a._appender.fast

    def bump(v: str) -> None:
        a.cas("cursor", lambda cur: ({"seq": 0, "key": "cursor", "v": f"{v} after {cur and cur['v']}"}, None),
              what="cursor")

    for i in range(3):
        _update(a, f"k{i}", "x", None)
    bump("ack1")

    def during() -> None:
        _update(_log(root, every=1000), "c", "x", None)  # a's handle is behind it: delta-rs steps over it
        _update(a, "k9", "durable", None)
        bump("ack2")

    _without_conditional_put_a_write_lands_within_anothers_overwrite(monkeypatch, root, during)
    expected = {"c": "x", "k0": "x", "k1": "x", "k2": "x", "k9": "durable", "cursor": "ack2 after ack1 after None"}
    a.refresh()
    assert _state(a) == expected == _state(_log(root))
    live = {str(p) for p in delta.add_actions(delta.open_table(root, "kl")).column("path").to_pylist()}
    assert a._active == live
    bump("ack3")
    expected["cursor"] = "ack3 after ack2 after ack1 after None"
    assert _state(a) == expected == _state(_log(root))
    assert a.rows["cursor"]["seq"] == 2
    # Every row of the cursor ever written: one per seq, none written twice.
    rows = []
    for f in (tmp_path / "kl").glob("*.parquet"):
        rows += [r for r in pq.read_table(f).to_pylist() if r["key"] == "cursor"]
    assert sorted({(r["seq"], r["v"]) for r in rows}) == [
        (0, "ack1 after None"), (1, "ack2 after ack1 after None"), (2, "ack3 after ack2 after ack1 after None")]
