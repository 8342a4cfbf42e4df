"""Producer deduplication (PIP-6): a message whose sequence id is not greater than the last one
persisted for its producer is dropped. Pure, so the rule is testable without storage."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def new_message_keep(sequence_ids: np.ndarray, last_persisted: int | None) -> np.ndarray:
    """Boolean array, True for each message to keep: a message must beat the last persisted id and
    every predecessor in its batch, so a retried batch that overlaps itself is cut the same way.

    Beating every kept predecessor equals beating every predecessor (a dropped one is never above
    the running high), so this is a shifted running maximum: no Python loop per message, which at
    1000 messages a batch was a sizeable share of an append."""
    seqs = np.asarray(sequence_ids, dtype=np.int64)
    high = -1 if last_persisted is None else last_persisted
    if len(seqs) == 0:
        return np.zeros(0, dtype=bool)
    before = np.empty(len(seqs), dtype=np.int64)
    before[0] = high
    if len(seqs) > 1:
        np.maximum.accumulate(seqs[:-1], out=before[1:])
        np.maximum(before[1:], high, out=before[1:])
    return seqs > before


def new_message_mask(sequence_ids: Sequence[int], last_persisted: int | None) -> list[bool]:
    """:func:`new_message_keep` as a list of bools."""
    return new_message_keep(np.asarray(list(sequence_ids), dtype=np.int64), last_persisted).tolist()


def producer_app_id(producer_name: str) -> str:
    """The Delta app-transaction id whose version is the producer's last persisted sequence id."""
    return f"pulsartx.producer.{producer_name}"


OFFSET_APP_ID = "pulsartx.offset"
"""App-transaction id whose version is the partition's next offset: the per-partition CAS key."""
