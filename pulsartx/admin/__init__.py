"""Administration: ``client.admin``, mirroring pulsar-admin."""
from __future__ import annotations

from typing import Any

from pulsartx.admin.host import AdminHost
from pulsartx.admin.subscriptions import SubscriptionNotFound, SubscriptionsAdmin
from pulsartx.admin.topics import TopicsAdmin
from pulsartx.admin.transactions import TransactionsAdmin
from pulsartx.buffer.reads import check_isolation
from pulsartx.exceptions import InvalidConfiguration
from pulsartx.log.message_id import MessageId


class Admin(TopicsAdmin, SubscriptionsAdmin):
    """``client.admin``: topic and subscription operations directly, transaction operations under
    ``.transactions``."""

    def __init__(self, client: AdminHost):
        super().__init__(client.root)
        self.client = client
        self.transactions = TransactionsAdmin(client)

    def peek(self, topic: str, n: int = 10, isolation_level: str = "READ_COMMITTED") -> list[Any]:
        """The first ``n`` messages a reader from the earliest position sees (``Message`` objects),
        READ_COMMITTED by default (pulsar-admin topics peek-messages). No subscription is touched."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise InvalidConfiguration(f"peek on {topic}: n={n!r} must be a non-negative integer")
        level = check_isolation(isolation_level)
        self.get_partitions(topic)
        out: list[Any] = []
        with self.client.create_reader(topic, MessageId.earliest, isolation_level=level) as reader:
            while len(out) < n and reader.has_message_available():
                out.append(reader.read_next())
        return out


__all__ = ["Admin", "AdminHost", "SubscriptionNotFound", "SubscriptionsAdmin", "TopicsAdmin", "TransactionsAdmin"]
