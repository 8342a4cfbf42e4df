"""Producer deduplication at its edges: a producer killed after its append landed and before it
learned so, lost responses on the commit, two producers of one name, explicit sequence ids out of
order or across queues, aborted transactions, partitioned topics, merges, compaction.

Each test asserts exactly what a READ_COMMITTED reader sees afterwards. The kill test's child is a
fresh interpreter (this file is its script, speaking ``_procs``'s protocol) SIGKILLed by the parent.
"""
from __future__ import annotations

import os
import threading

import pytest
from _procs import Child, emit, hang, main

import pulsartx
from pulsartx.exceptions import ProducerBusy
from pulsartx.log.message_id import MessageId
from pulsartx.storage import delta, faults
from pulsartx.storage.faults import Fault, Mode, Op
from pulsartx.storage.retry import OutcomeUnknown

pytestmark = pytest.mark.timeout(120)
HERE = os.path.abspath(__file__)
TOPIC = "dd"


def _seen(client, topic: str = TOPIC) -> list[bytes]:
    with client.create_reader(topic, MessageId.earliest) as r:
        return [m.data() for m in r]


class _Script(Child):
    script = HERE


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "root")


# ---- a producer killed after its append landed, before it learned so ----------------------------

def _append_then_hang(root: str, topic: str, n: int) -> None:
    """Send ``n`` messages (sequence ids 0..n-1) as one batch; the commit lands, then the process
    stops before the send returns, waiting to be killed."""
    from pulsartx.log import partition as partition_mod

    real = partition_mod.PartitionLog._write_group

    def landed_then_hang(self, items):
        real(self, items)
        emit("EVENT", "landed", [i.result.first_offset for i in items])
        hang()

    partition_mod.PartitionLog._write_group = landed_then_hang
    c = pulsartx.Client(root)
    p = c.create_producer(topic, producer_name="K", batching_max_messages=n, batching_max_publish_delay_ms=60_000)
    for i in range(n):
        p.send_async(f"m{i}".encode(), None, sequence_id=i)
    p.flush()
    emit("EVENT", "returned")  # never: the process hangs inside the commit
    hang()


def test_a_producer_killed_after_its_append_landed_resends_exactly_once(root):
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
    child = _Script("append_then_hang", root=root, topic=TOPIC, n=5)
    try:
        assert child.wait_event("landed") == [0]
    finally:
        child.sigkill()
    with pulsartx.Client(root) as c:
        p = c.create_producer(TOPIC, producer_name="K")
        assert p.last_sequence_id() == 4
        # The restarted application resends what it never saw acknowledged, under the same ids.
        ids = [p.send(f"m{i}".encode(), sequence_id=i) for i in range(5)]
        assert [i.offset() for i in ids] == [-1] * 5
        assert p.send(b"m5").offset() == 5  # numbering resumes after the persisted ids
        assert p.last_sequence_id() == 5
        p.close()
        assert _seen(c) == [f"m{i}".encode() for i in range(6)]


# ---- lost responses on the commit -----------------------------------------------------------------

@pytest.mark.parametrize("mode", [Mode.LOST, Mode.HTTP500])
def test_a_lost_response_on_the_commit_put_sends_once(root, mode):
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="L")
        p.send(b"a")
        fault = Fault(Op.CREATE, mode, after=True, match="_delta_log/00000000000000000002.json")
        faults.install([fault])
        try:
            mid = p.send(b"b")
        finally:
            faults.clear()
        assert fault.fired == 1
        assert mid.offset() == 1
        assert p.send(b"c").offset() == 2
        assert _seen(c) == [b"a", b"b", b"c"]


def test_a_send_whose_commit_outcome_is_unknown_is_written_once_after_the_application_retries(root):
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="U")
        p.send(b"a")
        commit = "_delta_log/00000000000000000002.json"
        lost = Fault(Op.CREATE, Mode.LOST, after=True, match=commit)
        unreadable = Fault(Op.READ, Mode.ERROR, match=commit, times=3)
        faults.install([lost, unreadable])
        try:
            try:
                p.send(b"b")
            except pulsartx.PulsarException:
                faults.clear()
                p.send(b"b")  # the application's retry of a send that failed
        finally:
            faults.clear()
        assert lost.fired == 1 and unreadable.fired >= 1
        p.close()
        assert _seen(c) == [b"a", b"b"]


@pytest.mark.parametrize("landed", [True, False])
def test_a_send_whose_outcome_stays_unknown_names_the_ids_whose_resend_keeps_it_once(root, monkeypatch, landed):
    """Storage unreadable for the whole retry budget after a failed commit put: the send fails with
    OutcomeUnknown naming its sequence ids, and a resend under them is written exactly once whether
    or not the first put had landed."""
    monkeypatch.setenv(delta.RETRY_ENV, "0.3")
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="V")
        p.send(b"a")
        commit = "_delta_log/00000000000000000002.json"
        put = Fault(Op.CREATE, Mode.LOST if landed else Mode.ERROR, after=landed, match=commit)
        faults.install([put, Fault(Op.READ, Mode.ERROR, match=commit, times=1_000_000)])
        try:
            with pytest.raises(OutcomeUnknown, match=r"resend them with the same producer name and sequence id 1 "):
                p.send(b"b")
        finally:
            faults.clear()
        assert p.send(b"b", sequence_id=1).offset() == (-1 if landed else 1)
        assert p.send(b"c").offset() == 2
        p.close()
        assert _seen(c) == [b"a", b"b", b"c"]


# ---- two live producers of one name ---------------------------------------------------------------

def test_two_live_producers_of_one_name_lose_no_message(root):
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p1 = c.create_producer(TOPIC, producer_name="same")
        try:
            p2 = c.create_producer(TOPIC, producer_name="same")
        except pulsartx.PulsarException:
            return  # refused, as Pulsar refuses it: nothing can be lost
        a = p1.send(b"from-p1")
        b = p2.send(b"from-p2")
        # Accepted: then both messages must be there, or the second send must fail.
        assert (a.offset(), b.offset()) == (0, 1)
        assert _seen(c) == [b"from-p1", b"from-p2"]


def test_a_second_producer_of_a_name_in_one_process_is_busy_until_the_first_closes(root):
    with pulsartx.Client(root) as c, pulsartx.Client(root) as other:
        c.admin.create_topic(TOPIC, 2)
        p1 = c.create_producer(TOPIC, producer_name="same")
        with pytest.raises(ProducerBusy, match="'same' is already open on persistent://public/default/dd in this process"):
            c.create_producer(TOPIC, producer_name="same")
        # Another Client on the root is the same process: refused too, and so is one partition of the topic.
        with pytest.raises(ProducerBusy, match="another producer_name"):
            other.create_producer(TOPIC, producer_name="same")
        with pytest.raises(ProducerBusy, match=r"open on persistent://public/default/dd-partition-1 \(its producer "
                                               r"made on persistent://public/default/dd\) in this process"):
            other.create_producer(f"{TOPIC}-partition-1", producer_name="same")
        other.create_producer("elsewhere", producer_name="same").close()  # another topic: its own sequence
        c.create_producer(TOPIC).close()  # generated names never collide
        c.create_producer(TOPIC).close()
        p1.send(b"a", partition_key="k")
        p1.close()
        p2 = other.create_producer(TOPIC, producer_name="same")  # released by close()
        assert p2.last_sequence_id() == 0
        p2.send(b"b", partition_key="k")
        p2.close()
        assert sorted(m for part in range(2) for m in _seen(c, f"{TOPIC}-partition-{part}")) == [b"a", b"b"]


def _second_producer(root: str, topic: str, txn: bool) -> dict:
    """Make producer "same" while the parent's is live, wait for the parent's go (a line on stdin),
    then send (in a transaction, committed, with ``txn``); report what each step raised."""
    import sys

    out: dict = {}
    c = pulsartx.Client(root)
    p = c.create_producer(topic, producer_name="same")
    emit("EVENT", "made", p.last_sequence_id())
    sys.stdin.readline()
    t = c.new_transaction() if txn else None
    for step, run in (("send", lambda: p.send(b"from-child", txn=t)), ("commit", lambda: t and t.commit()),
                      ("close", c.close)):
        try:
            run()
            out[step] = "ok"
        except pulsartx.PulsarException as e:
            out[step] = [type(e).__name__, str(e)]
    return out


class _Interactive(_Script):
    stdin = True


@pytest.mark.parametrize("txn", [False, True], ids=["plain", "transaction"])
def test_a_live_producer_of_the_name_in_another_process_fails_the_second_writer(root, txn):
    """Another process's producer of the name is not seen when made: the first append that finds
    the name's persisted id above what this producer knew of fails with ProducerBusy, where
    deduplication dropped its message as a duplicate while send() reported success."""
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="same")
        child = _Interactive("second_producer", root=root, topic=TOPIC, txn=txn)
        try:
            assert child.wait_event("made") == -1
            assert p.send(b"p0").offset() == 0  # sequence id 0, above what the child's producer found
            child.proc.stdin.write("go\n")
            child.proc.stdin.flush()
            got = child.result()
        finally:
            child.kill()
        assert got["send"][0] == "ProducerBusy"
        assert "another producer named 'same' appended sequence id 0" in got["send"][1]
        assert "above this producer's -1" in got["send"][1]
        if txn:
            assert got["commit"][0] == "TransactionHasOperationFailed", got  # it lost a send: it may not commit
        assert p.send(b"p1").offset() >= 1  # the first producer goes on (after an abort marker, in a transaction)
        p.close()
        assert _seen(c) == [b"p0", b"p1"]


def test_the_producer_whose_name_was_taken_fails_its_next_append_too(root):
    """Either producer's append fails once the other appended above what it knew of."""
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="same")
        assert p.send(b"p0").offset() == 0
        child = _Interactive("second_producer", root=root, topic=TOPIC, txn=False)
        try:
            assert child.wait_event("made") == 0
            child.proc.stdin.write("go\n")
            child.proc.stdin.flush()
            got = child.result()
        finally:
            child.kill()
        assert got["send"] == "ok"  # made after p0 landed: it numbered past it (sequence id 1)
        with pytest.raises(ProducerBusy, match="appended sequence id 1 to .*, above this producer's 0"):
            p.send(b"lost-before")
        p.close()
        assert _seen(c) == [b"p0", b"from-child"]


def test_an_async_send_refused_as_busy_tells_its_callback_and_flush(root):
    from pulsartx.log.partition import build_records, shared_log
    from pulsartx.naming import TopicName

    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="same", batching_max_publish_delay_ms=60_000)
        # Another writer of the name (as another process's producer would) appends sequence id 0.
        other = build_records([b"other"], producer_name="same", sequence_ids=[0])
        shared_log(c.root, TopicName.parse(TOPIC).with_partition(0)).append(other, producer_name="same")
        got: list = []
        p.send_async(b"mine", lambda r, m: got.append((r, m)))
        with pytest.raises(ProducerBusy, match="appended sequence id 0 to .*, above this producer's -1"):
            p.flush()
        assert got == [(pulsartx.Result.ProducerBusy, None)]
        p.close()
        assert _seen(c) == [b"other"]


def test_the_floor_check_at_the_partition_log(root):
    """The check itself: an append whose floor is below the name's persisted id fails; without a
    floor (Spark's task appends) it is deduplicated as before; batches submitted one after the
    other share a commit, each with a floor that counts the ones before it (pipelining)."""
    from pulsartx.log.partition import build_records, shared_log
    from pulsartx.naming import TopicName
    from pulsartx.storage.root import StorageRoot

    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
    plog = shared_log(StorageRoot.resolve(root), TopicName.parse(TOPIC).with_partition(0))

    def rec(*seqs: int):
        return build_records([b"x%d" % s for s in seqs], producer_name="n", sequence_ids=list(seqs))

    assert plog.append(rec(0, 1), producer_name="n").offsets == [0, 1]
    with pytest.raises(ProducerBusy, match="appended sequence id 1 to .*-partition-0, above this producer's 0"):
        plog.wait_append(plog.submit_append(rec(1, 2), producer_name="n", floor=0))
    assert plog.wait_append(plog.submit_append(rec(0, 1), producer_name="n", floor=1)).offsets == [None, None]
    assert plog.append(rec(1, 2), producer_name="n").offsets == [None, 2]  # no floor: deduplicated
    first = plog.submit_append(rec(3, 4), producer_name="n", floor=2)
    second = plog.submit_append(rec(5), producer_name="n", floor=4)
    assert (plog.wait_append(first).offsets, plog.wait_append(second).offsets) == ([3, 4], [5])


# ---- explicit sequence ids ----------------------------------------------------------------------

def test_explicit_sequence_ids_backwards_equal_and_with_gaps(root):
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="E")
        assert p.send(b"s10", sequence_id=10).offset() == 0
        assert p.send(b"s10-again", sequence_id=10).offset() == -1  # equal: a duplicate
        assert p.send(b"s5", sequence_id=5).offset() == -1  # backwards: a duplicate, as in Pulsar
        assert p.send(b"s20", sequence_id=20).offset() == 1  # a gap is fine
        assert p.last_sequence_id() == 20
        assert p.send(b"auto").offset() == 2  # numbered 21
        assert p.last_sequence_id() == 21
        p.close()
        assert _seen(c) == [b"s10", b"s20", b"auto"]


def test_an_explicit_id_queued_behind_an_unnumbered_message_is_kept(root):
    """send_async numbers an unnumbered message when its batch is appended, but takes an explicit
    id at once: a message sent with ``sequence_id=`` after an unnumbered one got a lower id than
    it, in the same batch, and was dropped as a duplicate. Pulsar numbers at send time."""
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="M", batching_max_publish_delay_ms=60_000)
        got: list = []
        p.send_async(b"auto", lambda r, m: got.append(m))
        p.send_async(b"explicit", lambda r, m: got.append(m), sequence_id=5)
        p.flush()
        assert [m.offset() for m in got] == [0, 1]
        p.close()
        assert _seen(c) == [b"auto", b"explicit"]


def test_explicit_ids_in_a_transaction_and_outside_it_are_kept_in_send_order(root):
    """A plain batch appended before an earlier-sent transactional one (it filled first) made the
    transaction's lower explicit ids look persisted: the committed transaction lost them."""
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="T", batching_max_messages=2,
                              batching_max_publish_delay_ms=60_000)
        txn = c.new_transaction()
        got: dict[bytes, MessageId] = {}
        p.send_async(b"t1", lambda r, m: got.__setitem__(b"t1", m), sequence_id=1, txn=txn)
        p.send_async(b"p2", lambda r, m: got.__setitem__(b"p2", m), sequence_id=2)
        p.send_async(b"p3", lambda r, m: got.__setitem__(b"p3", m), sequence_id=3)  # fills the plain batch
        txn.commit()
        p.flush()
        assert got[b"t1"].offset() != -1
        p.close()
        assert sorted(_seen(c)) == [b"p2", b"p3", b"t1"]


def test_explicit_ids_interleaved_across_queues_are_all_kept(root):
    """Send order t0 (txn), p1, t2 (txn), p3, then an unnumbered plain message: each queue's batch is
    appended before another queue's message joins, so every id rises in append order."""
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="I", batching_max_publish_delay_ms=60_000)
        txn = c.new_transaction()
        got: dict[bytes, MessageId] = {}

        def send(value: bytes, seq: int | None, t=None) -> None:
            p.send_async(value, lambda r, m: got.__setitem__(value, m), sequence_id=seq, txn=t)

        send(b"t0", 0, txn)
        send(b"p1", 1)
        send(b"t2", 2, txn)
        send(b"p3", 3)
        send(b"auto", None)
        txn.commit()
        p.flush()
        assert sorted(v for v, m in got.items() if m.offset() == -1) == []
        assert p.last_sequence_id() == 4
        p.close()
        assert _seen(c) == [b"t0", b"p1", b"t2", b"p3", b"auto"]


def test_a_callback_sending_an_explicit_id_to_another_queue_does_not_deadlock(root):
    """A send_async callback runs while its queue's append still holds that queue's flush lock. A
    callback that refills that queue, then sends a caller-chosen id to another queue (which would
    append the refilled queue first), must not wait for its own lock."""
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="C", batching_max_publish_delay_ms=60_000)
        txn = c.new_transaction()
        done: list[MessageId] = []

        def chain(res, mid) -> None:
            p.send_async(b"p1", lambda r, m: done.append(m), sequence_id=1)
            p.send_async(b"t2", lambda r, m: done.append(m), sequence_id=2, txn=txn)

        p.send_async(b"p0", chain, sequence_id=0)
        worker = threading.Thread(target=p.flush, daemon=True)
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), "flush() deadlocked in its own callback"
        txn.commit()
        p.flush()
        assert sorted(m.offset() for m in done) == [1, 2]
        p.close()
        assert _seen(c) == [b"p0", b"p1", b"t2"]


# ---- transactions ------------------------------------------------------------------------------------

def test_an_aborted_message_s_sequence_id_counts_as_persisted(root):
    """As in Pulsar, whose dedup runs before the transaction buffer: the ids of an aborted
    transaction's messages stay used, and a resend under them is dropped. Resend under new ids."""
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="A")
        txn = c.new_transaction()
        assert p.send(b"in-txn", txn=txn).offset() == 0  # sequence id 0
        txn.abort()
        assert p.send(b"again", sequence_id=0).offset() == -1
        assert p.send(b"new").offset() >= 1  # numbered 1
        p.close()
        assert _seen(c) == [b"new"]


# ---- partitioned topics -------------------------------------------------------------------------

def test_sequence_ids_across_partitions_and_a_restart(root):
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 3)
        p = c.create_producer(TOPIC, producer_name="P")
        ids = [p.send(f"m{i}".encode(), partition_key=f"k{i}") for i in range(9)]
        assert all(i.offset() >= 0 for i in ids)
        p.close()
        q = c.create_producer(TOPIC, producer_name="P")
        assert q.last_sequence_id() == 8
        # A resend of every message under its id, to the same partition (by key): all duplicates.
        again = [q.send(f"m{i}".encode(), partition_key=f"k{i}", sequence_id=i) for i in range(9)]
        assert [i.offset() for i in again] == [-1] * 9
        q.send(b"m9", partition_key="k9")
        assert q.last_sequence_id() == 9
        q.close()
        seen = [m for part in range(3) for m in _seen(c, f"{TOPIC}-partition-{part}")]
        assert sorted(seen) == sorted(f"m{i}".encode() for i in range(10))


# ---- maintenance: compaction and retention ----------------------------------------------------------

def test_dedup_state_survives_compaction_and_retention(root):
    from pulsartx.maintenance.compaction import compact_partition
    from pulsartx.maintenance.retention import apply_retention
    from pulsartx.naming import TopicName

    part = TopicName.parse(TOPIC).with_partition(0)
    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="C")
        for i in range(6):
            p.send(f"m{i}".encode())
        txn = c.new_transaction()
        p.send(b"aborted", txn=txn)  # sequence id 6
        txn.abort()
        for i in range(7, 10):
            p.send(f"m{i}".encode())
        p.close()
        assert compact_partition(c.root, part).skipped is None
        assert apply_retention(c.root, part, max_bytes=1, force=True).files_deleted >= 1
        q = c.create_producer(TOPIC, producer_name="C")
        assert q.last_sequence_id() == 9
        assert [q.send(b"dup", sequence_id=i).offset() for i in (0, 6, 9)] == [-1, -1, -1]
        assert q.send(b"m10").offset() == 11  # offsets never restart; sequence id 10
        q.close()
        with c.create_reader(TOPIC, MessageId.earliest) as r:
            assert [m.data() for m in r][-1:] == [b"m10"]


# ---- send_table ---------------------------------------------------------------------------------------

def test_send_table_numbers_rows_after_sends_and_a_restart_resumes(root):
    import pyarrow as pa

    with pulsartx.Client(root) as c:
        c.admin.create_topic(TOPIC, 1)
        p = c.create_producer(TOPIC, producer_name="S")
        p.send(b"first")
        ids = p.send_table(pa.table({"value": [b"r0", b"r1", b"r2"]}))
        assert [i.offset() for i in ids] == [1, 2, 3]
        assert p.last_sequence_id() == 3
        p.close()
        q = c.create_producer(TOPIC, producer_name="S")
        assert q.last_sequence_id() == 3
        assert [i.offset() for i in q.send_table(pa.table({"value": [b"r3"]}))] == [4]
        q.close()
        assert _seen(c) == [b"first", b"r0", b"r1", b"r2", b"r3"]


# ---- the child side -----------------------------------------------------------------------------

COMMANDS = {"append_then_hang": _append_then_hang, "second_producer": _second_producer}

if __name__ == "__main__":
    main(COMMANDS)
