"""``query.stop()`` in the middle of a micro-batch ends that batch's transaction at once (aborted),
so READ_COMMITTED readers are not held until its timeout, and the stop logs no error.

Stops at several moments of a batch: in this process's session, before any task wrote (the task
is held before its first row), then the query is run again, which must output every input row
exactly once; and as spark-submit jobs (tests/stream_jobs/stop_job.py) before any task wrote,
while a task writes (held after its first append) and during the sink's commit, whose whole driver
output must hold no ERROR line or stack trace."""
from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from stream_jobs.harness import committed_messages
from test_streaming import run_to_end, send, sink_txns, started, stream, wait_until

pytestmark = pytest.mark.spark


def _query(spark: Any, root: str, tmp_path: Path, gate: str, waiting: str, attempt: int) -> Any:
    from pyspark.sql import functions as F

    def hold(value: str) -> str:  # pickled by value: blocks every row until the gate opens
        if not os.path.exists(gate):
            open(waiting, "w").close()
            while not os.path.exists(gate):
                time.sleep(0.05)
        return value

    src = stream(spark, root, topic="sin", startingOffsets="earliest")
    value = F.udf(hold, "string")(F.col("value").cast("string"))
    return (src.select(value.alias("value"), "__key").writeStream.format("pulsartx")
            .option("service.url", root).option("topic", "sout")
            .option("checkpointLocation", str(tmp_path / "ck")).queryName(f"stop{attempt}")
            .trigger(processingTime="1 second").start())


def _reader_sees(root: str, value: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        if value in [m[3] for m in committed_messages(root, "sout")]:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_stop_mid_batch_aborts_its_transaction_at_once(spark: Any, client: Any, root: str, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    client.admin.create_topic("sin", 1)
    client.admin.create_topic("sout", 1)
    send(client, "sin", [f"m{i}" for i in range(10)], [f"k{i % 3}" for i in range(10)])
    gate, waiting = str(tmp_path / "gate"), str(tmp_path / "waiting")
    with started(lambda a: _query(spark, root, tmp_path, gate, waiting, a),
                 ready=lambda q: os.path.exists(waiting)) as q:
        key = _key(tmp_path)  # once Spark has written the checkpoint's metadata (the query id)
        open_txns = [m for m in sink_txns(client, key) if m.status.value == "OPEN"]
        assert len(open_txns) == 1
        t0 = time.monotonic()
        q.stop()
        stopped_s = time.monotonic() - t0
    statuses = [m.status.value for m in sink_txns(client, key)]
    assert "OPEN" not in statuses, (statuses, stopped_s)
    send(client, "sout", ["plain"])
    assert _reader_sees(root, "plain", 1.0)
    open(gate, "w").close()
    with started(lambda a: _query(spark, root, tmp_path, gate, waiting, 10 + a)) as q2:
        wait_until(q2, lambda: len(committed_messages(root, "sout")) >= 11, "the restarted query's output")
    out = Counter(m[3] for m in committed_messages(root, "sout"))
    assert out == Counter([f"m{i}" for i in range(10)] + ["plain"])


def _without_accumulator_eof(lines: list[str]) -> list[str]:
    """The output without pyspark's own accumulator-server traceback, which a stop landing during
    the sink's commit can make the driver print: ``stop()`` interrupts the query thread, which runs
    the commit through a Python runner and then merges the runner's accumulator updates over
    Spark's accumulator channel, a NIO channel that Java closes when its thread is interrupted; the
    driver's accumulator server (pyspark/accumulators.py) then reads EOF and socketserver prints the
    EOFError between two dashed lines. None of pulsartx's code runs in either place. Only that exact
    block is left out: any other line still counts."""
    out, i = [], 0
    while i < len(lines):
        if lines[i] == "-" * 40 and "Exception occurred during processing of request" in (lines[i + 1:i + 2] or [""])[0]:
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == "-" * 40), None)
            block = lines[i:end]
            if end is not None and block[-1] == "EOFError" and any("pyspark/accumulators.py" in x for x in block):
                i = end + 1
                continue
        out.append(lines[i])
        i += 1
    return out


def _without_broadcast_unlock_race(lines: list[str]) -> list[str]:
    """The output without Spark's own broadcast-lock race on a killed task: the stop kills the held
    task, and when the task's completion listeners finally run, TorrentBroadcast's listener unlocks
    a broadcast block that the block manager has already dropped, so TaskContextImpl logs
    ``Error in TaskCompletionListener`` with ``[INTERNAL_ERROR_STORAGE] Block broadcast_N does not
    exist``. No pulsartx code is on that stack. Only that exact block is left out, and only when
    every frame under it is Spark's, Scala's or Java's: any other line still counts."""
    out, i = [], 0
    while i < len(lines):
        head = lines[i:i + 2]
        if (len(head) == 2 and head[0].endswith("ERROR TaskContextImpl: Error in TaskCompletionListener")
                and "[INTERNAL_ERROR_STORAGE] Block broadcast_" in head[1] and "does not exist" in head[1]):
            end = i + 2
            while end < len(lines) and lines[end].startswith("\tat "):
                end += 1
            frames = lines[i + 2:end]
            if frames and all(f.startswith(("\tat org.apache.spark.", "\tat java.base/", "\tat scala."))
                              for f in frames):
                i = end
                continue
        out.append(lines[i])
        i += 1
    return out


def _key(tmp_path: Path) -> str:
    from pulsartx.commit_protocol.microbatch import query_transaction_key

    return query_transaction_key(str(tmp_path / "ck"), None)


# ---- a spark-submit'ed query that stops itself: the driver's whole output is inspected -------------
MOMENTS = ["before_write", "mid_write", "in_commit"]
NOISE = ("ERROR", "Exception", "at org.apache", "Traceback")


@pytest.mark.slow
@pytest.mark.parametrize("moment", MOMENTS)
def test_a_stop_at_any_moment_of_a_batch_is_quiet_and_loses_nothing(spark: Any, client: Any, root: str,
                                                                    tmp_path: Path, moment: str) -> None:
    """tests/stream_jobs/stop_job.py stops its query while the first batch is held at ``moment``.
    Then: no ERROR line, exception or stack trace in the driver's output (stdout and stderr); no
    transaction of the query is left OPEN; a plain message sent after the stop reaches a
    READ_COMMITTED reader within a second; and the query run again from the checkpoint outputs
    every input exactly once (a batch that committed during the stop is not written twice)."""
    from stream_jobs.harness import StreamJob

    client.admin.create_topic("sin", 1)
    client.admin.create_topic("sout", 1)
    inputs = [f"m{i}" for i in range(10)]
    send(client, "sin", inputs)
    checkpoint = tmp_path / "ck"
    job = StreamJob("stop_job.py", dict(root=root, input="sin", output="sout", checkpoint=str(checkpoint),
                                        moment=moment, run=moment), tmp_path)
    try:
        done = job.wait_end(timeout=900)
    finally:
        job.kill()
    assert done["event"] == "done", job.output()
    assert [e["event"] for e in job.events() if e["event"] != "holding"] == ["session", "started", "stopped", "done"]
    assert job.events("holding")[0]["where"] == moment
    lines = _without_broadcast_unlock_race(_without_accumulator_eof(job.log_path.read_text().splitlines()))
    noisy = [line for line in lines
             if any(n in line for n in NOISE)]
    assert noisy == [], job.output()

    statuses = {m.status.value for m in sink_txns(client, _key(tmp_path))}
    assert "OPEN" not in statuses and statuses, statuses
    t0 = time.monotonic()
    send(client, "sout", ["plain"])
    assert _reader_sees(root, "plain", 1.0), f"plain message not visible {time.monotonic() - t0:.1f}s after the stop"

    from pyspark.sql import functions as F

    def rerun(attempt: int) -> Any:
        src = stream(spark, root, topic="sin", startingOffsets="earliest")
        return (src.select(F.col("value").cast("string").alias("value")).writeStream.format("pulsartx")
                .option("service.url", root).option("topic", "sout").option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True).start())

    run_to_end(rerun)
    out = Counter(m[3] for m in committed_messages(root, "sout"))
    assert out == Counter([*inputs, "plain"])


RACE = ["18:02:55 ERROR TaskContextImpl: Error in TaskCompletionListener",
        "org.apache.spark.SparkException: [INTERNAL_ERROR_STORAGE] Block broadcast_0 does not exist. SQLSTATE: XX000",
        "\tat org.apache.spark.storage.BlockInfoManager.unlock(BlockInfoManager.scala:448)",
        "\tat org.apache.spark.scheduler.Task.run(Task.scala:147)",
        "\tat java.base/java.lang.Thread.run(Thread.java:840)"]


def test_only_sparks_own_broadcast_unlock_block_is_left_out() -> None:
    assert _without_broadcast_unlock_race(["a", *RACE, "b"]) == ["a", "b"]
    ours = [*RACE[:3], "\tat pulsartx.something(x.py:1)", *RACE[3:]]
    assert _without_broadcast_unlock_race(ours) == ours
    other = [RACE[0], "org.apache.spark.SparkException: something else", *RACE[2:]]
    assert _without_broadcast_unlock_race(other) == other
