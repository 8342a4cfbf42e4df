"""Structured Streaming: the pulsartx sink and the consume-transform-produce pipeline against Spark's
parquet file sink/source, and the per-micro-batch cost of the transaction.

    .venv/bin/python bench/streaming.py [--rows 400000] [--batches 4] [--value-size 100] \\
        [--empty-batches 12] [--partitions 4] [--repeat 5] [--breakdown] [--sides sink,ctp,empty] [--dir DIR]

Every side processes the same pre-generated input (untimed set-up) with Trigger.AvailableNow and the
same number of micro-batches:

  sink: parquet -> pulsartx       parquet file source (maxFilesPerTrigger) -> writeStream pulsartx
  sink: parquet -> parquet        the same source -> FileStreamSink (parquet)
  ctp:  pulsartx -> pulsartx      readStream pulsartx (subscription, maxEntriesPerTrigger, the
                                  two columns the transform uses declared with .schema()) -> transform
                                  -> writeStream pulsartx: every batch one transaction that also
                                  acknowledges its input
  ctp:  parquet -> parquet        the same rows from parquet files -> the same transform -> parquet
  empty: ... -> pulsartx          batches that deliver 0 rows to the sink (a filter no row passes):
  empty: ... -> parquet           the fixed cost of a micro-batch, transaction included

Throughput is steady state: rows / summed ``triggerExecution`` of the batches after the first (the
first batch also pays for starting the query's Python workers, which is reported in the wall
column). Empty-batch overhead is the median ``triggerExecution`` (and ``addBatch``) after two
warm-up batches. Every pair of sides runs ``--repeat`` times (5 by default), its two runs back to
back in alternating order, so load from other processes hits both alike; each ratio is taken per
repetition and printed as its median, spread (min-max) and target: sink pulsartx/parquet >= 0.9,
ctp pulsartx/parquet >= 0.9, empty-batch time pulsartx/parquet <= 1.1. Beside them, the CPU
seconds of the whole process tree over each run (start-up included), as parquet / pulsartx. The
table shows each side's median run. Nothing is asserted; outputs are counted so a fast but wrong side cannot pass. A phase
breakdown (Spark's durationMs per batch, median runs) follows the table; ``--breakdown`` also times
the pulsartx source/sink calls inside the pyspark workers (first repetition).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Rounds, print_rounds  # noqa: E402 (sibling bench modules)
from read import measure, tree_cpu  # noqa: E402

TARGET_SINK, TARGET_CTP, TARGET_EMPTY = 0.9, 0.9, 1.1
PHASES = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets")


@dataclass
class Result:
    name: str
    rows: int = 0
    wall: float = 0.0
    progress: list[dict[str, Any]] = field(default_factory=list)
    output_rows: int = 0
    cpu: float = 0.0  # CPU seconds of the process tree over the whole run (start-up included)

    def steady(self) -> list[dict[str, Any]]:
        with_rows = [p for p in self.progress if p["numInputRows"] > 0]
        return with_rows[1:] if len(with_rows) > 1 else with_rows

    def rate(self) -> float:
        s = self.steady()
        ms = sum(p["durationMs"].get("triggerExecution", 0) for p in s)
        return 1000.0 * sum(p["numInputRows"] for p in s) / ms if ms else 0.0

    def median(self, phase: str, skip: int = 2) -> float:
        vals = [p["durationMs"].get(phase, 0) for p in self.progress[skip:]] or [0]
        return float(statistics.median(vals))

    def phase_means(self, batches: list[dict[str, Any]]) -> dict[str, float]:
        return {k: statistics.mean(p["durationMs"].get(k, 0) for p in batches) if batches else 0.0
                for k in (*PHASES, "triggerExecution")}


# What the transform reads. The parquet side's scan is pruned to these by Spark; a Python data
# source is not, so the pulsartx side declares them (--ctp-columns '' measures the full schema).
CTP_COLUMNS = "value binary, __key string"


def session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    log4j = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "log4j2.properties")
    spark = (SparkSession.builder.master("local[2]").appName("pulsartx-bench-streaming")
             .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def timed_source(log_path: str) -> Any:
    """``--breakdown``: the real source under the name ``pulsartx``, timing each of its calls in the
    pyspark worker that runs it (pickled by value from this script) into ``log_path``."""
    import json

    from pulsartx.datasource.source import PulsarTxDataSource
    from pulsartx.datasource.stream_reader import PulsarTxStreamReader
    from pulsartx.datasource.stream_writer import PulsarTxStreamWriter

    def note(kind: str, t0: float, **extra: Any) -> None:
        with open(log_path, "a") as f:
            f.write(json.dumps({"kind": kind, "ms": 1000 * (time.perf_counter() - t0), **extra}) + "\n")

    def profiled(tag: str, fn: Any) -> Any:
        """``fn()``, under cProfile dumped next to the log when PULSARTX_BENCH_PROFILE is set."""
        if not os.environ.get("PULSARTX_BENCH_PROFILE"):
            return fn()
        import cProfile

        with cProfile.Profile() as prof:
            out = fn()
        prof.dump_stats(f"{log_path}.{tag}-{os.getpid()}-{time.time_ns()}.prof")
        return out

    class TimedWriter(PulsarTxStreamWriter):
        def write(self, iterator):  # type: ignore[override]
            t0 = time.perf_counter()

            def first_timed(it: Any) -> Any:
                first = True
                for item in it:
                    if first:
                        note("sink task write(): waiting for its first input row", t0, start=time.time())
                        first = False
                    yield item

            out = profiled("write", lambda: super(TimedWriter, self).write(first_timed(iterator)))
            note("sink task write() (incl. waiting for input)", t0, rows=getattr(out, "rows", 0))
            return out

        def commit(self, messages, batchId):  # type: ignore[override]  # noqa: N803
            t0 = time.perf_counter()
            profiled(f"commit-{batchId}", lambda: super(TimedWriter, self).commit(messages, batchId))
            note("sink commit() (txn end, markers, acks)", t0)

    class TimedReader(PulsarTxStreamReader):
        def latestOffset(self, start, limit):  # type: ignore[override]  # noqa: N802
            t0 = time.perf_counter()
            out = super().latestOffset(start, limit)
            note("source latestOffset()", t0)
            return out

        def partitions(self, start, end):  # type: ignore[override]
            t0 = time.perf_counter()
            out = super().partitions(start, end)
            note("source partitions() (visibility, hand-off)", t0)
            return out

        def read(self, partition):  # type: ignore[override]
            t0 = time.perf_counter()
            note("source task read(): started", t0, start=time.time())
            n = 0
            for b in super().read(partition):
                n += b.num_rows
                yield b
            note("source task read() (incl. downstream)", t0, rows=n)

        def commit(self, end):  # type: ignore[override]
            t0 = time.perf_counter()
            super().commit(end)
            note("source commit()", t0)

    class TimedSource(PulsarTxDataSource):
        def streamReader(self, schema):  # type: ignore[override]  # noqa: N802
            r = super().streamReader(schema)
            r.__class__ = TimedReader
            return r

        def streamWriter(self, schema, overwrite):  # type: ignore[override]  # noqa: N802
            t0 = time.perf_counter()
            w = super().streamWriter(schema, overwrite)
            w.__class__ = TimedWriter
            note("sink streamWriter() (begins the txn in the planner; also in the sink runner)", t0)
            return w

    return TimedSource


def breakdown(log_path: str) -> dict[str, tuple[int, float, float]]:
    """kind -> (calls, mean ms, total ms) from the ``--breakdown`` log, then the log is emptied."""
    import json

    if not os.path.exists(log_path):
        return {}
    by: dict[str, list[float]] = {}
    with open(log_path) as f:
        for line in f:
            e = json.loads(line)
            by.setdefault(e["kind"], []).append(e["ms"])
    os.replace(log_path, f"{log_path}.{time.time_ns()}")  # kept for timelines (with --dir)
    return {k: (len(v), statistics.mean(v), sum(v)) for k, v in by.items()}


def run(name: str, start, rows: int) -> Result:
    """Start a Trigger.AvailableNow query (``start()``), wait for its end, keep its progress and the
    CPU seconds of the whole process tree (driver JVM, pyspark workers) over the run."""
    for attempt in range(3):
        c0, t0 = tree_cpu(), time.perf_counter()
        q = start(attempt)
        try:
            measure(q.awaitTermination)  # samples the tree meanwhile: exited workers stay counted
        except Exception as e:  # Spark gives a new source runner 10 s to connect back: retry that
            q.stop()
            if "failed to connect back" not in str(e) or attempt == 2:
                raise
            continue
        return Result(name, rows, time.perf_counter() - t0, list(q.recentProgress), cpu=tree_cpu() - c0)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=400_000, help="rows per throughput side")
    ap.add_argument("--batches", type=int, default=4, help="micro-batches per throughput side")
    ap.add_argument("--value-size", type=int, default=100, help="bytes per value")
    ap.add_argument("--empty-batches", type=int, default=12, help="empty micro-batches per overhead side")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of every pulsartx topic")
    ap.add_argument("--keys", type=int, default=64,
                    help="distinct __key values of the input rows; 0: no __key column (unkeyed rows, routed "
                         "round-robin by batch)")
    ap.add_argument("--dir", default=None, help="work directory (default: a fresh temp dir, removed afterwards)")
    ap.add_argument("--min-entries-per-task", type=int, default=None,
                    help="the ctp source's minEntriesPerTask option (packing of small ranges; 0 disables; "
                         "default: the source's own default)")
    ap.add_argument("--ctp-columns", default=CTP_COLUMNS,
                    help="the ctp source's .schema(): the columns the transform uses, as the parquet side reads only "
                         "those (Spark prunes file-source columns; Python data sources are pruned by a declared "
                         "schema). '' reads the whole topic schema")
    ap.add_argument("--repeat", type=int, default=5,
                    help="repetitions: each runs every pair of sides back to back (the median ratio counts)")
    ap.add_argument("--breakdown", action="store_true",
                    help="time the pulsartx source/sink calls inside the pyspark workers (adds a little overhead)")
    ap.add_argument("--sides", default="sink,ctp,empty",
                    help="the pairs to run, comma-separated (sink, ctp, empty): one pair alone gives a worker profile "
                         "(PULSARTX_PROFILE_DIR) of that pipeline only")
    args = ap.parse_args(argv)
    pairs = [p for p in (("sink_pq", "sink_px"), ("ctp_pq", "ctp_px"), ("empty_pq", "empty_px"))
             if p[0].split("_")[0] in args.sides.split(",")]

    t_all = time.perf_counter()
    work = args.dir or tempfile.mkdtemp(prefix="pulsartx-bench-streaming-")
    os.makedirs(work, exist_ok=True)
    spark = session()
    from pyspark.sql import functions as F

    import pulsartx

    root = os.path.join(work, "root")
    client = pulsartx.Client(root)
    for t in ("sink-out", "ctp-in", "ctp-out", "empty-out"):
        client.admin.create_topic(t, args.partitions)
    # As many parquet files per batch as the topics have partitions: every side then runs the same
    # number of tasks per batch (one per file, one per topic partition), as a Kafka-style source
    # plans one Spark partition per topic partition.
    per_batch = args.partitions
    files = per_batch * args.batches
    n = args.rows
    print(f"streaming bench: {n:,} rows x {args.value_size} B values in {args.batches} batches; "
          f"{args.empty_batches} empty batches; {args.partitions} partitions per topic; work dir {work}")

    # ---- untimed set-up: the same input for every side ------------------------------------------
    t0 = time.perf_counter()
    value = (F.concat(F.lpad(F.col("id").cast("string"), 12, "0"), F.lit("x" * max(0, args.value_size - 12)))
             .cast("binary").alias("value"))
    keyed = [F.concat(F.lit("k"), (F.col("id") % args.keys).cast("string")).alias("__key")] if args.keys else []
    data = spark.range(n, numPartitions=files).select(value, *keyed)
    src_dir = os.path.join(work, "input")
    data.write.parquet(src_dir)
    data.write.format("pulsartx").mode("append").option("service.url", root).option("topic", "ctp-in").save()
    tiny_dir = os.path.join(work, "tiny")  # one one-row file per empty batch
    spark.range(args.empty_batches, numPartitions=args.empty_batches).select(
        F.col("id").cast("string").cast("binary").alias("value"), F.lit("k").alias("__key")).write.parquet(tiny_dir)
    schema = spark.read.parquet(src_dir).schema
    print(f"set-up (untimed): {time.perf_counter() - t0:.1f} s")
    timing_log = os.path.join(work, "breakdown.jsonl")
    if args.breakdown:
        spark.dataSource.register(timed_source(timing_log))
    if not args.keys and args.ctp_columns == CTP_COLUMNS:
        args.ctp_columns = "value binary"  # what the transform uses
    phases: dict[str, dict[str, tuple[int, float, float]]] = {}

    def from_parquet(path: str, per_trigger: int) -> Any:
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", str(per_trigger)).parquet(path)

    def transform(df: Any) -> Any:
        return df.select(F.concat(F.col("value"), F.lit(b"!")).alias("value"), *([F.col("__key")] if args.keys else []))

    def to_pulsartx(df: Any, topic: str, ck: str) -> Any:
        return (df.writeStream.format("pulsartx").option("service.url", root).option("topic", topic)
                .option("checkpointLocation", os.path.join(work, "ck", ck)).trigger(availableNow=True).start())

    def to_parquet(df: Any, out: str, ck: str) -> Any:
        return (df.writeStream.format("parquet").option("path", os.path.join(work, "out", out))
                .option("checkpointLocation", os.path.join(work, "ck", ck)).trigger(availableNow=True).start())

    def parquet_rows(out: str) -> int:
        return spark.read.parquet(os.path.join(work, "out", out)).count()

    def topic_rows(topic: str) -> int:
        return spark.read.format("pulsartx").option("service.url", root).option("topic", topic).load().count()

    def nothing(df: Any) -> Any:
        return df.where(F.length("value") < 0)  # no row passes; not constant-folded

    # Warm-up (untimed): start the pyspark daemon and the data source's workers once.
    run("warm-up", lambda a: to_pulsartx(nothing(from_parquet(tiny_dir, 1000)), "empty-out", f"warm{a}"), 0)
    breakdown(timing_log)

    # maxEntriesPerTrigger counts entries (offsets), as Kafka's maxOffsetsPerTrigger counts control
    # records: the set-up write's commit markers are entries too. Dividing only the rows would
    # leave a last batch of nothing but markers, one more micro-batch than the parquet side runs.
    entries = sum(s["entries"] for s in client.admin.topic_stats("ctp-in"))

    def ctp_source(sub: str) -> Any:
        reader = spark.readStream.format("pulsartx")
        if args.ctp_columns:
            reader = reader.schema(args.ctp_columns)
        return (reader.option("service.url", root).option("topic", "ctp-in")
                .option("subscription", sub).option("startingOffsets", "earliest")
                .option("maxEntriesPerTrigger", str(-(-entries // args.batches)))
                .options(**({} if args.min_entries_per_task is None
                             else {"minEntriesPerTask": str(args.min_entries_per_task)})).load())

    # Each side: (name, rows, start(rep, attempt)). Throughput pairs run --repeat times, the two sides
    # of a pair back to back in alternating order (load from other processes hits both alike); the
    # best run of each side counts.
    sides: dict[str, tuple[str, int, Any]] = {
        "sink_pq": ("sink: parquet -> parquet", n,
                    lambda i, a: to_parquet(from_parquet(src_dir, per_batch), f"sink{i}", f"sink-pq{i}-{a}")),
        "sink_px": ("sink: parquet -> pulsartx", n,
                    lambda i, a: to_pulsartx(from_parquet(src_dir, per_batch), "sink-out", f"sink-px{i}-{a}")),
        "ctp_pq": ("ctp: parquet -> parquet", n,
                   lambda i, a: to_parquet(transform(from_parquet(src_dir, per_batch)), f"ctp{i}", f"ctp-pq{i}-{a}")),
        "ctp_px": ("ctp: pulsartx -> pulsartx", n,
                   lambda i, a: to_pulsartx(transform(ctp_source(f"bench{i}-{a}")), "ctp-out", f"ctp-px{i}-{a}")),
        "empty_pq": ("empty: parquet -> parquet", 0,
                     lambda i, a: to_parquet(nothing(from_parquet(tiny_dir, 1)), f"empty{i}", f"empty-pq{i}-{a}")),
        "empty_px": ("empty: parquet -> pulsartx", 0,
                     lambda i, a: to_pulsartx(nothing(from_parquet(tiny_dir, 1)), "empty-out", f"empty-px{i}-{a}")),
    }
    sides = {k: v for k, v in sides.items() if any(k in p for p in pairs)}
    runs: dict[str, list[Result]] = {k: [] for k in sides}  # every repetition's run of each side
    for rep in range(args.repeat):
        for pair in pairs:
            for key in pair if rep % 2 == 0 else pair[::-1]:
                name, rows, start = sides[key]
                r = run(name, lambda a, start=start, rep=rep: start(rep, a), rows)
                timed = breakdown(timing_log)
                if key.endswith("_px") and rep == 0:
                    phases[key] = timed
                runs[key].append(r)
    outputs = {  # every repetition wrote its own output (parquet) or appended to one topic (pulsartx)
        "sink_pq": lambda: [parquet_rows(f"sink{i}") for i in range(args.repeat)],
        "sink_px": lambda: [topic_rows("sink-out") // args.repeat] * args.repeat,
        "ctp_pq": lambda: [parquet_rows(f"ctp{i}") for i in range(args.repeat)],
        "ctp_px": lambda: [topic_rows("ctp-out") // args.repeat] * args.repeat,
    }
    outputs = {k: f() for k, f in outputs.items() if k in runs}
    for k, counts in outputs.items():
        for r, v in zip(runs[k], counts, strict=True):
            r.output_rows = v

    def measure(key: str, r: Result) -> float:
        """What a side is judged on: steady throughput, or an empty side's median batch time."""
        return r.median("triggerExecution") if key.startswith("empty") else r.rate()

    # The table shows each side's median run (by its measure); the ratios are taken per repetition,
    # between the two runs of a pair that ran back to back.
    results = {k: sorted(rs, key=lambda r, k=k: measure(k, r))[len(rs) // 2] for k, rs in runs.items()}

    # ---- report -----------------------------------------------------------------------------------
    print()
    print(f"{'side (median of ' + str(args.repeat) + ' runs)':28s} {'batches':>7s} {'rows out':>9s} {'wall s':>7s} "
          f"{'cpu s':>6s} {'rows/s':>10s} {'med batch ms':>12s} {'med addBatch':>12s}")
    for r in results.values():
        print(f"{r.name:28s} {len(r.progress):7d} {r.output_rows:9,d} {r.wall:7.1f} {r.cpu:6.1f} {r.rate():10,.0f} "
              f"{r.median('triggerExecution'):12.0f} {r.median('addBatch'):12.0f}")

    def ratio(a: float, b: float) -> float:
        return a / b if b else float("nan")

    def per_rep(px: str, pq: str, fn: Any) -> list[float]:
        return [ratio(fn(a), fn(b)) for a, b in zip(runs.get(px, []), runs.get(pq, []), strict=True)]

    rounds = [
        Rounds("sink throughput pulsartx / parquet", per_rep("sink_px", "sink_pq", Result.rate), ">=", TARGET_SINK),
        Rounds("ctp throughput pulsartx / parquet", per_rep("ctp_px", "ctp_pq", Result.rate), ">=", TARGET_CTP),
        Rounds("empty batch time pulsartx / parquet",
               per_rep("empty_px", "empty_pq", lambda r: r.median("triggerExecution")), "<=", TARGET_EMPTY),
        Rounds("  empty batch, addBatch only",
               per_rep("empty_px", "empty_pq", lambda r: r.median("addBatch"))),
        # Background work (markers, acknowledgements) is charged where it runs: CPU over the whole
        # run, as parquet cpu / pulsartx cpu so that higher is better like the throughput ratios.
        Rounds("sink cpu-s parquet / pulsartx (whole run)", per_rep("sink_pq", "sink_px", lambda r: r.cpu)),
        Rounds("ctp cpu-s parquet / pulsartx (whole run)", per_rep("ctp_pq", "ctp_px", lambda r: r.cpu)),
    ]
    print_rounds("ratios per repetition (the two runs of a pair back to back):", [r for r in rounds if r.values])

    print("\nmean durationMs per batch (steady-state batches; empty sides after 2 warm-up batches):")
    print(f"{'side':28s} " + " ".join(f"{k[:12]:>12s}" for k in (*PHASES, "triggerExecution")))
    for key, r in results.items():
        batches = r.progress[2:] if key.startswith("empty") else r.steady()
        means = r.phase_means(batches)
        print(f"{r.name:28s} " + " ".join(f"{means[k]:12.0f}" for k in (*PHASES, "triggerExecution")))
    if args.breakdown:
        print("\npulsartx calls timed inside the workers (--breakdown): calls, mean ms, total ms")
        for key, kinds in phases.items():
            print(f"  {results[key].name}")
            for kind, (calls, mean, total) in sorted(kinds.items()):
                print(f"    {kind:72s} {calls:4d} {mean:9.1f} {total:9.0f}")
    wrong = sorted({r.name for k, rs in runs.items() for r in rs if not k.startswith("empty") and r.output_rows != r.rows})
    if wrong:
        print(f"\nWRONG OUTPUT COUNTS: {wrong}")
    print(f"\ntotal {time.perf_counter() - t_all:.1f} s")
    spark.stop()
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
