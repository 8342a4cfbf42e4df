"""One streaming micro-batch = one pulsartx transaction, exactly once across restarts.

* Transaction key: one per query, from Spark's query id in ``<checkpoint>/metadata``, whatever
  the checkpoint's spelling (or the ``transactionKey`` option; a query begun under the older
  checkpoint-path key keeps it). A query run is a *connection* of the fencing proposal, identified
  by the driver JVM (host, pid, start time) and the checkpoint; a new run bumps the key's epoch,
  which aborts the previous run's open transaction and refuses that run forever after (zombie
  fencing: its later commits fail).
* Replays: the query id and batch id are recorded in the transaction's deciding TC entry. Before
  committing batch N, the sink looks for a transaction of its key already COMMITTING/COMMITTED for
  N by the same query; if there is one (the batch committed but Spark died before writing
  ``commits/N``), this attempt's output is aborted instead, so the batch appears once. The query id
  is read from ``<checkpoint>/metadata``, else taken from the tasks' reports (Spark gives every task
  of the query its id as a local property): without a ``checkpointLocation`` option, another query
  under the same ``transactionKey`` is then not taken for a replay
  (docs/design/replay-check-by-the-tasks-query-id.md).
* pyspark calls ``streamWriter()`` twice per batch: in the planner worker, whose writer is pickled
  to the tasks, and again in the sink runner, whose writer only commits or aborts. Only the first
  begins the batch's transaction; the committing side learns it from the tasks' reports
  (:meth:`MicroBatchTransaction.for_commit`), or begins one just to acknowledge input when the batch
  produced no output at all.
* ``abort(messages, batchId)`` never undoes a committed batch: ABORT on a committed transaction is
  refused by the TC and logged.
* Input acknowledgement: with the source's ``subscription`` option, the batch's input end offsets
  are cumulatively acknowledged *inside* the transaction (``handoff.py``), so output and input
  position commit together.
"""
from __future__ import annotations

import hashlib
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from pulsartx.commit_protocol import handoff, keepalive
from pulsartx.commit_protocol.driver import driver_coordinators, driver_jvm
from pulsartx.commit_protocol.job import JobTransaction
from pyspark.sql.datasource import WriterCommitMessage

from pulsartx.buffer.state import txn_key
from pulsartx.client.transaction import run_beside
from pulsartx.coordinator.coordinator import now_ms
from pulsartx.coordinator.fencing import fence_all
from pulsartx.coordinator.keys import full_key
from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.state import Subscription, TxnAction, TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import InvalidTxnStatusError, NotAllowedError, TransactionNotFound
from pulsartx.log.partition import partition_segments
from pulsartx.naming import TopicName
from pulsartx.storage import delta
from pulsartx.storage.root import StorageRoot, read_url_text
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.resolution import pending_keys, resolve_pending
from pulsartx.subscription.store import SubscriptionStore, shared_store

log = logging.getLogger("pulsartx.commit_protocol")
BATCH_PROPERTY = "pulsartx.streaming.batch"  # "<query id>:<batch id>"
COMMIT_REQUESTED_PROPERTY = "pulsartx.streaming.commitRequestedMs"  # sink's commit call, epoch ms
OWNER = "spark-streaming"


def query_transaction_key(checkpoint: str | None, explicit: str | None, root: StorageRoot | None = None) -> str:
    """The query's transaction key: the ``transactionKey`` option, else ``query-<Spark's query id>``.

    The query id (``<checkpoint>/metadata``, written by Spark before the sink's first call) is the
    same however the checkpoint is spelled (a symlink, ``s3a://`` or ``s3://``, a relative path), so
    a batch replayed after a restart under another spelling is found committed under the key it
    committed under. A query whose checkpoint-path key (the key before query ids were used) already
    has a key row keeps that key while its query-id key has none: its committed batches and its
    running zombies are under that key (docs/design/transaction-key-from-the-query-id.md). Without
    ``root`` no key row is read: the key of a query with no path-key history."""
    if explicit:
        return explicit
    if not checkpoint:
        raise ValueError("a streaming write needs checkpointLocation (or the transactionKey option)")
    qid = query_id(checkpoint)
    if not qid:
        return checkpoint_path_key(checkpoint)
    key = f"query-{qid}"
    if root is None or _has_key_row(root, key):
        return key
    legacy = checkpoint_path_key(checkpoint)
    return legacy if _has_key_row(root, legacy) else key


def checkpoint_path_key(checkpoint: str) -> str:
    """The key derived from the checkpoint path as written, the only key before query ids were
    used; still the key of a checkpoint without ``metadata`` and of queries that began under it."""
    norm = checkpoint.rstrip("/")
    for prefix in ("file://", "file:"):
        if norm.startswith(prefix):
            norm = norm[len(prefix):]
    return "query-" + hashlib.sha1(norm.encode()).hexdigest()[:20]


def _has_key_row(root: StorageRoot, key: str) -> bool:
    """Whether a run ever claimed ``key`` (and no admin deleted it): a row is never dropped."""
    return driver_coordinators(root).key_store_of(full_key(OWNER, key)).current_epoch(OWNER, key) is not None


def query_id(checkpoint: str | None) -> str:
    """Spark's query id from ``<checkpoint>/metadata`` ("" without a checkpoint)."""
    if not checkpoint:
        return ""
    import json

    try:
        return str(json.loads(read_url_text(checkpoint.rstrip("/") + "/metadata").splitlines()[0]).get("id", ""))
    except (FileNotFoundError, ValueError, IndexError):
        return ""


def same_batch(recorded: str | None, query: str, batch_id: int) -> bool:
    """Whether a committed transaction's batch token (``<query id>:<batch id>``) is batch
    ``batch_id`` of query ``query``. Where either query id is unknown ("": a token written by a
    version that knew none without a checkpoint, or a batch whose tasks reported none), the batch id
    alone decides, as before query ids were reported: a replay across an upgrade is still written
    once (a restart after ``stop()`` often replays the last batch)."""
    if recorded is None:
        return False
    recorded_query, _, recorded_batch = recorded.rpartition(":")
    if recorded_batch != str(batch_id):
        return False
    return recorded_query == query or not recorded_query or not query


def connection_id(checkpoint: str | None) -> str:
    """This query run's identity for fencing: the driver JVM (host, pid, start time) and the
    checkpoint. Spark refuses two active runs of one checkpoint in one JVM, so a different JVM (or
    checkpoint) under the same transaction key is a different run."""
    pid, start = driver_jvm()
    return f"{socket.gethostname()}:{pid}:{start}:{checkpoint or ''}"


@dataclass(frozen=True)
class MicroBatchTransaction:
    job: JobTransaction
    key: str
    epoch: int
    checkpoint: str | None

    @classmethod
    def begin(cls, root: StorageRoot, key: str, checkpoint: str | None, *, timeout_ms: int,
              producer_name: str | None = None, connection: str | None = None,
              partitions: frozenset[str] = frozenset(), keep_alive: bool = False) -> MicroBatchTransaction:
        """``keep_alive``: ``timeout_ms`` is a short timeout that the driver extends while it lives
        (:mod:`keepalive`), rather than the batch's whole budget."""

        tcs = driver_coordinators(root)
        keys = tcs.key_store_of(full_key(OWNER, key))
        epoch, previous = keys.claim_connection(OWNER, key, connection or connection_id(checkpoint))
        if previous:
            fence_all(tcs, previous, f"fenced: transaction key {key!r} taken over by a new run (epoch {epoch})")
        tc = tcs.tc(tcs.pick())  # the driver's leased TC; the key's epoch stays on the TC it hashes to
        # The key's ids rise on each TC, whichever process begins the batch: the TC log's compaction
        # keeps the key's committed transaction with the highest id, which a replay looks for.
        # As of the claim just made (a read of the key's row): no second read of the table.
        mine = [t.least_bits for t in keys.txn_ids(OWNER, key, refresh=False) if t.most_bits == tc.tc_id]
        if mine:
            tc.issue_above(max(mine))
        props = keepalive.properties(timeout_ms) if keep_alive else None
        meta = tc.new_transaction(timeout_ms, owner=OWNER, transaction_key=key, epoch=epoch, partitions=partitions,
                                  properties=props)
        if keep_alive:
            keepalive.keep_alive(root, meta.txn_id, timeout_ms)
        try:
            earlier = keys.attach(OWNER, key, epoch, meta.txn_id)
        except NotAllowedError:
            fence_all(tcs, [meta.txn_id], f"fenced: transaction key {key!r} moved to a newer epoch")
            raise
        # One open transaction per key: an earlier batch left open (never committed nor aborted) goes.
        fence_all(tcs, [t for t in earlier if t != meta.txn_id], f"fenced: superseded by {meta.txn_id}")
        prefix = producer_name or f"stream-{key}"
        return cls(JobTransaction(root, meta.txn_id, prefix, timeout_ms), key, epoch, checkpoint)

    @classmethod
    def for_commit(cls, root: StorageRoot, key: str, checkpoint: str | None, timeout_ms: int,
                   messages: Sequence[WriterCommitMessage | None]) -> MicroBatchTransaction | None:
        """The sink runner's view of the batch's transaction: the one the tasks reported."""
        txn = JobTransaction.txn_of(messages)
        if txn is None:
            return None
        return cls(JobTransaction(root, txn, f"stream-{key}", timeout_ms), key, -1, checkpoint)

    @classmethod
    def abort_open_of_run(cls, root: StorageRoot, key: str, checkpoint: str | None, batch_id: int) -> list[TxnID]:
        """Abort this run's OPEN transactions of the key: Spark aborts a batch that was stopped or
        failed before any task reported, and the sink learns the transaction from reports only.
        Left open, it would hold READ_COMMITTED readers until it timed out. Only transactions of
        the run holding the key (this driver) are touched: another run's are its own business."""
        tcs = driver_coordinators(root)
        keys = tcs.key_store_of(full_key(OWNER, key))
        holder = keys.connection(OWNER, key)
        if holder is None or holder[1] != connection_id(checkpoint):
            return []
        epoch, aborted = holder[0], []
        for t in keys.txn_ids(OWNER, key)[-4:]:
            try:
                meta = tcs.for_txn(t).get(t, refresh=True)
                if meta.status is TxnStatus.OPEN and meta.epoch == epoch and meta.owner == OWNER:
                    tcs.for_txn(t).end_transaction(t, TxnAction.ABORT, reason=f"batch {batch_id} aborted")
                    aborted.append(t)
            except (TransactionNotFound, InvalidTxnStatusError):
                continue  # trimmed, or ended meanwhile: nothing to do
        return aborted

    def _tcs(self):
        return driver_coordinators(self.job.root)

    def query_of(self, messages: Sequence[WriterCommitMessage | None]) -> str:
        """Spark's query id for this batch: ``<checkpoint>/metadata``'s, else the one its tasks
        report (the sink gets no checkpoint when it comes from spark.sql.streaming.checkpointLocation;
        Spark's tasks still see the query id). "" when neither knows it: no task reported (only
        outside Spark: Spark runs one task even for an empty batch), or tasks of an earlier version."""
        return query_id(self.checkpoint) or JobTransaction.query_id_of(messages)

    def batch_token(self, batch_id: int, query: str | None = None) -> str:
        """A batch's identity: Spark's query id (kept in ``<checkpoint>/metadata``, new when a
        checkpoint is recreated; ``query`` when given) and the batch id. A deleted checkpoint restarts
        batch ids at 0, and those batches are new work, not replays."""
        return f"{query_id(self.checkpoint) if query is None else query}:{batch_id}"

    def committed_by(self, batch_id: int, query: str | None = None) -> str | None:
        """The transaction of this key that already committed ``batch_id`` for the same query
        (``query``, else the checkpoint's), if any: :func:`same_batch`.

        Only the key's latest committed transaction can have: Spark replays only its latest batch,
        and a key has one open transaction at a time, so its transactions commit in the order the
        key row lists them. Walking that list from the newest usually ends at the previous batch,
        one or two lookups. When none listed committed (a crash loop pushed the committed one off
        the list), the TC logs the key used are searched: their compaction always keeps the key's
        latest committed transaction, and the key row keeps naming every TC it used."""
        tcs = self._tcs()
        query = query_id(self.checkpoint) if query is None else query
        listed = tcs.key_store_of(full_key(OWNER, self.key)).txn_ids(OWNER, self.key)
        refreshed: set[int] = set()
        for t in reversed(listed):
            if t == self.job.txn_id:
                continue
            meta = self._lookup(t, refresh=t.most_bits not in refreshed)
            refreshed.add(t.most_bits)
            if meta is not None and self._committed_of_key(meta):
                return str(t) if same_batch(meta.properties.get(BATCH_PROPERTY), query, batch_id) else None
        for tc_id in sorted({tcs.pick(full_key(OWNER, self.key))} | {t.most_bits for t in listed}):
            for meta in tcs.tc(tc_id).transactions(refresh=True):
                if self._committed_of_key(meta) and same_batch(meta.properties.get(BATCH_PROPERTY), query, batch_id):
                    return str(meta.txn_id)
        return None

    def _lookup(self, txn: TxnID, refresh: bool):
        try:
            return self._tcs().for_txn(txn).get(txn, refresh=refresh)
        except TransactionNotFound:
            return None  # trimmed: finished, and not the latest committed of its log

    def _committed_of_key(self, meta) -> bool:
        return (meta.transaction_key == self.key and meta.owner == OWNER and meta.txn_id != self.job.txn_id
                and meta.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED))

    def commit(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> None:
        query = self.query_of(messages)
        done = self.committed_by(batch_id, query)
        if done is not None:
            log.warning("batch %d was already committed by transaction %s: discarding this replay's output (%s)",
                        batch_id, done, self.job.txn_id)
            self.job.abort(messages)
            return
        self._ack_inputs(batch_id)
        assert self.job.txn_id is not None
        tc = self._tcs().for_txn(self.job.txn_id)
        entries = JobTransaction.entries(messages)
        requested = now_ms()
        meta = tc.end_transaction(self.job.txn_id, TxnAction.COMMIT, commit_entries=entries,
                                  properties={BATCH_PROPERTY: self.batch_token(batch_id, query),
                                              COMMIT_REQUESTED_PROPERTY: str(requested)})
        log.info("batch %d committed as transaction %s (%d entries, key %s, epoch %d, status %s, commit %d ms)",
                 batch_id, self.job.txn_id, len(entries), self.key, self.epoch, meta.status.value,
                 now_ms() - requested)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> None:
        if self.committed_by(batch_id, self.query_of(messages)) is not None:
            log.warning("abort of batch %d ignored: the batch already committed", batch_id)
        try:
            self.job.abort(messages)
        except InvalidTxnStatusError as e:
            log.warning("abort of batch %d (transaction %s) refused, it committed: %s", batch_id, self.job.txn_id, e)

    def _ack_inputs(self, batch_id: int) -> None:
        """Cumulatively acknowledge the batch's input on its subscription inside the transaction."""
        root, txn = self.job.root, self.job.txn_id
        assert txn is not None
        plans = []
        for h in handoff.find(root, self.checkpoint, batch_id):
            targets = _ack_targets(root, h)
            if targets:  # None: another query's record; []: a subscription already past this range
                plans.append((h.subscription, targets))
        if len(plans) > 1:
            log.warning("batch %d: input hand-off is ambiguous (%s); the source's commit will acknowledge instead",
                        batch_id, [s for s, _ in plans])
            return
        tcs = self._tcs()
        tc = tcs.for_txn(txn)
        k = txn_key(txn.most_bits, txn.least_bits)
        for sub, targets in plans:
            tc.add_subscriptions(txn, [Subscription(str(t.partition), sub) for t in targets])
            run_beside([partial(_ack_partition, root, tcs, sub, k, t) for t in targets])


@dataclass(frozen=True)
class _AckTarget:
    """One input partition to acknowledge up to ``position``, with the cursor read to decide it."""

    store: SubscriptionStore
    partition: TopicName
    position: int
    cursor: CursorState


def _ack_partition(root: StorageRoot, tcs: Coordinators, sub: str, k: int, t: _AckTarget) -> None:
    """The transaction's pending cumulative ack on one input partition.

    Another transaction's pending ack there (a fenced batch's, landed after its abort) would
    refuse this one: those their TCs can no longer commit are returned first. They are found on
    the cursor ``_ack_targets`` has just read fresh; the update itself is a compare-and-set that
    re-reads on a lost race, and a pending ack landing in between makes it raise
    TransactionConflict (the batch fails and is retried), exactly as with a second read."""
    others = pending_keys(t.cursor, exclude=[k])
    resolve_pending(root, tcs, str(t.partition), sub, others, deadlines=t.cursor.deadlines)
    t.store.update(lambda c: c.txn_ack_cumulative(k, t.position))


def _ack_targets(root: StorageRoot, h: handoff.Handoff) -> list[_AckTarget] | None:
    """The input partitions to acknowledge for one hand-off record; None when the subscription is
    not at the batch's start, i.e. the record belongs to another query."""
    targets = []
    for topic, parts in h.end.items():
        tables = parts.get(handoff.TABLE_IDS, {})
        for p, end in handoff.positions(parts).items():
            partition = TopicName.parse(topic).with_partition(int(p))
            store = shared_store(root, partition, h.subscription)
            cur = store.cursor() if store.exists() else None
            if cur is None:
                continue
            start = h.start.get(topic, {}).get(p)
            if start is not None and cur.mark_delete + 1 not in (start, end):
                return None
            if end - 1 > cur.mark_delete and _on_current_table(root, partition, tables.get(p)):
                targets.append(_AckTarget(store, partition, end - 1, cur))
    return targets


def _on_current_table(root: StorageRoot, partition: TopicName, recorded: str | None) -> bool:
    """Whether the batch's offsets for ``partition`` are its current table's (or name none). A
    batch planned on a topic deleted and re-created since read nothing of the new one: its offsets
    acknowledged there would be new messages nobody read. One read of the table's first commit,
    only for a partition with something to acknowledge."""
    if recorded is None:
        return True
    current = delta.LogTail(root, partition_segments(partition)).table_id()
    if current is None or current == recorded:  # None: version 0 cleaned up after a checkpoint, same table
        return True
    log.warning("%s was re-created after this micro-batch was planned: its input there is not acknowledged",
                partition)
    return False
