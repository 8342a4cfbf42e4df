"""The exactly-once consume-transform-produce pipeline (pulsartx -> transform -> pulsartx through a
durable subscription) as a ``spark-submit`` job, with optional hooks that pause it at an exact step
so the parent can SIGKILL it there:

    spark-submit tests/stream_jobs/pipeline.py '<json config>'

Production code is not patched on disk: the job registers a subclass of the real source under the
same name ``pulsartx``, whose stream reader/writer delegate to the real ones after installing the
scenario's hook *inside the pyspark worker that runs them* (pyspark pickles these classes by value,
so the hooks reach the source runner, the sink runner and the executors; monkeypatching in this
driver script alone would not). Scenarios (``scenario``; ``hang_at`` = how many batches of this run
commit normally first):

``none``              run to the end (``trigger`` available_now) or until killed (processing_time).
``mid_write``         a task hangs right after an append of the batch's open transaction
                      (``hang_after_appends`` appends into the run).
``after_committing``  the sink's commit logs COMMITTING (with the input ack pending in the
                      transaction) and hangs before any marker or cursor update.
``after_txn_commit``  the batch's transaction is COMMITTED (markers, acks) and the sink hangs before
                      returning, i.e. before Spark writes ``commits/N``.
``in_latest_offset``  the source hangs in ``latestOffset``: the next batch's offsets are not logged.
``after_offset_log``  the source hangs in ``commit(previous end)``, which Spark calls right after it
                      wrote ``offsets/N`` and before batch N runs.

Input values are ``<key>:<seq>``; outputs are ``T:<key>:<seq>@<input partition>:<input offset>`` with
the input's key, so the output is partitioned by key. Events go to the ``events`` JSON-lines file
(from the driver and from every worker); the job leaves with ``os._exit``.
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


def events_seen(name: str) -> list[dict[str, Any]]:
    try:
        with open(CFG["events"]) as f:
            return [e for e in map(json.loads, f) if e["event"] == name]
    except FileNotFoundError:
        return []


def hang(name: str, **payload: Any) -> None:
    event(name, **payload)
    time.sleep(900)  # the parent SIGKILLs the whole process tree long before
    os._exit(3)


def armed() -> bool:
    """This run has committed ``hang_at`` batches: the scenario's hook fires now."""
    return len(events_seen("batch_committed")) >= int(CFG.get("hang_at", 1))


def install_task_hook() -> None:
    """Executor side (mid_write): hang right after an append of the batch's open transaction."""
    import pulsartx.commit_protocol.task as task_mod

    orig = task_mod.TaskAppender._flush
    if getattr(orig, "_hooked", False):  # a reused worker already has it
        return

    def flush(self: Any, partition: str, buf: Any) -> None:
        rows = buf.rows
        orig(self, partition, buf)
        if rows:
            event("appended", partition=partition, rows=rows, txn=str(self.job.txn_id))
            if len(events_seen("appended")) >= int(CFG.get("hang_after_appends", 1)):
                hang("hanging_mid_write", txn=str(self.job.txn_id), partition=partition)

    flush._hooked = True  # type: ignore[attr-defined]
    task_mod.TaskAppender._flush = flush


def install_committing_hook(batch_id: int) -> None:
    """Sink-runner side (after_committing): stop the TC right after it logged COMMITTING. The batch
    id is kept on the patched module: every batch unpickles fresh copies of this script's functions
    and globals, but the module (and the hook installed by an earlier batch) persists in the worker."""
    from pulsartx.coordinator import coordinator as coordinator_mod
    from pulsartx.coordinator.state import TxnAction

    coordinator_mod._test_batch_id = batch_id  # type: ignore[attr-defined]
    orig = coordinator_mod.end_on_participants
    if getattr(orig, "_hooked", False):
        return

    def stop(root: Any, meta: Any, action: Any) -> Any:
        if action is TxnAction.COMMIT and armed():
            hang("hanging_after_committing", batch=coordinator_mod._test_batch_id, txn=str(meta.txn_id),
                 status=meta.status.value,
                 subscriptions=len(meta.subscriptions or ()), partitions=sorted(meta.partitions))
        return orig(root, meta, action)

    stop._hooked = True  # type: ignore[attr-defined]
    coordinator_mod.end_on_participants = stop


def txn_status(root: Any, txn: Any) -> str:
    from pulsartx.coordinator.registry import Coordinators

    return Coordinators(root, recover_on_open=False).for_txn(txn).get(txn, refresh=True).status.value


def main() -> None:
    from pulsartx.commit_protocol.job import JobTransaction
    from pulsartx.datasource.source import PulsarTxDataSource
    from pulsartx.datasource.stream_reader import PulsarTxStreamReader
    from pulsartx.datasource.stream_writer import PulsarTxStreamWriter
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    scenario = CFG.get("scenario", "none")

    class HookedWriter(PulsarTxStreamWriter):
        def write(self, iterator):  # type: ignore[override]
            if scenario == "mid_write":
                install_task_hook()
            return super().write(iterator)

        def commit(self, messages, batchId):  # type: ignore[override]  # noqa: N803
            if scenario == "after_committing":
                install_committing_hook(batchId)
            super().commit(messages, batchId)
            txn = JobTransaction.txn_of(messages)
            status = txn_status(self.root, txn) if txn is not None else None
            rows = sum(getattr(m, "rows", 0) for m in messages if m is not None)
            if scenario == "after_txn_commit" and armed():
                hang("hanging_after_txn_commit", batch=batchId, txn=str(txn), status=status)
            event("batch_committed", batch=batchId, txn=None if txn is None else str(txn), status=status, rows=rows)

        def abort(self, messages, batchId):  # type: ignore[override]  # noqa: N803
            event("batch_aborted", batch=batchId)
            super().abort(messages, batchId)

    class HookedReader(PulsarTxStreamReader):
        def latestOffset(self, start, limit):  # type: ignore[override]  # noqa: N802
            if scenario == "in_latest_offset" and armed():
                hang("hanging_in_latest_offset", start=start)
            return super().latestOffset(start, limit)

        def commit(self, end):  # type: ignore[override]
            if scenario == "after_offset_log" and armed():
                hang("hanging_after_offset_log", end=end)
            super().commit(end)

    class HookedSource(PulsarTxDataSource):
        def streamReader(self, schema):  # type: ignore[override]  # noqa: N802
            r = super().streamReader(schema)
            r.__class__ = HookedReader
            return r

        def streamWriter(self, schema, overwrite):  # type: ignore[override]  # noqa: N802
            w = super().streamWriter(schema, overwrite)
            w.__class__ = HookedWriter
            return w

    spark = (SparkSession.builder.master(CFG.get("master", "local[2]")).appName("pulsartx-stream-pipeline")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(HookedSource)
    event("session")

    reader = (spark.readStream.format("pulsartx").option("service.url", CFG["root"]).option("topic", CFG["input"])
              .option("subscription", CFG["subscription"]).option("startingOffsets", "earliest")
              .option("maxEntriesPerTrigger", str(CFG.get("max_entries", 50))))
    src = reader.load()
    out = src.select(
        F.concat(F.lit("T:"), F.col("value").cast("string"), F.lit("@"), F.col("__partition").cast("string"),
                 F.lit(":"), F.col("__offset").cast("string")).alias("value"),
        F.col("__key"))
    writer = (out.writeStream.format("pulsartx").option("service.url", CFG["root"]).option("topic", CFG["output"])
              .option("checkpointLocation", CFG["checkpoint"]))
    for k, v in CFG.get("sink_options", {}).items():
        writer = writer.option(k, v)
    if CFG.get("trigger", "available_now") == "available_now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=CFG.get("interval", "1 second"))
    t0 = time.monotonic()
    query = writer.start()
    event("started", query_id=str(query.id), run_id=str(query.runId))
    try:
        query.awaitTermination()
    except Exception as e:  # the parent reads the reason from the events
        event("failed", error=str(e)[-6000:])
        sys.stdout.flush()
        os._exit(1)
    progress = [{"batch": p["batchId"], "rows": p["numInputRows"], "end": p["sources"][0]["endOffset"]}
                for p in query.recentProgress]
    event("done", seconds=round(time.monotonic() - t0, 2), progress=progress)
    sys.stdout.flush()
    os._exit(0)  # deltalake may abort at interpreter exit; the parent judges by the events


if __name__ == "__main__":
    main()
