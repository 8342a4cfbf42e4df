"""End-to-end latency of a continuous exactly-once pipeline: pulsartx -> Spark -> pulsartx, against the
same pipeline through Spark's file source and FileStreamSink, in the same run.

    .venv/bin/python bench/streaming_latency.py [--rate 200] [--flush-ms 20] [--trigger-ms 500] \\
        [--poll-ms 10] [--partitions 2] [--warmup 5] [--seconds 20] [--rounds 5] [--dir DIR]

Each side, in every round:

  producer   a thread in this process generates one message every 1/--rate seconds, its payload
             ``msg <seq> <send wall time>`` stamped as it is handed over, and cuts what it was
             handed every --flush-ms:
               pulsartx  ``send_async`` to the input topic (plain, non-transactional; batching set
                         so that only the ``flush()`` every --flush-ms cuts a batch);
               file      the messages since the last cut written as one small parquet file into the
                         input directory (written aside, then renamed into place).
  query      one Structured Streaming query with ``processingTime`` triggers of --trigger-ms,
             exactly once, the same transform on both sides (the value upper-cased):
               pulsartx  ``readStream.format("pulsartx")`` with a ``subscription`` (the input's
                         acknowledgements go in each micro-batch's transaction) ->
                         ``writeStream.format("pulsartx")`` with a ``checkpointLocation``;
               file      ``readStream.schema(...).parquet(input dir)`` -> ``writeStream.parquet``
                         with a ``checkpointLocation`` (FileStreamSink).
  reader     a thread in this process that receives only committed output:
               pulsartx  a READ_COMMITTED consumer (``batch_receive``, ``idle_poll_max_interval_ms``
                         = --poll-ms), acknowledging what it receives;
               file      a watcher of ``<out>/_spark_metadata/``: the sink's commit is batch N's log
                         file appearing (``N``, or ``N.compact`` every 10th batch, which repeats the
                         files of the batches before it). It checks for the next batch's two names
                         every --poll-ms (the most the pulsartx consumer waits between its checks),
                         reads the JSON lines after the ``v1`` header for the data files, and reads
                         those files with pyarrow.
  Latency is the reader's wall time on receipt minus the send wall time in the payload.

Measurement starts --warmup seconds after the first output arrived (query start-up, Python
workers) and lasts --seconds; latencies count the messages sent in that window. Then the producer
stops, the reader drains (for as long as output keeps arriving: a side that fell behind is waited
for, not cut short), the query stops. Rounds (--rounds, 5 by default) alternate which side
goes first; one SparkSession (local[2]) serves the whole run. Printed: per round each side's p50
and p99 with the CPU seconds of the whole process tree (this process, the driver JVM, the Python
workers: children that still run count, which ``os.times`` would miss) beside the wall seconds of
the window; then the p99 ratio pulsartx / file per round, its median and spread (min-max), and
the target p99 <= 1.2 x the file pipeline's. Every message sent must be received exactly once on
each side (no loss, no duplicate, transformed), else the run is INVALID (exit code 1).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Rounds, percentile, print_rounds  # noqa: E402 (sibling bench modules)
from read import tree_cpu  # noqa: E402
from streaming import session  # noqa: E402

TARGET_P99 = 1.2
SIDES = ("pulsartx", "file")
FIRST_OUTPUT_TIMEOUT_S = 300.0


@dataclass
class SideRun:
    """One side's run in one round: what was sent (seq -> send wall time), what was received
    ((payload, receive wall time) in arrival order), and the measured window."""

    side: str
    sent: dict[int, float] = field(default_factory=dict)
    received: list[tuple[bytes, float]] = field(default_factory=list)
    window: tuple[float, float] = (0.0, 0.0)
    cpu: float = 0.0
    wall: float = 0.0
    problems: list[str] = field(default_factory=list)

    def latencies_ms(self) -> list[float]:
        lo, hi = self.window
        out = []
        for payload, t in self.received:
            _, seq, sent = payload.split(b" ")
            if lo <= float(sent) < hi:
                out.append(1000.0 * (t - float(sent)))
        return out

    def check(self) -> None:
        """Every message sent received exactly once, transformed; problems are recorded, not raised."""
        seqs: dict[int, int] = {}
        for payload, _ in self.received:
            head, seq, _ = payload.split(b" ")
            if head != b"MSG":
                self.problems.append(f"untransformed output {payload!r}")
                break
            seqs[int(seq)] = seqs.get(int(seq), 0) + 1
        dups = sum(1 for n in seqs.values() if n > 1)
        missing = len(self.sent.keys() - seqs.keys())
        extra = len(seqs.keys() - self.sent.keys())
        if dups or missing or extra:
            self.problems.append(f"{len(self.sent)} sent, {len(self.received)} received: {missing} missing, "
                                 f"{dups} duplicated, {extra} never sent")


# ---- the producer ---------------------------------------------------------------------------------


def produce(send: Callable[[bytes], None], cut: Callable[[], None], rate: float, flush_s: float,
            stop: threading.Event, sent: dict[int, float]) -> None:
    """One message every ``1/rate`` s, stamped with the wall time it is handed to ``send``; ``cut``
    every ``flush_s``. Late ticks (a slow cut, a busy machine) are caught up at once, stamped when
    they really go."""
    period = 1.0 / rate
    seq = 0
    next_msg = time.monotonic()
    next_cut = next_msg + flush_s
    while not stop.is_set():
        now = time.monotonic()
        if now >= next_msg:
            t = time.time()
            send(b"msg %d %.6f" % (seq, t))
            sent[seq] = t
            seq += 1
            next_msg += period
            continue
        if now >= next_cut:
            cut()
            next_cut = max(next_cut + flush_s, time.monotonic())
            continue
        time.sleep(min(next_msg, next_cut) - now)
    cut()


class ParquetDrop:
    """The file side's producer: the messages since the last cut as one parquet file, written aside
    (a dot file, which Spark's file source ignores) and renamed into the input directory."""

    def __init__(self, directory: str):
        self.dir = directory
        self.buf: list[bytes] = []
        self.n = 0

    def send(self, value: bytes) -> None:
        self.buf.append(value)

    def cut(self) -> None:
        if not self.buf:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        tmp = os.path.join(self.dir, f".part-{self.n:06d}.parquet.tmp")
        pq.write_table(pa.table({"value": pa.array(self.buf, pa.binary())}), tmp)
        os.replace(tmp, os.path.join(self.dir, f"part-{self.n:06d}.parquet"))
        self.n += 1
        self.buf = []


# ---- the readers ----------------------------------------------------------------------------------


def receive_pulsartx(consumer: Any, stop: threading.Event, got: list[tuple[bytes, float]]) -> None:
    while not stop.is_set():
        msgs = consumer.batch_receive(timeout_millis=100)
        t = time.time()
        for m in msgs:
            got.append((m.data(), t))
            consumer.acknowledge(m)


def sink_log_files(log_file: str) -> list[str]:
    """The data files a FileStreamSink batch log (or compaction) lists: JSON lines after ``v1``."""
    import json

    with open(log_file) as f:
        lines = f.read().splitlines()
    if not lines or lines[0] != "v1":
        raise ValueError(f"{log_file}: not a v1 sink log")
    out = []
    for line in lines[1:]:
        if line.strip():
            entry = json.loads(line)
            if entry.get("action", "add") == "add":
                out.append(urllib.parse.unquote(urllib.parse.urlparse(entry["path"]).path))
    return out


def receive_files(out_dir: str, poll_s: float, stop: threading.Event, got: list[tuple[bytes, float]]) -> None:
    """Read each committed batch's files once, in batch order, as the sink's metadata log lists them."""
    import pyarrow.parquet as pq

    meta = os.path.join(out_dir, "_spark_metadata")
    batch = 0
    seen: set[str] = set()
    while not stop.is_set():
        plain, compact = os.path.join(meta, str(batch)), os.path.join(meta, f"{batch}.compact")
        log_file = plain if os.path.exists(plain) else compact if os.path.exists(compact) else None
        if log_file is None:
            time.sleep(poll_s)
            continue
        for path in sink_log_files(log_file):
            if path in seen:  # a compaction file repeats the earlier batches' files
                continue
            seen.add(path)
            values = pq.read_table(path, columns=["value"]).column("value").to_pylist()
            t = time.time()
            got.extend((v, t) for v in values)
        batch += 1


# ---- one side of one round ------------------------------------------------------------------------


@dataclass
class Stops:
    """The producer stops first; the reader once the output is drained and the query stopped."""

    producer: threading.Event = field(default_factory=threading.Event)
    reader: threading.Event = field(default_factory=threading.Event)



class Bench:
    def __init__(self, spark: Any, work: str, args: argparse.Namespace):
        import pulsartx

        self.spark, self.work, self.args = spark, work, args
        self.root = os.path.join(work, "root")
        self.client = pulsartx.Client(self.root)

    def transform(self, df: Any) -> Any:
        from pyspark.sql import functions as F

        return df.select(F.upper(F.col("value").cast("string")).cast("binary").alias("value"))

    def trigger(self, writer: Any) -> Any:
        return writer.trigger(processingTime=f"{self.args.trigger_ms} milliseconds")

    def start_pulsartx(self, r: int, run: SideRun, stop: Stops) -> tuple[Any, list[threading.Thread]]:
        from pulsartx import InitialPosition

        a, root = self.args, self.root
        src, out = f"in-{r}", f"out-{r}"
        for t in (src, out):
            self.client.admin.create_topic(t, a.partitions)
        consumer = self.client.subscribe(out, "latency", initial_position=InitialPosition.Earliest,
                                         idle_poll_max_interval_ms=a.poll_ms)
        producer = self.client.create_producer(src, batching_max_messages=100_000,
                                               batching_max_publish_delay_ms=600_000)
        query = self.trigger(
            self.transform(self.spark.readStream.format("pulsartx").schema("value binary")
                           .option("service.url", root).option("topic", src)
                           .option("subscription", f"pipeline-{r}").option("startingOffsets", "earliest").load())
            .writeStream.format("pulsartx").option("service.url", root).option("topic", out)
            .option("checkpointLocation", os.path.join(self.work, "ck", f"pulsartx-{r}"))).start()

        def reader() -> None:
            try:
                receive_pulsartx(consumer, stop.reader, run.received)
            finally:
                consumer.close()

        def writer() -> None:
            try:
                produce(lambda v: producer.send_async(v, None), producer.flush, a.rate, a.flush_ms / 1000.0,
                        stop.producer, run.sent)
            finally:
                producer.close()

        return query, [threading.Thread(target=reader, daemon=True), threading.Thread(target=writer, daemon=True)]

    def start_file(self, r: int, run: SideRun, stop: Stops) -> tuple[Any, list[threading.Thread]]:
        a = self.args
        src, out = os.path.join(self.work, "files", f"in-{r}"), os.path.join(self.work, "files", f"out-{r}")
        os.makedirs(src)
        drop = ParquetDrop(src)
        query = self.trigger(
            self.transform(self.spark.readStream.schema("value binary").parquet(src))
            .writeStream.format("parquet").option("path", out)
            .option("checkpointLocation", os.path.join(self.work, "ck", f"file-{r}"))).start()
        reader = threading.Thread(target=receive_files, args=(out, a.poll_ms / 1000.0, stop.reader, run.received),
                                  daemon=True)
        writer = threading.Thread(target=produce, args=(drop.send, drop.cut, a.rate, a.flush_ms / 1000.0,
                                                        stop.producer, run.sent), daemon=True)
        return query, [reader, writer]

    def run(self, side: str, r: int) -> SideRun:
        a = self.args
        run = SideRun(side)
        stop = Stops()
        start = self.start_pulsartx if side == "pulsartx" else self.start_file
        query, threads = start(r, run, stop)
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + FIRST_OUTPUT_TIMEOUT_S
            while not run.received:
                if time.monotonic() > deadline or query.exception() is not None:
                    run.problems.append(f"no output within {FIRST_OUTPUT_TIMEOUT_S:.0f} s "
                                        f"(query exception: {query.exception()})")
                    return run
                time.sleep(0.05)
            time.sleep(a.warmup)
            c0, w0 = tree_cpu(), time.time()
            while time.time() < w0 + a.seconds:
                time.sleep(min(0.5, max(0.0, w0 + a.seconds - time.time())))
                tree_cpu()  # a sample every half second keeps exited pyspark workers counted
            c1, w1 = tree_cpu(), time.time()
            run.window, run.cpu, run.wall = (w0, w1), c1 - c0, w1 - w0
        finally:
            stop.producer.set()
            threads[1].join()
            # Drain: until everything sent is received, or nothing more arrives for a generous while
            # (a side that lost messages; a side far behind keeps making progress and is waited for).
            stall = max(30.0, 20 * a.trigger_ms / 1000.0)
            seen, last = len(run.received), time.monotonic()
            while len(run.received) < len(run.sent) and query.exception() is None:
                if len(run.received) != seen:
                    seen, last = len(run.received), time.monotonic()
                elif time.monotonic() - last > stall:
                    run.problems.append(f"nothing more arrived for {stall:.0f} s while draining")
                    break
                time.sleep(0.05)
            time.sleep(2 * a.trigger_ms / 1000.0)  # a duplicate would show up now
            if query.exception() is not None:
                run.problems.append(f"the query failed: {str(query.exception()).splitlines()[0]}")
            query.stop()
            stop.reader.set()
            threads[0].join()
        run.check()
        return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=200.0, help="messages per second")
    ap.add_argument("--flush-ms", type=int, default=20, help="the producers cut what they hold this often")
    ap.add_argument("--trigger-ms", type=int, default=500, help="processingTime trigger interval")
    ap.add_argument("--poll-ms", type=int, default=10,
                    help="the readers' longest wait between two checks for new output (the pulsartx "
                         "consumer's idle_poll_max_interval_ms; the file watcher's sleep)")
    ap.add_argument("--partitions", type=int, default=2, help="partitions of the pulsartx topics")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after the first output, not measured")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per side and round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the median ratio counts)")
    ap.add_argument("--dir", default=None, help="work directory (default: a fresh temp dir, removed afterwards)")
    args = ap.parse_args(argv)

    work = args.dir or tempfile.mkdtemp(prefix="pulsartx-bench-latency-")
    os.makedirs(work, exist_ok=True)
    t_all = time.perf_counter()
    print(f"streaming latency bench: {args.rate:g} msg/s, producers cut every {args.flush_ms} ms, triggers every "
          f"{args.trigger_ms} ms, readers poll at most every {args.poll_ms} ms; {args.warmup:g} s warm-up + "
          f"{args.seconds:g} s measured per side, {args.rounds} rounds; work dir {work}", flush=True)
    spark = session()
    bench = Bench(spark, work, args)
    runs: dict[str, list[SideRun]] = {s: [] for s in SIDES}
    invalid: list[str] = []
    try:
        for r in range(args.rounds):
            for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                run = bench.run(side, r)
                runs[side].append(run)
                lat = run.latencies_ms()
                print(f"round {r + 1} {side:8s}: p50 {percentile(lat, 0.5):7.1f} ms  p99 {percentile(lat, 0.99):7.1f} ms"
                      f"  ({len(lat):,} measured of {len(run.sent):,} sent, {len(run.received):,} received; "
                      f"cpu {run.cpu:5.1f} s over {run.wall:4.1f} s wall)", flush=True)
                for p in run.problems:
                    invalid.append(f"round {r + 1} {side}: {p}")
                    print(f"  INVALID: {p}", flush=True)
    finally:
        bench.client.close()
        spark.stop()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)

    def per_round(fn: Callable[[SideRun], float]) -> list[float]:
        return [fn(p) / fn(f) if fn(f) else float("nan") for p, f in zip(runs["pulsartx"], runs["file"], strict=True)]

    print(f"\n{'round':>5} " + " ".join(f"{s + ' ' + q:>14s}" for s in SIDES for q in ("p50", "p99"))
          + f" {'p99 ratio':>10s} {'cpu pulsartx':>13s} {'cpu file':>9s}")
    for r in range(len(runs["file"])):
        px, fl = runs["pulsartx"][r], runs["file"][r]
        cols = [percentile(x.latencies_ms(), q) for x in (px, fl) for q in (0.5, 0.99)]
        print(f"{r + 1:>5} " + " ".join(f"{c:14.1f}" for c in cols)
              + f" {cols[1] / cols[3] if cols[3] else float('nan'):10.2f} {px.cpu:13.1f} {fl.cpu:9.1f}")
    print_rounds("pulsartx / file pipeline, per round (latency: lower is better):", [
        Rounds("p99 latency pulsartx / file", per_round(lambda x: percentile(x.latencies_ms(), 0.99)),
               "<=", TARGET_P99),
        Rounds("p50 latency pulsartx / file", per_round(lambda x: percentile(x.latencies_ms(), 0.5))),
        Rounds("cpu-s of the window pulsartx / file", per_round(lambda x: x.cpu)),
    ])
    if invalid:
        print(f"\nINVALID: {len(invalid)} side run(s) lost, duplicated or mangled messages:")
        for line in invalid:
            print(f"  {line}")
    print(f"\ntotal {time.perf_counter() - t_all:.1f} s")
    return 1 if invalid else 0


if __name__ == "__main__":
    from common import exit_with

    exit_with(main)
