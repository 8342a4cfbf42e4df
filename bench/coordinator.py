"""Transaction coordinator benchmarks. Prints what one run measured; asserts nothing.

    .venv/bin/python bench/coordinator.py [--round-trips 100] [--finished 10000] [--small 100]
                                          [--batch 5] [--seconds 8] [--procs 4] [--tcs 16]

1. Empty transaction round trip (``new_transaction()`` + ``commit()``, no participant) divided by one
   plain ``write_deltalake(dt, <1-row table>, mode="append")`` with a reused ``DeltaTable`` on the
   same storage. The two are interleaved one for one, so background load hits both alike; the ratio
   is of medians. Target <= 1: an empty transaction is one TC-log commit (its final entry; the
   TxnID comes from a block reserved once per 1,000).

2. Opening a TC (fresh Client, ``_coordinators().tc(0)``: load the log, replay it, recovery sweep)
   after ``--finished`` finished transactions, divided by the same after ``--small``. Target <= 1.5:
   with ``finished_retention_ms=0`` compaction trims finished transactions, so opening costs the
   snapshot plus the tail, not the history.

   HISTORY GENERATOR: ~40 ms per real transaction would make 10,000 of them take 400 s, so the
   history is written straight into the TC log (``TransactionLog.log.put``): ``--batch``
   transactions per Delta commit, each as its three real entries (NEW/OPEN, UPDATE/COMMITTING,
   UPDATE/COMMITTED, seq 0..2, one partition), the TxnID counter advanced in the same commit, and
   compaction run exactly as the TC runs it (``maybe_compact`` after every commit, every
   ``compact_every`` files). Both histories then get one final compaction and the same tail of 20
   real transactions through the TC API, so the two opens differ only in the history behind the
   snapshot. What the generator does NOT reproduce: a real TC makes 3 Delta commits per
   transaction, i.e. 3*batch times more versions and removed-file tombstones than here; the Delta
   table's version count and tombstones are printed for both sides so that can be judged.

3. Transactions per second (empty begin + commit, each process its own Client, each on the TC
   log it leases, of ``--tcs``) with ``--procs`` processes divided by 1 process, each for
   ``--seconds`` after a common start signal. Target >= 1.5 with 4 processes on 16 TCs: an empty
   transaction is one TC-log commit, so it waits on storage as much as it computes and scales
   past the machine's cores (printed); before leases every process wrote every log (0.32-0.58).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from common import collect, finish_worker, percentile, release, signal_ready, start_workers, wait_go

TARGETS = {"round_trip": ("<=", 1.0), "tc_open": ("<=", 1.5)}


# ---- 1. round trip ------------------------------------------------------------------------------------


def bench_round_trip(work: str, n: int) -> dict:
    import deltalake
    import pyarrow as pa

    import pulsartx

    root = os.path.join(work, "rt-root")
    os.makedirs(root)
    client = pulsartx.Client(root, num_coordinators=1)
    plain_uri = os.path.join(work, "plain-table")
    row = pa.table({"offset": pa.array([0], pa.int64()), "value": pa.array([b"x"], pa.binary())})
    deltalake.write_deltalake(plain_uri, row, mode="append")
    dt = deltalake.DeltaTable(plain_uri)
    for _ in range(10):  # warm up both (TC open, first checkpoint paths, page cache)
        client.new_transaction().commit()
        deltalake.write_deltalake(dt, row, mode="append")
    txn_s, plain_s, begin_s = [], [], []
    for i in range(n):
        for side in ((0, 1) if i % 2 else (1, 0)):
            t0 = time.perf_counter()
            if side == 0:
                txn = client.new_transaction()
                t1 = time.perf_counter()
                txn.commit()
                txn_s.append(time.perf_counter() - t0)
                begin_s.append(t1 - t0)
            else:
                deltalake.write_deltalake(dt, row, mode="append")
                plain_s.append(time.perf_counter() - t0)
    return {"txn_ms": 1000 * statistics.median(txn_s), "begin_ms": 1000 * statistics.median(begin_s),
            "plain_ms": 1000 * statistics.median(plain_s), "txn_p90_ms": 1000 * percentile(txn_s, 0.9),
            "plain_p90_ms": 1000 * percentile(plain_s, 0.9),
            "ratio": statistics.median(txn_s) / statistics.median(plain_s)}


# ---- 2. TC open after a long history -------------------------------------------------------------------


def generate_history(root_url: str, n: int, batch: int, compact_every: int) -> dict:
    """Write ``n`` finished transactions into TC 0's log directly (see the module docstring)."""
    from pulsartx.coordinator.coordinator import now_ms
    from pulsartx.coordinator.state import MetadataOp, TxnMeta, TxnStatus
    from pulsartx.coordinator.tclog import COUNTER_APP_ID, TransactionLog, meta_to_row
    from pulsartx.coordinator.txnid import TxnID
    from pulsartx.storage.root import StorageRoot

    tl = TransactionLog(StorageRoot.resolve(root_url), 0, compact_every=compact_every, finished_retention_ms=0).open()
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        rows = []
        ids = range(start, min(n, start + batch))
        for i in ids:
            t = now_ms()
            m = TxnMeta(TxnID(0, i), TxnStatus.OPEN, 60_000, t, t, partitions=frozenset({"persistent://b/h/p-partition-0"}))
            c1 = m.transition(TxnStatus.COMMITTING, t)
            c2 = c1.transition(TxnStatus.COMMITTED, t)
            rows += [meta_to_row(m, MetadataOp.NEW, None), meta_to_row(c1, MetadataOp.UPDATE, TxnStatus.OPEN),
                     meta_to_row(c2, MetadataOp.UPDATE, TxnStatus.COMMITTING)]
        tl.log.put(rows, extra_app_ids={COUNTER_APP_ID: ids[-1]})
        tl.maybe_compact(now_ms())
    tl.log.compact(lambda r: not TxnStatus(r["new_status"]).is_final)  # the TC just took a snapshot
    return {"generate_s": time.perf_counter() - t0, "counter": tl.counter}


def delta_shape(root_url: str) -> dict:
    """Version count, active files and tombstones (removed files still listed) of TC 0's log."""
    import deltalake

    from pulsartx.coordinator.tclog import tc_segments
    from pulsartx.storage.root import StorageRoot

    dt = deltalake.DeltaTable(StorageRoot.resolve(root_url).uri(*tc_segments(0)))
    removed = 0
    log_dir = os.path.join(root_url, *tc_segments(0), "_delta_log")
    for name in os.listdir(log_dir):
        if name.endswith(".json"):
            with open(os.path.join(log_dir, name)) as f:
                removed += sum(1 for line in f if '"remove"' in line)
    return {"version": dt.version(), "active_files": len(dt.file_uris()), "tombstones": removed}


def bench_tc_open(work: str, sizes: list[int], batch: int, repeats: int) -> dict:
    import pulsartx
    from pulsartx.coordinator.coordinator import CoordinatorConfig

    cfg = CoordinatorConfig(finished_retention_ms=0)
    out = {}
    for n in sizes:
        root = os.path.join(work, f"open-{n}")
        os.makedirs(root)
        pulsartx.Client(root, num_coordinators=1, coordinator_config=cfg)._coordinators().tc(0)
        gen = generate_history(root, n, batch, cfg.compact_every)
        tail = pulsartx.Client(root, coordinator_config=cfg)
        for _ in range(20):  # the same real tail on both sides
            tail.new_transaction().commit()
        times, files, rows = [], None, None
        for _ in range(repeats):
            c = pulsartx.Client(root, coordinator_config=cfg)
            t0 = time.perf_counter()
            tc = c._coordinators().tc(0)
            times.append(time.perf_counter() - t0)
            files, rows = tc.txlog.log.files_since_compaction, len(tc.txlog.log.rows)
            assert tc.txlog.counter == n - 1 + cfg.id_block_size  # the tail reserved one block after the history
        out[n] = {"open_ms": 1000 * statistics.median(times), "files_read": files, "rows": rows, **gen,
                  **delta_shape(root)}
    return out


# ---- 3. throughput with several processes --------------------------------------------------------------


def worker_main(args: dict) -> None:
    """Child: empty transactions for ``seconds`` once released; prints one JSON line (bench/common.py)."""
    import pulsartx

    try:
        client = pulsartx.Client(args["root"])
        for tc in client._coordinators().all():
            tc.transactions()  # open every TC before the clock starts
        signal_ready(args)
        wait_go(args)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < args["seconds"]:
            client.new_transaction().commit()
            n += 1
        finish_worker({"txns": n, "seconds": time.perf_counter() - t0})
    except BaseException as e:  # report, never hang the parent
        finish_worker({"error": repr(e)})


def bench_throughput(work: str, procs: int, seconds: float, tcs: int) -> dict:
    import pulsartx

    root = os.path.join(work, f"tput-{procs}")
    os.makedirs(root)
    pulsartx.Client(root, num_coordinators=tcs)._coordinators().all()
    args = {"root": root, "seconds": seconds}
    children, go = start_workers(__file__, [args] * procs, work, str(procs))
    release(go)
    results = collect(children, seconds + 120)
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"throughput workers failed: {errors}")
    total = sum(r["txns"] for r in results)
    return {"txns": total, "tps": total / max(r["seconds"] for r in results)}


# ---- main ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--round-trips", type=int, default=100, help="empty transactions (and plain appends) timed")
    ap.add_argument("--finished", type=int, default=10_000, help="finished transactions behind the big TC open")
    ap.add_argument("--small", type=int, default=100, help="finished transactions behind the small TC open")
    ap.add_argument("--batch", type=int, default=5, help="generated transactions per TC-log commit")
    ap.add_argument("--open-repeats", type=int, default=5, help="fresh opens timed per history (median)")
    ap.add_argument("--seconds", type=float, default=8.0, help="duration of each throughput run")
    ap.add_argument("--procs", type=int, default=4, help="processes of the multi-process throughput run")
    ap.add_argument("--tcs", type=int, default=16, help="TCs of the throughput roots")
    ap.add_argument("--dir", default=None, help="work directory (default: a fresh temp dir, removed afterwards)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(json.loads(args.worker))
        return 0
    work = args.dir or tempfile.mkdtemp(prefix="pulsartx-bench-tc-")
    os.makedirs(work, exist_ok=True)
    t_start = time.perf_counter()
    try:
        print(f"coordinator bench in {work} ({os.cpu_count()} CPUs)")
        rt = bench_round_trip(work, args.round_trips)
        print(f"\n1. empty transaction round trip: median {rt['txn_ms']:.1f} ms (begin {rt['begin_ms']:.1f} ms, "
              f"p90 {rt['txn_p90_ms']:.1f} ms); plain deltalake append: median {rt['plain_ms']:.1f} ms "
              f"(p90 {rt['plain_p90_ms']:.1f} ms)")

        op = bench_tc_open(work, [args.small, args.finished], args.batch, args.open_repeats)
        print(f"\n2. TC open (finished_retention_ms=0, history generated {args.batch} txns per commit, see docstring):")
        for n, r in op.items():
            print(f"   {n:>6} finished: open {r['open_ms']:6.1f} ms, read {r['files_read']} files / {r['rows']} rows; "
                  f"log version {r['version']}, active files {r['active_files']}, tombstones {r['tombstones']}; "
                  f"generated in {r['generate_s']:.1f} s")
        open_ratio = op[args.finished]["open_ms"] / op[args.small]["open_ms"]

        tp1 = bench_throughput(work, 1, args.seconds, args.tcs)
        tpn = bench_throughput(work, args.procs, args.seconds, args.tcs)
        print(f"\n3. throughput on {args.tcs} TCs: 1 process {tp1['tps']:.1f} txn/s ({tp1['txns']} txns); "
              f"{args.procs} processes {tpn['tps']:.1f} txn/s ({tpn['txns']} txns)")
        scaling = tpn["tps"] / tp1["tps"]

        print("\nsummary")
        print(f"  {'measure':58s} {'ratio':>7s}  target")
        rows = [
            ("empty txn round trip / plain deltalake append", rt["ratio"], "<= 1"),
            (f"TC open after {args.finished} finished / after {args.small}", open_ratio, "<= 1.5"),
            (f"txn/s with {args.procs} processes / 1 process ({os.cpu_count()} CPUs)", scaling,
             ">= 1.5 (4 processes, 16 TCs)"),
        ]
        for name, ratio, target in rows:
            print(f"  {name:58s} {ratio:7.2f}  {target}")
        print(f"\ntotal bench time {time.perf_counter() - t_start:.0f} s")
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    from common import exit_with

    exit_with(main)
