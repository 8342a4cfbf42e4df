"""Producer deduplication (PIP-6): a message whose sequence id is not greater than the last one
persisted for its producer is dropped. Pure, so the rule is testable without storage."""
from __future__ import annotations

from collections.abc import Sequence


def new_message_mask(sequence_ids: Sequence[int], last_persisted: int | None) -> list[bool]:
    """True for each message to keep. Within one batch a message must also beat every kept
    predecessor, so a retried batch that overlaps itself is cut the same way."""
    high = -1 if last_persisted is None else last_persisted
    keep = []
    for seq in sequence_ids:
        if seq > high:
            keep.append(True)
            high = seq
        else:
            keep.append(False)
    return keep


def producer_app_id(producer_name: str) -> str:
    """The Delta app-transaction id whose version is the producer's last persisted sequence id."""
    return f"pulsartx.producer.{producer_name}"


OFFSET_APP_ID = "pulsartx.offset"
"""App-transaction id whose version is the partition's next offset: the per-partition CAS key."""
