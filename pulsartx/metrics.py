"""Prometheus metrics, with Pulsar's names where they exist so existing dashboards keep working.

Two kinds of figures:
* events counted in this process (transactions committed/aborted/timed out by this process's TCs,
  TC log appends, execution latencies, pending-ack commits): ``record_*`` functions, called by the
  coordinator and the pending-ack participant;
* state read from storage at scrape time (active transactions, TxnIDs created, transaction keys,
  per-partition entries, maxReadPosition lag, oldest open transaction).

Embed with :func:`generate_latest` (text exposition) or :func:`start_metrics_server`;
``pulsartx coordinator run --metrics-port`` does the latter.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from functools import partial
from typing import Any

from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.state import key_txn
from pulsartx.log.partition import PartitionLog
from pulsartx.observe.failures import RepeatedFailures, one_line
from pulsartx.observe.listings import unless_deleted
from pulsartx.storage.retry import StorageUnavailable

log = logging.getLogger(__name__)

# Pulsar's pulsar_txn_execution_latency_le_* buckets, in milliseconds.
LATENCY_BUCKETS_MS = (10, 20, 50, 100, 500, 1000, 5000, 15000, 30000, 60000, 300000, 1500000, 3000000)

_lock = threading.Lock()
_counts: dict[tuple[str, int], int] = defaultdict(int)  # (event, coordinator_id) -> count
_latency: dict[int, list[int]] = defaultdict(lambda: [0] * (len(LATENCY_BUCKETS_MS) + 1))
_tp: dict[str, int] = defaultdict(int)  # pending-ack committed/aborted counts
_tp_latency = [0] * (len(LATENCY_BUCKETS_MS) + 1)


def _counts_in_child() -> None:
    """A forked child counts its own events, behind a lock no parent thread holds."""
    global _lock
    _lock = threading.Lock()
    _counts.clear()
    _latency.clear()
    _tp.clear()
    _tp_latency[:] = [0] * len(_tp_latency)


os.register_at_fork(after_in_child=_counts_in_child)


def _bucket(ms: float) -> int:
    for i, b in enumerate(LATENCY_BUCKETS_MS):
        if ms <= b:
            return i
    return len(LATENCY_BUCKETS_MS)


def record_tc_event(coordinator_id: int, event: str, meta: Any = None) -> None:
    """``event``: created, append, committed, aborted, timeout."""
    with _lock:
        _counts[(event, coordinator_id)] += 1
        if event in ("committed", "aborted") and meta is not None:
            _latency[coordinator_id][_bucket(meta.last_modified_ms - meta.start_ms)] += 1


def record_pending_ack(committed: bool, latency_ms: float) -> None:
    with _lock:
        _tp["committed" if committed else "aborted"] += 1
        if committed:
            _tp_latency[_bucket(latency_ms)] += 1


def reset() -> None:
    """Forget this process's event counts (tests)."""
    with _lock:
        _counts.clear()
        _latency.clear()
        _tp.clear()
        for i in range(len(_tp_latency)):
            _tp_latency[i] = 0


class PulsarTxCollector:
    """A prometheus_client collector: event counts from memory, state from storage at scrape."""

    def __init__(self, client: Any, topics: Iterable[str] | None = None):
        self.client = client
        self.topics = list(topics) if topics is not None else None
        self._reported = RepeatedFailures()  # "TC <id>'s log", "topic <name>", "partition <name>"

    def _unreadable(self, what: str, e: Exception) -> None:
        """Log ``what`` (a TC log, a topic, a partition) that cannot be read at WARNING once, then
        at DEBUG while the same error repeats, as every scrape meets it (the coordinator service
        logs a failing TC or partition the same way)."""
        error = one_line(e)
        if self._reported.is_news(what, error):
            log.warning("metrics: %s cannot be read; its figures are left out of this scrape: %s", what, error)
        else:
            log.debug("metrics: %s still cannot be read: %s", what, error)

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        def family(name: str, doc: str, labels: list[str]):
            return GaugeMetricFamily(name, doc, labels=labels)

        tcs = self.client._coordinators()
        active = family("pulsar_txn_active_count", "Open, committing and aborting transactions", ["coordinator_id"])
        created = family("pulsar_txn_created_count", "Transactions created (the highest TxnID the TC log holds or "
                         "has trimmed + 1)", ["coordinator_id"])
        unreadable = family("pulsartx_coordinator_log_unreadable", "1 when the TC's log could not be read at "
                            "this scrape (its other families have no sample then), else 0", ["coordinator_id"])
        metas_by_tc = {}
        used = tcs.used()  # an unused TC has no log, and opening it would create one at every scrape
        for tc_id in sorted(set(range(tcs.count)) - set(used)):
            unreadable.add_metric([str(tc_id)], 0)
            active.add_metric([str(tc_id)], 0)
            created.add_metric([str(tc_id)], 0)
        # With the TC: its transactions and, as they are trimmed once finished, the highest id trimmed.
        for tc_id, read in tcs.each(lambda tc: (tc.transactions(), tc.txlog.trimmed_through), used):
            unreadable.add_metric([str(tc_id)], 1 if isinstance(read, Exception) else 0)
            if isinstance(read, Exception):  # the other TCs are still reported; this one's figures are unknown
                self._unreadable(f"TC {tc_id}'s log", read)
                continue
            self._reported.cleared(f"TC {tc_id}'s log")
            metas, trimmed = read
            metas_by_tc[tc_id] = metas
            active.add_metric([str(tc_id)], sum(1 for m in metas if not m.status.is_final))
            created.add_metric([str(tc_id)], max([trimmed, *(m.txn_id.least_bits for m in metas)]) + 1)
        yield active
        yield created
        yield unreadable
        with _lock:
            counts = dict(_counts)
            latency = {k: list(v) for k, v in _latency.items()}
            tp = dict(_tp)
            tp_latency = list(_tp_latency)
        for event, name, doc in (("committed", "pulsar_txn_committed_count", "Transactions committed"),
                                 ("aborted", "pulsar_txn_aborted_count", "Transactions aborted"),
                                 ("timeout", "pulsar_txn_timeout_count", "Transactions aborted on timeout"),
                                 ("append", "pulsar_txn_append_log_count", "TC log entries appended")):
            f = family(name, doc + " by this process", ["coordinator_id"])
            for tc_id in range(tcs.count):
                f.add_metric([str(tc_id)], counts.get((event, tc_id), 0))
            yield f
        labels = [f"le_{b}" for b in LATENCY_BUCKETS_MS] + ["le_overflow"]
        for i, suffix in enumerate(labels):
            f = family(f"pulsar_txn_execution_latency_{suffix}", "Transactions whose execution took at most "
                       "this many ms and more than the previous bucket's bound (one range, as in Pulsar)",
                       ["coordinator_id"])
            for tc_id in range(tcs.count):
                f.add_metric([str(tc_id)], latency.get(tc_id, [0] * len(labels))[i])
            yield f
        f = family("pulsar_txn_tp_committed_count_total", "Pending acks committed", [])
        f.add_metric([], tp.get("committed", 0))
        yield f
        f = family("pulsar_txn_tp_aborted_count_total", "Pending acks aborted", [])
        f.add_metric([], tp.get("aborted", 0))
        yield f
        for i, suffix in enumerate(labels):
            f = family(f"pulsar_txn_tp_commit_latency_{suffix}", "Pending-ack commits that took at most this "
                       "many ms and more than the previous bucket's bound (one range, as in Pulsar)", [])
            f.add_metric([], tp_latency[i])
            yield f
        yield from self._keys(tcs)
        yield from self._partitions(metas_by_tc)

    def _keys(self, tcs):
        from prometheus_client.core import GaugeMetricFamily

        count = GaugeMetricFamily("pulsar_txn_transaction_key_count", "Transaction keys", labels=["coordinator_id"])
        epoch = GaugeMetricFamily("pulsar_txn_transaction_key_epoch", "Current epoch of each transaction key",
                                  labels=["coordinator_id", "owner", "transaction_key"])
        age = GaugeMetricFamily("pulsar_txn_transaction_key_age", "Milliseconds since the key's epoch was claimed",
                                labels=["coordinator_id", "owner", "transaction_key"])
        for tc_id in range(tcs.count):
            infos = tcs.keys_if_any(tc_id)
            count.add_metric([str(tc_id)], len(infos))
            for i in infos:
                epoch.add_metric([str(tc_id), i.owner, i.transaction_key], i.epoch)
                age.add_metric([str(tc_id), i.owner, i.transaction_key], i.age_ms)
        yield count
        yield epoch
        yield age

    def _partitions(self, metas_by_tc):
        from prometheus_client.core import GaugeMetricFamily


        entries = GaugeMetricFamily("pulsartx_partition_entries", "Offsets in the partition log",
                                    labels=["topic", "partition"])
        lag = GaugeMetricFamily("pulsartx_partition_max_read_position_lag", "End offset minus maxReadPosition + 1",
                                labels=["topic", "partition"])
        oldest = GaugeMetricFamily("pulsartx_partition_oldest_open_txn_age_ms",
                                   "Age of the oldest transaction open in the partition", labels=["topic", "partition"])
        starts = {(m.txn_id.most_bits, m.txn_id.least_bits): m.start_ms for ms in metas_by_tc.values() for m in ms}
        now = int(time.time() * 1000)
        admin = self.client.admin
        for topic in self.topics if self.topics is not None else admin.list_topics():
            try:
                # One named in ``topics`` is missing: worth a warning (below); one listed was deleted since.
                parts = admin.partitions_of(topic) if self.topics is not None else \
                    unless_deleted(admin, topic, partial(admin.partitions_of, topic))
                if parts is None:
                    continue
            except StorageUnavailable:
                raise
            except Exception as e:  # its metadata unreadable: the other topics are still reported
                self._unreadable(f"topic {topic}", e)
                continue
            self._reported.cleared(f"topic {topic}")
            for p in parts:
                try:
                    plog = PartitionLog(self.client.root, p)
                    loaded = unless_deleted(admin, p, lambda plog=plog: (plog.refresh(), TransactionBuffer(plog).state()))
                    if loaded is None:
                        continue  # deleted since its topic was listed
                    index, state = loaded
                except StorageUnavailable:
                    raise
                except Exception as e:  # one damaged partition must not fail the whole scrape
                    self._unreadable(f"partition {p}", e)
                    continue
                self._reported.cleared(f"partition {p}")  # the same error later is news again
                labels = [str(p.base), str(p.partition)]
                entries.add_metric(labels, index.end_offset - index.start_offset)
                lag.add_metric(labels, state.end_offset - state.read_limit)
                ages = [now - starts[key_txn(k)] for k in state.ongoing if key_txn(k) in starts]
                oldest.add_metric(labels, max(ages) if ages else 0)
        yield entries
        yield lag
        yield oldest


def registry(client: Any, topics: Iterable[str] | None = None):
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(PulsarTxCollector(client, topics))
    return reg


def generate_latest(client: Any, topics: Iterable[str] | None = None) -> str:
    """The metrics in Prometheus' text format, for embedding in an existing endpoint."""
    from prometheus_client import generate_latest as _gen

    return _gen(registry(client, topics)).decode()


def start_metrics_server(port: int, client: Any, topics: Iterable[str] | None = None, addr: str = "0.0.0.0"):
    """Serve /metrics on ``port`` from a background thread; returns (server, thread)."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr=addr, registry=registry(client, topics))
