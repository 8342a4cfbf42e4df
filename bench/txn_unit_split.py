"""Where a transactional produce unit's cost goes beside a plain one. Prints figures; asserts nothing.

    .venv/bin/python bench/txn_unit_split.py [--n 1000] [--units 150] [--warmup 5] [--sides txn,plain] [--keyed]

The unit is bench/transactions.py's: ``--n`` 1 KiB messages with ``send_async`` (batches of 1,000,
a publish delay long enough that only full batches, ``flush()`` or ``commit()`` cut one) to a topic
of 4 partitions (``--keyed``: each message with its own key, so the 4 partitions fill side by side
instead of one batch after another), then ``flush()`` (plain) or ``commit()`` (transactional);
``--units`` of them back to back in one process on a fresh local root, then ``client.flush()`` (so
the background markers and final TC entries count). Each side prints per unit:

- wall and process CPU (``time.process_time``: every thread);
- CPU by thread, read from ``/proc/self/task`` and named by ``threading`` (MainThread is the
  caller's critical path; ``pulsartx-txn-complete`` the background completer: markers, final TC
  entries; ``pulsartx-txn`` the helpers: registrations begun beside a filling batch, parallel
  flushes; ``pulsartx-checkpoint``);
- Delta commits per table, counted as commit files created under each ``_delta_log``.

CPU and counts are the steady evidence on a shared machine; wall figures move with its load.
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import tempfile
import threading
import time

import numpy as np

_names: dict[str, str] = {}


def thread_cpu_ticks() -> dict[str, tuple[str, int]]:
    """Every thread of this process: {tid: (name, user+system clock ticks)}."""
    for th in threading.enumerate():
        _names[str(th.native_id)] = th.name
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        out[tid] = (_names.get(tid) or comm, int(fields[11]) + int(fields[12]))
    return out


def commits_per_table(root: str) -> collections.Counter:
    found: collections.Counter = collections.Counter()
    for base, _dirs, names in os.walk(root):
        if os.path.basename(base) == "_delta_log":
            table = os.path.relpath(os.path.dirname(base), root)
            found[table] += sum(1 for n in names if n.endswith(".json") and n[0].isdigit())
    return found


def group(name: str) -> str:
    """A pool thread's name without its number: ``pulsartx-txn_3`` -> ``pulsartx-txn``."""
    return name.split(" ")[0].rstrip("0123456789_-()")


def run(side: str, n: int, units: int, warmup: int, work: str, keyed: bool = False) -> None:
    import pulsartx

    root = os.path.join(work, side)
    client = pulsartx.Client(root, num_coordinators=4)
    client.admin.create_topic("t", 4)
    prod = client.create_producer("t", batching_max_messages=1000, batching_max_publish_delay_ms=60_000)
    blob = np.random.default_rng(1).bytes(n * 1024)
    values = [blob[i * 1024:(i + 1) * 1024] for i in range(n)]
    keys = [str(i) if keyed else None for i in range(n)]

    def unit() -> None:
        if side == "txn":
            txn = client.new_transaction()
            for v, k in zip(values, keys, strict=True):
                prod.send_async(v, None, partition_key=k, txn=txn)
            txn.commit()
        else:
            for v, k in zip(values, keys, strict=True):
                prod.send_async(v, None, partition_key=k)
            prod.flush()

    for _ in range(warmup):
        unit()
    client.flush()
    before, ticks0 = commits_per_table(root), thread_cpu_ticks()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(units):
        unit()
    client.flush()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    ticks1, after = thread_cpu_ticks(), commits_per_table(root)
    by_thread: collections.Counter = collections.Counter()
    for tid, (name, t) in ticks1.items():
        by_thread[group(name)] += t - ticks0.get(tid, (name, 0))[1]
    hz = os.sysconf("SC_CLK_TCK")
    per = 1e3 / units
    print(f"{side}: wall {wall * per:.2f} ms/unit, process CPU {cpu * per:.2f} ms/unit")
    print("  CPU by thread (ms/unit): " + ", ".join(f"{k} {v / hz * per:.2f}" for k, v in by_thread.most_common() if v))
    commits = {k: (after[k] - before.get(k, 0)) / units for k in after if after[k] != before.get(k, 0)}
    tc = sum(v for k, v in commits.items() if k.startswith("coordinator"))
    parts = sum(v for k, v in commits.items() if k.startswith("topics"))
    print(f"  Delta commits per unit: TC logs {tc:.2f}, partitions {parts:.2f}")
    client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--units", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--sides", default="txn,plain")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keyed", action="store_true", help="a key per message: the partitions fill side by side")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="txn-unit-split-", dir=a.dir)
    try:
        for side in a.sides.split(","):
            run(side, a.n, a.units, a.warmup, work, a.keyed)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
