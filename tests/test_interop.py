"""docs/interop.md's recipe, run as the doc writes it: the SQL and the Python helpers are taken
from the doc's fenced blocks, so the doc cannot drift from what is tested. Through DuckDB (with
the delta extension shipped by ``duckdb-extension-delta``) and through Polars, the recipe must
return exactly what pulsartx's READ_COMMITTED reader returns: same offsets, same payloads, same
order, on partitions holding plain messages, committed, aborted and open transactions, Spark
write jobs (one with a retried task whose first attempt the commit leaves out) and a straggler
written after its own transaction's marker; before and after compaction.
"""
from __future__ import annotations

import glob
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pulsartx.commit_protocol.job import JobTransaction
from pulsartx.commit_protocol.task import TaskAppender
from spark_jobs.checks import write

from pulsartx import MessageId
from pulsartx.log.index import DataFile
from pulsartx.log.partition import build_records, shared_log
from pulsartx.maintenance.compaction import compact_partition, rewrite_plan
from pulsartx.naming import TopicName
from pulsartx.storage.keyed_log import KeyedLog
from pulsartx.storage.root import StorageRoot

pytestmark = pytest.mark.spark
DOC = Path(__file__).resolve().parents[1] / "docs" / "interop.md"


def fenced(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


(RECIPE,) = fenced("sql")
HELPERS: dict[str, Any] = {}
for block in fenced("python"):
    exec(compile(block, str(DOC), "exec"), HELPERS)


def partition_path(root: str, topic: str, i: int) -> str:
    t = TopicName.parse(topic)
    return str(Path(root) / "topics" / t.tenant / t.namespace / t.local_name / f"partition-{i}")


def pulsartx_read(client: Any, topic: str) -> dict[int, list[tuple[int, bytes]]]:
    """What a fresh READ_COMMITTED reader returns, per partition: [(offset, payload)] in order."""
    reader = client.create_reader(topic, MessageId.earliest)
    out: dict[int, list[tuple[int, bytes]]] = {}
    while reader.has_message_available():
        m = reader.read_next(timeout_millis=3000)
        out.setdefault(m.message_id().partition(), []).append((m.message_id().offset(), m.data()))
    reader.close()
    return out


def recipe_reads(root: str, topic: str, i: int) -> dict[str, list[tuple[int, bytes]]]:
    path = partition_path(root, topic, i)
    duck = HELPERS["read_committed_duckdb"](path, RECIPE)
    polars = HELPERS["read_committed_polars"](path, RECIPE).to_arrow()
    return {name: list(zip(t.column("offset").to_pylist(), t.column("value").to_pylist(), strict=True))
            for name, t in (("duckdb", duck), ("polars", polars))}


def task_attempt(job: JobTransaction, topic: TopicName, attempt: int, values: list[bytes],
                 registered: frozenset[str] = frozenset()) -> Any:
    """One attempt of a Spark write task, through the write path's own task code."""
    task = TaskAppender(job, topic, {str(topic): 1}, None, 0, attempt, registered=registered)
    task.add(pa.RecordBatch.from_pydict({"value": pa.array(values, pa.binary())}))
    return task.finish()


def test_recipe_returns_exactly_read_committed_on_one_partition(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("mixed", 1)
    p = client.create_producer("mixed")
    for i in range(3):
        p.send(f"plain-{i}".encode())
    a = client.new_transaction()
    p.send(b"a-0", txn=a)
    p.send(b"a-1", txn=a)
    a.commit()
    client.flush()
    # A zombie writer of the committed transaction, appending after its marker: a straggler.
    shared_log(StorageRoot.resolve(root), TopicName.parse("mixed").with_partition(0)).append(
        build_records([b"a-late"], txn=a.txn_id.as_tuple()))
    b = client.new_transaction()
    p.send(b"b-0", txn=b)
    b.abort()
    write(spark.range(4, numPartitions=2).selectExpr("concat('spark-', id) as value"), root, topic="mixed")
    write(spark.range(2, numPartitions=1).selectExpr("concat('sparkplain-', id) as value"), root, topic="mixed",
          transactional="false")
    # A write job whose task ran twice: the commit lists only the second attempt's entries.
    topic = TopicName.parse("mixed")
    job = JobTransaction.begin(StorageRoot.resolve(root), partitions=[str(topic.with_partition(0))])
    task_attempt(job, topic, 0, [b"retried-0", b"retried-1"])
    job.commit([task_attempt(job, topic, 1, [b"retried-0", b"retried-1"])])
    # A zombie attempt of the same task, still appending after the job committed: a straggler.
    task_attempt(job, topic, 2, [b"retried-0"], registered=frozenset({str(topic.with_partition(0))}))
    p.send(b"plain-3")
    held = client.new_transaction(timeout_ms=600_000)  # open: holds maxReadPosition here
    p.send(b"open-0", txn=held)
    later = client.new_transaction()
    p.send(b"later-0", txn=later)
    later.commit()
    p.send(b"plain-4")
    client.flush()  # the markers, written by the background completer

    expected_values = [b"plain-0", b"plain-1", b"plain-2", b"a-0", b"a-1", *sorted(
        f"spark-{i}".encode() for i in range(4)), b"sparkplain-0", b"sparkplain-1", b"retried-0", b"retried-1",
        b"plain-3"]
    got = pulsartx_read(client, "mixed")[0]
    # Spark's tasks may append in either order: compare the Spark rows as a set, the rest in order.
    assert sorted(v for _, v in got) == sorted(expected_values)
    assert [v for _, v in got if not v.startswith(b"spark-")] == [v for v in expected_values
                                                                  if not v.startswith(b"spark-")]
    assert recipe_reads(root, "mixed", 0) == {"duckdb": got, "polars": got}

    # Once the open transaction commits, everything after it shows, in both.
    held.commit()
    client.flush()
    got = pulsartx_read(client, "mixed")[0]
    assert [v for _, v in got][-4:] == [b"plain-3", b"open-0", b"later-0", b"plain-4"]
    assert recipe_reads(root, "mixed", 0) == {"duckdb": got, "polars": got}

    # Compaction drops the aborted and left-out rows and leaves the replaced files until vacuum:
    # the recipe, through the Delta log, still returns exactly the same; a glob of the files does not.
    res = compact_partition(StorageRoot.resolve(root), topic.with_partition(0))
    assert res.skipped is None and res.rows_dropped > 0
    assert pulsartx_read(client, "mixed")[0] == got
    assert recipe_reads(root, "mixed", 0) == {"duckdb": got, "polars": got}
    files = glob.glob(partition_path(root, "mixed", 0) + "/*.parquet")
    globbed = pa.concat_tables([pq.read_table(f, columns=["offset"]) for f in files]).column("offset").to_pylist()
    assert len(globbed) > len(set(globbed))


def test_recipe_on_every_partition_of_a_topic(spark: Any, client: Any, root: str) -> None:
    client.admin.create_topic("multi", 3)
    p = client.create_producer("multi")
    write(spark.range(30, numPartitions=2).selectExpr("concat('job-', id) as value"), root, topic="multi")
    keyed = [(f"k{i}", f"m-{i}".encode()) for i in range(12)]
    for k, v in keyed[:4]:
        p.send(v, partition_key=k)
    committed = client.new_transaction()
    aborted = client.new_transaction()
    for k, v in keyed[4:8]:
        p.send(b"c-" + v, partition_key=k, txn=committed)
        p.send(b"x-" + v, partition_key=k, txn=aborted)
    committed.commit()
    aborted.abort()
    held = client.new_transaction(timeout_ms=600_000)
    p.send(b"open", partition_key="k0", txn=held)  # holds back one partition only
    p.send(b"after-open", partition_key="k0")
    for k, v in keyed[8:]:
        p.send(v, partition_key=k)
    client.flush()

    got = pulsartx_read(client, "multi")
    assert sum(len(v) for v in got.values()) > 30
    assert not any(v.startswith((b"x-", b"open", b"after-open")) for rows in got.values() for _, v in rows)
    assert {b"c-" + v for _, v in keyed[4:8]} <= {v for rows in got.values() for _, v in rows}
    for i in range(3):
        assert recipe_reads(root, "multi", i) == {"duckdb": got.get(i, []), "polars": got.get(i, [])}
    held.abort()


# ---- compaction commits, as a Delta reader sees them -----------------------------------------------------
def commits(table_path: str) -> list[list[dict[str, Any]]]:
    return [[json.loads(line) for line in open(f)] for f in sorted(glob.glob(table_path + "/_delta_log/*.json"))]


def flags(commit: list[dict[str, Any]], action: str) -> list[bool]:
    return [a[action]["dataChange"] for a in commit if action in a]


def operation(commit: list[dict[str, Any]]) -> str:
    (info,) = [a["commitInfo"] for a in commit if "commitInfo" in a]
    return info["operation"]


def test_partition_compaction_is_an_optimize_with_data_change_only_where_rows_drop(client: Any, root: str) -> None:
    client.admin.create_topic("opt", 1)
    p = client.create_producer("opt")
    for i in range(3):  # three files, nothing to drop
        p.send(f"plain-{i}".encode())
    sroot, part = StorageRoot.resolve(root), TopicName.parse("opt").with_partition(0)
    path = partition_path(root, "opt", 0)
    before = pulsartx_read(client, "opt")
    assert compact_partition(sroot, part).rows_dropped == 0
    last = commits(path)[-1]
    assert operation(last) == "OPTIMIZE"
    assert flags(last, "remove") == [False] * 3 and flags(last, "add") == [False]
    info = next(a["commitInfo"] for a in last if "commitInfo" in a)
    assert info["operationParameters"] == {"predicate": "[]", "zOrderBy": "[]"} and info["isBlindAppend"] is False
    assert pulsartx_read(client, "opt") == before

    # An aborted transaction between plain files: the files it touches drop rows (a data change),
    # the runs around them are rearranged only.
    x = client.new_transaction()
    p.send(b"x-0", txn=x)
    x.abort()
    client.flush()
    for i in range(3, 5):
        p.send(f"plain-{i}".encode())
    before = pulsartx_read(client, "opt")
    assert [v for _, v in before[0]] == [f"plain-{i}".encode() for i in range(5)]
    res = compact_partition(sroot, part)
    assert res.rows_dropped == 1
    last = commits(path)[-1]
    assert operation(last) == "OPTIMIZE"
    # files: [compacted plain 0-2], [x-0], [abort marker], [plain-3], [plain-4]
    assert flags(last, "remove") == [False, True, False, False, False]
    assert flags(last, "add") == [False, False]  # x-0's file kept nothing
    assert pulsartx_read(client, "opt") == before
    assert recipe_reads(root, "opt", 0) == {"duckdb": before[0], "polars": before[0]}
    # deltalake opens the table and reads one row per offset: the file x-0 was alone in is gone.
    import deltalake

    offsets = deltalake.DeltaTable(path).to_pyarrow_table(columns=["offset"]).column("offset").to_pylist()
    assert sorted(offsets) == sorted(set(offsets)) and len(offsets) == 6  # 5 plain + 1 marker


def test_rewrite_plan_flags_runs_of_files_that_lose_rows() -> None:
    """A file that loses some rows is rewritten at dataChange=true with its survivors; runs of
    files that lose none merge at dataChange=false; offset ranges stay disjoint and ordered."""
    files = [DataFile(0, 1, "a", 10, 2), DataFile(2, 3, "b", 10, 2), DataFile(4, 6, "c", 10, 3),
             DataFile(7, 7, "d", 10, 1), DataFile(8, 9, "e", 10, 2)]
    kept = pa.table({"offset": pa.array([0, 1, 2, 3, 4, 6, 8, 9], pa.int64())})  # 5 and 7 dropped
    parts, removes = rewrite_plan(files, kept)
    assert [(t.column("offset").to_pylist(), change) for t, change in parts] == [
        ([0, 1, 2, 3], False), ([4, 6], True), ([8, 9], False)]
    assert removes == [("a", 10, False), ("b", 10, False), ("c", 10, True), ("d", 10, True), ("e", 10, False)]


def test_keyed_log_compaction_is_an_optimize_that_changes_data(root: str) -> None:
    """Keyed logs (TC logs, subscriptions) compact by keeping each key's newest row: superseded rows
    go, so Delta must see a data change; deltalake still reads exactly the live rows."""
    import deltalake

    sroot = StorageRoot.resolve(root)
    schema = pa.schema([("seq", pa.int64(), False), ("key", pa.string(), False), ("v", pa.string())])
    kl = KeyedLog(sroot, ("kl",), schema, key_of=lambda r: r["key"], name="kl").open()
    for i in range(3):
        kl.put([{"seq": 0, "key": f"k{i}", "v": "old"}])
        kl.put([{"seq": 1, "key": f"k{i}", "v": "new"}])
    assert kl.compact(lambda r: True)
    last = commits(sroot.uri("kl"))[-1]
    assert operation(last) == "OPTIMIZE"
    assert flags(last, "remove") == [True] * 6 and flags(last, "add") == [True]
    rows = deltalake.DeltaTable(sroot.uri("kl")).to_pyarrow_table().sort_by("key").to_pylist()
    assert rows == [{"seq": 1, "key": f"k{i}", "v": "new"} for i in range(3)]
