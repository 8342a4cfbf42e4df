"""Client: the entry point, named after pulsar-client's ``pulsar.Client``.

There is no broker: a Client is a handle on a storage root, and every producer, reader and
transaction it creates works directly against the Delta tables there.

Topics are created on first use, as a Pulsar broker does by default (``allowAutoTopicCreation=true``,
non-partitioned): ``create_producer``, ``subscribe`` and ``create_reader`` on a missing topic create
it with ``auto_create_partitions`` partitions (1, the nearest to Pulsar's non-partitioned topic).
As a misspelt name would otherwise create a topic unnoticed, each one created so is logged once, at
INFO, with the way to turn this off: ``Client(..., auto_create_topics=False)`` makes them raise
``TopicNotFound`` instead, as a broker with ``allowAutoTopicCreation=false`` does; topics are then
created with ``client.admin.create_topic`` or ``pulsartx topics create``. A ``-partition-N`` name
is never auto-created.

Every keyword is checked: a misspelt one raises :class:`~pulsartx.exceptions.UnknownOption` (a
``TypeError`` too) naming the nearest valid keyword, instead of being ignored. Each method's
docstring lists its keywords with their defaults (tests/test_client_keywords.py compares the
lists with the signatures).

Across ``os.fork()`` (multiprocessing's default start method on Linux before Python 3.14), a
Client in the child starts over as a fresh one: its TCs, TxnID block, TC lease and background
completions stay with the parent. Its producers, consumers, readers and transactions made before
the fork, and a Client holding a transaction key, stay with the parent too: in the child they
raise :class:`~pulsartx.exceptions.ForkedProcessError`. A child forked after its parent used
storage cannot use deltalake at all, so it too gets ForkedProcessError at its first storage access:
start such children with the ``spawn`` or ``forkserver`` method (docs/design/clients-across-fork.md).
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from pulsartx import forks
from pulsartx.admin import Admin
from pulsartx.admin.topics import MAX_PARTITIONS
from pulsartx.client.consumer import Consumer, ConsumerType, InitialPosition
from pulsartx.client.producer import Producer
from pulsartx.client.reader import Reader
from pulsartx.client.transaction import Transaction
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.coordinator.fencing import fence_all
from pulsartx.coordinator.keys import full_key
from pulsartx.coordinator.registry import Coordinators
from pulsartx.exceptions import (
    AlreadyClosed,
    InvalidConfiguration,
    InvalidTopicName,
    NotAllowedError,
    TopicAlreadyExists,
    TopicNotFound,
)
from pulsartx.log.message_id import MessageId
from pulsartx.maintenance.merging import wait_for_background_writes
from pulsartx.naming import TopicName
from pulsartx.storage.root import StorageRoot
from pulsartx.suggest import checked_keywords

log = logging.getLogger(__name__)


class Client:
    @checked_keywords()
    def __init__(self, service_url: str | None = None, storage_options: dict[str, str] | None = None, *,
                 transaction_key: str | None = None, owner: str | None = None, num_coordinators: int | None = None,
                 coordinator_config: CoordinatorConfig | None = None, auto_create_topics: bool = True,
                 auto_create_partitions: int = 1):
        """A handle on a storage root; nothing is written until first use.

        Keywords:
            service_url=None: the storage root, a local directory or ``s3://bucket/prefix``; None:
                ``$PULSARTX_SERVICE_URL``, else ``./pulsartx-data``.
            storage_options=None: object-store settings (credentials, endpoint, region), as delta-rs takes them.
            transaction_key=None: a key that fences older clients holding it: claiming it aborts their
                open transactions, and they may begin no more.
            owner=None: the transaction key's namespace (keys of different owners never fence each other).
            num_coordinators=None: how many transaction coordinators the root has, fixed at its first use;
                None: the root's count, or 16 for a new root.
            coordinator_config=None: coordinator tuning (timeouts, recovery); None: the defaults.
            auto_create_topics=True: create a missing topic on first use, as a Pulsar broker does.
            auto_create_partitions=1: the partition count of auto-created topics.
        """
        _check_auto_create(auto_create_topics, auto_create_partitions)
        self.auto_create_topics = auto_create_topics
        self.auto_create_partitions = auto_create_partitions
        self.root = StorageRoot.resolve(service_url, storage_options)
        self._closed = False
        self._children: list[Any] = []
        self.owner = owner
        self.transaction_key = transaction_key
        self.epoch: int | None = None
        self._num_coordinators = num_coordinators
        self._coordinator_config = coordinator_config
        self._tcs: Coordinators | None = None
        self._tcs_lock = threading.Lock()
        self.admin = Admin(self)
        self._made = forks.stamp()
        if transaction_key is not None:
            full_key(owner, transaction_key)  # validate before touching storage
            self._claim_transaction_key()
        forks.reset_in_child(self)

    def _after_fork(self) -> None:
        """In a forked child: start over as a fresh Client. The TCs (TxnID block, lease, queued
        completions) and everything made so far are the parent's; the child builds its own on first
        use. A transaction key stays the parent's (:meth:`new_transaction` refuses it here)."""
        self._tcs = None
        self._tcs_lock = threading.Lock()
        self._children = []

    def _coordinators(self) -> Coordinators:
        """The client's one set of TCs: a transaction begun lazily lives in its TC object until it
        registers something, so threads must never each build their own set."""
        if self._tcs is None:
            with self._tcs_lock:
                if self._tcs is None:
                    self._tcs = Coordinators(self.root, self._num_coordinators, self._coordinator_config)
        return self._tcs

    def _key_tc(self) -> int:
        return self._coordinators().pick(full_key(self.owner, self.transaction_key))

    def _claim_transaction_key(self) -> None:
        """The proposal's "connection": bump the key's epoch and abort the previous epoch's txns."""
        tc_id = self._key_tc()
        keys = self._coordinators().keys(tc_id)
        self.epoch, stale = keys.claim(self.owner, self.transaction_key)
        fence_all(self._coordinators(), stale, f"fenced by epoch {self.epoch} of transaction key {self.transaction_key!r}")
        keys.forget(self.owner, self.transaction_key, self.epoch, stale)
        log.info("claimed transaction key %r (owner %r) at epoch %d", self.transaction_key, self.owner, self.epoch)

    @checked_keywords()
    def new_transaction(self, timeout_ms: int = 60000, properties: dict[str, str] | None = None) -> Transaction:
        """Begin a transaction on a TC: by hash of the transaction key, else the TC this process leases
        (docs/design/tc-leases.md; round-robin only with leases off).

        Keywords:
            timeout_ms=60000: abort the transaction if it is still open this many milliseconds after it began.
            properties=None: string properties recorded with the transaction.
        """
        if self._closed:
            raise AlreadyClosed("client is closed")
        if self.transaction_key is not None:  # a key has one holder: the process that claimed it
            forks.check(self._made, lambda: f"the Client holding transaction key {self.transaction_key!r} "
                                            f"(owner {self.owner!r}, epoch {self.epoch})")
        if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
            raise InvalidConfiguration(f"timeout_ms={timeout_ms!r}: must be a positive number of milliseconds")
        tcs = self._coordinators()
        if self.transaction_key is None:
            meta = tcs.tc(tcs.pick()).new_transaction(timeout_ms, owner=self.owner, properties=properties, lazy=True)
            return Transaction(self, meta, written=False)
        tc_id = self._key_tc()
        keys = tcs.keys(tc_id)
        current = keys.current_epoch(self.owner, self.transaction_key)
        if current != self.epoch:
            raise NotAllowedError(
                f"transaction key {self.transaction_key!r} (owner {self.owner!r}) is at epoch {current}, this client "
                f"holds epoch {self.epoch}: a newer client claimed the key, so this one may not begin transactions")
        meta = tcs.tc(tc_id).new_transaction(timeout_ms, owner=self.owner, transaction_key=self.transaction_key,
                                             epoch=self.epoch, properties=properties)
        try:
            earlier = keys.attach(self.owner, self.transaction_key, self.epoch, meta.txn_id)
        except NotAllowedError:
            fence_all(tcs, [meta.txn_id], f"fenced: transaction key {self.transaction_key!r} moved to a newer epoch")
            raise
        # One active transaction per key: an earlier one still open is superseded.
        fence_all(tcs, earlier, f"fenced: superseded by {meta.txn_id} of the same transaction key")
        return Transaction(self, meta)

    def __repr__(self) -> str:
        return f"Client({self.root!r})"

    def _track(self, obj: Any) -> Any:
        if self._closed:
            raise AlreadyClosed("client is closed")
        self._children.append(obj)
        return obj

    def _auto_create(self, topic: str) -> None:
        """Pulsar's allowAutoTopicCreation: a missing topic is created on first use (see the module
        docstring). Racing creators agree: the first one's partition count wins."""
        if not self.auto_create_topics or self._closed or TopicName.parse(topic).partition is not None:
            return
        with contextlib.suppress(TopicNotFound):
            self.admin.get_partitions(topic)
            return
        try:
            t = self.admin._create_topic(topic, self.auto_create_partitions)
        except TopicAlreadyExists:
            return  # a racing creator made it first: its partition count stands, and it is not ours to log
        log.info("auto-created topic %s with %d partition(s) on first use; Client(..., auto_create_topics=False) "
                 "turns auto-creation off", t, self.auto_create_partitions)

    @checked_keywords(Producer.__init__)
    def create_producer(self, topic: str, producer_name: str | None = None, batching_max_messages: int = 1000,
                        batching_max_publish_delay_ms: int = 10, **kwargs: Any) -> Producer:
        """A producer on ``topic`` (created first if missing and auto-creation is on).

        Keywords:
            topic: the topic, as ``name``, ``tenant/ns/name`` or ``persistent://tenant/ns/name``.
            producer_name=None: names the producer's sequence ids, so a restarted producer of that name
                resumes after its last persisted id; None: a generated name. One live producer per
                name: a second one raises ProducerBusy (docs/semantics.md, Producers).
            batching_max_messages=1000: a partition's queued messages are appended as one commit when
                this many are queued...
            batching_max_publish_delay_ms=10: ...or when the oldest has waited this long.
            initial_sequence_id=None: the sequence id to count from; None: the last persisted one of
                ``producer_name``, else -1.
            compression_type=CompressionType.NONE: the parquet codec of the payload column.
            auto_update_partitions=True: a producer of a whole topic takes on the partitions a growth
                adds (``update_partitioned_topic``) within ``auto_update_partitions_interval_ms``;
                False: it keeps the partitions it was made with.
            auto_update_partitions_interval_ms=None: how often the partition count is read again
                (one small read and one listing); None: every 60 s, pulsar-client's default.
        """
        self._auto_create(topic)
        return self._track(Producer(self, topic, producer_name=producer_name, batching_max_messages=batching_max_messages,
                                    batching_max_publish_delay_ms=batching_max_publish_delay_ms, **kwargs))

    @checked_keywords(Reader.__init__)
    def create_reader(self, topic: str, start_message_id: MessageId, reader_name: str | None = None,
                      start_message_id_inclusive: bool = False, isolation_level: str = "READ_COMMITTED",
                      idle_poll_max_interval_ms: int | None = None, **kwargs: Any) -> Reader:
        """A reader of ``topic`` from ``start_message_id``, with no subscription.

        Keywords:
            topic: the topic, as ``name``, ``tenant/ns/name`` or ``persistent://tenant/ns/name``.
            start_message_id: ``MessageId.earliest``, ``MessageId.latest`` or a message's id (on a
                topic of several partitions, earliest or latest only: an id places a message in its
                own partition; ``seek`` to it repositions that partition only).
            reader_name=None: a name for the reader.
            start_message_id_inclusive=False: also return the message at ``start_message_id``; with
                ``MessageId.latest``, start at each partition's last visible message (Pulsar's way to
                read a topic's last message).
            isolation_level='READ_COMMITTED': or ``READ_UNCOMMITTED`` to see open and aborted messages too.
            idle_poll_max_interval_ms=None: no broker pushes messages here, so while ``read_next()`` waits,
                the next commit of each partition is checked (one stat locally, one HEAD on S3),
                first 1 ms after finding nothing, then at intervals doubling up to this many
                milliseconds (1 to 10000): it bounds how late a new message is noticed. None: 10 on
                a local disk, 100 on an object store. Raise it to spend less while idle.
            auto_update_partitions=True: a reader of a whole topic takes on the partitions a growth
                adds (``update_partitioned_topic``) within ``auto_update_partitions_interval_ms``
                and reads each from its first message; False: it keeps the partitions it was made
                with.
            auto_update_partitions_interval_ms=None: how often the partition count is read again
                (one small read and one listing); None: every 60 s, pulsar-client's default.
        """
        self._auto_create(topic)
        return self._track(Reader(self, topic, start_message_id, reader_name=reader_name,
                                  start_message_id_inclusive=start_message_id_inclusive,
                                  isolation_level=isolation_level, idle_poll_max_interval_ms=idle_poll_max_interval_ms,
                                  **kwargs))

    @checked_keywords(Consumer.__init__)
    def subscribe(self, topic: str, subscription_name: str, consumer_type: ConsumerType = ConsumerType.Exclusive,
                  initial_position: InitialPosition = InitialPosition.Latest, isolation_level: str = "READ_COMMITTED",
                  receiver_queue_size: int = 1000, unacked_messages_timeout_ms: int | None = None,
                  negative_ack_redelivery_delay_ms: int = 60000,
                  idle_poll_max_interval_ms: int | None = None, **kwargs: Any) -> Consumer:
        """A consumer on a durable subscription (created at ``initial_position`` if new).

        Keywords:
            topic: the topic, as ``name``, ``tenant/ns/name`` or ``persistent://tenant/ns/name``.
            subscription_name: the durable subscription.
            consumer_type=ConsumerType.Exclusive: or ``Failover``, ``Shared`` or ``KeyShared``.
            initial_position=InitialPosition.Latest: where a new subscription starts (or ``Earliest``).
            isolation_level='READ_COMMITTED': or ``READ_UNCOMMITTED`` to see open and aborted messages too.
            receiver_queue_size=1000: how many messages are fetched ahead of ``receive()``.
            unacked_messages_timeout_ms=None: redeliver a message not acknowledged within this many
                milliseconds; None: never.
            negative_ack_redelivery_delay_ms=60000: how long a negatively acknowledged message waits
                before redelivery.
            consumer_name=None: a name for the consumer; None: a generated one.
            lease_ms=10000: how long the consumer's Exclusive/Failover lease or Shared membership lasts
                without renewal (the background thread renews it).
            acknowledgment_group_time_ms=100: acknowledgements made within this window are written together.
            idle_poll_max_interval_ms=None: no broker pushes messages here, so while ``receive()`` waits,
                the next commit of each partition is checked (one stat locally, one HEAD on S3),
                first 1 ms after finding nothing, then at intervals doubling up to this many
                milliseconds (1 to 10000): it bounds how late a new message is noticed. None: 10 on
                a local disk, 100 on an object store. Raise it to spend less while idle.
            dead_letter_policy=None: a ``pulsartx.ConsumerDeadLetterPolicy``: a message redelivered
                more than its ``max_redeliver_count`` times is moved to its dead-letter topic
                (default ``<topic>-<subscription>-DLQ``) and acknowledged here, in one
                transaction; None: redeliver without limit.
            auto_update_partitions=True: a consumer of a whole topic subscribes to the partitions a
                growth adds (``update_partitioned_topic``) within
                ``auto_update_partitions_interval_ms``, as pulsar-client's consumers do; on a new
                partition the subscription starts at its first message whatever
                ``initial_position`` says, so nothing sent to it is missed. False: it keeps the
                partitions it subscribed to.
            auto_update_partitions_interval_ms=None: how often the partition count is read again
                (one small read and one listing); None: every 60 s, pulsar-client's default.
        """
        if not isinstance(topic, str):
            # pulsar-client also takes a list of topics or a compiled pattern here; say which is missing.
            raise InvalidTopicName(f"subscribe(topic={topic!r}): give one topic name as a string; a consumer "
                                   "on a list of topics or a topic pattern is not supported (subscribe to each "
                                   "topic, or to a partitioned topic)")
        self._auto_create(topic)
        return self._track(Consumer(self, topic, subscription_name, consumer_type=consumer_type,
                                    initial_position=initial_position, isolation_level=isolation_level,
                                    receiver_queue_size=receiver_queue_size,
                                    unacked_messages_timeout_ms=unacked_messages_timeout_ms,
                                    negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
                                    idle_poll_max_interval_ms=idle_poll_max_interval_ms, **kwargs))

    def get_topic_partitions(self, topic: str) -> list[str]:
        """pulsar-client's name: the partition topic names of ``topic``."""
        return [str(p) for p in self.admin.partitions_of(topic)]

    def flush(self, timeout_s: float | None = 30.0) -> bool:
        """Wait, at most ``timeout_s``, for the background completion of this client's ended
        transactions (their markers, acknowledgement commits and final TC entries). Their outcomes
        are already visible to everyone; this makes them applied too. One that is failing (storage
        errors) is tried at once and then every second while this waits. False if some are not
        complete: the client keeps retrying them while it lives."""
        return self._tcs is None or self._tcs.completer.flush(timeout_s)

    def close(self) -> None:
        """Close this client's producers and consumers, then wait for its transactions' background
        completions, 30 s at most, and for its process's queued merges and checkpoints. A completion
        that is failing gets one last try, not a wait on storage that keeps failing: it stays decided
        (readers see its outcome) and whoever next opens its TC finishes it."""
        if self._closed:
            return
        errors = []
        for child in reversed(self._children):
            try:
                child.close()
            except Exception as e:  # close everything, then report
                errors.append(e)
        if self._tcs is not None:
            # Completions under way are waited for (30 s at most), and each that is failing is
            # tried once more; one still failing is left to the recovery sweep of its TC's next
            # opener rather than waited on (Completer.close).
            self._tcs.completer.close()
        # The small-file merges and checkpoints its writers scheduled run on process-wide threads:
        # once close() returns nothing of this client writes any more, so its topics can be
        # deleted and re-created safely. Other clients' queued work is waited for too; each is short.
        wait_for_background_writes()
        if self._tcs is not None:
            self._tcs.release()
        self._closed = True
        if errors:
            raise errors[0]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _check_auto_create(auto_create_topics: Any, auto_create_partitions: Any) -> None:
    if not isinstance(auto_create_topics, bool):
        raise InvalidConfiguration(f"auto_create_topics={auto_create_topics!r}: must be True or False")
    if not isinstance(auto_create_partitions, int) or isinstance(auto_create_partitions, bool) \
            or not 1 <= auto_create_partitions <= MAX_PARTITIONS:
        raise InvalidConfiguration(f"auto_create_partitions={auto_create_partitions!r}: must be an integer "
                                   f"from 1 to {MAX_PARTITIONS} (the partition count of auto-created topics)")
