"""Checker: histories (tests/reliability/history.py) + the final storage state -> anomaly counts.

Modelled on Jepsen's Kafka/Bufstream checker. Values are unique strings, so every observation of a
value at a position ``(topic, partition, offset)`` can be cross-checked against every other one:

=====================  ==========================================================================
aborted_read (G1a)     a value of an aborted (or failed) transaction, or a failed plain send, is
                       visible (final READ_COMMITTED read, a poll or a batch read)
lost_write             an acknowledged commit (or a COMMITTED transaction, or an acknowledged plain
                       send) whose values are not all visible in the final READ_COMMITTED read
duplicate              one value at two positions
inconsistent_offset    two values at one position (readers, writers or storage disagree)
non_monotonic          a consumer epoch receives an offset at or below one it already received
                       (except one acknowledged in a transaction of its process whose end that
                       process never saw, which did not commit: returned when the TC aborts it)
skipped                a consumer epoch jumps over an offset visible in the final read that its
                       subscription had not acknowledged (in any transaction) before the poll
fractured_read         a batch read returns part, but not all, of a committed transaction
stale_read             a batch read begun after a commit() returned misses some of that
                       transaction's values (read-your-writes: the decision is the commit point),
                       unless some of them lie past the first entry of a transaction not decided
                       when the read began (maxReadPosition stops there)
stuck_partition        maxReadPosition blocked at one offset longer than the limit, or a
                       transaction still ongoing in a partition after recovery
unfinished_txn         a transaction not COMMITTED or ABORTED in its TC after recovery
merged_txn             one TxnID begun twice (by two processes, or twice by one): two transactions
                       that were meant to be unrelated share one outcome
lost_ack               a value acknowledged by a committed transaction is delivered again (final
                       drain) or acknowledged by a second committed transaction
lost_delivery          a visible value of a subscribed topic is neither acknowledged by a committed
                       transaction nor delivered to the final drain
=====================  ==========================================================================

The checker is pure (no storage access): :func:`collect_final` in tests/reliability/final.py
builds :class:`FinalState` through the public client and admin.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

Txn = tuple[int, int]
Pos = tuple[str, int, int]  # (topic, partition, offset)
COMMITTED, ABORTED = "COMMITTED", "ABORTED"


@dataclass
class FinalState:
    """What storage holds after recovery, read through the public client/reader and admin."""

    visible: dict[str, list[tuple[int, int, str]]]  # topic -> READ_COMMITTED [(partition, offset, value)]
    stored: dict[str, list[tuple[int, int, str, Txn | None]]] = field(default_factory=dict)  # DATA rows, any txn
    txn_status: dict[Txn, str] = field(default_factory=dict)  # from the TC logs
    ongoing: dict[tuple[str, int], list[int]] = field(default_factory=dict)  # first offsets still ongoing
    drained: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (topic, sub) -> values delivered
    # (topic, partition) -> first offset still in the log: retention deleted what lay below it
    starts: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass
class Anomalies:
    aborted_read: int = 0
    lost_write: int = 0
    duplicate: int = 0
    inconsistent_offset: int = 0
    non_monotonic: int = 0
    skipped: int = 0
    fractured_read: int = 0
    stale_read: int = 0
    stuck_partition: int = 0
    unfinished_txn: int = 0
    merged_txn: int = 0
    lost_ack: int = 0
    lost_delivery: int = 0
    examples: dict[str, list[Any]] = field(default_factory=dict)

    def add(self, kind: str, example: Any, n: int = 1) -> None:
        setattr(self, kind, getattr(self, kind) + n)
        ex = self.examples.setdefault(kind, [])
        if len(ex) < 5:
            ex.append(example)

    def counts(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "examples"}

    @property
    def total(self) -> int:
        return sum(self.counts().values())

    def nonzero(self) -> dict[str, int]:
        return {k: v for k, v in self.counts().items() if v}


@dataclass
class Report:
    anomalies: Anomalies
    stats: Counter

    def __str__(self) -> str:
        return f"anomalies {self.anomalies.nonzero() or 'none'}; {dict(self.stats)}; examples {self.anomalies.examples}"


def _txn(x: Any) -> Txn | None:
    return None if x is None else (int(x[0]), int(x[1]))


def check(events: Iterable[dict[str, Any]], final: FinalState, stuck_limit_s: float | None = None) -> Report:
    events = sorted(events, key=lambda e: (e["p"], e["i"]))
    a = Anomalies()
    stats: Counter = Counter()

    # ---- what the writers did -------------------------------------------------------------------
    value_txn: dict[str, Txn | None] = {}
    txn_values: dict[Txn, set[str]] = defaultdict(set)  # values each transaction's sends reached
    sent_ok: dict[str, Pos] = {}
    plain_failed: set[str] = set()
    commit_ok: set[Txn] = set()
    commit_returned: dict[Txn, float] = {}  # when commit() returned (the earliest, if retried)
    aborted_hist: set[Txn] = set()  # abort ok, or commit failed (definitely not committed)
    admin_aborted: set[Txn] = set()  # an admin abort answered ABORTED/ABORTING
    begun: set[Txn] = set()
    begun_by: dict[Txn, list[str]] = defaultdict(list)  # the processes whose begin returned each TxnID
    decided_at: dict[Txn, float] = {}  # when commit() or abort() first returned (its decision durable)
    invoked_send: dict[tuple[str, int], dict] = {}
    for e in events:
        f, kind = e["f"], e["type"]
        if f == "begin" and kind == "ok":
            begun.add(_txn(e["txn"]))
            begun_by[_txn(e["txn"])].append(e["p"])
        elif f == "send":
            if kind == "invoke":
                value_txn[e["value"]] = _txn(e.get("txn"))
                invoked_send[(e["p"], e["value"])] = e
                if e.get("txn") is not None:
                    txn_values[_txn(e["txn"])].add(e["value"])
                stats["sends"] += 1
            elif kind == "ok":
                inv = invoked_send.get((e["p"], e["value"]), e)
                sent_ok[e["value"]] = (inv.get("topic", e.get("topic")), e["partition"], e["offset"])
            elif kind == "fail" and e.get("txn") is None:
                plain_failed.add(e["value"])
        elif f == "commit" and kind == "ok":
            commit_ok.add(_txn(e["txn"]))
            commit_returned[_txn(e["txn"])] = min(commit_returned.get(_txn(e["txn"]), e["t"]), e["t"])
        elif f == "commit" and kind == "fail":
            aborted_hist.add(_txn(e["txn"]))
        elif f == "abort" and kind == "ok":
            aborted_hist.add(_txn(e["txn"]))
        elif f == "admin_abort" and kind == "ok":
            # An operator was told ABORTED: the transaction must never show as committed.
            aborted_hist.add(_txn(e["txn"]))
            admin_aborted.add(_txn(e["txn"]))
            stats["admin_aborted"] += 1
        if f in ("commit", "abort") and kind == "ok":
            decided_at[_txn(e["txn"])] = min(decided_at.get(_txn(e["txn"]), e["t"]), e["t"])
    stored_values = {r[2] for rows in final.stored.values() for r in rows}
    for rows in final.stored.values():
        for _p, _o, v, t in rows:
            if t is not None:
                value_txn.setdefault(v, t)
                txn_values[t].add(v)

    def outcome(t: Txn) -> str | None:
        s = final.txn_status.get(t)
        if s in (COMMITTED, ABORTED):
            return s
        if t in commit_ok:
            return COMMITTED
        if t in aborted_hist:
            return ABORTED
        return s

    for t, processes in begun_by.items():
        if len(processes) > 1:
            a.add("merged_txn", (t, sorted(processes)))
    txns = begun | set(txn_values) | commit_ok | aborted_hist | set(final.txn_status)
    stats["txns"] = len(txns)
    for t in sorted(txns):
        o = outcome(t)
        stats[f"txn_{(o or 'unknown').lower()}"] += 1
        if final.txn_status.get(t) not in (COMMITTED, ABORTED) and t in final.txn_status:
            a.add("unfinished_txn", (t, final.txn_status[t]))
        if t in commit_ok and final.txn_status.get(t) == ABORTED:
            a.add("lost_write", ("acknowledged commit logged ABORTED", t))
        if t in aborted_hist and final.txn_status.get(t) == COMMITTED:
            a.add("aborted_read", ("aborted/failed transaction logged COMMITTED", t))
        if t in admin_aborted and t in commit_ok:
            # Whatever the TC log holds by now (its entry may be trimmed): both cannot be true.
            a.add("lost_write", ("an admin abort answered ABORTED for a transaction whose commit returned", t))

    # ---- every observation of a value at a position ---------------------------------------------
    positions: dict[Pos, set[str]] = defaultdict(set)
    value_positions: dict[str, set[Pos]] = defaultdict(set)
    seen_visible: dict[str, str] = {}  # value -> where it was seen visible (first source)

    def observe(pos: Pos, v: str, source: str | None) -> None:
        positions[pos].add(v)
        value_positions[v].add(pos)
        if source is not None:
            seen_visible.setdefault(v, source)

    final_visible: dict[str, Pos] = {}
    visible_offsets: dict[tuple[str, int], list[int]] = defaultdict(list)
    for topic, rows in final.visible.items():
        for p, o, v in rows:
            observe((topic, p, o), v, "final")
            final_visible[v] = (topic, p, o)
            visible_offsets[(topic, p)].append(o)
    for k in visible_offsets:
        visible_offsets[k].sort()
    stats["visible"] = len(final_visible)
    for topic, rows in final.stored.items():
        for p, o, v, _t in rows:
            positions[(topic, p, o)].add(v)
    for v, pos in sent_ok.items():
        if pos[0] is not None:
            observe(pos, v, None)
    for e in events:
        if e["type"] != "ok":
            continue
        if e["f"] == "poll":
            for p, o, v in e["msgs"]:
                observe((e["topic"], p, o), v, "poll")
        elif e["f"] == "read":
            for topic, p, o, v in e["msgs"]:
                observe((topic, p, o), v, "read")
    for pos, vs in positions.items():
        if len(vs) > 1:
            a.add("inconsistent_offset", (pos, sorted(vs)))
    for v, ps in value_positions.items():
        if len(ps) > 1:
            a.add("duplicate", (v, sorted(ps)))

    # ---- G1a and lost writes ----------------------------------------------------------------------
    for v, src in seen_visible.items():
        t = value_txn.get(v)
        if (t is not None and outcome(t) == ABORTED) or (t is None and v in plain_failed):
            a.add("aborted_read", (v, t, src))
    def retained(v: str) -> bool:
        """Deleted by retention: written below its partition's final start (and so acknowledged by
        every subscription, which bounds retention)."""
        pos = sent_ok.get(v)
        return pos is not None and pos[2] < final.starts.get((pos[0], pos[1]), 0)

    for t in txns:
        if outcome(t) != COMMITTED:
            continue
        missing = sorted(v for v in txn_values.get(t, ()) if v not in final_visible
                         and (v in sent_ok or v in stored_values) and not retained(v))
        if missing:
            a.add("lost_write", (t, missing[:5]), len(missing))
    for v in sent_ok:
        if value_txn.get(v) is None and v not in final_visible and not retained(v):
            a.add("lost_write", (v, "plain send acknowledged"))

    # ---- consumers: monotonic, no skips -------------------------------------------------------------
    # An offset acknowledged on the consumer's subscription before the poll is legitimately passed
    # over: committed, it must not come again (Pulsar redelivers an aborted transaction's older
    # messages after newer ones were acknowledged, so a new epoch may restart below them); pending in
    # a transaction whose abort has not reached the subscription yet, it is not dispatchable until it
    # has (and lost_delivery checks that it does come back).
    acked_at: dict[tuple[str, str, int, int], float] = {}
    for e in events:
        if e["type"] == "ok" and e["f"] == "ack":
            for p, o, _v in e["msgs"]:
                k = (e["topic"], e["sub"], p, o)
                acked_at[k] = min(acked_at.get(k, e["t"]), e["t"])
    # A transaction whose end its process never saw decided (commit or abort raised with the outcome
    # unknown) stays OPEN with its pending acks: redelivery cannot return them (PIP-31 leaves
    # PENDING_ACK out), later offsets go out, and they come back when the TC aborts it (its
    # timeout, an admin abort), below offsets already received in that epoch, as a Pulsar broker
    # redelivers an aborted transaction's acks. Nothing was wrong unless it committed.
    ended_seen: dict[tuple[str, Txn], int] = {}  # (process, txn) -> first event where its end returned or surely failed
    undecided_acks: dict[tuple[str, str, str, int, int], list[tuple[int, Txn]]] = defaultdict(list)
    for e in events:
        if e["f"] in ("commit", "abort") and e["type"] in ("ok", "fail"):
            ended_seen.setdefault((e["p"], _txn(e["txn"])), e["i"])
        elif e["f"] == "ack" and e["type"] in ("invoke", "ok") and e.get("txn") is not None:
            for p, o, _v in e["msgs"]:
                undecided_acks[(e["p"], e["topic"], e.get("sub"), p, o)].append((e["i"], _txn(e["txn"])))

    def orphaned(e: dict[str, Any], p: int, o: int) -> bool:
        """Whether ``o`` was acknowledged before poll ``e``, by its process, in a transaction that
        process had not seen end by then and that did not commit: its redelivery may come at any time."""
        return any(i < e["i"] < ended_seen.get((e["p"], t), e["i"] + 1) and outcome(t) != COMMITTED
                   for i, t in undecided_acks.get((e["p"], e["topic"], e.get("sub"), p, o), []))

    last: dict[tuple, int] = {}
    for e in events:
        if e["type"] != "ok" or e["f"] != "poll":
            continue
        stats["polled"] += len(e["msgs"])
        for p, o, _v in e["msgs"]:
            key = (e["p"], e.get("consumer"), e.get("epoch", 0), e["topic"], p)
            prev = last.get(key)
            if prev is not None:
                if o <= prev:
                    if orphaned(e, p, o):
                        stats["orphaned_redelivered"] += 1
                    else:
                        a.add("non_monotonic", (key, prev, o))
                else:
                    gap = len([x for x in _between(visible_offsets.get((e["topic"], p), []), prev, o)
                               if acked_at.get((e["topic"], e.get("sub"), p, x), e["t"] + 1) > e["t"]])
                    if gap:
                        a.add("skipped", (key, prev, o, gap))
            last[key] = o if prev is None else max(prev, o)

    # ---- batch reads: all of a committed transaction or none ---------------------------------------
    # Where each transaction's data lies: the stored rows (failed sends may have landed too) and the
    # acknowledged sends (compaction drops an aborted transaction's rows).
    txn_spans: dict[Txn, dict[tuple[str, int], tuple[int, int]]] = defaultdict(dict)
    positions = [(topic, p, o, t) for topic, rows in final.stored.items() for p, o, _v, t in rows]
    positions += [(topic, p, o, value_txn.get(v)) for v, (topic, p, o) in sent_ok.items()]
    for topic, p, o, t in positions:
        if t is not None:
            lo, hi = txn_spans[t].get((topic, p), (o, o))
            txn_spans[t][(topic, p)] = (min(lo, o), max(hi, o))

    def open_firsts(topics: set[str], started: float) -> dict[tuple[str, int], int]:
        """Per partition of ``topics``, the first entry of any transaction not decided when a read
        began: maxReadPosition stops there, and a batch read shows a transaction whole or not at
        all, so READ_COMMITTED may rightly miss all of a committed transaction with data past it."""
        out: dict[tuple[str, int], int] = {}
        for u, spans in txn_spans.items():
            if decided_at.get(u, started) < started:
                continue
            for key, (lo, _hi) in spans.items():
                if key[0] in topics:
                    out[key] = min(out.get(key, lo), lo)
        return out

    for e in events:
        if e["type"] != "ok" or e["f"] != "read":
            continue
        stats["batch_reads"] += 1
        topics = set(e["topics"])
        got = {v for _t, _p, _o, v in e["msgs"]}
        by_txn: dict[Txn, set[str]] = defaultdict(set)
        for v in got:
            t = value_txn.get(v)
            if t is not None:
                by_txn[t].add(v)
        for t, vs in by_txn.items():
            whole = {v for v in txn_values.get(t, ()) if v in final_visible and final_visible[v][0] in topics}
            if whole - vs:
                a.add("fractured_read", (t, sorted(vs)[:3], sorted(whole - vs)[:3]))
        started = e.get("started")  # reads that record when they began take part in read-your-writes
        if started is None:
            continue
        firsts = None
        for t, returned in commit_returned.items():
            if returned >= started or t in by_txn:
                continue  # concurrent with the commit, or seen (fractured_read judges the rest)
            firsts = open_firsts(topics, started) if firsts is None else firsts
            if any(hi > firsts.get(key, hi) for key, (_lo, hi) in txn_spans.get(t, {}).items()):
                continue  # past maxReadPosition: behind an earlier transaction not decided yet
            whole = {v for v in txn_values.get(t, ()) if v in final_visible and final_visible[v][0] in topics}
            if whole:
                a.add("stale_read", (t, e["p"], sorted(whole)[:3]))

    # ---- stuck partitions ---------------------------------------------------------------------------
    if stuck_limit_s is not None:
        episodes: dict[tuple[str, int], tuple[int, float, float]] = {}
        flagged: set[tuple[str, int, int]] = set()
        for e in sorted((e for e in events if e["f"] == "mrp" and e["type"] == "ok"), key=lambda e: e["t"]):
            key = (e["topic"], e["partition"])
            at = e["blocked_at"]
            cur = episodes.get(key)
            if at is None:
                episodes.pop(key, None)
                continue
            if cur is None or cur[0] != at:
                episodes[key] = (at, e["t"], e["t"])
            else:
                episodes[key] = (at, cur[1], e["t"])
            at0, t0, t1 = episodes[key]
            if t1 - t0 > stuck_limit_s and (*key, at0) not in flagged:
                flagged.add((*key, at0))
                a.add("stuck_partition", (key, at0, round(t1 - t0, 2)))
    for key, firsts in final.ongoing.items():
        if firsts:
            a.add("stuck_partition", (key, "ongoing after recovery", firsts[:3]))

    # ---- acknowledgements (consume-transform-produce) -----------------------------------------------
    acked_by: dict[tuple[str, str], dict[str, list[Txn]]] = defaultdict(lambda: defaultdict(list))
    for e in events:
        if e["type"] == "ok" and e["f"] == "ack":
            t = _txn(e.get("txn"))
            stats["acks"] += len(e["msgs"])
            if t is not None and outcome(t) == COMMITTED:
                for _p, _o, v in e["msgs"]:
                    acked_by[(e["topic"], e["sub"])][v].append(t)
    for (topic, sub), drained in final.drained.items():
        acked = acked_by.get((topic, sub), {})
        drained_set = set(drained)
        for v, ts in acked.items():
            if len(set(ts)) > 1 or v in drained_set:
                a.add("lost_ack", (topic, sub, v, ts, v in drained_set))
        for _p, _o, v in final.visible.get(topic, []):
            if v not in acked and v not in drained_set:
                a.add("lost_delivery", (topic, sub, v))
        stats["drained"] += len(drained)
    return Report(a, stats)


def _between(sorted_offsets: list[int], lo: int, hi: int) -> list[int]:
    """The ``sorted_offsets`` strictly between ``lo`` and ``hi``."""
    from bisect import bisect_left, bisect_right

    return sorted_offsets[bisect_right(sorted_offsets, lo):bisect_left(sorted_offsets, hi)]
