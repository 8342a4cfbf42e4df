"""A streaming query that ``stop()``s itself in the middle of a micro-batch, as a ``spark-submit`` job
whose whole output (driver stderr included) the parent inspects:

    spark-submit tests/stream_jobs/stop_job.py '<json config>'

Config: ``root``, ``input``/``output`` topics, ``checkpoint``, ``events``, and ``moment``: where the
batch is when ``stop()`` is called: ``before_write`` (a UDF holds every row, so no task appended),
``mid_write`` (a task appended a first block and is held), ``in_commit`` (the sink's commit takes
3 s more before it commits: Spark cannot interrupt a commit, so stop() waits for it). Events: ``session``, ``started``, ``holding``, ``stopped``, ``done``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

CFG: dict[str, Any] = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}


def event(name: str, **payload: Any) -> None:
    line = json.dumps({"event": name, "pid": os.getpid(), "t": time.time(), **payload})
    with open(CFG["events"], "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def held() -> bool:
    try:
        with open(CFG["events"]) as f:
            return any(json.loads(line)["event"] == "holding" for line in f if line.strip())
    except FileNotFoundError:
        return False


def hold(where: str, seconds: float = 60) -> None:
    """Announce, then wait until the process is killed by the stop (Spark interrupts the task or
    kills the worker) or ``seconds`` have passed."""
    event("holding", where=where)
    time.sleep(seconds)


def main() -> None:
    from pulsartx.datasource.source import PulsarTxDataSource
    from pulsartx.datasource.stream_writer import PulsarTxStreamWriter
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    moment = CFG["moment"]

    class HeldWriter(PulsarTxStreamWriter):
        def write(self, iterator):  # type: ignore[override]
            if moment == "mid_write":
                import pulsartx.commit_protocol.task as task_mod

                orig = task_mod.TaskAppender._flush
                if not getattr(orig, "_hooked", False):
                    def flush(self: Any, partition: str, buf: Any) -> None:
                        orig(self, partition, buf)
                        hold("mid_write")

                    flush._hooked = True  # type: ignore[attr-defined]
                    task_mod.TaskAppender._flush = flush
            return super().write(iterator)

        def commit(self, messages, batchId):  # type: ignore[override]  # noqa: N803
            if moment == "in_commit":
                hold("in_commit", 3)  # a slow commit: Spark cannot interrupt it, stop() waits for it
            super().commit(messages, batchId)

    class HeldSource(PulsarTxDataSource):
        def streamWriter(self, schema, overwrite):  # type: ignore[override]  # noqa: N802
            w = super().streamWriter(schema, overwrite)
            w.__class__ = HeldWriter
            return w

    spark = (SparkSession.builder.master("local[2]").appName("pulsartx-stop-job")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.dataSource.register(HeldSource)
    event("session")

    def gate(value):  # no type hints: pyspark would try to infer an Arrow UDF from them
        if moment == "before_write":
            hold("before_write")
        return value

    src = (spark.readStream.format("pulsartx").option("service.url", CFG["root"]).option("topic", CFG["input"])
           .option("startingOffsets", "earliest").load())
    out = src.select(F.udf(gate, "string", useArrow=False)(F.col("value").cast("string")).alias("value"))
    query = (out.writeStream.format("pulsartx").option("service.url", CFG["root"]).option("topic", CFG["output"])
             .option("checkpointLocation", CFG["checkpoint"]).trigger(processingTime="1 second").start())
    event("started")
    deadline = time.monotonic() + 600
    while not held() and time.monotonic() < deadline:
        time.sleep(0.1)
    t0 = time.monotonic()
    query.stop()
    event("stopped", seconds=round(time.monotonic() - t0, 2), active=query.isActive)
    # No spark.stop(): pyspark's SparkContext.stop() closes the JVM before its accumulator server,
    # whose handler may then print an EOFError traceback, a shutdown race of pyspark's own that
    # has nothing to do with the query's stop under test.
    event("done")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # deltalake may abort at interpreter exit; the parent judges by the events


if __name__ == "__main__":
    main()
