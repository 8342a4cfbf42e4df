"""One Spark write job = one pulsartx transaction.

pyspark runs ``writer()``, each task's ``write()`` and the job's ``commit()``/``abort()`` in
different Python processes (docs/design/spark-job-state-in-storage.md), so nothing may live in memory:
:class:`JobTransaction` is created in ``writer()``, pickled into every task and into the commit
worker, and carries only the storage root and the TxnID. Everything else is in storage:

1. ``writer()`` → :meth:`JobTransaction.begin` logs NEW on a TC (and ADD_PARTITION for every
   partition it already knows), with a short timeout that the driver keeps extending while it
   lives (``keepalive.py``): a long job lives, a dead driver's transaction aborts soon.
2. each task attempt appends through the idempotent-producer path (``task.py``) and reports
   exactly the entries it appended in its :class:`TaskReport`;
3. ``commit(messages)`` → :meth:`JobTransaction.commit` logs COMMITTING *with the reported entries*
   and writes markers that list them: entries of failed or speculative attempts, which no report
   names, are never visible. A driver that dies after COMMITTING is finished by TC recovery from
   the logged entries; one that dies before it leaves an OPEN transaction that times out, within
   the short keep-alive timeout.
4. ``abort(messages)`` → ABORT markers at once, so readers are unblocked immediately.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pulsartx.commit_protocol import keepalive
from pulsartx.commit_protocol.driver import driver_coordinators
from pyspark.sql.datasource import WriterCommitMessage

from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.storage.root import StorageRoot

log = logging.getLogger("pulsartx.commit_protocol")
DEFAULT_JOB_TIMEOUT_MS = 3_600_000
# The local property Spark's StreamExecution sets to the query's id (the one kept in
# <checkpoint>/metadata, not the run id); local properties reach every task of the query.
SPARK_QUERY_ID_PROPERTY = "sql.streaming.queryId"


@dataclass
class TaskReport(WriterCommitMessage):
    """What one successful task attempt appended: ``(partition, first_offset, last_offset)`` per
    entry (Delta commit), plus counts for logging."""

    entries: list[tuple[str, int, int]] = field(default_factory=list)
    rows: int = 0
    attempt: str = ""
    txn: tuple[int, int] | None = None  # the transaction the entries belong to
    # The Spark streaming query the task ran for ("" in a batch job, and in a report unpickled from a
    # version without the field, which the class default fills in): a micro-batch's replay check
    # needs it when the sink has no checkpoint to read it from (commit_protocol/microbatch.py).
    query_id: str = ""


@dataclass(frozen=True)
class JobTransaction:
    root: StorageRoot
    txn_id: TxnID | None  # None: non-transactional mode
    producer_prefix: str
    timeout_ms: int
    # Non-transactional jobs only: a token unique to the job, in its tasks' producer names. Those
    # names otherwise repeat from job to job under one producerName option (no TxnID in them), and
    # the idempotent-producer check then dropped a later job's rows as duplicates of an earlier one's.
    run_id: str = ""

    @classmethod
    def begin(cls, root: StorageRoot, *, transactional: bool = True, timeout_ms: int = DEFAULT_JOB_TIMEOUT_MS,
              producer_name: str | None = None, partitions: Iterable[str] = (),
              properties: dict[str, str] | None = None, keep_alive: bool = False) -> JobTransaction:
        """``keep_alive``: ``timeout_ms`` is a short timeout that the driver extends while it lives
        (:mod:`keepalive`), rather than the job's whole budget."""
        prefix = producer_name or f"spark-{uuid.uuid4().hex[:12]}"
        if not transactional:
            return cls(root, None, prefix, timeout_ms, run_id=uuid.uuid4().hex[:12])
        tcs = driver_coordinators(root, recover_on_open=True)
        tc = tcs.tc(tcs.pick())
        parts = sorted(set(partitions))
        if keep_alive:
            properties = {**(properties or {}), **keepalive.properties(timeout_ms)}
        meta = tc.new_transaction(timeout_ms, owner=None, properties=properties, partitions=parts)
        if keep_alive:
            keepalive.keep_alive(root, meta.txn_id, timeout_ms)
        log.info("write job began transaction %s on TC %d (%d partition(s) registered, timeout %d ms)",
                 meta.txn_id, tc.tc_id, len(parts), timeout_ms)
        return cls(root, meta.txn_id, prefix, timeout_ms)

    @property
    def transactional(self) -> bool:
        return self.txn_id is not None

    def _tc(self):
        assert self.txn_id is not None
        return Coordinators.shared(self.root).for_txn(self.txn_id)

    def register(self, partitions: Iterable[str]) -> None:
        """ADD_PARTITION from a task, before its first append to a partition the driver could not
        know (rows routed by the ``__topic`` column)."""
        if self.txn_id is not None:
            self._tc().add_partitions(self.txn_id, partitions)

    @staticmethod
    def txn_of(messages: Sequence[WriterCommitMessage | None]) -> TxnID | None:
        """The transaction the tasks wrote under (streaming commits learn it from the reports)."""
        txns = {m.txn for m in messages if isinstance(m, TaskReport) and m.txn is not None}
        if len(txns) > 1:
            raise ValueError(f"task reports name several transactions: {sorted(txns)}")
        return TxnID(*txns.pop()) if txns else None

    @staticmethod
    def query_id_of(messages: Sequence[WriterCommitMessage | None]) -> str:
        """The Spark streaming query the tasks wrote for ("" when none reported one)."""
        ids = {m.query_id for m in messages if isinstance(m, TaskReport) and m.query_id}
        if len(ids) > 1:
            raise ValueError(f"task reports name several streaming queries: {sorted(ids)}")
        return ids.pop() if ids else ""

    @staticmethod
    def entries(messages: Sequence[WriterCommitMessage | None]) -> list[tuple[str, int, int]]:
        return sorted({e for m in messages if isinstance(m, TaskReport) for e in m.entries})

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> TxnStatus | None:
        entries = self.entries(messages)
        rows = sum(m.rows for m in messages if isinstance(m, TaskReport))
        if self.txn_id is None:
            log.info("non-transactional write job done: %d rows in %d entries", rows, len(entries))
            return None
        t0 = time.monotonic()
        meta = self._tc().end_transaction(self.txn_id, TxnAction.COMMIT, commit_entries=entries)
        log.info("committed transaction %s: %d rows in %d entries over %d partition(s), status %s, %.0f ms",
                 self.txn_id, rows, len(entries), len({e[0] for e in entries}), meta.status.value,
                 1000 * (time.monotonic() - t0))
        return meta.status

    def abort(self, messages: Sequence[WriterCommitMessage | None] = ()) -> TxnStatus | None:
        if self.txn_id is None:
            log.warning("non-transactional write job failed: rows already appended stay visible")
            return None
        meta = self._tc().end_transaction(self.txn_id, TxnAction.ABORT)
        log.info("aborted transaction %s (status %s): nothing of this job is visible", self.txn_id, meta.status.value)
        return meta.status
