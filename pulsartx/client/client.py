"""Client: the entry point, named after pulsar-client's ``pulsar.Client``.

There is no broker: a Client is a handle on a storage root, and every producer, reader and
transaction it creates works directly against the Delta tables there.
"""
from __future__ import annotations

import logging
from typing import Any

from pulsartx.admin import Admin
from pulsartx.client.producer import Producer
from pulsartx.client.reader import Reader
from pulsartx.exceptions import AlreadyClosed
from pulsartx.log.message_id import MessageId
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)


class Client:
    def __init__(self, service_url: str | None = None, storage_options: dict[str, str] | None = None, **kwargs: Any):
        self.root = StorageRoot.resolve(service_url, storage_options)
        self._closed = False
        self._children: list[Any] = []
        self.admin = Admin(self)
        self._options = kwargs

    def __repr__(self) -> str:
        return f"Client({self.root!r})"

    def _track(self, obj: Any) -> Any:
        if self._closed:
            raise AlreadyClosed("client is closed")
        self._children.append(obj)
        return obj

    def create_producer(self, topic: str, producer_name: str | None = None, batching_max_messages: int = 1000,
                        batching_max_publish_delay_ms: int = 10, **kwargs: Any) -> Producer:
        return self._track(Producer(self, topic, producer_name=producer_name, batching_max_messages=batching_max_messages,
                                    batching_max_publish_delay_ms=batching_max_publish_delay_ms, **kwargs))

    def create_reader(self, topic: str, start_message_id: MessageId, reader_name: str | None = None,
                      start_message_id_inclusive: bool = False, isolation_level: str = "READ_COMMITTED",
                      **kwargs: Any) -> Reader:
        return self._track(Reader(self, topic, start_message_id, reader_name=reader_name,
                                  start_message_id_inclusive=start_message_id_inclusive,
                                  isolation_level=isolation_level, **kwargs))

    def get_topic_partitions(self, topic: str) -> list[str]:
        """pulsar-client's name: the partition topic names of ``topic``."""
        return [str(p) for p in self.admin.partitions_of(topic)]

    def close(self) -> None:
        if self._closed:
            return
        errors = []
        for child in reversed(self._children):
            try:
                child.close()
            except Exception as e:  # close everything, then report
                errors.append(e)
        self._closed = True
        if errors:
            raise errors[0]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
