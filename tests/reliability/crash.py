"""Suite 1, the crash matrix: SIGKILL a client at an exact step of a consume-transform-produce
transaction, recover with the real unpatched code, then check the histories and storage.

One run (a point and a seed) is one child process that, on its own fresh topics:

1. sends ``n_in`` plain messages to ``in`` (1 partition) and subscribes to it (Exclusive, earliest);
2. receives ``k`` of them, begins a transaction, sends ``t:<input>`` plus a few extra values to
   ``out`` (2 partitions, always both), acknowledges the ``k`` inputs in the
   transaction, then commits or aborts it (seeded);
3. stops at its injection point, records ``crash`` in its history and signals the parent, which
   SIGKILLs it. Injection only parks the child at the step (a patch inside the child, as
   tests/_procs.py does); nothing of pulsartx is patched in the parent or during recovery.

Children come from a ``forkserver`` whose server process imported pulsartx (and deltalake) but
never opened a table: forking it costs milliseconds where a fresh interpreter costs about a second,
and delta-rs only refuses forks once its runtime ran (measured: forked children work).

Right after each kill, before anything may recover it: the transaction's TC status (read-only) and
a batch read and a READ_COMMITTED read of its topics (recorded as history: they must not be
fractured nor show aborted data, with markers half written). Later children's clients recover
older runs as they open TCs (after ``recovery_grace_ms``), as any new client would. After all runs
of a storage: wait for every transaction's timeout, one sweep of every TC (``admin.transactions.sweep``), then the
checker over everything, plus the expected outcome per point.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from _keys import keys_for  # tests/ is on sys.path (conftest), in the forkserver's children too

from .history import History, read_events, txn_list

# point -> (step, outcome once recovered: None = the child's chosen action, "ABORTED" = timed out)
POINTS: dict[str, str | None] = {
    "after_new": "ABORTED",          # NEW logged, nothing sent
    "add_partition": "ABORTED",      # ADD_PARTITION logged, its data not appended yet
    "mid_produce": "ABORTED",        # some of the transaction's appends durable
    "after_produce": "ABORTED",      # every send durable, no ack, no decision
    "after_ack": "ABORTED",          # PENDING_ACK durable, no decision
    "decided": None,                 # COMMITTING/ABORTING logged, no participant touched
    "mid_markers": None,             # one partition's marker written, the others not
    "markers_done": None,            # every participant done, final status not logged
    "pending_ack_mid": None,         # the subscription's pending-ack commit/abort not applied
    "pending_ack_done": None,        # pending-ack commit/abort applied, markers racing
}
TXN_TIMEOUT_MS = 15000  # long enough for a child on a very busy machine to reach its point
LEASE_MS = 1500
IN_PARTS, OUT_PARTS = 1, 2
SUB = "s"


def topics_for(point: str, seed: int) -> tuple[str, str]:
    tag = f"{point.replace('_', '')}{seed}"
    return f"in{tag}", f"out{tag}"


# ================================ child ===========================================================



def crash_child(url: str, options: dict | None, point: str, seed: int, hist_path: str, stopped: Any) -> None:
    """Run one crash run; park at ``point`` (``stopped`` is set) until SIGKILLed."""
    try:
        _crash_child(url, options, point, seed, hist_path, stopped)
        with open(hist_path + ".err", "w") as f:
            f.write(f"reached the end without stopping at {point}")
    except BaseException:
        with open(hist_path + ".err", "w") as f:
            f.write(traceback.format_exc())
    os._exit(1)


def _crash_child(url: str, options: dict | None, point: str, seed: int, hist_path: str, stopped: Any) -> None:
    from pulsartx.client.consumer import ConsumerType, InitialPosition
    from pulsartx.coordinator import coordinator as coordinator_mod
    from pulsartx.coordinator import participants
    from pulsartx.log import partition as partition_mod

    from .final import client as make_client

    rng = random.Random(f"{point}/{seed}")
    name = f"{point}.{seed}"
    h = History(hist_path, name)
    in_topic, out_topic = topics_for(point, seed)
    c = make_client(url, options, recovery_grace_ms=5000)
    c.admin.create_topic(in_topic, IN_PARTS)
    c.admin.create_topic(out_topic, OUT_PARTS)
    state: dict[str, Any] = {"txn": None, "action": None}

    def stop(**info: Any) -> None:
        h.info("crash", "SIGKILL", point=point, txn=txn_list(state["txn"]), action=state["action"], **info)
        stopped.set()
        time.sleep(600)
        os._exit(3)

    # 1. plain inputs and a subscription
    n_in = rng.randint(1, 3)
    p_in = c.create_producer(in_topic)
    in_keys = keys_for(IN_PARTS)
    for j in range(n_in):
        v = f"{name}:in{j}"
        h.invoke("send", topic=in_topic, value=v, txn=None)
        mid = p_in.send(v.encode(), partition_key=in_keys[j % IN_PARTS])
        h.ok("send", topic=in_topic, value=v, txn=None, partition=mid.partition(), offset=mid.offset())
    cons = c.subscribe(in_topic, SUB, consumer_type=ConsumerType.Exclusive, initial_position=InitialPosition.Earliest,
                       lease_ms=LEASE_MS)
    k = rng.randint(1, n_in)
    got = []
    while len(got) < k:
        m = cons.receive(timeout_millis=30_000)
        got.append(m)
        mid = m.message_id()
        h.ok("poll", consumer=name, epoch=0, topic=in_topic, sub=SUB, msgs=[[mid.partition(), mid.offset(), m.data().decode()]])

    # 2. the transaction, with the injection point's patch in place
    out_keys = keys_for(OUT_PARTS)
    values = [f"t:{m.data().decode()}" for m in got] + [f"{name}:x{j}" for j in range(rng.randint(1, 2))]
    keys = [out_keys[i % OUT_PARTS] for i in range(len(values))]  # at least two partitions
    rng.shuffle(keys)
    state["action"] = "commit" if rng.random() < 0.5 else "abort"
    if POINTS[point] == "ABORTED":
        state["action"] = "commit"
    n_out_parts = len(set(keys))

    def mine(meta: Any) -> bool:
        """Only this run's transaction stops: opening a TC may roll another (killed) run's forward."""
        return state["txn"] is not None and meta.txn_id == state["txn"].id

    if point == "add_partition":
        orig_add = coordinator_mod.TransactionCoordinator.add_partitions

        def add_then_stop(self, txn_id, partitions):
            orig_add(self, txn_id, partitions)
            stop(partitions=sorted(partitions))
        coordinator_mod.TransactionCoordinator.add_partitions = add_then_stop
    elif point == "mid_produce":
        stop_after = rng.randint(1, max(1, len(values) - 1))
        # Where an append is durable: producers queue theirs (submit_append) and wait here, and
        # PartitionLog.append waits here too.
        orig_wait = partition_mod.PartitionLog.wait_append
        appended = [0]

        def append_then_maybe_stop(self, request):
            res = orig_wait(self, request)
            if str(self.topic).split("/")[-1].startswith(out_topic + "-partition-"):
                appended[0] += 1
                if appended[0] >= stop_after:
                    stop(appended=appended[0])
            return res
        partition_mod.PartitionLog.wait_append = append_then_maybe_stop
    elif point in ("decided", "markers_done"):
        orig_all = coordinator_mod.end_on_participants

        def participants_then_maybe_stop(root, meta, action):
            if not mine(meta):
                return orig_all(root, meta, action)
            if point == "decided":
                stop(status=meta.status.value)
            failures = orig_all(root, meta, action)
            stop(failures=len(failures))
        coordinator_mod.end_on_participants = participants_then_maybe_stop
    elif point == "mid_markers":
        orig_one = participants.end_on_partition
        first = rng.randint(1, n_out_parts - 1)
        lock = threading.Lock()
        written: list[str] = []

        def some_markers(root, meta, partition, action):
            if not mine(meta):
                return orig_one(root, meta, partition, action)
            names = sorted(meta.partitions)
            if partition in names[:first]:
                orig_one(root, meta, partition, action)
                with lock:
                    written.append(partition)
                    if len(written) == first:
                        stop(markers=sorted(written))
            time.sleep(600)
        participants.end_on_partition = some_markers
    elif point in ("pending_ack_mid", "pending_ack_done"):
        orig_sub = participants.end_on_subscription

        def sub_maybe_stop(root, meta, sub, action):
            if not mine(meta):
                return orig_sub(root, meta, sub, action)
            if point == "pending_ack_mid":
                stop(subscription=str(sub))
            orig_sub(root, meta, sub, action)
            stop(subscription=str(sub))
        participants.end_on_subscription = sub_maybe_stop

    txn = c.new_transaction(timeout_ms=TXN_TIMEOUT_MS)
    state["txn"] = txn
    h.ok("begin", txn=txn_list(txn))
    if point == "after_new":
        txn._tc().persist(txn.id)  # a client transaction writes NEW with its first registration: write it now
        txn._written = True
        stop()
    p_out = c.create_producer(out_topic)
    for v, key in zip(values, keys, strict=True):
        h.invoke("send", topic=out_topic, value=v, txn=txn_list(txn))
        mid = p_out.send(v.encode(), partition_key=key, txn=txn)
        h.ok("send", topic=out_topic, value=v, txn=txn_list(txn), partition=mid.partition(), offset=mid.offset())
    if point == "after_produce":
        stop()
    cons.acknowledge(got, txn=txn)
    h.ok("ack", txn=txn_list(txn), topic=in_topic, sub=SUB,
         msgs=[[m.message_id().partition(), m.message_id().offset(), m.data().decode()] for m in got])
    if point == "after_ack":
        stop()
    f = state["action"]
    h.invoke(f, txn=txn_list(txn))
    txn.commit() if f == "commit" else txn.abort()
    h.ok(f, txn=txn_list(txn))
    # The points from the decision on are in the background completer: wait there to be killed.
    c.flush(None)


# ================================ parent ==========================================================


_CTX: Any = None


def context() -> Any:
    """The forkserver context, its server preloaded with pulsartx and this module (no table opened)."""
    global _CTX
    if _CTX is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([__name__, "pulsartx", "pulsartx.client.client", "pulsartx.service",
                                    "pulsartx.log.partition", "pulsartx.coordinator.coordinator",
                                    "pulsartx.subscription.store", "pulsartx.buffer.reads", "pyarrow.parquet"])
        _CTX = ctx
    return _CTX


@dataclass
class MatrixResult:
    runs: int = 0
    per_point: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)  # (point, status) -> n
    wrong_outcome: list = field(default_factory=list)
    report: Any = None
    seconds: dict[str, float] = field(default_factory=dict)
    swept: dict[str, int] = field(default_factory=dict)
    status_at_kill: Counter = field(default_factory=Counter)  # (point, TC status right after the kill)
    lease_epochs: dict[int, int] = field(default_factory=dict)  # TC -> its lease's epoch at the end
    final: Any = None
    events: list = field(default_factory=list)


def run_one(url: str, options: dict | None, point: str, seed: int, hist_dir: str, parent: History,
            timeout: float = 120) -> tuple[str, str | None]:
    """Start the child, wait until it parks at ``point``, SIGKILL it; then, before anything can
    recover the transaction, note its TC status (read-only) and read its topics as a batch read
    and a READ_COMMITTED reader (recorded in ``parent`` for the checker). Returns (point, status)."""
    from pulsartx.coordinator.registry import Coordinators
    from pulsartx.coordinator.txnid import TxnID

    from .final import batch_read, client, visible

    ctx = context()
    stopped = ctx.Event()
    path = os.path.join(hist_dir, f"{point}.{seed}.jsonl")
    proc = ctx.Process(target=crash_child, args=(url, options, point, seed, path, stopped), daemon=True)
    proc.start()
    deadline = time.monotonic() + timeout
    try:
        while not stopped.wait(0.02):
            if not proc.is_alive() or time.monotonic() > deadline:
                err = open(path + ".err").read() if os.path.exists(path + ".err") else f"exit code {proc.exitcode}"
                raise AssertionError(f"crash child {point}/{seed} never reached its injection point:\n{err}")
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
    assert proc.exitcode == -signal.SIGKILL, (point, seed, proc.exitcode)
    crash_ev = next(e for e in read_events([path]) if e["f"] == "crash")
    c = client(url, options, recovery_grace_ms=10**9)  # reads must not roll anything forward themselves
    try:
        t = TxnID(*crash_ev["txn"])
        status = Coordinators(c.root, recover_on_open=False).for_txn(t).get(t, refresh=True).status.value
        in_t, out_t = topics_for(point, seed)
        started = time.time()  # after the child's commit() returned: read-your-writes applies
        parent.ok("read", topics=[in_t, out_t], msgs=[list(r) for r in batch_read(c, [in_t, out_t])],
                  started=started)
        parent.ok("poll", consumer=f"reader-{point}.{seed}", epoch=0, topic=out_t,
                  msgs=[list(r) for r in visible(c, out_t)])
    finally:
        c.close()
    return point, status


def run_matrix(url: str, options: dict | None, points: list[str], seeds: int, hist_dir: str,
               parallel: int = 3) -> MatrixResult:
    from concurrent.futures import ThreadPoolExecutor

    from .checker import check
    from .final import client, collect_final

    os.makedirs(hist_dir, exist_ok=True)
    res = MatrixResult()
    t0 = time.monotonic()
    jobs = [(p, s) for s in range(seeds) for p in points]
    parent = History(os.path.join(hist_dir, "parent.jsonl"), "parent")
    with ThreadPoolExecutor(parallel) as pool:
        for f in [pool.submit(run_one, url, options, p, s, hist_dir, parent) for p, s in jobs]:
            res.status_at_kill[f.result()] += 1
    killed_at = time.time()
    res.runs = len(jobs)
    res.seconds["kills_and_reads"] = time.monotonic() - t0
    all_topics = [t for p, s in jobs for t in topics_for(p, s)]

    # Recovery: every timeout passed, then a sweep of every TC (real code, grace 0: the children
    # are dead). (The soak runs the whole coordinator service; here its buffer folding would only
    # add time.)
    time.sleep(max(0.0, killed_at + TXN_TIMEOUT_MS / 1000 + 0.2 - time.time()))
    t2 = time.monotonic()
    from pulsartx.coordinator.registry import Coordinators

    from .final import config

    c = client(url, options)
    swept: Counter = Counter()
    for tc in Coordinators(c.root, config=config(0), recover_on_open=False).all():  # count what sweeps do
        r = tc.sweep(grace_ms=0)
        swept.update(timed_out=r.timed_out, completed=r.completed, failed=r.failed)
        lease = tc.txlog.lease()
        if lease is not None:  # every epoch past 0 is a child that took a killed child's log over
            res.lease_epochs[tc.tc_id] = lease.epoch
    res.swept = dict(swept)
    c.close()
    res.seconds["recovery"] = time.monotonic() - t2

    t3 = time.monotonic()
    subs = [(topics_for(p, s)[0], SUB) for p, s in jobs]
    final = collect_final(url, options, all_topics, subs, drain_with_consumer=False, workers=parallel)
    events = read_events(sorted(os.path.join(hist_dir, f) for f in os.listdir(hist_dir) if f.endswith(".jsonl")))
    res.report = check(events, final)
    res.final, res.events = final, events
    crashed: set[str] = set()
    for e in events:
        if e["f"] == "crash" and e["p"] not in crashed:
            crashed.add(e["p"])  # (two participant threads may both reach a stop)
            res.per_point[e["point"]] += 1
            if e["txn"] is None:
                continue
            t = tuple(e["txn"])
            status = final.txn_status.get(t)
            res.outcomes[(e["point"], status)] += 1
            want = POINTS[e["point"]] or ("COMMITTED" if e["action"] == "commit" else "ABORTED")
            if status != want:
                res.wrong_outcome.append((e["p"], t, status, want))
    res.seconds["check"] = time.monotonic() - t3
    res.seconds["total"] = time.monotonic() - t0
    return res
