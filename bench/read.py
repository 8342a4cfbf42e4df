"""Spark batch read throughput: ``spark.read.format("pulsartx")`` against a minimal Python Arrow data
source reading the very same parquet files, and against ``spark.read.parquet`` of them.

    .venv/bin/python bench/read.py [--messages 2000000] [--value-size 100] [--batch 10000] [--rounds 5]

Setup: ``--messages`` plain (non-transactional) messages of ``--value-size`` random bytes, a third of
them keyed, appended to a 4-partition topic ``--batch`` messages per Delta commit (as a producer
with ``batching_max_messages=--batch`` would), so every side reads the same data files.

Sides, each forced to produce every column of every row (``write.format("noop")``):

* ``pulsartx``: ``spark.read.format("pulsartx")`` (READ_COMMITTED, the default): plans offset ranges
  from the Delta logs, reads the files with pyarrow in the executors, and returns the topic schema
  (9 columns, three of them derived: ``__topic``, ``__partition``, ``__messageId``);
* the minimal Python data source reading the same files with ``pyarrow.parquet``, one input
  partition per topic partition (a ``DataSourceReader`` defined here), three ways:
  * ``arrow same schema``: returns exactly what pulsartx returns (the topic schema, its derived
    columns filled in as constants): the **target** side, since it does the same job minus
    everything pulsartx adds (planning from the Delta logs, visibility, offsets ranges);
  * ``arrow whole files``: returns the files as stored (all 12 columns): the most literal
    "minimal reader of the same parquet files"; informative;
  * ``arrow 6 columns``: returns only the six stored columns the topic schema is built from, fewer
    columns than the topic schema has; informative only (Python data sources have no column
    pruning, so this gap is the price of the topic schema, not of the implementation);
* ``spark parquet``: ``spark.read.parquet`` of the same files and columns (JVM vectorized reader).

Runs are interleaved round by round (``--rounds``, 5 by default, after ``--warmup`` uncounted rounds, 2 by default), rotating which side goes first.
Ratios are throughput ratios (pulsartx ÷ side, higher is better), taken per round, on wall time and
on CPU time of the process tree, and printed as their median, spread (min-max) and target: pulsartx
÷ arrow same schema >= 0.95; the other sides are informative. Nothing is asserted.
bench/spark_read.py reuses this module for transactional data written by Spark jobs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also when imported by a sibling

TOPIC = "bench"
PARTITIONS = 4
STORED = ("value", "key", "offset", "publish_time", "event_time", "properties")
READER_SCHEMA = ("value binary, key string, offset bigint, publish_time timestamp, event_time timestamp, "
                 "properties map<string,string>")
# Every column of the partition files, as stored (pulsartx.log.schema.RECORD_SCHEMA).
FILE_SCHEMA = ("offset bigint, type string, value binary, key string, properties map<string,string>, "
               "event_time timestamp, publish_time timestamp, producer_name string, sequence_id bigint, "
               "txn_most_bits bigint, txn_least_bits bigint, "
               "marker_entries array<struct<first_offset:bigint,last_offset:bigint>>")


def session(master: str, name: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    log4j = Path(__file__).resolve().parents[1] / "conf" / "log4j2.properties"
    spark = (SparkSession.builder.master(master).appName(name)
             .config("spark.driver.memory", "2g")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# ---- the minimal Arrow reader ----------------------------------------------------------------------
def register_arrow_reader(spark: Any) -> None:
    """``bench_arrow_parquet_reader``: option ``files`` names a JSON file of ``[[path, ...], ...]``,
    one list of parquet files per input partition."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Files(InputPartition):
        def __init__(self, files: list[str]):
            self.files = files

    class ArrowParquetReader(DataSourceReader):
        def __init__(self, groups: list[list[str]], topic_schema: bool, file_schema: Any = None):
            self.groups = groups
            self.topic_schema = topic_schema
            self.file_schema = file_schema  # Spark schema of every stored column: read the files whole

        def partitions(self) -> list[Any]:
            return [Files(g) for g in self.groups]

        def read(self, partition: Any) -> Iterator[Any]:
            # Profiled as pulsartx's own calls are, when PULSARTX_PROFILE_DIR is set, so
            # `python -m pulsartx.datasource.profiling DIR` compares the two readers' tasks.
            from pulsartx.datasource.profiling import profiled

            return profiled(self._read, "ArrowParquetReader.read")(partition)

        def _read(self, partition: Any) -> Iterator[Any]:
            import pyarrow as pa
            import pyarrow.parquet as pq

            if self.file_schema is not None:  # the files as they are, every column
                from pyspark.sql.pandas.types import to_arrow_schema

                target = to_arrow_schema(self.file_schema, timezone="UTC")
                for f in partition.files:
                    for batch in pq.ParquetFile(f).iter_batches(batch_size=65_536):
                        yield batch.cast(target)
                return
            ts = pa.timestamp("us", tz="UTC")
            schema = pa.schema([("value", pa.binary()), ("key", pa.string()), ("offset", pa.int64()),
                                ("publish_time", ts), ("event_time", ts),
                                ("properties", pa.map_(pa.string(), pa.string()))])
            for f in partition.files:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=65_536, columns=list(STORED)):
                    batch = batch.cast(schema)
                    if self.topic_schema:  # the three derived columns of the topic schema, as constants
                        from pulsartx.datasource.schema import arrow_schema, message_ids

                        n = batch.num_rows
                        cols = {"value": batch.column(0), "__key": batch.column(1), "__topic": pa.repeat(
                                pa.scalar("persistent://public/default/bench", pa.string()), n),
                                "__partition": pa.repeat(pa.scalar(0, pa.int32()), n), "__offset": batch.column(2),
                                "__messageId": message_ids(0, batch.column(2).to_numpy()),
                                "__publishTime": batch.column(3), "__eventTime": batch.column(4),
                                "__messageProperties": batch.column(5)}
                        batch = pa.RecordBatch.from_arrays(list(cols.values()), schema=arrow_schema())
                    yield batch

    class ArrowParquetSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_arrow_parquet_reader"

        def schema(self) -> Any:
            if self.options.get("topicschema") == "true":
                from pulsartx.datasource.schema import SPARK_SCHEMA

                return SPARK_SCHEMA
            return FILE_SCHEMA if self.options.get("allcolumns") == "true" else READER_SCHEMA

        def reader(self, schema: Any) -> Any:
            with open(self.options["files"]) as f:
                return ArrowParquetReader(json.load(f), self.options.get("topicschema") == "true",
                                          schema if self.options.get("allcolumns") == "true" else None)

    spark.dataSource.register(ArrowParquetSource)


# Throughput target of a plain pulsartx read over the minimal reader returning the same schema (the
# module docstring says why the other sides are informative).
READ_TARGETS = {"arrow same schema": 0.95}


def arrow_reader_sides(spark: Any, listing: Path) -> dict[str, Callable[[], Any]]:
    """The minimal reader's three variants over the files listed in ``listing``."""
    def load(**options: str) -> Callable[[], Any]:
        def df() -> Any:
            r = spark.read.format("bench_arrow_parquet_reader").option("files", str(listing))
            for k, v in options.items():
                r = r.option(k, v)
            return r.load()
        return df

    return {"arrow same schema": load(topicSchema="true"), "arrow whole files": load(allColumns="true"),
            "arrow 6 columns": load()}


def data_files(root: str, topic: str, partitions: int) -> list[list[str]]:
    """The current data files of each partition table (Delta snapshot), as local paths."""
    from pulsartx.log.partition import partition_segments
    from pulsartx.naming import TopicName
    from pulsartx.storage import delta
    from pulsartx.storage.root import StorageRoot

    sr = StorageRoot.resolve(root)
    out = []
    for i in range(partitions):
        t = delta.open_table(sr, *partition_segments(TopicName.parse(topic).with_partition(i)))
        out.append(sorted(u.removeprefix("file://") for u in t.file_uris()))
    return out


# ---- timing ------------------------------------------------------------------------------------
# Processes of the tree whose parent ignores SIGCHLD: (pid, start time) -> CPU ticks last seen.
_REAPED_UNCOUNTED: dict[tuple[int, int], int] = {}
_GONE_TICKS = 0


def _ignores_sigchld(pid: int) -> bool:
    """The pyspark daemon ignores SIGCHLD, so the kernel reaps its workers without adding their CPU
    time to its ``cutime``: a worker that exits takes its CPU out of the tree's total."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) >> 16 & 1)  # SIGCHLD is signal 17
    except OSError:
        pass
    return False


def tree_cpu() -> float:
    """CPU seconds used so far by this process and every process below it (the driver JVM, the
    pyspark daemons and workers; exited workers count through their parent's cutime/cstime, or,
    for the children of a parent that ignores SIGCHLD, at what an earlier call last saw of them).
    On a shared machine this is far steadier than wall time, which other processes' load skews.
    A worker that starts and exits between two calls is missed: sample often to bound that."""
    global _GONE_TICKS
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stats[int(entry)] = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(int(st[1]), []).append(pid)
    total, todo = 0, [os.getpid()]
    uncounted: dict[tuple[int, int], int] = {}
    ignoring: dict[int, bool] = {}
    while todo:
        pid = todo.pop()
        st = stats.get(pid)
        if st is not None:
            ticks = sum(int(x) for x in st[11:15])  # utime, stime, cutime, cstime
            total += ticks
            ppid = int(st[1])
            if ignoring.setdefault(ppid, _ignores_sigchld(ppid)):
                uncounted[(pid, int(st[19]))] = ticks
        todo.extend(children.get(pid, []))
    _GONE_TICKS += sum(t for k, t in _REAPED_UNCOUNTED.items() if k not in uncounted)
    _REAPED_UNCOUNTED.clear()
    _REAPED_UNCOUNTED.update(uncounted)
    return (total + _GONE_TICKS) / tick


def measure(action: Callable[[], Any]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process tree) of ``action()``; the tree is sampled
    every half second meanwhile, so a pyspark worker that exits during the action still counts."""
    import threading

    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            tree_cpu()

    c, t = tree_cpu(), time.perf_counter()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        action()
    finally:
        done.set()
        sampler.join()
    return time.perf_counter() - t, tree_cpu() - c


def force(df: Any) -> None:
    """Produce every column of every row of ``df`` (the noop sink consumes them all)."""
    df.write.format("noop").mode("overwrite").save()


def interleave(sides: dict[str, Callable[[], Any]], rounds: int, warmup: int = 2) -> dict[str, list[tuple[float, float]]]:
    """``warmup`` rounds that are printed but not counted, then ``rounds`` rounds, every one rotating
    which side goes first. The JVM's JIT on 2 cores keeps warming for several full-size runs (Spark's
    parquet reader ran 1.8x its later time in the first round after a single warm-up run), and a
    round still warming charges most the side that runs first in it."""
    names = list(sides)
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        took = {}
        for name in names[r % len(names):] + names[:r % len(names)]:
            took[name] = measure(lambda name=name: force(sides[name]()))
        label = f"warm-up round {r + 1} (not counted)" if r < warmup else f"round {r - warmup + 1}"
        if r >= warmup:
            for name in names:
                times[name].append(took[name])
        print(f"{label}: " + ", ".join(f"{n} {took[n][0]:.2f}s ({took[n][1]:.1f} cpu-s)" for n in names), flush=True)
    return times


def report(times: dict[str, list[tuple[float, float]]], rows: int, reference: str, targets: dict[str, float]) -> None:
    """Throughput ratios ``reference / side`` (higher is better for the reference), per round (the
    sides of a round ran back to back), on wall time and on CPU time of the process tree: each as
    its median, spread and target (bench/common.py's :class:`Rounds`)."""
    from common import Rounds, print_rounds

    def med(side: str, i: int) -> float:
        return statistics.median(t[i] for t in times[side])

    print(f"\n{'side':<18}{'wall s':>8}{'best':>7}{'cpu s':>7}{'M rows/s':>10}  (medians of {len(times[reference])} rounds)")
    for side in times:
        wall = med(side, 0)
        print(f"{side:<18}{wall:>8.2f}{min(t[0] for t in times[side]):>7.2f}{med(side, 1):>7.1f}{rows / wall / 1e6:>10.2f}")
    lines = []
    for side, ts in times.items():
        if side == reference:
            continue
        target = targets.get(side)
        op = None if target is None else ">="
        for i, kind in ((0, "wall"), (1, "cpu")):
            lines.append(Rounds(f"{reference} / {side} ({kind})",
                                [b[i] / a[i] if a[i] else float("nan") for a, b in zip(times[reference], ts, strict=True)],
                                op, target))
    print_rounds(f"throughput ratios per round ({reference} / side; higher is better for {reference}):", lines)


def read_breakdown(root: str, topic: str, repeat: int = 1) -> None:
    """Where a pulsartx read spends its time, outside Spark: planning (Delta logs, visibility), then
    per input partition the parquet read, the visibility filter and the conversion to Spark rows.
    With ``repeat``, the whole read is timed that many times (the first plan may fold and snapshot
    the partitions; later ones start from the snapshot, as repeated queries do)."""
    for _ in range(repeat):
        _read_breakdown(root, topic)


def _read_breakdown(root: str, topic: str) -> None:
    from pulsartx.datasource.batch_reader import plan_partitions, read_steps
    from pulsartx.datasource.options import parse_options
    from pulsartx.datasource.schema import spark_batches, to_spark_table
    from pulsartx.datasource.visibility import visible_records

    from pulsartx.log.partition import read_files

    opts = parse_options({"service.url": root, "topic": topic})
    t = time.perf_counter()
    parts = plan_partitions(opts.root, opts)
    plan = time.perf_counter() - t
    acc = {"read_files (pyarrow parquet)": 0.0, "visible_records (filter)": 0.0,
           "to_spark_table + batches": 0.0}
    rows = files = filtered = 0
    for part in parts:
        for group, columns, filtering in read_steps(part):
            files += len(group)
            filtered += len(group) if filtering else 0
            t = time.perf_counter()
            raw = read_files(opts.root, part.segments, group, part.start, part.end, columns)
            acc["read_files (pyarrow parquet)"] += time.perf_counter() - t
            t = time.perf_counter()
            vis = visible_records(raw, part.visibility) if filtering else raw
            acc["visible_records (filter)"] += time.perf_counter() - t
            t = time.perf_counter()
            rows += sum(b.num_rows for b in spark_batches(to_spark_table(vis, part.topic, part.partition)))
            acc["to_spark_table + batches"] += time.perf_counter() - t
    print(f"\nbreakdown of the pulsartx read path in one process ({rows:,} rows, {len(parts)} input "
          f"partitions, {files} files, {filtered} of them filtered):")
    print(f"  {'plan_partitions (driver)':<34}{plan:>7.2f}s")
    for k, v in acc.items():
        print(f"  {k:<34}{v:>7.2f}s")


# ---- setup: plain messages ---------------------------------------------------------------------
def produce(root: str, messages: int, value_size: int, batch: int) -> None:
    """``messages`` plain messages, round-robin over the partitions, ``batch`` per Delta commit."""
    import numpy as np
    import pyarrow as pa

    import pulsartx
    from pulsartx.log.partition import PartitionLog, records_from_arrow
    from pulsartx.naming import TopicName

    client = pulsartx.Client(root)
    client.admin.create_topic(TOPIC, PARTITIONS)
    rng = np.random.default_rng(7)
    per = messages // PARTITIONS
    for p in range(PARTITIONS):
        plog = PartitionLog(client.root, TopicName.parse(TOPIC).with_partition(p))
        seq = 0
        for lo in range(0, per, batch):
            n = min(batch, per - lo)
            blob = rng.bytes(n * value_size)
            values = pa.FixedSizeBinaryArray.from_buffers(pa.binary(value_size), n, [None, pa.py_buffer(blob)])
            keys = pa.array([f"key-{(lo + i) % 100}" if (lo + i) % 3 == 0 else None for i in range(n)], pa.string())
            plog.append(records_from_arrow(values.cast(pa.binary()), keys=keys, producer_name="bench",
                                           first_sequence_id=seq), producer_name="bench")
            seq += n
    client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=10_000, help="messages per Delta commit (data file)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the median counts)")
    ap.add_argument("--warmup", type=int, default=2, help="interleaved rounds run first and not counted")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--breakdown", action="store_true", help="time the read path's steps outside Spark")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="bench-read-"))
    root = str(base / "root")
    try:
        t0 = time.perf_counter()
        produce(root, args.messages, args.value_size, args.batch)
        groups = data_files(root, TOPIC, PARTITIONS)
        listing = base / "files.json"
        listing.write_text(json.dumps(groups))
        print(f"{args.messages:,} messages x {args.value_size} B in {sum(map(len, groups))} files over {PARTITIONS} "
              f"partitions, produced in {time.perf_counter() - t0:.1f}s", flush=True)
        spark = session(args.master, "pulsartx-bench-read")
        register_arrow_reader(spark)
        flat = [f for g in groups for f in g]
        sides = {
            "pulsartx": lambda: spark.read.format("pulsartx").option("service.url", root).option("topic", TOPIC).load(),
            **arrow_reader_sides(spark, listing),
            "spark parquet": lambda: spark.read.parquet(*flat).select(*STORED),
        }
        print(f"{args.rounds} interleaved round(s) on {args.master}; load average {os.getloadavg()[0]:.1f}", flush=True)
        times = interleave(sides, args.rounds, args.warmup)
        report(times, args.messages, "pulsartx", READ_TARGETS)
        if args.breakdown:
            read_breakdown(root, TOPIC)
        spark.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
