"""The storage requests on ``commit()``'s path, one after another, and the latency floor they set.

Usage: python bench/commit_path.py [--latency-ms 20] [--txns 7] [--partitions 2] [--messages 10]
           [--shape 20:100]

Why: ``bench/scale.py --store-latency 20:100`` judges p99 ``commit()`` against p99 of one
conditional put (target <= 2). How far a design can get is set by how many requests its commit
makes *in sequence*: requests made side by side cost the slowest of them, requests made one after
another cost their sum. This bench makes that count visible instead of inferring it from a ratio.

It runs ``scale.py``'s transaction (``--messages`` messages over ``--partitions`` one-partition
topics, then ``commit()``) under a fixed injected latency of ``--latency-ms`` per storage call
(pulsartx.storage.faults, the fail points under all of our storage calls), with the background
completion of the previous transaction finished first, and logs every storage call made between
``commit()``'s call and its return. Calls that start within half a latency of a step's first call
are one step (they run side by side); each later call starts a new one. It prints one commit's
chain, the step count of each commit, and, for that chain, the p99 of ``commit()`` ÷ the p99 of
one request that a log-normal latency of ``--shape`` (median:p99 ms, scale.py's) gives by
simulation, each step costing the slowest of its calls. That simulated ratio is the floor of the
design: what the ratio would be if our code cost no CPU at all.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pulsartx.storage import faults  # noqa: E402

SIMULATED = 100_000


def table_of(path: str, root: str) -> str:
    """The table a call went to, and what it wrote there (a commit or a data file)."""
    rel = path.replace(root, "").lstrip("/")
    kind = "commit" if "_delta_log" in rel else "data file"
    table = rel.split("/_delta_log")[0] if "_delta_log" in rel else os.path.dirname(rel)
    return f"{table} ({kind})"


def steps_of(calls: list[dict], gap_s: float) -> list[list[dict]]:
    steps: list[list[dict]] = []
    for c in sorted(calls, key=lambda c: c["t"]):
        if steps and c["t"] - steps[-1][0]["t"] < gap_s:
            steps[-1].append(c)
        else:
            steps.append([c])
    return steps


def simulated_ratio(widths: list[int], median_ms: float, p99_ms: float) -> float:
    """p99 of a chain of steps (each the slowest of ``width`` requests) ÷ p99 of one request."""
    sigma = math.log(p99_ms / median_ms) / 2.326
    rng = random.Random(7)

    def one() -> float:
        return median_ms * math.exp(rng.gauss(0.0, sigma))

    chains = sorted(sum(max(one() for _ in range(w)) for w in widths) for _ in range(SIMULATED))
    singles = sorted(one() for _ in range(SIMULATED))
    return chains[int(0.99 * SIMULATED)] / singles[int(0.99 * SIMULATED)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latency-ms", type=float, default=20.0, help="fixed latency of every storage call")
    ap.add_argument("--txns", type=int, default=7, help="commits traced (after 5 untraced)")
    ap.add_argument("--partitions", type=int, default=2, help="one-partition topics a transaction writes")
    ap.add_argument("--messages", type=int, default=10, help="messages per transaction, spread over the topics")
    ap.add_argument("--shape", default="20:100", help="median:p99 ms of the simulated log-normal latency")
    args = ap.parse_args()
    median_ms, p99_ms = (float(x) for x in args.shape.split(":"))

    import pulsartx

    work = tempfile.mkdtemp(prefix="pulsartx-bench-commit-path-")
    root = os.path.join(work, "root")
    trace = os.path.join(work, "calls.jsonl")
    client = pulsartx.Client(root)
    for tc in client._coordinators().all():
        tc.transactions()  # open every TC before tracing, as scale.py does before its clock
    producers = [client.create_producer(f"path-{i}") for i in range(args.partitions)]

    def one(seq: int) -> float:
        txn = client.new_transaction()
        for k in range(args.messages):
            producers[k % len(producers)].send_async(f"{seq}:{k}".encode(), None, txn=txn)
        t0 = time.perf_counter()
        txn.commit()
        return time.perf_counter() - t0

    for seq in range(5):
        one(seq)
    client.flush()
    latency = args.latency_ms / 1000
    faults.install([faults.Fault(op, faults.Mode.LATENCY, delay_s=latency, p99_s=latency) for op in faults.STORE_OPS])
    os.environ[faults.LOG_ENV] = trace
    commits: list[tuple[float, list[list[dict]]]] = []
    try:
        for seq in range(5, 5 + args.txns):
            client.flush()  # the previous transaction's markers and final entry: not on this path
            start = os.path.getsize(trace) if os.path.exists(trace) else 0
            began = time.time()
            took = one(seq)
            ended = time.time()
            with open(trace) as f:
                f.seek(start)
                calls = [c for c in map(json.loads, f) if began <= c["t"] <= ended]
            commits.append((took, steps_of(calls, latency / 2)))
    finally:
        faults.clear()
        os.environ.pop(faults.LOG_ENV, None)
        client.close()

    took, chain = commits[len(commits) // 2]
    print(f"commit() of {args.messages} messages to {args.partitions} partitions, every storage call "
          f"taking {args.latency_ms:g} ms; one commit ({took * 1000:.1f} ms):")
    for i, step in enumerate(chain, 1):
        what = Counter(f"{c['op']} {table_of(c['path'], root)}" for c in step)
        print(f"  step {i}: " + "; ".join(f"{n} x {w}" if n > 1 else w for w, n in sorted(what.items())))
    counts = [len(c) for _, c in commits]
    times = [t * 1000 for t, _ in commits]
    print(f"sequential steps per commit over {len(commits)} commits: {counts}; commit() median "
          f"{statistics.median(times):.1f} ms = {statistics.median(times) / args.latency_ms:.2f} latencies")
    widths = [len(s) for s in chain]
    floor = simulated_ratio(widths, median_ms, p99_ms)
    print(f"floor of p99 commit() / p99 one request at {args.shape} ms, this chain (step widths {widths}), "
          f"no CPU: {floor:.2f} (simulated; scale.py's target <= 2)")


if __name__ == "__main__":
    main()
