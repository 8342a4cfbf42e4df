"""Transaction: Pulsar's Java transaction API in Python form (pulsar-client for Python has none).

``with client.new_transaction() as txn:`` commits on success and aborts on an exception.
Messages sent and acks made with ``txn=`` become visible/effective atomically at commit.

A transaction stays with the process that began it: in a forked child its use raises
ForkedProcessError (two processes adding to one transaction would merge their work unseen;
docs/design/clients-across-fork.md).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any

from pulsartx import forks
from pulsartx.coordinator.state import Subscription, TxnAction, TxnMeta, TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import (
    ExpiredTransactionError,
    InvalidTxnStatusError,
    TransactionConflict,
    TransactionHasOperationFailed,
    TransactionNotFound,
)
from pulsartx.naming import TopicName
from pulsartx.storage.pools import ProcessPool

if TYPE_CHECKING:
    from pulsartx.client.client import Client
    from pulsartx.log.partition import AppendResult

log = logging.getLogger(__name__)
# Sized for many transactions in flight: a helper mostly waits on storage, and a transaction waiting
# for a free helper serialises behind others' round trips (threads start only when needed).
_HELPERS = ProcessPool(64, "pulsartx-txn")


def helper_pool() -> ThreadPoolExecutor:
    """The process's threads for protocol steps that run beside the caller's."""
    return _HELPERS.get()


def run_beside(jobs: Sequence[Callable[[], object]]) -> None:
    """Run independent protocol steps side by side, the first on this thread (one helper fewer),
    and return once every one has ended, raising the first error: nothing the caller started is
    still being written when it reports the failure.

    A job no helper has started by the time the caller is free runs on the caller instead. So a
    call nested in a helper's job (a commit flushes its producers beside each other, and each
    producer its queues) never waits on a job queued behind busy helpers: with every helper
    waiting that way, the pool would otherwise deadlock."""
    if len(jobs) <= 1:
        for job in jobs:
            job()
        return
    futures = [(job, helper_pool().submit(job)) for job in jobs[1:]]
    errors: list[BaseException] = []
    try:
        jobs[0]()
    except Exception as e:
        errors.append(e)
    for job, f in futures:
        if f.cancel():  # not started: run here
            try:
                job()
            except Exception as e:
                errors.append(e)
        elif (e := f.exception()) is not None:
            errors.append(e)
    if errors:
        raise errors[0]


class TransactionState(Enum):
    OPEN = "OPEN"
    COMMITTING = "COMMITTING"
    ABORTING = "ABORTING"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"
    ERROR = "ERROR"
    TIME_OUT = "TIME_OUT"


# The client's view: a decided transaction is committed/aborted for it (the rest is the completer's).
_DECIDED = {TxnStatus.OPEN: TransactionState.OPEN, TxnStatus.COMMITTING: TransactionState.COMMITTED,
            TxnStatus.ABORTING: TransactionState.ABORTED, TxnStatus.COMMITTED: TransactionState.COMMITTED,
            TxnStatus.ABORTED: TransactionState.ABORTED}
_ENDS = ProcessPool(8, "pulsartx-txn-end")


def _end_pool() -> ThreadPoolExecutor:
    """Threads for commit_async/abort_async, apart from the helper pool their commit uses."""
    return _ENDS.get()


@dataclass
class _Registration:
    """One ADD_PARTITION call of a transaction: its partitions and its outcome."""

    partitions: set[str]
    done: Future[None]


class Transaction:
    def __init__(self, client: Client, meta: TxnMeta, written: bool = True):
        self._client = client
        self._made = forks.stamp()
        self.id: TxnID = meta.txn_id
        self.timeout_ms = meta.timeout_ms
        self.state = TransactionState.OPEN
        self._partitions: set[str] = set()
        self._subscriptions: set[Subscription] = set()
        self._registering: dict[Subscription, Future[None]] = {}  # ADD_SUBSCRIPTIONs under way
        # Partition registrations (``_register_partitions``): the future of the ADD_PARTITION call
        # that covers each partition under way (queued or in flight); the partitions that wait for
        # the call in flight, to go in the next one together; whether a thread is making those
        # calls; and the helper job submitted to make them, which a waiter runs itself if no helper
        # has started it (``_await_registrations``). The condition is notified when a call ends or
        # a job is submitted.
        self._registering_parts: dict[str, Future[None]] = {}
        self._next_registration: _Registration | None = None
        self._registration_running = False
        self._registration_job: Future[None] | None = None
        # Subscriptions acknowledged on before the TC log held the transaction: registered with
        # its first log write, at the latest its decision (``_defer_subscriptions``).
        self._deferred: set[Subscription] = set()
        self._producers: list[Any] = []
        self._entries: dict[str, list[tuple[int, int]]] = {}
        self._conflict: BaseException | None = None
        self._expired: ExpiredTransactionError | None = None  # fenced or timed out: said again on every use
        self._must_abort: BaseException | None = None  # a flush failed: this transaction may never commit
        # Whether commit() ever reached the TC: until it has, a TC that forgot the transaction can
        # only have seen it aborted (only its owner commits).
        self._commit_tried = False
        # Whether abort was ever asked for: it dropped the queued sends (their senders were told),
        # so a commit() after it, its own outcome unknown (a failed TC write), must never commit.
        self._abort_asked = False
        # Whether the TC log holds the transaction (its NEW goes with the first registration):
        # until then a pending ack must wait for the registration, lest it outlive a crash unowned.
        self._written = written
        # Appends of this transaction's data between their last check (``_before_append``) and
        # their end, and its pending-ack writes (``_before_ack``): the decision waits for them
        # (``_end``), as Pulsar's commit waits for the transaction's sends and acks in flight.
        # Decided first, such an append could land behind the commit marker, a straggler never
        # visible though its send reported success.
        self._appending = 0
        self._lock = threading.Lock()
        self._registrations_changed = threading.Condition(self._lock)
        self._appends_ended = threading.Condition(self._lock)
        self._end_lock = threading.RLock()  # one commit/abort at a time (a retry, commit_async)

    def __repr__(self) -> str:
        return f"Transaction({self.id}, {self.state.value})"

    @property
    def txn_id(self) -> TxnID:
        return self.id

    # ---- used by producers and consumers --------------------------------------------------------
    def _check_process(self) -> None:
        forks.check(self._made, lambda: f"transaction {self.id}")

    def _check_usable(self) -> None:
        if self.state is TransactionState.OPEN and self._expired is None and self._made == forks.generation:
            return  # the common case, first: producers check on every message
        self._check_process()
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
        """ADD_PARTITION before any data reaches the partition, so the TC knows all it must finish;
        returns once every one of ``partitions`` is durably registered (raises if one is not).
        Already-registered partitions still cost one check with the TC, so that a transaction fenced,
        timed out or aborted elsewhere fails the send instead of writing data that could never
        become visible. A registration call this caller waited for (begun beside a filling batch,
        ``_register_early``, or by another append) counts as that check: it ended after this call
        began. One that had already ended does not: the transaction may have been aborted since.

        One ADD_PARTITION call of the transaction is in flight at a time (the TC could not group two
        of them in one commit anyway: a group commit holds one request per transaction). Partitions
        asked for meanwhile, here or beside other batches, wait for it and then go to the TC
        together in the next call: registrations begun close together share one TC commit."""
        waiting, lead = self._queue_registration(partitions)
        if lead:
            self._run_registrations(once=True)
        self._await_registrations(waiting)
        for f in waiting:
            f.result()
        if not waiting:
            self._call(lambda: self._tc().check_usable(self.id))

    def _queue_registration(self, partitions: Iterable[str]) -> tuple[set[Future[None]], bool]:
        """The futures of the registration calls under way (queued or in flight) that cover
        ``partitions``, queueing the unregistered ones for the next ADD_PARTITION call; and whether
        the caller must make that call (no thread is making calls)."""
        with self._lock:
            waiting: set[Future[None]] = set()
            for p in partitions:
                f = self._registering_parts.get(p)
                if f is None:
                    if p in self._partitions:
                        continue
                    if self._next_registration is None:
                        self._next_registration = _Registration(set(), Future())
                    self._next_registration.partitions.add(p)
                    f = self._registering_parts[p] = self._next_registration.done
                waiting.add(f)
            lead = self._next_registration is not None and not self._registration_running
            if lead:
                self._registration_running = True
        return waiting, lead

    def _await_registrations(self, futures: set[Future[None]]) -> None:
        """Wait until ``futures`` (registration calls) have ended. The calls queued for a helper
        that no helper has started yet run on this thread instead, as in ``run_beside``: a waiter
        may hold a producer's flush lock, and the helpers may all be waiting for such locks (a
        commit flushes its producers on them), so a call left for a free helper could wait forever."""
        while True:
            with self._registrations_changed:
                while True:
                    if all(f.done() for f in futures):
                        return
                    job = self._registration_job
                    if job is not None and job.cancel():
                        self._registration_job = None
                        break
                    self._registrations_changed.wait()
            self._run_registrations(once=True)  # the cancelled job's turn (``_registration_running``)

    def _run_registrations(self, once: bool = False) -> None:
        """Make the queued ADD_PARTITION calls one after the other until none is left (the caller
        set ``_registration_running``). ``once``: the caller waits for one call only, so the calls
        queued behind it go on on a helper thread, or on a waiter that finds no helper has begun."""
        with self._lock:
            reg = self._take_registration()
        while reg is not None:
            error: BaseException | None = None
            try:
                self._call(partial(self._add_partitions, reg.partitions))
            except BaseException as e:
                # Not registered, or not known to be: a later append registers again (the TC re-reads
                # its log first when a write's outcome was unknown), and meets the error itself.
                error = e
            inline = False
            with self._lock:
                for p in reg.partitions:
                    if self._registering_parts.get(p) is reg.done:
                        del self._registering_parts[p]
                if error is None:
                    self._partitions |= reg.partitions
                    self._written = True
                if once and self._next_registration is not None:
                    inline = not self._start_registrations()
                    nxt = None
                else:
                    nxt = self._take_registration()
            # The next step is settled before the waiters wake: none of them finds a call queued
            # and nobody to make it.
            if error is None:
                reg.done.set_result(None)
            else:
                reg.done.set_exception(error)
            with self._registrations_changed:
                self._registrations_changed.notify_all()
            if inline:
                self._run_registrations()
            reg = nxt

    def _take_registration(self) -> _Registration | None:
        """The queued call, now this thread's to make; None (and no thread making calls) when none
        is queued. The caller holds ``_lock``."""
        reg, self._next_registration = self._next_registration, None
        if reg is None:
            self._registration_running = False
        return reg

    def _add_partitions(self, partitions: set[str]) -> None:
        self._tc().add_partitions(self.id, partitions)

    def _start_registrations(self) -> bool:
        """Submit ``_run_registrations`` to a helper (the caller set ``_registration_running`` and
        holds ``_lock``), where a waiter that finds it not started takes it over
        (``_await_registrations``). False when the interpreter is shutting down (no new threads):
        the caller makes the calls."""
        try:
            self._registration_job = helper_pool().submit(self._run_registrations)
        except RuntimeError:
            return False
        self._registrations_changed.notify_all()
        return True

    def _register_early(self) -> None:
        """Begin ADD_PARTITION on a helper thread for every partition this transaction has
        messages queued for, once one of its queues is long (``EARLY_REGISTRATION_AT``), as
        Pulsar's producer sends addPartitionToTxn at its first send to a partition: the
        registration is then written while the batches fill instead of after, and each batch's
        append (``_register_partitions``) waits for it (or makes it, when no helper has started it
        yet), so data still never precedes it. All of
        them at once: partitions filling side by side (keyed messages, several producers) share
        one TC commit instead of one each as each queue reaches the threshold. Only partitions
        with queued messages: those are written, or dropped by an abort, so none gets a marker
        for nothing."""
        queued: set[str] = set()
        for producer in list(self._producers):
            queued |= producer.transaction_partitions(self)
        _, lead = self._queue_registration(queued)
        if not lead:
            return  # registered, or queued behind the call in flight
        with self._lock:
            started = self._start_registrations()
        if not started:
            self._run_registrations()
        # Let the helper take the GIL now: a sender looping over send_async would keep it for the
        # interpreter's switch interval (5 ms), longer than the batch takes to fill.
        time.sleep(0)

    def _settle_registrations(self) -> None:
        """Wait for the partition registrations under way: the decision entry must not race its
        own transaction's ADD_PARTITION (their outcome is reported where it is needed: a failed
        one fails the append that waited for it)."""
        with self._lock:
            waiting = set(self._registering_parts.values())
        self._await_registrations(waiting)

    def _defer_subscriptions(self, subs: set[Subscription]) -> int | None:
        """For a transaction the TC log does not hold yet (begun lazily, nothing produced, no key):
        list ``subs`` with its first log write instead of registering them now, and return its
        deadline (start + timeout, ms), which the pending acks then carry so that recovery can
        tell an open transaction from a dead one without the registration. None: register the
        ordinary way. An acknowledgement-only transaction thereby costs two sequential commits
        (its pending acks, then one TC entry with NEW, the subscriptions and the decision)."""
        if self._written:
            return None
        meta = self._call(lambda: self._tc().defer_subscriptions(self.id, subs))
        if meta is None:
            return None
        with self._lock:
            self._deferred |= subs
            self._subscriptions |= subs
        return meta.start_ms + meta.timeout_ms

    def _register_subscriptions(self, subs: set[Subscription]) -> list[Future[None]]:
        """ADD_SUBSCRIPTION for those of ``subs`` this transaction has not registered yet, started
        on a helper thread; returns what to wait for. The caller writes its pending acks meanwhile
        (``Consumer._txn_ack`` says why that is safe). Callers acking on a subscription whose
        registration is under way wait for the same one, so they all learn the same outcome.

        When all are registered, the TC is still asked once, beside the write, whether the
        transaction takes acks (as every append asks it, ``_register_partitions``): one timed
        out, fenced or ended elsewhere then fails the ack, which is taken back, instead of
        reporting success for an ack its commit can never apply."""
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
                        self._written = True
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
        elif not waiting:
            def check() -> None:
                self._call(lambda: self._tc().check_usable(self.id))

            try:
                return [helper_pool().submit(check)]
            except RuntimeError:  # the interpreter is shutting down: no new threads
                check()
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
        if not registered or str(partition) not in self._partitions:
            self._register_partitions({str(partition)})
        with self._lock:
            # Checked again where ``_end`` changes the state: a decision begun since the check
            # above refuses the append, one begun after this waits for it (``_append_ended``).
            self._check_usable()
            self._appending += 1
        return self.id.as_tuple()

    def _before_ack(self) -> None:
        """Called by a consumer before it writes pending acks of this transaction: the decision
        waits for that write (``_end``), as Pulsar's commit waits for the transaction's acks in
        flight. Decided first, the pending acks landed after the TC's pass over the subscription
        and stayed PENDING_ACK for good (or, not yet listed, came back though their acknowledge
        returned and the transaction committed). ``_append_ended`` ends it."""
        with self._lock:
            self._check_usable()
            self._appending += 1

    def _append_ended(self) -> None:
        """An append ``_before_append`` (or an ack ``_before_ack``) let through has ended (landed
        or failed)."""
        with self._lock:
            self._appending -= 1
            if not self._appending:
                self._appends_ended.notify_all()

    def _after_append(self, partition: TopicName, result: AppendResult) -> None:
        with self._lock:
            self._entries.setdefault(str(partition), []).extend(result.entries)

    def _attach_producer(self, producer: Any) -> None:
        with self._lock:
            if producer not in self._producers:
                self._producers.append(producer)

    def _mark_conflict(self, exc: BaseException) -> None:
        self._conflict = exc

    def _operation_failed(self, exc: BaseException) -> None:
        """A send of this transaction failed (its sender was told), or a pending-ack write whose
        outcome is unknown: committing would commit the transaction without it, or with it
        unknown, so commit() aborts instead (Pulsar's TransactionHasOperationFailedException). The
        first failure is the one reported. A send refused because the transaction was already
        being decided is not one of its operations: it never joined it, and its sender was told."""
        with self._lock:
            if isinstance(exc, InvalidTxnStatusError) and self.state is not TransactionState.OPEN:
                return
            if self._must_abort is None:
                self._must_abort = exc

    # ---- public API -----------------------------------------------------------------------------
    def commit(self) -> None:
        """Flush what this transaction buffered, then decide COMMIT. Returns once the decision is
        durable in the TC log: from then on every READ_COMMITTED reader, in any process, sees all of
        it. Markers and acknowledgement commits follow in the background (``Client.flush()``).

        Safe to call again after it raised (PIP-254): it returns if the transaction committed and
        raises naming the real outcome if it aborted; on a committed transaction it returns quietly."""
        self._check_process()
        with self._end_lock:
            if self.state is TransactionState.COMMITTED:
                return
            if self.state in (TransactionState.ABORTED, TransactionState.ABORTING, TransactionState.TIME_OUT):
                if self.state is not TransactionState.ABORTING:
                    # Fenced or timed out as a TC call learnt (a registration beside a filling batch
                    # may be the first to): what is still queued would never be sent. Report it failed
                    # now, not at the producer's next flush.
                    for p in list(self._producers):
                        p.discard_transaction(self)
                raise self._aborted_error()
            if self._must_abort is not None or self._abort_asked:
                self._abort_locked()
                raise self._aborted_error()
            if self.state is TransactionState.OPEN:
                self._check_usable()
                try:
                    self._flush_producers()
                except Exception as e:
                    # Part of the transaction's data may be missing: it must never commit.
                    self._must_abort = e
                    self.state = TransactionState.ERROR
                    try:
                        self._abort_locked()
                    except Exception as abort_error:
                        log.warning("abort of %s after its failed flush failed (retried by abort() or the "
                                    "transaction's timeout): %s", self.id, abort_error)
                    if self._expired is not None:
                        # Timed out or fenced, as the flush learnt: the state says so, as it does
                        # for a transaction with nothing queued (the abort above set ABORTED).
                        self._note_expired(self._expired)
                    raise
                if self._conflict is not None or self._must_abort is not None:
                    # An acknowledgement conflicted, or a send failed while flushing: abort.
                    self._abort_locked()
                    raise self._aborted_error()
            self._end(TxnAction.COMMIT)

    def abort(self) -> None:
        """Decide ABORT; returns once that is durable (nothing of the transaction is then ever
        visible, and its acknowledged messages are redeliverable). Safe to call again; on an
        aborted transaction it returns quietly, on a committed one it raises."""
        self._check_process()
        with self._end_lock:
            self._abort_locked()

    def commit_async(self) -> Future[None]:
        """:meth:`commit` on a helper thread: the future completes at the decision point (Pulsar's
        ``commit()`` returns a CompletableFuture)."""
        self._check_process()
        return _end_pool().submit(self.commit)

    def abort_async(self) -> Future[None]:
        self._check_process()
        return _end_pool().submit(self.abort)

    def _abort_locked(self) -> None:
        if self.state is TransactionState.ABORTED:
            return
        if self.state is TransactionState.COMMITTED:
            raise InvalidTxnStatusError(f"cannot abort transaction {self.id}: it is already COMMITTED")
        self._abort_asked = True
        for p in list(self._producers):
            p.discard_transaction(self)
        self._end(TxnAction.ABORT)

    def _aborted_error(self) -> InvalidTxnStatusError | TransactionConflict:
        """What a commit of an aborted transaction raises, naming why it aborted."""
        if self._conflict is not None:
            err = TransactionConflict(f"transaction {self.id} cannot commit: an acknowledgement in it conflicted "
                                      f"({self._conflict}); it was aborted")
            err.__cause__ = self._conflict
            return err
        if self._expired is not None:
            return ExpiredTransactionError(str(self._expired))
        if self._must_abort is not None:
            err = TransactionHasOperationFailed(f"transaction {self.id} cannot commit: a send or acknowledgement in "
                                                f"it failed ({self._must_abort}); it was aborted, so none of it is "
                                                "visible or applied. Do its work again in a new transaction")
            err.__cause__ = self._must_abort
            return err
        if self.state is TransactionState.TIME_OUT:
            return ExpiredTransactionError(f"transaction {self.id} timed out and was aborted; begin a new transaction")
        return InvalidTxnStatusError(f"cannot commit transaction {self.id}: it was ABORTED")

    def _flush_producers(self) -> None:
        """Every producer's messages of this transaction, durable before the decision: the
        partitions all registered in one TC entry, then appended all in parallel."""
        producers = list(self._producers)
        if not producers:
            return
        parts = set().union(*(p.transaction_partitions(self) for p in producers))
        if parts:
            self._register_partitions(parts)
        run_beside([partial(p.flush_transaction, self, registered=bool(parts)) for p in producers])

    def _end(self, action: TxnAction) -> None:
        with self._lock:
            # No append of this transaction begins from here on, and those under way end before
            # the decision: each either belongs to it or failed, never lands behind its marker.
            self.state = TransactionState.COMMITTING if action is TxnAction.COMMIT else TransactionState.ABORTING
            while self._appending:
                self._appends_ended.wait()
            failed = action is TxnAction.COMMIT and (self._must_abort is not None or self._conflict is not None)
        if failed:
            # An append waited for above failed (its sender was told): committing the rest would
            # commit the transaction without it, which commit() refuses (TransactionHasOperationFailed).
            self._abort_locked()
            raise self._aborted_error()
        self._settle_registrations()
        tried_before = self._commit_tried
        if action is TxnAction.COMMIT:
            self._commit_tried = True
        try:
            # "" when the client has no owner: it may then end only owner-less transactions.
            meta = self._tc().end_transaction(self.id, action, owner=self._client.owner or "", background=True,
                                              subscriptions=self._deferred)
        except TransactionNotFound:
            if action is TxnAction.COMMIT:
                # A definite answer: the TC holds no such transaction, so this attempt committed
                # nothing (an admin abort, or a timeout, ended it and its entry was trimmed).
                self._commit_tried = tried_before
            if action is TxnAction.ABORT and not self._commit_tried:
                # The TC has forgotten it: it ended and its entry was trimmed. Only this client can
                # commit it, and it never asked to, so it ended ABORTED (an admin abort, a timeout).
                log.info("abort of %s: it was already aborted (its TC entry is trimmed)", self.id)
                self.state = TransactionState.ABORTED
                for p in list(self._producers):
                    p.forget_transaction(self)
                return
            self.state = TransactionState.ERROR
            raise
        except ExpiredTransactionError as e:
            self._note_expired(e)
            raise
        except InvalidTxnStatusError:
            try:
                status = self._tc().get(self.id, refresh=True).status
            except Exception:  # the outcome stands in the log; only our view of it is unknown
                status = None
            self.state = _DECIDED.get(status, TransactionState.ERROR)
            raise
        except Exception:
            self.state = TransactionState.ERROR  # outcome unknown: commit()/abort() again asks the TC
            raise
        self.state = _DECIDED[meta.status]
        for p in list(self._producers):
            p.forget_transaction(self)

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
