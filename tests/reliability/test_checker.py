"""The checker on small synthetic histories: a clean one finds nothing, and each anomaly planted in
it is found, counted exactly, and nothing else is reported (so the suites can really fail)."""
from __future__ import annotations

import copy

import pytest

from .checker import FinalState, check
from .history import History, read_events

T1, T2, T3 = (0, 1), (1, 1), (2, 1)


class H:
    """Builds one process's events the way History writes them."""

    def __init__(self, p: str):
        self.p, self.i, self.events = p, 0, []

    def ev(self, kind: str, f: str, **kw):
        self.i += 1
        self.events.append({"p": self.p, "i": self.i, "t": float(self.i), "type": kind, "f": f, **kw})
        return self

    def send(self, topic, value, txn, partition, offset, kind="ok"):
        self.ev("invoke", "send", topic=topic, value=value, txn=list(txn) if txn else None)
        return self.ev(kind, "send", topic=topic, value=value, partition=partition, offset=offset,
                       txn=list(txn) if txn else None)

    def end(self, f, txn, kind="ok"):
        self.ev("invoke", f, txn=list(txn))
        return self.ev(kind, f, txn=list(txn))


def base() -> tuple[list[dict], FinalState]:
    """T1 commits a@0 and b@0 over two partitions of "in"; T2 aborts c@1; a plain send d@1; a
    consumer polls a, d in order; a transformer acks a in T3 (committed, output t:a) and d is
    drained; a batch read sees T1 whole."""
    w = H("w")
    w.ev("ok", "begin", txn=list(T1)).send("in", "a", T1, 0, 0).send("in", "b", T1, 1, 0).end("commit", T1)
    w.ev("ok", "begin", txn=list(T2)).send("in", "c", T2, 0, 1).end("abort", T2)
    w.send("in", "d", None, 1, 2)
    c = H("c")
    c.ev("ok", "poll", consumer="c0", epoch=0, topic="in", msgs=[[0, 0, "a"]])
    c.ev("ok", "poll", consumer="c0", epoch=0, topic="in", msgs=[[0, 3, "e"]])
    c.ev("ok", "begin", txn=list(T3)).send("out", "t:a", T3, 0, 0)
    c.ev("ok", "ack", txn=list(T3), topic="in", sub="s", msgs=[[0, 0, "a"]]).end("commit", T3)
    c.ev("ok", "read", topics=["in"], msgs=[["in", 0, 0, "a"], ["in", 1, 0, "b"]])
    c.ev("ok", "mrp", topic="in", partition=0, blocked_at=1, t=10.0)
    c.ev("ok", "mrp", topic="in", partition=0, blocked_at=1, t=11.0)
    c.ev("ok", "mrp", topic="in", partition=0, blocked_at=None, t=12.0)
    final = FinalState(
        visible={"in": [(0, 0, "a"), (0, 3, "e"), (1, 0, "b"), (1, 2, "d")], "out": [(0, 0, "t:a")]},
        stored={"in": [(0, 0, "a", T1), (0, 1, "c", T2), (0, 3, "e", None), (1, 0, "b", T1), (1, 2, "d", None)],
                "out": [(0, 0, "t:a", T3)]},
        txn_status={T1: "COMMITTED", T2: "ABORTED", T3: "COMMITTED"},
        ongoing={("in", 0): [], ("in", 1): []},
        drained={("in", "s"): ["b", "d", "e"]},
    )
    return w.events + c.events, final


def counts(events, final, limit=5.0) -> dict[str, int]:
    return check(events, final, stuck_limit_s=limit).anomalies.nonzero()


def test_clean_history_has_no_anomaly():
    events, final = base()
    rep = check(events, final, stuck_limit_s=5.0)
    assert rep.anomalies.nonzero() == {}, rep
    assert rep.stats["txns"] == 3 and rep.stats["txn_committed"] == 2 and rep.stats["txn_aborted"] == 1
    assert rep.stats["visible"] == 5 and rep.stats["batch_reads"] == 1


def test_aborted_read_in_final_state_poll_and_batch_read():
    events, final = base()
    final.visible["in"].append((0, 1, "c"))  # T2 aborted, yet c is visible...
    # ...so the consumer that went from 0 to 3 skipped it, and nobody received it
    assert counts(events, final) == {"aborted_read": 1, "skipped": 1, "lost_delivery": 1}
    events, final = base()
    events.append({"p": "c", "i": 99, "t": 0, "type": "ok", "f": "read", "topics": ["in"],
                   "msgs": [["in", 0, 1, "c"]]})
    assert counts(events, final) == {"aborted_read": 1}
    events, final = base()
    final.txn_status[T2] = "COMMITTED"  # the TC says committed what the client saw aborted
    # (and by the TC's word c should now be visible: it is not)
    assert counts(events, final) == {"aborted_read": 1, "lost_write": 1}


def test_failed_plain_send_visible_is_an_aborted_read():
    events, final = base()
    h = H("z")
    h.ev("invoke", "send", topic="in", value="f", txn=None).ev("fail", "send", value="f", txn=None, error="x")
    final.visible["in"].append((1, 4, "f"))
    final.drained[("in", "s")].append("f")
    assert counts(events + h.events, final) == {"aborted_read": 1}


def test_lost_write_of_acknowledged_commit_and_plain_send():
    events, final = base()
    final.visible["in"].remove((1, 0, "b"))  # half of T1: lost write of b
    final.drained[("in", "s")].remove("b")
    assert counts(events, final) == {"lost_write": 1}
    events, final = base()
    final.visible["in"].remove((1, 2, "d"))
    final.drained[("in", "s")].remove("d")
    assert counts(events, final) == {"lost_write": 1}


def test_what_retention_deleted_below_the_start_is_no_lost_write_but_above_it_is():
    events, final = base()
    final.visible["in"].remove((1, 0, "b"))
    final.stored["in"].remove((1, 0, "b", T1))
    final.drained[("in", "s")].remove("b")
    final.starts[("in", 1)] = 1  # retention deleted offset 0 of partition 1
    assert counts(events, final) == {}
    final.starts[("in", 1)] = 0  # ...but not when the log still starts at 0
    assert counts(events, final) == {"lost_write": 1}


def test_committed_in_tc_but_not_all_stored_rows_visible():
    """A transaction nobody saw commit (killed), COMMITTED by recovery: all its rows must show."""
    events, final = base()
    final.stored["in"].append((0, 4, "g", (5, 5)))
    final.stored["in"].append((1, 5, "h", (5, 5)))
    final.txn_status[(5, 5)] = "COMMITTED"
    final.visible["in"].append((0, 4, "g"))
    final.drained[("in", "s")].append("g")
    assert counts(events, final) == {"lost_write": 1}


def test_unfinished_transaction():
    events, final = base()
    final.txn_status[(5, 6)] = "COMMITTING"
    assert counts(events, final) == {"unfinished_txn": 1}


def test_one_txn_id_begun_by_two_processes_is_a_merged_transaction():
    events, final = base()
    events.append({"p": "forked", "i": 1, "t": 0, "type": "ok", "f": "begin", "txn": list(T2)})
    assert counts(events, final) == {"merged_txn": 1}


def test_duplicate_value_at_two_offsets():
    events, final = base()
    final.visible["in"].append((1, 7, "d"))
    assert counts(events, final) == {"duplicate": 1}


def test_inconsistent_offsets_between_readers():
    events, final = base()
    events.append({"p": "r", "i": 1, "t": 0, "type": "ok", "f": "poll", "consumer": "r", "epoch": 0,
                   "topic": "in", "msgs": [[1, 2, "b"]]})  # reader says b@2, final says d@2 (and b@0)
    assert counts(events, final) == {"inconsistent_offset": 1, "duplicate": 1}


def test_non_monotonic_and_skipping_polls():
    events, final = base()
    events.append({"p": "c", "i": 50, "t": 0, "type": "ok", "f": "poll", "consumer": "c0", "epoch": 0,
                   "topic": "in", "msgs": [[0, 0, "a"]]})  # goes back from 3 to 0 in the same epoch
    assert counts(events, final) == {"non_monotonic": 1}
    events, final = base()
    events.append({"p": "c", "i": 50, "t": 0, "type": "ok", "f": "poll", "consumer": "c0", "epoch": 1,
                   "topic": "in", "msgs": [[0, 0, "a"]]})  # a new epoch may go back
    assert counts(events, final) == {}
    events, final = base()
    final.visible["in"].append((0, 2, "x"))  # visible between the consumer's 0 and 3: skipped
    final.drained[("in", "s")].append("x")
    assert counts(events, final) == {"skipped": 1}


def test_acks_of_a_transaction_whose_end_raised_may_return_late_in_the_epoch():
    """A commit that raised with its outcome unknown leaves the transaction OPEN with its pending
    acks: the redelivery that follows cannot return them, so epoch 1 gets 3 first, and 0 when the TC
    aborts the transaction (its timeout, an admin abort). Legitimate unless it committed, or the
    process saw its end (then the redelivery itself returned them, in order)."""
    t4 = (4, 1)

    def run(ack_ok: bool, end_kind: str, end_f: str = "commit", status: str = "ABORTED") -> dict[str, int]:
        events, final = base()
        k = H("k")
        k.ev("ok", "poll", consumer="k", epoch=0, topic="in", sub="s", msgs=[[0, 0, "a"]])
        k.ev("ok", "begin", txn=list(t4)).ev("invoke", "ack", txn=list(t4), topic="in", sub="s", msgs=[[0, 0, "a"]])
        if ack_ok:
            k.ev("ok", "ack", txn=list(t4), topic="in", sub="s", msgs=[[0, 0, "a"]])
        k.end(end_f, t4, kind=end_kind)
        k.ev("ok", "poll", consumer="k", epoch=1, topic="in", sub="s", msgs=[[0, 3, "e"]])
        k.ev("ok", "poll", consumer="k", epoch=1, topic="in", sub="s", msgs=[[0, 0, "a"]])
        final.txn_status[t4] = status
        return counts(events + k.events, final)

    assert run(True, "info") == {}
    assert run(False, "info", end_f="abort") == {}  # the ack raised, part of it may have landed
    assert run(True, "ok", end_f="abort") == {"non_monotonic": 1}  # its abort returned: redelivery had them
    assert run(True, "fail") == {"non_monotonic": 1}  # surely aborted when the commit answered
    assert run(True, "info", status="COMMITTED") == {"non_monotonic": 1, "lost_ack": 1}


def test_passing_over_what_the_subscription_already_acknowledged_is_no_skip():
    """Epoch 1 redelivers 0 (its transaction aborted) after 1 and 2 were acknowledged in committed
    transactions: going from 0 to 3 passes over 1 and 2 legitimately, but not over 2.5's twin x."""
    events, final = base()
    final.visible["in"] += [(0, 1, "y"), (0, 2, "x")]
    final.stored["in"] += [(0, 1, "y", None), (0, 2, "x", None)]
    final.stored["in"] = [r for r in final.stored["in"] if r[2] != "c"]  # (c's offset 1 now holds y)
    final.visible["in"].remove((0, 3, "e"))
    final.stored["in"] = [r for r in final.stored["in"] if r[2] != "e"]
    final.drained[("in", "s")].remove("e")
    c = H("c2")
    c.ev("ok", "begin", txn=[7, 7]).ev("ok", "ack", txn=[7, 7], topic="in", sub="s", msgs=[[0, 1, "y"]])
    c.end("commit", (7, 7))
    c.ev("ok", "poll", consumer="k", epoch=1, topic="in", sub="s", msgs=[[0, 0, "a"]])
    c.ev("ok", "poll", consumer="k", epoch=1, topic="in", sub="s", msgs=[[0, 3, "z"]])
    final.visible["in"].append((0, 3, "z"))
    final.stored["in"].append((0, 3, "z", None))
    final.txn_status[(7, 7)] = "COMMITTED"
    final.drained[("in", "s")] += ["x", "z"]
    events = [e for e in events if not (e["f"] == "poll" and e.get("consumer") == "c0")]
    events = [e for e in events if not (e["p"] == "w" and e.get("value") == "c")]
    assert counts(events + c.events, final) == {"skipped": 1}  # x at 2 was never acknowledged
    final.drained[("in", "s")].remove("x")
    c.ev("ok", "begin", txn=[8, 8]).ev("ok", "ack", txn=[8, 8], topic="in", sub="s", msgs=[[0, 2, "x"]])
    c.end("commit", (8, 8))
    for e in c.events:  # acknowledged before the polls
        if e["f"] != "poll":
            e["t"] = -1.0
    final.txn_status[(8, 8)] = "COMMITTED"
    assert counts(events + c.events, final) == {}


def test_fractured_batch_read():
    events, final = base()
    for e in events:
        if e["f"] == "read":
            e["msgs"] = [["in", 0, 0, "a"]]  # a without b
    assert counts(events, final) == {"fractured_read": 1}


def test_stale_read_after_commit_returned():
    """A read begun after commit() returned must see the whole transaction; one that began before
    may see nothing of it."""
    events, final = base()
    commit_returned = next(e["t"] for e in events if e["f"] == "commit" and e["type"] == "ok" and e["txn"] == list(T1))
    r = H("r")
    r.ev("ok", "read", topics=["in"], msgs=[["in", 1, 2, "d"]], started=commit_returned + 0.5)
    assert counts(events + r.events, final) == {"stale_read": 1}
    r = H("r")
    r.ev("ok", "read", topics=["in"], msgs=[["in", 1, 2, "d"]], started=commit_returned - 0.5)
    assert counts(events + r.events, final) == {}
    r = H("r")  # only the transactions' values in the topics read count: T1's are not in "out"...
    r.ev("ok", "read", topics=["out"], msgs=[], started=commit_returned + 0.5)
    assert counts(events + r.events, final) == {}
    last_commit = max(e["t"] for e in events if e["f"] == "commit" and e["type"] == "ok")
    r = H("r")  # ...T3's t:a is
    r.ev("ok", "read", topics=["out"], msgs=[], started=last_commit + 0.5)
    assert counts(events + r.events, final) == {"stale_read": 1}


def test_a_read_may_miss_a_committed_transaction_behind_an_undecided_one():
    """maxReadPosition stops at the first entry of a transaction not decided when the read began
    (here T4's abort raised, so it stays open until its timeout): T5, committed after it in the
    same partition, may rightly be missing from that read. Once T4's abort has returned, it may not."""
    T4, T5 = (3, 1), (4, 1)

    def history(abort_kind: str):
        events, final = base()
        w = H("w2")
        w.ev("ok", "begin", txn=list(T4)).send("in", "x", T4, 1, 3)
        w.ev("ok", "begin", txn=list(T5)).send("in", "y", T5, 1, 4).send("in", "z", T5, 0, 4).end("commit", T5)
        w.end("abort", T4, kind=abort_kind)
        final.visible["in"] += [(1, 4, "y"), (0, 4, "z")]
        final.stored["in"] += [(1, 3, "x", T4), (1, 4, "y", T5), (0, 4, "z", T5)]
        final.txn_status.update({T4: "ABORTED", T5: "COMMITTED"})
        final.drained[("in", "s")] += ["y", "z"]
        r = H("r")
        r.ev("ok", "read", topics=["in"], msgs=[["in", 0, 0, "a"], ["in", 1, 0, "b"]], started=w.events[-1]["t"] + 0.5)
        return events + w.events + r.events, final

    assert counts(*history("info")) == {}
    assert counts(*history("ok")) == {"stale_read": 1}


def test_stuck_partition_by_samples_and_after_recovery():
    events, final = base()
    assert counts(events, final, limit=0.5) == {"stuck_partition": 1}  # blocked at 1 from t=10 to 11
    assert counts(events, final, limit=1.5) == {}
    events, final = base()
    final.ongoing[("in", 1)] = [9]
    assert counts(events, final) == {"stuck_partition": 1}


def test_lost_ack_and_lost_delivery():
    events, final = base()
    final.drained[("in", "s")].append("a")  # acked in committed T3, delivered again
    assert counts(events, final) == {"lost_ack": 1}
    events, final = base()
    final.drained[("in", "s")].remove("e")  # visible, never acknowledged, not redelivered
    assert counts(events, final) == {"lost_delivery": 1}
    events, final = base()
    final.txn_status[T3] = "ABORTED"  # the ack's transaction aborted: a must be redelivered
    for e in events:
        if e["f"] == "commit" and e["txn"] == list(T3):
            e["type"] = "fail" if e["type"] == "ok" else e["type"]
    final.visible["out"] = []
    assert counts(events, final) == {"lost_delivery": 1}


@pytest.mark.parametrize("kill_after", [3, 4])
def test_history_file_survives_a_torn_last_line(tmp_path, kill_after):
    path = tmp_path / "p.jsonl"
    h = History(path, "p")
    for i in range(kill_after):
        h.invoke("send", value=str(i), topic="in", txn=None)
    h.close()
    with open(path, "a") as f:
        f.write('{"p":"p","i":9,"t"')  # killed in the middle of a write
    events = read_events([path])
    assert [e["value"] for e in events] == [str(i) for i in range(kill_after)]
    assert copy.deepcopy(events) == events


def test_an_admin_abort_answered_aborted_for_a_committed_transaction_is_a_lost_write():
    """The operator's word holds whatever the TC log says by the end (the entry may be trimmed)."""
    events, final = base()
    op = H("operator")
    op.ev("invoke", "admin_abort", txn=list(T1), target="trimmed")
    op.ev("ok", "admin_abort", txn=list(T1), target="trimmed", status="ABORTED")
    del final.txn_status[T1]  # trimmed from its TC log
    got = counts(events + op.events, final)
    assert got["lost_write"] == 1 and set(got) <= {"lost_write", "aborted_read"}, got
    # A refused abort, or one of a transaction that did abort, is no anomaly.
    events, final = base()
    op = H("operator")
    op.ev("invoke", "admin_abort", txn=list(T1)).ev("info", "admin_abort", txn=list(T1), error="TransactionNotFound")
    op.ev("invoke", "admin_abort", txn=list(T2)).ev("ok", "admin_abort", txn=list(T2), status="ABORTED")
    assert counts(events + op.events, final) == {}
