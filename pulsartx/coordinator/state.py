"""The TC's transaction status machine (PIP-31 TxnStatus), pure: no I/O, testable without storage.

As in Kafka's ``TransactionMetadata``: every status names its valid previous statuses, and a change
is *prepared* as a new immutable :class:`TxnMeta` that the log-backed state manager (``tclog``)
writes with a compare-and-set and applies only once it is durable.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import InvalidTxnStatusError


class TxnStatus(StrEnum):
    OPEN = "OPEN"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"

    @property
    def is_final(self) -> bool:
        return self in (TxnStatus.COMMITTED, TxnStatus.ABORTED)

    @property
    def is_decided(self) -> bool:
        """COMMITTING/ABORTING or final: the outcome can no longer change (PIP-31 sync point)."""
        return self is not TxnStatus.OPEN


VALID_PREVIOUS: dict[TxnStatus, frozenset[TxnStatus]] = {
    TxnStatus.OPEN: frozenset(),
    TxnStatus.COMMITTING: frozenset({TxnStatus.OPEN}),
    TxnStatus.COMMITTED: frozenset({TxnStatus.COMMITTING}),
    TxnStatus.ABORTING: frozenset({TxnStatus.OPEN}),
    TxnStatus.ABORTED: frozenset({TxnStatus.ABORTING}),
}


class TxnAction(StrEnum):
    COMMIT = "COMMIT"
    ABORT = "ABORT"

    @property
    def ending_status(self) -> TxnStatus:
        return TxnStatus.COMMITTING if self is TxnAction.COMMIT else TxnStatus.ABORTING

    @property
    def final_status(self) -> TxnStatus:
        return TxnStatus.COMMITTED if self is TxnAction.COMMIT else TxnStatus.ABORTED


class MetadataOp(StrEnum):
    """PIP-31 TransactionMetadataOp."""

    NEW = "NEW"
    ADD_PARTITION = "ADD_PARTITION"
    ADD_SUBSCRIPTION = "ADD_SUBSCRIPTION"
    UPDATE = "UPDATE"


@dataclass(frozen=True)
class Subscription:
    topic: str
    subscription: str

    def __str__(self) -> str:
        return f"{self.topic}:{self.subscription}"


@dataclass(frozen=True)
class TxnMeta:
    """A transaction's full metadata after its latest log entry (``seq`` counts those entries)."""

    txn_id: TxnID
    status: TxnStatus
    timeout_ms: int
    start_ms: int
    last_modified_ms: int
    seq: int = 0
    partitions: frozenset[str] = frozenset()
    subscriptions: frozenset[Subscription] = frozenset()
    owner: str | None = None
    transaction_key: str | None = None
    epoch: int | None = None
    reason: str | None = None
    # Exactly which entries a commit makes visible, per partition: (partition, first, last) offsets.
    # None means "every message of the transaction" (the client path; Spark reports its entries).
    commit_entries: tuple[tuple[str, int, int], ...] | None = None
    properties: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    def expired(self, now_ms: int) -> bool:
        return self.status is TxnStatus.OPEN and now_ms >= self.start_ms + self.timeout_ms

    def _require_open(self, what: str) -> None:
        if self.status is not TxnStatus.OPEN:
            raise InvalidTxnStatusError(
                f"cannot {what} transaction {self.txn_id}: it is {self.status.value}"
                + (f" ({self.reason})" if self.reason else "") + ", and only OPEN transactions accept it")

    def with_partitions(self, partitions: set[str], now_ms: int) -> TxnMeta:
        self._require_open("add partitions to")
        return replace(self, partitions=self.partitions | frozenset(partitions), last_modified_ms=now_ms, seq=self.seq + 1)

    def with_subscriptions(self, subs: set[Subscription], now_ms: int) -> TxnMeta:
        self._require_open("add subscriptions to")
        return replace(self, subscriptions=self.subscriptions | frozenset(subs), last_modified_ms=now_ms, seq=self.seq + 1)

    def transition(self, new: TxnStatus, now_ms: int, reason: str | None = None, **changes) -> TxnMeta:
        if self.status not in VALID_PREVIOUS[new]:
            raise InvalidTxnStatusError(
                f"transaction {self.txn_id} cannot go from {self.status.value} to {new.value}"
                + (f" (it was {self.reason})" if self.reason else ""))
        return replace(self, status=new, last_modified_ms=now_ms, seq=self.seq + 1,
                       reason=reason if reason is not None else self.reason, **changes)


def end_request(meta: TxnMeta, action: TxnAction) -> bool:
    """PIP-31 CommandEndTxn rules. True: log the ending status now. False: already decided the same
    way, so the request succeeds (a client retrying after a lost reply is safe). The opposite
    action on a decided transaction raises InvalidTxnStatusError."""
    if meta.status is TxnStatus.OPEN:
        return True
    if meta.status in (action.ending_status, action.final_status):
        return False
    raise InvalidTxnStatusError(
        f"cannot {action.value.lower()} transaction {meta.txn_id}: it is already {meta.status.value}"
        + (f" ({meta.reason})" if meta.reason else ""))
