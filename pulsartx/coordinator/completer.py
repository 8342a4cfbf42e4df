"""The background completer: a decided transaction's markers, pending-ack commits and final record,
written after the client was answered (Kafka's EndTxn returns once PREPARE_COMMIT is durable and
its marker channel follows; PIP-473 acknowledges at the header compare-and-set).

Nothing here decides anything. The COMMITTING/ABORTING record is the linearization point, and
readers resolve a transaction without a marker through its TC log, so a completion that is late,
repeated or never run changes when the markers appear, not what anyone sees. If this process dies
with completions queued, whoever opens the TC log finishes them (the recovery sweep), exactly as
after a crash between the decision and the markers.

Its threads come from a :class:`~pulsartx.storage.pools.ProcessPool`: a forked child starts its
own (the parent's threads did not survive the fork) and forgets the parent's queue, whose
completions are the parent's to run.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from pulsartx import forks
from pulsartx.coordinator.state import TxnMeta
from pulsartx.coordinator.txnid import TxnID
from pulsartx.storage import delta, group_commit
from pulsartx.storage.pools import ProcessPool

if TYPE_CHECKING:
    from pulsartx.coordinator.coordinator import TransactionCoordinator

log = logging.getLogger(__name__)
THREADS = 32  # completions mostly wait on storage: as many as transactions commonly in flight
ATTEMPTS = 4  # then recovery (any process that sweeps the TC log) takes over
THREAD_PREFIX = "pulsartx-txn-complete"


class Completer:
    """One per client (its TCs share it): what :meth:`flush` waits for is that client's work."""

    def __init__(self, threads: int = THREADS):
        self._pool = ProcessPool(threads, THREAD_PREFIX)
        self._inflight: dict[TxnID, Future[TxnMeta]] = {}
        self._decided: dict[TxnID, TxnMeta] = {}  # the decided metadata of each completion in flight
        self._lock = threading.Lock()
        forks.reset_in_child(self)

    def _after_fork(self) -> None:
        self._inflight = {}
        self._decided = {}
        self._lock = threading.Lock()

    def decided(self) -> list[TxnMeta]:
        """The transactions whose completion is queued or running here: decided durably, and not
        yet final. Their outcome may be applied by anyone meanwhile (each participant step is
        idempotent), e.g. within the next acknowledgement's write to one of their subscriptions."""
        with self._lock:
            return list(self._decided.values())

    def submit(self, tc: TransactionCoordinator, meta: TxnMeta) -> Future[TxnMeta]:
        """Complete ``meta`` (decided) in the background; a transaction already queued is not queued twice."""
        with self._lock:
            fut = self._inflight.get(meta.txn_id)
            if fut is not None:
                return fut
            try:
                fut = self._pool.get().submit(self._run, tc, meta)
            except RuntimeError:  # the interpreter is exiting: no new threads; complete here
                fut = Future()
                fut.set_result(self._run(tc, meta, track=False))
                return fut
            self._inflight[meta.txn_id] = fut
            self._decided[meta.txn_id] = meta
            return fut

    def _run(self, tc: TransactionCoordinator, meta: TxnMeta, track: bool = True) -> TxnMeta:
        try:
            with group_commit.background():  # folded into the next transaction's commits when one comes
                return self._complete(tc, meta)
        finally:
            if track:
                with self._lock:
                    self._inflight.pop(meta.txn_id, None)
                    self._decided.pop(meta.txn_id, None)

    def _complete(self, tc: TransactionCoordinator, meta: TxnMeta) -> TxnMeta:
        for attempt in range(ATTEMPTS):
            try:
                final = tc._complete(meta)
            except Exception as e:  # _complete reports, never raises, after a decision; be sure
                log.warning("completing %s failed: %s", meta.txn_id, e)
                final = meta
            if final.status.is_final:
                return final
            delta.backoff(attempt, base=0.05, cap=1.0)
        log.warning("%s is %s but could not be completed here after %d attempts; the TC's recovery sweep "
                    "finishes it (readers already see its outcome)", meta.txn_id, meta.status.value, ATTEMPTS)
        return meta

    def pending(self) -> int:
        with self._lock:
            return len(self._inflight)

    def wait(self, txn_ids, timeout_s: float | None = None) -> None:
        """Wait for the completions of ``txn_ids`` queued in this process (others: nothing to wait for)."""
        with self._lock:
            futs = [f for t in txn_ids if (f := self._inflight.get(t)) is not None]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with group_commit.urgent():
            for f in futs:
                try:
                    f.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
                except Exception:  # a timeout, or a failure _run already logged
                    return

    def flush(self, timeout_s: float | None = 30.0) -> bool:
        """Wait for every queued completion, at most ``timeout_s``; False if some are still running
        (they stay decided, and recovery finishes them if this process stops first)."""
        with group_commit.urgent():
            return self._flush(timeout_s)

    def _flush(self, timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last_log = time.monotonic()
        while True:
            with self._lock:
                futs = list(self._inflight.values())
            if not futs:
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                log.warning("%d transaction completions still running after %.0f s; they are decided, and the TC's "
                            "recovery finishes them if this process stops first", len(futs), timeout_s)
                return False
            if time.monotonic() - last_log >= 5:
                log.info("waiting for %d transaction completions (markers, acknowledgements)", len(futs))
                last_log = time.monotonic()
            try:
                futs[0].result(timeout=min(1.0, left) if left is not None else 1.0)
            except Exception:
                time.sleep(0.001)
