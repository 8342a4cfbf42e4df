"""Real child processes for the coordinator tests and bench/coordinator.py.

Every child is a fresh interpreter (``subprocess.Popen([python, this file, command, json-args])``):
deltalake panics in a forked child once the parent used it (docs/design/deltalake-in-processes.md). A child talks to
the parent through stdout lines ``@@EVENT <name> <json>`` (it reached a step and is now waiting to
be killed) and ``@@RESULT <json>`` (its work is done), then leaves with ``os._exit(0)``, so the
occasional abort at interpreter exit can neither hide nor fake a result: the parent judges children
by what they printed and by what is in storage, never by their exit codes.

Patching inside a child (``end_on_partition``, ``end_on_participants``) only makes the child stop at
an exact step of the commit protocol; the parent then kills it with SIGKILL and checks recovery with
the real, unpatched code.

:class:`Forked` is the exception: a child ``os.fork()`` makes of the calling process, for tests of
what a forked child may do with what its parent made (docs/design/clients-across-fork.md).
"""
from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Any

HERE = os.path.abspath(__file__)
BIG_RETENTION_MS = 10**12  # keep finished transactions in the TC log for the whole test


# ================================ parent side =====================================================


class Child:
    """One child process running ``command(**args)`` from :data:`COMMANDS` (or from the ``COMMANDS``
    of another test module, ``script``, whose ``__main__`` calls :func:`main`); ``stdin``: a pipe the
    parent may write commands to."""

    script = HERE
    stdin = False

    def __init__(self, command: str, **args: Any):
        self.command = command
        self.proc = subprocess.Popen([sys.executable, self.script, command, json.dumps(args)],
                                     stdin=subprocess.PIPE if self.stdin else None, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def _next(self, kind: str, name: str | None, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise AssertionError(f"child {self.command}: no @@{kind} {name or ''} within {timeout}s; output:\n"
                                     + "\n".join(self.lines[-60:]))
            try:
                line = self._q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"child {self.command} ended without @@{kind} {name or ''}; output:\n"
                                     + "\n".join(self.lines[-60:]))
            self.lines.append(line)
            if kind == "EVENT" and line.startswith("@@EVENT "):
                _, ev, payload = line.split(" ", 2)
                if ev == name:
                    return json.loads(payload)
            elif kind == "RESULT" and line.startswith("@@RESULT "):
                return json.loads(line.split(" ", 1)[1])

    def wait_event(self, name: str, timeout: float = 60) -> Any:
        """Block until the child prints ``@@EVENT name``; returns its payload."""
        return self._next("EVENT", name, timeout)

    def result(self, timeout: float = 120) -> Any:
        """The child's return value; raises AssertionError with its traceback if it failed."""
        out = self._next("RESULT", None, timeout)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()
        if not out["ok"]:
            raise AssertionError(f"child {self.command} failed:\n{out['error']}")
        return out["result"]

    def sigkill(self) -> None:
        """SIGKILL: no finally blocks, no atexit, no flush, exactly like a crashed TC."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        assert self.proc.returncode == -signal.SIGKILL, self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


class Forked:
    """``fn(*args)`` in a child ``os.fork()`` makes of this process, which sends back its JSON
    result through a pipe and leaves with ``os._exit(0)``. The child runs nothing but ``fn``: no
    test framework, no interpreter teardown."""

    def __init__(self, fn: Any, *args: Any):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                out = {"ok": True, "result": fn(*args)}
            except BaseException:
                out = {"ok": False, "error": traceback.format_exc()}
            try:
                data = json.dumps(out).encode()
                while data:
                    data = data[os.write(w, data):]
            finally:
                os._exit(0)
        os.close(w)
        self.pid = pid
        self._r = r

    def result(self, timeout: float = 60) -> Any:
        """The child's return value; raises AssertionError with its traceback if it failed, or if
        it sent nothing within ``timeout`` seconds (then it is killed: e.g. it waits on a lock)."""
        import select

        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._r], [], [], left)[0]:
                    os.kill(self.pid, signal.SIGKILL)
                    raise AssertionError(f"forked child {self.pid}: no result within {timeout}s")
                chunk = os.read(self._r, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(self._r)
            os.waitpid(self.pid, 0)
        if not chunks:
            raise AssertionError(f"forked child {self.pid} ended without a result")
        out = json.loads(b"".join(chunks))
        if not out["ok"]:
            raise AssertionError(f"forked child {self.pid} failed:\n{out['error']}")
        return out["result"]


def count_markers(root_url: str, topic: str, partitions: int) -> Counter:
    """Marker rows of every partition of ``topic``: Counter of (partition, type, (most, least))."""
    from pulsartx.log.partition import PartitionLog
    from pulsartx.naming import TopicName
    from pulsartx.storage.root import StorageRoot

    root = StorageRoot.resolve(root_url)
    out: Counter = Counter()
    for i in range(partitions):
        plog = PartitionLog(root, TopicName.parse(f"{topic}-partition-{i}"))
        rows = plog.read(0, plog.end_offset(), columns=["type", "txn_most_bits", "txn_least_bits"]).to_pylist()
        for r in rows:
            if r["type"] != "DATA":
                out[(i, r["type"], (r["txn_most_bits"], r["txn_least_bits"]))] += 1
    return out


def data_rows(root_url: str, topic: str, partitions: int) -> Counter:
    """DATA rows per (partition, txn) of ``topic``."""
    from pulsartx.log.partition import PartitionLog
    from pulsartx.naming import TopicName
    from pulsartx.storage.root import StorageRoot

    root = StorageRoot.resolve(root_url)
    out: Counter = Counter()
    for i in range(partitions):
        plog = PartitionLog(root, TopicName.parse(f"{topic}-partition-{i}"))
        for r in plog.read(0, plog.end_offset(), columns=["type", "txn_most_bits", "txn_least_bits"]).to_pylist():
            if r["type"] == "DATA":
                out[(i, (r["txn_most_bits"], r["txn_least_bits"]))] += 1
    return out


def read_tc_log(root_url: str, tc_id: int):
    """The TC log as a read-only replay (no sweep, no recovery): {least_bits: TxnMeta}."""
    from pulsartx.coordinator.tclog import TransactionLog
    from pulsartx.storage.root import StorageRoot

    txlog = TransactionLog(StorageRoot.resolve(root_url), tc_id).open()
    return {m.txn_id.least_bits: m for m in txlog.all()}


# ================================ child side ======================================================


def emit(kind: str, name: str | None = None, payload: Any = None) -> None:
    text = json.dumps(payload)
    sys.stdout.write(f"@@{kind} {name} {text}\n" if name else f"@@{kind} {text}\n")
    sys.stdout.flush()


def hang() -> None:
    """Wait to be SIGKILLed (bounded, so a broken parent never leaves children behind)."""
    time.sleep(600)
    os._exit(3)


def _config(cfg: dict | None):
    from pulsartx.coordinator.coordinator import CoordinatorConfig

    return CoordinatorConfig(**(cfg or {}))


def crash_txn(root: str, topic: str, partitions: int, stage: str, action: str = "COMMIT",
              timeout_ms: int = 60_000, stop_after: int = 1, cfg: dict | None = None) -> None:
    """Begin a transaction, send one message to each partition of ``topic``, then stop at ``stage``
    and wait to be killed:

    * ``open``: right after the sends (the TC log holds NEW + ADD_PARTITION only);
    * ``decided``: COMMITTING/ABORTING is durable, no participant touched (``before_participants``);
    * ``mid``: ``stop_after`` partitions (in sorted order) have their marker, the others none;
    * ``participants_done``: every marker written, the final COMMITTED/ABORTED not logged.
    """
    import pulsartx
    from pulsartx.coordinator import coordinator as coordinator_mod
    from pulsartx.coordinator import participants
    from pulsartx.coordinator.state import TxnAction

    client = pulsartx.Client(root, coordinator_config=_config(cfg))
    producers = [client.create_producer(f"{topic}-partition-{i}") for i in range(partitions)]
    txn = client.new_transaction(timeout_ms=timeout_ms)
    for i, p in enumerate(producers):
        p.send(f"m{i}".encode(), txn=txn)
    info = {"txn": [txn.id.most_bits, txn.id.least_bits]}
    if stage == "open":
        emit("EVENT", "open", info)
        hang()
    tc = client._coordinators().for_txn(txn.id)
    act = TxnAction(action)
    if stage == "decided":
        def stop(meta):
            emit("EVENT", "decided", dict(info, status=meta.status.value))
            hang()

        tc.end_transaction(txn.id, act, before_participants=stop)
    elif stage == "mid":
        names = sorted(str(t) for t in client.admin.partitions_of(topic))
        first = set(names[:stop_after])
        orig = participants.end_on_partition
        lock = threading.Lock()
        done: list[str] = []

        def slow(root_, meta, partition, action_):
            if partition in first:
                orig(root_, meta, partition, action_)
                with lock:
                    done.append(partition)
                    if len(done) == len(first):
                        emit("EVENT", "mid", dict(info, written=sorted(done)))
            hang()

        participants.end_on_partition = slow
        tc.end_transaction(txn.id, act)
    elif stage == "participants_done":
        orig_all = coordinator_mod.end_on_participants

        def then_stop(root_, meta, action_):
            failures = orig_all(root_, meta, action_)
            emit("EVENT", "participants_done", dict(info, failures=len(failures)))
            hang()

        coordinator_mod.end_on_participants = then_stop
        tc.end_transaction(txn.id, act)
    raise AssertionError(f"stage {stage!r} did not stop the child")


def txn_worker(root: str, topic: str, wid: int, n: int, tiny_timeout_ms: int, seed: int,
               go_file: str, cfg: dict | None = None) -> list[dict]:
    """``n`` transactions through the public API; each with 0 or 1 message, committed or aborted at
    random, some with a tiny timeout so the sweeper races with them. Records, per transaction, what
    was attempted and what was observed (``ok`` or the exception class)."""
    import pulsartx

    rng = random.Random(seed)
    client = pulsartx.Client(root, coordinator_config=_config(cfg))
    producer = client.create_producer(topic)
    _wait_for(go_file)
    records = []
    for i in range(n):
        t0 = time.perf_counter()
        tiny = rng.random() < 0.25
        txn = client.new_transaction(timeout_ms=tiny_timeout_ms if tiny else 60_000)
        rec: dict[str, Any] = {"txn": [txn.id.most_bits, txn.id.least_bits], "tiny": tiny, "send": None}
        if rng.random() < 0.5:
            try:
                producer.send(f"{wid}:{i}".encode(), txn=txn)
                rec["send"] = "ok"
            except Exception as e:
                rec["send"] = type(e).__name__
        if tiny:
            time.sleep(rng.uniform(0, 2 * tiny_timeout_ms) / 1000)
        rec["action"] = "commit" if rng.random() < 0.5 else "abort"
        try:
            txn.commit() if rec["action"] == "commit" else txn.abort()
            rec["observed"] = "ok"
        except Exception as e:
            rec["observed"] = type(e).__name__
        rec["state"] = txn.state.value
        rec["ms"] = round((time.perf_counter() - t0) * 1000, 1)
        records.append(rec)
    return records


def sweeper(root: str, stop_file: str, go_file: str, pause_ms: int = 20, cfg: dict | None = None) -> dict:
    """``client.admin.transactions.sweep(grace_ms=0)`` in a loop until ``stop_file`` exists."""
    import pulsartx

    client = pulsartx.Client(root, coordinator_config=_config(cfg))
    _wait_for(go_file)
    totals: Counter = Counter()
    passes = 0
    while not os.path.exists(stop_file):
        totals.update(client.admin.transactions.sweep(grace_ms=0))
        passes += 1
        time.sleep(pause_ms / 1000)
    return {"passes": passes, **totals}


def throughput_worker(root: str, seconds: float, go_file: str, cfg: dict | None = None) -> dict:
    """Empty transactions (begin + commit) for ``seconds`` once ``go_file`` exists (bench)."""
    import pulsartx

    client = pulsartx.Client(root, coordinator_config=_config(cfg))
    for tc in client._coordinators().all():  # open (and recover) every TC before the clock starts
        tc.transactions()
    _wait_for(go_file)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        client.new_transaction().commit()
        n += 1
    return {"txns": n, "seconds": time.perf_counter() - t0}


def end_and_hang(root: str, source: str, sink: str, subs: list[str], acked: int, action: str, go_file: str) -> None:
    """Process A of the read-your-writes tests: acknowledge the first ``acked`` messages of
    ``source`` on every subscription of ``subs`` (cumulatively on the first, as a list on the
    others) and send one message to every partition of ``sink``, all in one transaction; say
    ``sent``, wait for ``go_file``, then ``action`` it with the background completer stalled (no
    marker, no acknowledgement commit, no final entry is ever written here), say ``ended`` and wait
    to be killed."""
    import pulsartx
    from pulsartx.coordinator.coordinator import TransactionCoordinator

    stalled = threading.Event()

    def stall(self, meta):
        stalled.set()
        time.sleep(600)
        return meta

    TransactionCoordinator._complete = stall
    client = pulsartx.Client(root)
    txn = client.new_transaction(timeout_ms=600_000)
    for i, sub in enumerate(subs):
        consumer = client.subscribe(source, sub, initial_position=pulsartx.InitialPosition.Earliest)
        msgs = [consumer.receive(10_000) for _ in range(acked)]
        if i == 0:
            consumer.acknowledge_cumulative(msgs[-1], txn=txn)
        else:
            consumer.acknowledge(msgs, txn=txn)
        consumer.close()
    for i, name in enumerate(client.get_topic_partitions(sink)):
        client.create_producer(name).send(f"out-{i}".encode(), txn=txn)
    emit("EVENT", "sent", {"txn": [txn.id.most_bits, txn.id.least_bits]})
    _wait_for(go_file)
    txn.commit() if action == "COMMIT" else txn.abort()
    emit("EVENT", "ended", {"state": txn.state.value, "stalled": stalled.wait(10)})
    hang()


def id_worker(root: str, n: int, cfg: dict | None = None) -> list[list[int]]:
    """Begin ``n`` transactions and end each (alternately commit and abort, some with a
    partition registered), saying each TxnID as it is issued: the parent may SIGKILL at any point."""
    import pulsartx

    client = pulsartx.Client(root, coordinator_config=_config(cfg))
    partition = client.get_topic_partitions("ids")[0]
    ids = []
    for i in range(n):
        txn = client.new_transaction()
        ids.append([txn.id.most_bits, txn.id.least_bits])
        emit("EVENT", "id", ids[-1])
        if i % 3 == 0:
            txn._register_partitions({partition})
        txn.commit() if i % 2 else txn.abort()
    client.close()
    return ids


def _lease_of(client) -> list | None:
    """The lease this process holds, as the TC it would begin its next transaction on sees it."""
    tcs = client._coordinators()
    tcs.pick()
    held = tcs.leased
    return None if held is None else [held[0], held[1].owner, held[1].epoch]


def lease_worker(root: str, topic: str, wid: int, n: int, go_file: str, cfg: dict | None = None,
                 clock_offset_s: float = 0.0, close: bool = True) -> dict:
    """``n`` committed one-message transactions through the public API once ``go_file`` exists;
    returns the TCs they began on and the lease held. ``clock_offset_s`` moves this process's wall
    clock (a machine whose clock runs ahead or behind)."""
    import pulsartx

    _skew_clock(clock_offset_s)
    client = pulsartx.Client(root, coordinator_config=_config(cfg))
    producer = client.create_producer(topic)
    _wait_for(go_file)
    tcs = []
    for i in range(n):
        txn = client.new_transaction()
        producer.send(f"{wid}:{i}".encode(), txn=txn)
        txn.commit()
        tcs.append(txn.id.most_bits)
    lease = _lease_of(client)
    if close:  # gives the lease up; a process that dies keeps it until it expires
        client.close()
    return {"tcs": tcs, "lease": lease}


def lease_holder(root: str, topic: str, go_file: str, cfg: dict | None = None, open_timeout_ms: int = 600_000,
                 clock_offset_s: float = 0.0) -> dict:
    """Take a lease by beginning transactions: one left open (timeout ``open_timeout_ms``) and one
    committed with the background completer stalled (decided, no marker, no final entry); say
    ``held``. Then wait for ``go_file`` (the parent may SIGKILL, or SIGSTOP and SIGCONT, meanwhile)
    and begin, send and commit one more transaction, returning its TC and the lease then held."""
    import pulsartx
    from pulsartx.coordinator.coordinator import TransactionCoordinator

    _skew_clock(clock_offset_s)
    original = TransactionCoordinator._complete
    hang: dict[str, Any] = {"id": None}  # the TxnID whose completion hangs: our decided one only

    def stall(self, meta):
        # Not "the first completion": a takeover sweep finishes the previous owner's decided
        # transactions once they are older than recovery_grace_ms, which a slow start reaches.
        if meta.txn_id == hang["id"]:
            hang["id"] = None  # once
            time.sleep(600)
        return original(self, meta)

    TransactionCoordinator._complete = stall
    client = pulsartx.Client(root, coordinator_config=_config(cfg))
    producer = client.create_producer(topic)
    opened = client.new_transaction(timeout_ms=open_timeout_ms)
    producer.send(b"open", txn=opened)
    decided = client.new_transaction(timeout_ms=600_000)
    producer.send(b"decided", txn=decided)
    hang["id"] = decided.id
    decided.commit()
    emit("EVENT", "held", {"lease": _lease_of(client), "open": list(opened.id.as_tuple()),
                           "decided": list(decided.id.as_tuple())})
    _wait_for(go_file, timeout=600)
    txn = client.new_transaction()
    producer.send(b"after", txn=txn)
    txn.commit()
    return {"tc": txn.id.most_bits, "lease": _lease_of(client)}


def _skew_clock(offset_s: float) -> None:
    if offset_s:
        real = time.time
        time.time = lambda: real() + offset_s


def _wait_for(path: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"start signal {path} never came")
        time.sleep(0.005)


COMMANDS = {"crash_txn": crash_txn, "txn_worker": txn_worker, "sweeper": sweeper,
            "throughput_worker": throughput_worker, "end_and_hang": end_and_hang, "id_worker": id_worker,
            "lease_worker": lease_worker, "lease_holder": lease_holder}


def main(commands: dict[str, Any] | None = None) -> None:
    command, args = sys.argv[1], json.loads(sys.argv[2])
    try:
        emit("RESULT", payload={"ok": True, "result": (commands or COMMANDS)[command](**args)})
    except BaseException:
        emit("RESULT", payload={"ok": False, "error": traceback.format_exc()})
    finally:
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
