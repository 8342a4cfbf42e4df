"""End-to-end latency: commit() (or a plain send()) in one process to receive() in another.

    .venv/bin/python bench/e2e_latency.py [--rounds 200] [--idle-ms 50:250] [--idle-poll-max-interval-ms N]
                                          [--idle-seconds 10] [--dir DIR]

A consumer (Exclusive, one-partition topic) runs in a fresh child interpreter and idles in
``receive()``. Each round, the parent waits a random idle time (``--idle-ms``, so rounds land at
every phase of the consumer's polling, with its backoff at its cap), then either sends one message
in a transaction and commits it (the instant ``commit()`` returns is the start) or sends one plain
message (``send()``'s return is the start); the child stamps the instant ``receive()`` returns. Both
processes read ``CLOCK_MONOTONIC``, which Linux shares between processes. A message can be received
slightly before ``commit()`` returns (it is visible from the durable decision on): those rounds
count as 0.

To measure another checkout, run a copy of this file from outside this repository (it puts its
own repository first on ``sys.path``) with ``PYTHONPATH`` set to that checkout.

Beside it, in the same run and the same parent process, a plain ``write_deltalake`` append of one
row to a reused DeltaTable, once per round: the target is txn p99 <= 4 x that append's p99.

Then the child idles in ``receive()`` for ``--idle-seconds`` and reports the CPU time it used: the
cost of an idle consumer's polling. Nothing is asserted. ``--idle-poll-max-interval-ms`` is passed
to ``subscribe`` when given (leave it out to measure a version without the option).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TARGET = 4.0
TOPIC = "e2e"


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def child(root: str, rounds: int, idle_s: float, cap_ms: int | None) -> None:
    """The consumer: one ``@@RECV i t`` line per message, then ``@@IDLE {cpu, wall}``."""
    import pulsartx

    client = pulsartx.Client(root)
    kw = {} if cap_ms is None else {"idle_poll_max_interval_ms": cap_ms}
    consumer = client.subscribe(TOPIC, "bench", **kw)
    print("@@READY", flush=True)
    for _ in range(rounds):
        msg = consumer.receive()
        t = now()
        consumer.acknowledge(msg)
        print(f"@@RECV {msg.data().decode()} {t!r}", flush=True)
    time.sleep(0.5)  # the last acknowledgements are flushed by then: the idle phase is idle
    cpu0, wall0 = time.process_time(), now()
    try:
        consumer.receive(timeout_millis=int(idle_s * 1000))
    except pulsartx.Timeout:
        pass
    print("@@IDLE " + json.dumps({"cpu": time.process_time() - cpu0, "wall": now() - wall0}), flush=True)
    sys.stdout.flush()
    os._exit(0)


def pct(v: list[float], q: float) -> float:
    return float(np.percentile(v, q)) if v else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200, help="rounds per kind (transactional, plain)")
    ap.add_argument("--idle-ms", default="50:250", help="random idle time before each round, min:max ms")
    ap.add_argument("--idle-poll-max-interval-ms", type=int, default=None, help="the consumer's cap (default: its own)")
    ap.add_argument("--idle-seconds", type=float, default=10.0, help="idle phase for the CPU measure")
    ap.add_argument("--dir", default=None, help="work directory (default: a fresh temp dir, removed afterwards)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(args.child, 2 * args.rounds, args.idle_seconds, args.idle_poll_max_interval_ms)
        return 0

    import deltalake
    import pyarrow as pa

    import pulsartx

    lo, hi = (float(x) / 1000 for x in args.idle_ms.split(":"))
    base = args.dir or tempfile.mkdtemp(prefix="pulsartx-bench-e2e-")
    root = os.path.join(base, "root")
    try:
        client = pulsartx.Client(root)
        client.admin.ensure_topic(TOPIC, partitions=1)
        producer = client.create_producer(TOPIC)
        plain_uri = os.path.join(base, "plain")
        row = pa.table({"offset": pa.array([0], pa.int64()), "value": pa.array([b"x"], pa.binary())})
        deltalake.write_deltalake(plain_uri, row)
        dt = deltalake.DeltaTable(plain_uri)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", root, "--rounds", str(args.rounds),
               "--idle-seconds", str(args.idle_seconds)]
        if args.idle_poll_max_interval_ms is not None:
            cmd += ["--idle-poll-max-interval-ms", str(args.idle_poll_max_interval_ms)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
        received: dict[int, float] = {}
        idle: dict[str, float] = {}
        ready = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("@@READY"):
                    ready.set()
                elif line.startswith("@@RECV "):
                    _, i, t = line.split()
                    received[int(i)] = float(t)
                elif line.startswith("@@IDLE "):
                    idle.update(json.loads(line.split(" ", 1)[1]))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if not ready.wait(120):
            raise RuntimeError("the consumer process did not start")
        for _ in range(5):  # warm up both sides
            deltalake.write_deltalake(dt, row, mode="append")
        started: dict[int, float] = {}
        kinds = ["txn", "plain"] * args.rounds
        random.Random(7).shuffle(kinds)
        append_ms, call_ms = [], []
        for i, kind in enumerate(kinds):
            time.sleep(random.uniform(lo, hi))
            if kind == "txn":
                txn = client.new_transaction()
                producer.send(str(i).encode(), txn=txn)
                t0 = now()
                txn.commit()
            else:
                t0 = now()
                producer.send(str(i).encode())
            started[i] = now()
            call_ms.append((started[i] - t0) * 1000)
            deadline = time.monotonic() + 30
            while i not in received:  # one message in flight: rounds do not overlap
                if time.monotonic() > deadline:
                    raise RuntimeError(f"round {i} ({kind}) was not received within 30 s")
                time.sleep(0.001)
            t0 = time.perf_counter()
            deltalake.write_deltalake(dt, row, mode="append")
            append_ms.append((time.perf_counter() - t0) * 1000)
        reader.join(args.idle_seconds + 60)
        client.close()
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)

    early = sum(received[i] < started[i] for i in range(len(kinds)))
    lat = {k: [max(0.0, (received[i] - started[i]) * 1000) for i, kind in enumerate(kinds) if kind == k]
           for k in ("txn", "plain")}
    cap = args.idle_poll_max_interval_ms
    print(f"e2e latency, {args.rounds} rounds per kind, idle {args.idle_ms} ms between rounds, consumer in another "
          f"process, idle_poll_max_interval_ms={'default' if cap is None else cap}; {os.cpu_count()} CPU(s), "
          f"load avg {os.getloadavg()[0]:.1f}")
    print(f"  commit() -> receive()   p50 {pct(lat['txn'], 50):6.2f} ms   p99 {pct(lat['txn'], 99):6.2f} ms   "
          f"max {max(lat['txn']):6.2f} ms")
    print(f"  send() -> receive()     p50 {pct(lat['plain'], 50):6.2f} ms   p99 {pct(lat['plain'], 99):6.2f} ms   "
          f"max {max(lat['plain']):6.2f} ms")
    print(f"  deltalake append        p50 {pct(append_ms, 50):6.2f} ms   p99 {pct(append_ms, 99):6.2f} ms")
    print(f"  (commit() or send() itself: p50 {pct(call_ms, 50):.2f} ms, p99 {pct(call_ms, 99):.2f} ms; received "
          f"before it returned, counted as 0: {early} of {len(kinds)} rounds)")
    ratio = pct(lat["txn"], 99) / pct(append_ms, 99)
    print(f"  commit->receive p99 / append p99 = {ratio:.2f} (target <= {TARGET:g}) "
          f"{'ok' if ratio <= TARGET else 'ABOVE TARGET'}")
    if idle:
        print(f"  idle consumer: {idle['cpu']:.3f} s CPU in {idle['wall']:.1f} s = {100 * idle['cpu'] / idle['wall']:.2f}% "
              "of one core")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    from common import exit_with

    exit_with(main)
