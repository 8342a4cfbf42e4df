"""A ``df.write.format("pulsartx")`` job for ``spark-submit``, with optional fault injection.

    spark-submit tests/spark_jobs/write_job.py '<json config>'

The tests run it as a subprocess (its own SparkSession, so its own master such as ``local[2,2]``,
which allows one retry per task) and then SIGKILL it or let it finish. Production code is not
patched on disk: the job registers a subclass of the real source under the same name
``pulsartx``, whose writer only delegates to the real ``PulsarTxBatchWriter`` after installing,
*inside the pyspark worker that runs it*, the hook of its scenario:

``ok``
    a plain write.
``fail_first_attempt``
    task ``fail_task``'s first attempt appends (``flush_rows`` makes the task flush early), waits
    until its append is durable, then raises from a Python UDF feeding the writer; Spark
    retries the task (attempt 1) and the job succeeds.
``hang_mid_write``
    task ``fail_task`` appends once and then hangs: the job is stuck mid-write (OPEN txn).
``hang_after_committing``
    the job commit logs COMMITTING and hangs before any marker (the TC's participant step).
``hang_mid_markers``
    the job commit writes markers on the first ``markers_first`` partitions (sorted) and hangs.

Progress goes to stdout (``@@EVENT name {json}``) and, because pyspark workers' stdout is not the
driver's, as JSON lines appended to the ``events`` file, which the parent polls. Every hook that
hangs sleeps until the parent kills the whole process tree.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

CFG: dict[str, Any] = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}


def event(name: str, **payload: Any) -> None:
    """Record that the job reached a step (works from the driver script and from any worker)."""
    line = json.dumps({"event": name, "pid": os.getpid(), "t": time.time(), **payload})
    with open(CFG["events"], "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    print(f"@@EVENT {name} {line}", flush=True)


def hang() -> None:
    time.sleep(600)  # the parent SIGKILLs the process tree long before
    os._exit(3)


def events_seen(name: str) -> list[dict[str, Any]]:
    try:
        with open(CFG["events"]) as f:
            # A line without its newline is one another process is still writing.
            return [e for e in (json.loads(x) for x in f if x.endswith("\n")) if e["event"] == name]
    except FileNotFoundError:
        return []


def install_task_hooks(task_id: int, attempt: int) -> None:
    """Executor side: flush small batches, and report (or hang after) the task's appends."""
    import pulsartx.commit_protocol.task as task_mod

    task_mod.FLUSH_ROWS = int(CFG.get("flush_rows", task_mod.FLUSH_ROWS))
    orig = task_mod.TaskAppender._flush
    if getattr(orig, "_hooked", False):  # a reused worker already has the hook
        return

    def flush(self: Any, partition: str, buf: Any) -> None:
        rows = buf.rows
        orig(self, partition, buf)
        if rows:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            t, a = (ctx.partitionId(), ctx.attemptNumber()) if ctx else (-1, -1)
            event("appended", task=t, attempt=a, partition=partition, rows=rows, producer=self.producer)
            if CFG["scenario"] == "hang_mid_write" and t == CFG.get("fail_task", 0):
                event("hanging_mid_write", task=t, txn=str(self.job.txn_id))
                hang()

    flush._hooked = True  # type: ignore[attr-defined]
    task_mod.TaskAppender._flush = flush


def install_commit_hooks() -> None:
    """Commit-worker side: stop the TC right after COMMITTING, or after some markers."""
    scenario = CFG["scenario"]
    if scenario == "hang_after_committing":
        from pulsartx.coordinator import coordinator as coordinator_mod

        def stop(root: Any, meta: Any, action: Any) -> Any:
            event("committing", txn=str(meta.txn_id), status=meta.status.value,
                  partitions=sorted(meta.partitions), entries=len(meta.commit_entries or ()))
            hang()

        coordinator_mod.end_on_participants = stop
    elif scenario == "hang_mid_markers":
        import threading

        from pulsartx.coordinator import participants

        orig = participants.end_on_partition
        lock = threading.Lock()
        done: list[str] = []

        def slow(root: Any, meta: Any, partition: str, action: Any) -> None:
            first = set(sorted(meta.partitions)[:int(CFG["markers_first"])])
            if partition in first:
                orig(root, meta, partition, action)
                with lock:
                    done.append(partition)
                    if len(done) == len(first):
                        event("mid_markers", txn=str(meta.txn_id), written=sorted(done),
                              partitions=sorted(meta.partitions))
            hang()

        participants.end_on_partition = slow


def main() -> None:
    event("script_started")
    from pulsartx.datasource.source import PulsarTxDataSource
    from pulsartx.datasource.writer import PulsarTxBatchWriter
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    class HookedWriter(PulsarTxBatchWriter):
        def write(self, iterator):  # type: ignore[override]
            ctx = TaskContext.get()
            event("task_started", task=ctx.partitionId(), attempt=ctx.attemptNumber())
            install_task_hooks(ctx.partitionId(), ctx.attemptNumber())
            return super().write(iterator)

        def commit(self, messages):  # type: ignore[override]
            event("commit_called", reports=sum(1 for m in messages if m is not None))
            install_commit_hooks()
            return super().commit(messages)

    class HookedSource(PulsarTxDataSource):
        def writer(self, schema, overwrite):  # type: ignore[override]
            event("writer_called")
            w = super().writer(schema, overwrite)
            event("txn_begun", txn=str(w.job.txn_id))
            w.__class__ = HookedWriter  # the real writer's state, with the hooks above
            return w

    spark = (SparkSession.builder.master(CFG.get("master", "local[2]")).appName("pulsartx-write-job")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(CFG.get("arrow_batch", 1000)))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(HookedSource)
    event("session")

    rows, slices, job = int(CFG["rows"]), int(CFG.get("slices", 8)), CFG["job"]
    topics = CFG["topics"]
    topic_expr = F.element_at(F.array(*[F.lit(t) for t in topics]), (F.col("id") % len(topics) + 1).cast("int"))
    df = spark.range(rows, numPartitions=slices).select(
        # job id, then the row id zero-padded to 64 bytes: parseable, and big enough that a
        # Python UDF's output buffer fills (and flushes to the writer) within a few thousand rows
        F.concat(F.lit(f"{job}-"), F.lpad(F.col("id").cast("string"), 64, "0")).alias("value"),
        F.concat(F.lit("k"), (F.col("id") % 50).cast("string")).alias("__key"),
        topic_expr.alias("__topic"))

    if CFG["scenario"] == "fail_first_attempt":
        fail_task, fail_at = int(CFG["fail_task"]), int(CFG.get("fail_at_row", 3000))
        seen: dict[tuple[int, int], int] = {}

        def fail_once(value):  # no type hints: pyspark would try to infer an Arrow UDF from them
            # A plain Python UDF (mapInArrow needs pandas, which is not installed). Rows before
            # fail_at flow on to the writer, which flushes them (flush_rows); only once that
            # append is durable does the first attempt fail, so it leaves appended entries that
            # no commit may ever list.
            ctx = TaskContext.get()
            key = (ctx.partitionId(), ctx.attemptNumber())
            seen[key] = seen.get(key, 0) + 1
            if key == (fail_task, 0) and seen[key] == fail_at:
                deadline = time.monotonic() + 60
                while not [e for e in events_seen("appended") if e["task"] == fail_task and e["attempt"] == 0]:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                event("failing_attempt", task=fail_task, rows_before=fail_at - 1)
                raise RuntimeError(f"injected failure of task {fail_task} attempt 0")
            return value

        df = df.withColumn("value", F.udf(fail_once, "string", useArrow=False)("value"))

    writer = df.write.format("pulsartx").mode("append").option("service.url", CFG["root"])
    for k, v in CFG.get("options", {}).items():
        writer = writer.option(k, v)
    event("write_started")
    t0 = time.monotonic()
    writer.save()
    event("done", seconds=round(time.monotonic() - t0, 2))
    sys.stdout.flush()
    os._exit(0)  # deltalake may abort at interpreter exit; the parent judges by the events


if __name__ == "__main__":
    main()
