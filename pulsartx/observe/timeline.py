"""A partition's recent history as data: what ``topics timeline`` draws.

The last K entries of one partition, each a message (plain or in a transaction) or a marker; for
every transaction with an entry in that window, its span from its first entry to its marker and
its outcome; maxReadPosition, the end, and the open transaction holding maxReadPosition back. The
transaction buffer supplies what lies before the window (a transaction's first entry, a marker
the window does not reach); the window's own rows are read, four columns of them.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.state import key_txn, txn_key_column
from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.txnid import TxnID
from pulsartx.log.partition import PartitionLog
from pulsartx.log.schema import MessageType
from pulsartx.naming import TopicName
from pulsartx.observe.holdback import HoldBack, holding_back
from pulsartx.storage.root import StorageRoot

COMMITTED, ABORTED, OPEN = "committed", "aborted", "open"
DEFAULT_LAST = 200


@dataclass(frozen=True)
class Entry:
    offset: int
    type: str  # MessageType value
    txn_id: TxnID | None


@dataclass(frozen=True)
class Span:
    """One transaction in the window: ``first`` is its first entry in the partition (it may lie
    before the window: ``clipped``), ``marker`` its commit/abort marker (None while open: then it
    runs on to the partition's end)."""

    txn_id: TxnID
    first: int
    last: int  # its last entry shown: the marker, or its last message while open
    marker: int | None
    outcome: str
    clipped: bool = False


@dataclass(frozen=True)
class Timeline:
    partition: str
    start: int  # first offset shown
    end: int  # the partition's end offset (next offset to be written)
    log_start: int  # the partition's first offset (retention)
    max_read_position: int
    entries: list[Entry] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    blocker: HoldBack | None = None
    now_ms: int = 0

    def as_dict(self) -> dict:
        return {"partition": self.partition, "start": self.start, "end": self.end,
                "maxReadPosition": self.max_read_position, "entries": len(self.entries),
                "messages": sum(1 for e in self.entries if e.type == MessageType.DATA.value),
                "markers": sum(1 for e in self.entries if e.type != MessageType.DATA.value),
                "transactions": {o: sum(1 for s in self.spans if s.outcome == o) for o in (COMMITTED, ABORTED, OPEN)},
                "blockingTxn": None if self.blocker is None else self.blocker.as_dict(self.now_ms)}


def partition_timeline(root: StorageRoot, partition: TopicName, coordinators: Callable[[], Coordinators],
                       last: int = DEFAULT_LAST, now_ms: int | None = None) -> Timeline:
    """The last ``last`` entries of ``partition`` and the transactions among them."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    plog = PartitionLog(root, partition)
    index = plog.refresh()
    state = TransactionBuffer(plog).state()
    end = state.end_offset
    start = max(index.start_offset, end - last)
    rows = plog.read(start, end, columns=["offset", "type", "txn_most_bits", "txn_least_bits"])
    keys = txn_key_column(rows).to_pylist()
    entries = [Entry(o, t, None if k is None else TxnID(*key_txn(k)))
               for o, t, k in zip(rows.column("offset").to_pylist(), rows.column("type").to_pylist(), keys,
                                  strict=True)]
    seen: dict[int, list[Entry]] = {}
    for k, e in zip(keys, entries, strict=True):
        if k is not None:
            seen.setdefault(k, []).append(e)
    spans = []
    for k, es in seen.items():
        markers = [e for e in es if e.type != MessageType.DATA.value]
        data = [e.offset for e in es if e.type == MessageType.DATA.value]
        marker = markers[0] if markers else None
        if marker is not None:
            first = min(data) if data and min(data) < marker.offset else None
            outcome = ABORTED if marker.type == MessageType.TXN_ABORT.value else COMMITTED
            last_shown = marker.offset
        else:  # open, or its marker lies before the window (data after it never shows)
            first = state.ongoing.get(k, min(data))
            outcome = OPEN if k in state.ongoing or k not in state.ended else \
                ABORTED if k in state.aborted else COMMITTED
            last_shown = end - 1 if outcome == OPEN else max(data)  # an open one runs on to the end
        clipped = first is None or first < start
        spans.append(Span(TxnID(*key_txn(k)), start if clipped else first, last_shown,
                          None if marker is None else marker.offset, outcome, clipped))
    # Open since before the window, with no entry in it: still spans it (and may be the blocker).
    spans.extend(Span(TxnID(*key_txn(k)), start, end - 1, None, OPEN, True)
                 for k, first in state.ongoing.items() if k not in seen and first < start)
    spans.sort(key=lambda s: (s.first, s.txn_id))
    blocker = holding_back(coordinators(), str(partition), state) if state.read_limit < end else None
    return Timeline(str(partition), start, end, index.start_offset, state.max_read_position, entries, spans,
                    blocker, now)
