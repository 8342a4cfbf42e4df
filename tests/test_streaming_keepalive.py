"""Micro-batch and write-job transactions live on a short timeout that the driver keeps extending
(commit_protocol/keepalive.py), with real Spark and real processes:

* a batch (and a write job) that runs longer than its timeout still commits: the timeout is 2 s
  and a UDF sleeps 6 s;
* with ``transactionKeepAlive=false`` the same job's transaction times out, as before;
* a driver SIGKILLed mid-batch (and mid-job): its transaction stays OPEN while the driver lives,
  well past its timeout; once the driver JVM is killed (nothing else: the keeper has to notice by
  itself) READ_COMMITTED readers are unblocked within the timeout, the keeper process exits, and a
  restarted query produces every input exactly once.

Stops requested with ``query.stop()`` are in test_streaming_stop.py.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from spark_jobs.harness import SparkJob, alive, descendants
from stream_jobs.harness import committed_messages
from test_streaming import run_to_end, send, sink_txns, stream
from test_streaming_crash import IN, OUT, Pipeline, txn_status

pytestmark = pytest.mark.spark

SHORT_MS = 2_000  # the slow batches' timeout
KILL_MS = 5_000  # the killed drivers' timeout
SLACK_S = 4.0  # a reader's polling, the abort, and a loaded machine, on top of the timeout


def _slow(marker: str, seconds: float):
    """A UDF that sleeps ``seconds`` once (the first row to reach it), pickled by value."""
    def slow(value):  # no type hints: pyspark would try to infer an Arrow UDF from them
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return value
        os.close(fd)
        time.sleep(seconds)
        return value
    return slow


def test_a_micro_batch_longer_than_its_timeout_commits(spark: Any, client: Any, root: str, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    client.admin.create_topic("kin", 1)
    client.admin.create_topic("kout", 1)
    send(client, "kin", [f"m{i}" for i in range(5)])
    slow = F.udf(_slow(str(tmp_path / "slept"), 6.0), "string", useArrow=False)

    def start(attempt: int) -> Any:
        src = stream(spark, root, topic="kin", startingOffsets="earliest")
        return (src.select(slow(F.col("value").cast("string")).alias("value")).writeStream.format("pulsartx")
                .option("service.url", root).option("topic", "kout").option("transactionTimeoutMs", str(SHORT_MS))
                .option("checkpointLocation", str(tmp_path / f"ck{attempt}")).trigger(availableNow=True).start())

    t0 = time.monotonic()
    run_to_end(start)
    took = time.monotonic() - t0
    assert os.path.exists(tmp_path / "slept")
    assert sorted(m[3] for m in committed_messages(root, "kout")) == [f"m{i}" for i in range(5)]
    key = _key(tmp_path / "ck0")
    (data,) = [m for m in sink_txns(client, key) if m.commit_entries]
    assert data.status.value == "COMMITTED", (data, took)
    # Begun before the 6 s sleep with a 2 s timeout: only extensions kept it alive that long.
    assert data.timeout_ms > 6_000 and data.properties["pulsartx.keepAlive.timeoutMs"] == str(SHORT_MS)


def _slow_job(spark: Any, root: str, marker: str, **options: str) -> None:
    from pyspark.sql import functions as F

    slow = F.udf(_slow(marker, 6.0), "string", useArrow=False)
    df = spark.range(6, numPartitions=2).select(slow(F.col("id").cast("string")).alias("value"))
    df.write.format("pulsartx").mode("append").option("service.url", root).option("topic", "jobout") \
        .option("transactionTimeoutMs", str(SHORT_MS)).options(**options).save()


def _job_txns(client: Any) -> list[Any]:
    from pulsartx.coordinator.registry import Coordinators

    return [m for tc in Coordinators(client.root, recover_on_open=False).all() for m in tc.transactions()]


def test_a_write_job_longer_than_its_timeout_commits(spark: Any, client: Any, root: str, tmp_path: Path) -> None:
    client.admin.create_topic("jobout", 2)
    _slow_job(spark, root, str(tmp_path / "slept"))
    assert sorted(m[3] for m in committed_messages(root, "jobout")) == [str(i) for i in range(6)]
    (meta,) = _job_txns(client)
    assert meta.status.value == "COMMITTED" and meta.timeout_ms > 6_000


def test_without_keep_alive_the_timeout_is_the_whole_budget(spark: Any, client: Any, root: str,
                                                            tmp_path: Path) -> None:
    client.admin.create_topic("jobout", 2)
    with pytest.raises(Exception, match="is expired: it passed its timeout"):
        _slow_job(spark, root, str(tmp_path / "slept"), transactionKeepAlive="false")
    (meta,) = _job_txns(client)
    assert meta.status.value == "ABORTED" and meta.timeout_ms == SHORT_MS
    assert committed_messages(root, "jobout") == []


# ---- a SIGKILLed driver ---------------------------------------------------------------------------
def _keepers(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"pulsartx.commit_protocol.keepalive" in f.read():
                    out.append(pid)
        except OSError:
            continue
    return out


def _kill_driver_only(proc: Any) -> tuple[list[int], list[int], float]:
    """SIGKILL the driver JVM alone (spark-submit execs it): its workers and keeper are left to
    notice. Returns the processes that were below it, the keepers among them, and the monotonic
    time of the kill."""
    with open(f"/proc/{proc.pid}/comm") as f:
        assert f.read().strip() == "java"
    tree = descendants(proc.pid)
    keepers = _keepers(tree)
    assert len(keepers) == 1, f"{len(keepers)} keep-alive processes for one driver and root"
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    proc.wait(60)
    return tree, keepers, killed


def _unblocked_after(root: str, topic: str, client: Any, killed: float) -> float:
    """Send a plain message and return the seconds from the kill until a READ_COMMITTED reader
    sees it (at most the timeout plus the slack)."""
    send(client, topic, ["plain"])
    while "plain" not in [m[3] for m in committed_messages(root, topic)]:
        assert time.monotonic() - killed < KILL_MS / 1000 + SLACK_S, "readers still blocked by the dead driver"
        time.sleep(0.1)
    return time.monotonic() - killed


def _reap(tree: list[int], keepers: list[int]) -> None:
    """The keeper exits by itself once its driver is gone; everything else left is killed."""
    deadline = time.monotonic() + KILL_MS / 1000 + SLACK_S
    while any(alive(p) for p in keepers):
        assert time.monotonic() < deadline, f"keeper(s) {keepers} outlived their driver"
        time.sleep(0.1)
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_a_driver_killed_mid_batch_holds_readers_only_for_the_short_timeout(client: Any, root: str,
                                                                            tmp_path: Path) -> None:
    pipe = Pipeline(root, client, tmp_path)
    pipe.produce(60)
    job, ev = pipe.start("mid_write", "hanging_mid_write", scenario="mid_write", hang_after_appends=1,
                         trigger="processing_time", sink_options={"transactionTimeoutMs": str(KILL_MS)})
    try:
        # Alive: held OPEN well past its timeout.
        time.sleep(2 * KILL_MS / 1000)
        assert txn_status(root, ev["txn"]) == "OPEN"
        tree, keepers, killed = _kill_driver_only(job.proc)
        took = _unblocked_after(root, OUT, client, killed)
        assert txn_status(root, ev["txn"]) == "ABORTED", took
        _reap(tree, keepers)
    finally:
        job.kill()
    pipe.produce(20)
    pipe.start("restart", "end")
    # Everything once, with the plain message beside the pipeline's output.
    out = committed_messages(root, OUT)
    assert [m[3] for m in out].count("plain") == 1
    plain = [m for m in out if m[3] == "plain"]
    pipe_out = [m for m in out if m[3] != "plain"]
    assert len(plain) == 1 and len(pipe_out) == sum(pipe.produced.values())
    sources = sorted(m[3].split("@")[1] for m in pipe_out)
    assert sources == sorted(f"{p}:{o}" for p, o, _, _ in committed_messages(root, IN))


@pytest.mark.slow
def test_a_driver_killed_mid_job_holds_readers_only_for_the_short_timeout(client: Any, root: str,
                                                                          tmp_path: Path) -> None:
    client.admin.create_topic("x", 4)
    client.admin.create_topic("y", 4)
    config = dict(root=root, job="kmid", scenario="hang_mid_write", rows=4000, slices=4, topics=["x", "y"],
                  fail_task=1, flush_rows=50, options={"transactionTimeoutMs": str(KILL_MS)})
    job = SparkJob("write_job.py", config, tmp_path)
    try:
        ev = job.wait_event("hanging_mid_write", timeout=600)
        time.sleep(2 * KILL_MS / 1000)
        assert txn_status(root, ev["txn"]) == "OPEN"
        tree, keepers, killed = _kill_driver_only(job.proc)
        _unblocked_after(root, "x", client, killed)
        assert txn_status(root, ev["txn"]) == "ABORTED"
        _reap(tree, keepers)
    finally:
        job.kill()
    assert [m[3] for m in committed_messages(root, "x")] == ["plain"]
    assert committed_messages(root, "y") == []


def _key(checkpoint: Path) -> str:
    from pulsartx.commit_protocol.microbatch import query_transaction_key

    return query_transaction_key(str(checkpoint), None)
