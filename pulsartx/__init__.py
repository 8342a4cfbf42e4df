"""pulsartx: Apache Pulsar's transactional messaging (PIP-31) on Delta tables, no broker to run.

The public API is flat and re-exported here; everything below may change freely.
"""
from pathlib import Path as _Path

from pulsartx.client import Client, Message, Producer, Reader, Result
from pulsartx.client.consumer import Consumer, ConsumerType, InitialPosition
from pulsartx.client.dead_letter import ConsumerDeadLetterPolicy
from pulsartx.client.transaction import Transaction, TransactionState
from pulsartx.coordinator.state import TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import (
    InvalidConfiguration,
    NotAllowedError,
    PulsarException,
    Timeout,
    TopicNotFound,
    UnknownOption,
)
from pulsartx.log.compression import CompressionType
from pulsartx.log.message_id import MessageId
from pulsartx.log.schema import MessageType
from pulsartx.maintenance import merging as _merging  # noqa: F401  (writers merge small files: registers itself)
from pulsartx.naming import TopicName
from pulsartx.version import installed_version

__version__ = installed_version()
__all__ = [
    "Client", "CompressionType", "Consumer", "ConsumerDeadLetterPolicy", "ConsumerType", "InitialPosition", "InvalidConfiguration", "Message", "MessageId", "MessageType", "NotAllowedError", "Producer",
    "PulsarException", "Reader", "Result", "Timeout", "TopicName", "TopicNotFound", "Transaction",
    "TransactionState", "TxnID", "TxnStatus", "UnknownOption", "__version__",
]

# Installed, ``pulsartx.datasource`` and ``pulsartx.commit_protocol`` sit inside this package; in a
# checkout they are the top-level folders beside it, so the checkout's root joins this package's path
# (docs/design/installed-namespace.md).
_CHECKOUT = _Path(__file__).resolve().parent.parent
if not _Path(__file__).with_name("datasource").is_dir() and (_CHECKOUT / "datasource" / "__init__.py").is_file() \
        and (_CHECKOUT / "pyproject.toml").is_file():
    __path__.append(str(_CHECKOUT))
