"""Append throughput: the pulsartx producer against raw deltalake appends of the same Arrow batches.

    .venv/bin/python bench/append.py [--batches 100] [--batch-size 1000] [--message-size 1024] [--rounds 1]

pulsartx side: ``create_producer(batching_max_messages=batch_size)`` + ``send_async`` (+ ``flush``) on
a one-partition topic: one Delta commit per full batch, with the offset CAS and producer dedup.
deltalake side: ``write_deltalake(dt, batch, mode="append")`` with one reused ``DeltaTable``, over the
very same rows (same schema, payloads, offsets, sequence ids) pre-built as Arrow tables.
A third, informative side times ``build_records`` + ``PartitionLog.append`` alone (no client), which
splits any gap into client overhead and storage path.

The sides are interleaved batch by batch (rotating which goes first), so that load from other
processes on a shared machine hits all of them alike; wall time and process CPU time are summed per
side. ``--profile`` adds a cProfile of the producer side.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

TARGET = 0.8


def make_payloads(batches: int, batch_size: int, message_size: int, seed: int = 42) -> list[list[bytes]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batches):
        blob = rng.bytes(batch_size * message_size)  # incompressible, like real encrypted/compressed payloads
        out.append([blob[i * message_size:(i + 1) * message_size] for i in range(batch_size)])
    return out


def make_arrow_batches(payloads: list[list[bytes]], producer_name: str):
    """The rows pulsartx writes, as Arrow tables in the record schema (offsets and sequence ids
    assigned), for the raw deltalake side."""
    from pulsartx.log.partition import _finish, build_records

    tables, offset = [], 0
    now_us = int(time.time() * 1_000_000)
    for values in payloads:
        n = len(values)
        rec = build_records(values, producer_name=producer_name, sequence_ids=list(range(offset, offset + n)))
        tables.append(_finish(rec, offset, now_us))
        offset += n
    return tables


@dataclass
class Side:
    name: str
    wall: float = 0.0
    cpu: float = 0.0
    commits: int = 0
    extra: dict = field(default_factory=dict)

    def timed(self, fn, *args) -> None:
        w0, c0 = time.perf_counter(), time.process_time()
        fn(*args)
        self.wall += time.perf_counter() - w0
        self.cpu += time.process_time() - c0


class ProducerSide(Side):
    def __init__(self, workdir: str, batch_size: int, delay_ms: int | None, profile: bool):
        super().__init__("pulsartx producer (send_async)")
        from pulsartx import Client, Result

        self.client = Client(workdir)
        self.client.admin.create_topic("bench", partitions=1)
        kwargs = {} if delay_ms is None else {"batching_max_publish_delay_ms": delay_ms}
        self.producer = self.client.create_producer("bench", producer_name="bench-producer",
                                                    batching_max_messages=batch_size, **kwargs)
        self.failures: list = []
        self.acked = 0
        ok = Result.Ok

        def callback(res, _mid):
            if res is ok:
                self.acked += 1
            else:
                self.failures.append(res)

        self.callback = callback
        self.prof = cProfile.Profile() if profile else None

    def batch(self, values: list[bytes]) -> None:
        if self.prof:
            self.prof.enable()
        send, cb = self.producer.send_async, self.callback
        for v in values:
            send(v, cb)
        if self.prof:
            self.prof.disable()

    def finish(self) -> None:
        self.timed(self.producer.flush)

    def check(self, expected: int) -> None:
        from pulsartx.log.partition import PartitionLog
        from pulsartx.naming import TopicName

        self.producer.close()
        self.client.close()
        if self.failures or self.acked != expected:
            raise RuntimeError(f"producer: {self.acked} acked, {len(self.failures)} failed: {self.failures[:3]}")
        plog = PartitionLog(self.client.root, TopicName.parse("bench-partition-0"))
        if plog.end_offset() != expected:
            raise RuntimeError(f"pulsartx wrote {plog.end_offset()} messages, expected {expected}")
        self.commits = plog.index.version

    def profile_report(self) -> str:
        if not self.prof:
            return ""
        s = io.StringIO()
        pstats.Stats(self.prof, stream=s).sort_stats("cumulative").print_stats(30)
        return s.getvalue()


class LogSide(Side):
    def __init__(self, workdir: str):
        super().__init__("PartitionLog.append alone")
        from pulsartx.admin.topics import TopicsAdmin
        from pulsartx.log.partition import PartitionLog, build_records
        from pulsartx.naming import TopicName
        from pulsartx.storage.root import StorageRoot

        root = StorageRoot.resolve(workdir)
        TopicsAdmin(root).create_topic("bench", partitions=1)
        self.plog = PartitionLog(root, TopicName.parse("bench-partition-0"))
        self.build = build_records
        self.seq = 0

    def batch(self, values: list[bytes]) -> None:
        n = len(values)
        self.plog.append(self.build(values, producer_name="bench-log", sequence_ids=list(range(self.seq, self.seq + n))),
                         producer_name="bench-log")
        self.seq += n

    def finish(self) -> None:
        pass

    def check(self, expected: int) -> None:
        if self.plog.end_offset() != expected:
            raise RuntimeError(f"PartitionLog wrote {self.plog.end_offset()} messages, expected {expected}")
        self.commits = self.plog.index.version


class DeltaSide(Side):
    def __init__(self, workdir: str, tables):
        super().__init__("deltalake write_deltalake (reused dt)")
        import deltalake

        from pulsartx.log.schema import RECORD_SCHEMA

        uri = os.path.join(workdir, "raw")
        os.makedirs(uri)
        deltalake.DeltaTable.create(uri, RECORD_SCHEMA)
        self.dt = deltalake.DeltaTable(uri)
        self.write = deltalake.write_deltalake
        self.tables = tables
        self.i = 0

    def batch(self, _values) -> None:
        self.write(self.dt, self.tables[self.i], mode="append")
        self.i += 1

    def finish(self) -> None:
        pass

    def check(self, expected: int) -> None:
        import pyarrow as pa

        self.dt.update_incremental()
        rows = sum(pa.table(self.dt.get_add_actions(flatten=True)).column("num_records").to_pylist())
        if rows != expected:
            raise RuntimeError(f"deltalake wrote {rows} rows, expected {expected}")
        self.commits = self.dt.version()


def rate(n_msgs: int, n_bytes: int, seconds: float) -> str:
    return f"{n_msgs / seconds:>9,.0f} msg/s {n_bytes / seconds / 1e6:>6.1f} MB/s"


def run_round(base: str, r: int, payloads, tables, args) -> tuple[ProducerSide, DeltaSide, LogSide]:
    px = ProducerSide(os.path.join(base, f"r{r}-px"), args.batch_size, args.delay_ms, args.profile and r == 0)
    dl = DeltaSide(os.path.join(base, f"r{r}-dl"), tables)
    lg = LogSide(os.path.join(base, f"r{r}-log"))
    sides = [px, dl, lg]
    for i, values in enumerate(payloads):
        for k in range(len(sides)):
            s = sides[(i + k) % len(sides)]
            s.timed(s.batch, values)
    for s in sides:
        s.finish()
    expected = sum(len(v) for v in payloads)
    for s in sides:
        s.check(expected)
    return px, dl, lg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=100, help="number of batches (= Delta commits) per side")
    ap.add_argument("--batch-size", type=int, default=1000, help="messages per batch")
    ap.add_argument("--message-size", type=int, default=1024, help="payload bytes per message")
    ap.add_argument("--rounds", type=int, default=1, help="repeat everything in fresh tables")
    ap.add_argument("--delay-ms", type=int, default=1000,
                    help="producer batching_max_publish_delay_ms (default 1000, so every batch is the "
                    "--batch-size messages the target is about; with the client's 10 ms a loaded machine "
                    "splits batches by time and the producer makes more, smaller commits than the raw side)")
    ap.add_argument("--dir", default=None, help="work directory (default: a fresh temp dir, removed afterwards)")
    ap.add_argument("--profile", action="store_true", help="cProfile the producer's send_async calls (round 0)")
    args = ap.parse_args(argv)

    n_msgs = args.batches * args.batch_size
    n_bytes = n_msgs * args.message_size
    try:
        load = f" load avg {os.getloadavg()[0]:.1f},"
    except OSError:
        load = ""
    print(f"append bench: {args.batches} batches x {args.batch_size} messages x {args.message_size} B "
          f"= {n_msgs:,} messages, {n_bytes / 1e6:.1f} MB payload per side; {args.rounds} round(s); "
          f"{os.cpu_count()} CPU(s),{load} sides interleaved per batch")
    payloads = make_payloads(args.batches, args.batch_size, args.message_size)
    tables = make_arrow_batches(payloads, "bench-producer")

    base = args.dir or tempfile.mkdtemp(prefix="pulsartx-bench-")
    ratios, cpu_ratios, report = [], [], ""
    try:
        for r in range(args.rounds):
            px, dl, lg = run_round(base, r, payloads, tables, args)
            report = report or px.profile_report()
            print(f"round {r}:")
            for s in (px, dl, lg):
                print(f"  {s.name:38s} wall {s.wall:6.2f} s {rate(n_msgs, n_bytes, s.wall)}   "
                      f"cpu {s.cpu:6.2f} s   {s.commits} commits")
            ratios.append(dl.wall / px.wall)
            cpu_ratios.append(dl.cpu / px.cpu)
            print(f"  storage path alone vs deltalake: {dl.wall / lg.wall:.2f}; client overhead: "
                  f"{100 * (px.wall - lg.wall) / px.wall:.0f}% of producer wall time")
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)

    ratio = float(np.median(ratios))
    print(f"cpu-time ratio pulsartx/deltalake = {float(np.median(cpu_ratios)):.2f}")
    print(f"ratio pulsartx/deltalake = {ratio:.2f} (target >= {TARGET})"
          f"{'' if ratio >= TARGET else '  BELOW TARGET'}{'  [median of rounds]' if args.rounds > 1 else ''}")
    if report:
        print("\ncProfile of the producer's send_async calls (cumulative):")
        print(report)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    from common import exit_with

    exit_with(main)
