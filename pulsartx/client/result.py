"""``Result`` codes passed to ``send_async`` callbacks, as in pulsar-client."""
from __future__ import annotations

from enum import Enum

from pulsartx import exceptions as ex


class Result(Enum):
    """Member names are pulsar-client's; values are pulsartx's own (the first nine predate the
    rest and never change, as callers store and compare them), so compare members, not numbers."""

    Ok = 0
    UnknownError = 1
    Timeout = 5
    TopicNotFound = 15
    ProducerBusy = 19
    AlreadyClosed = 20
    InvalidTxnStatus = 30
    TransactionConflict = 31
    NotAllowed = 32
    InvalidConfiguration = 33
    InvalidTopicName = 34
    ConsumerBusy = 35
    ProducerFenced = 36
    TransactionCoordinatorNotFoundError = 37
    TransactionNotFound = 38
    # pulsar-client's spellings of two members above: aliases, so ported code compares equal.
    InvalidTxnStatusError = 30
    NotAllowedError = 32

    @classmethod
    def of(cls, exc: BaseException | None) -> Result:
        """The code of ``exc``'s nearest class that has one, walking its MRO: a subclass keeps its
        base's code unless it has its own (``TransactionFenced`` is a ``ProducerFenced`` before
        it is an ``ExpiredTransactionError``)."""
        if exc is None:
            return cls.Ok
        for klass in type(exc).__mro__:
            res = _BY_CLASS.get(klass)
            if res is not None:
                return res
        return cls.UnknownError


_BY_CLASS: dict[type, Result] = {
    ex.Timeout: Result.Timeout,
    TimeoutError: Result.Timeout,  # a wait that gave up (futures, sockets) before an exception of ours wrapped it
    ex.TopicNotFound: Result.TopicNotFound,
    ex.ProducerBusy: Result.ProducerBusy,
    ex.AlreadyClosed: Result.AlreadyClosed,
    ex.InvalidTxnStatusError: Result.InvalidTxnStatus,
    ex.TransactionConflict: Result.TransactionConflict,
    ex.NotAllowedError: Result.NotAllowed,
    ex.InvalidConfiguration: Result.InvalidConfiguration,
    ex.InvalidTopicName: Result.InvalidTopicName,
    ex.ConsumerBusy: Result.ConsumerBusy,
    ex.ProducerFenced: Result.ProducerFenced,
    ex.TransactionCoordinatorNotFoundError: Result.TransactionCoordinatorNotFoundError,
    ex.TransactionNotFound: Result.TransactionNotFound,
}
