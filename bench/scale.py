"""Multi-process scaling of small transactions, on local disk and on a Ceph RGW (S3) server.
Prints ratios beside their targets; asserts nothing.

    .venv/bin/python bench/scale.py [--procs 1,2,4,8] [--seconds 10] [--storage local|rgw|both]
                                    [--tcs 16] [--dir DIR] [--append-gap-ms 20]
                                    [--inflight 1,8,32] [--store-latency MS[:P99_MS]]
                                    [--layout shared|own|both]

For each storage, each process count P and each layout, on a fresh root (local: a directory under
``--dir``; RGW: a fresh bucket), with ``--tcs`` TCs and one-partition topics:

* P producer processes (fresh interpreters, bench/common.py) each run transactions back to back
  from a common start time for ``--seconds``. A transaction sends 10 messages with ``send_async``,
  alternately to the two topics (5 each), and commits: "10 messages to 2 partitions of 2 topics"
  read as one partition of each of 2 topics, so every transaction has two participants (as the
  2-partition commit path of bench/transactions.py). Layout ``shared``: all P processes write the
  same two topics (``scale-a``, ``scale-b``), so they race for every Delta version of the same two
  partitions. Layout ``own``: process ``w`` writes ``scale-a-<w>`` and ``scale-b-<w>``, so the
  processes share the TCs and the machine but no partition. One process is the same shape either
  way: it runs once, the baseline of both (``--layout both``, the default, runs every P > 1 both
  ways). Producers keep pulsar-client's defaults (batching delay 10 ms), so ``commit()``
  normally cuts both batches. Each process has its own Client and warms up with 3 transactions
  before it says it is ready.
* One more process (not counted in P) consumes the first topic of every producer (one topic when
  shared, P when own), each through an Exclusive subscription created before the start (position
  Earliest on an empty topic), with a blocking ``receive()`` in a thread of its own (1 s timeout,
  so the library's idle-poll backoff, capped at 200 ms, applies as it would to an application) and
  a plain acknowledgement per message. Either way it receives the same messages: those with an
  even ``k``.
* The main process, meanwhile, does plain ``deltalake.write_deltalake(<DeltaTable>, <1-row table>,
  mode="append")`` appends on the same storage (same storage options), one every
  ``--append-gap-ms``, from the start to the end of the window: the baseline sees the same machine
  load as the commits it is compared with. 20 more appends right before the processes start and 20
  right after they end (a quiet machine) are printed for comparison. The baseline moves to a fresh
  table every 50 appends (see ``PlainAppender``).

Figures:

* txn/s: transactions whose ``commit()`` returned inside the window, / ``--seconds``; and its
  ratio to P = 1 of the same storage in the same run.
* commit latency p50/p99: ``commit()`` alone (the sends before it only queue). ``txn`` p50 is
  ``new_transaction()`` to ``commit()``'s return.
* end-to-end latency p50/p99: the consumer's wall clock (``time.time()``) when ``receive()``
  returned a message, minus the producer's wall clock when the ``commit()`` of its transaction
  returned (payload ``<worker>:<seq>:<k>`` names the transaction; one machine, one clock). One
  sample per message, not per transaction. ``commit()`` returns at the decision point and markers
  are written after it in the background (docs/design/commit-at-the-decision-point.md), while a
  reader can see a decided transaction before ``commit()`` has returned to its caller: such
  messages count with a negative latency (how many is printed).
* txn/s in the last tenth of the window / the first tenth (by ``commit()`` return time). The
  target's row was measured after 150 s of load: over the default 10 s this only catches growth
  that is already fast.
* Each step is checked: every message of every committed transaction is read exactly once at
  READ_COMMITTED (every topic of the step, from the earliest position), nothing else is there, a
  commit that raised shows all or none of its messages, and the consumer received each message of
  its topics exactly once. A step that fails its check prints INVALID instead of met/MISSED.
* Where the time goes (diagnostics): CPU seconds of the producers, the consumer, the parent's
  plain appends, (RGW) the Ceph daemons and the whole machine (whatever else runs on it included),
  against the cores x seconds available; per transaction, the Delta commits (put-if-absent) made
  on the commit path and by the background completer, the ones that lost their version to another
  writer (each one is retried after reading the winner's commit) and the time spent in those puts;
  the TCs each process began its transactions on (its TC lease: distinct processes should hold
  distinct TC logs, docs/design/tc-leases.md); and the end-to-end latency of each message split
  into: until the consumer's look at the partition that fetched it began (its idle-poll backoff,
  or it was busy), that look (reading cursor, log and transaction states from storage), and the
  time it then sat in the consumer's local queue.
  Per tenth of the window: the producers' CPU per transaction, the consumer's CPU per message and
  per look, and each process's CPU by thread group (delta-rs's own threads are "(native)"), so a
  cost that grows with the history shows as a trend and names its thread.

Targets (ratios; "now" is what the multi-process scaling work started from):

    local, P processes on shared partitions: txn/s / 1 process    now 0.56-0.67   >= min(P, cores)
        ("grows up to the core count", read as: reaches it)
    p99 commit / p99 plain append (local 2-4 processes; RGW 1)   now 33-105, 11-17   <= 2
    Ceph RGW, 8 processes / 1 process                             now 0.40 (4 procs)   >= 5
    commit -> consumer in another process, p99 / p99 append       now ~200 ms          <= 4
    txn/s after 150 s of load / at the start                      now 0.62             >= 0.9

The latency and growth rows are printed for every P with the same target, the RGW txn/s ratio for
2 and 4 processes as a report. Ratios to the plain append use the appends made during the window;
the summary's ``quiet`` column gives the same ratio to the appends on the idle machine, which is
what a figure measured against an uncontended append compares with.

bench/coordinator.py (section 3) measures the remaining row of that table, empty transactions'
txn/s with 4 processes / 1 process on 16 TCs (target >= 1.5).

Transactions in flight (``--inflight``): after the process counts, one process runs N loops of
back-to-back transactions in threads sharing its Client, so N transactions are in flight together.
Without injected latency the CPU is the limit, and the rows compare CPU per transaction and txn/s
with one in flight (targets for 32: CPU per txn <= 1/4, txn/s >= 3).

Object-store latency (``--store-latency 20:100``): the transaction processes (not this one) get a
storage fail-point plan (pulsartx.storage.faults.store_latency) under which every read, listing,
put, conditional put, delete and delta-rs call waits a log-normal request latency with that median
and p99, in its own thread, as S3 requests do. Latency, not CPU, is then the limit, which a 2-core
machine can show. Each step also times ``PUT_SAMPLES`` single conditional puts at that latency and
counts the storage requests per transaction by kind. Targets: 8 processes on their own partitions
/ 1 >= 6, 32 in flight / 1 >= 16, p99 ``commit()`` / p99 conditional put <= 2 (1 process).
docs/storage.md holds the model.

The 8-process target is stated on own partitions (it was 8 processes / 1 on the shared two, which
measured 1.47). A partition is the unit of serial order, here as in Pulsar and Kafka: its Delta
versions are written one after another, so processes that share a partition queue on it, and each
version a process loses to another costs it a re-read of the winner (~36 reads per transaction at
8 processes, against 2 alone) and another try. More processes only add throughput when they add
partitions, as more producers would in Pulsar. Transactions are sharded across 16 TCs, so what
the processes still share in ``own`` is the TC count, the storage and the machine. The shared
layout's 8-process ratio is printed beside it as a report (how contention on one partition
grows), with the 1.47 it measured.

RGW is the throw-away Ceph cluster of the test suite (tests/reliability/rgw.py: installed with apt
when missing, which needs root; started on loopback). When it cannot be started the bench says why
and measures local disk only.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from common import collect, finish_worker, percentile, release, signal_ready, start_workers, verdict, wait_go

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPICS = ("scale-a", "scale-b")
MESSAGES_PER_TXN = 10
WARMUP_TXNS = 3
QUIET_APPENDS = 20
SUBSCRIPTION = "scale-e2e"
LAYOUTS = ("shared", "own")  # every process writes the same two topics, or two of its own
BACKGROUND_THREADS = ("pulsartx-txn-complete", "pulsartx-tc-end")  # the completer: off the commit path
SEQ_STRIDE = 1_000_000  # the sequence numbers of in-flight loop i start at i * SEQ_STRIDE
PUT_SAMPLES = 200  # conditional puts timed at the injected latency, the commit's yardstick


# ---- worker processes -------------------------------------------------------------------------------------


class PutSpy:
    """Counts a process's Delta commits (put-if-absent of ``_delta_log/<version>.json``) by table
    kind, by whether the background completer made them, and by whether they won their version:
    a lost one means another writer took the version and the commit was tried again."""

    def __init__(self) -> None:
        from pulsartx.storage.root import StorageRoot

        self.counts: Counter = Counter()
        self.seconds: Counter = Counter()
        self._lock = threading.Lock()
        orig = StorageRoot.put_if_absent

        def put_if_absent(root: Any, body: bytes, *segments: str) -> bool:
            t0 = time.perf_counter()
            created = orig(root, body, *segments)
            side = "bg" if threading.current_thread().name.startswith(BACKGROUND_THREADS) else "path"
            key = f"{segments[0]}/{side}/{'won' if created else 'lost'}"
            with self._lock:
                self.counts[key] += 1
                self.seconds[key] += time.perf_counter() - t0
            return created

        StorageRoot.put_if_absent = put_if_absent

    def take(self) -> dict[str, list[float]]:
        """{kind: [commits, seconds in their puts]} since the last call."""
        with self._lock:
            out = {k: [n, self.seconds[k]] for k, n in self.counts.items()}
            self.counts, self.seconds = Counter(), Counter()
        return out


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def stat_cpu_seconds(path: str) -> float | None:
    """CPU seconds (user + system) from a process's or a thread's ``/proc/.../stat`` file; None
    when it cannot be read (gone, or not Linux)."""
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    except (OSError, IndexError, ValueError):
        return None


def pids_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) the given processes have used so far, from /proc (Linux): the
    Ceph daemons share the cores with the bench, and what they use is not the bench's."""
    return sum(s for pid in pids if (s := stat_cpu_seconds(f"/proc/{pid}/stat")) is not None)


def machine_cpu_seconds() -> float:
    """CPU seconds every process on the machine has used so far (busy time of all cores, from
    /proc/stat; NaN elsewhere): what the bench's own figures leave out on a shared machine."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


class TenthSampler(threading.Thread):
    """Process CPU seconds at each tenth of the window (11 samples, start to deadline), and the
    values of ``counters`` (callables) at the same instants: what a transaction, a look or an ack
    costs in each tenth, so a cost that grows with the history shows up as a trend."""

    def __init__(self, start: float, deadline: float, counters: dict[str, Any] | None = None):
        super().__init__(name="bench-tenths", daemon=True)
        self.start_at, self.tenth = start, (deadline - start) / 10
        self.counters = counters or {}
        self.samples: list[dict[str, float]] = []
        self.start()

    def run(self) -> None:
        for i in range(11):
            time.sleep(max(0.0, self.start_at + i * self.tenth - time.time()))
            self.samples.append({"cpu": cpu_seconds(), **{k: float(f()) for k, f in self.counters.items()},
                                 **{f"thread {k}": v for k, v in thread_cpu_seconds().items()}})

    def threads(self) -> dict[str, list[float]]:
        """CPU seconds per tenth of each thread group (see :func:`thread_cpu_seconds`)."""
        names = sorted({k for s in self.samples for k in s if k.startswith("thread ")})
        out = {}
        for k in names:
            v = [s.get(k, 0.0) for s in self.samples]
            out[k.removeprefix("thread ")] = [b - a for a, b in zip(v, v[1:], strict=False)]
        return out

    def per_tenth(self, key: str = "cpu") -> list[float]:
        """Increments of ``key`` per tenth (fewer than 10 when called before the deadline)."""
        self.join(timeout=max(0.0, self.start_at + 10 * self.tenth - time.time()) + 5)
        v = [s[key] for s in self.samples]
        return [b - a for a, b in zip(v, v[1:], strict=False)]


_THREAD_CPU: dict[int, tuple[str, float]] = {}  # thread id -> (group, last CPU seconds seen)


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads, summed by name with digits dropped
    (pool threads share a group), from /proc (Linux; empty elsewhere). A thread that ended keeps
    the seconds it was last seen with, so its group does not go down."""
    names = {t.native_id: "".join(c for c in t.name if not c.isdigit()).rstrip("-_") for t in threading.enumerate()}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        tids = []
    for tid in tids:
        secs = stat_cpu_seconds(f"/proc/self/task/{tid}/stat")
        if secs is None:
            continue
        name = names.get(int(tid), _THREAD_CPU.get(int(tid), ("(native)", 0.0))[0])
        _THREAD_CPU[int(tid)] = (name, secs)
    out: dict[str, float] = {}
    for name, secs in _THREAD_CPU.values():
        out[name] = out.get(name, 0.0) + secs
    return out


def storage_calls() -> dict[str, int]:
    """Storage calls this process made so far, by kind, as counted by the --store-latency plan
    (empty without it): each one is a request to an object store."""
    from pulsartx.storage import faults

    return {f.op.value: f.fired for f in faults.plan() if f.mode is faults.Mode.LATENCY}


def worker_topics(layout: str, wid: int) -> tuple[str, ...]:
    """The two one-partition topics producer ``wid`` writes: the same two for every process
    (``shared``), or two of its own (``own``: ``scale-a-<wid>``, ``scale-b-<wid>``)."""
    return TOPICS if layout == "shared" else tuple(f"{t}-{wid}" for t in TOPICS)


def step_topics(layout: str, procs: int) -> list[str]:
    """Every topic of a step: what is created before it and read back by its check."""
    return sorted({t for w in range(procs) for t in worker_topics(layout, w)})


def consumed_topics(layout: str, procs: int) -> list[str]:
    """The topics the consumer process reads: the first topic of every producer (one topic when
    they share it), so it receives the messages with an even ``k`` of every transaction."""
    return sorted({worker_topics(layout, w)[0] for w in range(procs)})


def producer_worker(args: dict[str, Any]) -> dict[str, Any]:
    import pulsartx

    wid = args["wid"]
    client = pulsartx.Client(args["root"], storage_options=args["options"] or None)
    for tc in client._coordinators().all():
        tc.transactions()  # open every TC before the clock starts
    producers = [client.create_producer(t) for t in worker_topics(args["layout"], wid)]
    spy = PutSpy()
    tcs: Counter = Counter()  # TC id -> transactions begun on it in the window (the TxnID names its TC)

    def one(seq: int) -> tuple[float, float]:
        txn = client.new_transaction()
        if seq >= 0:
            tcs[txn.id.tc_id] += 1
        for k in range(MESSAGES_PER_TXN):
            producers[k % len(producers)].send_async(f"{wid}:{seq}:{k}".encode(), None, txn=txn)
        t0 = time.perf_counter()
        txn.commit()
        return time.perf_counter() - t0, time.time()

    for seq in range(-WARMUP_TXNS, 0):  # opens the partitions' write handles; negative: not timed
        one(seq)
    client.flush()
    spy.take()
    signal_ready(args)
    go = wait_go(args)
    time.sleep(max(0.0, go["start"] - time.time()))
    cpu0, requests0 = cpu_seconds(), storage_calls()
    tenths = TenthSampler(go["start"], go["deadline"])
    txns: list[list[float]] = []  # [seq, new_transaction() wall time, commit() seconds, commit() return wall time]
    failed: list[list[Any]] = []

    def loop(first_seq: int) -> None:
        """Transactions back to back; with ``inflight`` > 1, that many loops run in threads of
        this process, sharing its Client and producers, so that many transactions are in flight."""
        seq = first_seq
        while time.time() < go["deadline"]:
            began = time.time()
            try:
                latency, done = one(seq)
                txns.append([seq, began, latency, done])
            except Exception as e:  # reported and checked (all or nothing), never fatal
                failed.append([seq, repr(e)[:300]])
            seq += 1

    loops = [threading.Thread(target=loop, args=(i * SEQ_STRIDE,), name=f"bench-inflight-{i}")
             for i in range(args.get("inflight", 1))]
    for t in loops:
        t.start()
    for t in loops:
        t.join()
    cpu = cpu_seconds() - cpu0
    puts = spy.take()
    requests = {op: n - requests0.get(op, 0) for op, n in storage_calls().items()}
    t0 = time.perf_counter()
    flushed = client.flush(120)  # the background completion of the last transactions: after the window
    return {"wid": wid, "txns": txns, "failed": failed, "warmup": WARMUP_TXNS, "cpu_s": cpu, "puts": puts,
            "flush_s": time.perf_counter() - t0, "flushed": flushed, "requests": requests, "tcs": dict(tcs),
            "cpu_tenths": tenths.per_tenth(), "thread_tenths": tenths.threads()}


def consumer_worker(args: dict[str, Any]) -> dict[str, Any]:
    """One Exclusive consumer per topic of ``args["topics"]``, each in its own thread with the
    blocking ``receive()`` an application would run, sharing one Client."""
    import pulsartx

    client = pulsartx.Client(args["root"], storage_options=args["options"] or None)
    fills: list[tuple[float, float, bool, bool]] = []  # per look at a partition: wall s, CPU s, found, held back
    looked: dict[tuple[int, int], tuple[float, float]] = {}  # (consumer, offset) -> wall times of the look

    def subscribe(i: int, topic: str) -> Any:
        consumer = client.subscribe(topic, SUBSCRIPTION, consumer_type=pulsartx.ConsumerType.Exclusive,
                                    initial_position=pulsartx.InitialPosition.Earliest)
        plain_fill = consumer._fill

        def timed_fill(part: Any) -> None:
            t0, c0, w0, before = time.perf_counter(), time.thread_time(), time.time(), len(part.queue)
            try:
                plain_fill(part)
            finally:
                wall, cpu, w1 = time.perf_counter() - t0, time.thread_time() - c0, time.time()
                try:  # records in the log beyond what READ_COMMITTED may show: an undecided transaction holds them
                    held = part.visible.log.end_offset(refresh=False) > part.visible._end
                except Exception:
                    held = False
                fills.append((wall, cpu, len(part.queue) > before, held))
                for m in list(part.queue)[before:]:
                    looked[(i, m._offset)] = (w0, w1)

        consumer._fill = timed_fill
        return consumer

    consumers = [subscribe(i, t) for i, t in enumerate(args["topics"])]
    signal_ready(args)
    go = wait_go(args)
    cpu0 = cpu_seconds()
    got: list[list[Any]] = []  # [payload, start and end of the look that fetched it, receive() return], wall
    tenths = TenthSampler(go["start"], go["deadline"], {
        "looks": lambda: len(fills), "look_cpu": lambda: sum(f[1] for f in list(fills)), "acks": lambda: len(got)})
    done = threading.Event()

    def receive(i: int, consumer: Any) -> None:
        while not done.is_set():
            try:
                msg = consumer.receive(timeout_millis=1000)
            except pulsartx.Timeout:
                continue
            received = time.time()
            got.append([msg.data().decode(), *looked.pop((i, msg._offset), (received, received)), received])
            consumer.acknowledge(msg)

    threads = [threading.Thread(target=receive, args=(i, c), name=f"bench-consumer-{i}")
               for i, c in enumerate(consumers)]
    for t in threads:
        t.start()
    while not os.path.exists(args["stop"]):
        time.sleep(0.05)
    with open(args["stop"]) as f:
        expected = json.load(f)["expected"]
    give_up = time.monotonic() + 60
    while len(got) < expected and time.monotonic() < give_up:
        time.sleep(0.01)
    done.set()
    for t in threads:
        t.join()
    cpu = cpu_seconds() - cpu0
    for consumer in consumers:
        consumer.close()
    found = [f for f in fills if f[2]]
    empty = [f for f in fills if not f[2]]
    return {"got": got, "cpu_s": cpu, "fills": len(fills), "found_p50": percentile([f[0] for f in found], 0.5),
            "found_p99": percentile([f[0] for f in found], 0.99), "found_cpu_p50": percentile([f[1] for f in found], 0.5),
            "empty": len(empty), "empty_p50": percentile([f[0] for f in empty], 0.5),
            "empty_held": sum(1 for f in empty if f[3]),
            "tenths": {k: tenths.per_tenth(k) for k in ("cpu", "looks", "look_cpu", "acks")},
            "thread_tenths": tenths.threads()}


def worker_main(args: dict[str, Any]) -> None:
    """Child process entry (bench/common.py): one JSON line, then ``os._exit``."""
    try:
        fn = producer_worker if args["role"] == "producer" else consumer_worker
        finish_worker(fn(args))
    except BaseException as e:  # report, never hang the parent
        import traceback

        finish_worker({"error": f"{e!r}\n{traceback.format_exc()[-1500:]}"})


# ---- storage --------------------------------------------------------------------------------------------


@dataclass
class Storage:
    """Where a step's root and its plain-append table live."""

    name: str
    work: str
    server: Any = None  # tests.reliability.rgw.RGW for "rgw"
    options: dict[str, str] = field(default_factory=dict)

    def new_step(self, tag: str) -> tuple[str, str]:
        """A fresh (root URL, plain-append table URI) pair on this storage."""
        if self.server is None:
            base = os.path.join(self.work, f"{self.name}-{tag}")
            os.makedirs(os.path.join(base, "root"))
            return os.path.join(base, "root"), os.path.join(base, "plain-append")
        bucket = self.server.new_bucket(f"scale-{tag}")
        return f"s3://{bucket}/root", f"s3://{bucket}/plain-append"


def start_rgw() -> tuple[Any, str]:
    """The test suite's Ceph RGW, or None and why not."""
    sys.path.insert(0, REPO)
    try:
        from tests.reliability import rgw
    except ImportError as e:
        return None, f"cannot import tests/reliability/rgw.py: {e}"
    try:
        return rgw.start(), ""
    except rgw.RGWUnavailable as e:
        return None, str(e).splitlines()[0][:400]


# ---- one step -------------------------------------------------------------------------------------------


class PlainAppender:
    """One plain deltalake append at a time, on a reused DeltaTable (as bench/coordinator.py's
    baseline), moving to a fresh table every ``ROTATE_EVERY`` appends: ``write_deltalake`` slows as
    its table grows (median 8 ms at 50 versions, 24 ms at 400, local disk, this machine), and the
    baseline is one append, not an append to a table that the baseline itself has grown. The
    tables are created up front, so no creation falls inside a measured window."""

    ROTATE_EVERY = 50

    def __init__(self, uri: str, options: dict[str, str], appends: int):
        import deltalake
        import pyarrow as pa

        self._write = deltalake.write_deltalake
        self.row = pa.table({"offset": pa.array([0], pa.int64()), "value": pa.array([b"x"], pa.binary())})
        self.tables = []
        for i in range(appends // self.ROTATE_EVERY + 1):
            self._write(f"{uri}-{i}", self.row, mode="append", storage_options=options or None)
            self.tables.append(deltalake.DeltaTable(f"{uri}-{i}", storage_options=options or None))
        self.n = 0
        for dt in self.tables:  # warm up (connection pool, page cache); not counted against rotation
            self._write(dt, self.row, mode="append")

    def once(self) -> float:
        dt = self.tables[(self.n // self.ROTATE_EVERY) % len(self.tables)]
        self.n += 1
        t0 = time.perf_counter()
        self._write(dt, self.row, mode="append")
        return time.perf_counter() - t0

    def until(self, start: float, deadline: float, gap_s: float) -> list[float]:
        time.sleep(max(0.0, start - time.time()))
        out = []
        while time.time() < deadline:
            out.append(self.once())
            time.sleep(gap_s)
        return out


def read_committed(root: str, options: dict[str, str], topics: list[str]) -> Counter:
    """Every message of the step's topics at READ_COMMITTED, from the earliest position: payload -> count."""
    import pulsartx
    from pulsartx import MessageId

    client = pulsartx.Client(root, storage_options=options or None)
    seen: Counter = Counter()
    for topic in topics:
        reader = client.create_reader(topic, MessageId.earliest)
        for m in reader:
            seen[m.data().decode()] += 1
        reader.close()
    client.close()
    return seen


def check_step(producers: list[dict], seen: Counter, consumed: list[str]) -> tuple[bool, str]:
    """Exactly once at READ_COMMITTED, atomic failed commits, and the consumer's view of the first
    topic of every producer (the messages with an even ``k``, in either layout)."""
    committed = set()
    for r in producers:
        seqs = list(range(-r["warmup"], 0)) + [int(t[0]) for t in r["txns"]]
        committed.update((r["wid"], s) for s in seqs)
    failed = {(r["wid"], f[0]) for r in producers for f in r["failed"]}
    want = {f"{w}:{s}:{k}" for w, s in committed for k in range(MESSAGES_PER_TXN)}
    dup = sum(1 for p, n in seen.items() if n > 1)
    missing = len(want - seen.keys())
    per_failed = Counter()
    unexpected = 0
    for p in seen.keys() - want:
        w, s, _ = p.split(":")
        if (int(w), int(s)) in failed:
            per_failed[(int(w), int(s))] += 1
        else:
            unexpected += 1
    partial = sum(1 for n in per_failed.values() if n != MESSAGES_PER_TXN)
    want_a = {p for p in want if int(p.rsplit(":", 1)[1]) % len(TOPICS) == 0}
    got_a = Counter(consumed)
    c_dup = sum(1 for n in got_a.values() if n > 1)
    c_missing = len(want_a - got_a.keys())
    ok = not (dup or missing or unexpected or partial or c_dup or c_missing)
    text = (f"{len(want)} messages of {len(committed)} committed txns: missing {missing}, duplicated {dup}, "
            f"unexpected {unexpected}; {len(failed)} failed commits ({partial} partly visible); consumer "
            f"{len(got_a)}/{len(want_a)} of its topics, missing {c_missing}, duplicated {c_dup}")
    return ok, text


def put_latencies(root_url: str, options: dict[str, str], latency: tuple[float, float]) -> list[float]:
    """Seconds of ``PUT_SAMPLES`` conditional puts (the Delta commit primitive), one at a time, at
    the injected store latency: what one sequential request costs, the yardstick of ``commit()``."""
    from pulsartx.storage import faults
    from pulsartx.storage.root import StorageRoot

    root = StorageRoot.resolve(root_url, storage_options=options or None)
    faults.install(faults.store_latency(*latency))
    try:
        out = []
        for i in range(PUT_SAMPLES):
            t0 = time.perf_counter()
            root.put_if_absent(b"{}", "bench-conditional-put", f"{i:06d}.json")
            out.append(time.perf_counter() - t0)
        return out
    finally:
        faults.clear()


def run_step(store: Storage, procs: int, args: argparse.Namespace, inflight: int = 1,
             layout: str = "shared") -> dict[str, Any]:
    import pulsartx

    root, plain_uri = store.new_step(f"p{procs}x{inflight}-{layout}")
    options = store.options
    setup = pulsartx.Client(root, storage_options=options or None, num_coordinators=args.tcs)
    for t in step_topics(layout, procs):
        setup.admin.create_topic(t, 1)
    setup._coordinators().all()
    setup.close()
    # at most one append per gap during the window, and the quiet ones around it
    plain = PlainAppender(plain_uri, options, int(args.seconds * 1000 / args.append_gap_ms) + 2 * QUIET_APPENDS)
    quiet = [plain.once() for _ in range(QUIET_APPENDS)]

    puts_s = put_latencies(root, options, args.store_latency) if args.store_latency else []
    tag = f"{store.name}-{procs}x{inflight}-{layout}"
    stop = os.path.join(store.work, f"stop-{tag}")
    common_args = {"root": root, "options": options}
    consumers, consumer_go = start_workers(__file__, [{**common_args, "role": "consumer", "stop": stop,
                                                       "topics": consumed_topics(layout, procs)}],
                                           store.work, tag + "-c")
    workers, go = start_workers(__file__, [{**common_args, "role": "producer", "wid": i, "inflight": inflight,
                                            "layout": layout} for i in range(procs)],
                                store.work, tag)
    start = time.time() + 0.2
    deadline = start + args.seconds
    release(consumer_go, {"start": start, "deadline": deadline})
    daemons = [p.pid for p in store.server.procs.values()] if store.server is not None else []
    release(go, {"start": start, "deadline": deadline})
    main0, daemons0, machine0 = cpu_seconds(), pids_cpu_seconds(daemons), machine_cpu_seconds()
    loaded = plain.until(start, deadline, args.append_gap_ms / 1000)
    cpu_main, cpu_daemons = cpu_seconds() - main0, pids_cpu_seconds(daemons) - daemons0  # the window
    cpu_machine = machine_cpu_seconds() - machine0
    results = collect(workers, args.seconds + 300)
    errors = [r["error"] for r in results if "error" in r]
    sent_a = 0
    for r in results:
        if "error" not in r:
            sent_a += (r["warmup"] + len(r["txns"])) * (MESSAGES_PER_TXN // len(TOPICS))
    release(stop, {"expected": sent_a})
    [consumer] = collect(consumers, 180)
    quiet += [plain.once() for _ in range(QUIET_APPENDS)]
    if errors or "error" in consumer:
        return {"procs": procs, "inflight": inflight, "layout": layout, "error": "; ".join(errors + [consumer.get("error", "")]).strip("; ")}

    ok, check_text = check_step(results, read_committed(root, options, step_topics(layout, procs)),
                                [g[0] for g in consumer["got"]])
    txns = [t for r in results for t in r["txns"]]
    done_at = {(r["wid"], int(t[0])): t[3] for r in results for t in r["txns"]}
    tenth = args.seconds / 10
    first = sum(1 for t in txns if start <= t[3] < start + tenth)
    last = sum(1 for t in txns if deadline - tenth <= t[3] <= deadline)
    tenths = [sum(1 for t in txns if start + i * tenth <= t[3] < start + (i + 1) * tenth) for i in range(10)]
    e2e, wait, look, queued = [], [], [], []
    for payload, look_start, look_end, received in consumer["got"]:
        w, s, _ = payload.split(":")
        done = done_at.get((int(w), int(s)))
        if done is not None:
            e2e.append(received - done)
            wait.append(look_start - done)
            look.append(look_end - look_start)
            queued.append(received - look_end)
    puts: dict[str, list[float]] = {}
    for r in results:
        for k, (count, secs) in r["puts"].items():
            acc = puts.setdefault(k, [0, 0.0])
            acc[0], acc[1] = acc[0] + count, acc[1] + secs
    n = max(1, len(txns))
    return {
        "procs": procs, "inflight": inflight, "layout": layout, "ok": ok, "check": check_text,
        "tcs": [sorted(int(tc) for tc in r["tcs"]) for r in sorted(results, key=lambda r: r["wid"])],
        "put_p50": percentile(puts_s, 0.5), "put_p99": percentile(puts_s, 0.99),
        "txns": len(txns), "tps": sum(1 for t in txns if t[3] <= deadline) / args.seconds,
        "tenths": tenths, "first": first, "last": last, "growth": last / first if first else float("nan"),
        "commit_p50": percentile([t[2] for t in txns], 0.5), "commit_p99": percentile([t[2] for t in txns], 0.99),
        "txn_p50": percentile([t[3] - t[1] for t in txns], 0.5),
        "e2e_p50": percentile(e2e, 0.5), "e2e_p99": percentile(e2e, 0.99), "e2e_n": len(e2e),
        "e2e_negative": sum(1 for x in e2e if x < 0),
        "wait_p50": percentile(wait, 0.5), "wait_p99": percentile(wait, 0.99),
        "look_p50": percentile(look, 0.5), "look_p99": percentile(look, 0.99),
        "queued_p50": percentile(queued, 0.5), "queued_p99": percentile(queued, 0.99),
        "fills": consumer["fills"], "found_p50": consumer["found_p50"], "found_p99": consumer["found_p99"],
        "empty": consumer["empty"], "empty_p50": consumer["empty_p50"], "empty_held": consumer["empty_held"],
        "found_cpu_p50": consumer["found_cpu_p50"],
        "append_p50": percentile(loaded, 0.5), "append_p99": percentile(loaded, 0.99), "append_n": len(loaded),
        "quiet_p50": percentile(quiet, 0.5), "quiet_p99": percentile(quiet, 0.99),
        "failed": sum(len(r["failed"]) for r in results),
        "cpu_workers": sum(r["cpu_s"] for r in results), "cpu_consumer": consumer["cpu_s"],
        "cpu_main": cpu_main, "cpu_daemons": cpu_daemons if daemons else None, "cpu_machine": cpu_machine,
        "puts_per_txn": {k: (c / n, secs / n) for k, (c, secs) in sorted(puts.items())},
        "requests_per_txn": {op: sum(r["requests"].get(op, 0) for r in results) / n
                             for op in sorted({op for r in results for op in r["requests"]})},
        "flush_s": max(r["flush_s"] for r in results),
        "cpu_tenths": [sum(v) for v in zip(*(r["cpu_tenths"] for r in results), strict=False)],
        "consumer_tenths": consumer["tenths"],
        "thread_tenths": {"producer": results[0]["thread_tenths"], "consumer": consumer["thread_tenths"]},
    }


# ---- report ---------------------------------------------------------------------------------------------


def ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def print_step(store: str, s: dict[str, Any], seconds: float, cores: int) -> None:
    shape = f"{s['procs']} process(es)" + (f", {s['inflight']} transactions in flight" if s["inflight"] > 1 else "")
    if s["procs"] > 1:
        shape += f" on {'shared' if s['layout'] == 'shared' else 'their own'} partitions"
    if "error" in s:
        print(f"[{store}] {shape}: FAILED: {s['error']}", flush=True)
        return
    print(f"[{store}] {shape}, {seconds:g} s: {s['tps']:.1f} txn/s ({s['txns']} txns, "
          f"{s['failed']} failed; first tenth {s['first']}, last tenth {s['last']}; 1-minute load average "
          f"{os.getloadavg()[0]:.1f} after the step)")
    print(f"    transactions per tenth of the window: {s['tenths']}")
    print(f"    commit() p50 {ms(s['commit_p50'])} p99 {ms(s['commit_p99'])} ms; new_transaction() to commit() "
          f"return p50 {ms(s['txn_p50'])} ms")
    print(f"    commit -> consumer p50 {ms(s['e2e_p50'])} p99 {ms(s['e2e_p99'])} ms ({s['e2e_n']} messages, "
          f"{s['e2e_negative']} seen before commit() returned)")
    print(f"      = until the consumer's next look at the partition began p50 {ms(s['wait_p50'])} p99 "
          f"{ms(s['wait_p99'])} ms + that look p50 {ms(s['look_p50'])} p99 {ms(s['look_p99'])} ms + in the "
          f"consumer's queue p50 {ms(s['queued_p50'])} p99 {ms(s['queued_p99'])} ms")
    print(f"      the consumer looked {s['fills']} times: {s['fills'] - s['empty']} found messages (p50 "
          f"{ms(s['found_p50'])} p99 {ms(s['found_p99'])} ms a look, of which CPU p50 {ms(s['found_cpu_p50'])} ms), "
          f"{s['empty']} found none (p50 {ms(s['empty_p50'])} ms; {s['empty_held']} of them with records in the log "
          "held back by an undecided transaction)")
    if s["put_p50"] == s["put_p50"]:  # measured (not NaN): --store-latency
        print(f"    one conditional put at the injected latency p50 {ms(s['put_p50'])} p99 {ms(s['put_p99'])} ms; "
              f"commit() p99 / put p99 {s['commit_p99'] / s['put_p99']:.2f}")
    print(f"    plain append during the run p50 {ms(s['append_p50'])} p99 {ms(s['append_p99'])} ms "
          f"({s['append_n']} appends); quiet, before and after p50 {ms(s['quiet_p50'])} p99 {ms(s['quiet_p99'])} ms")
    budget = cores * seconds
    daemons = "" if s["cpu_daemons"] is None else f", Ceph daemons {s['cpu_daemons']:.1f} s"
    print(f"    CPU: producers {s['cpu_workers']:.1f} s ({1000 * s['cpu_workers'] / max(1, s['txns']):.1f} ms/txn), "
          f"consumer {s['cpu_consumer']:.1f} s (with its drain after the window), plain appends "
          f"{s['cpu_main']:.1f} s{daemons}, of {budget:g} core-seconds; the whole machine (other work included) "
          f"{s['cpu_machine']:.1f} s; background completion after the window "
          f"{s['flush_s']:.1f} s")
    per = " ".join(f"{1000 * c / max(1, n):.1f}" for c, n in zip(s["cpu_tenths"], s["tenths"], strict=False))
    print(f"    producer CPU per transaction per tenth (ms): {per}")
    ct = s["consumer_tenths"]
    print("    consumer per tenth: CPU (s) " + " ".join(f"{c:.1f}" for c in ct["cpu"])
          + "; messages received " + " ".join(f"{a:.0f}" for a in ct["acks"])
          + "; CPU per message (ms) " + " ".join(f"{1000 * c / max(1, a):.2f}" for c, a in zip(ct["cpu"], ct["acks"], strict=False))
          + "; looks " + " ".join(f"{n:.0f}" for n in ct["looks"])
          + "; CPU per look (ms) " + " ".join(f"{1000 * c / max(1, n):.2f}" for c, n in zip(ct["look_cpu"], ct["looks"], strict=False)))
    for who, groups in s["thread_tenths"].items():
        busy = {k: v for k, v in groups.items() if sum(v) >= 0.5}
        print(f"    {who} threads, CPU seconds per tenth: " + "; ".join(
            f"{k} " + " ".join(f"{x:.1f}" for x in v) for k, v in sorted(busy.items(), key=lambda kv: -sum(kv[1]))))
    per = ", ".join(f"{k} {c:.2f} ({ms(secs)} ms)" for k, (c, secs) in s["puts_per_txn"].items())
    lost = sum(c for k, (c, _) in s["puts_per_txn"].items() if k.endswith("/lost"))
    print(f"    Delta commit puts per txn (table/side/race, time in those puts): {per}; lost (the version "
          f"went to another writer, retried after reading it) {lost:.2f} per txn")
    tcs = [tc for used in s["tcs"] for tc in used]
    print(f"    TCs the processes began their transactions on: {s['tcs']} ({len(set(tcs))} distinct for "
          f"{len(s['tcs'])} processes{'' if len(set(tcs)) == len(tcs) else '; some TC log is shared'})")
    if s["requests_per_txn"]:
        per = ", ".join(f"{op} {n:.1f}" for op, n in s["requests_per_txn"].items())
        print(f"    storage requests per txn (with the background completion): {per}; "
              f"{sum(s['requests_per_txn'].values()):.1f} in all")
    print(f"    check: {'ok' if s['ok'] else 'WRONG'}: {s['check']}", flush=True)


Row = tuple[str, float, float | None, str, str, str]  # measure, ratio, ratio to the quiet append, now, target, result


class Rows(list):
    """The summary's rows, each judged against its target (INVALID when its step's check failed)."""

    def add(self, name: str, value: float, now: str, op: str | None, target: float, valid: bool,
            quiet: float | None = None) -> None:
        if op is None:
            self.append((name, value, quiet, now, "(report)", "-"))
        else:
            self.append((name, value, quiet, now, f"{op} {target:g}", verdict(value, op, target) if valid else "INVALID"))


def inflight_rows(store: str, steps: list[dict[str, Any]], latency: str) -> list[Row]:
    """Transactions in flight in one process against one at a time. Without injected latency the
    CPU is the limit: a transaction must cost less CPU when many share the process's commits. With
    it, requests wait: throughput must grow with what is in flight."""
    good = {s["inflight"]: s for s in steps if "error" not in s and s["procs"] == 1}
    rows, base = Rows(), good.get(1)
    if base is None:
        return rows
    for n, s in sorted(good.items()):
        if n == 1:
            continue
        valid = s["ok"] and base["ok"]
        tps = s["tps"] / base["tps"] if base["tps"] else float("nan")
        cpu = (s["cpu_workers"] / max(1, s["txns"])) / (base["cpu_workers"] / max(1, base["txns"]))
        if latency:
            rows.add(f"{store}{latency}, {n} in flight: txn/s / 1 in flight", tps, "", ">=" if n == 32 else None, 16,
                     valid)
        else:
            rows.add(f"{store}, {n} in flight: txn/s / 1 in flight", tps, "", ">=" if n == 32 else None, 3, valid)
        rows.add(f"{store}{latency}, {n} in flight: CPU per txn / 1 in flight", cpu, "",
                 "<=" if n == 32 and not latency else None, 0.25, valid)
    return rows


def layout_steps(steps: list[dict[str, Any]], layout: str) -> dict[int, dict[str, Any]]:
    """Process count -> the step of one layout, one transaction in flight per process. The 1-process
    step (one process, two partitions of its own either way) is the baseline of both layouts."""
    return {s["procs"]: s for s in steps if "error" not in s and s["inflight"] == 1
            and (s["layout"] == layout or s["procs"] == 1)}


def procs_label(p: int, layout: str) -> str:
    return f"{p} procs" + (f" on {layout} partitions" if p > 1 else "")


def own_rows(good: dict[int, dict[str, Any]], layout: str) -> list[tuple[int, dict[str, Any]]]:
    """The steps whose per-step rows belong to this layout: a borrowed baseline's rows print once, under its own."""
    return [(p, s) for p, s in sorted(good.items()) if s["layout"] == layout]


def latency_rows(store: str, steps: list[dict[str, Any]], latency: str, layout: str = "shared") -> list[Row]:
    """Processes against one process, and commit() against one conditional put, at the injected
    latency. The 8-process target is judged on own partitions: on shared ones every process races
    for each Delta version of the same two tables, which no number of processes can speed up."""
    good = layout_steps(steps, layout)
    rows, base = Rows(), good.get(1)
    for p, s in sorted(good.items()):
        if base is not None and p > 1:
            ratio = s["tps"] / base["tps"] if base["tps"] else float("nan")
            rows.add(f"{store}{latency}, {procs_label(p, layout)}: txn/s / 1 proc", ratio,
                     "1.47" if p == 8 and layout == "shared" else "", ">=" if p == 8 and layout == "own" else None,
                     6, s["ok"] and base["ok"])
    for p, s in own_rows(good, layout):
        rows.add(f"{store}{latency}, {procs_label(p, layout)}: p99 commit / p99 conditional put",
                 s["commit_p99"] / s["put_p99"], "", "<=" if p == 1 else None, 2, s["ok"])
    return rows


def summary_rows(store: str, steps: list[dict[str, Any]], cores: int, layout: str = "shared") -> list[Row]:
    """The rows of the targets this bench measures. Ratios to the plain append use the appends made
    during the window (same load); the same ratio to the quiet appends is printed beside it. The
    txn/s targets were set on shared partitions; own partitions print beside them as a report."""
    good = layout_steps(steps, layout)
    rows = Rows()
    add = rows.add

    base = good.get(1)
    for p, s in sorted(good.items()):
        valid = s["ok"] and (base is None or base["ok"])
        if base is not None and p > 1:
            ratio = s["tps"] / base["tps"] if base["tps"] else float("nan")
            name = f"{store}, {procs_label(p, layout)}: txn/s / 1 proc"
            if layout != "shared":
                add(name, ratio, "", None, 0, valid)
            elif store == "local":
                add(name, ratio, "0.56-0.67" if p in (2, 4) else "", ">=", min(p, cores), valid)
            else:
                add(name, ratio, "0.40" if p == 4 else "", ">=" if p == 8 else None, 5, valid)
    for p, s in own_rows(good, layout):
        now = ("33-105" if p in (2, 4) else "") if store == "local" else ("11-17" if p == 1 else "")
        add(f"{store}, {procs_label(p, layout)}: p99 commit / p99 append", s["commit_p99"] / s["append_p99"], now,
            "<=", 2, s["ok"], s["commit_p99"] / s["quiet_p99"])
    for p, s in own_rows(good, layout):
        add(f"{store}, {procs_label(p, layout)}: p99 commit->consumer / p99 append", s["e2e_p99"] / s["append_p99"],
            "~200 ms", "<=", 4, s["ok"], s["e2e_p99"] / s["quiet_p99"])
    for p, s in own_rows(good, layout):
        add(f"{store}, {procs_label(p, layout)}: txn/s last tenth / first tenth", s["growth"], "0.62 (150 s)", ">=",
            0.9, s["ok"])
    return rows


def store_latency_arg(text: str) -> tuple[float, float]:
    """``MS`` or ``MS:P99_MS`` -> (median, p99) in milliseconds."""
    median, _, p99 = text.partition(":")
    try:
        shape = (float(median), float(p99 or median))
        from pulsartx.storage import faults

        faults.store_latency(*shape)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not MS[:P99_MS] (e.g. 20:100): {e}") from None
    return shape


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", default="1,2,4,8", help="comma-separated process counts (1 is added: the baseline)")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each step's measured window")
    ap.add_argument("--storage", choices=["local", "rgw", "both"], default="both")
    ap.add_argument("--tcs", type=int, default=16, help="TCs of every root")
    ap.add_argument("--append-gap-ms", type=float, default=20.0, help="pause between the baseline's plain appends")
    ap.add_argument("--dir", default=None, help="work directory (default: a fresh temp dir, removed afterwards)")
    ap.add_argument("--inflight", default="1",
                    help="comma-separated counts of transactions in flight in one process (threads sharing its "
                         "Client), measured after the process counts; e.g. 1,8,32")
    ap.add_argument("--store-latency", type=store_latency_arg, default=None, metavar="MS[:P99_MS]",
                    help="inject this request latency into every storage call of the transaction processes "
                         "(log-normal: median MS, 99th percentile P99_MS), e.g. 20:100 for S3 Standard")
    ap.add_argument("--layout", choices=[*LAYOUTS, "both"], default="both",
                    help="which partitions the producer processes write: the same two topics (shared), two "
                         "topics of their own each (own), or each process count both ways (both)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(json.loads(args.worker))
    procs = sorted({1, *(int(p) for p in args.procs.split(","))})
    inflight = sorted({1, *(int(n) for n in args.inflight.split(","))})
    layouts = list(LAYOUTS) if args.layout == "both" else [args.layout]
    # (processes, in flight, layout); one process has no one to share with: measured once, the baseline of both
    plan = [(p, 1, lay) for lay in layouts for p in procs if p > 1 or lay == layouts[0]]
    plan += [(1, n, layouts[0]) for n in inflight if n > 1]
    latency = ""
    if args.store_latency:
        from pulsartx.storage import faults

        # The workers inherit the plan; this process (set-up, plain appends, checks) runs without it.
        os.environ[faults.ENV] = faults.env_value(faults.store_latency(*args.store_latency))
        faults.clear()
        latency = f" at {args.store_latency[0]:g}:{args.store_latency[1]:g} ms"
    cores = os.cpu_count() or 1
    work = args.dir or tempfile.mkdtemp(prefix="pulsartx-bench-scale-")
    os.makedirs(work, exist_ok=True)
    t_start = time.perf_counter()
    print(f"scale bench in {work}: {cores} CPUs, load {os.getloadavg()[0]:.1f}; processes {procs}, "
          f"{args.seconds:g} s each, {args.tcs} TCs, {MESSAGES_PER_TXN}-message transactions over {len(TOPICS)} "
          f"one-partition topics ({' and '.join(layouts)} between processes); in flight in one process {inflight}; injected store latency "
          f"{latency.removeprefix(' at ') or 'none'}", flush=True)
    rows: list[Row] = []
    try:
        for name in (["local", "rgw"] if args.storage == "both" else [args.storage]):
            store = Storage(name, work)
            if name == "rgw":
                server, why = start_rgw()
                if server is None:
                    print(f"\n[rgw] not measured: Ceph RGW unavailable: {why}", flush=True)
                    continue
                store.server, store.options = server, server.storage_options
                print(f"\n[rgw] Ceph RGW at {server.endpoint} (started in {server.started_in:.0f} s)", flush=True)
            try:
                steps = []
                for p, n, lay in plan:
                    print()
                    steps.append(run_step(store, p, args, n, lay))
                    print_step(name, steps[-1], args.seconds, cores)
                for lay in layouts:
                    rows += latency_rows(name, steps, latency, lay) if latency else summary_rows(name, steps, cores, lay)
                rows += inflight_rows(name, steps, latency)
            finally:
                if store.server is not None:
                    store.server.stop()
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nsummary ({time.perf_counter() - t_start:.0f} s; {cores} CPUs; nothing asserted)")
    width = max([len("measure"), *(len(r[0]) for r in rows)])
    print(f"  {'measure':{width}s} {'ratio':>7s} {'quiet':>7s}  {'now':<13s} {'target':<9s} result")
    for name, value, quiet, now, target, result in rows:
        q = "" if quiet is None else f"{quiet:.2f}"
        print(f"  {name:{width}s} {value:7.2f} {q:>7s}  {now:<13s} {target:<9s} {result}")
    print("  quiet: the same ratio to the plain appends made right before and after the step, with none of the "
          "bench's processes running")
    return 0


if __name__ == "__main__":
    from common import exit_with

    exit_with(main)
