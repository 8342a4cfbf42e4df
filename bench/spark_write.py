"""Spark batch write throughput: ``df.write.format("pulsartx")`` (one transaction per job) against the
same write without a transaction, a minimal Python Arrow data source writing parquet, and Spark's
own parquet writer.

    .venv/bin/python bench/spark_write.py [--rows 2000000] [--value-size 100] [--rounds 5] [--breakdown]

Sides (the same cached DataFrame of ``--rows`` rows × ``--value-size`` random bytes, ``--slices``
tasks, written to a fresh 4-partition topic / directory per run):

* ``pulsartx tx``: ``format("pulsartx")`` with the defaults (transactional);
* ``pulsartx plain``: the same with ``option("transactional", "false")``;
* ``arrow sink``: a minimal ``DataSourceArrowWriter`` defined here that writes each task's batches
  as one parquet file with pyarrow (zstd level 1, like pulsartx's Delta writer) and commits nothing:
  the floor for any Python data source writing parquet;
* ``spark parquet``: ``df.write.parquet`` (JVM writer, zstd), for reference.

Runs are interleaved round by round, after ``--warmup`` uncounted rounds (2 by default), rotating which side goes first, so load from other processes
hits every side alike; each run is timed in wall seconds and in CPU seconds of the whole process
tree (driver JVM and pyspark workers), which a shared machine skews far less. Ratios are throughput
ratios (higher is better for pulsartx), taken per round (``--rounds``, 5 by default) and printed as
their median, spread (min-max) and target: tx/arrow sink >= 0.85 and tx/plain >= 0.95.
Nothing is asserted. ``--breakdown`` adds a run with
timers inside the pyspark workers (routing, record building, Delta appends, TC calls, commit).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from read import measure, report, session  # noqa: E402 (the sibling bench module: CPU accounting, table)

TOPIC_PARTITIONS = 4
TARGETS = {"pulsartx plain": 0.95, "arrow sink": 0.85}


# ---- the minimal Arrow sink ----------------------------------------------------------------------
def register_arrow_sink(spark: Any) -> None:
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class ParquetFiles(WriterCommitMessage):
        def __init__(self, files: list[str]):
            self.files = files

    class ArrowParquetWriter(DataSourceArrowWriter):
        def __init__(self, path: str):
            self.path = path

        def write(self, iterator: Iterator[Any]) -> Any:
            # Under PULSARTX_PROFILE_DIR, profiled like the data source's tasks (per-task CPU compared).
            from pulsartx.datasource.profiling import profiled

            return profiled(self._write, "ArrowParquetWriter.write")(iterator)

        def _write(self, iterator: Iterator[Any]) -> Any:
            import uuid

            import pyarrow as pa
            import pyarrow.parquet as pq

            batches = [b for b in iterator if b.num_rows]
            if not batches:
                return ParquetFiles([])
            name = os.path.join(self.path, f"part-{uuid.uuid4().hex}.parquet")
            pq.write_table(pa.Table.from_batches(batches), name, compression="zstd", compression_level=1)
            return ParquetFiles([name])

        def commit(self, messages: list[Any]) -> None:
            pass

        def abort(self, messages: list[Any]) -> None:
            pass

    class ArrowParquetSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_arrow_parquet"

        def writer(self, schema: Any, overwrite: bool) -> Any:
            os.makedirs(self.options["path"], exist_ok=True)
            return ArrowParquetWriter(self.options["path"])

    spark.dataSource.register(ArrowParquetSink)


# ---- timers inside the workers (--breakdown) -------------------------------------------------------
def register_timed_pulsartx(spark: Any, out: str) -> None:
    """``pulsartx_timed``: the real source with the workers' main steps timed into ``out``."""
    from pulsartx.datasource.source import PulsarTxDataSource
    from pulsartx.datasource.writer import PulsarTxBatchWriter

    def current() -> dict[str, float]:
        """The running task's timers (a pyspark worker may be reused for several tasks)."""
        import pulsartx.commit_protocol.task as task_mod

        return task_mod.__dict__.setdefault("_bench_timers", {})

    def timed(cls: Any, name: str) -> None:
        orig = getattr(cls, name)
        if getattr(orig, "_timed", False):
            return

        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            res = None
            try:
                res = orig(*a, **k)
                return res
            finally:
                acc = current()
                acc[f"{cls.__name__}.{name}"] = acc.get(f"{cls.__name__}.{name}", 0.0) + time.perf_counter() - t
                lost = getattr(res, "attempts", 1) - 1  # AppendResult: commit races lost (re-encoded)
                if lost > 0:
                    acc["lost append races"] = acc.get("lost append races", 0) + lost

        wrapper._timed = True  # type: ignore[attr-defined]
        setattr(cls, name, wrapper)

    def record(kind: str, acc: dict[str, float], **extra: Any) -> None:
        with open(out, "a") as f:
            f.write(json.dumps({"kind": kind, "pid": os.getpid(), **acc, **extra}) + "\n")

    class TimedWriter(PulsarTxBatchWriter):
        def write(self, iterator: Any) -> Any:
            import pulsartx.commit_protocol.job as job_mod
            import pulsartx.commit_protocol.task as task_mod

            import pulsartx.log.partition as part_mod

            task_mod._bench_timers = acc = {}
            for cls, names in ((task_mod.TaskAppender, ("_route", "_flush")), (part_mod.PartitionLog, ("append",)),
                               (job_mod.JobTransaction, ("register",))):
                for n in names:
                    timed(cls, n)
            orig_build = task_mod.records_from_arrow

            def build(*a: Any, **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    return orig_build(*a, **k)
                finally:
                    acc["records_from_arrow"] = acc.get("records_from_arrow", 0.0) + time.perf_counter() - t

            task_mod.records_from_arrow = build
            waited = 0.0
            rows = 0

            def counted(it: Any) -> Iterator[Any]:
                nonlocal waited, rows
                while True:
                    t = time.perf_counter()
                    try:
                        b = next(it)
                    except StopIteration:
                        waited += time.perf_counter() - t
                        return
                    waited += time.perf_counter() - t
                    rows += b.num_rows
                    yield b

            t0, start = time.perf_counter(), time.time()
            report = super().write(counted(iter(iterator)))
            total = time.perf_counter() - t0
            task_mod.records_from_arrow = orig_build
            record("task", {k: round(v, 3) for k, v in acc.items()}, total=round(total, 3),
                   input_wait=round(waited, 3), rows=rows, entries=len(report.entries), start=start, end=time.time())
            return report

        def commit(self, messages: Any) -> Any:
            t, start = time.perf_counter(), time.time()
            try:
                return super().commit(messages)
            finally:
                record("commit", {"commit": round(time.perf_counter() - t, 3)}, start=start, end=time.time())

    class TimedSource(PulsarTxDataSource):
        @classmethod
        def name(cls) -> str:
            return "pulsartx_timed"

        def writer(self, schema: Any, overwrite: bool) -> Any:
            t, start = time.perf_counter(), time.time()
            w = super().writer(schema, overwrite)
            w.__class__ = TimedWriter
            record("driver", {"writer()": round(time.perf_counter() - t, 3)}, start=start, end=time.time())
            return w

    spark.dataSource.register(TimedSource)


# ---- the runs ----------------------------------------------------------------------------------
def source_df(spark: Any, rows: int, value_size: int, slices: int) -> Any:
    """``rows`` rows of ``value_size`` pseudo-random (incompressible) bytes, cached in memory so that
    generating them is not part of any side's time."""
    from pyspark.sql import functions as F

    digest = F.concat(*[F.unhex(F.sha2(F.concat(F.lit(f"{i}:"), F.col("id").cast("string")), 512))
                        for i in range(value_size // 64 + 1)])
    df = spark.range(rows, numPartitions=slices).select(F.substring(digest, 1, value_size).alias("value")).cache()
    assert df.count() == rows
    return df


class Runner:
    def __init__(self, spark: Any, base: Path):
        import pulsartx

        self.spark = spark
        self.base = base
        self.root = base / "pulsartx-root"
        self.root.mkdir()
        self.client = pulsartx.Client(str(self.root))
        self.n = 0

    def run(self, side: str, df: Any) -> tuple[float, float]:
        """(wall seconds, CPU seconds of the process tree) of one write of ``df``."""
        self.n += 1
        target = f"t{self.n}"
        if side.startswith("pulsartx"):
            self.client.admin.create_topic(target, TOPIC_PARTITIONS)
            w = df.write.format("pulsartx_timed" if side == "pulsartx timed" else "pulsartx").mode("append") \
                .option("service.url", str(self.root)).option("topic", target)
            if side == "pulsartx plain":
                w = w.option("transactional", "false")
            return measure(w.save)
        path = str(self.base / target)
        if side == "arrow sink":
            took = measure(lambda: df.write.format("bench_arrow_parquet").mode("append").save(path))
        else:
            took = measure(lambda: df.write.option("compression", "zstd").parquet(path))
        shutil.rmtree(path, ignore_errors=True)
        return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the median counts)")
    ap.add_argument("--warmup", type=int, default=2, help="interleaved rounds run first and not counted")
    ap.add_argument("--slices", type=int, default=4, help="tasks per write (the DataFrame's partitions)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--breakdown", action="store_true", help="one more pulsartx run with timers in the workers")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="bench-spark-write-"))
    spark = session(args.master, "pulsartx-bench-write")
    register_arrow_sink(spark)
    timings = base / "timings.jsonl"
    register_timed_pulsartx(spark, str(timings))
    runner = Runner(spark, base)
    sides = ["pulsartx tx", "pulsartx plain", "arrow sink", "spark parquet"]
    try:
        t0 = time.perf_counter()
        df = source_df(spark, args.rows, args.value_size, args.slices)
        print(f"{args.rows:,} rows x {args.value_size} B in {args.slices} tasks on {args.master}, cached in "
              f"{time.perf_counter() - t0:.1f}s; {args.rounds} interleaved round(s); load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        # Python workers, imports and the JVM's JIT at full size: paid in ``--warmup`` rounds that are
        # printed and not counted. A 20k-row warm-up left every side's first counted round 1.3-1.8x
        # slower than its later ones, charged most to the side that ran first in it.
        times: dict[str, list[tuple[float, float]]] = {s: [] for s in sides}
        for r in range(args.warmup + args.rounds):
            order = sides[r % len(sides):] + sides[:r % len(sides)]
            took = {side: runner.run(side, df) for side in order}
            label = f"warm-up round {r + 1} (not counted)" if r < args.warmup else f"round {r - args.warmup + 1}"
            if r >= args.warmup:
                for side in sides:
                    times[side].append(took[side])
            print(f"{label}: " + ", ".join(f"{s} {took[s][0]:.2f}s ({took[s][1]:.1f} cpu-s)" for s in sides),
                  flush=True)
        report(times, args.rows, "pulsartx tx", TARGETS)
        if args.breakdown:
            breakdown(runner, df, timings)
    finally:
        runner.client.close()
        spark.stop()
        shutil.rmtree(base, ignore_errors=True)


def breakdown(runner: Runner, df: Any, timings: Path) -> None:
    timings.unlink(missing_ok=True)
    began = time.time()
    elapsed, _ = runner.run("pulsartx timed", df)
    recs = [json.loads(line) for line in timings.read_text().splitlines()]
    tasks = [r for r in recs if r["kind"] == "task"]
    print(f"\nbreakdown of one transactional write ({elapsed:.2f}s wall, {len(tasks)} tasks; seconds summed over tasks):")
    keys = sorted({k for t in tasks for k in t if k not in ("kind", "pid", "rows", "entries", "start", "end")})
    for k in keys:
        print(f"  {k:<28}{sum(t.get(k, 0.0) for t in tasks):>8.2f}")
    print(f"  {'entries (Delta commits)':<28}{sum(t['entries'] for t in tasks):>8}")
    for r in recs:
        if r["kind"] != "task":
            print(f"  {r['kind']:<28}{', '.join(f'{k} {v}s' for k, v in r.items() if k not in ('kind', 'pid', 'start', 'end'))}")
    print(f"timeline (seconds from the save() call; the job ended at {elapsed:.2f}):")
    for r in sorted(recs, key=lambda r: r["start"]):
        print(f"  {r['kind']:<8} pid {r['pid']:<7} {r['start'] - began:6.2f} -> {r['end'] - began:6.2f}")


if __name__ == "__main__":
    main()
