"""READ_COMMITTED Spark reads of transactional data written by Spark jobs: ``spark.read.format("pulsartx")``
against a minimal Python Arrow data source over the same parquet files (and ``spark.read.parquet``).

    .venv/bin/python bench/spark_read.py [--rows 2000000] [--value-size 100] [--jobs 2] [--rounds 5]

Setup: ``--jobs`` committed ``df.write.format("pulsartx")`` jobs (one transaction each) of
``--rows / --jobs`` rows of ``--value-size`` random bytes into a 4-partition topic, plus one small
aborted job, so a READ_COMMITTED read has commit markers with entry lists and aborted data to
filter. Sides (every column of every row produced, ``write.format("noop")``):

* ``pulsartx RC``: ``spark.read.format("pulsartx")``, READ_COMMITTED (the default);
* ``pulsartx RU``: the same with ``isolationLevel=READ_UNCOMMITTED`` (no transaction filtering);
* ``arrow same schema``, ``arrow whole files``, ``arrow 6 columns`` and ``spark parquet``: as in
  bench/read.py, over the partition tables' current data files (they return the aborted rows and
  marker rows too, which READ_COMMITTED drops).

Sides run in ``--rounds`` interleaved rounds (5 by default), rotating which goes first; every ratio
is taken per round and printed as its median, spread (min-max) and target. The targets are
pulsartx RC ÷ arrow same schema >= 0.95 and pulsartx RC ÷ spark parquet >= 0.9 (throughput ratios;
nothing is asserted; bench/read.py says why the other variants are informative only).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from read import (  # noqa: E402 (the sibling bench module)
    PARTITIONS,
    STORED,
    arrow_reader_sides,
    data_files,
    interleave,
    read_breakdown,
    register_arrow_reader,
    report,
    session,
)

TOPIC = "txbench"
TARGETS = {"arrow same schema": 0.95, "spark parquet": 0.9}


def write_jobs(spark, root: str, rows: int, value_size: int, jobs: int) -> None:
    from pyspark.sql import functions as F

    import pulsartx

    client = pulsartx.Client(root)
    client.admin.create_topic(TOPIC, PARTITIONS)
    client.close()
    digest = F.concat(*[F.unhex(F.sha2(F.concat(F.lit(f"{i}:"), F.col("id").cast("string")), 512))
                        for i in range(value_size // 64 + 1)])
    per = rows // jobs
    for j in range(jobs):
        df = spark.range(j * per, (j + 1) * per, numPartitions=4).select(
            F.substring(digest, 1, value_size).alias("value"),
            F.when(F.col("id") % 3 == 0, F.concat(F.lit("key-"), (F.col("id") % 100).cast("string"))).alias("__key"))
        df.write.format("pulsartx").mode("append").option("service.url", root).option("topic", TOPIC).save()
    # One aborted job: its rows stay in the files and READ_COMMITTED must drop them.
    from pyspark import TaskContext

    def boom(v):  # no type hints: pyspark would try to infer an Arrow UDF from them
        if TaskContext.get().partitionId() == 3:
            raise RuntimeError("abort this job")
        return v

    bad = spark.range(20_000, numPartitions=4).select(F.udf(boom, "binary", useArrow=False)(digest).alias("value"))
    spark.sparkContext.setLogLevel("OFF")  # the injected task failure's stack traces
    try:
        bad.write.format("pulsartx").mode("append").option("service.url", root).option("topic", TOPIC).save()
    except Exception:
        pass
    spark.sparkContext.setLogLevel("ERROR")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the median counts)")
    ap.add_argument("--warmup", type=int, default=2, help="interleaved rounds run first and not counted")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--breakdown", action="store_true", help="time the read path's steps outside Spark")
    ap.add_argument("--dir", default=None, help="keep the written data here and reuse it when it exists "
                    "(default: a fresh temp dir, removed afterwards)")
    ap.add_argument("--breakdown-only", action="store_true", help="write (or reuse) the data, print the breakdown")
    args = ap.parse_args()

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-spark-read-"))
    root = str(base / "root")
    if args.breakdown_only and (base / "root").exists():
        read_breakdown(root, TOPIC, repeat=2)
        return
    spark = session(args.master, "pulsartx-bench-spark-read")
    try:
        t0 = time.perf_counter()
        if not (base / "root").exists():
            write_jobs(spark, root, args.rows, args.value_size, args.jobs)
        groups = data_files(root, TOPIC, PARTITIONS)
        listing = base / "files.json"
        listing.write_text(json.dumps(groups))
        register_arrow_reader(spark)
        flat = [f for g in groups for f in g]

        def pulsartx(level: str):
            return lambda: (spark.read.format("pulsartx").option("service.url", root).option("topic", TOPIC)
                            .option("isolationLevel", level).load())

        rc = pulsartx("READ_COMMITTED")().count()
        ru = pulsartx("READ_UNCOMMITTED")().count()
        print(f"{args.jobs} committed jobs + 1 aborted: {rc:,} rows READ_COMMITTED, {ru:,} READ_UNCOMMITTED, in "
              f"{len(flat)} files; written in {time.perf_counter() - t0:.1f}s", flush=True)
        sides = {
            "pulsartx RC": pulsartx("READ_COMMITTED"),
            "pulsartx RU": pulsartx("READ_UNCOMMITTED"),
            **arrow_reader_sides(spark, listing),
            "spark parquet": lambda: spark.read.parquet(*flat).select(*STORED),
        }
        if args.breakdown_only:
            read_breakdown(root, TOPIC, repeat=2)
            return
        print(f"{args.rounds} interleaved round(s) on {args.master}; load average {os.getloadavg()[0]:.1f}", flush=True)
        times = interleave(sides, args.rounds, args.warmup)
        report(times, rc, "pulsartx RC", TARGETS)
        if args.breakdown:
            read_breakdown(root, TOPIC)
    finally:
        spark.stop()
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
