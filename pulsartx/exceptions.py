"""Exceptions, named as in the pulsar-client Python package so that code written for Pulsar ports over.

Every error message names the offending value or option and says how to fix it.
"""
from __future__ import annotations

import re
from collections.abc import Iterator

# delta-rs appends a native stack trace to its messages when RUST_BACKTRACE is set: dozens of
# "   0: <unknown>" lines that bury the one line saying what is wrong.
_RUST_BACKTRACE = re.compile(r"\n\s*(?:Stack backtrace:\s*)?\n?\s+0: .*", re.DOTALL)


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and everything it was raised from or during, outermost first (cycles cut)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def short_cause(exc: BaseException) -> str:
    """The message of ``exc`` without a native backtrace: what error wrapping should quote."""
    return _RUST_BACKTRACE.sub("", str(exc)).strip()


class PulsarException(Exception):
    """Base of every pulsartx error."""


class Timeout(PulsarException):
    """An operation did not complete within its timeout (``receive``, ``read_next``)."""


class TopicNotFound(PulsarException):
    """The topic (or partition) does not exist under the storage root."""


class TopicAlreadyExists(PulsarException):
    """``create_topic`` was called for a topic that exists."""


class InvalidTopicName(PulsarException, ValueError):
    """A topic name broke one of the naming rules; the message names the rule."""


class InvalidConfiguration(PulsarException, ValueError):
    """A bad option or argument; the message names it and says how to fix it."""


class UnknownOption(InvalidConfiguration, TypeError):
    """An option or keyword argument pulsartx does not know; the message suggests the nearest one.
    Also a TypeError, which Python raises for an unexpected keyword argument, so code that caught
    that still does."""


class NotAllowedError(PulsarException):
    """The operation is not allowed in the current state (e.g. a fenced transaction key)."""


class AlreadyClosed(PulsarException):
    """The producer, reader, consumer or client was already closed."""


class ConsumerBusy(PulsarException):
    """An Exclusive subscription already has a live consumer (pulsar-client's ConsumerBusy)."""


class ProducerBusy(PulsarException):
    """Another live producer has the name (pulsar-client's ProducerBusy): two producers of one name
    number from the same sequence ids, and deduplication would drop one's messages as the other's
    duplicates. Raised when the second is made in the same process, and by an append that finds
    another writer of the name appended since this producer was made (docs/semantics.md)."""


class ProducerFenced(PulsarException):
    """Another producer with the same name won the race for a sequence id."""


class ForkedProcessError(PulsarException):
    """A forked child used what its parent made before the fork (a producer, consumer, reader or
    transaction), or storage after its parent had used deltalake; the message says how to start it."""


class StorageError(PulsarException):
    """The storage root could not be read or written; the message names the table or file."""


class CorruptedLog(StorageError):
    """A Delta log or data file is unreadable; the message names the partition and the file."""


# Transaction errors (coordinator, buffer and subscriptions).
class TransactionCoordinatorNotFoundError(PulsarException):
    """The TC id does not exist under this root."""


class InvalidTxnStatusError(PulsarException):
    """The transaction is not in a status that allows the operation (e.g. send on a committed txn)."""


class TransactionNotFound(PulsarException):
    """No transaction with that TxnID was ever issued by its TC."""


class TransactionConflict(PulsarException):
    """A transactional acknowledgement conflicts with another one (Pulsar's ack conflict rules)."""


class ExpiredTransactionError(InvalidTxnStatusError):
    """The transaction was fenced by a newer epoch of its transaction key, or timed out.

    A subclass of InvalidTxnStatusError: the transaction is no longer OPEN, and code that handles
    the general case keeps working."""


class TransactionHasOperationFailed(InvalidTxnStatusError):
    """An operation of the transaction (a send) failed, so committing it would commit only part of
    it: the transaction was aborted instead, as Pulsar's client fails such a commit with
    TransactionHasOperationFailedException. A subclass of InvalidTxnStatusError, which a commit of
    an aborted transaction raised before."""


class TransactionFenced(ProducerFenced, ExpiredTransactionError):
    """The transaction's transaction key moved to a newer epoch (a newer client or run claimed
    it): the transaction was aborted and may not commit. A ProducerFenced, as Kafka fences an old
    producer epoch; also an ExpiredTransactionError, which fenced transactions raised before."""


__all__ = [name for name, obj in list(globals().items()) if isinstance(obj, type) and issubclass(obj, Exception)]
