"""TransactionBuffer: the read state of one partition, kept current incrementally.

Opening loads the latest snapshot and folds only the records after it (projected to the few
columns the fold needs); later calls fold only what was appended since. A snapshot is written
every ``snapshot_every_txns`` markers or ``snapshot_interval_s`` seconds, whichever first, and
every ``snapshot_every_records`` records folded: a partition holding a few large transactions (a
Spark job's) or none at all has few markers, and without it every new reader (each Spark query
plans with fresh buffers) would re-fold the whole partition.

A snapshot that falls due while reading is taken (as an Arrow table) on the reader's thread and
written on a background thread: the write opens and overwrites a Delta table (50-150 ms), which
on a consumer's path put that much into the commit-to-receive tail. A snapshot only spares
folding, so one that fails to land costs the next reader a longer fold, nothing else.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future

import pyarrow as pa
import pyarrow.compute as pc

from pulsartx.buffer.snapshot import SnapshotStore, state_to_table
from pulsartx.buffer.state import FOLD_COLUMNS, BufferState, txn_key_column
from pulsartx.log.partition import PartitionLog
from pulsartx.log.schema import MessageType
from pulsartx.storage.pools import ProcessPool

log = logging.getLogger(__name__)
SNAPSHOT_EVERY_TXNS = 100
SNAPSHOT_INTERVAL_S = 60.0
SNAPSHOT_EVERY_RECORDS = 200_000
FOLD_CHUNK = 200_000
_WRITER = ProcessPool(1, "pulsartx-tb-snapshot")


class TransactionBuffer:
    def __init__(self, plog: PartitionLog, snapshot_every_txns: int = SNAPSHOT_EVERY_TXNS,
                 snapshot_interval_s: float = SNAPSHOT_INTERVAL_S,
                 snapshot_every_records: int = SNAPSHOT_EVERY_RECORDS):
        self.log = plog
        self._snapshots: SnapshotStore | None = None
        self.snapshot_every_txns = snapshot_every_txns
        self.snapshot_interval_s = snapshot_interval_s
        self.snapshot_every_records = snapshot_every_records
        self._state: BufferState | None = None
        self._last_snapshot_time = time.monotonic()
        self._writing: Future[bool] | None = None

    @property
    def snapshots(self) -> SnapshotStore:
        """The snapshots of this partition's current table (its incarnation)."""
        if self._snapshots is None:
            self._snapshots = SnapshotStore(self.log.root, self.log.topic, self.log.table_id)
        return self._snapshots

    def state(self, refresh: bool = True) -> BufferState:
        if self._state is None:
            self._state = self._load_snapshot() or BufferState()
            refresh = True
        if refresh:
            end = self.log.end_offset()
            s = self._state
            while s.end_offset < end:
                upto = min(end, s.end_offset + FOLD_CHUNK)
                s.fold(self.log.read(s.end_offset, upto, columns=FOLD_COLUMNS, txn_only=True))
                if s.end_offset < upto:  # offsets are dense; a gap means the range was empty or skipped
                    s.end_offset = upto
            self._maybe_snapshot()
        return self._state

    def _load_snapshot(self) -> BufferState | None:
        """The latest snapshot, unless the log was trimmed past its end: the markers in between
        are gone, and its open transactions that they ended would stay open for good, holding
        maxReadPosition (a retention whose own snapshot failed leaves such an older one). A fold
        of what the log still holds is then the state, as with no snapshot at all."""
        s = self.snapshots.load()
        if s is None:
            return None
        start = self.log.refresh().start_offset
        if s.end_offset < start:
            log.warning("the transaction buffer snapshot of %s ends at offset %d, before the log's start %d: "
                        "folding the log instead", self.log.topic, s.end_offset, start)
            return None
        return s

    def settle_stragglers(self, keys: set[int]) -> None:
        """Record the data of ``keys`` folded so far as stragglers (:meth:`BufferState.settle_stragglers`):
        the exact rows, read back from the first one, as other transactions' rows lie between them."""
        s = self.state(refresh=False)
        keys = {k for k in keys if k in s.ongoing}
        if not keys:
            return
        rows = self.log.read(min(s.ongoing[k] for k in keys), s.end_offset, ["type", "txn_most_bits", "txn_least_bits"],
                             txn_only=True)
        theirs = pc.and_(pc.equal(rows.column("type"), MessageType.DATA.value),
                         pc.is_in(txn_key_column(rows), pa.array(sorted(keys), pa.int64())))
        s.settle_stragglers(keys, rows.filter(theirs).column("offset").to_pylist())

    def _maybe_snapshot(self) -> None:
        s = self._state
        if s is None or s.end_offset == s.snapshot_offset:
            return
        due = s.markers_since_snapshot >= self.snapshot_every_txns or (
            s.markers_since_snapshot and time.monotonic() - self._last_snapshot_time >= self.snapshot_interval_s) or (
            s.end_offset - max(s.snapshot_offset, 0) >= self.snapshot_every_records)
        if due and (self._writing is None or self._writing.done()):
            table = state_to_table(s)
            s.snapshot_offset, s.markers_since_snapshot = s.end_offset, 0
            self._last_snapshot_time = time.monotonic()
            try:
                self._writing = _WRITER.get().submit(self.snapshots.write, table)
            except RuntimeError:  # the interpreter is exiting: a snapshot only spares folding
                self._writing = None

    def wait_for_snapshot(self) -> None:
        """Block until a snapshot being written in the background has landed (or failed)."""
        if self._writing is not None:
            self._writing.result()

    def take_snapshot(self) -> bool:
        """A snapshot now, on this thread (after any being written in the background)."""
        self.wait_for_snapshot()
        s = self.state(refresh=False)
        ok = self.snapshots.save(s)
        self._last_snapshot_time = time.monotonic()
        return ok

    def stats(self) -> dict:
        s = self.state()
        return {"partition": str(self.log.topic), "state": "Ready", "maxReadPosition": s.max_read_position,
                "lastConfirmedEntry": s.end_offset - 1, "ongoingTxnSize": len(s.ongoing),
                "abortedTxnSize": len(s.aborted), "lastSnapshotOffset": s.snapshot_offset,
                "endOffset": s.end_offset}
