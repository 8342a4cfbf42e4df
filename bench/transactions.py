"""Transaction benchmarks: produce, read-state and read throughput. Prints ratios; asserts nothing.

    .venv/bin/python bench/transactions.py [--rounds 5] [--turn 2] [--small-rounds 5] [--small-turn 10]
                                           [--history 10000] [--read-messages 200000] [--profile]

1. Transactional produce throughput / non-transactional, with the same batching: 1 KiB
   incompressible messages, ``send_async`` with ``batching_max_messages=1000`` (and a publish delay
   long enough that only full batches, ``flush()`` or ``commit()`` cut a batch), 4 partitions. One
   unit of work is N messages then ``flush()`` (plain) or ``new_transaction()``, N messages with
   ``txn=``, ``commit()`` (transactional), with N = 10,000 (target >= 0.95) and N = 1,000 (>= 0.8).
   The sides run in turns of ``--turn`` units back to back (rotating which goes first), and every
   turn ends with the side's ``client.flush()``, timed: ``commit()`` returns at the decision and
   the markers and final TC entries are written in the background, so without it the plain side's
   next turn paid for them. The ratio is taken per round on wall time and on process CPU time, and
   printed as its median, spread and target. A transaction cannot cost less than the plain produce
   it contains: a median that beats plain by more than its spread prints LEAK IN THE BENCH.

2. Time to compute a partition's read state (a fresh ``PartitionLog`` and a fresh
   ``TransactionBuffer(...).state()``: open the log, load the buffer snapshot, fold the tail) after
   10,000 transactions / after 100. Target <= 1.5.

   HISTORY GENERATOR: writing 10,000 real transactions (a TC round trip and a marker commit each)
   would take minutes, so the history is appended straight to the partition with
   ``PartitionLog.append``: per transaction one DATA row carrying its TxnID and then its TXN_COMMIT
   marker (every 5th transaction a TXN_ABORT), ``--gen-batch`` transactions per Delta commit. A
   ``TransactionBuffer`` with the default ``snapshot_every_txns`` (100) folds after every commit, so
   snapshots are taken along the way as a live partition would take them. Both histories end with
   the same tail of 20 plain rows, 2 open transactions and 10 more transactions, so the two sides
   differ only in the history behind the snapshot. Not reproduced: one Delta commit per data batch
   and per marker (the generator has ~``2/gen-batch`` as many versions); the version counts are
   printed. Measurements alternate between the two partitions.

3. READ_COMMITTED read throughput / READ_UNCOMMITTED over the same partition holding
   ``--read-messages`` messages (128 B) in transactions of 1,000, every other one aborted (50%
   aborted data), read to the end with the client ``Reader``. Throughput counts log records passed
   per second (both levels traverse the same offsets; READ_COMMITTED returns half of them). Target
   >= 0.8. The history is generated like (2) (data + marker per transaction, one commit each); the
   two levels alternate.

4. The commit path of a 2-partition transaction (one message per partition): the number of
   sequential durable commits from ``new_transaction()`` to ``commit()``'s return (the longest chain
   of Delta commits that ran one after another; target <= 3: registration, the two appends in
   parallel, the decision), and ``commit()``'s latency p50/p99 beside a plain deltalake append's in
   the same run (target p99 <= 2x).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Rounds  # noqa: E402 (the sibling module)

TARGETS = {"produce_10k": (">=", 0.95), "produce_1k": (">=", 0.8), "read_state": ("<=", 1.5), "rc_read": (">=", 0.8),
           "critical_path": ("<=", 3.0), "commit_p99": ("<=", 2.0)}
MESSAGE_SIZE = 1024


def payloads(n: int, size: int, seed: int) -> list[bytes]:
    blob = np.random.default_rng(seed).bytes(n * size)
    return [blob[i * size:(i + 1) * size] for i in range(n)]


# ---- 1. produce ------------------------------------------------------------------------------------------


class ProduceSide:
    def __init__(self, root: str, topic: str, txn: bool, profile: bool = False):
        import pulsartx

        self.client = pulsartx.Client(root, num_coordinators=4)
        self.client.admin.create_topic(topic, 4)
        self.topic = topic
        self.producer = self.client.create_producer(topic, batching_max_messages=1000,
                                                    batching_max_publish_delay_ms=60_000)
        self.txn = txn
        self.turn_seconds: list[float] = []
        self.turn_cpu: list[float] = []
        self.messages = 0
        self.acked = 0
        self.failed: list = []
        self.prof = cProfile.Profile() if profile else None
        ok = pulsartx.Result.Ok

        def cb(res, _mid):
            if res is ok:
                self.acked += 1
            else:
                self.failed.append(res)

        self.cb = cb

    def unit(self, values: list[bytes]) -> None:
        """N messages then ``flush()`` (plain), or one transaction of N messages (transactional)."""
        send, cb = self.producer.send_async, self.cb
        if self.txn:
            txn = self.client.new_transaction()
            for v in values:
                send(v, cb, txn=txn)
            txn.commit()
        else:
            for v in values:
                send(v, cb)
            self.producer.flush()
        self.messages += len(values)

    def turn(self, units: list[list[bytes]]) -> None:
        """Units back to back, as an application runs them, then ``client.flush()``: all timed (wall
        and process CPU), so the background completion of this side's transactions (markers, final
        TC entries) is charged to this side and not to the side whose turn comes next."""
        if self.prof:
            self.prof.enable()
        w0, c0 = time.perf_counter(), time.process_time()
        for values in units:
            self.unit(values)
        self.client.flush()
        self.turn_seconds.append(time.perf_counter() - w0)
        self.turn_cpu.append(time.process_time() - c0)
        if self.prof:
            self.prof.disable()

    def check(self) -> None:
        if self.failed or self.acked != self.messages:
            raise RuntimeError(f"{self.topic}: {self.acked} acked of {self.messages}, failures {self.failed[:3]}")
        from pulsartx import MessageId

        # every message is visible at READ_COMMITTED, once (unkeyed messages go round-robin by
        # batch, so partitions need not hold a quarter each: count them all)
        n = 0
        for p in range(4):
            r = self.client.create_reader(f"{self.topic}-partition-{p}", MessageId.earliest)
            while r.has_message_available():
                r.read_next()
                n += 1
        if n != self.messages:
            raise RuntimeError(f"{self.topic}: the partitions show {n} messages, expected {self.messages}")

    def profile_report(self) -> str:
        if not self.prof:
            return ""
        s = io.StringIO()
        pstats.Stats(self.prof, stream=s).sort_stats("cumulative").print_stats(25)
        return s.getvalue()


def bench_produce(work: str, n: int, rounds: int, turn: int, seed: int, profile: bool) -> dict:
    root = os.path.join(work, f"produce-{n}")
    os.makedirs(root)
    plain = ProduceSide(root, f"plain{n}", txn=False)
    txn = ProduceSide(root, f"txn{n}", txn=True, profile=profile)
    warm = payloads(1000, MESSAGE_SIZE, seed)
    for s in (plain, txn):  # opens the TCs and the partition handles: not measured
        s.unit(warm)
        s.client.flush()
    for r in range(rounds):
        units = [payloads(n, MESSAGE_SIZE, seed + r * turn + u) for u in range(turn)]  # untimed
        for s in ((plain, txn) if r % 2 == 0 else (txn, plain)):
            s.turn(units)
    plain.check()
    txn.check()
    measured = n * rounds * turn
    # Each round's two turns ran back to back: per-round throughput ratios txn / plain.
    wall = [p / t for p, t in zip(plain.turn_seconds, txn.turn_seconds, strict=True)]
    cpu = [p / t for p, t in zip(plain.turn_cpu, txn.turn_cpu, strict=True)]
    out = {"n": n, "rounds": rounds, "turn": turn,
           "plain_msgs_s": measured / sum(plain.turn_seconds), "txn_msgs_s": measured / sum(txn.turn_seconds),
           "wall": wall, "cpu": cpu, "profile": txn.profile_report()}
    plain.client.close()
    txn.client.close()
    return out


# ---- history generator (2 and 3) ---------------------------------------------------------------------


def generate_history(plog, first_txn: int, n_txns: int, rows_per_txn: int, batch: int, value: bytes,
                     abort_every: int, tb=None) -> None:
    """Append ``n_txns`` finished transactions: their DATA rows then their marker, ``batch``
    transactions per Delta commit; fold ``tb`` after every commit (it snapshots as it goes)."""
    import pyarrow as pa

    from pulsartx.buffer.markers import MARKER_PRODUCER
    from pulsartx.log.partition import build_records
    from pulsartx.log.schema import MessageType

    for start in range(first_txn, first_txn + n_txns, batch):
        parts = []
        for i in range(start, min(first_txn + n_txns, start + batch)):
            txn = (1, i)
            parts.append(build_records([value] * rows_per_txn, producer_name="gen", txn=txn))
            aborted = abort_every and i % abort_every == abort_every - 1
            parts.append(build_records([b""], producer_name=MARKER_PRODUCER, txn=txn,
                                       msg_type=MessageType.TXN_ABORT if aborted else MessageType.TXN_COMMIT))
        plog.append(pa.concat_tables(parts))  # no producer name: no dedup, offsets assigned in order
        if tb is not None:
            tb.state()


def make_state_partition(root, name: str, n_txns: int, batch: int) -> dict:
    from pulsartx.admin.topics import TopicsAdmin
    from pulsartx.buffer.buffer import TransactionBuffer
    from pulsartx.log.partition import PartitionLog, build_records
    from pulsartx.naming import TopicName

    TopicsAdmin(root).create_topic(name, 1)
    plog = PartitionLog(root, TopicName.parse(f"{name}-partition-0"))
    tb = TransactionBuffer(plog)  # default snapshot_every_txns: snapshots along the way
    t0 = time.perf_counter()
    generate_history(plog, 0, n_txns, 1, batch, b"x" * 100, abort_every=5, tb=tb)
    gen_s = time.perf_counter() - t0
    # the common tail: plain rows, two transactions left open, ten more finished ones
    plog.append(build_records([b"p"] * 20))
    for i in range(2):
        plog.append(build_records([b"o"], producer_name="tail", txn=(2, i)))
    generate_history(plog, n_txns, 10, 1, 10, b"t", abort_every=5, tb=tb)
    s = tb.state()
    return {"name": name, "txns": n_txns, "end": plog.end_offset(), "snapshot_offset": s.snapshot_offset,
            "versions": plog.index.version, "ended": len(s.ended), "aborted": len(s.aborted),
            "ongoing": len(s.ongoing), "generate_s": gen_s}


def time_read_state(root, name: str, log_open: bool = False) -> float:
    """A fresh PartitionLog and TransactionBuffer(...).state(); with ``log_open`` the log's file
    index is loaded before the clock starts, so only the buffer (snapshot + tail) is timed."""
    from pulsartx.buffer.buffer import TransactionBuffer
    from pulsartx.log.partition import PartitionLog
    from pulsartx.naming import TopicName

    plog = PartitionLog(root, TopicName.parse(f"{name}-partition-0")) if log_open else None
    if plog is not None:
        plog.refresh()
    t0 = time.perf_counter()
    if plog is None:
        plog = PartitionLog(root, TopicName.parse(f"{name}-partition-0"))
    s = TransactionBuffer(plog).state()
    dt = time.perf_counter() - t0
    assert len(s.ongoing) == 2, s.ongoing
    return dt


def bench_read_state(work: str, big: int, small: int, batch: int, repeats: int, profile: bool) -> dict:
    from pulsartx.storage.root import StorageRoot

    root = StorageRoot.resolve(os.path.join(work, "state"))
    info = {"small": make_state_partition(root, "small", small, min(batch, small)),
            "big": make_state_partition(root, "big", big, batch)}
    times: dict[str, list[float]] = {"small": [], "big": [], "small_tb": [], "big_tb": []}
    for name in ("small", "big"):
        time_read_state(root, name)  # warm the OS cache and imports alike
    for r in range(repeats):
        for name in (("small", "big") if r % 2 == 0 else ("big", "small")):
            times[name].append(time_read_state(root, name))
            times[f"{name}_tb"].append(time_read_state(root, name, log_open=True))
    prof = ""
    if profile:
        pr = cProfile.Profile()
        pr.enable()
        time_read_state(root, "big")
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(25)
        prof = s.getvalue()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"info": info, "median_s": med, "ratio": med["big"] / med["small"],
            "ratio_tb": med["big_tb"] / med["small_tb"], "profile": prof}


# ---- 3. read throughput ------------------------------------------------------------------------------------


def read_through(client, topic: str, level: str) -> tuple[float, int]:
    from pulsartx import MessageId

    t0 = time.perf_counter()
    r = client.create_reader(topic, MessageId.earliest, isolation_level=level)
    n = 0
    for _m in r:
        n += 1
    r.close()
    return time.perf_counter() - t0, n


def bench_read(work: str, messages: int, repeats: int, profile: bool) -> dict:
    import pulsartx
    from pulsartx.log.partition import PartitionLog
    from pulsartx.naming import TopicName

    root = os.path.join(work, "read")
    os.makedirs(root)
    client = pulsartx.Client(root, num_coordinators=2)
    client.admin.create_topic("r", 1)
    plog = PartitionLog(client.root, TopicName.parse("r-partition-0"))
    per_txn = 1000
    t0 = time.perf_counter()
    generate_history(plog, 0, messages // per_txn, per_txn, 1, b"v" * 128, abort_every=2)
    gen_s = time.perf_counter() - t0
    end = plog.end_offset()
    times: dict[str, list[float]] = {"READ_COMMITTED": [], "READ_UNCOMMITTED": []}
    counts = {}
    for r in range(repeats):
        for level in (("READ_COMMITTED", "READ_UNCOMMITTED") if r % 2 == 0 else ("READ_UNCOMMITTED", "READ_COMMITTED")):
            dt, n = read_through(client, "r", level)
            times[level].append(dt)
            counts[level] = n
    if counts["READ_COMMITTED"] != messages // 2 or counts["READ_UNCOMMITTED"] != messages:
        raise RuntimeError(f"read counts {counts}, expected {messages // 2} and {messages}")
    prof = ""
    if profile:
        pr = cProfile.Profile()
        pr.enable()
        read_through(client, "r", "READ_COMMITTED")
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(20)
        prof = s.getvalue()
    client.close()
    tot = {k: sum(v) for k, v in times.items()}
    rc_rate = end * repeats / tot["READ_COMMITTED"]
    ru_rate = end * repeats / tot["READ_UNCOMMITTED"]
    return {"end": end, "generate_s": gen_s, "records_s": {"READ_COMMITTED": rc_rate, "READ_UNCOMMITTED": ru_rate},
            "returned_s": {k: counts[k] * repeats / tot[k] for k in tot},
            "returned": counts, "seconds": tot, "ratio": rc_rate / ru_rate, "profile": prof}


# ---- 4. the commit's critical path and latency ----------------------------------------------------------


def longest_chain(intervals: list[tuple[float, float]]) -> int:
    """The most commits that ran one after another (each starting after the previous ended): the
    number of sequential durable commits on the critical path (commits that overlapped ran in
    parallel and count once)."""
    count, end = 0, float("-inf")
    for a, b in sorted(intervals, key=lambda iv: iv[1]):
        if a >= end:
            count, end = count + 1, b
    return count


def bench_commit_path(work: str, n: int) -> dict:
    """2-partition transactions (one message per partition, ``send_async`` then ``commit()``), each
    beside one plain ``write_deltalake`` append of a 1-row table to a reused ``DeltaTable``,
    interleaved. Every Delta commit from ``new_transaction()`` to ``commit()``'s return is recorded
    as the interval from the start of its append (the data file's write) to the end of the put of
    ``_delta_log/<version>.json``, and the longest chain of non-overlapping ones is the critical
    path. The whole append counts, not the put alone: the put is ~50 us at the end of a ~2 ms
    append, so two appends running side by side in two threads almost never overlap in their puts,
    and counting puts alone reported parallel appends as sequential."""
    import deltalake
    import pyarrow as pa

    import pulsartx
    from pulsartx.storage import appender as appender_mod

    client = pulsartx.Client(os.path.join(work, "commit-root"))
    client.admin.create_topic("cp", partitions=2)
    producer = client.create_producer("cp", batching_max_publish_delay_ms=60_000)
    for tc in client._coordinators().all():
        tc.transactions()
    plain_uri = os.path.join(work, "commit-plain")
    row = pa.table({"offset": pa.array([0], pa.int64()), "value": pa.array([b"x"], pa.binary())})
    deltalake.write_deltalake(plain_uri, row)
    dt = deltalake.DeltaTable(plain_uri)
    intervals: list[tuple[float, float]] = []
    orig = appender_mod.DeltaAppender.append

    def spy(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return orig(self, *args, **kwargs)
        finally:
            name = threading.current_thread().name
            if not name.startswith(("pulsartx-txn-complete", "pulsartx-tc-end")):
                intervals.append((t0, time.perf_counter()))  # the background completer's are off the path

    appender_mod.DeltaAppender.append = spy
    commit_ms, plain_ms, chains = [], [], []
    try:
        for i in range(n + 5):
            intervals.clear()
            txn = client.new_transaction()
            producer.send_async(b"a", None, partition_key="0", txn=txn)
            producer.send_async(b"b", None, partition_key="1", txn=txn)
            t0 = time.perf_counter()
            txn.commit()
            t1 = time.perf_counter()
            chain = longest_chain([iv for iv in intervals if iv[0] <= t1])
            t2 = time.perf_counter()
            deltalake.write_deltalake(dt, row, mode="append")
            t3 = time.perf_counter()
            if i >= 5:  # warm-up
                commit_ms.append((t1 - t0) * 1000)
                plain_ms.append((t3 - t2) * 1000)
                chains.append(chain)
        client.flush()
    finally:
        appender_mod.DeltaAppender.append = orig
        client.close()

    def pct(v: list[float], q: float) -> float:
        return float(np.percentile(v, q))

    return {"chain": statistics.median(chains), "chain_max": max(chains),
            "commit_p50": pct(commit_ms, 50), "commit_p99": pct(commit_ms, 99),
            "plain_p50": pct(plain_ms, 50), "plain_p99": pct(plain_ms, 99)}


# ---- main ------------------------------------------------------------------------------------------------


def target_text(key: str) -> str:
    op, target = TARGETS[key]
    return f"{op} {target:.2f}"


def verdict(key: str, value: float) -> str:
    op, target = TARGETS[key]
    ok = value >= target if op == ">=" else value <= target
    return "met" if ok else "MISSED"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="turns per side of 10,000-message units (interleaved)")
    ap.add_argument("--turn", type=int, default=2, help="10,000-message units per turn")
    ap.add_argument("--small-rounds", type=int, default=5, help="turns per side of 1,000-message units")
    ap.add_argument("--small-turn", type=int, default=10, help="1,000-message units per turn")
    ap.add_argument("--history", type=int, default=10_000, help="transactions behind the big partition")
    ap.add_argument("--small-history", type=int, default=100, help="transactions behind the small partition")
    ap.add_argument("--gen-batch", type=int, default=100,
                    help="generated transactions per Delta commit (100: one buffer snapshot per commit, as live)")
    ap.add_argument("--state-repeats", type=int, default=8, help="read-state measurements per partition")
    ap.add_argument("--read-messages", type=int, default=200_000, help="messages in the read partition")
    ap.add_argument("--read-repeats", type=int, default=2, help="full reads per isolation level")
    ap.add_argument("--commits", type=int, default=200, help="2-partition transactions timed for the commit path")
    ap.add_argument("--only", choices=["produce", "state", "read", "commit"], default=None)
    ap.add_argument("--profile", action="store_true", help="cProfile the transactional/heavy side of each part")
    ap.add_argument("--dir", default=None, help="work directory (default: a fresh temp dir, removed afterwards)")
    args = ap.parse_args(argv)

    work = args.dir or tempfile.mkdtemp(prefix="pulsartx-bench-txn-")
    os.makedirs(work, exist_ok=True)
    started = time.perf_counter()
    rows: list[tuple[str, str, str, str, str]] = []
    try:
        print(f"pulsartx transaction benchmarks in {work} ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
        if args.only in (None, "produce"):
            for n, rounds, turn, key in ((10_000, args.rounds, args.turn, "produce_10k"),
                                         (1000, args.small_rounds, args.small_turn, "produce_1k")):
                res = bench_produce(work, n, rounds, turn, seed=n, profile=args.profile and n == 10_000)
                print(f"\n[1] produce, {n:,}-message units, {rounds} turns of {turn} per side, each turn ending "
                      "with client.flush(), timed (1 KiB, batches of 1000, 4 partitions)")
                print(f"    plain          {res['plain_msgs_s']:>10,.0f} msg/s")
                print(f"    transactional  {res['txn_msgs_s']:>10,.0f} msg/s  (a transaction per unit)")
                op, target = TARGETS[key]
                wall = Rounds(f"txn / plain produce, txns of {n:,} (wall)", res["wall"], op, target)
                cpu = Rounds(f"txn / plain produce, txns of {n:,} (cpu)", res["cpu"], op, target)
                print("    " + wall.line())
                print("    " + cpu.line())
                for r in (wall, cpu):
                    if r.beats_by_more_than_spread():
                        print(f"    LEAK IN THE BENCH: the transactional side beats plain produce ({r.label}: median "
                              f"{r.median:.2f}, spread {r.spread[0]:.2f}-{r.spread[1]:.2f}); some of its work "
                              "escapes its timing")
                if res["profile"]:
                    print(res["profile"])
                rows.append((f"txn produce / plain, txns of {n:,}", f"{wall.median:.2f}", target_text(key),
                             verdict(key, wall.median), f"cpu {cpu.median:.2f}, spread "
                             f"{wall.spread[0]:.2f}-{wall.spread[1]:.2f}"))
        if args.only in (None, "state"):
            res = bench_read_state(work, args.history, args.small_history, args.gen_batch, args.state_repeats,
                                   args.profile)
            print(f"\n[2] read state (fresh PartitionLog + TransactionBuffer.state()), medians of {args.state_repeats}")
            for k in ("small", "big"):
                i = res["info"][k]
                print(f"    {i['txns']:>6,} txns: {res['median_s'][k] * 1000:7.1f} ms, of which buffer alone "
                      f"{res['median_s'][k + '_tb'] * 1000:5.1f} ms  (end offset {i['end']:,}, snapshot at "
                      f"{i['snapshot_offset']:,}, {i['versions']} versions, ended {i['ended']:,}, "
                      f"aborted {i['aborted']:,}, generated in {i['generate_s']:.1f}s)")
            if res["profile"]:
                print(res["profile"])
            rows.append((f"read state after {args.history:,} / {args.small_history} txns", f"{res['ratio']:.2f}",
                         target_text("read_state"), verdict("read_state", res["ratio"]), ""))
            rows.append(("  the same, log already open (buffer alone)", f"{res['ratio_tb']:.2f}", "(report)", "-", ""))
        if args.only in (None, "read"):
            res = bench_read(work, args.read_messages, args.read_repeats, args.profile)
            print(f"\n[3] Reader over {res['end']:,} records ({args.read_messages:,} messages, 50% aborted, "
                  f"generated in {res['generate_s']:.1f}s), {args.read_repeats} reads per level")
            for level in ("READ_COMMITTED", "READ_UNCOMMITTED"):
                print(f"    {level:<16} {res['records_s'][level]:>10,.0f} records/s, returns "
                      f"{res['returned'][level]:,} messages ({res['returned_s'][level]:,.0f} msg/s, "
                      f"{res['seconds'][level]:.1f}s total)")
            if res["profile"]:
                print(res["profile"])
            rows.append(("READ_COMMITTED / READ_UNCOMMITTED read", f"{res['ratio']:.2f}",
                         target_text("rc_read"), verdict("rc_read", res["ratio"]), ""))
        if args.only in (None, "commit"):
            res = bench_commit_path(work, args.commits)
            print(f"\n[4] commit of a 2-partition transaction, {args.commits} of them, each beside a plain "
                  "deltalake append")
            print(f"    sequential durable commits on the critical path: median {res['chain']:g}, "
                  f"max {res['chain_max']}")
            print(f"    commit() latency    p50 {res['commit_p50']:6.2f} ms   p99 {res['commit_p99']:6.2f} ms")
            print(f"    deltalake append    p50 {res['plain_p50']:6.2f} ms   p99 {res['plain_p99']:6.2f} ms")
            rows.append(("sequential commits, 2-partition txn", f"{res['chain']:g}", target_text("critical_path"),
                         verdict("critical_path", res["chain"]), ""))
            ratio = res["commit_p99"] / res["plain_p99"]
            rows.append(("commit p99 / deltalake append p99", f"{ratio:.2f}", target_text("commit_p99"),
                         verdict("commit_p99", ratio), ""))
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nsummary ({time.perf_counter() - started:.0f}s)")
    print(f"    {'measure':<44} {'ratio':>6}  {'target':<8} result")
    for name, ratio, target, result, note in rows:
        print(f"    {name:<44} {ratio:>6}  {target:<8} {result:<6} {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
