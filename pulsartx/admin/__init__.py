"""Administration: ``client.admin``, mirroring pulsar-admin."""
from __future__ import annotations

from typing import Any

from pulsartx.admin.subscriptions import SubscriptionNotFound, SubscriptionsAdmin
from pulsartx.admin.topics import TopicsAdmin
from pulsartx.admin.transactions import TransactionsAdmin


class Admin(TopicsAdmin, SubscriptionsAdmin):
    """``client.admin``: topic and subscription operations directly, transaction operations under
    ``.transactions``."""

    def __init__(self, client: Any):
        super().__init__(client.root)
        self.client = client
        self.transactions = TransactionsAdmin(client)


__all__ = ["Admin", "SubscriptionNotFound", "SubscriptionsAdmin", "TopicsAdmin", "TransactionsAdmin"]
