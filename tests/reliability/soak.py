"""Suite 2, the concurrency soak: 9 processes on one root at once, then the checker.

=========  ======================================================================================
txn-0/1    transactional producers to ``orders`` (3 partitions): 1-4 values per transaction over
           random partitions, 80 % commit, 20 % abort; 1 in 10 uses a tiny timeout and sleeps past
           it, so the sweeper (or a reader) aborts it under the producer and its commit must fail
plain      plain (non-transactional) producer to ``orders``, interleaved with the transactions
xform-1/2  transactional consumers (consume-transform-produce): subscription ``x<i>`` on ``orders``
           (Exclusive, earliest), each batch sends ``x<i>:<txn>:<value>`` to ``out<i>`` (2 partitions) and
           acknowledges the inputs in the same transaction; 10 % abort, then redeliver (new epoch)
reader     batch reads of ``orders`` and of ``out1`` + ``out2`` (the consistent cut), a READ_COMMITTED
           reader tailing ``orders``, and maxReadPosition samples of every partition
service    the coordinator service (``pulsartx.service``): sweeps every TC, folds buffers and
           writes snapshots when due
operator   an operator at random moments: admin aborts (``abort_transaction``) of open, deciding,
           decided and trimmed transactions, and TC-log maintenance that trims finished entries
           (a full compaction with a short retention); an abort it is told succeeded must hold
maint      maintenance: ``compact_partition`` of every partition and a forced buffer snapshot, in turn
=========  ======================================================================================

Each writes a history (tests/reliability/history.py). At the end: stop, wait past every timeout,
one more service pass, drain both subscriptions with real consumers, and check. Run it alone with
``python -m tests.reliability.soak --seconds 300 [--rgw]``.
"""
from __future__ import annotations

import json
import os
import random
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from .history import History, now, read_events, txn_list

ORDERS, ORDERS_PARTS = "orders", 3
OUTS = {1: "out1", 2: "out2"}
OUT_PARTS = 2
TXN_TIMEOUT_MS = 5000
TINY_TIMEOUT_MS = 300
SERVICE_INTERVAL_S = 1.0
ROLES = ["txn-0", "txn-1", "plain", "xform-1", "xform-2", "reader", "service", "maint", "operator"]
TRIM_EVERY_S = 1.0  # the operator's TC-log maintenance, with this retention for finished entries
TRIM_RETENTION_MS = 2000
DEFINITELY_ABORTED = ("ExpiredTransactionError", "TransactionConflict")


def _stopping(stop_path: str, deadline: float) -> bool:
    # The observer's clock, as the parent's deadline: a worker whose clock is skewed stops on time
    # (on its own clock, the service 8 days ahead stopped before its first pass).
    return os.path.exists(stop_path) or now() > deadline


def worker(role: str, url: str, options: dict | None, hist_dir: str, stop_path: str, go_path: str,
           deadline: float, seed: int, fault_env: str | None = None, skew_s: float = 0.0,
           retention: bool = False) -> None:
    """Entry point of every soak process: writes ``<role>.result.json`` then leaves with os._exit.
    ``fault_env``: a storage fault plan (``PULSARTX_FAULTS`` value) for this process; ``skew_s``:
    how far this process's wall clock is off (a clock that jumped); ``retention``: the maintenance
    role also applies retention (bounded by the subscriptions) beside the live transactions."""
    out: dict[str, Any]
    if fault_env:
        import logging

        os.environ["PULSARTX_FAULTS"] = fault_env
        os.environ["PULSARTX_FAULTS_LOG"] = os.path.join(hist_dir, f"{role}.faults.log")
        logging.getLogger("pulsartx").setLevel(logging.ERROR)  # thousands of expected fault warnings
    if retention:
        os.environ["PULSARTX_SOAK_RETENTION"] = "1"
    if skew_s:
        real = time.time
        time.time = lambda: real() + skew_s  # noqa: E731  (every wall-clock read of this process)
    try:
        out = {"ok": True, "result": ROLE_FNS[role.split("-")[0]](role, url, options, hist_dir, stop_path, go_path,
                                                                   deadline, seed)}
    except BaseException:
        out = {"ok": False, "error": traceback.format_exc()}
    path = os.path.join(hist_dir, f"{role}.result.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)
    os._exit(0)


def _setup(role: str, url: str, options: dict | None, hist_dir: str, go_path: str, recovery_grace_ms: int = 5000):
    from .final import client

    c = _retry(lambda: client(url, options, recovery_grace_ms=recovery_grace_ms))
    h = History(os.path.join(hist_dir, f"{role}.jsonl"), role)
    while not os.path.exists(go_path):
        time.sleep(0.01)
    return c, h


def _retry(fn: Any, attempts: int = 20) -> Any:
    """A setup step under injected storage faults: tried again until it works."""
    for i in range(attempts):
        try:
            return fn()
        except Exception:
            if i == attempts - 1:
                raise
            time.sleep(0.05)


def _send(h: History, producer: Any, topic: str, value: str, txn: Any = None, key: str | None = None) -> None:
    h.invoke("send", topic=topic, value=value, txn=txn_list(txn))
    try:
        mid = producer.send(value.encode(), partition_key=key, txn=txn)
    except Exception as e:
        # a transactional send that failed is decided by the transaction; a plain one may have landed
        h.info("send", e, topic=topic, value=value, txn=txn_list(txn))
        raise
    h.ok("send", topic=topic, value=value, txn=txn_list(txn), partition=mid.partition(), offset=mid.offset())


def _end(h: History, txn: Any, action: str) -> bool:
    """Commit or abort, recorded; True when it definitely committed."""
    h.invoke(action, txn=txn_list(txn))
    try:
        txn.commit() if action == "commit" else txn.abort()
    except Exception as e:
        kind = h.fail if type(e).__name__ in DEFINITELY_ABORTED else h.info
        kind(action, e, txn=txn_list(txn))
        return False
    h.ok(action, txn=txn_list(txn))
    return action == "commit"


def txn_producer(role, url, options, hist_dir, stop_path, go_path, deadline, seed) -> dict:
    rng = random.Random(seed)
    c, h = _setup(role, url, options, hist_dir, go_path)
    p = _retry(lambda: c.create_producer(ORDERS))
    n = committed = 0
    while not _stopping(stop_path, deadline):
        tiny = rng.random() < 0.1
        try:
            txn = c.new_transaction(timeout_ms=TINY_TIMEOUT_MS if tiny else TXN_TIMEOUT_MS)
        except Exception:
            continue  # a storage fault: no transaction began (or one that will time out)
        h.ok("begin", txn=txn_list(txn))
        try:
            for _ in range(rng.randint(1, 4)):
                n += 1
                _send(h, p, ORDERS, f"{role}:{n}", txn, key=f"k{rng.randrange(1000)}")
            if tiny:
                time.sleep(TINY_TIMEOUT_MS / 1000 * 1.5)
        except Exception:
            pass  # the transaction is doomed; its commit below says how
        committed += _end(h, txn, "commit" if rng.random() < 0.8 else "abort")
    return {"values": n, "committed": committed}


def plain_producer(role, url, options, hist_dir, stop_path, go_path, deadline, seed) -> dict:
    rng = random.Random(seed)
    c, h = _setup(role, url, options, hist_dir, go_path)
    p = _retry(lambda: c.create_producer(ORDERS))
    n = 0
    while not _stopping(stop_path, deadline):
        n += 1
        try:
            _send(h, p, ORDERS, f"{role}:{n}", key=f"k{rng.randrange(1000)}")
        except Exception:
            pass
        time.sleep(rng.uniform(0, 0.05))
    return {"values": n}


def _redeliver(cons) -> None:
    """Redelivery raises when it could not return an aborted transaction's acks (a storage fault):
    asked again before anything more is received, as the error says."""
    for _ in range(50):
        try:
            cons.redeliver_unacknowledged_messages()
            return
        except Exception:
            time.sleep(0.05)
    cons.redeliver_unacknowledged_messages()


def transformer(role, url, options, hist_dir, stop_path, go_path, deadline, seed) -> dict:
    from pulsartx.client.consumer import ConsumerType, InitialPosition

    from .final import DRAIN_LEASE_WAIT_S, subscribe_when_free

    rng = random.Random(seed)
    i = int(role.split("-")[1])
    sub, out = f"x{i}", OUTS[i]
    c, h = _setup(role, url, options, hist_dir, go_path)
    # A subscribe that failed under the injected faults after taking the Exclusive lease, and whose
    # release failed too ("it will expire"), holds the subscription until the lease runs out: the
    # next attempt waits that out, as a restarted application does.
    cons = _retry(lambda: subscribe_when_free(c, ORDERS, sub, DRAIN_LEASE_WAIT_S, consumer_type=ConsumerType.Exclusive,
                                              initial_position=InitialPosition.Earliest))
    p = _retry(lambda: c.create_producer(out))
    epoch = committed = aborted = 0
    while not _stopping(stop_path, deadline):
        try:
            msgs = cons.batch_receive(rng.randint(1, 8), timeout_millis=200)
        except Exception:
            continue  # a storage fault while fetching: nothing was delivered
        if not msgs:
            continue
        for m in msgs:
            mid = m.message_id()
            h.ok("poll", consumer=role, epoch=epoch, topic=ORDERS, sub=sub,
                 msgs=[[mid.partition(), mid.offset(), m.data().decode()]])
        try:
            txn = c.new_transaction(timeout_ms=TXN_TIMEOUT_MS)
        except Exception:
            epoch += 1
            _redeliver(cons)
            continue
        h.ok("begin", txn=txn_list(txn))
        try:
            for m in msgs:  # values stay unique across retries; acks catch double processing
                _send(h, p, out, f"{sub}:{txn.id.most_bits}.{txn.id.least_bits}:{m.data().decode()}", txn,
                      key=m.data().decode())
            acked = [[m.message_id().partition(), m.message_id().offset(), m.data().decode()] for m in msgs]
            # Invoked first: an ack that raised may have left some pending (the checker's non_monotonic
            # allows their late return when the transaction's end is unknown here).
            h.invoke("ack", txn=txn_list(txn), topic=ORDERS, sub=sub, msgs=acked)
            cons.acknowledge(msgs, txn=txn)
            h.ok("ack", txn=txn_list(txn), topic=ORDERS, sub=sub, msgs=acked)
            action = "commit" if rng.random() < 0.9 else "abort"
        except Exception:
            action = "abort"  # (committing outputs without their acks would process the inputs twice)
        if _end(h, txn, action):
            committed += 1
        else:
            aborted += 1
            epoch += 1  # what this transaction acknowledged comes back: offsets may go back
            _redeliver(cons)
    cons.close()
    return {"committed": committed, "aborted": aborted}


def reader(role, url, options, hist_dir, stop_path, go_path, deadline, seed) -> dict:
    from pulsartx import MessageId
    from pulsartx.exceptions import Timeout

    from .final import batch_read, blocked_at

    c, h = _setup(role, url, options, hist_dir, go_path)
    r = _retry(lambda: c.create_reader(ORDERS, MessageId.earliest))
    reads = samples = failed = 0
    topics = [ORDERS, *OUTS.values()]
    while not _stopping(stop_path, deadline):
        try:  # a read that failed on a storage fault observed nothing
            for ts in ([ORDERS], list(OUTS.values())):
                started = now()
                h.ok("read", topics=ts, msgs=[list(x) for x in batch_read(c, ts)], started=started)
                reads += 1
            for t in topics:
                sampled = now()
                for part, at in blocked_at(c, t).items():
                    h.ok("mrp", topic=t, partition=part, blocked_at=at, t=sampled)
                    samples += 1
        except Exception:
            failed += 1
        got = []
        try:
            while len(got) < 200:
                m = r.read_next(timeout_millis=50)
                got.append([m.message_id().partition(), m.message_id().offset(), m.data().decode()])
        except Timeout:
            pass
        except Exception:
            failed += 1
        if got:
            h.ok("poll", consumer=role, epoch=0, topic=ORDERS, msgs=got)
    return {"batch_reads": reads, "mrp_samples": samples, "failed_reads": failed}


def service(role, url, options, hist_dir, stop_path, go_path, deadline, seed) -> dict:
    from pulsartx.service import CoordinatorService

    c, _h = _setup(role, url, options, hist_dir, go_path)
    svc = CoordinatorService(c, sweep_interval_s=SERVICE_INTERVAL_S)
    longest = 0.0
    while not _stopping(stop_path, deadline):
        t0 = time.monotonic()
        try:
            svc.run_pass()
        except Exception:
            svc.stats.failed += 1  # the service logs and goes on; so does this loop
        svc.stats.passes += 1
        longest = max(longest, time.monotonic() - t0)
        time.sleep(max(0.0, SERVICE_INTERVAL_S - (time.monotonic() - t0)))
    s = svc.stats
    return {"passes": s.passes, "timed_out": s.timed_out, "completed": s.completed, "failed": s.failed,
            "longest_pass_s": round(longest, 2)}


def maintenance(role, url, options, hist_dir, stop_path, go_path, deadline, seed) -> dict:
    from pulsartx.admin.subscriptions import subscription_names
    from pulsartx.buffer.buffer import TransactionBuffer
    from pulsartx.log.partition import PartitionLog
    from pulsartx.maintenance.compaction import compact_partition
    from pulsartx.maintenance.retention import apply_retention

    retain = os.environ.get("PULSARTX_SOAK_RETENTION") == "1"
    c, _h = _setup(role, url, options, hist_dir, go_path)
    compactions = dropped = snapshots = retained = 0
    errors: list[str] = []
    parts = _retry(lambda: [p for t in (ORDERS, *OUTS.values()) for p in c.admin.partitions_of(t)])
    i = 0
    while not _stopping(stop_path, deadline):
        part = parts[i % len(parts)]
        i += 1
        try:  # keep going, as the coordinator service does; the test asserts there were none
            subscribed = part.base.short.endswith(ORDERS)
            # With retention on, the subscribed topic is left to it: compaction would keep merging
            # its files into one reaching past the consumers' position, leaving retention nothing.
            if not (retain and subscribed):
                res = compact_partition(c.root, part)
                if res.skipped is None:
                    compactions += 1
                    dropped += res.rows_dropped
            tb = TransactionBuffer(PartitionLog(c.root, part))
            tb.state()
            snapshots += bool(tb.take_snapshot())
            # The subscribed topic, once both subscriptions exist: they bound what retention deletes.
            if retain and subscribed and {f"x{i}" for i in OUTS} <= set(
                    subscription_names(c.root, [part])):
                retained += apply_retention(c.root, part, max_bytes=1).files_deleted
        except Exception as e:
            errors.append(f"{part}: {type(e).__name__}: {e}"[:400])
        time.sleep(0.2)
    return {"compactions": compactions, "rows_dropped": dropped, "snapshots": snapshots,
            "retention_files_deleted": retained, "errors": len(errors),
            "first_errors": errors[:3]}


def operator(role, url, options, hist_dir, stop_path, go_path, deadline, seed) -> dict:
    from pulsartx.coordinator.state import TxnStatus
    from pulsartx.coordinator.tclog import TransactionLog

    from .final import client

    rng = random.Random(seed)
    c, h = _setup(role, url, options, hist_dir, go_path)
    told: dict[str, int] = {}
    trimmed: list = []  # ids seen finished, then trimmed by this role's maintenance
    last_trim = time.monotonic()
    while not _stopping(stop_path, deadline):
        time.sleep(rng.uniform(0.05, 0.3))
        try:
            metas = [m for tc in c._coordinators().all() for m in tc.transactions(refresh=True)]
            if time.monotonic() - last_trim >= TRIM_EVERY_S:
                last_trim = time.monotonic()
                tc_id = rng.choice(sorted({m.txn_id.most_bits for m in metas} or {0}))
                tl = TransactionLog(c.root, tc_id, compact_every=1, finished_retention_ms=TRIM_RETENTION_MS).open()
                before = {m.txn_id for m in tl.all() if m.status.is_final}
                tl.log.files_since_compaction = 1
                if tl.maybe_compact(int(time.time() * 1000)):
                    tl.refresh()
                    trimmed.extend(t for t in before if tl.get(t.least_bits) is None)
                    trimmed[:] = trimmed[-200:]
        except Exception:
            continue  # a storage fault: try again later
        kinds = {
            "open": [m.txn_id for m in metas if m.status is TxnStatus.OPEN],
            "deciding": [m.txn_id for m in metas if m.status in (TxnStatus.COMMITTING, TxnStatus.ABORTING)],
            "decided": [m.txn_id for m in metas if m.status.is_final],
            "trimmed": trimmed,
        }
        # Trimmed ids half the time when there are any: the state an abort must not re-decide.
        kind = "trimmed" if trimmed and rng.random() < 0.5 else rng.choice([k for k, v in kinds.items() if v] or ["open"])
        if not kinds[kind]:
            continue
        target = rng.choice(kinds[kind])
        h.invoke("admin_abort", txn=txn_list(target), target=kind)
        try:
            if kind == "trimmed":  # as `pulsartx transactions abort` does: a fresh process's view
                with client(url, options) as fresh:
                    meta = fresh.admin.transactions.abort_transaction(str(target))
            else:
                meta = c.admin.transactions.abort_transaction(str(target))
        except Exception as e:
            h.info("admin_abort", e, txn=txn_list(target), target=kind)
            told[f"{kind}:refused"] = told.get(f"{kind}:refused", 0) + 1
            continue
        h.ok("admin_abort", txn=txn_list(target), target=kind, status=meta["status"])
        told[f"{kind}:{meta['status']}"] = told.get(f"{kind}:{meta['status']}", 0) + 1
    return {"admin_aborts": told, "trimmed_seen": len(trimmed)}


ROLE_FNS = {"txn": txn_producer, "plain": plain_producer, "xform": transformer, "reader": reader,
            "service": service, "maint": maintenance, "operator": operator}


# ================================ parent ==========================================================


@dataclass
class SoakResult:
    seconds: float = 0.0
    results: dict[str, Any] = field(default_factory=dict)
    report: Any = None
    committed_txns: int = 0
    stuck_limit_s: float = 0.0

    @property
    def txns_per_second(self) -> float:
        return self.committed_txns / self.seconds if self.seconds else 0.0


def run_soak(url: str, options: dict | None, seconds: float, hist_dir: str, fault_env: str | None = None,
             skew: dict[str, float] | None = None, retention: bool = False) -> SoakResult:
    """``fault_env``: a storage fault plan every worker runs under; ``skew``: role -> seconds its
    clock is off. The recovery and the final read run without faults, as a repaired system would."""
    from .checker import check
    from .crash import context
    from .final import client, collect_final

    os.makedirs(hist_dir, exist_ok=True)
    c = client(url, options)
    c.admin.create_topic(ORDERS, ORDERS_PARTS)
    for t in OUTS.values():
        c.admin.create_topic(t, OUT_PARTS)
    c.close()
    stop, go = os.path.join(hist_dir, "stop"), os.path.join(hist_dir, "go")
    ctx = context()
    procs = []
    deadline = time.time() + seconds + 60  # a hard bound; the stop file normally ends them
    for i, role in enumerate(ROLES):
        pr = ctx.Process(target=worker, args=(role, url, options, hist_dir, stop, go, deadline, 1000 + i, fault_env,
                                              (skew or {}).get(role, 0.0), retention), daemon=True)
        pr.start()
        procs.append(pr)
    time.sleep(2.0)  # let every process open its client before the clock starts
    open(go, "w").close()
    t0 = time.monotonic()
    time.sleep(seconds)
    open(stop, "w").close()
    for pr in procs:
        pr.join(180)
    res = SoakResult(seconds=time.monotonic() - t0)
    for pr in procs:
        if pr.is_alive():
            pr.kill()
            pr.join(10)
    for role in ROLES:
        path = os.path.join(hist_dir, f"{role}.result.json")
        if not os.path.exists(path):
            raise AssertionError(f"soak process {role} wrote no result")
        out = json.load(open(path))
        if not out["ok"]:
            raise AssertionError(f"soak process {role} failed:\n{out['error']}")
        res.results[role] = out["result"]

    # Recovery: every timeout passed, one more service pass (real code), then the final state.
    time.sleep(TXN_TIMEOUT_MS / 1000 + 0.2)
    from pulsartx.service import CoordinatorService

    c = client(url, options)
    CoordinatorService(c, sweep_interval_s=0, grace_ms=0).run_pass()
    c.close()
    final = collect_final(url, options, [ORDERS, *OUTS.values()], [(ORDERS, f"x{i}") for i in OUTS])
    events = read_events(sorted(os.path.join(hist_dir, f) for f in os.listdir(hist_dir) if f.endswith(".jsonl")))
    # "blocked for longer than the transaction timeout plus one sweep" (a pass can take a while here)
    res.stuck_limit_s = TXN_TIMEOUT_MS / 1000 + SERVICE_INTERVAL_S + res.results["service"]["longest_pass_s"] + 1.0
    res.report = check(events, final, stuck_limit_s=res.stuck_limit_s)
    res.committed_txns = res.report.stats["txn_committed"]
    return res


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="pulsartx concurrency soak (reliability suite 2, docs/reliability.md)")
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("PULSARTX_SOAK_SECONDS", "300")))
    ap.add_argument("--rgw", action="store_true", help="run on a throw-away Ceph RGW instead of local disk")
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="pulsartx-soak-")
    server = None
    try:
        if args.rgw:
            from . import rgw

            server = rgw.start()
            url, options = server.new_root("soak")
        else:
            url, options = os.path.join(work, "root"), None
            os.makedirs(url)
        res = run_soak(url, options, args.seconds, os.path.join(work, "histories"))
        print(json.dumps({"storage": "rgw" if args.rgw else "local", "seconds": round(res.seconds, 1),
                          "committed_txns": res.committed_txns, "txns_per_second": round(res.txns_per_second, 2),
                          "anomalies": res.report.anomalies.counts(), "stats": dict(res.report.stats),
                          "processes": res.results}, indent=1))
        return 0 if res.report.anomalies.total == 0 else 1
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    import sys

    code = main()
    sys.stdout.flush()
    os._exit(code)
