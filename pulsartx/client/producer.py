"""Producer, with pulsar-client's names: batching, sync and async sends, idempotent sequence ids
(and ``send_table``, Arrow tables through the same append path: :mod:`~pulsartx.client.table_sending`).

Messages are queued per (partition, transaction) and each queue is appended as one Delta commit
when it holds ``batching_max_messages`` messages, when ``batching_max_publish_delay_ms`` has
passed, or on ``flush()``/``send()``. Sequence ids are assigned at send time, so a retried batch
carries the same ids and the partition's dedup drops what already landed.

A keyed message goes to its key's partition; unkeyed messages go round-robin by batch, as Pulsar's
default router does with batching: all of one batch to one partition, the next batch to the next
(so consecutive ``send()`` calls, each its own batch, rotate message by message).

A producer of a whole topic re-reads its partition count every
``auto_update_partitions_interval_ms`` (default
:data:`~pulsartx.client.partition_updates.PARTITIONS_UPDATE_INTERVAL_S`, 60 s, pulsar-client's)
and, once the topic has grown, routes over every partition: keys then go to ``hash mod`` the new
count (they move, as in Pulsar). ``auto_update_partitions=False`` keeps the partitions it opened with.

A producer stays with the process that made it: in a forked child it raises ForkedProcessError
(its name and sequence ids would name two writers, and Pulsar refuses a second producer of one
name; docs/design/clients-across-fork.md).
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from pulsartx import forks
from pulsartx.client.fields import check_message_fields
from pulsartx.client.partition_updates import (
    PARTITIONS_UPDATE_INTERVAL_S as PARTITIONS_UPDATE_INTERVAL_S,  # re-export
)
from pulsartx.client.partition_updates import PartitionUpdates
from pulsartx.client.result import Result
from pulsartx.client.routing import RoundRobin, partition_for_key
from pulsartx.client.table_sending import TableSending
from pulsartx.client.transaction import TransactionState, run_beside
from pulsartx.exceptions import (
    AlreadyClosed,
    InvalidConfiguration,
    InvalidTxnStatusError,
    ProducerBusy,
    PulsarException,
    causes,
    short_cause,
)
from pulsartx.log.compression import DEFAULT_COMPRESSION, CompressionType
from pulsartx.log.message_id import MessageId
from pulsartx.log.partition import AppendResult, build_records, shared_log
from pulsartx.naming import TopicName
from pulsartx.storage.retry import OutcomeUnknown
from pulsartx.suggest import checked_keywords, keyword_defaults, refuse_unknown

if TYPE_CHECKING:
    from pulsartx.client.client import Client

log = logging.getLogger(__name__)
SendCallback = Callable[[Result, MessageId | None], None]


def _resend_hint(e: BaseException, txn: Any, records: Any) -> str:
    """What an application must know about a plain send whose outcome is unknown (storage could not
    be read back for the whole retry budget): a resend under new sequence ids writes it twice if it
    landed, one under the same ids is dropped by deduplication if it did. (A transaction's send
    needs no hint: the transaction cannot commit, so whatever landed is aborted.)"""
    if txn is not None or records is None or not any(isinstance(c, OutcomeUnknown) for c in causes(e)):
        return ""
    seqs = records.column("sequence_id")
    lo, hi = pc.min(seqs).as_py(), pc.max(seqs).as_py()
    ids = f"sequence id {lo}" if lo == hi else f"sequence ids {lo}..{hi}"
    return (f"; the messages may have been written: to keep them exactly once, resend them with the same "
            f"producer name and {ids} (send(..., sequence_id=...)), which deduplication drops if they landed")


_FLUSHING = threading.local()


def _flushing() -> set[tuple[int, Any]]:
    """The queue keys this thread is appending right now (their flush locks held)."""
    keys = getattr(_FLUSHING, "keys", None)
    if keys is None:
        keys = _FLUSHING.keys = set()
    return keys


class _Pending:
    """One queued message. Slotted and Event-free for async sends: at 1 KiB a message, per-message
    Python overhead is what bounds producer throughput, not storage."""

    __slots__ = ("content", "key", "properties", "event_ms", "sequence_id", "callback", "sync", "partition",
                 "result", "done", "full")

    def __init__(self, content: bytes, key: str | None, properties: dict[str, str] | None, event_ms: int | None,
                 sequence_id: int | None, callback: SendCallback | None, sync: bool, partition: int):
        self.content = content
        self.key = key
        self.properties = properties
        self.event_ms = event_ms
        self.sequence_id = sequence_id
        self.callback = callback
        self.sync = sync
        self.partition = partition
        self.result: MessageId | BaseException | None = None
        self.done = threading.Event() if sync else None
        self.full = False  # set when this message filled its batch: the sender flushes it

    def finish(self, result: MessageId | BaseException) -> None:
        self.result = result
        if self.done is not None:
            self.done.set()


# A transaction's queue for a partition this long starts the registration of every partition the
# transaction has messages queued for, beside the batches still filling
# (``Transaction._register_early``). Not at the first message: a small transaction's partitions are
# registered together in one TC entry at its flush, and registering at the first send would cost a
# TC commit per partition as each got its first message.
EARLY_REGISTRATION_AT = 100


class Producer(TableSending):
    @checked_keywords()
    def __init__(self, client: Client, topic: str, producer_name: str | None = None,
                 batching_max_messages: int = 1000, batching_max_publish_delay_ms: int = 10,
                 initial_sequence_id: int | None = None,
                 compression_type: CompressionType | str = DEFAULT_COMPRESSION,
                 auto_update_partitions: bool = True, auto_update_partitions_interval_ms: int | None = None):
        """Made by :meth:`Client.create_producer`, whose docstring lists the keywords."""
        if batching_max_messages < 1:
            raise InvalidConfiguration(f"batching_max_messages={batching_max_messages}: must be at least 1")
        if batching_max_publish_delay_ms < 0:
            raise InvalidConfiguration(f"batching_max_publish_delay_ms={batching_max_publish_delay_ms}: must be >= 0")
        self._compression = CompressionType.parse(compression_type)
        self._client = client
        self._made = forks.stamp()
        self._updates = PartitionUpdates(client.admin, topic, auto_update_partitions, auto_update_partitions_interval_ms)
        self._partitions: list[TopicName] = self._updates.partitions
        self._topic = str(TopicName.parse(topic))
        self._name = producer_name or f"pulsartx-{uuid.uuid4().hex[:12]}"
        self._live_keys = _claim_name(self, client.root.url)
        try:
            self._open(client, initial_sequence_id, producer_name is not None, batching_max_messages,
                       batching_max_publish_delay_ms)
        except BaseException:
            self._release_name()
            raise

    def _open(self, client: Client, initial_sequence_id: int | None, named: bool, batching_max_messages: int,
              batching_max_publish_delay_ms: int) -> None:
        """The rest of ``__init__``, once the name is this producer's in this process."""
        # One write handle per partition per process, shared with the TC's marker channel: separate
        # handles would each go stale on the other's commits and lose every CAS race once.
        self._logs = {p.partition: shared_log(client.root, p) for p in self._partitions}
        self._max_messages = batching_max_messages
        self._delay = batching_max_publish_delay_ms / 1000.0
        self._router = RoundRobin(len(self._partitions))
        # The queues holding unkeyed messages routed to the router's current partition: when one of
        # them is appended (full, publish delay, flush, a sync send), that batch has ended and the
        # next unkeyed message goes to the next partition (Pulsar's round robin on batch boundaries).
        self._round: set[tuple[int, Any]] = set()
        self._lock = threading.Lock()
        self._queues: dict[tuple[int, Any], list[_Pending]] = {}
        self._flush_locks: dict[tuple[int, Any], threading.Lock] = {}
        # The queue keys of each transaction (None: plain sends), so that a commit looks at its own
        # keys only and an ended transaction's keys can go (they piled up, one per transaction and
        # partition, and each commit scanned them all).
        self._txn_keys: dict[Any, list[tuple[int, Any]]] = {}
        self._append_locks = {p.partition: threading.Lock() for p in self._partitions}
        self._first_enqueued: dict[tuple[int, Any], float] = {}
        # Queues that hold a message with a caller-chosen sequence id (a superset: a key leaves when
        # its queue is taken for an append): see ``_ahead_of``.
        self._explicit: set[tuple[int, Any]] = set()
        self._closed = False
        # Failures of batches sent with send_async, for flush() to raise: (error, transaction). A
        # transaction's go when it is decided or aborted (its commit() reports them itself), and
        # one that failed because it was no longer OPEN is not kept (its sender was told).
        self._errors: list[tuple[BaseException, Any]] = []
        # Per partition, the highest sequence id of this name that may be persisted by this producer
        # or before it was made: its floor. An append that finds a higher one persisted fails with
        # ProducerBusy (another live producer of the name appended), where deduplication would drop
        # its messages as duplicates. None: ``initial_sequence_id`` given, the caller numbers from
        # where it chooses and a persisted id above is its own to deduplicate against (no check).
        self._floors: dict[int, int] | None
        if initial_sequence_id is not None:
            self._last_seq = initial_sequence_id
            self._floors = None
        elif named:
            persisted = {part: lg.last_sequence_id(self._name) for part, lg in self._logs.items()}
            self._last_seq = max((s for s in persisted.values() if s is not None), default=-1)
            self._floors = {part: -1 if s is None else s for part, s in persisted.items()}
        else:  # a generated name is new: nothing of it is persisted
            self._last_seq = -1
            self._floors = dict.fromkeys(self._logs, -1)
        self._timer = threading.Thread(target=self._flush_loop, name=f"pulsartx-producer-{self._name}", daemon=True)
        self._wake = threading.Event()
        self._timer.start()

    # ---- pulsar-client API -------------------------------------------------------------------
    def topic(self) -> str:
        return self._topic

    def producer_name(self) -> str:
        return self._name

    def last_sequence_id(self) -> int:
        return self._last_seq

    def send(self, content: bytes, properties: dict[str, str] | None = None, partition_key: str | None = None,
             sequence_id: int | None = None, event_timestamp: int | None = None, txn: Any = None,
             **unknown: Any) -> MessageId:
        """Send and wait until the message is durable; returns its MessageId.

        Keywords:
            content: the payload, bytes.
            properties=None: string key/value properties.
            partition_key=None: routes the message (same key, same partition) and is its ``__key``.
            sequence_id=None: the id deduplication uses; None: the producer numbers messages itself.
            event_timestamp=None: the event time, epoch milliseconds.
            txn=None: the transaction the message belongs to; None: visible once durable.
        """
        if unknown:  # checked inline, not by a decorator: a send is per message
            refuse_unknown("Producer.send", unknown, _SEND)
        p = self._enqueue(content, None, properties, partition_key, sequence_id, event_timestamp, txn, sync=True)
        self._flush_queue(self._queue_key(p, txn))
        p.done.wait()
        out = p.result
        if isinstance(out, BaseException):
            raise out
        return out

    def send_async(self, content: bytes, callback: SendCallback | None, properties: dict[str, str] | None = None,
                   partition_key: str | None = None, sequence_id: int | None = None,
                   event_timestamp: int | None = None, txn: Any = None, **unknown: Any) -> None:
        """Queue the message; ``callback(result, message_id)`` runs once it is durable (or failed).

        Keywords:
            content: the payload, bytes.
            callback: called with ``(Result, MessageId or None)`` once the message is durable or failed.
            properties=None: string key/value properties.
            partition_key=None: routes the message (same key, same partition) and is its ``__key``.
            sequence_id=None: the id deduplication uses; None: the producer numbers messages itself.
            event_timestamp=None: the event time, epoch milliseconds.
            txn=None: the transaction the message belongs to; None: visible once durable.
        """
        if unknown:
            refuse_unknown("Producer.send_async", unknown, _SEND_ASYNC)
        p = self._enqueue(content, callback, properties, partition_key, sequence_id, event_timestamp, txn)
        if p.full:
            registered = False
            if txn is not None:
                # Register every partition this transaction has messages queued for in one TC write,
                # rather than one write per partition as each batch fills.
                try:
                    txn._register_partitions(self.transaction_partitions(txn))
                    registered = True
                except PulsarException:
                    # Not raised here: the message is queued, and a sender told it failed would send
                    # it again while the queue still holds it. The batch's append registers again,
                    # and a failure then fails the batch through its callbacks.
                    pass
            self._flush_queue(self._queue_key(p, txn), registered=registered)

    def flush(self) -> None:
        """Make every queued message durable; raises the first error a background flush met."""
        forks.check(self._made, self._describe)
        # Iterate over the flush locks, not the queues: a batch the timer thread already popped is
        # no longer queued, and taking its lock is what waits for that append to finish.
        self._flush_keys(list(self._flush_locks))
        if self._errors:
            (err, _), self._errors = self._errors[0], []
            raise err

    def close(self) -> None:
        if self._closed:
            return
        if forks.forked(self._made):  # the parent's copy: its queue is the parent's to flush
            self._closed = True
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._wake.set()
            self._release_name()

    def is_connected(self) -> bool:
        return not self._closed and not forks.forked(self._made)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- internals ------------------------------------------------------------------------------
    def _describe(self) -> str:
        return f"producer {self._name} on {self._topic}"

    def _release_name(self) -> None:
        """Let another producer of this process take the name (``close``, or a failed ``__init__``)."""
        with _LIVE.lock:
            for key in self._live_keys:
                if _LIVE.get(key) is self:
                    del _LIVE[key]

    def _check_open(self) -> None:
        if self._made != forks.generation:
            forks.check(self._made, self._describe)
        if self._closed:
            raise AlreadyClosed(f"producer {self._name} on {self._topic} is closed")

    def _enqueue(self, content, callback, properties, partition_key, sequence_id, event_timestamp, txn,
                 sync: bool = False) -> _Pending:
        self._check_open()
        if not isinstance(content, bytes | bytearray | memoryview):
            raise InvalidConfiguration(f"content must be bytes, got {type(content).__name__}: encode strings first")
        check_message_fields(partition_key, properties)  # before queueing: a bad field must not fail its batch
        if txn is not None:
            txn._check_usable()
            if txn not in self._txn_keys:  # attached already when it has a queue here: a send is per message
                txn._attach_producer(self)
        n = len(self._partitions)
        if n == 1:
            idx = 0
        elif partition_key is not None:
            idx = partition_for_key(partition_key, n)
        else:
            idx = None
        routed = idx
        while True:
            with self._lock:
                idx = self._router.current() if routed is None else routed
                # A producer on one "-partition-i" name routes everything to that partition's index.
                ahead = self._ahead_of(self._partitions[idx].partition, txn, sequence_id)
                if not ahead:
                    p, early = self._put(content, callback, properties, partition_key, sequence_id, event_timestamp,
                                         txn, sync, idx, unkeyed=routed is None)
                    break
            mine = _flushing()  # a send from a callback of that very queue's append holds its flush lock
            try:
                for k in ahead:
                    if k in mine:
                        self._flush_taken(k, False)
                self._flush_keys([k for k in ahead if k not in mine])
            except PulsarException as e:  # that batch's senders are told through its callbacks
                log.info("producer %s: appending an earlier queue before a send failed: %s", self._name, e)
        if early:
            txn._register_early()
        return p

    def _ahead_of(self, part: int, txn: Any, sequence_id: int | None) -> list[tuple[int, Any]]:
        """The other queues of ``part`` to append before a message joins ``txn``'s queue (caller holds
        ``_lock``). Queues of one partition (the plain one, each transaction's) are appended in the
        order they flush, and an id is counted when appended: a caller-chosen id appended after a
        higher one, though sent before it, would be dropped as a duplicate. So while caller-chosen
        ids are queued, a partition's queues are appended in send order: a message with such an id,
        or any message while another queue holds one, first waits for the partition's other queues
        to be appended. Producers that number their messages themselves never pay for this."""
        if sequence_id is None and not self._explicit:
            return []
        others = [k for k, q in self._queues.items() if q and k[0] == part and k[1] is not txn]
        if sequence_id is not None:
            return others
        return [k for k in others if k in self._explicit]

    def _put(self, content, callback, properties, partition_key, sequence_id, event_timestamp, txn, sync: bool,
             idx: int, unkeyed: bool) -> tuple[_Pending, bool]:
        """Queue one message on partition index ``idx`` (caller holds ``_lock``); True: the
        transaction should register its partitions early."""
        part = self._partitions[idx].partition
        p = _Pending(content if type(content) is bytes else bytes(content), partition_key, properties,
                     event_timestamp, sequence_id, callback, sync, part)
        key = (part, txn)
        q = self._queues.get(key)
        if not q:
            if q is None:
                q = self._queues[key] = []
            self._first_enqueued[key] = time.monotonic()
            if key not in self._flush_locks:
                self._flush_locks[key] = threading.Lock()
                self._txn_keys.setdefault(txn, []).append(key)
        q.append(p)
        if sequence_id is not None:
            self._explicit.add(key)
        p.full = len(q) >= self._max_messages
        early = txn is not None and len(q) == EARLY_REGISTRATION_AT and not p.full
        if unkeyed:
            if p.full:  # this batch is complete: the next unkeyed message starts the next one
                self._end_round()
            else:
                self._round.add(key)
        return p, early

    def _end_round(self) -> None:
        """The batch of the router's current partition has ended (caller holds ``_lock``)."""
        self._router.advance()
        self._round.clear()

    @staticmethod
    def _queue_key(p: _Pending, txn: Any) -> tuple[int, Any]:
        return (p.partition, txn)

    def _flush_keys(self, keys: list[tuple[int, Any]], registered: bool = False) -> None:
        """Flush several queues: partitions of each transaction are registered with one TC call,
        then the partitions are appended in parallel (delta-rs releases the GIL while committing)."""
        if not keys:
            return
        for txn in {k[1] for k in keys if k[1] is not None} if not registered else ():
            with self._lock:
                parts = {str(self._logs[k[0]].topic) for k in keys if k[1] is txn and self._queues.get(k)}
            if parts:
                try:
                    txn._register_partitions(parts)
                    registered = True
                except PulsarException as e:
                    with self._lock:
                        batch = [p for k in keys if k[1] is txn for p in self._queues.pop(k, [])]
                    if batch:
                        self._fail(batch, e, txn, report=False)
                    raise
        if len(keys) == 1:
            self._flush_queue(keys[0], registered)
            return
        # Only queues holding messages need a thread: the others are passed through their lock,
        # which waits for an append the flush loop already took. (A pool made per call started a
        # thread per queue, ~0.6 ms each, on every flush and every commit of a transaction whose
        # full batches were already appended.)
        with self._lock:
            busy = [k for k in keys if self._queues.get(k)]
        try:
            run_beside([partial(self._flush_queue, k, registered) for k in busy])
        finally:
            for k in keys:
                if k not in busy:
                    self._flush_queue(k, registered)

    def _flush_queue(self, key: tuple[int, Any], registered: bool = False) -> None:
        lock = self._flush_locks.get(key)
        if lock is None:
            return
        mine = _flushing()
        with lock:
            mine.add(key)
            try:
                self._flush_taken(key, registered)
            finally:
                mine.discard(key)

    def _flush_taken(self, key: tuple[int, Any], registered: bool) -> None:
        """``_flush_queue`` with the queue's flush lock held."""
        with self._lock:
            batch = self._queues.pop(key, [])
            self._first_enqueued.pop(key, None)
            self._explicit.discard(key)
            if batch and key in self._round:
                self._end_round()
        if batch:
            self._append(key, batch, registered)

    def _append(self, key: tuple[int, Any], batch: list[_Pending], registered: bool = False) -> None:
        """Append one queue's batch. Batches of one partition are numbered as they are queued for
        its commit (``_write``): the queues of several transactions (and the plain one) flush
        concurrently, and a batch whose sequence ids were below a batch appended before it would be
        dropped by deduplication as already persisted, a lost message.

        An id the caller chose counts here too, not when it was queued: counted at once, it numbered
        the unnumbered messages queued before it above it, and dropped it as a duplicate of theirs."""
        def number() -> None:
            with self._lock:
                for p in batch:
                    if p.sequence_id is None:
                        self._last_seq += 1
                        p.sequence_id = self._last_seq
                    elif p.sequence_id > self._last_seq:
                        self._last_seq = p.sequence_id

        part, txn = key
        try:
            res = self._write(part, txn, registered, lambda txn_bits: build_records(
                [p.content for p in batch], keys=[p.key for p in batch], properties=[p.properties for p in batch],
                event_times_ms=[p.event_ms for p in batch], producer_name=self._name,
                sequence_ids=[p.sequence_id for p in batch], txn=txn_bits), number)
        except PulsarException as e:
            self._fail(batch, e, txn)
            return
        for p, off in zip(batch, res.offsets, strict=True):
            # A deduplicated message was persisted earlier; Pulsar reports it without a new position.
            mid = MessageId(part, off if off is not None else -1)
            p.finish(mid)
            if p.callback is not None:
                self._run_callback(p.callback, Result.Ok, mid)

    def _write(self, part: int, txn: Any, registered: bool, build: Callable[[tuple[int, int] | None], Any],
               number: Callable[[], None]) -> AppendResult:
        """Append the records ``build(txn_bits)`` makes as one commit: the one append path of
        ``send``, ``send_async`` and ``send_table`` (the transaction's partition registered first,
        deduplicated by this producer's name and sequence ids, its entries recorded for the
        commit marker).

        Under the partition's append lock the batch is numbered (``number``) and queued for the
        partition's group commit, and the commit is waited for outside it: batches queue in
        sequence-id order, and the next batch (another transaction's) joins the next commit, or
        this one, instead of waiting for this one's round trip (pipelining)."""
        plog = self._logs[part]
        records = None
        try:
            txn_bits = None
            if txn is not None:
                txn_bits = txn._before_append(plog.topic, registered)
            try:
                with self._append_locks[part]:
                    number()
                    records = build(txn_bits)
                    floor = None
                    if self._floors is not None:
                        # Taken and raised in submission order: a batch submitted while the one
                        # before it is still being committed counts that one's ids as its own.
                        floor = self._floors[part]
                        high = pc.max(records.column("sequence_id")).as_py()
                        if high is not None and high > floor:
                            self._floors[part] = high
                    request = plog.submit_append(records, producer_name=self._name,
                                                 compression=self._compression, floor=floor)
                res = plog.wait_append(request)
                if txn is not None:
                    txn._after_append(plog.topic, res)
            finally:
                if txn is not None:
                    txn._append_ended()  # the decision may go ahead (``Transaction._end``)
            return res
        except Exception as e:
            # storage errors surface as PulsarException to callers
            hint = _resend_hint(e, txn, records)
            if hint:
                err = OutcomeUnknown(f"send to {plog.topic} failed: {short_cause(e)}{hint}")
            else:
                err = e if isinstance(e, PulsarException) else PulsarException(
                    f"send to {plog.topic} failed: {short_cause(e)}")
            if txn is not None:
                txn._operation_failed(err)  # the rest of the transaction must not commit without it
            if err is e:
                raise
            raise err from e

    def _fail(self, batch: list[_Pending], exc: BaseException, txn: Any = None, report: bool = True) -> None:
        """Fail ``batch``; a batch of ``txn`` also bars the transaction from committing: the rest of
        it would otherwise commit without these messages. ``report`` False: the caller reports
        ``exc`` itself, so ``flush()`` must not raise it again (other batches' errors it keeps)."""
        log.warning("producer %s: batch of %d to %s failed: %s", self._name, len(batch), self._topic, exc)
        if txn is not None:
            txn._operation_failed(exc)
        if report and not all(p.sync for p in batch) and (txn is None or txn.state is TransactionState.OPEN):
            self._errors.append((exc, txn))  # sync senders get it raised directly; flush() reports the rest
        for p in batch:
            p.finish(exc)
            if p.callback is not None:
                self._run_callback(p.callback, Result.of(exc), None)

    @staticmethod
    def _run_callback(cb: SendCallback, res: Result, mid: MessageId | None) -> None:
        try:
            cb(res, mid)
        except Exception:  # a user callback must never break the producer
            log.exception("send_async callback raised")

    def _flush_loop(self) -> None:
        while not self._closed:
            self._wake.wait(max(self._delay, 0.001))
            now = time.monotonic()
            with self._lock:
                due = [k for k, t0 in self._first_enqueued.items() if now - t0 >= self._delay]
            for key in due:
                self._flush_queue(key)
            if self._updates.due(now):
                self._update_partitions()

    def _update_partitions(self) -> None:
        """Take on the partitions a growth of the topic added (pulsar-client's producers do, every
        minute by default). A failed count read is left for the next interval: the partitions known
        stay valid, since a count never falls while the topic lives."""
        have = len(self._partitions)
        added = self._updates.added(have)
        if not added or self._closed:
            return
        n = have + len(added)
        try:
            keys = _claim_name(self, self._client.root.url, added)
        except ProducerBusy as e:
            log.warning("producer %s: %s grew to %d partitions, but this producer keeps its %d: %s",
                        self._name, self._topic, n, have, e)
            return
        self._live_keys = self._live_keys + keys
        if self._closed:  # closed meanwhile: its release may have missed these
            self._release_name()
            return
        # Every table a partition index may reach is in place before the index can be routed to.
        for p in added:
            plog = shared_log(self._client.root, p)
            self._append_locks[p.partition] = threading.Lock()
            if self._floors is not None:
                persisted = plog.last_sequence_id(self._name)
                self._floors[p.partition] = -1 if persisted is None else persisted
            self._logs[p.partition] = plog
        with self._lock:
            self._partitions = self._partitions + added
            self._router = RoundRobin(n, self._router.current())
            self._round.clear()
        log.info("producer %s: %s grew from %d to %d partitions; keys now route over %d", self._name, self._topic,
                 have, n, n)

    def discard_transaction(self, txn: Any) -> None:
        """Drop what is still queued under an aborting transaction: it would never be visible."""
        with self._lock:
            keys = [k for k in self._queues if k[1] is txn]
            dropped = [p for k in keys for p in self._queues.pop(k)]
            for k in keys:
                self._first_enqueued.pop(k, None)
                self._explicit.discard(k)
        if dropped:
            self._fail(dropped, InvalidTxnStatusError(f"transaction {txn.id} was aborted before these messages were sent"),
                       report=False)
        self._drop_errors_of(txn)
        # A batch the flush loop already took is being appended right now: let it finish before the
        # abort is logged (as Pulsar's abort waits for the transaction's in-flight sends), so it
        # neither fails half-way against an ABORTING transaction nor lands after the decision.
        for key in self._keys_of(txn):
            lock = self._flush_locks.get(key)
            if lock is not None:
                with lock:
                    pass

    def transaction_partitions(self, txn: Any) -> set[str]:
        """The partitions that messages queued under ``txn`` go to (to register them all at once)."""
        with self._lock:
            return {str(self._logs[k[0]].topic) for k in self._txn_keys.get(txn, ()) if self._queues.get(k)}

    def flush_transaction(self, txn: Any, registered: bool = False) -> None:
        """Make the messages queued under ``txn`` durable (``txn.commit()`` calls this first);
        ``registered``: the transaction registered their partitions already."""
        self._flush_keys(self._keys_of(txn), registered)

    def _keys_of(self, txn: Any) -> list[tuple[int, Any]]:
        with self._lock:
            return list(self._txn_keys.get(txn, ()))

    def _drop_errors_of(self, txn: Any) -> None:
        with self._lock:
            self._errors = [(e, t) for e, t in self._errors if t is not txn]

    def forget_transaction(self, txn: Any) -> None:
        """``txn`` was decided: drop its queue keys and flush locks (a queue a late send refilled
        stays until it is flushed and refused), and its failures (its commit reported them)."""
        self._drop_errors_of(txn)
        with self._lock:
            left = []
            for k in self._txn_keys.pop(txn, []):
                if self._queues.get(k):
                    left.append(k)
                    continue
                self._flush_locks.pop(k, None)
                self._queues.pop(k, None)
                self._first_enqueued.pop(k, None)
                self._explicit.discard(k)
            if left:
                self._txn_keys[txn] = left


# This process's open producers, by (storage root, partition, name): a second live producer of a
# name is refused when made, as a Pulsar broker refuses it (another process's is refused by its
# appends: ``Producer._write``'s floor). Emptied in a forked child, whose producers are its own.
_LIVE: forks.ProcessCache[tuple[str, str, str], Producer] = forks.ProcessCache()


def _claim_name(producer: Producer, root_url: str,
                partitions: list[TopicName] | None = None) -> list[tuple[str, str, str]]:
    """Take the producer's name on each of its partitions (or ``partitions``) in this process, or
    raise ProducerBusy."""
    keys = [(root_url, str(p), producer._name) for p in (producer._partitions if partitions is None else partitions)]
    with _LIVE.lock:
        for key in keys:
            other = _LIVE.get(key)
            if other is not None and other is not producer:
                where = other._topic if other._topic == producer._topic else \
                    f"{key[1]} (its producer made on {other._topic})"
                raise ProducerBusy(
                    f"a producer named {producer._name!r} is already open on {where} in this process: "
                    "two live producers of one name number from the same sequence "
                    "ids, and deduplication drops one's messages as the other's duplicates. Close the other "
                    "producer first, or give this one another producer_name (or none, for a generated one)")
        for key in keys:
            _LIVE[key] = producer
    return keys


_SEND = frozenset(keyword_defaults(Producer.send))
_SEND_ASYNC = frozenset(keyword_defaults(Producer.send_async))
