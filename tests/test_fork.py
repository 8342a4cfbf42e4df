"""Clients across ``os.fork()``: what a forked child may use of what its parent made, and children
started by multiprocessing's ``fork`` and ``spawn`` methods committing and aborting their own
transactions while their parent does (docs/design/clients-across-fork.md).

The single-fork tests fork this process (``_procs.Forked``) after it used a Client, so the child
cannot run deltalake. The multiprocessing tests run the parent as a fresh interpreter
(``_procs.Child``, this file being its script), so that whether it used storage before forking is
the test's choice and not that of the tests that ran before; this file is also the script of its
``spawn`` children. No child judges anything: each records a history (tests/reliability/history.py),
and the checker (tests/reliability/checker.py) reads every topic READ_COMMITTED afterwards.
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from _procs import Child, Forked, main, read_tc_log
from reliability import final
from reliability.checker import check
from reliability.history import History, history_files, read_events, txn_list

import pulsartx
from pulsartx import MessageId
from pulsartx.coordinator.registry import Coordinators

pytestmark = pytest.mark.timeout(300)
HERE = os.path.abspath(__file__)
TOPIC = "persistent://public/default/t"
REFUSED = "ForkedProcessError"


def values(client: pulsartx.Client, topic: str = TOPIC) -> list[bytes]:
    """Every message of ``topic`` a READ_COMMITTED reader from the earliest position sees, in order."""
    with client.create_reader(topic, MessageId.earliest) as reader:
        return [m.data() for m in reader]


def outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    """What ``fn()`` did, as JSON: its result, or the class and message of what it raised."""
    try:
        return {"result": fn()}
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e)}


def assert_refused(got: dict[str, Any], what: str) -> None:
    assert got.get("error") == REFUSED, got
    assert what in got["message"] and "after the fork" in got["message"] and "'spawn'" in got["message"], got


# ================================ one fork, a used client =========================================


def test_a_forked_child_never_joins_its_parents_next_transaction(tmp_path):
    """The child begins a transaction on the inherited Client and sends to it; the parent then
    begins, sends and commits one. Both would hold the same TxnID (the reserved block was copied),
    the parent's registration would join the child's entry, and its commit would show the child's
    message, never committed. The child's Client starts over as a fresh one, which cannot run
    deltalake here: it is refused at once, and only the parent's message becomes visible."""
    client = pulsartx.Client(str(tmp_path))
    producer = client.create_producer(TOPIC)
    with client.new_transaction() as first:
        producer.send(b"before", txn=first)

    def child() -> dict[str, Any]:
        def begin_and_send() -> list[int]:
            txn = client.new_transaction()
            client.create_producer(TOPIC).send(b"child", txn=txn)
            return list(txn.id.as_tuple())  # left open: the child stops here
        return outcome(begin_and_send)

    got = Forked(child).result()
    txn = client.new_transaction()
    producer.send(b"parent", txn=txn)
    txn.commit()
    assert client.flush(30)
    assert values(client) == [b"before", b"parent"]
    assert txn.state is pulsartx.TransactionState.COMMITTED
    assert_refused(got, "deltalake was used by process")


def test_a_forked_child_cannot_send_as_its_parents_producer(tmp_path):
    """Sending from the inherited producer would reuse its name and next sequence id, so the
    parent's next message would be dropped as a duplicate of the child's."""
    client = pulsartx.Client(str(tmp_path))
    producer = client.create_producer(TOPIC)
    producer.send(b"m0")
    got = Forked(lambda: outcome(lambda: str(producer.send(b"child")))).result()
    producer.send(b"m1")
    assert values(client) == [b"m0", b"m1"]
    assert producer.last_sequence_id() == 1
    assert_refused(got, f"producer {producer.producer_name()} on {TOPIC}")


def test_a_forked_child_cannot_end_its_parents_transaction(tmp_path):
    """The parent's open transaction is its own to end: a child committing it would publish what
    the parent is about to abort."""
    client = pulsartx.Client(str(tmp_path))
    producer = client.create_producer(TOPIC)
    txn = client.new_transaction()
    producer.send(b"open", txn=txn)
    got = Forked(lambda: outcome(txn.commit)).result()
    txn.abort()
    assert client.flush(30)
    assert values(client) == []
    assert txn.state is pulsartx.TransactionState.ABORTED
    assert_refused(got, f"transaction {txn.id}")


def test_a_forked_child_leaves_no_transaction_undecided(tmp_path):
    """A child that committed on the inherited Client had its commit() return at the decision,
    but the completer's threads had not survived the fork: flush() timed out and the transaction
    stayed COMMITTING. Now the child is refused before it begins anything, and every transaction in
    the TC logs is finished once the parent flushed."""
    client = pulsartx.Client(str(tmp_path))
    producer = client.create_producer(TOPIC)
    with client.new_transaction() as first:
        producer.send(b"before", txn=first)
    assert client.flush(30)

    def child() -> dict[str, Any]:
        def commit_and_flush() -> dict[str, Any]:
            txn = client.new_transaction()
            client.create_producer(TOPIC).send(b"child", txn=txn)
            txn.commit()
            return {"txn": list(txn.id.as_tuple()), "flushed": client.flush(3)}
        return outcome(commit_and_flush)

    got = Forked(child).result()
    count = Coordinators(client.root, recover_on_open=False).count
    statuses = {(m.txn_id.as_tuple(), m.status.value) for tc in range(count)
                for m in read_tc_log(client.root.url, tc).values()}
    assert statuses == {(first.id.as_tuple(), "COMMITTED")}
    assert values(client) == [b"before"]
    assert_refused(got, "deltalake was used by process")


def _subscribed(client: pulsartx.Client) -> Any:
    consumer = client.subscribe(TOPIC, "s", initial_position=pulsartx.InitialPosition.Earliest)
    client.create_producer(TOPIC).send(b"m0")
    return consumer


@pytest.mark.parametrize("what", ["consumer", "reader", "keyed client"])
def test_a_forked_child_cannot_use_what_carries_its_parents_identity(tmp_path, what):
    """A consumer's lease and prefetched messages, a reader's position and a transaction key are
    the parent's: in the child each is refused at its first use, and the parent's copy is untouched
    (the consumer still receives m0, which the child would otherwise have received and acknowledged)."""
    root = str(tmp_path)
    if what == "consumer":
        client = pulsartx.Client(root)
        consumer = _subscribed(client)

        def use() -> Any:
            consumer.acknowledge(consumer.receive(5000))
        name = f"consumer {consumer.consumer_name()} of subscription 's'"
    elif what == "reader":
        client = pulsartx.Client(root)
        client.create_producer(TOPIC).send(b"m0")
        reader = client.create_reader(TOPIC, MessageId.earliest)

        def use() -> Any:
            return reader.read_next(5000).data().decode()
        name = f"reader on {TOPIC}"
    else:
        client = pulsartx.Client(root, transaction_key="k", owner="o")

        def use() -> Any:
            return list(client.new_transaction().id.as_tuple())
        name = "the Client holding transaction key 'k' (owner 'o', epoch 0)"
    got = Forked(lambda: outcome(use)).result()
    assert_refused(got, name)
    if what == "consumer":
        assert consumer.receive(5000).data() == b"m0"
        consumer.close()
    elif what == "reader":
        assert reader.read_next(5000).data() == b"m0"
    else:
        with client.new_transaction():
            pass  # the parent's key is still at its epoch: nothing fenced it
    client.close()


# ================================ locks held by another thread at the fork ========================


def _held_at_fork(name: str, root: Any) -> tuple[Any, Callable[[], Any]]:
    """(a lock of the parent's process-wide state, what takes it in the child)."""
    from pulsartx import metrics
    from pulsartx.client.transaction import _HELPERS, helper_pool
    from pulsartx.coordinator import registry
    from pulsartx.coordinator.completer import Completer
    from pulsartx.log import partition
    from pulsartx.maintenance import merging
    from pulsartx.naming import TopicName
    from pulsartx.storage import appender, group_commit
    from pulsartx.subscription import store

    p0 = TopicName.parse("t-partition-0")
    if name == "partition writers":
        return partition._SHARED.lock, lambda: repr(partition.shared_log(root, p0))
    if name == "subscription stores":
        return store._SHARED.lock, lambda: store.shared_store(root, p0, "s").subscription
    if name == "TC sets":
        return registry._SHARED.lock, lambda: Coordinators.shared(root).count
    if name == "group commit":
        return group_commit._LINGER, lambda: group_commit.urgent().__enter__() is None
    if name == "checkpoints":
        return appender._CHECKPOINT_QUEUED.lock, lambda: appender.schedule_checkpoint(root, ("no-table",), 1).result(10)
    if name == "merges":
        return merging._QUEUED.lock, lambda: merging.schedule_merge(root, p0)
    if name == "thread pool":
        helper_pool()
        return _HELPERS._lock, lambda: helper_pool().submit(lambda: 7).result(10)
    if name == "completer":
        completer = Completer()
        return completer._lock, lambda: completer.flush(1)
    assert name == "metrics"
    return metrics._lock, lambda: metrics.record_tc_event(0, "created")


@pytest.mark.parametrize("name", ["partition writers", "subscription stores", "TC sets", "group commit",
                                  "checkpoints", "merges", "thread pool", "completer", "metrics"])
def test_no_lock_held_at_the_fork_stays_held_in_the_child(tmp_path, name):
    """A lock another thread holds when the process forks stays held forever in the child, which
    has no such thread: the child must get new ones."""
    from pulsartx.storage.root import StorageRoot

    root = StorageRoot.resolve(str(tmp_path))
    lock, use = _held_at_fork(name, root)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(10)
    try:
        got = Forked(lambda: outcome(use)).result(timeout=20)
    finally:
        release.set()
        holder.join(10)
    assert "error" not in got, got


def test_a_process_cache_starts_empty_in_a_forked_child():
    """What a process keeps for itself is the parent's alone: a child sees none of its entries
    and makes its own, while the parent keeps its own."""
    from pulsartx.forks import ProcessCache

    cache: ProcessCache[str, str] = ProcessCache()
    assert cache.get_or_make("k", lambda: "parent") == "parent"
    assert cache.get_or_make("k", lambda: "again") == "parent"
    assert cache.get_or_make("k", lambda: "remade", keep=lambda v: v != "parent") == "remade"

    def in_child() -> list:
        return [dict(cache), cache.get_or_make("k", lambda: "child")]

    assert Forked(in_child).result(timeout=20) == [{}, "child"]
    assert dict(cache) == {"k": "remade"}
    cache.drop(lambda k: k == "k")
    assert dict(cache) == {}


# ================================ real multiprocessing ============================================

# Which of its transactions each process commits (C) and aborts (A): no two plans agree, so two
# processes that shared a TxnID would disagree on its outcome.
PLANS = {"parent-before": "CACA", "parent": "CCAA", "child0": "ACAC", "child1": "AACC"}


def _work(client: pulsartx.Client, history: History, name: str) -> None:
    """A transaction of two messages (one per partition) per letter of ``PLANS[name]``, committed
    or aborted as it says, recorded as the checker reads them."""
    producer = client.create_producer(TOPIC)
    for i, plan in enumerate(PLANS[name]):
        history.invoke("begin")
        txn = client.new_transaction()
        t = txn_list(txn)
        history.ok("begin", txn=t)
        for j in range(2):
            value = f"{name}:{i}:{j}"
            history.invoke("send", topic=TOPIC, value=value, txn=t)
            mid = producer.send(value.encode(), txn=txn)
            history.ok("send", topic=TOPIC, value=value, txn=t, partition=mid.partition(), offset=mid.offset())
        action = "commit" if plan == "C" else "abort"
        history.invoke(action, txn=t)
        txn.commit() if action == "commit" else txn.abort()
        history.ok(action, txn=t)
    producer.close()


def _child(client_or_root: pulsartx.Client | str, path: str, name: str) -> None:
    """A multiprocessing child: the inherited Client (fork) or the root (spawn). Whatever it meets
    is recorded; it leaves with os._exit (docs/design/deltalake-in-processes.md)."""
    history = History(path, name)
    try:
        client = final.client(client_or_root, auto_create_partitions=2) if isinstance(client_or_root, str) \
            else client_or_root
        _work(client, history, name)
        history.ok("flush", flushed=client.flush(30))
        client.close()
    except BaseException as e:  # recorded for the test to judge
        history.fail("stopped", e, kind=type(e).__name__)
    finally:
        history.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def family(root: str, method: str, used: bool, history_dir: str, children: int = 2) -> dict:
    """The parent: a Client (used first, or not), ``children`` multiprocessing children started
    with ``method``, and the parent's own transactions while they run theirs."""
    import multiprocessing as mp

    client = final.client(root, auto_create_partitions=2)
    history = History(os.path.join(history_dir, "parent.jsonl"), "parent")
    if used:
        _work(client, history, "parent-before")
    ctx = mp.get_context(method)
    procs = []
    for k in range(children):
        handed = client if method == "fork" else root
        proc = ctx.Process(target=_child, args=(handed, os.path.join(history_dir, f"child{k}.jsonl"), f"child{k}"))
        proc.start()
        procs.append(proc)
    try:
        _work(client, history, "parent")
    except Exception as e:  # recorded for the test to judge, with what the children did
        history.fail("stopped", e, kind=type(e).__name__)
    for proc in procs:
        proc.join(120)
    flushed = client.flush(30)
    client.close()
    history.close()
    return {"exitcodes": [proc.exitcode for proc in procs], "flushed": flushed}


class Family(Child):
    script = HERE


@pytest.mark.parametrize("method, used", [("fork", False), ("fork", True), ("spawn", True)])
def test_children_and_parent_each_commit_and_abort_their_own_transactions(tmp_path, method, used):
    """Every committed message is read exactly once, no aborted one ever, and no two processes
    shared a transaction. Forked before the parent used storage, the children use the Client they
    inherited; forked after it, they are refused at their first use (deltalake cannot run there)
    and nothing of theirs reaches storage; spawned, they open the root and work."""
    root, hist = str(tmp_path / "root"), tmp_path / "history"
    hist.mkdir()
    children = 2
    got = Family("family", root=root, method=method, used=used, history_dir=str(hist),
                 children=children).result(timeout=240)
    assert got["exitcodes"] == [0] * children and got["flushed"], got

    events = read_events(history_files(hist))
    report = check(events, final.collect_final(root, None, [TOPIC]))
    assert report.anomalies.total == 0, str(report)

    refused = method == "fork" and used
    writers = ["parent"] + (["parent-before"] if used else []) + ([] if refused else [f"child{k}" for k in range(children)])
    committed = {f"{w}:{i}:{j}" for w in writers for i, plan in enumerate(PLANS[w]) if plan == "C" for j in range(2)}
    with final.client(root) as reader_client:
        visible = [v for _p, _o, v in final.visible(reader_client, TOPIC)]
    assert sorted(visible) == sorted(committed)  # each once; no aborted one, nobody else's

    begun = [tuple(e["txn"]) for e in events if e["f"] == "begin" and e["type"] == "ok"]
    txns = sum(len(PLANS[w]) for w in writers)
    assert len(begun) == len(set(begun)) == txns  # no TxnID in two processes
    ends = [e for e in events if e["f"] in ("commit", "abort") and e["type"] != "invoke"]
    assert [e["type"] for e in ends] == ["ok"] * txns, ends
    failures = {e["p"]: e for e in events if e["f"] == "stopped"}
    if refused:
        assert set(failures) == {f"child{k}" for k in range(children)}
        for e in failures.values():
            assert e["kind"] == REFUSED and "deltalake was used by process" in e["error"], e
    else:
        assert failures == {}
        flushes = [e for e in events if e["f"] == "flush"]
        assert [e["flushed"] for e in flushes] == [True] * children


COMMANDS = {"family": family}

if __name__ == "__main__":
    main(COMMANDS)
