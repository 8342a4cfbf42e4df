"""``query.stop()`` in the middle of a micro-batch ends that batch's transaction at once (aborted),
so READ_COMMITTED readers are not held until its timeout, and the stop logs no error.

Stops at several moments of a batch: before any task wrote (the task is held before its first
row), while tasks write (a task held after the first rows of its partition reached the log), and
then the query is run again, which must output every input row exactly once."""
from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from stream_jobs.harness import committed_messages
from test_streaming import send, sink_txns, started, stream, wait_until

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
    key = _key(tmp_path)
    with started(lambda a: _query(spark, root, tmp_path, gate, waiting, a),
                 ready=lambda q: os.path.exists(waiting)) as q:
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


def _key(tmp_path: Path) -> str:
    from pulsartx.commit_protocol.microbatch import query_transaction_key

    return query_transaction_key(str(tmp_path / "ck"), None)
