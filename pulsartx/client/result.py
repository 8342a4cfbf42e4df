"""``Result`` codes passed to ``send_async`` callbacks, as in pulsar-client."""
from __future__ import annotations

from enum import Enum


class Result(Enum):
    Ok = 0
    UnknownError = 1
    Timeout = 5
    TopicNotFound = 15
    ProducerBusy = 19
    AlreadyClosed = 20
    InvalidTxnStatus = 30
    TransactionConflict = 31
    NotAllowed = 32

    @classmethod
    def of(cls, exc: BaseException | None) -> Result:
        if exc is None:
            return cls.Ok
        name = type(exc).__name__
        for key, res in (("Timeout", cls.Timeout), ("TopicNotFound", cls.TopicNotFound), ("ProducerBusy", cls.ProducerBusy),
                         ("AlreadyClosed", cls.AlreadyClosed), ("InvalidTxnStatus", cls.InvalidTxnStatus),
                         ("TransactionConflict", cls.TransactionConflict), ("NotAllowed", cls.NotAllowed),
                         ("Expired", cls.NotAllowed)):
            if key in name:
                return res
        return cls.UnknownError
