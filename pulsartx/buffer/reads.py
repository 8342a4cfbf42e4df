"""What a reader may see of a partition, per isolation level.

READ_UNCOMMITTED returns every DATA record. READ_COMMITTED returns DATA records below
maxReadPosition, minus aborted transactions, minus entries a commit marker left out, minus a
transaction's stragglers after its own marker. Markers are never returned.

Markers are written only after the TC logged COMMITTING/ABORTING, so the TC record is the
decision and a marker merely materialises it. Readers use that (:func:`resolved_filter`):
for every transaction still ongoing in the partitions being read, they ask its TC once, after
folding all partitions:
  * decided COMMIT: visible in every partition alike, marker written or not: a read of several
    partitions never returns part of a transaction (no fractured reads);
  * decided ABORT, or unknown to the TC: hidden;
  * OPEN past its timeout: aborted right there (reader-side resolution), so a dead client blocks
    a partition for no longer than its timeout, with or without a sweeper;
  * OPEN: it bounds maxReadPosition, as in Pulsar and Kafka (the LSO).
"""
from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.state import BufferState, Cut, Decision, VisibilityFilter, key_txn, txn_key
from pulsartx.coordinator.coordinator import now_ms
from pulsartx.coordinator.state import TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import InvalidConfiguration, PulsarException, StorageError, TransactionNotFound
from pulsartx.log.partition import PartitionLog
from pulsartx.log.schema import MessageType
from pulsartx.storage.delta import NextCommit

log = logging.getLogger(__name__)

ISOLATION_LEVELS = ("READ_COMMITTED", "READ_UNCOMMITTED")


def check_isolation(level: str) -> str:
    """The isolation level, upper-cased; an unknown one names the valid levels."""
    norm = str(level).upper()
    if norm not in ISOLATION_LEVELS:
        raise InvalidConfiguration(f"isolation_level={level!r}: must be one of {', '.join(ISOLATION_LEVELS)}")
    return norm


def _lookup(coordinators: Any, keys: set[int]) -> dict[int, Any]:
    """TC metadata for each transaction key (None: unknown to its TC), one log refresh per TC."""

    by_tc: dict[int, list[int]] = defaultdict(list)
    for k in keys:
        by_tc[key_txn(k)[0]].append(k)
    out: dict[int, Any] = {}
    for tc_id, ks in by_tc.items():
        try:
            tc = coordinators.tc(tc_id)
            tc.refresh()
        except PulsarException as e:
            log.debug("TC %d unavailable for visibility decisions: %s", tc_id, e)
            continue  # undecided: those transactions keep blocking, which is always safe
        for k in ks:
            txn_id = TxnID(*key_txn(k))
            try:
                meta = tc.get(txn_id)
                if meta.expired(now_ms()):
                    log.info("reader-side resolution: aborting expired transaction %s", txn_id)
                    meta = tc.abort_expired(txn_id)
                else:
                    tc.adopt(meta)  # decided without its markers: finished here after the grace if not by then
                out[k] = meta
            except TransactionNotFound:
                out[k] = None
            except PulsarException as e:
                log.debug("cannot decide %s: %s", txn_id, e)
    return out


def _finished(m: Any) -> bool:
    """Finished for good: COMMITTED/ABORTED are logged after every marker was written, and a
    transaction its TC no longer knows finished and was trimmed from its log."""
    return m is None or m.status in (TxnStatus.COMMITTED, TxnStatus.ABORTED)


def finished(coordinators: Any, keys: set[int]) -> set[int]:
    """Those of ``keys`` whose TCs finished them for good (see :func:`_finished`); one whose TC
    cannot be read now is not among them."""
    return {k for k, m in _lookup(coordinators, keys).items() if _finished(m)}


def settle(coordinators: Any, buffer: TransactionBuffer, eager: bool = False) -> tuple[BufferState, dict[int, Any]]:
    """The buffer's state, folded, with what its transactions' TCs know for good applied to it,
    and the TC metadata looked up (by key; only ongoing transactions, and overdue plain commits).

    * A transaction still ongoing here that its TC reports finished has no marker here though
      every marker was written before that report, and the state is folded again after it: its
      data here came after its own marker (forgotten, or deleted by retention), or lies in a
      partition it never registered. None of it is ever visible: it is recorded as stragglers,
      and stops holding maxReadPosition, for readers, compaction and retention alike.
    * Plain commits past the MAX_ENDED most recent ones are forgotten once their TCs confirm them
      finished; the TCs are asked once MAX_ENDED are due (at every call with ``eager``)."""
    state = buffer.state()
    overdue = state.overdue() if eager or state.forget_due else []
    if not state.ongoing and not overdue:
        return state, {}
    metas = _lookup(coordinators, set(state.ongoing) | set(overdue))
    done = {k for k, m in metas.items() if _finished(m)}
    if done & state.ongoing.keys():
        state = buffer.state()  # folded after the lookup: every marker written before it is in
        buffer.settle_stragglers(done)
    if overdue:
        state.forget(done)
    return state, metas


def _decisions(metas: Mapping[int, Any], name: str, state: BufferState) -> dict[int, Decision]:
    """Outcomes for the transactions still ongoing in ``state`` that their TCs decided (after
    :func:`settle`, no finished one is left ongoing)."""
    decided: dict[int, Decision] = {}
    for k in state.ongoing:
        if k not in metas:
            continue
        m = metas[k]
        if m is None or m.status in (TxnStatus.ABORTING, TxnStatus.ABORTED):
            decided[k] = Decision(False)
        elif m.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
            ranges = None
            if m.commit_entries is not None:
                ranges = tuple((a, b) for p, a, b in m.commit_entries if p == name)
            decided[k] = Decision(True, ranges)
    return decided


def resolved_filter(coordinators: Any, buffer: TransactionBuffer) -> VisibilityFilter:
    """One partition's READ_COMMITTED filter with its ongoing transactions resolved through their
    TCs (an expired one aborted on the spot): the path every tailing reader takes, the client's
    readers and consumers as well as Spark's stream reader, so a dead producer's transaction blocks
    none of them past its timeout, with or without a sweeper. A decided COMMIT shows its data in
    every partition alike, marker written or not (no fractured reads)."""
    if coordinators is None:
        return buffer.state().filter()
    state, metas = settle(coordinators, buffer)
    if not state.ongoing:
        return state.filter()
    return state.filter(_decisions(metas, str(buffer.log.topic), state))


def marker_outcomes(states: Iterable[BufferState]) -> dict[int, bool]:
    """Each transaction with a marker in one of ``states``: True when it committed. A marker
    follows its TC's decision, so one partition's marker settles the outcome for all of them."""
    out: dict[int, bool] = {}
    for s in states:
        for k in s.ended:
            out[k] = out.get(k, True) and k not in s.aborted
    return out


def consistent_cut(coordinators: Any, buffers: Mapping[str, TransactionBuffer]) -> dict[str, VisibilityFilter]:
    """READ_COMMITTED filters for a read of several partitions that shows every transaction whole
    or not at all (the Spark batch read's guarantee), even while transactions commit during planning.

    1. fold every partition, to learn which TCs matter;
    2. resolve expired transactions, then take T0: each of those TCs' state (statuses, counters);
       a transaction unknown at T0 with no data in step 1's fold and a marker past its end may
       have begun after T0 (its id may still be below the counter: ids are reserved in blocks),
       and is hidden; one with data in step 1's fold finished before T0, and its markers decide;
    3. fold again, up to the partitions' current ends (everything decided before T0 was written
       before T0, hence before these ends);
    4. per partition, the read limit is the first offset of the earliest transaction not decided at
       T0; a transaction is shown only if decided COMMIT at T0 (or finished before it) and none of its
       data lies at or past any partition's limit: otherwise it is hidden everywhere.
    """

    # Settled: a forgotten transaction's straggler is neither shown nor holding the limit.
    first = {name: b.state() if coordinators is None else settle(coordinators, b)[0] for name, b in buffers.items()}
    # Before T0: everything at or past these offsets was written after this instant.
    first_end = {name: s.end_offset for name, s in first.items()}
    # Transactions with data before this instant (copied: a buffer's state may advance in place).
    began_before = set().union(*(s.ongoing.keys() for s in first.values())) if first else set()
    # A marker is the last word: it is written only after its TC decided, so no TC entry can reverse
    # it (docs/semantics.md, "Which record decides"). Only markers folded before T0 decide for this
    # cut: one written after T0 is a decision after T0, and a partition folded before it may lack
    # some of that transaction's data (showing it would fracture the read).
    marked = marker_outcomes(first.values())
    tc_ids = {key_txn(k)[0] for s in first.values() for k in (*s.ongoing, *s.ended)}
    if coordinators is not None:
        _lookup(coordinators, began_before)  # aborts expired ones before T0
    known: dict[int, Any] = {}
    counters: dict[int, int] = {}
    for tc_id in sorted(tc_ids) if coordinators is not None else ():
        try:
            tc = coordinators.tc(tc_id)
            metas = tc.transactions(refresh=True)
        except StorageError as e:
            # Hiding its transactions would hide some that committed before this read began (their
            # markers may still be on their way): no answer rather than a stale one.
            raise StorageError(f"a consistent read needs TC {tc_id}'s log, which cannot be read now ({e}); "
                               "retry the read") from e
        except PulsarException as e:
            log.debug("TC %d unavailable for the cut: its transactions stay hidden: %s", tc_id, e)
            continue
        counters[tc_id] = tc.txlog.counter
        for m in metas:
            known[txn_key(m.txn_id.most_bits, m.txn_id.least_bits)] = m
    committed = {TxnStatus.COMMITTING, TxnStatus.COMMITTED}
    states = {name: b.state() for name, b in buffers.items()}

    def commits(k: int) -> bool:
        """Whether ``k``, known to its TC at T0, is decided COMMIT: its markers say so first."""
        return marked[k] if k in marked else known[k].status in committed

    def decided(k: int) -> Decision | None:
        if k in marked:
            return Decision(marked[k])
        m = known.get(k)
        if m is None or m.status is TxnStatus.OPEN:
            return None
        return Decision(m.status in committed)

    limits: dict[str, int] = {}
    for name, s in states.items():
        blocking = [o for k, o in s.ongoing.items() if decided(k) is None]
        limits[name] = min(blocking) if blocking else s.end_offset
    hidden = {k for name, s in states.items() for k, last in s.last_data.items()
              if last >= limits[name] and k not in s.aborted}
    # A transaction the TCs did not know at T0 is either finished and trimmed from its log (its
    # markers all written before T0) or begun after T0, possibly with an id below its TC's counter
    # (ids are reserved in blocks). One with data in the first fold began before T0, so it is the
    # first kind (trimmed in between, as when its writer's clock runs behind), and its markers
    # decide; one with a marker written after the first fold and no data in it may be the second
    # kind, and is hidden everywhere, as the partitions folded before its data cannot show it.
    hidden |= {k for name, s in states.items() for k, o in s.ended.items()
               if o >= first_end[name] and k not in known and k not in s.aborted and k not in began_before}
    visible = frozenset(k for k in known if commits(k) and k not in hidden)
    invisible = frozenset((set(known) - visible) | hidden | {k for k, c in marked.items() if not c})
    cut = Cut(visible, invisible, counters)
    out = {}
    for name, s in states.items():
        ranges = dict(s.ranges)
        for k in s.ongoing:
            m = known.get(k)
            if m is not None and commits(k) and m.commit_entries is not None:
                ranges[k] = [(a, b) for p, a, b in m.commit_entries if p == name]
        out[name] = VisibilityFilter(limits[name], dict(s.aborted), dict(s.ended), ranges, cut=cut,
                                     stragglers=tuple(s.stragglers),
                                     min_offset=s.trimmed_below)
    return out


class VisibilityReader:
    def __init__(self, client: Any, plog: PartitionLog, isolation_level: str):
        self.client = client
        self.log = plog
        self.isolation = isolation_level
        self.buffer = TransactionBuffer(plog)
        self._end = 0
        self._filter: VisibilityFilter | None = None
        self._watch: list[NextCommit] = []  # see next_commits()

    @property
    def committed(self) -> bool:
        return self.isolation == "READ_COMMITTED"

    def end_position(self) -> int:
        """The offset below which records may be returned (refreshes the partition)."""
        # Taken before anything is read, so that whatever lands meanwhile is still awaited (a TC
        # log is shared by the threads of a process: another one may catch it up in between).
        watch = [self.log.next_commit()]
        if not self.committed:
            self._end = self.log.end_offset()
            self._watch = watch
            return self._end
        state = self.buffer.state()
        tc_logs: dict[int, NextCommit] = {}
        if self.client is None or not (state.ongoing or state.forget_due):
            self._filter = state.filter()
        elif self._filter is None or state.forget_due or any(
                k not in self._filter.decided_commits and k not in self._filter.aborted for k in state.ongoing):
            # An undecided transaction is asked about on every call, never cached: a commit is
            # visible to everyone from its decision on (read-your-writes across processes). A TC
            # log with nothing new costs one probe for its next commit.
            tc_logs = self._tc_logs(state.ongoing)
            self._filter = resolved_filter(self.client._coordinators(), self.buffer)
        else:
            self._filter = self._refold(state)  # every ongoing one is decided, and decisions stand
        f = self._filter
        undecided = {key_txn(k)[0] for k in self.buffer.state(refresh=False).ongoing
                     if k not in f.decided_commits and k not in f.aborted}
        self._watch = watch + [nc for tc_id, nc in sorted(tc_logs.items()) if tc_id in undecided]
        self._end = f.read_limit
        return self._end

    def _tc_logs(self, keys: Iterable[int]) -> dict[int, NextCommit]:
        """The next commit of the TC log of each of these transactions."""
        out: dict[int, NextCommit] = {}
        tcs = self.client._coordinators()
        for tc_id in {key_txn(k)[0] for k in keys}:
            try:
                nc = tcs.tc(tc_id).txlog.log.next_commit()
            except PulsarException as e:  # not watched: the reader's periodic full check asks the TC
                log.debug("TC %d not watched: %s", tc_id, e)
                continue
            if nc is not None:
                out[tc_id] = nc
        return out

    def next_commits(self) -> list[NextCommit]:
        """The commits that can make more of this partition readable, for a reader idling at the end
        :meth:`end_position` gave: the partition's next one, and the next one of each TC log holding
        a transaction that is still undecided there. ``commit()`` returns at the decision, before
        any marker is written, so the TC log's commit is what shows such a transaction first."""
        return list(self._watch)

    def _refold(self, state: BufferState) -> VisibilityFilter:
        """Between TC checks, keep the decisions already made for transactions still ongoing."""
        assert self._filter is not None
        ranges = self._filter.ranges
        decided = {k: Decision(True, tuple(ranges[k]) if k in ranges else None)  # () shows nothing
                   for k in self._filter.decided_commits if k in state.ongoing}
        decided.update({k: Decision(False) for k in state.ongoing if k in self._filter.aborted})
        return state.filter(decided)

    def more_readable(self, position: int) -> bool:
        return position < self._end

    def fetch(self, position: int, max_records: int) -> tuple[pa.Table, int]:
        end = min(self.end_position(), position + max_records)
        if end <= position:
            return self.log.read(0, 0), position
        return self.visible(self.log.read(position, end)), end

    def visible(self, table: pa.Table) -> pa.Table:
        """The visible DATA rows of raw records read below the last :meth:`end_position`."""
        if self.committed:
            assert self._filter is not None
            return self._filter.apply(table)
        return table.filter(pc.equal(table.column("type"), MessageType.DATA.value))
