"""Each streaming micro-batch's transaction id and commit latency, next to Spark's query progress.

Spark copies a connector's own figures into ``StreamingQueryProgress.sources[].metrics`` and
``sink.metrics`` only through the ``ReportsSourceMetrics`` / ``ReportsSinkMetrics`` interfaces.
pyspark 4.3's Python data-source runtime implements neither (``PythonMicroBatchStream`` and
``PythonStreamingWrite`` in spark-sql 4.x, checked with javap), and a Python data source has no
other path into the progress JSON. The sink therefore records each batch *in its transaction*
(``pulsartx.streaming.batch = "<query id>:<batch id>"`` and the time the sink asked to commit), and
:class:`PulsarTxProgressListener`, a ``StreamingQueryListener``, joins every progress event
(``progress.id`` is that same query id, ``progress.batchId`` the batch) to its transaction::

    listener = PulsarTxProgressListener(service_url)
    spark.streams.addListener(listener)
    ...
    listener.batches[(query.id, 3)]  # BatchTransaction(txn_id=..., commit_latency_ms=..., ...)

The join is exact because the batch id is part of the transaction's deciding TC record, the same
fact the sink uses to detect replays; no clock or ordering assumption is involved.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pulsartx.commit_protocol.microbatch import BATCH_PROPERTY, COMMIT_REQUESTED_PROPERTY
from pyspark.sql.streaming import StreamingQueryListener

from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.state import TxnMeta, TxnStatus
from pulsartx.storage.root import StorageRoot

log = logging.getLogger("pulsartx.streaming")


@dataclass(frozen=True)
class BatchTransaction:
    """One micro-batch's transaction as the TC log records it."""

    query_id: str
    batch_id: int
    txn_id: str
    status: str
    entries: int  # entries the commit marker covers (0 for a batch that only acknowledged input)
    duration_ms: int  # transaction opened -> last state change (COMMITTED: markers written)
    commit_latency_ms: int | None  # sink's commit call -> COMMITTED; None while still COMMITTING

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _batch_transaction(meta: TxnMeta) -> BatchTransaction | None:
    token = meta.properties.get(BATCH_PROPERTY)
    if token is None or ":" not in token:
        return None
    qid, _, batch = token.rpartition(":")
    requested = meta.properties.get(COMMIT_REQUESTED_PROPERTY)
    latency = None
    if requested is not None and meta.status is TxnStatus.COMMITTED:
        latency = max(0, meta.last_modified_ms - int(requested))
    return BatchTransaction(query_id=qid, batch_id=int(batch), txn_id=str(meta.txn_id), status=meta.status.value,
                            entries=sum(hi - lo + 1 for _, lo, hi in meta.commit_entries or ()),
                            duration_ms=meta.last_modified_ms - meta.start_ms, commit_latency_ms=latency)


class BatchTransactions:
    """Looks up the transactions of one root's streaming batches, remembering which TC serves each
    query (all batches of a query go to the TC of its transaction key), so a lookup after the first
    reads one TC log instead of all of them."""

    def __init__(self, service_url: str | None = None, storage_options: Mapping[str, str] | None = None):
        self.root = StorageRoot.resolve(service_url, dict(storage_options or {}))
        self._tc_of: dict[str, int] = {}
        self._tcs: Any = None

    def _coordinators(self):
        if self._tcs is None:
            self._tcs = Coordinators(self.root, recover_on_open=False)
        return self._tcs

    def of_query(self, query_id: str) -> dict[int, BatchTransaction]:
        """Every recorded batch of ``query_id`` (finished transactions stay until TC-log retention)."""
        tcs = self._coordinators()
        known = self._tc_of.get(query_id)
        found: dict[int, BatchTransaction] = {}
        for tc_id in [known] if known is not None else range(tcs.count):
            for meta in tcs.tc(tc_id).transactions(refresh=True):
                bt = _batch_transaction(meta)
                if bt is None or bt.query_id != query_id:
                    continue
                self._tc_of[query_id] = tc_id
                old = found.get(bt.batch_id)
                # A replayed batch leaves an aborted attempt beside the committed one: keep the latter.
                if old is None or (old.status != TxnStatus.COMMITTED.value and bt.status == TxnStatus.COMMITTED.value):
                    found[bt.batch_id] = bt
        return found

    def of_batch(self, query_id: str, batch_id: int) -> BatchTransaction | None:
        return self.of_query(query_id).get(batch_id)


class PulsarTxProgressListener(StreamingQueryListener):
    """Adds the transaction of every pulsartx-sink micro-batch to the query's progress events.

    ``batches`` maps (query id, batch id) to :class:`BatchTransaction`; ``on_batch`` (optional) is
    called with the progress event's JSON dict extended by a ``"pulsartx"`` entry, for users who
    forward progress to their monitoring. Queries without a pulsartx sink are ignored quietly.
    """

    def __init__(self, service_url: str | None = None, storage_options: Mapping[str, str] | None = None,
                 on_batch: Callable[[dict[str, Any]], None] | None = None):
        self.lookup = BatchTransactions(service_url, storage_options)
        self.on_batch = on_batch
        self.batches: dict[tuple[str, int], BatchTransaction] = {}
        self._lock = threading.Lock()

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 (Spark's names)
        pass

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        progress = event.progress
        qid, batch_id = str(progress.id), int(progress.batchId)
        try:
            bt = self.lookup.of_batch(qid, batch_id)
        except Exception as e:  # a listener must never take the query down
            log.warning("query %s batch %d: could not look up its transaction: %s", qid, batch_id, e)
            return
        if bt is None:
            return
        with self._lock:
            self.batches[(qid, batch_id)] = bt
        log.info("query %s batch %d: transaction %s %s, %d entries, commit latency %s ms", qid, batch_id,
                 bt.txn_id, bt.status, bt.entries, bt.commit_latency_ms)
        if self.on_batch is not None:
            import json

            self.on_batch(dict(json.loads(progress.json), pulsartx=bt.to_dict()))
