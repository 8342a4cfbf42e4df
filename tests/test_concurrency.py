"""Real processes racing on one partition (multiprocessing 'spawn': deltalake panics in forked children).

Children report through JSON files and leave with ``os._exit`` once the file is written, so the
occasional abort at interpreter exit (docs/design/deltalake-in-processes.md) cannot hide or fake a result: the parent
judges by the files and by what is in the table, never by exit codes alone.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import traceback
from collections import Counter

N_PROCS = 4
# The brief's full size is 4 x 200 (PULSARTX_TEST_CONCURRENT_APPENDS=200, ~60 s on 2 busy vCPUs);
# the default (4 x 50) keeps the suite fast while still forcing many lost compare-and-sets.
N_APPENDS = int(os.environ.get("PULSARTX_TEST_CONCURRENT_APPENDS", "50"))
JOIN_TIMEOUT_S = 300


# ---- children (top level so that spawn can import them) -----------------------------------------


def _run_child(result_path: str, fn, *args) -> None:
    try:
        out = {"ok": True, "result": fn(*args)}
    except BaseException:  # report everything, the parent decides
        out = {"ok": False, "error": traceback.format_exc()}
    with open(result_path + ".tmp", "w") as f:
        json.dump(out, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(result_path + ".tmp", result_path)
    os._exit(0)


def _append_worker(root_url: str, topic: str, wid: int, n: int, batch_sizes: list[int] | None,
                   producer: str, seq_start: int, go) -> dict:
    from pulsartx.log.partition import PartitionLog, build_records
    from pulsartx.naming import TopicName
    from pulsartx.storage.root import StorageRoot

    plog = PartitionLog(StorageRoot.resolve(root_url), TopicName.parse(topic))
    plog._appender()  # open before the start signal so that all writers start together
    go.wait(60)
    offsets, attempts, seq = [], [], seq_start
    sizes = batch_sizes or [1] * n
    for size in sizes:
        seqs = list(range(seq, seq + size))
        seq += size
        res = plog.append(build_records([f"{wid}:{s}".encode() for s in seqs], producer_name=producer,
                                        sequence_ids=seqs), producer_name=producer)
        offsets.append(res.offsets)
        attempts.append(res.attempts)
    return {"offsets": offsets, "attempts": attempts}


def _producer_first_life(root_url: str, topic: str, name: str, n: int) -> dict:
    from pulsartx import Client

    client = Client(root_url)
    p = client.create_producer(topic, producer_name=name)
    ids = [p.send(b"msg-%d" % i) for i in range(n)]
    last = p.last_sequence_id()
    client.close()
    return {"ids": [[m.partition(), m.offset()] for m in ids], "last_sequence_id": last}


def _producer_second_life(root_url: str, topic: str, name: str, resend: list[int]) -> dict:
    from pulsartx import Client

    client = Client(root_url)
    p = client.create_producer(topic, producer_name=name)
    last_at_start = p.last_sequence_id()
    ids = [p.send(b"msg-%d" % s, sequence_id=s) for s in resend]
    after_resend = p.last_sequence_id()
    nxt = p.send(b"after-restart")
    client.close()
    return {"last_at_start": last_at_start, "resend_ids": [[m.partition(), m.offset()] for m in ids],
            "after_resend": after_resend, "next_id": [nxt.partition(), nxt.offset()],
            "last_at_end": p.last_sequence_id()}


# ---- parent helpers -----------------------------------------------------------------------------


def _spawn_all(tmp_path, jobs: list[tuple], tag: str = "r") -> list:
    """Run ``_run_child(path, *job)`` per job in spawned processes; return each child's result."""
    ctx = mp.get_context("spawn")
    procs, paths = [], []
    for i, job in enumerate(jobs):
        path = str(tmp_path / f"{tag}-result-{i}.json")
        proc = ctx.Process(target=_run_child, args=(path, *job), daemon=True)
        proc.start()
        procs.append(proc)
        paths.append(path)
    for proc in procs:
        proc.join(JOIN_TIMEOUT_S)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    results = []
    for i, path in enumerate(paths):
        assert os.path.exists(path), f"child {i} wrote no result (exit code {procs[i].exitcode})"
        with open(path) as f:
            out = json.load(f)
        assert out["ok"], f"child {i} failed:\n{out['error']}"
        results.append(out["result"])
    return results


def _setup(tmp_path, topic: str = "race", partitions: int = 1) -> str:
    from pulsartx.admin.topics import TopicsAdmin
    from pulsartx.storage.root import StorageRoot

    root_url = str(tmp_path / "root")
    TopicsAdmin(StorageRoot.resolve(root_url)).create_topic(topic, partitions=partitions)
    return root_url


def _partition_state(root_url: str, topic: str):
    """(records as a pyarrow Table, [(version, [(min_offset, max_offset) per add])] of the appends'
    commits in the Delta log). Writers merge small files in the background: a merge commit
    (OPTIMIZE, every action dataChange false) changes no record and is checked, then left out."""
    from pulsartx.log.partition import PartitionLog
    from pulsartx.naming import TopicName
    from pulsartx.storage import delta
    from pulsartx.storage.root import StorageRoot

    root = StorageRoot.resolve(root_url)
    plog = PartitionLog(root, TopicName.parse(topic))
    table = plog.read(0, plog.end_offset())
    commits = []
    for version, actions in delta.LogTail(root, plog.segments).commits_after(0):
        if any(a.get("commitInfo", {}).get("operation") == "OPTIMIZE" for a in actions):
            changes = [a[k]["dataChange"] for a in actions for k in ("add", "remove") if k in a]
            assert changes and not any(changes), (version, actions)
            continue
        ranges = []
        for a in actions:
            if "add" in a:
                st = json.loads(a["add"]["stats"])
                ranges.append((st["minValues"]["offset"], st["maxValues"]["offset"]))
        commits.append((version, ranges))
    return table, commits


# ---- tests --------------------------------------------------------------------------------------


def test_concurrent_appenders_get_dense_distinct_offsets(tmp_path):
    root_url = _setup(tmp_path)
    go = mp.get_context("spawn").Barrier(N_PROCS)  # all writers start once all are up
    jobs = [(_append_worker, root_url, "race-partition-0", w, N_APPENDS, None, f"writer-{w}", 0, go)
            for w in range(N_PROCS)]
    results = _spawn_all(tmp_path, jobs)
    total = N_PROCS * N_APPENDS

    # One commit per append (merges beside them), in version order, each holding the next dense offset range.
    table, commits = _partition_state(root_url, "race-partition-0")
    versions = [v for v, _ in commits]
    assert len(versions) == total and versions == sorted(versions)
    assert [ranges for _, ranges in commits] == [[(o, o)] for o in range(total)]

    # Every (process, i) payload exactly once, at dense, strictly increasing offsets.
    offsets = table.column("offset").to_pylist()
    assert offsets == list(range(total))
    payloads = [v.decode() for v in table.column("value").to_pylist()]
    assert Counter(payloads) == Counter(f"{w}:{i}" for w in range(N_PROCS) for i in range(N_APPENDS))

    # What each writer was told matches what is stored, and its own offsets only grow.
    by_payload = dict(zip(payloads, offsets, strict=True))
    for w, res in enumerate(results):
        got = [o[0] for o in res["offsets"]]
        assert got == [by_payload[f"{w}:{i}"] for i in range(N_APPENDS)]
        assert all(a < b for a, b in zip(got, got[1:], strict=False))
        # Per writer, the payload order in the table is the send order.
        assert [p for p in payloads if p.startswith(f"{w}:")] == [f"{w}:{i}" for i in range(N_APPENDS)]
    assert sorted(o[0] for res in results for o in res["offsets"]) == list(range(total))
    # The race was real: some appends had to retry after losing the compare-and-set.
    assert sum(a > 1 for res in results for a in res["attempts"]) > 0


def test_same_producer_name_race_persists_each_sequence_id_once(tmp_path):
    root_url = _setup(tmp_path)
    go = mp.get_context("spawn").Barrier(2)
    n = 120
    # Different batch boundaries, so that batches partially overlap and dedup has to cut inside them.
    sizes_a = [3] * (n // 3)
    sizes_b = [1, 4, 2, 5] * (n // 12)
    assert sum(sizes_a) == sum(sizes_b) == n
    jobs = [(_append_worker, root_url, "race-partition-0", 0, n, sizes_a, "shared", 0, go),
            (_append_worker, root_url, "race-partition-0", 1, n, sizes_b, "shared", 0, go)]
    results = _spawn_all(tmp_path, jobs)

    table, commits = _partition_state(root_url, "race-partition-0")
    seqs = table.column("sequence_id").to_pylist()
    assert sorted(seqs) == list(range(n))  # each sequence id exactly once...
    assert seqs == list(range(n))  # ...and in sequence order, since every kept id beats all earlier ones
    assert table.column("offset").to_pylist() == list(range(n))
    assert set(table.column("producer_name").to_pylist()) == {"shared"}
    values = [v.decode() for v in table.column("value").to_pylist()]
    assert [int(v.split(":")[1]) for v in values] == list(range(n))

    # The offsets reported to the two processes are disjoint and together cover every record.
    kept = [o for res in results for batch in res["offsets"] for o in batch if o is not None]
    assert sorted(kept) == list(range(n))
    for w, res in enumerate(results):
        for batch in res["offsets"]:
            for o in batch:
                if o is not None:
                    assert values[o].startswith(f"{w}:")
    # Commits hold dense, increasing ranges; appends that were wholly duplicate made no commit.
    flat = [r for _, ranges in commits for r in ranges]
    assert flat[0][0] == 0 and flat[-1][1] == n - 1
    assert all(b[0] == a[1] + 1 for a, b in zip(flat, flat[1:], strict=False))


def test_dedup_survives_a_restart(tmp_path):
    root_url = _setup(tmp_path)
    (first,) = _spawn_all(tmp_path, [(_producer_first_life, root_url, "race", "N", 50)], tag="first")
    assert first["ids"] == [[0, i] for i in range(50)]
    assert first["last_sequence_id"] == 49

    (second,) = _spawn_all(tmp_path, [(_producer_second_life, root_url, "race", "N", list(range(40, 50)))],
                           tag="second")
    assert second["last_at_start"] == 49
    # Deduplicated sends are acknowledged without a new position.
    assert second["resend_ids"] == [[0, -1]] * 10
    assert second["after_resend"] == 49
    assert second["next_id"] == [0, 50]
    assert second["last_at_end"] == 50

    table, _ = _partition_state(root_url, "race-partition-0")
    assert table.column("offset").to_pylist() == list(range(51))
    assert table.column("sequence_id").to_pylist() == list(range(51))
    assert table.column("value").to_pylist() == [b"msg-%d" % i for i in range(50)] + [b"after-restart"]
    assert set(table.column("producer_name").to_pylist()) == {"N"}


def test_spawned_child_sees_parent_writes(tmp_path):
    """The parent has already used deltalake; spawned children must still work (no fork panic)."""
    from pulsartx.log.partition import PartitionLog, build_records
    from pulsartx.naming import TopicName
    from pulsartx.storage.root import StorageRoot

    root_url = _setup(tmp_path)
    plog = PartitionLog(StorageRoot.resolve(root_url), TopicName.parse("race-partition-0"))
    n = 3
    plog.append(build_records([b"parent-%d" % i for i in range(n)]))
    go = mp.get_context("spawn").Barrier(1)
    (res,) = _spawn_all(tmp_path, [(_append_worker, root_url, "race-partition-0", 9, 2, None, "child", 0, go)])
    assert res["offsets"] == [[n], [n + 1]]
    assert plog.read(0, plog.end_offset()).column("value").to_pylist() == [
        b"parent-0", b"parent-1", b"parent-2", b"9:0", b"9:1"]
