"""Transaction: Pulsar's Java transaction API in Python form (pulsar-client for Python has none).

``with client.new_transaction() as txn:`` commits on success and aborts on an exception.
Messages sent and acks made with ``txn=`` become visible/effective atomically at commit.
"""
from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from enum import Enum
from typing import TYPE_CHECKING, Any

from pulsartx.coordinator.state import Subscription, TxnAction, TxnMeta, TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import ExpiredTransactionError, InvalidTxnStatusError, TransactionConflict
from pulsartx.naming import TopicName

if TYPE_CHECKING:
    from pulsartx.client.client import Client
    from pulsartx.log.partition import AppendResult

log = logging.getLogger(__name__)
_POOL: ThreadPoolExecutor | None = None
_POOL_PID = 0
_POOL_LOCK = threading.Lock()


def helper_pool() -> ThreadPoolExecutor:
    """The process's threads for protocol steps that run beside the caller's (a new one after a
    fork: a parent's pool does not survive into the child)."""
    global _POOL, _POOL_PID
    with _POOL_LOCK:
        if _POOL is None or _POOL_PID != os.getpid():
            _POOL, _POOL_PID = ThreadPoolExecutor(4, thread_name_prefix="pulsartx-txn"), os.getpid()
        return _POOL


class TransactionState(Enum):
    OPEN = "OPEN"
    COMMITTING = "COMMITTING"
    ABORTING = "ABORTING"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"
    ERROR = "ERROR"
    TIME_OUT = "TIME_OUT"


_FROM_STATUS = {TxnStatus.OPEN: TransactionState.OPEN, TxnStatus.COMMITTING: TransactionState.COMMITTING,
                TxnStatus.ABORTING: TransactionState.ABORTING, TxnStatus.COMMITTED: TransactionState.COMMITTED,
                TxnStatus.ABORTED: TransactionState.ABORTED}


class Transaction:
    def __init__(self, client: Client, meta: TxnMeta):
        self._client = client
        self.id: TxnID = meta.txn_id
        self.timeout_ms = meta.timeout_ms
        self.state = TransactionState.OPEN
        self._partitions: set[str] = set()
        self._subscriptions: set[Subscription] = set()
        self._registering: dict[Subscription, Future[None]] = {}  # ADD_SUBSCRIPTIONs under way
        self._producers: list[Any] = []
        self._entries: dict[str, list[tuple[int, int]]] = {}
        self._conflict: BaseException | None = None
        self._expired: ExpiredTransactionError | None = None  # fenced or timed out: said again on every use
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Transaction({self.id}, {self.state.value})"

    @property
    def txn_id(self) -> TxnID:
        return self.id

    # ---- used by producers and consumers --------------------------------------------------------
    def _check_usable(self) -> None:
        if self._expired is not None:
            raise ExpiredTransactionError(str(self._expired))
        if self.state is TransactionState.TIME_OUT:
            raise ExpiredTransactionError(f"transaction {self.id} timed out; begin a new transaction")
        if self.state is not TransactionState.OPEN:
            raise InvalidTxnStatusError(f"transaction {self.id} is {self.state.value}; only OPEN transactions accept "
                                        "sends and acks")

    def _tc(self):
        return self._client._coordinators().for_txn(self.id)

    def _register_partitions(self, partitions: set[str]) -> None:
        """ADD_PARTITION before any data reaches the partition, so the TC knows all it must finish.
        Already-registered partitions still cost one check with the TC, so that a transaction fenced
        or timed out elsewhere fails the send with ExpiredTransactionError instead of writing data
        that could never become visible."""
        with self._lock:
            new = partitions - self._partitions
        if new:
            self._call(lambda: self._tc().add_partitions(self.id, new))
            with self._lock:
                self._partitions |= new
        else:
            self._call(lambda: self._tc().check_usable(self.id))

    def _register_subscriptions(self, subs: set[Subscription]) -> list[Future[None]]:
        """ADD_SUBSCRIPTION for those of ``subs`` this transaction has not registered yet, started
        on a helper thread; returns what to wait for (nothing when all are registered). The caller
        writes its pending acks meanwhile (``Consumer._txn_ack`` says why that is safe). Callers
        acking on a subscription whose registration is under way wait for the same one, so they
        all learn the same outcome."""
        with self._lock:
            waiting = {id(f): f for s in subs if (f := self._registering.get(s)) is not None}
            new = subs - self._subscriptions - self._registering.keys()
            if new:
                fut: Future[None] = Future()
                for s in new:
                    self._registering[s] = fut
                waiting[id(fut)] = fut
        if new:
            def register() -> None:
                try:
                    self._call(lambda: self._tc().add_subscriptions(self.id, new))
                    with self._lock:
                        self._subscriptions |= new
                except BaseException as e:
                    fut.set_exception(e)
                else:
                    fut.set_result(None)
                finally:
                    with self._lock:
                        for s in new:
                            self._registering.pop(s, None)

            try:
                helper_pool().submit(register)
            except RuntimeError:  # the interpreter is shutting down: no new threads
                register()
        return list(waiting.values())

    def _call(self, fn):
        try:
            return fn()
        except ExpiredTransactionError as e:
            self._note_expired(e)
            raise

    def _note_expired(self, e: ExpiredTransactionError) -> None:
        self._expired = e
        timed_out = "timed out" in str(e) or "timeout" in str(e)
        self.state = TransactionState.TIME_OUT if timed_out else TransactionState.ABORTED

    def _before_append(self, partition: TopicName, registered: bool = False) -> tuple[int, int]:
        """Called by a producer right before appending a batch of this transaction to ``partition``;
        ``registered`` when the producer already registered it in this flush (one TC call for all)."""
        self._check_usable()
        if not registered:
            self._register_partitions({str(partition)})
        return self.id.as_tuple()

    def _after_append(self, partition: TopicName, result: AppendResult) -> None:
        with self._lock:
            self._entries.setdefault(str(partition), []).extend(result.entries)

    def _attach_producer(self, producer: Any) -> None:
        with self._lock:
            if producer not in self._producers:
                self._producers.append(producer)

    def _mark_conflict(self, exc: BaseException) -> None:
        self._conflict = exc

    # ---- public API -----------------------------------------------------------------------------
    def commit(self) -> None:
        """Flush what this transaction buffered, then commit it everywhere at once."""
        self._check_usable()
        try:
            for p in list(self._producers):
                p.flush_transaction(self)
        except Exception:
            self.state = TransactionState.ERROR
            self.abort()
            raise
        if self._conflict is not None:
            err = self._conflict
            self.abort()
            raise TransactionConflict(f"transaction {self.id} cannot commit: an acknowledgement in it conflicted "
                                      f"({err}); it was aborted") from err
        self._end(TxnAction.COMMIT)

    def abort(self) -> None:
        if self.state is TransactionState.ABORTED:
            return
        for p in list(self._producers):
            p.discard_transaction(self)
        self._end(TxnAction.ABORT)

    def _end(self, action: TxnAction) -> None:
        self.state = TransactionState.COMMITTING if action is TxnAction.COMMIT else TransactionState.ABORTING
        try:
            # "" when the client has no owner: it may then end only owner-less transactions.
            meta = self._tc().end_transaction(self.id, action, owner=self._client.owner or "")
        except ExpiredTransactionError as e:
            self._note_expired(e)
            raise
        except InvalidTxnStatusError:
            self.state = _FROM_STATUS.get(self._tc().get(self.id, refresh=True).status, TransactionState.ERROR)
            raise
        except Exception:
            self.state = TransactionState.ERROR
            raise
        self.state = _FROM_STATUS[meta.status]

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        elif self.state is TransactionState.OPEN:
            try:
                self.abort()
            except Exception as e:  # the original exception matters more
                log.warning("abort of %s after %s failed: %s", self.id, exc_type.__name__, e)
