"""Which stored records of a partition a Spark read may return: the executor half of
:mod:`pulsartx.buffer.reads`.

The driver decides *what is visible* when it plans: it folds every partition of the read, then
asks the TCs about every transaction still ongoing in any of them
(:func:`pulsartx.buffer.reads.resolved_filter`). The result, one picklable
:class:`~pulsartx.buffer.state.VisibilityFilter` per partition, travels in the input partition;
the executor applies it to the raw records of its range and nothing else decides visibility.
Because all partitions share one set of TC decisions, a read never returns part of a
transaction, even while its markers are still being written (no fractured reads).

Partitions are folded one after another, so one pass alone is no consistent cut: partition 0 may
be folded before a job's last task appends to it, and partition 1 after the job's commit marker,
which would show the job in partition 1 only. Planning therefore fixes the TCs' decisions at one
instant T0 between two folds (:func:`pulsartx.buffer.reads.consistent_cut`): all data of a
transaction precedes its decision, so the second fold holds all data of every transaction decided
by T0, which is read whole; transactions decided after T0 still block (read in a later query).

The planner keeps each partition's :class:`TransactionBuffer` for the next read it plans (pyspark
reuses its planner process), so a later query folds only what was appended since, as a consumer
or the stream reader does, instead of the whole partition back to its last snapshot
(docs/design/read-committed-planning.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pulsartx.datasource.held_back import warn_held_back

from pulsartx import forks
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.reads import consistent_cut
from pulsartx.buffer.state import VisibilityFilter, keep_rows, key_txn
from pulsartx.coordinator.registry import Coordinators
from pulsartx.log.schema import MessageType

if TYPE_CHECKING:
    import pyarrow as pa

    from pulsartx.log.index import DataFile
    from pulsartx.log.partition import PartitionLog
    from pulsartx.storage.root import StorageRoot

READ_COMMITTED = "READ_COMMITTED"

# (root url, storage options, partition, table id) -> the buffer the last plan folded. A re-created
# table has another id, so it starts over. Plans of one process take turns: a cut advances the
# buffers in place.
# A forked child folds for itself (docs/design/clients-across-fork.md).
_PLANNED: forks.ProcessCache[tuple, TransactionBuffer] = forks.ProcessCache()


def planned_buffer(root: StorageRoot, name: str, plog: PartitionLog) -> TransactionBuffer:
    """The partition's buffer as the last plan in this process left it, now reading through
    ``plog`` (this plan's log, whose file index the fold refreshes); a new one the first time.
    Call with ``_PLANNED.lock`` held."""
    key = (root.url, tuple(sorted(root.storage_options.items())), name, plog.table_id)
    buf = _PLANNED.get(key)
    if buf is not None and buf.state(refresh=False).end_offset > plog.end_offset(refresh=False):
        buf = None  # folded past what this plan's log lists: fold afresh, as far as it lists
    if buf is None:
        buf = _PLANNED[key] = TransactionBuffer(plog)
    else:
        buf.log = plog
        # Retention trims only its own buffer and snapshot: a kept buffer forgets what it deleted
        # the same way, or it would show a filter unlike a fresh plan's and its next snapshot would
        # put the trimmed aborted set back for every later reader.
        state, start = buf.state(refresh=False), plog.index.start_offset
        if start > state.trimmed_below:
            state.trim_below(start)
    return buf


@dataclass(frozen=True)
class Visibility:
    """What the driver decided about one partition's visibility, shipped to the executor."""

    isolation_level: str
    filter: VisibilityFilter | None = None  # READ_COMMITTED only

    @property
    def columns(self) -> tuple[str, ...]:
        """Stored columns :func:`visible_records` needs besides the output ones."""
        if self.filter is None:
            return ("type",)
        return ("type", "txn_most_bits", "txn_least_bits")

    def shows_file(self, f: DataFile, start: int, end: int) -> bool:
        """Whether every record of ``f`` in ``[start, end)`` is visible, known from the plan alone:
        its span lies in one commit entry this filter shows (:meth:`VisibilityFilter.shows_all`).
        Such a file is read without the filter's columns and mask. A file without transactional
        records (``txn_free``) is still filtered: its statistics do not prove it holds no marker
        row (a marker written without a TxnID is one, and is never returned).

        The entry is trusted only for a file whose statistics show every row carrying that
        transaction's most bits (no nulls): a file without them, or with rows of another TC, is
        filtered. The least bits have no statistics, so rows of another transaction of the same TC
        are still taken on the entry's word (docs/design/read-committed-planning.md)."""
        if self.filter is None:
            return False
        k = self.filter.shown_by(max(f.min_offset, start), min(f.max_offset, end - 1))
        if k is None:
            return False
        most = key_txn(k)[0]
        return f.txn_most_nulls == 0 and f.txn_most_min == most and f.txn_most_max == most

    @property
    def read_limit(self) -> int | None:
        """Offsets at or past this are not visible yet (maxReadPosition + 1); None: no limit."""
        return None if self.filter is None else self.filter.read_limit


def plan_visibility(root: StorageRoot, plogs: dict[str, PartitionLog], isolation_level: str) -> dict[str, Visibility]:
    """Driver side: one consistent visibility decision for all partitions of a read planned now
    (:func:`pulsartx.buffer.reads.consistent_cut`). Each ``PartitionLog``'s file index is refreshed
    in place by the fold, so the index the caller plans files from covers what the cut folded."""
    if isolation_level != READ_COMMITTED:
        return {name: Visibility(isolation_level) for name in plogs}

    tcs = Coordinators.shared(root)
    with _PLANNED.lock:
        buffers = {name: planned_buffer(root, name, plog) for name, plog in plogs.items()}
        filters = consistent_cut(tcs, buffers)
        warn_held_back(tcs, buffers, filters)
    return {name: Visibility(isolation_level, filters[name]) for name in plogs}


def visible_records(records: pa.Table, visibility: Visibility) -> pa.Table:
    """Executor side: the raw records of a planned range, reduced to what the reader may see."""
    if visibility.filter is not None:
        return visibility.filter.apply(records)
    import pyarrow.compute as pc

    return keep_rows(records, pc.equal(records.column("type"), MessageType.DATA.value))
