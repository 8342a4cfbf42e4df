"""Acknowledgement-only transactions back to back: CPU and durable commits per transaction.

    .venv/bin/python bench/ack_only.py [--txns 200] [--per-txn 10] [--cumulative]

One one-partition topic, pre-seeded (untimed) with ``txns x per-txn`` messages, one Exclusive
subscription. Each transaction: receive ``per-txn`` messages, acknowledge them with the
transaction (one call: a list, or cumulatively on the last with ``--cumulative``), commit. Reports
process CPU (``time.process_time``) per transaction over the loop and the final ``client.flush()``,
wall time (noisy on a shared machine), and the durable commits (TC log, subscription) per
transaction, counted by wrapping ``KeyedLog.put``; ``--isolated`` also reports the commits between
one transaction's begin and its ``commit()`` returning, with its predecessor's completion flushed
first (the critical path: those commits run one after another).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter

import pulsartx
from pulsartx import InitialPosition
from pulsartx.storage.keyed_log import KeyedLog

SEEN: list[str] = []


def _count_puts() -> None:
    original = KeyedLog.put

    def put(log, rows, *args, **kwargs):
        out = original(log, rows, *args, **kwargs)
        if rows:
            SEEN.append("tc" if log.name.startswith("tc-") else "sub" if log.name.startswith("sub-") else "other")
        return out

    KeyedLog.put = put


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--txns", type=int, default=200)
    ap.add_argument("--per-txn", type=int, default=10)
    ap.add_argument("--cumulative", action="store_true")
    ap.add_argument("--isolated", type=int, default=20, help="transactions measured alone for the critical path")
    args = ap.parse_args()
    _count_puts()
    root = tempfile.mkdtemp(prefix="ack-only-")
    client = pulsartx.Client(root, num_coordinators=1)
    client.admin.create_topic("ao", 1)
    p = client.create_producer("ao")
    n = (args.txns + args.isolated + 1) * args.per_txn
    for i in range(n):
        p.send_async(f"m{i}".encode(), None)
    p.flush()
    cons = client.subscribe("ao", "s", initial_position=InitialPosition.Earliest)

    def receive() -> list:
        return [cons.receive(5000) for _ in range(args.per_txn)]

    def acknowledge_and_commit(msgs: list) -> None:
        txn = client.new_transaction()
        if args.cumulative:
            cons.acknowledge_cumulative(msgs[-1], txn=txn)
        else:
            cons.acknowledge(msgs, txn=txn)
        txn.commit()

    def one() -> None:
        acknowledge_and_commit(receive())

    one()  # warm: the TxnID block, the stores
    client.flush()
    paths = []
    for _ in range(args.isolated):
        msgs = receive()
        client.flush()
        mark = len(SEEN)
        acknowledge_and_commit(msgs)
        paths.append(",".join(SEEN[mark:]))
    client.flush()
    mark = len(SEEN)
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(args.txns):
        one()
    client.flush()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    counts = Counter(SEEN[mark:])
    print(json.dumps({
        "txns": args.txns, "per_txn": args.per_txn, "cumulative": args.cumulative,
        "cpu_ms_per_txn": round(1000 * cpu / args.txns, 2), "wall_ms_per_txn": round(1000 * wall / args.txns, 2),
        "tc_commits_per_txn": round(counts["tc"] / args.txns, 2),
        "sub_commits_per_txn": round(counts["sub"] / args.txns, 2),
        "critical_path": dict(Counter(paths)),
    }))
    client.close()


if __name__ == "__main__":
    main()
