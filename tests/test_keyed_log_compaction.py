"""Two-level compaction of a keyed log: minor compactions rewrite only the rows of the commits
since the last compaction, full ones every live row; after each, a fresh open reads exactly the
writer's state, and a row dropped by a full compaction never comes back from an older file."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa

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
