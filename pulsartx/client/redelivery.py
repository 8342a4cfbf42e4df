"""Redelivery: negative acknowledgements, ``redeliver_unacknowledged_messages`` and the unacked
timeout return held messages to the subscription, counting a redelivery."""
from __future__ import annotations

import logging
import time

from pulsartx.client.consumer_state import CLAIMING, ConsumerCore
from pulsartx.client.message import Message
from pulsartx.exceptions import PulsarException, StorageError
from pulsartx.log.message_id import MessageId
from pulsartx.subscription.ranges import RangeSet
from pulsartx.subscription.resolution import pending_keys
from pulsartx.subscription.store import Claim

log = logging.getLogger("pulsartx.client.consumer")
REDELIVER_ATTEMPTS = 5  # returning an aborted transaction's acks on redelivery, through storage faults


class Redelivery(ConsumerCore):
    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Redeliver this message after ``negative_ack_redelivery_delay_ms`` (to any consumer).

        Only a message this consumer holds (delivered, not acknowledged) is given back, as a Pulsar
        broker redelivers only what its consumer holds: one acknowledged since, in a transaction
        above all, is left alone. Counted, its redelivery count would rise twice when that
        transaction aborts, and the delay would hold it back after the abort returned it."""
        self._check_open()
        until = time.monotonic() + self._nack_delay
        with self._lock:
            for part, offs in self._group(message).items():
                for o in offs:
                    if part.held.pop(o, None) is None:
                        continue
                    part.nacked[o] = until
                    part.redeliver.append(o)
        self._local_change.set()  # a receive() waiting in another thread now has a timer to wait for
        self._release_claims()

    def redeliver_unacknowledged_messages(self) -> None:
        """Everything delivered and not acknowledged becomes deliverable again (PENDING_ACK excluded)."""
        self._check_open()
        with self._lock:
            for part in self._parts:
                offs = list(part.held) + [m._offset for m in part.queue]
                part.redeliver.extend(part.held)
                part.held.clear()
                part.queue.clear()
                part.nacked = {o: t for o, t in part.nacked.items() if o not in offs}
        self._flush_acks()
        self._release_claims()
        # An aborted transaction's acks that are still pending (its pass over the subscription
        # failed) come back now, not when resolution next runs: else later offsets go out first.
        for part in self._parts:
            for attempt in range(REDELIVER_ATTEMPTS):
                try:
                    cursor = part.store.cursor()
                    if cursor is not None and pending_keys(cursor):
                        part.last_resolve = 0.0
                        self._resolve_pending(part, cursor, strict=True)
                        part.cursor = None
                    break
                except PulsarException as e:
                    if attempt == REDELIVER_ATTEMPTS - 1:
                        # Resolution runs again on a later fetch, but those messages would then
                        # come after newer ones: say so rather than reorder silently.
                        raise StorageError(
                            f"redelivery on {part.topic}: the acknowledgements of an aborted transaction could not "
                            f"be returned ({e}); they would come back after newer messages: call "
                            "redeliver_unacknowledged_messages() again") from e
                    log.info("returning aborted pending acks of %s on redelivery failed, retrying: %s", part.topic, e)
                    time.sleep(0.02 * (attempt + 1))

    def _expire_unacked(self) -> None:
        if self._unacked_timeout is None:
            return
        cutoff = time.monotonic() - self._unacked_timeout / 1000.0
        expired = False
        with self._lock:
            for part in self._parts:
                old = [o for o, t in part.held.items() if t <= cutoff]
                for o in old:
                    del part.held[o]
                part.redeliver.extend(old)
                expired = expired or bool(old)
        if expired:
            self._release_claims()

    def _release_claims(self, all_held: bool = False) -> None:
        """Shared, Key_Shared: give up claims on what this consumer no longer holds (or, on close,
        everything but what it acknowledged without the acknowledgement being stored)."""
        if self._type not in CLAIMING:
            return
        now = time.monotonic()
        due: float | None = None
        for part in self._parts:
            with self._lock:
                if all_held:
                    # Close: an acknowledgement whose write failed keeps its claim until the claim
                    # runs out, as an Exclusive lease does, rather than going out again at once
                    # while that write may still land.
                    keep = {*part.acks, *part.inflight}
                else:
                    # An acknowledgement still grouped keeps its claim too: released before the
                    # ack is stored, the message went out again to another consumer.
                    keep = {*part.held, *part.acks, *part.inflight} | {m._offset for m in part.queue}
                    # A message given back stays claimed until its redelivery count is stored and
                    # its negative-ack delay is over: released earlier, another consumer received
                    # it at once, with its old count (a DLQ move one delivery late) and no delay.
                    counting = {*part.redeliver, *part.inflight_redeliver}
                    waiting = {o: t for o, t in part.nacked.items() if t > now}
                    keep |= counting | set(waiting)
                    if counting:
                        due = now
                    if waiting:
                        due = min(due if due is not None else float("inf"), *waiting.values())

            def change(claims: list[Claim], keep=keep) -> tuple[list[Claim], None]:
                out = [c for c in claims if c.consumer != self._id]
                mine = RangeSet.of(keep)
                out += [c.narrowed(a, b) for c in claims if c.consumer == self._id
                        for a, b in mine.ranges() if c.first <= a and b <= c.last]
                return out, None

            try:
                part.store.update_claims(change)
            except PulsarException as e:
                log.debug("releasing claims failed (they expire): %s", e)
        self._release_at = None if all_held else due
