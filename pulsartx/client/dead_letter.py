"""Dead letters, as pulsar-client's ``ConsumerDeadLetterPolicy``: a message redelivered more than
``max_redeliver_count`` times is moved to the dead-letter topic instead of being delivered again.

The move is one transaction: the copy is produced to the dead-letter topic and the original
acknowledged on the source subscription, then committed. A process that dies anywhere in between
leaves either nothing (its transaction times out and aborts: the copy is never visible, the
original returns to the subscription and is moved again) or both (a decided commit is completed by
whoever finds it), never one without the other.

Redelivery counts are those the cursor keeps (negative acknowledgements, ack timeouts,
``redeliver_unacknowledged_messages``, aborted transactional acks), so they survive restarts:
delivery ``max_redeliver_count + 1`` is the last, as in Pulsar, and the consumer that next finds
the message moves it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pulsartx.client.transaction import Transaction
from pulsartx.exceptions import InvalidConfiguration, PulsarException
from pulsartx.naming import TopicName, check_subscription_name
from pulsartx.subscription.store import shared_store

if TYPE_CHECKING:
    from pulsartx.client.client import Client
    from pulsartx.client.message import Message
    from pulsartx.client.producer import Producer

log = logging.getLogger("pulsartx.client.consumer")
TXN_TIMEOUT_MS = 30_000  # a move whose process died is aborted after this, and the message moved again
REAL_TOPIC = "REAL_TOPIC"  # Pulsar's properties on a dead letter: where it came from
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"


@dataclass(frozen=True)
class ConsumerDeadLetterPolicy:
    """pulsar-client's dead-letter policy, given to ``Client.subscribe(dead_letter_policy=...)``.

    ``dead_letter_topic`` defaults to ``<topic>-<subscription>-DLQ``; ``initial_subscription_name``
    is created on it (at its earliest position) when the consumer first moves a message there, so
    no dead letter goes unseen by that subscription."""

    max_redeliver_count: int
    dead_letter_topic: str | None = None
    initial_subscription_name: str | None = None

    def __post_init__(self) -> None:
        n = self.max_redeliver_count
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidConfiguration(f"max_redeliver_count={n!r}: must be an integer >= 1")
        if self.dead_letter_topic is not None:
            TopicName.parse(self.dead_letter_topic)  # InvalidTopicName names the rule
        if self.initial_subscription_name is not None:
            check_subscription_name(self.initial_subscription_name)


def dead_letter_topic(policy: ConsumerDeadLetterPolicy, topic: str, subscription: str) -> str:
    """Pulsar's default name, on the base topic (one dead-letter topic for all partitions)."""
    if policy.dead_letter_topic is not None:
        return str(TopicName.parse(policy.dead_letter_topic))
    return f"{TopicName.parse(topic).base}-{subscription}-DLQ"


class DeadLetters:
    """A consumer's dead-letter mover: its producer is made on the first move."""

    def __init__(self, client: Client, policy: ConsumerDeadLetterPolicy, topic: str, subscription: str):
        if not isinstance(policy, ConsumerDeadLetterPolicy):
            raise InvalidConfiguration(f"dead_letter_policy={policy!r}: use pulsartx.ConsumerDeadLetterPolicy(...)")
        self.client = client
        self.policy = policy
        self.topic = dead_letter_topic(policy, topic, subscription)
        self._producer: Producer | None = None

    def due(self, message: Message) -> bool:
        return message.redelivery_count() > self.policy.max_redeliver_count

    def divert(self, consumer: Any, messages: list[Message]) -> list[Message]:
        """The messages still to deliver. Those past ``max_redeliver_count`` are moved instead, or,
        when a move fails, left for the next fetch to move: never delivered again."""
        out = []
        for m in messages:
            if self.due(m):
                self.move(consumer, m)
            else:
                out.append(m)
        return out

    def _open(self) -> Producer:
        if self._producer is None:
            self.client.admin.ensure_topic(self.topic, 1)
            if self.policy.initial_subscription_name is not None:
                for p in self.client.admin.partitions_of(self.topic):
                    shared_store(self.client.root, p, self.policy.initial_subscription_name).create(-1)
            self._producer = self.client.create_producer(self.topic)
        return self._producer

    def _new_transaction(self) -> Transaction:
        """A transaction of its own, outside the client's transaction key: one begun under the key
        would fence the application's open transaction (one active transaction per key)."""
        if self.client.transaction_key is None:
            return self.client.new_transaction(timeout_ms=TXN_TIMEOUT_MS)
        tcs = self.client._coordinators()
        meta = tcs.tc(tcs.pick()).new_transaction(TXN_TIMEOUT_MS, owner=self.client.owner, lazy=True)
        return Transaction(self.client, meta, written=False)

    def move(self, consumer: Any, message: Message) -> bool:
        """Produce ``message`` to the dead-letter topic and acknowledge it on ``consumer``'s
        subscription in one transaction. False when that failed: the transaction is aborted (or
        times out) and the message comes back to be moved again."""
        txn = None
        try:
            producer = self._open()
            txn = self._new_transaction()
            props = message.properties()
            props.setdefault(REAL_TOPIC, message.topic_name())
            props.setdefault(ORIGIN_MESSAGE_ID, str(message.message_id()))
            producer.send(message.data(), properties=props, partition_key=message.partition_key(),
                          event_timestamp=message.event_timestamp() or None, txn=txn)
            consumer.acknowledge(message, txn=txn)
            txn.commit()
        except PulsarException as e:
            log.warning("moving %s of %s to dead-letter topic %s failed (it is moved again later): %s",
                        message.message_id(), message.topic_name(), self.topic, e)
            if txn is not None:
                try:
                    txn.abort()
                except PulsarException as again:
                    log.debug("aborting the dead-letter transaction failed (it times out): %s", again)
            return False
        log.info("moved %s of %s to dead-letter topic %s after %d redeliveries", message.message_id(),
                 message.topic_name(), self.topic, message.redelivery_count())
        return True

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
