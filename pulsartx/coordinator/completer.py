"""The background completer: a decided transaction's markers, pending-ack commits and final record,
written after the client was answered (Kafka's EndTxn returns once PREPARE_COMMIT is durable and
its marker channel follows; PIP-473 acknowledges at the header compare-and-set).

Nothing here decides anything. The COMMITTING/ABORTING record is the linearization point, and
readers resolve a transaction without a marker through its TC log, so a completion that is late,
repeated or never run changes when the markers appear, not what anyone sees. Until then the
decided transaction still holds compaction and retention at its data, so a completion that fails
is retried for as long as its client lives, as Pulsar's TC retries its markers until they land. If
this process dies (or its client closes) first, whoever opens the TC log finishes them (the
recovery sweep), exactly as after a crash between the decision and the markers; a sweep or a
reader that meets a decided transaction within its recovery grace hands it to its own completer
for when the grace ends (:meth:`Completer.adopt`).

Its threads come from a :class:`~pulsartx.storage.pools.ProcessPool`: a forked child starts its
own (the parent's threads did not survive the fork) and forgets the parent's queue, whose
completions are the parent's to run.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING

from pulsartx import forks
from pulsartx.coordinator import participants
from pulsartx.coordinator.state import TxnMeta, TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import TransactionNotFound
from pulsartx.storage import delta, group_commit
from pulsartx.storage.pools import ProcessPool

if TYPE_CHECKING:
    from pulsartx.coordinator.coordinator import TransactionCoordinator

log = logging.getLogger(__name__)
THREADS = 32  # completions mostly wait on storage: as many as transactions commonly in flight
ATTEMPTS = 4  # tries in the first round; then one try per retry
RETRY_FIRST_S = 1.0  # the first retry's delay after a failed round; doubled at each failure...
RETRY_CAP_S = 30.0  # ...up to this
TICK_S = 0.05  # the retry thread wakes at most this often for what comes due (a flush wakes it at once)
WARN_EVERY_S = 300.0  # a transaction still failing is warned about at its first failed round, then this often
THREAD_PREFIX = "pulsartx-txn-complete"


class _Retry:
    """A decided transaction waiting for its next try here."""

    __slots__ = ("tc", "meta", "due", "failures", "own", "warned_at")

    def __init__(self, tc: TransactionCoordinator, meta: TxnMeta, due: float, own: bool):
        self.tc, self.meta, self.due, self.own = tc, meta, due, own
        self.failures = 0  # rounds of tries that failed (the first round is ATTEMPTS tries)
        self.warned_at: float | None = None


class Completer:
    """One per client (its TCs share it): what :meth:`flush` waits for is that client's work.

    A transaction whose first ATTEMPTS tries fail is not dropped: it waits here, and is tried again
    after a delay that doubles from RETRY_FIRST_S up to RETRY_CAP_S, until it completes or
    :meth:`close`. Without that, a single process with no coordinator service left it decided for
    good after a storage outage of a few seconds: its markers unwritten, compaction and retention
    held at its data, until some other process swept its TC log."""

    def __init__(self, threads: int = THREADS):
        self._pool = ProcessPool(threads, THREAD_PREFIX)
        self._lock = threading.Lock()
        self._tasks_lock = threading.Lock()  # a leaf: its holder calls nothing else
        self._reset()
        forks.reset_in_child(self)

    def _reset(self) -> None:
        self._inflight: dict[TxnID, Future[TxnMeta]] = {}  # this client's completions, until final
        self._decided: dict[TxnID, TxnMeta] = {}  # the decided metadata of each completion in flight
        self._retries: dict[TxnID, _Retry] = {}  # waiting for their next try (own, and adopted)
        self._wake = threading.Condition(self._lock)
        self._retrier: threading.Thread | None = None
        self._waking_at = float("-inf")  # when the waiting retry thread wakes (-inf: it is not waiting)
        self._hurry = 0  # flushes and closes waiting: retries come at once, and soon after a failure
        self._closed = False
        self._tasks: set[Future[None]] = set()  # handed to the pool and not over: close() waits for them

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._tasks_lock = threading.Lock()
        self._reset()

    def _spawn(self, fn: Callable[..., None], *args: object) -> None:
        """Run ``fn`` on the pool, known to :meth:`close` until it is over (RuntimeError: the
        interpreter is exiting, or this completer closed). The lock may be held: the task's own
        bookkeeping takes only the leaf ``_tasks_lock``."""
        with self._tasks_lock:  # close() sees every task the pool accepted
            task = self._pool.get().submit(fn, *args)
            self._tasks.add(task)
        task.add_done_callback(self._task_over)

    def _task_over(self, task: Future[None]) -> None:
        with self._tasks_lock:
            self._tasks.discard(task)

    def decided(self) -> list[TxnMeta]:
        """The transactions whose completion is queued or running here: decided durably, and not
        yet final. Their outcome may be applied by anyone meanwhile (each participant step is
        idempotent), e.g. within the next acknowledgement's write to one of their subscriptions."""
        with self._lock:
            return list(self._decided.values())

    def submit(self, tc: TransactionCoordinator, meta: TxnMeta) -> Future[TxnMeta]:
        """Complete ``meta`` (decided) in the background; a transaction already queued is not queued
        twice. The future is done once the transaction is final, or once this completer closes
        before that (with the decided metadata: the TC's recovery sweep finishes it)."""
        with self._lock:
            fut = self._inflight.get(meta.txn_id)
            if fut is not None:
                return fut
            fut = Future()
            adopted = self._retries.pop(meta.txn_id, None)  # now this client's own
            try:
                self._spawn(self._run, tc, meta, ATTEMPTS, True)
            except RuntimeError:  # the interpreter is exiting, or this completer closed: complete here
                if adopted is not None:
                    self._retries[meta.txn_id] = adopted
            else:
                self._inflight[meta.txn_id] = fut
                self._decided[meta.txn_id] = meta
                return fut
        # Not under the lock: completing may adopt the transaction here (TransactionCoordinator.adopt).
        fut.set_result(self._complete(tc, meta, ATTEMPTS))
        return fut

    def adopt(self, tc: TransactionCoordinator, meta: TxnMeta, not_before_ms: int) -> None:
        """Complete ``meta``, decided by another process (or by this one earlier), once the wall
        clock reaches ``not_before_ms`` (its decision plus the recovery grace, during which its
        decider is normally still writing the markers), unless it is final by then. What a recovery
        sweep or a reader met too early is thus still finished by this process, as long as it
        lives; :meth:`flush` does not wait for it."""
        with self._lock:
            if self._closed or meta.txn_id in self._inflight or meta.txn_id in self._retries:
                return
            delay_s = max(0.0, not_before_ms / 1000 - time.time())
            retry = self._retries[meta.txn_id] = _Retry(tc, meta, time.monotonic() + delay_s, own=False)
            self._start_retrier()
            self._wake_for(retry.due)

    def _run(self, tc: TransactionCoordinator, meta: TxnMeta, attempts: int, loud: bool) -> None:
        """One round of tries (on a pool thread); a transaction still not final waits for the next.
        ``loud``: the round's first try logs its failures as warnings (the others at DEBUG)."""
        try:
            with group_commit.background():  # folded into the next transaction's commits when one comes
                final = self._complete(tc, meta, attempts, loud)
        except Exception as e:  # _complete reports its failures; anything else is one too
            log.warning("completing %s failed: %s", meta.txn_id, e)
            final = meta
        if final.status.is_final:
            self._done(meta.txn_id, final)
        else:
            self._failed(tc, meta)

    def _complete(self, tc: TransactionCoordinator, meta: TxnMeta, attempts: int, loud: bool = True) -> TxnMeta:
        for attempt in range(attempts):
            if attempt:
                delta.backoff(attempt - 1, base=0.05, cap=1.0)
            quiet = attempt > 0 or not loud  # a round's first try warns; the others log at DEBUG
            try:
                with participants.quietly() if quiet else contextlib.nullcontext():
                    final = tc._complete(meta)
            except TransactionNotFound:  # finished and trimmed from the log meanwhile
                return replace(meta, status=_final_of(meta))
            except Exception as e:  # _complete reports, never raises, after a decision; be sure
                log.log(logging.DEBUG if quiet else logging.WARNING, "completing %s failed: %s", meta.txn_id, e)
                final = meta
            if final.status.is_final:
                return final
        return meta

    def _done(self, txn_id: TxnID, final: TxnMeta) -> None:
        with self._lock:
            fut = self._inflight.pop(txn_id, None)
            self._decided.pop(txn_id, None)
            retry = self._retries.pop(txn_id, None)
        if retry is not None and retry.warned_at is not None:
            log.info("%s is %s: completed after %d failed rounds of tries", txn_id, final.status.value, retry.failures)
        if fut is not None and not fut.done():
            fut.set_result(final)

    def _failed(self, tc: TransactionCoordinator, meta: TxnMeta) -> None:
        """Schedule the next try of ``meta``; warn at the first failed round, then every WARN_EVERY_S."""
        with self._lock:
            if self._closed:
                drop = True
            else:
                drop = False
                own = meta.txn_id in self._inflight
                retry = self._retries.get(meta.txn_id)
                if retry is None:
                    retry = self._retries[meta.txn_id] = _Retry(tc, meta, 0.0, own)
                retry.failures += 1
                delay = min(RETRY_CAP_S, RETRY_FIRST_S * 2 ** min(retry.failures - 1, 16))
                retry.due = time.monotonic() + (min(delay, RETRY_FIRST_S) if self._hurry else delay)
                now = time.monotonic()
                warn = retry.warned_at is None or now - retry.warned_at >= WARN_EVERY_S
                if warn:
                    retry.warned_at = now
                self._start_retrier()
                self._wake_for(retry.due)
        if drop:
            self._done(meta.txn_id, meta)
            return
        if warn:
            log.warning("%s is %s but could not be completed yet (%d failed rounds of tries); retried every %.0f s "
                        "at most while this client lives (readers already see its outcome)", meta.txn_id,
                        meta.status.value, retry.failures, RETRY_CAP_S)

    def _start_retrier(self) -> None:
        """Start the thread that hands due retries to the pool (the caller holds the lock)."""
        if self._retrier is None:
            self._retrier = threading.Thread(target=self._retry_loop, name=f"{THREAD_PREFIX}-retry", daemon=True)
            self._retrier.start()

    def _wake_for(self, due: float) -> None:
        """Wake the retry thread if it waits past ``due`` (the caller holds the lock). Not at every
        new retry: a tailing reader adopts transactions one after another, each due a grace later,
        and a wake scans every waiting retry."""
        if due < self._waking_at:
            self._wake.notify_all()

    def _retry_loop(self) -> None:
        with self._lock:
            wake = self._wake
        while True:
            with wake:
                if self._closed or self._wake is not wake:  # closed, or a forked child's copy
                    return
                now = time.monotonic()
                due = [r for r in self._retries.values() if r.due <= now]
                if not due:
                    nxt = min((r.due for r in self._retries.values()), default=now + RETRY_CAP_S)
                    timeout = min(RETRY_CAP_S, max(TICK_S, nxt - now))
                    self._waking_at = now + timeout
                    wake.wait(timeout)
                    self._waking_at = float("-inf")
                    continue
                for r in due:
                    r.due = float("inf")  # running: _failed sets the next due time
            by_tc: dict[int, list[_Retry]] = {}
            for r in due:
                by_tc.setdefault(id(r.tc), []).append(r)
            for group in by_tc.values():
                try:
                    self._spawn(self._retry_group, group)
                except RuntimeError:  # the interpreter is exiting: recovery finishes them
                    return

    def _retry_group(self, group: list[_Retry]) -> None:
        """The due tries of one TC's transactions, sharing one re-read of its log: a reader that
        tails a busy topic adopts every transaction it meets before its markers land, and most of
        them are final by the time they are due."""
        refreshed: list[bool] = [False]
        for r in group:
            if self._closed:  # nothing of a closed client writes any more
                return
            self._retry(r, refreshed)

    def _retry(self, r: _Retry, refreshed: list[bool]) -> None:
        """One try of a waiting transaction, on the log as it is now: another process may have
        finished it meanwhile (then nothing is written again). ``refreshed``: whether the TC's log
        was re-read for this round already."""
        txn_id = r.meta.txn_id
        try:
            meta = r.tc.get(txn_id)  # as last read: most adopted ones were finished by their decider
            if not meta.status.is_final and not refreshed[0]:
                meta = r.tc.get(txn_id, refresh=True)
                refreshed[0] = True
        except TransactionNotFound:  # finished, and trimmed from the log
            self._done(txn_id, replace(r.meta, status=_final_of(r.meta)))
            return
        except Exception as e:  # the log cannot be read now: a failed try
            log.debug("reading %s for its completion failed: %s", txn_id, e)
            meta = None
        if meta is not None and meta.status.is_final:
            self._done(txn_id, meta)
            return
        loud = r.warned_at is None or time.monotonic() - r.warned_at >= WARN_EVERY_S  # as _failed will warn
        self._run(r.tc, r.meta if meta is None else meta, 1, loud)

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
        """Wait for every completion of this client, at most ``timeout_s``; False if some are not
        final yet. Those waiting for a retry are tried at once, and again every RETRY_FIRST_S
        while this waits (storage that keeps failing is not waited on past ``timeout_s``). They
        stay decided, and are retried here, or by the TC's recovery sweep if this process stops first."""
        with group_commit.urgent(), self._hurrying():
            return self._flush(timeout_s, lambda: False, warn=True)

    def close(self, timeout_s: float | None = 30.0) -> None:
        """Wait, at most ``timeout_s``, for every completion of this client to be final or to fail
        once more (each waiting for a retry is tried at once), then stop: a completion still
        failing is left to the recovery sweep of whoever opens its TC next. A close does not wait
        on storage that keeps failing, any more than it did when a completion gave up after its
        first round of tries.

        Nothing of this completer writes once it returns (the client's topics can then be deleted
        and re-created): a try under way, of its own transactions or of ones it adopted, is waited
        for within ``timeout_s``; none starts after."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            rounds = {t: r.failures for t, r in self._retries.items() if r.own}

        def failed_again() -> bool:
            with self._lock:
                return all((r := self._retries.get(t)) is not None and r.failures > rounds.get(t, 0)
                           for t in self._inflight)
        with group_commit.urgent(), self._hurrying():
            self._flush(timeout_s, failed_again, warn=False)
        with self._lock:
            self._closed = True
            left = [r.meta for r in self._retries.values() if r.own]
            left += [m for t, m in self._decided.items() if t not in self._retries]  # a first round still running
            self._retries.clear()
            self._wake.notify_all()
        self._stop(deadline)
        for m in left:
            self._done(m.txn_id, m)
        if left:
            log.warning("%d decided transactions are not completed at close (their markers or acknowledgements "
                        "could not be written yet): whoever next opens their TC finishes them (the recovery sweep), "
                        "and readers see their outcome meanwhile: %s", len(left),
                        ", ".join(str(m.txn_id) for m in left[:10]))

    def _stop(self, deadline: float | None) -> None:
        """Stop the pool (its idle threads end) and wait, until ``deadline``, for the tries under way."""
        pool = self._pool.started()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        with self._tasks_lock:
            running = set(self._tasks)
        if not running:
            return
        _, late = futures.wait(running, None if deadline is None else max(0.0, deadline - time.monotonic()))
        if late:
            log.warning("%d transaction completions were still writing when their client closed (storage is slow); "
                        "they are idempotent, and whoever next opens their TC finishes them if they fail", len(late))

    @contextlib.contextmanager
    def _hurrying(self) -> Iterator[None]:
        with self._lock:
            self._hurry += 1
            now = time.monotonic()
            for r in self._retries.values():
                if r.own and r.due != float("inf"):
                    r.due = min(r.due, now)
            self._wake_for(now)
        try:
            yield
        finally:
            with self._lock:
                self._hurry -= 1

    def _flush(self, timeout_s: float | None, enough: Callable[[], bool], warn: bool) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last_log = time.monotonic()
        while True:
            with self._lock:
                futs = [f for f in self._inflight.values() if not f.done()]
            if not futs:
                return True
            if enough():
                return False
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                if not warn:
                    return False
                log.warning("%d transaction completions are not final after %.0f s; they are decided, and retried "
                            "here while this client lives, or by the TC's recovery sweep if this process stops "
                            "first", len(futs), timeout_s)
                return False
            if time.monotonic() - last_log >= 5:
                log.info("waiting for %d transaction completions (markers, acknowledgements)", len(futs))
                last_log = time.monotonic()
            try:
                futs[0].result(timeout=min(0.1, left) if left is not None else 0.1)
            except Exception:
                time.sleep(0.001)


def _final_of(meta: TxnMeta) -> TxnStatus:
    return TxnStatus.COMMITTED if meta.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED) else TxnStatus.ABORTED
