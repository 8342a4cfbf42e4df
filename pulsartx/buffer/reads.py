"""What a reader may see of a partition, per isolation level.

READ_UNCOMMITTED returns every DATA record. READ_COMMITTED returns DATA records below
maxReadPosition, minus aborted transactions, minus entries a commit marker left out, minus a
transaction's stragglers after its own marker. Markers are never returned.

Stuck transactions: when the earliest ongoing transaction blocks maxReadPosition, the reader asks
its TC. An OPEN transaction past its timeout is aborted right there (reader-side resolution), and a
decided one whose markers a dead TC never wrote is rolled forward, so a partition is blocked for no
longer than the timeout, with or without a sweeper running.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.state import BufferState, key_txn
from pulsartx.log.partition import PartitionLog
from pulsartx.log.schema import MessageType

log = logging.getLogger(__name__)
RESOLVE_EVERY_S = 0.5


def resolve_blocking(coordinators: Any, state: BufferState, grace_ms: int | None = None) -> bool:
    """Try to unblock the transaction holding maxReadPosition; True when it was finished here."""
    from pulsartx.coordinator.coordinator import now_ms
    from pulsartx.coordinator.state import TxnStatus
    from pulsartx.coordinator.txnid import TxnID
    from pulsartx.exceptions import PulsarException

    if not state.ongoing:
        return False
    key = min(state.ongoing, key=state.ongoing.get)
    txn_id = TxnID(*key_txn(key))
    try:
        tc = coordinators.for_txn(txn_id)
        meta = tc.get(txn_id, refresh=True)
    except PulsarException as e:
        log.debug("cannot resolve %s: %s", txn_id, e)
        return False
    grace = tc.config.recovery_grace_ms if grace_ms is None else grace_ms
    if meta.expired(now_ms()):
        log.info("reader-side resolution: aborting expired transaction %s blocking %s", txn_id, state)
        return tc.abort_expired(txn_id).status is TxnStatus.ABORTED
    if meta.status in (TxnStatus.COMMITTING, TxnStatus.ABORTING) and now_ms() - meta.last_modified_ms >= grace:
        return tc.end_transaction(txn_id, _action_of(meta.status)).status.is_final
    return False


def _action_of(status):
    from pulsartx.coordinator.state import TxnAction, TxnStatus

    return TxnAction.COMMIT if status is TxnStatus.COMMITTING else TxnAction.ABORT


class VisibilityReader:
    def __init__(self, client: Any, plog: PartitionLog, isolation_level: str):
        self.client = client
        self.log = plog
        self.isolation = isolation_level
        self.buffer = TransactionBuffer(plog)
        self._end = 0
        self._last_resolve = 0.0

    @property
    def committed(self) -> bool:
        return self.isolation == "READ_COMMITTED"

    def end_position(self) -> int:
        """The offset below which records may be returned (refreshes the partition)."""
        if not self.committed:
            self._end = self.log.end_offset()
            return self._end
        state = self.buffer.state()
        if state.ongoing and self.client is not None and time.monotonic() - self._last_resolve >= RESOLVE_EVERY_S:
            self._last_resolve = time.monotonic()
            if resolve_blocking(self.client._coordinators(), state):
                state = self.buffer.state()
        self._end = state.read_limit
        return self._end

    def more_readable(self, position: int) -> bool:
        return position < self._end

    def fetch(self, position: int, max_records: int) -> tuple[pa.Table, int]:
        end = min(self.end_position(), position + max_records)
        if end <= position:
            return self.log.read(0, 0), position
        table = self.log.read(position, end)
        if self.committed:
            return self.buffer.state(refresh=False).filter().apply(table), end
        return table.filter(pc.equal(table.column("type"), MessageType.DATA.value)), end
