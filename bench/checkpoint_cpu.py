"""CPU of one checkpoint: pulsartx's writer against delta-rs's, on the same table. Prints figures;
asserts nothing.

    .venv/bin/python bench/checkpoint_cpu.py [--actions 250,2000,20000] [--rounds 3] [--dir DIR]

For each size, a local table whose last checkpoint (written by delta-rs) holds about that many
actions (live files, app ids, tombstones of the last week, written as crafted commits: a
checkpoint never reads data files), then the commits of one checkpoint interval
(``appender.checkpoint_interval``) as a small transaction leaves them in a partition: two files
and an app id per commit, and a compaction commit every 25. Each round copies that table twice and
checkpoints the last version, once with :func:`pulsartx.storage.checkpoint.write_checkpoint` and
once as the checkpoint thread did before (``DeltaTable(uri, version=v)`` then
``create_checkpoint()``). CPU is ``time.process_time``: every thread, delta-rs's tokio threads
included.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa

from pulsartx.storage import appender, checkpoint, delta
from pulsartx.storage.root import StorageRoot

SCHEMA = pa.schema([("offset", pa.int64()), ("value", pa.binary())])


def _add(now: int, i: int) -> dict:
    stats = {"numRecords": 5, "minValues": {"offset": i * 5}, "maxValues": {"offset": i * 5 + 4},
             "nullCount": {"offset": 0}}
    return {"add": {"path": f"part-00000-{uuid.uuid4()}-c000.zstd.parquet", "partitionValues": {}, "size": 1400,
                    "modificationTime": now, "dataChange": True, "stats": json.dumps(stats)}}


def _commit(log: Path, version: int, actions: list[dict]) -> None:
    now = int(time.time() * 1000)
    info = {"commitInfo": {"timestamp": now, "operation": "WRITE", "engineInfo": "bench"}}
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in [info, *actions]) + "\n")


def build(base: Path, actions: int) -> tuple[StorageRoot, int]:
    """A table whose delta-rs checkpoint holds ~``actions`` actions, plus one interval of commits."""
    root = StorageRoot.resolve(str(base))
    delta.create_table(root, SCHEMA, "t", configuration={"delta.setTransactionRetentionDuration": "interval 7 days",
                                                         "delta.dataSkippingStatsColumns": "offset"})
    log = base / "t" / "_delta_log"
    now = int(time.time() * 1000)
    live: list[str] = []
    v, i = 0, 0
    # A third of the commits remove 20 files (tombstones of the last hour), the others add 20;
    # every 5th sets an app id.
    while i + v // 5 < actions:
        v += 1
        batch = [_add(now, i + k) for k in range(20)]
        i += 20
        live += [a["add"]["path"] for a in batch]
        removes = []
        if v % 3 == 0:
            for p in live[:20]:
                removes.append({"remove": {"path": p, "deletionTimestamp": now - 3_600_000, "dataChange": True,
                                           "extendedFileMetadata": True, "partitionValues": {}, "size": 1400}})
            live = live[20:]
            batch = []
        txn = [{"txn": {"appId": f"producer-{v}", "version": v, "lastUpdated": now}}] if v % 5 == 0 else []
        _commit(log, v, [*txn, *removes, *batch])
    import deltalake as dl

    dl.DeltaTable(root.uri("t"), version=v).create_checkpoint()
    size = delta.read_last_checkpoint(root, ("t",))["size"]
    interval = appender.checkpoint_interval(size)
    for k in range(1, interval + 1):
        v += 1
        if k % 25 == 0:
            out = live[:10]
            live = live[10:]
            acts = [{"remove": {"path": p, "deletionTimestamp": now, "dataChange": False,
                                "extendedFileMetadata": True, "partitionValues": {}, "size": 1400}} for p in out]
            acts.append(_add(now, i))
        else:
            acts = [{"txn": {"appId": f"producer-{k % 7}", "version": v, "lastUpdated": now}},
                    _add(now, i), _add(now, i + 1)]
        i += 2
        live += [a["add"]["path"] for a in acts if "add" in a]
        _commit(log, v, acts)
    print(f"table: last checkpoint {size} actions, then {interval} commits to version {v}")
    return root, v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actions", default="250,2000,20000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir")
    args = ap.parse_args()
    import deltalake as dl

    work = Path(args.dir or tempfile.mkdtemp())
    for n in (int(x) for x in args.actions.split(",")):
        base = work / f"t{n}"
        shutil.rmtree(base, ignore_errors=True)
        root, v = build(base, n)
        ours, theirs = [], []
        warm = work / f"w{n}"  # imports and first calls (pyarrow.compute, the parquet writer) untimed
        shutil.copytree(base, warm)
        checkpoint.write_checkpoint(StorageRoot.resolve(str(warm)), ("t",), v)
        dl.DeltaTable(str(warm / "t"), version=v)
        shutil.rmtree(warm)
        for r in range(args.rounds):
            a, b = work / f"a{n}-{r}", work / f"b{n}-{r}"
            shutil.copytree(base, a)
            shutil.copytree(base, b)
            ra, rb = StorageRoot.resolve(str(a)), StorageRoot.resolve(str(b))
            c0 = time.process_time()
            written = checkpoint.write_checkpoint(ra, ("t",), v)
            ours.append((time.process_time() - c0) * 1000)
            c0 = time.process_time()
            dl.DeltaTable(rb.uri("t"), version=v).create_checkpoint()
            theirs.append((time.process_time() - c0) * 1000)
            assert written is not None
            size = written.size
            shutil.rmtree(a)
            shutil.rmtree(b)
        print(f"{size:>7} actions: pulsartx {' '.join(f'{x:6.1f}' for x in ours)} ms   "
              f"delta-rs open+checkpoint {' '.join(f'{x:6.1f}' for x in theirs)} ms")


if __name__ == "__main__":
    main()
