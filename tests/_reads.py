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


def drain(consumer: Any, idle_ms: int = 400, ack: bool = False) -> list:
    """Every message ``consumer`` receives until none comes for ``idle_ms`` (``ack``: each one
    acknowledged as it comes)."""
    from pulsartx import Timeout

    out = []
    while True:
        try:
            m = consumer.receive(timeout_millis=idle_ms)
        except Timeout:
            return out
        out.append(m)
        if ack:
            consumer.acknowledge(m)


def offset_numbers(offsets: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    """A stream's offsets without their table ids (``"tableIds"``): Kafka's {topic: {partition:
    offset}}, as offsets from before the ids were recorded."""
    if offsets is None:
        return None
    return {t: {p: o for p, o in ps.items() if p != "tableIds"} for t, ps in offsets.items()}


def stall_lease_renewals(consumer: Any, monkeypatch: Any) -> Any:
    """Make ``consumer``'s lease takes and renewals hang (GC, a store that does not answer) until
    the returned Event is set; each then goes on as it would have."""
    import threading

    stalled, renew = threading.Event(), consumer._leases.take

    def stuck(*args: Any, **kw: Any) -> Any:
        stalled.wait(30)
        return renew(*args, **kw)

    monkeypatch.setattr(consumer._leases, "take", stuck)
    return stalled
