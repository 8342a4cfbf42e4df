"""Acknowledgement: plain acks are grouped and persisted every ``acknowledgment_group_time_ms``
(Pulsar's ack grouping); transactional acks are durable in the pending-ack store before the call
returns."""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pulsartx.buffer.state import key_txn, txn_key
from pulsartx.client.consumer_state import CLAIMING, ConsumerCore, PartitionState
from pulsartx.client.message import Message
from pulsartx.coordinator.state import Subscription, TxnMeta, TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import InvalidConfiguration, NotAllowedError, PulsarException, TransactionConflict
from pulsartx.log.message_id import MessageId
from pulsartx.naming import names_topic
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.resolution import pending_keys, resolve_pending

log = logging.getLogger("pulsartx.client.consumer")
SETTLE_WAIT_S = 10.0  # for this process's completion of a decided predecessor, before asking its TC


class Acknowledgement(ConsumerCore):
    def acknowledge(self, message: Message | MessageId | Iterable[Message | MessageId], txn: Any = None) -> None:
        """Acknowledge one message (or several). With ``txn`` the acks are PENDING_ACK until the
        transaction ends, durable before this returns, and may raise TransactionConflict."""
        self._check_open()
        by_part = self._group(message)
        if txn is None:
            with self._lock:
                for part, offs in by_part.items():
                    for o in offs:
                        part.held.pop(o, None)
                    part.acks.extend(offs)
            if self._group_s == 0:
                self._flush_acks()
            return
        self._txn_ack(txn, by_part, lambda c, k, part, offs: c.txn_ack(k, offs))

    def acknowledge_cumulative(self, message: Message | MessageId, txn: Any = None) -> None:
        """Acknowledge everything up to and including ``message`` on its partition."""
        self._check_open()
        if isinstance(message, list | tuple | set):
            raise NotAllowedError("acknowledge_cumulative takes one message or MessageId, not several")
        if self._type in CLAIMING:
            raise NotAllowedError(f"cumulative acknowledgement is not allowed on a {self._type.name} subscription "
                                  f"({self._subscription!r}): acknowledge messages individually")
        (part, offs), = self._group(message).items()
        pos = offs[0]
        if txn is None:
            with self._lock:
                for o in [o for o in part.held if o <= pos]:
                    del part.held[o]
                part.cumulative = pos if part.cumulative is None else max(part.cumulative, pos)
            if self._group_s == 0:
                self._flush_acks()
            return
        self._txn_ack(txn, {part: offs}, lambda c, k, part, offs: c.txn_ack_cumulative(k, offs[0]),
                      cumulative={part: pos})

    def _group(self, message: Any) -> dict[PartitionState, list[int]]:
        items = message if isinstance(message, list | tuple | set) else [message]
        out: dict[PartitionState, list[int]] = {}
        for m in items:
            if isinstance(m, Message):  # a received message: a real position, no id object needed
                out.setdefault(self._part_of(m), []).append(m._offset)
                continue
            if not isinstance(m, MessageId) or m.is_earliest or m.is_latest:
                raise InvalidConfiguration(f"cannot acknowledge {m!r}: give a received Message or its MessageId")
            part = self._part(m.partition())
            _check_written(part, m)
            out.setdefault(part, []).append(m.offset())
        return out

    def _part_of(self, m: Message) -> PartitionState:
        """The partition a received message belongs to here: its own topic and partition only. Its
        position names another message in any other partition or topic, which would be
        acknowledged without ever being delivered (a MessageId, which names no topic, keeps
        Pulsar's one-partition fallback in :meth:`_part`)."""
        rows = m._rows
        for p in self._parts:
            if p.index == rows.partition:
                topic = p.message_topic or str(p.topic.base)
                if rows.topic == topic or names_topic(rows.topic, p.topic):
                    return p
                break
        raise InvalidConfiguration(f"cannot acknowledge message {m.message_id()} of {rows.topic} (partition "
                                   f"{rows.partition}) on a consumer of {self._topic}: acknowledge it on the consumer "
                                   "it was received from")

    def _part(self, index: int) -> PartitionState:
        for p in self._parts:
            if p.index == index:
                return p
        if len(self._parts) == 1:
            return self._parts[0]
        raise InvalidConfiguration(f"partition {index} is not part of {self._topic}")

    def _txn_ack(self, txn: Any, by_part: dict[PartitionState, list[int]],
                 apply: Callable[[CursorState, int, PartitionState, list[int]], None],
                 cumulative: Mapping[PartitionState, int] | None = None) -> None:
        """Write ``apply(cursor, txn key, partition, offsets)`` to each partition's subscription
        store; ``cumulative`` holds the partitions acknowledged cumulatively, with their position
        (read once each write is done: a caller may choose while it writes).

        ADD_SUBSCRIPTION (to the TC) and the PENDING_ACK writes (to the subscription's store) are
        appends to different tables, so they run side by side: one append of latency, not two.

        Why that is safe, though the pending ack may land before the TC lists the subscription:
        * the ack returns (or the transaction can commit) only after both landed;
        * a registration that fails (the transaction timed out, was fenced or ended; storage)
          withdraws the pending acks this call wrote, as if never made, and the error is raised;
        * a crash in between leaves pending acks of a transaction the TC does not list for this
          subscription: once the TC has ended it (a timeout aborts it), consumer-side resolution
          returns them (``_resolve_pending``), as the TC's participant call would have.

        A transaction no TC log holds yet (acknowledgements only, so far) registers nothing here:
        its pending acks carry its deadline, and its decision lists the subscriptions."""
        txn._before_ack()
        try:
            self._txn_ack_in_flight(txn, by_part, apply, cumulative)
        finally:
            txn._append_ended()

    def _txn_ack_in_flight(self, txn: Any, by_part: dict[PartitionState, list[int]],
                           apply: Callable[[CursorState, int, PartitionState, list[int]], None],
                           cumulative: Mapping[PartitionState, int] | None) -> None:
        """``_txn_ack``'s work, which the transaction's decision waits for."""
        subs = {Subscription(str(part.topic), self._subscription) for part in by_part}
        # A transaction no TC log holds yet registers these subscriptions with its decision: the
        # pending acks carry its deadline instead, for recovery (docs/semantics.md).
        deadline = txn._defer_subscriptions(subs)
        written = txn._written or deadline is not None
        registering = [] if deadline is not None else txn._register_subscriptions(subs)
        if not written:
            # The transaction's NEW entry goes with this registration: until it lands no TC knows the
            # transaction, and a pending ack written first could be taken for a dead one's.
            for fut in registering:
                fut.result()
            registering = []
        k = txn_key(*txn.id.as_tuple())
        if deadline is not None:
            apply = _noting_deadline(apply, deadline)
        apply = self._owned(apply)
        cumulative = {} if cumulative is None else cumulative
        released: dict[PartitionState, dict[int, float]] = {}  # per partition written: what left `held`
        decided = self._client._coordinators().completer.decided()
        failed = True
        try:
            for part, offs in by_part.items():
                # This process's decided predecessors on this subscription: their outcome goes in
                # the same write, ahead of this ack (a cumulative ack behind a committed one would
                # otherwise wait for the completer's own write); the completer's later step is a no-op.
                sub = Subscription(str(part.topic), self._subscription)
                ahead = [m for m in decided if sub in m.subscriptions and m.txn_id != txn.id]
                write = _after(ahead, apply) if ahead else apply
                try:
                    try:
                        part.store.update(lambda c, part=part, offs=offs, write=write: write(c, k, part, offs))
                    except TransactionConflict:
                        if not self._settle_decided(part, k):
                            raise
                        part.store.update(lambda c, part=part, offs=offs: apply(c, k, part, offs))
                except TransactionConflict as e:
                    txn._mark_conflict(e)
                    raise
                except NotAllowedError:
                    raise  # refused before anything was written (a deleted subscription)
                except PulsarException as e:
                    # Landed or not, unknown: committed, the transaction's output would go with its
                    # input acknowledged or not. It aborts at commit, as after a failed send.
                    txn._operation_failed(e)
                    raise
                with self._lock:
                    pos = cumulative.get(part)
                    gone = [o for o in part.held if o <= pos] if pos is not None else offs
                    held = part.held
                    released[part] = {o: t for o in gone if (t := held.pop(o, None)) is not None}
                    part.cursor = None
            failed = False
        finally:
            for fut in registering:
                self._await_registration(txn, fut, by_part, released, cumulative, raise_error=not failed)

    def _owned(self, apply: Callable[[CursorState, int, PartitionState, list[int]], None]
               ) -> Callable[[CursorState, int, PartitionState, list[int]], None]:
        """``apply``, refused on a subscription this consumer did not open (deleted, maybe re-created)."""
        def run(c: CursorState, k: int, part: PartitionState, offs: list[int]) -> None:
            self._require_own(part, c)
            apply(c, k, part, offs)
        return run

    def _await_registration(self, txn: Any, registering: Any, by_part: dict[PartitionState, list[int]],
                            released: dict[PartitionState, dict[int, float]], cumulative: Mapping[PartitionState, int],
                            raise_error: bool) -> None:
        try:
            registering.result()
        except Exception as e:
            # The TC will not end what this call wrote: take it back (only this call's acks, and as
            # if never made: the messages stay with this consumer, no redelivery is counted).
            k = txn_key(*txn.id.as_tuple())
            for part, held in list(released.items()):
                pos = cumulative.get(part)
                offs = [] if pos is not None else by_part[part]
                try:
                    part.store.update(lambda c, offs=offs, pos=pos: c.withdraw(k, offs, pos))
                except PulsarException as undo:  # resolution returns them once the TC ended the txn
                    log.warning("taking back the pending acks of %s on %s after its failed registration "
                                "failed (they return when the transaction ends): %s", txn.id, part.topic, undo)
                    continue
                del released[part]  # several registrations to wait for: take back once
                with self._lock:  # held again, as before the call
                    for o, t in held.items():
                        part.held.setdefault(o, t)
                    part.cursor = None
            if raise_error:
                raise e from None
            log.debug("registration of %s's subscription also failed: %s", txn.id, e)

    def _settle_decided(self, part: PartitionState, own: int) -> bool:
        """Apply here the outcome of decided transactions whose pending acks are in the way of
        ``own``'s (a commit returns at its decision, and its acknowledgements are committed on the
        subscription just after): this process's completions are waited for, others' decisions read
        from their TCs. True if anything changed, so the acknowledgement is worth trying again."""
        cursor = part.store.cursor()
        keys = pending_keys(cursor, exclude=[own]) if cursor is not None else set()
        if not keys:
            return False
        tcs = self._client._coordinators()
        tcs.completer.wait([TxnID(*key_txn(k)) for k in keys], timeout_s=SETTLE_WAIT_S)
        cursor = part.store.cursor()
        left = pending_keys(cursor, exclude=[own]) if cursor is not None else set()
        if left != keys:
            return True
        return resolve_pending(self._client.root, tcs, str(part.topic), self._subscription, left, roll_forward=True,
                               deadlines=cursor.deadlines if cursor is not None else None) > 0

    def _flush_acks(self) -> None:
        # One flush at a time: the background thread and the caller's (close, seek, redeliver,
        # acknowledgment_group_time_ms=0) would otherwise overwrite each other's in-flight lists.
        with self._flush_lock:
            self._flush_acks_locked()

    def _flush_acks_locked(self) -> None:
        for part in self._parts:
            with self._lock:
                acks, cum, bumps, epoch = part.acks, part.cumulative, part.redeliver, part.reset_epoch
                part.acks, part.cumulative, part.redeliver = [], None, []
                part.inflight, part.inflight_cumulative, part.inflight_redeliver = acks, cum, bumps
            if not acks and cum is None and not bumps:
                continue

            def apply(c: CursorState, acks=acks, cum=cum, bumps=bumps, part=part, epoch=epoch) -> None:
                if not part.owns(c):  # for a deleted subscription: dropped with it
                    return
                if part.reset_since(epoch, c):
                    # Made against the position a reset (admin, another consumer's seek) replaced:
                    # applied now, they would undo it (a cumulative ack moving the cursor back past
                    # the replay, a redelivery count the reset cleared).
                    return
                if bumps:
                    # Not one acknowledged in a transaction meanwhile (after a negative ack): its
                    # abort counts the redelivery, its commit makes it none.
                    c.bump_redelivery([o for o in bumps if not c.is_acked(o) and not c.is_pending(o)])
                if acks:
                    c.ack(acks)
                if cum is not None:
                    c.ack_cumulative(cum)

            try:
                cursor = part.store.update(lambda c, f=apply: (f(c), c)[1])
                part.cursor = cursor
                if part.reset_since(epoch, cursor) and part.owns(cursor):
                    log.info("consumer %s: subscription %r on %s was reset after %d acknowledgements, cumulative "
                             "to %s, and %d redelivery-count rises were grouped: dropped", self._name,
                             self._subscription, part.topic, len(acks), cum, len(bumps))
                    self._see_reset(part, cursor)
                if bumps:  # redelivered messages are deliverable from now: a waiting receive() looks
                    self._local_change.set()
            except PulsarException as e:  # keep them for the next flush: an ack is never dropped
                log.warning("persisting acknowledgements of %s failed%s: %s", self._name,
                            " (the consumer is closing: not retried)" if getattr(self, "_closing", False)
                            else ", will retry", e)
                with self._lock:
                    if part.reset_epoch != epoch:  # a reset seen meanwhile: they were for what it replaced
                        continue
                    part.acks[:0] = acks
                    part.redeliver[:0] = bumps
                    if cum is not None:
                        part.cumulative = cum if part.cumulative is None else max(part.cumulative, cum)
            finally:
                with self._lock:
                    part.inflight, part.inflight_cumulative, part.inflight_redeliver = [], None, []


def _check_written(part: PartitionState, m: MessageId) -> None:
    """Refuse a MessageId past the partition's end: acknowledged, the messages written there later
    would never be delivered (a cumulative ack, every one up to it). A Pulsar broker refuses such
    a position too ("Invalid mark deleted position"). The partition is re-read only for an id past
    the end this process last saw."""
    log_ = part.visible.log
    if m.offset() < log_.end_offset(refresh=False) or m.offset() < log_.end_offset():
        return
    raise InvalidConfiguration(f"cannot acknowledge {m!r}: {part.topic} has no message at offset {m.offset()} yet "
                               f"(it ends before offset {log_.end_offset(refresh=False)}); acknowledging it would "
                               "drop the messages written there later. Acknowledge received messages or their ids")


def _noting_deadline(apply: Callable[[CursorState, int, PartitionState, list[int]], None], deadline: int
                     ) -> Callable[[CursorState, int, PartitionState, list[int]], None]:
    """``apply``, then the transaction's deadline recorded beside its pending acks, in the same write."""
    def run(c: CursorState, k: int, part: PartitionState, offs: list[int]) -> None:
        apply(c, k, part, offs)
        c.note_deadline(k, deadline)
    return run


def _after(decided: list[TxnMeta], apply: Callable[[CursorState, int, PartitionState, list[int]], None]
           ) -> Callable[[CursorState, int, PartitionState, list[int]], None]:
    """``apply`` preceded by the outcomes of ``decided`` transactions (durably decided, completions
    in flight here), as their participant calls would apply them: idempotent, so whichever lands
    first does it."""
    def run(c: CursorState, k: int, part: PartitionState, offs: list[int]) -> None:
        for m in decided:
            key = txn_key(*m.txn_id.as_tuple())
            if m.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
                c.commit(key)
            else:
                c.abort(key)
        apply(c, k, part, offs)
    return run

