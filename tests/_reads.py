"""Reading what a topic shows, for assertions (tests/ is on sys.path)."""
from __future__ import annotations

from typing import Any


def committed_values(client: Any, topic: str, timeout_millis: int = 3000) -> list[bytes]:
    """Every message a fresh READ_COMMITTED reader of ``topic`` returns, from the earliest, in order."""
    from pulsartx import MessageId

    reader = client.create_reader(topic, MessageId.earliest)
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(timeout_millis=timeout_millis).data())
    return out
