"""Where transactions in flight wait: one process, N threads running small transactions back to back
under an injected object-store latency, with a stack sampler.

    PYTHONPATH=. .venv/bin/python bench/inflight_probe.py [--inflight 32] [--seconds 8] [--store-latency 20:100]

Prints txn/s and CPU per transaction, storage requests per transaction by kind, per log (the TC log,
each partition) its group commits, requests, mean time a group holds the log's lock and the share
of the window it is busy, and the places threads were found waiting (innermost pulsartx frame and
its caller; ``IO`` marks a storage call). Latency, not CPU, is the limit, so it is meaningful on a
busy machine; the sampler costs CPU, so take CPU figures from bench/scale.py.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import threading
import time
import traceback

import pulsartx
from pulsartx.storage import faults, group_commit


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inflight", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--store-latency", default="20:100", help="MS[:P99_MS]")
    args = ap.parse_args()
    median, _, p99 = args.store_latency.partition(":")
    root = os.path.join(tempfile.mkdtemp(prefix="inflight-probe-"), "root")
    os.makedirs(root)
    setup = pulsartx.Client(root, num_coordinators=16)
    for t in ("a", "b"):
        setup.admin.create_topic(t, 1)
    setup.close()
    client = pulsartx.Client(root)
    producers = [client.create_producer(t) for t in ("a", "b")]

    def one(seq: int) -> None:
        txn = client.new_transaction()
        for k in range(10):
            producers[k % 2].send_async(f"{seq}:{k}".encode(), None, txn=txn)
        txn.commit()

    for s in range(3):
        one(-s - 1)
    client.flush()

    stats: collections.Counter = collections.Counter()
    plain = group_commit.GroupCommit._commit_group

    def counted(self, group):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return plain(self, group)
        finally:
            stats[(self.name, "groups")] += 1
            stats[(self.name, "requests")] += len(group)
            stats[(self.name, "held")] += time.perf_counter() - t0

    group_commit.GroupCommit._commit_group = counted
    faults.install(faults.store_latency(float(median), float(p99 or median)))
    samples: collections.Counter = collections.Counter()
    stop = threading.Event()

    def sampler() -> None:
        me = threading.get_ident()
        while not stop.is_set():
            for tid, frame in sys._current_frames().items():
                thread = threading._active.get(tid)  # type: ignore[attr-defined]
                name = thread.name if thread else "?"
                if tid == me or not name.startswith(("loop", "pulsartx")):
                    continue
                stack = traceback.extract_stack(frame)
                ours = [f for f in stack if "pulsartx/" in f.filename and "/faults.py" not in f.filename]
                if not ours:
                    continue
                inner = ours[-1]
                io = any("/faults.py" in f.filename for f in stack[-3:])
                caller = f"{os.path.basename(ours[-2].filename)}:{ours[-2].lineno}" if len(ours) > 1 else ""
                samples[(name.rstrip("0123456789-_"), f"{os.path.basename(inner.filename)}:{inner.lineno} "
                         f"{(inner.line or '')[:60]}", caller, "IO" if io else "")] += 1
            time.sleep(0.005)

    done = [0]
    deadline = time.time() + args.seconds

    def loop(i: int) -> None:
        seq = i * 1_000_000
        while time.time() < deadline:
            one(seq)
            seq += 1
            done[0] += 1

    calls0 = {f.op.value: f.fired for f in faults.plan()}
    cpu0, t0 = time.process_time(), time.time()
    threading.Thread(target=sampler, daemon=True).start()
    loops = [threading.Thread(target=loop, args=(i,), name=f"loop{i}") for i in range(args.inflight)]
    for t in loops:
        t.start()
    for t in loops:
        t.join()
    elapsed, cpu = time.time() - t0, time.process_time() - cpu0
    stop.set()
    n = max(1, done[0])
    print(f"{args.inflight} in flight: {done[0]} txns in {elapsed:.1f} s = {done[0] / elapsed:.1f} txn/s, "
          f"CPU {cpu / n * 1000:.1f} ms/txn (with the sampler)")
    print("storage requests per txn:", {f.op.value: round((f.fired - calls0.get(f.op.value, 0)) / n, 2)
                                        for f in faults.plan()})
    for name in sorted({k[0] for k in stats}):
        g = stats[(name, "groups")]
        print(f"  {name}: {g} groups, {stats[(name, 'requests')]} requests, {g / n:.2f} groups/txn, "
              f"{stats[(name, 'held')] / max(1, g) * 1000:.1f} ms/group, busy {stats[(name, 'held')] / elapsed:.0%}")
    total = sum(samples.values())
    print("where threads were found (share of samples):")
    for key, count in samples.most_common(25):
        print(f"  {count / total:6.1%} {key}")
    faults.clear()
    client.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
