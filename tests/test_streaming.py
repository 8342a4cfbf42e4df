"""Structured Streaming in the test process's SparkSession: ``readStream.format("pulsartx")`` (offsets,
admission control, Trigger.AvailableNow, READ_COMMITTED under concurrent transactions, topicsPattern,
failOnDataLoss, option errors) and ``writeStream.format("pulsartx")`` (the consume-transform-produce
pipeline through a subscription, a deleted checkpoint, a zombie query fenced by a newer one).

Spark gives a new streaming source runner a fixed 10 s to connect back; on an overloaded machine
its start can fail, so queries are started through helpers that start them again in that case
(``run_to_end`` / ``started``). Every query is stopped in ``finally``: one left running would keep
using the session's two cores for every later test.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from _reads import offset_numbers
from stream_jobs.harness import committed_messages, cursor_positions, last_offsets, per_key_sequences

pytestmark = pytest.mark.spark
WAIT_S = 600  # generous: a first batch can take a minute on a busy 2-core machine


def _retryable(e: BaseException) -> bool:
    return "failed to connect back" in str(e)


def run_to_end(start: Callable[[int], Any], timeout: float = WAIT_S) -> Any:
    """Run a Trigger.AvailableNow query to its end; ``start(attempt)`` starts it (a fresh one per
    attempt if it keeps state elsewhere than its checkpoint)."""
    for attempt in range(5):
        q = start(attempt)
        try:
            if not q.awaitTermination(timeout):
                q.stop()
                raise AssertionError(f"query did not finish within {timeout}s; last progress {q.lastProgress}")
            return q
        except Exception as e:
            q.stop()
            if not _retryable(e) or attempt == 4:
                raise
    raise AssertionError("unreachable")


def wait_until(q: Any, cond: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if not q.isActive:
            raise AssertionError(f"query ended before {what}: {q.exception()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last progress {q.lastProgress}")
        time.sleep(0.3)


@contextmanager
def started(start: Callable[[int], Any], ready: Callable[[Any], bool] | None = None) -> Iterator[Any]:
    """A continuously triggered query, once ``ready(query)`` (default: its first batch completed);
    started again if its source runner failed to start. Stopped on exit."""
    ready = ready or (lambda q: q.lastProgress is not None)
    q = None
    try:
        for attempt in range(5):
            q = start(attempt)
            try:
                wait_until(q, lambda q=q: ready(q), "the query to be ready")
                break
            except AssertionError:
                exc = q.exception()
                q.stop()
                if exc is None or not _retryable(exc) or attempt == 4:
                    raise
        yield q
    finally:
        if q is not None:
            q.stop()


def last_end(q: Any) -> dict[str, Any] | None:
    """The end offsets of the query's latest progress report that has them, parsed, without the
    partitions' table ids."""
    ends = [p["sources"][0].get("endOffset") for p in q.recentProgress]
    ends = [e for e in ends if e]
    return offset_numbers(json.loads(ends[-1])) if ends else None


def memory_rows(spark: Any, name: str) -> list[Any]:
    return spark.sql(f"SELECT * FROM {name}").collect()


def stream(spark: Any, root: str, **options: str) -> Any:
    return spark.readStream.format("pulsartx").option("service.url", root).options(**options).load()


def as_string(col: str) -> Any:
    from pyspark.sql import functions as F

    return F.col(col).cast("string").alias(col)


def send(client: Any, topic: str, values: list[str], keys: list[str] | None = None) -> None:
    p = client.create_producer(topic)
    for i, v in enumerate(values):
        p.send_async(v.encode(), None, partition_key=None if keys is None else keys[i])
    p.flush()
    p.close()


def end_offsets(client: Any, topic: str) -> dict[str, int]:
    from pulsartx.log.partition import PartitionLog

    return {str(p.partition): PartitionLog(client.root, p).end_offset() for p in client.admin.partitions_of(topic)}


def sink_txns(client: Any, key: str) -> list[Any]:
    """The TC records of the transactions the streaming sink began under ``key``."""
    from pulsartx.coordinator.registry import Coordinators

    tcs = Coordinators(client.root, recover_on_open=False)
    return [m for tc in tcs.all() for m in tc.transactions() if m.transaction_key == key]


# ---- the source -----------------------------------------------------------------------------------
def test_offsets_admission_control_and_available_now(spark: Any, client: Any, root: str, tmp_path: Path) -> None:
    """Offsets are {topic: {partition: offset, "tableIds": {partition: id}}} JSON in a stable order; maxEntriesPerTrigger bounds
    every batch, spread over the partitions; Trigger.AvailableNow stops by itself at the data present
    when it started, although more arrives during the run."""
    client.admin.create_topic("ev", 3)
    client.admin.create_topic("aa", 1)
    send(client, "ev", [f"ev-{i}" for i in range(300)], [f"k{i % 11}" for i in range(300)])
    send(client, "aa", [f"aa-{i}" for i in range(30)])
    at_start = {"public/default/aa": end_offsets(client, "aa"), "public/default/ev": end_offsets(client, "ev")}
    limit = 90
    late: list[str] = []
    stop_late = threading.Event()

    def produce_late() -> None:  # more data while the query runs: AvailableNow must not read it
        while not stop_late.is_set() and not list(tmp_path.glob("ck*/offsets/0")):
            time.sleep(0.1)  # offsets/0 is logged after the AvailableNow end was fixed
        while not stop_late.is_set() and len(late) < 200:
            batch = [f"late-{len(late) + i}" for i in range(10)]
            send(client, "ev", batch)
            late.extend(batch)
            time.sleep(0.2)

    def start(attempt: int) -> Any:
        df = stream(spark, root, topics="ev,aa", startingOffsets="earliest", maxEntriesPerTrigger=str(limit))
        return (df.select(as_string("value"), "__topic", "__partition", "__offset").writeStream.format("memory")
                .queryName(f"an{attempt}").option("checkpointLocation", str(tmp_path / f"ck{attempt}"))
                .trigger(availableNow=True).start())

    producer = threading.Thread(target=produce_late)
    producer.start()
    try:
        q = run_to_end(start)
    finally:
        stop_late.set()
        producer.join()
    assert late, "nothing was produced during the run"
    assert not q.isActive
    rows = memory_rows(spark, q.name)
    values = [r["value"] for r in rows]
    assert Counter(values) == Counter([f"ev-{i}" for i in range(300)] + [f"aa-{i}" for i in range(30)])

    progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert len(progress) >= 330 // limit
    prev = {t: {p: 0 for p in ps} for t, ps in at_start.items()}
    spread_batches = 0
    for p in progress:
        raw = p["sources"][0]["endOffset"]
        end = json.loads(raw)
        assert isinstance(end, dict) and all(isinstance(v, dict) for v in end.values())
        assert list(end) == sorted(end) == ["public/default/aa", "public/default/ev"]
        for ps in end.values():  # partitions, then their tables (incarnations)
            tables = ps.pop("tableIds")
            assert list(ps) == sorted(ps, key=int) and all(isinstance(o, int) for o in ps.values())
            assert list(tables) == list(ps) and all(isinstance(t, str) and t for t in tables.values())
            ps["tableIds"] = tables
        assert json.dumps(end) == raw  # the stable, canonical form Spark logs
        end = offset_numbers(end)
        assert p["numInputRows"] <= limit
        taken = {(t, part): end[t][part] - prev.get(t, {}).get(part, 0) for t in end for part in end[t]}
        assert sum(taken.values()) == p["numInputRows"]
        spread_batches += sum(1 for v in taken.values() if v > 0) >= 3
        prev = end
    assert spread_batches >= len(progress) - 1, "batches were not spread over the partitions"
    assert prev == at_start, "AvailableNow did not stop exactly at the offsets present when it started"


def test_streaming_read_never_shows_uncommitted_or_aborted_data(spark: Any, client: Any, root: str,
                                                               tmp_path: Path) -> None:
    """A transactional producer commits half of its transactions and aborts the other half (one is
    held open across several triggers) while a streaming query reads the topic (its value column
    only): the output holds exactly the committed messages, each once, and never anything else at
    any time."""
    client.admin.create_topic("tx", 2)
    send(client, "tx", ["plain-init"])
    committed: list[str] = ["plain-init"]
    done = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            p = client.create_producer("tx")
            for i in range(10):
                txn = client.new_transaction(timeout_ms=300_000)
                values = [f"{'C' if i % 2 == 0 else 'A'}{i}-{j}" for j in range(8)]
                for j, v in enumerate(values):
                    p.send_async(v.encode(), None, partition_key=f"k{j % 4}", txn=txn)
                p.flush()
                if i == 6:  # undecided across several triggers, with committed data behind it
                    p.send(f"plain-{i}".encode(), partition_key="k0")
                    committed.append(f"plain-{i}")
                    time.sleep(2)
                if i % 2 == 0:
                    txn.commit()
                    committed.extend(values)
                else:
                    txn.abort()
                time.sleep(0.3)
            p.close()
        except BaseException as e:  # reported by the test thread
            errors.append(e)
        finally:
            done.set()

    def start(attempt: int) -> Any:
        # Only the value column, declared (the projected read path; the other tests read them all).
        df = (spark.readStream.format("pulsartx").schema("value binary").option("service.url", root)
              .option("topic", "tx").option("startingOffsets", "earliest").load())
        assert df.columns == ["value"]
        return (df.select(as_string("value")).writeStream.format("memory").queryName(f"rc{attempt}")
                .option("checkpointLocation", str(tmp_path / f"ck{attempt}")).trigger(processingTime="500 milliseconds")
                .start())

    thread = threading.Thread(target=produce)
    with started(start) as q:
        thread.start()
        seen_bad: set[str] = set()
        while not done.is_set():
            seen_bad |= {r["value"] for r in memory_rows(spark, q.name) if not r["value"].startswith(("C", "plain"))}
            time.sleep(0.5)
        thread.join()
        assert not errors, errors
        wait_until(q, lambda: len(memory_rows(spark, q.name)) >= len(committed), "every committed message")
        # No batch ever plans past maxReadPosition, and once everything is decided the query catches
        # up with the partitions' ends (the last markers included).
        decided_end = {"public/default/tx": end_offsets(client, "tx")}
        wait_until(q, lambda: last_end(q) == decided_end, "the end of the decided data")
        time.sleep(1)  # another trigger or two: nothing else may arrive
        values = [r["value"] for r in memory_rows(spark, q.name)]
        progress = q.recentProgress
    assert not seen_bad, f"aborted/uncommitted data was visible: {sorted(seen_bad)[:10]}"
    assert Counter(values) == Counter(committed)
    assert len(committed) == 5 * 8 + 2
    assert sum(p["numInputRows"] for p in progress) == len(committed)  # every row once; markers are not rows


def test_topics_pattern_picks_up_a_topic_created_later(spark: Any, client: Any, root: str, tmp_path: Path) -> None:
    client.admin.create_topic("pat-a", 1)
    client.admin.create_topic("other", 1)
    send(client, "pat-a", [f"a{i}" for i in range(5)])
    send(client, "other", ["not-me"])

    def start(attempt: int) -> Any:
        df = stream(spark, root, topicsPattern="public/default/pat-.*", startingOffsets="earliest")
        return (df.select(as_string("value"), "__topic").writeStream.format("memory").queryName(f"pat{attempt}")
                .option("checkpointLocation", str(tmp_path / f"ck{attempt}")).trigger(processingTime="500 milliseconds")
                .start())

    with started(start) as q:
        wait_until(q, lambda: len(memory_rows(spark, q.name)) >= 5, "pat-a's messages")
        client.admin.create_topic("pat-b", 2)
        send(client, "pat-b", [f"b{i}" for i in range(6)], [f"k{i}" for i in range(6)])
        send(client, "pat-a", ["a5"])
        wait_until(q, lambda: len(memory_rows(spark, q.name)) >= 12, "the new topic's messages")
        time.sleep(1.5)
        rows = memory_rows(spark, q.name)
        last = last_end(q)
    assert Counter(r["value"] for r in rows) == Counter([f"a{i}" for i in range(6)] + [f"b{i}" for i in range(6)])
    assert {r["__topic"] for r in rows if r["value"].startswith("b")} == {"persistent://public/default/pat-b"}
    assert set(last) == {"public/default/pat-a", "public/default/pat-b"}
    assert last["public/default/pat-b"] == end_offsets(client, "pat-b")


def test_a_running_query_reads_a_grown_topics_new_partitions_from_their_start(spark: Any, client: Any, root: str,
                                                                             tmp_path: Path) -> None:
    """As Spark's Kafka source: partitions added under a running query (``startingOffsets=latest``,
    which applies to its first batch only) are read from their earliest offset."""
    client.admin.create_topic("grow", 1)
    send(client, "grow", ["before"])

    def start(attempt: int) -> Any:
        df = stream(spark, root, topic="grow", startingOffsets="latest")
        return (df.select(as_string("value"), "__partition").writeStream.format("memory").queryName(f"grow{attempt}")
                .option("checkpointLocation", str(tmp_path / f"ck{attempt}")).trigger(processingTime="500 milliseconds")
                .start())

    with started(start) as q:
        client.admin.update_partitioned_topic("grow", 3)
        send(client, "grow", [f"g{i}" for i in range(9)], [f"k{i}" for i in range(9)])
        wait_until(q, lambda: len(memory_rows(spark, q.name)) >= 9, "the new partitions' messages")
        time.sleep(1.5)
        rows = memory_rows(spark, q.name)
        last = last_end(q)
    assert Counter(r["value"] for r in rows) == Counter(f"g{i}" for i in range(9))
    assert {r["__partition"] for r in rows} == {0, 1, 2}
    assert last == {"public/default/grow": end_offsets(client, "grow")}


def test_fail_on_data_loss(spark: Any, client: Any, root: str, tmp_path: Path) -> None:
    """Offsets deleted by retention before the query read them: the query fails naming
    failOnDataLoss, or with failOnDataLoss=false skips to what is left."""
    from pulsartx.maintenance.retention import apply_retention
    from pulsartx.naming import TopicName

    client.admin.create_topic("dl", 1)
    send(client, "dl", [f"old{i}" for i in range(10)])  # one Delta file: offsets 0..9
    send(client, "dl", [f"new{i}" for i in range(5)])  # another: 10..14
    res = apply_retention(client.root, TopicName.parse("dl").with_partition(0), max_age_ms=0, force=True)
    assert res.new_start_offset == 10
    from_zero = json.dumps({"dl": {"0": 0}})

    def start(fail: str) -> Callable[[int], Any]:
        def go(attempt: int) -> Any:
            df = stream(spark, root, topic="dl", startingOffsets=from_zero, failOnDataLoss=fail)
            return (df.select(as_string("value")).writeStream.format("memory").queryName(f"dl{fail}{attempt}")
                    .option("checkpointLocation", str(tmp_path / f"ck-{fail}-{attempt}")).trigger(availableNow=True)
                    .start())
        return go

    with pytest.raises(Exception) as info:
        run_to_end(start("true"))
    msg = str(info.value)
    assert "data loss" in msg and "failOnDataLoss" in msg and "0..9" in msg, msg[-2000:]
    q = run_to_end(start("false"))
    assert sorted(r["value"] for r in memory_rows(spark, q.name)) == sorted(f"new{i}" for i in range(5))


def test_bad_options_give_clear_errors(spark: Any, client: Any, root: str, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    client.admin.create_topic("bo", 1)
    send(client, "bo", ["x"])

    def failure(start: Callable[[int], Any]) -> str:
        with pytest.raises(Exception) as info:
            run_to_end(start)
        return str(info.value)

    # endingOffsets on a stream: fails when the query starts, naming the option.
    msg = failure(lambda a: stream(spark, root, topic="bo", endingOffsets="latest").writeStream.format("memory")
                  .queryName(f"eo{a}").option("checkpointLocation", str(tmp_path / f"eo{a}"))
                  .trigger(availableNow=True).start())
    assert "endingOffsets" in msg and "Trigger.AvailableNow" in msg, msg[-2000:]

    df = stream(spark, root, topic="bo")
    # No checkpoint location (and no transactionKey): refused, naming checkpointLocation.
    with pytest.raises(Exception) as info:
        q = (df.select("value").writeStream.format("pulsartx").option("service.url", root).option("topic", "bo")
             .trigger(availableNow=True).start())
        q.awaitTermination(WAIT_S)
        q.stop()
    assert "checkpointLocation" in str(info.value), str(info.value)[-2000:]

    # outputMode complete (an aggregation): refused, append-only topics.
    counts = df.groupBy("__key").count().select(F.col("count").cast("string").alias("value"), "__key")
    msg = failure(lambda a: counts.writeStream.format("pulsartx").outputMode("complete").option("service.url", root)
                  .option("topic", "bo").option("checkpointLocation", str(tmp_path / f"cm{a}"))
                  .trigger(availableNow=True).start())
    assert "complete" in msg.lower(), msg[-2000:]


@pytest.mark.parametrize("bad", ["0", "-5", "ten", "1.5"])
def test_bad_max_entries_per_trigger_names_the_option(bad: str) -> None:
    """Checked by the option parser the stream reader calls first, so no query has to start."""
    from pulsartx.datasource.options import parse_stream_options

    from pulsartx.exceptions import InvalidConfiguration

    with pytest.raises(InvalidConfiguration, match="maxEntriesPerTrigger"):
        parse_stream_options({"service.url": "/tmp/x", "topic": "t", "maxEntriesPerTrigger": bad})


# ---- the sink: consume-transform-produce --------------------------------------------------------------
def _seq(value: str) -> int:
    return int(value.split("@", 1)[0].rsplit(":", 1)[1])


def _pipeline(spark: Any, root: str, checkpoint: str, max_entries: int = 60, subscription: str = "enrich",
              output: str = "enriched") -> Any:
    """orders -> enriched through subscription 'enrich': one transaction per micro-batch."""
    from pyspark.sql import functions as F

    def start(attempt: int) -> Any:
        src = stream(spark, root, topic="orders", subscription=subscription, startingOffsets="earliest",
                     maxEntriesPerTrigger=str(max_entries))
        out = src.select(
            F.concat(F.lit("T:"), F.col("value").cast("string"), F.lit("@"), F.col("__partition").cast("string"),
                     F.lit(":"), F.col("__offset").cast("string")).alias("value"),
            F.col("__key"))
        return (out.writeStream.format("pulsartx").option("service.url", root).option("topic", output)
                .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())

    return run_to_end(start)


def test_pipeline_exactly_once_in_key_order_then_checkpoint_deleted(spark: Any, client: Any, root: str,
                                                                    tmp_path: Path) -> None:
    from pulsartx.commit_protocol.microbatch import OWNER, query_transaction_key

    client.admin.create_topic("orders", 3)
    client.admin.create_topic("enriched", 2)
    produced: dict[str, int] = defaultdict(int)

    def produce(n: int) -> None:
        keys = [f"c{i % 7}" for i in range(n)]
        values = []
        for k in keys:
            values.append(f"{k}:{produced[k]:05d}")
            produced[k] += 1
        send(client, "orders", values, keys)

    def check() -> list[Any]:
        cursors = cursor_positions(client, "orders", "enrich")
        inputs = committed_messages(root, "orders")
        assert cursors == last_offsets(inputs), "the subscription cursor is not on the last committed input"
        out = committed_messages(root, "enriched")
        by_key = per_key_sequences(out, _seq)
        assert {k: len(v) for k, v in by_key.items()} == dict(produced)
        for k, seqs in by_key.items():
            assert seqs == list(range(produced[k])), f"key {k}: duplicates, gaps or reordering: {seqs[:40]}"
        assert sorted(m[3].split("@")[1] for m in out) == sorted(f"{p}:{o}" for p, o, _, _ in inputs)
        return out

    from pulsartx.datasource.progress import PulsarTxProgressListener

    checkpoint = str(tmp_path / "checkpoint")
    produce(240)
    forwarded: list[dict[str, Any]] = []
    listener = PulsarTxProgressListener(root, on_batch=forwarded.append)
    spark.streams.addListener(listener)
    try:
        q = _pipeline(spark, root, checkpoint)
        progress = list(q.recentProgress)
        deadline = time.monotonic() + 60  # listener events arrive asynchronously
        while len(listener.batches) < len(progress) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(listener)
    batches = [p for p in progress if p["numInputRows"]]
    assert len(batches) >= 4 and all(p["numInputRows"] <= 60 for p in batches)
    check()
    key = query_transaction_key(checkpoint, None)
    txns = sink_txns(client, key)
    committed = [m for m in txns if m.status.value == "COMMITTED"]
    assert len(committed) == len(batches)
    # Every progress event is joined to exactly its batch's committed transaction, with its latency.
    assert {b: bt.txn_id for (_, b), bt in listener.batches.items()} == {
        int(m.properties["pulsartx.streaming.batch"].rsplit(":", 1)[1]): str(m.txn_id) for m in committed}
    assert {(qid, b) for qid, b in listener.batches} == {(p["id"], p["batchId"]) for p in progress}
    assert all(bt.status == "COMMITTED" and bt.commit_latency_ms is not None and bt.commit_latency_ms >= 0
               for bt in listener.batches.values())
    assert sorted(f["batchId"] for f in forwarded) == sorted(b for _, b in listener.batches)
    assert all(f["pulsartx"]["txn_id"] == listener.batches[(f["id"], f["batchId"])].txn_id for f in forwarded)
    # Each batch's transaction carries the input acknowledgement (the subscription) with its outputs.
    assert all(any(s.subscription == "enrich" for s in m.subscriptions) for m in committed)
    assert client.admin.transactions.get_transaction_key(key, owner=OWNER)["transaction_key"] == key
    # Every micro-batch began on the one TC the driver leases (its Python workers share the lease),
    # while the key's epoch stays on the TC the key hashes to.
    from pulsartx.coordinator.registry import Coordinators

    (tc_id,) = {m.txn_id.most_bits for m in txns}
    tcs = Coordinators(client.root, recover_on_open=False)
    lease = tcs.tc(tc_id).txlog.lease()
    assert lease is not None and not lease.released and ":spark-driver-" in lease.owner
    assert lease.owner.split(":")[1] != str(os.getpid())  # the JVM's, not this test process's
    assert [row for tc in tcs.all() for row in tc.transactions() if row.txn_id.most_bits != tc_id] == []

    # A second pipeline (own subscription and checkpoint) reads the same input in the same batches:
    # each batch ends where one of the first pipeline's did, whose hand-off record for its last batch
    # is still there. Its own input acknowledgement must still commit with each batch, the last one
    # included (no later batch's source commit() would make up for it).
    client.admin.create_topic("audited", 1)
    _pipeline(spark, root, str(tmp_path / "audit-checkpoint"), subscription="audit", output="audited")
    assert cursor_positions(client, "orders", "audit") == last_offsets(committed_messages(root, "orders"))
    assert len(committed_messages(root, "audited")) == 240

    # The checkpoint is lost: a new query resumes from the subscription alone.
    shutil.rmtree(checkpoint)
    produce(90)
    q2 = _pipeline(spark, root, checkpoint)
    assert sum(p["numInputRows"] for p in q2.recentProgress) == 90
    assert q2.id != q.id
    out = check()
    assert len(out) == 330


def test_zombie_query_is_fenced_by_a_newer_one(spark: Any, client: Any, root: str, tmp_path: Path) -> None:
    """Two queries under one transactionKey: A's batch is stuck in a task when B starts; B's claim
    fences A's open transaction, so A's batch fails (TransactionFenced, a ProducerFenced, or
    NotAllowedError) when it goes on, and none of its output ever becomes visible, while B's output is
    complete."""
    from pyspark.sql import functions as F

    client.admin.create_topic("zin", 1)
    client.admin.create_topic("zout", 2)
    send(client, "zin", [f"m{i}" for i in range(40)], [f"k{i % 5}" for i in range(40)])
    gate, waiting = str(tmp_path / "gate"), str(tmp_path / "a-waiting")

    def hold(value: str) -> str:  # defined here so that pyspark pickles it by value
        if not os.path.exists(gate):
            open(waiting, "w").close()
            while not os.path.exists(gate):
                time.sleep(0.1)
        return value

    def query(tag: str, udf: bool) -> Callable[[int], Any]:
        def go(attempt: int) -> Any:
            src = stream(spark, root, topic="zin", startingOffsets="earliest")
            value = F.concat(F.lit(f"{tag}:"), F.col("value").cast("string"))
            if udf:
                value = F.udf(hold, "string")(value)
            return (src.select(value.alias("value"), "__key").writeStream.format("pulsartx")
                    .option("service.url", root).option("topic", "zout").option("transactionKey", "shared-key")
                    .option("checkpointLocation", str(tmp_path / f"ck-{tag}")).queryName(f"zombie-{tag}")
                    .trigger(processingTime="1 second").start())
        return go

    with started(query("A", True), ready=lambda q: os.path.exists(waiting)) as a:
        a_txns = [m for m in sink_txns(client, "shared-key") if m.status.value == "OPEN"]
        assert len(a_txns) == 1
        with started(query("B", False)) as b:
            wait_until(b, lambda: len(committed_messages(root, "zout")) >= 40, "B's output")
            open(gate, "w").close()  # A goes on with its fenced transaction
            deadline = time.monotonic() + WAIT_S
            while a.isActive:
                assert time.monotonic() < deadline, "the zombie query A was not stopped by the fencing"
                time.sleep(0.3)
            error = str(a.exception())
            send(client, "zin", ["late"], ["k0"])
            wait_until(b, lambda: len(committed_messages(root, "zout")) >= 41, "B's later batch")
            assert b.isActive and b.exception() is None
    assert "TransactionFenced" in error or "NotAllowedError" in error, error[-3000:]
    out = committed_messages(root, "zout")
    assert Counter(m[3] for m in out) == Counter([f"B:m{i}" for i in range(40)] + ["B:late"])
    assert all(client.admin.transactions.get_transaction_metadata(str(m.txn_id))["status"] == "ABORTED"
               for m in a_txns)


def test_a_batch_replayed_under_another_spelling_of_its_checkpoint_is_written_once(spark: Any, client: Any,
                                                                                  root: str, tmp_path: Path) -> None:
    """A query commits its batch, dies before Spark writes ``commits/N``, and is restarted through a
    symlink to the same checkpoint directory: Spark replays batch N, whose output must not appear
    twice. Fails before the fix: the transaction key was a hash of the checkpoint path as written,
    so the restart looked for the batch's commit under another key, found none, and committed the
    batch again."""
    client.admin.create_topic("sin", 1)
    client.admin.create_topic("sout", 1)
    send(client, "sin", [f"m{i}" for i in range(12)])
    real = tmp_path / "ck"
    real.mkdir()
    link = tmp_path / "ck-link"
    link.symlink_to(real, target_is_directory=True)

    def query(checkpoint: Path) -> Callable[[int], Any]:
        def go(attempt: int) -> Any:
            return (stream(spark, root, topic="sin", startingOffsets="earliest").select(as_string("value"))
                    .writeStream.format("pulsartx").option("service.url", root).option("topic", "sout")
                    .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        return go

    first = run_to_end(query(real))
    last = max(p["batchId"] for p in first.recentProgress if p["numInputRows"])
    assert len(committed_messages(root, "sout")) == 12
    for name in (str(last), f".{last}.crc"):  # as if the driver died right after the sink's commit
        (real / "commits" / name).unlink(missing_ok=True)
    second = run_to_end(query(link))
    assert second.id == first.id and any(p["batchId"] == last for p in second.recentProgress)
    assert Counter(m[3] for m in committed_messages(root, "sout")) == Counter(f"m{i}" for i in range(12))


def test_queries_under_one_transaction_key_with_the_sessions_checkpoint_each_keep_their_output(
        spark: Any, client: Any, root: str, tmp_path: Path) -> None:
    """Two queries share a ``transactionKey`` and take their checkpoints from the session's
    spark.sql.streaming.checkpointLocation, which pyspark does not pass to data sources: the sink
    learns each one's query id from its tasks (Spark's local property ``sql.streaming.queryId``).
    Fails before the fix: the second query's batch 0 was taken for a replay of the first's batch 0
    and its output discarded. A restart of the second query that replays its last batch (as if the
    driver died right after the sink's commit) still writes it once."""
    from pulsartx.commit_protocol.microbatch import BATCH_PROPERTY

    for topic in ("kin1", "kin2", "kout"):
        client.admin.create_topic(topic, 1)
    send(client, "kin1", [f"a{i}" for i in range(5)])
    send(client, "kin2", [f"b{i}" for i in range(5)])
    expected = Counter([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)])
    session_ck = tmp_path / "session-ck"
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(session_ck))

    def query(name: str, topic: str) -> Callable[[int], Any]:
        def go(attempt: int) -> Any:
            return (stream(spark, root, topic=topic, startingOffsets="earliest").select(as_string("value"))
                    .writeStream.format("pulsartx").option("service.url", root).option("topic", "kout")
                    .option("transactionKey", "shared").queryName(name).trigger(availableNow=True).start())
        return go

    try:
        first = run_to_end(query("key_a", "kin1"))
        second = run_to_end(query("key_b", "kin2"))
        assert first.id != second.id
        assert Counter(m[3] for m in committed_messages(root, "kout")) == expected
        last = max(p["batchId"] for p in second.recentProgress if p["numInputRows"])
        for name in (str(last), f".{last}.crc"):
            (session_ck / "key_b" / "commits" / name).unlink(missing_ok=True)
        again = run_to_end(query("key_b", "kin2"))
        assert again.id == second.id and any(p["batchId"] == last for p in again.recentProgress)
        assert Counter(m[3] for m in committed_messages(root, "kout")) == expected
        tokens = {m.properties.get(BATCH_PROPERTY) for m in sink_txns(client, "shared") if m.status.value == "COMMITTED"}
        assert {f"{first.id}:0", f"{second.id}:0"} <= tokens, tokens
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")


_OPEN_AND_WAIT = """
import sys, time
import pulsartx
c = pulsartx.Client(sys.argv[1])
p = c.create_producer("stall")
txn = c.new_transaction(timeout_ms=1500)
p.send(b"never-committed", txn=txn)
p.flush()
print("open", flush=True)
time.sleep(600)
"""


def test_a_stream_is_not_stalled_behind_an_expired_transaction(spark: Any, client: Any, root: str,
                                                               tmp_path: Path) -> None:
    """A producer SIGKILLed with an open transaction holds maxReadPosition until the transaction's
    timeout; then the stream resolves it (aborts it through its TC) and reads on, with no sweeper
    running anywhere, as the client reader does. Fails before the fix: the stream's read limit
    came from the transaction buffer alone and stayed at the dead transaction's first offset."""
    import signal
    import subprocess
    import sys

    client.admin.create_topic("stall", 1)
    send(client, "stall", ["before"])
    proc = subprocess.Popen([sys.executable, "-c", _OPEN_AND_WAIT, root], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    send(client, "stall", ["after-1", "after-2"])
    time.sleep(2.0)  # past the dead transaction's timeout

    def start(attempt: int) -> Any:
        return (stream(spark, root, topic="stall", startingOffsets="earliest").select(as_string("value"))
                .writeStream.format("memory").queryName(f"stall{attempt}")
                .option("checkpointLocation", str(tmp_path / f"ck-{attempt}")).trigger(availableNow=True).start())

    q = run_to_end(start)
    rows = [r.value for r in spark.table(q.name).collect()]
    assert rows == ["before", "after-1", "after-2"]


def test_a_stream_whose_source_topic_was_recreated_fails_clearly_or_starts_over(spark: Any, client: Any,
                                                                                 root: str, tmp_path: Path) -> None:
    """A checkpoint's offsets belong to the topic it read: after the topic is deleted and
    re-created they point past the new log's end. Fails before the fix: the query waited silently
    (no batch, no error) and would have skipped the new topic's first messages once it grew."""
    client.admin.create_topic("rec", 1)
    send(client, "rec", [f"old-{i}" for i in range(10)])

    def start(fail: str, ck: str) -> Callable[[int], Any]:
        return lambda attempt: (
            stream(spark, root, topic="rec", startingOffsets="earliest", failOnDataLoss=fail)
            .select(as_string("value")).writeStream.format("parquet").option("path", str(tmp_path / "out"))
            .option("checkpointLocation", ck).trigger(availableNow=True).start())

    for fail in ("true", "false"):
        shutil.rmtree(tmp_path / "ck", ignore_errors=True)
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
        client.admin.delete_topic("rec")
        client.admin.create_topic("rec", 1)
        send(client, "rec", [f"old-{i}" for i in range(10)])
        run_to_end(start(fail, str(tmp_path / "ck")))
        client.admin.delete_topic("rec")
        client.admin.create_topic("rec", 1)
        send(client, "rec", ["new-0", "new-1", "new-2"])
        if fail == "true":
            with pytest.raises(Exception, match="re-created.*failOnDataLoss=false"):
                run_to_end(start(fail, str(tmp_path / "ck")))
        else:
            run_to_end(start(fail, str(tmp_path / "ck")))
            values = sorted(r.value for r in spark.read.parquet(str(tmp_path / "out")).collect())
            assert values == ["new-0", "new-1", "new-2"] + [f"old-{i}" for i in range(10)]


def test_a_running_stream_fails_clearly_when_its_source_topic_is_recreated(spark: Any, client: Any, root: str,
                                                                            tmp_path: Path) -> None:
    """The topic is deleted and re-created while the query runs: the query stops with a clear
    error (the topic is gone; or, once it is back, its source notices the new table, a partition
    handle re-checking its identity, and names failOnDataLoss) instead of reading the new topic on
    from the old one's offsets."""
    client.admin.create_topic("live", 1)
    send(client, "live", [f"old-{i}" for i in range(10)])

    def start(attempt: int) -> Any:
        return (stream(spark, root, topic="live", startingOffsets="earliest").select(as_string("value"))
                .writeStream.format("memory").queryName(f"live{attempt}")
                .option("checkpointLocation", str(tmp_path / f"ck-{attempt}"))
                .trigger(processingTime="500 milliseconds").start())

    with started(start, ready=lambda q: len(memory_rows(spark, q.name)) >= 10) as q:
        client.admin.delete_topic("live")
        client.admin.create_topic("live", 1)
        send(client, "live", ["new-0"])
        deadline = time.monotonic() + WAIT_S
        while q.isActive:
            assert time.monotonic() < deadline, "the query went on reading the re-created topic"
            time.sleep(0.5)
        error = getattr(q.exception(), "_desc", None) or str(q.exception())
        # Which of the two it meets depends on when its next batch is planned: the topic gone, or
        # the new one past which its offsets lie.
        assert "does not exist" in error or "failOnDataLoss=false" in error, error[-2000:]
        assert sorted(r["value"] for r in memory_rows(spark, q.name)) == sorted(f"old-{i}" for i in range(10))
