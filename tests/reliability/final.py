"""Storage-side inputs of the checker, read through pulsartx's public client, reader and admin.

:func:`collect_final` builds the checker's :class:`~checker.FinalState` after recovery;
:func:`batch_read` is the Spark-free batch read of several partitions at one moment (the consistent
cut Spark's planner uses, ``pulsartx.buffer.reads.consistent_cut``) that workers record as ``read``
events; :func:`blocked_at` samples maxReadPosition for the stuck-partition check.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from .checker import FinalState

BIG_RETENTION_MS = 10**12  # keep every finished transaction in the TC logs, so the checker sees it
DATA_COLUMNS = ["offset", "type", "value", "txn_most_bits", "txn_least_bits"]


# TC leases expire within the runs, so processes take over dead (SIGKILLed) processes' TC logs and
# sweep them as they begin transactions, and a process whose clock is skewed loses or waits for one.
LEASE_MS = 2000
DRAIN_LEASE_WAIT_S = 15.0  # a consumer's default lease (10 s) and a margin


def config(recovery_grace_ms: int = 0) -> Any:
    from pulsartx.coordinator.coordinator import CoordinatorConfig

    return CoordinatorConfig(finished_retention_ms=BIG_RETENTION_MS, recovery_grace_ms=recovery_grace_ms,
                             lease_ms=LEASE_MS, max_clock_skew_ms=0)


def client(url: str, storage_options: dict[str, str] | None = None, recovery_grace_ms: int = 0, **kw: Any) -> Any:
    import pulsartx

    return pulsartx.Client(url, storage_options, coordinator_config=config(recovery_grace_ms), **kw)


def _partitions(c: Any, topic: str) -> list[Any]:
    return list(c.admin.partitions_of(topic))


def visible(c: Any, topic: str) -> list[tuple[int, int, str]]:
    """READ_COMMITTED through the public Reader, from the earliest message."""
    from pulsartx import MessageId

    out = []
    with c.create_reader(topic, MessageId.earliest) as r:
        for m in r:
            mid = m.message_id()
            out.append((mid.partition(), mid.offset(), m.data().decode()))
    return sorted(out)


def stored(c: Any, topic: str) -> list[tuple[int, int, str, tuple[int, int] | None]]:
    """Every DATA row as written (READ_UNCOMMITTED, with its TxnID)."""
    from pulsartx.log.partition import PartitionLog

    out = []
    for part in _partitions(c, topic):
        plog = PartitionLog(c.root, part)
        for r in plog.read(0, plog.end_offset(), columns=DATA_COLUMNS).to_pylist():
            if r["type"] != "DATA":
                continue
            t = None if r["txn_most_bits"] is None else (r["txn_most_bits"], r["txn_least_bits"])
            out.append((part.partition, r["offset"], r["value"].decode(), t))
    return out


def txn_status(c: Any) -> dict[tuple[int, int], str]:
    out = {}
    for tc in c._coordinators().all():
        for m in tc.transactions(refresh=True):
            out[(m.txn_id.most_bits, m.txn_id.least_bits)] = m.status.value
    return out


def ongoing(c: Any, topic: str) -> dict[tuple[str, int], list[int]]:
    from pulsartx.buffer.buffer import TransactionBuffer
    from pulsartx.log.partition import PartitionLog

    out = {}
    for part in _partitions(c, topic):
        s = TransactionBuffer(PartitionLog(c.root, part)).state()
        out[(topic, part.partition)] = sorted(s.ongoing.values())
    return out


def blocked_at(c: Any, topic: str) -> dict[int, int | None]:
    """Per partition: first offset of the oldest transaction holding maxReadPosition back (None: free)."""
    from pulsartx.buffer.buffer import TransactionBuffer
    from pulsartx.log.partition import PartitionLog

    out = {}
    for part in _partitions(c, topic):
        s = TransactionBuffer(PartitionLog(c.root, part)).state()
        out[part.partition] = min(s.ongoing.values()) if s.ongoing else None
    return out


def subscribe_when_free(c: Any, topic: str, sub: str, wait_s: float, **options: Any) -> Any:
    """``c.subscribe(topic, sub, **options)``, retrying ConsumerBusy for up to ``wait_s``: a consumer
    that died (killed, or its release failed) holds its subscription until its lease runs out, and
    a restarted application waits for that, as this does. Still busy after ``wait_s``: raises."""
    from pulsartx.exceptions import ConsumerBusy

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return c.subscribe(topic, sub, **options)
        except ConsumerBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def drain(c: Any, topic: str, sub: str, idle_ms: int = 1500) -> list[str]:
    """Everything the subscription still delivers (nothing acknowledged), until idle."""
    from pulsartx.client.consumer import ConsumerType

    out: list[str] = []
    # A worker whose lease release failed under injected faults ("it will expire") still holds the
    # subscription until its lease runs out (the consumers' default, 10 s).
    cons = subscribe_when_free(c, topic, sub, DRAIN_LEASE_WAIT_S, consumer_type=ConsumerType.Exclusive)
    try:
        while True:
            got = cons.batch_receive(1000, timeout_millis=idle_ms)
            if not got:
                return out
            out.extend(m.data().decode() for m in got)
    finally:
        cons.close()


def unacknowledged(c: Any, topic: str, sub: str, rows: list[tuple[int, int, str]] | None = None) -> list[str]:
    """What the subscription would still deliver, from its durable cursor (admin view, no consumer,
    so no lease to wait for): visible values neither acknowledged nor pending in a transaction."""
    from pulsartx.admin.subscriptions import live_cursor
    from pulsartx.subscription.store import SubscriptionStore

    out = []
    cursors = {p.partition: live_cursor(SubscriptionStore(c.root, p, sub)) for p in _partitions(c, topic)}
    for p, o, v in visible(c, topic) if rows is None else rows:
        cur = cursors.get(p)
        if cur is None or not (cur.is_acked(o) or cur.is_pending(o)):
            out.append(v)
    return out


def batch_read(c: Any, topics: Iterable[str]) -> list[tuple[str, int, int, str]]:
    """A batch read of every partition of ``topics`` at one moment: the consistent cut the Spark
    batch planner takes (``consistent_cut``), then each partition's rows below its read limit
    through the cut's filter. Must never return part of a transaction."""
    from pulsartx.buffer.buffer import TransactionBuffer
    from pulsartx.buffer.reads import consistent_cut
    from pulsartx.coordinator.registry import Coordinators
    from pulsartx.log.partition import PartitionLog

    plogs = {str(p): (t, p, PartitionLog(c.root, p)) for t in topics for p in _partitions(c, t)}
    filters = consistent_cut(Coordinators(c.root, recover_on_open=False),
                             {name: TransactionBuffer(pl) for name, (_t, _p, pl) in plogs.items()})
    out = []
    for name, (topic, part, plog) in plogs.items():
        f = filters[name]
        end = f.read_limit
        if end <= 0:
            continue
        rows = f.apply(plog.read(0, end, columns=DATA_COLUMNS))
        out.extend((topic, part.partition, o, v.decode()) for o, v in
                   zip(rows.column("offset").to_pylist(), rows.column("value").to_pylist(), strict=True))
    return out


def pmap(fn: Any, items: Iterable[Any], workers: int = 4) -> list[Any]:
    """``[fn(x) for x in items]`` on a few threads: reads are storage-latency bound and delta-rs
    releases the GIL, which matters on S3."""
    from concurrent.futures import ThreadPoolExecutor

    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


def starts(c: Any, topics: Iterable[str]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the first offset still in the log (0 unless retention ran)."""
    from pulsartx.log.partition import PartitionLog

    return {(t, p.partition): PartitionLog(c.root, p).refresh().start_offset
            for t in topics for p in _partitions(c, t)}


def collect_final(url: str, storage_options: dict[str, str] | None, topics: Iterable[str],
                  subscriptions: Iterable[tuple[str, str]] = (), drain_with_consumer: bool = True,
                  workers: int = 4) -> FinalState:
    """``drain_with_consumer``: a real consumer receives what is left (waits for an idle period and
    for a dead owner's lease); else the durable cursor says what is left (fast, for many subs)."""
    c = client(url, storage_options)
    try:
        topics = list(topics)
        per_topic = pmap(lambda t: (visible(c, t), stored(c, t), ongoing(c, t)), topics, workers)
        fs = FinalState(visible={t: r[0] for t, r in zip(topics, per_topic, strict=True)},
                        stored={t: r[1] for t, r in zip(topics, per_topic, strict=True)},
                        txn_status=txn_status(c), starts=starts(c, topics))
        for r in per_topic:
            fs.ongoing.update(r[2])
        subscriptions = list(subscriptions)
        drained = pmap(lambda ts: drain(c, *ts) if drain_with_consumer else
                       unacknowledged(c, *ts, rows=fs.visible.get(ts[0])), subscriptions, workers)
        fs.drained = dict(zip(subscriptions, drained, strict=True))
        return fs
    finally:
        c.close()


def rgw_root(request: Any, hint: str) -> tuple[str, dict[str, str]]:
    """A fresh root on the session's Ceph RGW (tests/conftest.py ``rgw_server``); skips with the
    reason when Ceph is unavailable (the fixture skips) or the fixture is missing."""
    import pytest

    try:
        server = request.getfixturevalue("rgw_server")
    except pytest.FixtureLookupError:
        pytest.skip("no rgw_server fixture (tests/conftest.py)")
    return server.new_root(hint)
