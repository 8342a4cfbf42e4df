"""What the admin needs from the client that owns it.

A protocol rather than the ``Client`` class: the client is built on the admin (``client.admin``),
so the admin names only the handful of things it uses, and imports nothing above it.
"""
from __future__ import annotations

from typing import Any, Protocol

from pulsartx.coordinator.registry import Coordinators
from pulsartx.log.message_id import MessageId
from pulsartx.storage.root import StorageRoot


class AdminHost(Protocol):
    root: StorageRoot

    @property
    def admin(self) -> Any: ...

    def _coordinators(self) -> Coordinators: ...

    def create_reader(self, topic: str, start_message_id: MessageId, **kwargs: Any) -> Any: ...
