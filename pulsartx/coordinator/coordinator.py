"""The transaction coordinator (TC): PIP-31's request processing, expiration and recovery.

There is no broker. A TC is a role any process plays against a TC log in storage, and several may
play the same TC at once: every status change is a compare-and-set on the log (``tclog``), so e.g. a
timeout sweeper and a committing client race and exactly one wins. Once COMMITTING/ABORTING is
durable the outcome is decided; whoever plays the TC next rolls it forward (``recover``).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from pulsartx import forks, metrics
from pulsartx.coordinator.completer import Completer
from pulsartx.coordinator.keys import TransactionKeyStore, full_key
from pulsartx.coordinator.lease import TcLease
from pulsartx.coordinator.participants import end_on_participants, failure_level
from pulsartx.coordinator.state import MetadataOp, Subscription, TxnAction, TxnMeta, TxnStatus, end_request
from pulsartx.coordinator.tclog import FENCE_PROPERTY, TransactionLog
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import (
    ExpiredTransactionError,
    InvalidTxnStatusError,
    NotAllowedError,
    TransactionFenced,
    TransactionNotFound,
)
from pulsartx.storage.cli_command import cli_command
from pulsartx.storage.group_commit import Done, GroupCommit, Write
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)
MAX_CAS_ATTEMPTS = 500
REASON_TIMEOUT = "timed out"
REASON_FENCED = "fenced"
REASON_ADMIN_ABORT = "admin abort"


# Transactions whose begin or last extension here is remembered as a step-proof base for the next
# extension (keep_alive_now); the oldest are forgotten first (they then fall back to the wall clock).
CLOCK_BASES_KEPT = 16_384
# How far the wall clock may stray from that base plus the monotonic time since before it is taken
# for stepped (and the count used instead).
CLOCK_STEP_MS = 1_000


def now_ms() -> int:
    return int(time.time() * 1000)


def monotonic_ms() -> float:
    return time.monotonic() * 1000


@dataclass
class CoordinatorConfig:
    compact_every: int = 200
    # TxnIDs reserved per compare-and-set on the TC log's counter (a dead process skips the rest).
    id_block_size: int = 1000
    finished_retention_ms: int = 300_000
    # A COMMITTING/ABORTING transaction untouched this long is finished by whoever sweeps; a live
    # TC is normally still writing its markers before that.
    recovery_grace_ms: int = 5_000
    # A process's lease on the TC log it begins its transactions on (pulsartx/coordinator/lease.py),
    # renewed after a third of it while used; 0 turns leases off (round-robin over every TC).
    lease_ms: int = 30_000
    # How far clocks of processes sharing a root may disagree: an expired lease is taken over only
    # this long after its expiry, by the taker's clock.
    max_clock_skew_ms: int = 10_000


@dataclass
class SweepResult:
    timed_out: int = 0
    completed: int = 0
    failed: int = 0


class TransactionCoordinator:
    def __init__(self, root: StorageRoot, tc_id: int, config: CoordinatorConfig | None = None,
                 keys: TransactionKeyStore | None = None, completer: Completer | None = None,
                 key_home: Callable[[str], TransactionKeyStore] | None = None):
        self.root = root
        self.tc_id = tc_id
        self.config = config or CoordinatorConfig()
        self.txlog = TransactionLog(root, tc_id, self.config.compact_every, self.config.finished_retention_ms)
        self.keys = keys or TransactionKeyStore(root, tc_id)  # the keys that hash to this TC
        # Where a transaction key's epoch lives, by ``owner&key``: the TC it hashes to, which need
        # not be this one (a Spark driver begins its micro-batches on the TC it leases).
        self._key_home = key_home
        self._lock = threading.RLock()
        self._group = GroupCommit(f"TC {tc_id}", self._lock, self.txlog.write_many, self.txlog.refresh,
                                  max_attempts=MAX_CAS_ATTEMPTS, before_group=self.txlog.refresh)
        self._opened = False
        # Transactions begun here that have registered nothing yet: their NEW entry is written with
        # the first ADD_PARTITION/ADD_SUBSCRIPTION (or the end), so beginning one costs no write.
        self._unwritten: dict[int, TxnMeta] = {}
        self._ids: tuple[int, int] | None = None  # the rest of this process's TxnID block: (next, last)
        self._ids_lock = threading.Lock()  # guards _ids; taken before _lock, never inside it
        self._made = forks.stamp()  # the block is this process's: a forked child issuing from it would repeat ids
        # TxnID least bits -> (the wall time of its begin or last extension here, the monotonic time then)
        self._clock_bases: dict[int, tuple[int, float]] = {}
        self.completer = completer  # background completion for end_transaction(background=True)
        self.on_event: Callable[[str, TxnMeta], None] | None = None  # metrics hook

    def _emit(self, event: str, meta: TxnMeta) -> None:
        metrics.record_tc_event(self.tc_id, event, meta)
        if self.on_event is not None:
            self.on_event(event, meta)

    def open(self, recover: bool = True) -> TransactionCoordinator:
        with self._lock:
            if not self._opened:
                self.txlog.open()
                self._opened = True
        if recover:
            # Opportunistic recovery: anyone who opens a TC finishes what a dead one left behind.
            self.sweep()
        return self

    # ---- CAS plumbing -----------------------------------------------------------------------------
    def _cas(self, txn_id: TxnID, prepare: Callable[[TxnMeta], tuple[TxnMeta, MetadataOp] | None]) -> TxnMeta:
        """Read-validate-write: ``prepare`` sees the latest durable metadata and returns the new
        metadata to log (or None for "nothing to do"). Concurrent requests of this process's
        threads share one commit (group commit); on a lost race each is re-read and re-validated.

        ``prepare`` first sees the row this process last read, which only a write's conflict
        corrects. A refusal judged on it (:class:`InvalidTxnStatusError`: ended, fenced, or OPEN
        past a deadline that another process, the driver's keeper, may have moved since) is
        judged again once on the log as it is now, and only that judgement is raised: a worker
        that cached the row before a keep-alive would otherwise refuse, on every retry, a
        transaction the log holds open. The re-read costs one probe, on the refusing path only."""
        judged: list[TxnMeta] = []

        def plan() -> Done | Write:
            meta = self._require(txn_id)
            try:
                prepared = prepare(meta)
            except InvalidTxnStatusError:
                judged.append(meta)
                raise
            if prepared is None:
                return Done(meta)
            new, op = prepared
            entries = new if isinstance(new, list) else [(new, op)]
            least = meta.txn_id.least_bits
            unwritten = least in self._unwritten and self.txlog.get(least) is None
            if unwritten and entries[-1][0].status.is_final:
                rows = [(entries[-1][0], entries[-1][1], None)]  # ended having registered nothing: one entry
            else:
                rows, expected = ([(meta, MetadataOp.NEW, None)] if unwritten else []), meta.status
                for m, o in entries:
                    rows.append((m, o, expected))
                    expected = m.status
            final = entries[-1][0]

            def written() -> None:
                self._unwritten.pop(least, None)
                self._emit("append", final)
            return Write(rows, final, written)

        try:
            new = self._group.run(txn_id, plan)
        except InvalidTxnStatusError:
            if not judged:
                raise
            new = self._group.run(txn_id, plan, before=True)  # the group re-reads the log first
        if self.txlog.log.needs_compaction():  # a hint read unlocked: most requests need no lock again
            with self._lock:
                self._maybe_compact()
        return new

    def _require(self, txn_id: TxnID) -> TxnMeta:
        if txn_id.most_bits != self.tc_id:
            raise TransactionNotFound(f"transaction {txn_id} does not belong to TC {self.tc_id}")
        meta = self.txlog.get(txn_id.least_bits)
        if meta is None and txn_id.least_bits in self._unwritten:
            return self._unwritten[txn_id.least_bits]
        if meta is None:
            self.txlog.refresh()
            meta = self.txlog.get(txn_id.least_bits)
        if meta is None:
            if txn_id.least_bits <= self.txlog.counter:
                raise TransactionNotFound(
                    f"transaction {txn_id} is not in TC {self.tc_id}'s log: it finished and its metadata was trimmed, "
                    "or it never registered a partition or subscription (an acknowledgement-only transaction "
                    "registers with its decision: until then the pending-ack stats of its subscriptions list it "
                    "under unregisteredTransactions, with its deadline)")
            raise TransactionNotFound(f"transaction {txn_id} was never issued by TC {self.tc_id}")
        self._unwritten.pop(txn_id.least_bits, None)
        return meta

    def _maybe_compact(self) -> None:
        try:
            self.txlog.maybe_compact(now_ms())
        except Exception as e:  # compaction is an optimisation; the log stays correct without it
            log.warning("TC %d log compaction failed: %s", self.tc_id, e)

    # ---- requests (PIP-31 "TC Request Processing") -----------------------------------------------
    def _next_id(self) -> TxnID:
        """The next TxnID of this process's block, leasing a new block when it runs out. Only the
        lease takes the TC's lock, which a commit in flight holds for its round trip: beginning a
        transaction does not wait for other transactions' commits."""
        forks.check(self._made, lambda: f"TC {self.tc_id} of {self.root.url} (its TxnID block)")
        with self._ids_lock:
            if self._ids is None or self._ids[0] > self._ids[1]:
                with self._lock:
                    self._ids = self.txlog.lease_block(self.config.id_block_size)
            least, last = self._ids
            self._ids = (least + 1, last)
        return TxnID(self.tc_id, least)

    def issue_above(self, least_bits: int) -> None:
        """Make the next TxnID this process issues here greater than ``least_bits``: the rest of a
        block at or below it is skipped (never reissued), and the next lease starts past the counter,
        which every issued id is at or below. Ids come in blocks per process, so a transaction key
        whose transactions begin in several processes (pyspark's planner workers begin micro-batches)
        would otherwise get a lower id after a higher one, and the TC log's compaction, which keeps
        a key's latest committed transaction by id, would trim the one committed last."""
        with self._ids_lock:
            if self._ids is not None and self._ids[0] <= least_bits:
                self._ids = None

    def new_transaction(self, timeout_ms: int, owner: str | None = None, transaction_key: str | None = None,
                        epoch: int | None = None, properties: dict[str, str] | None = None,
                        partitions: Iterable[str] = (), lazy: bool = False) -> TxnMeta:
        """NEW. ``partitions`` already known to the caller (a Spark job's targets) are recorded in the
        same entry, as if ADD_PARTITION had followed at once: one TC-log write instead of two.

        ``lazy``: write nothing now; the NEW entry goes with the first registration (or the end).
        Until then only this process knows the transaction, which is safe because nothing of it
        exists anywhere else yet: data and acknowledgements are written only after a registration."""
        t = now_ms()
        meta = TxnMeta(self._next_id(), TxnStatus.OPEN, int(timeout_ms), t, t,
                       partitions=frozenset(partitions), owner=owner, transaction_key=transaction_key,
                       epoch=epoch, properties=dict(properties or {}))
        self._remember_clock(meta.txn_id, t, monotonic_ms())
        if lazy and not meta.partitions:
            self._unwritten[meta.txn_id.least_bits] = meta  # no lock: one dict store, of an id no one else has
        else:
            self._write_new(meta)
            if self.txlog.log.needs_compaction():
                with self._lock:
                    self._maybe_compact()
        self._emit("created", meta)
        return meta

    def _write_new(self, meta: TxnMeta) -> None:
        """The NEW entry alone. A conflict can only be another key of the same bucket, as the id
        is ours alone: retried."""
        least = meta.txn_id.least_bits

        def written() -> None:
            self._unwritten.pop(least, None)
            self._emit("append", meta)  # the NEW entry is a log append too
        self._group.run(meta.txn_id, lambda: Write([(meta, MetadataOp.NEW, None)], meta, written))

    def persist(self, txn_id: TxnID) -> TxnMeta:
        """Write the NEW entry of a transaction begun lazily now (a no-op once it is in the log):
        for callers that need other processes to see it before it registers anything."""
        with self._lock:
            meta = self._require(txn_id)
            if txn_id.least_bits in self._unwritten:
                self._write_new(meta)
            return meta

    def defer_subscriptions(self, txn_id: TxnID, subscriptions: Iterable[Subscription]) -> TxnMeta | None:
        """Note ``subscriptions`` on a transaction begun lazily here that the log does not hold yet,
        in memory only: its first log write (an ADD_PARTITION, a keep-alive, or its decision) lists
        them. Returns the noted metadata, or None when the log holds the transaction (or may: a
        write of it had an unknown outcome), in which case the caller registers them the ordinary
        way. Saves the registration commit before an acknowledgement-only transaction's pending
        acks; recovery finds those pending acks through the deadline they carry instead
        (:meth:`fence_unregistered`)."""
        subs = frozenset(subscriptions)
        with self._lock:
            least = txn_id.least_bits
            meta = self._unwritten.get(least) if txn_id.most_bits == self.tc_id else None
            if meta is None or self.txlog.get(least) is not None:
                return None
            if meta.transaction_key is not None or meta.partitions:
                return None
            _check_usable(meta)
            if not subs <= meta.subscriptions:
                meta = replace(meta, subscriptions=meta.subscriptions | subs)
                self._unwritten[least] = meta
            return meta

    def fence_unregistered(self, txn_id: TxnID, deadline_ms: int, now: int | None = None) -> TxnMeta | None:
        """Decide a transaction the log does not hold but whose pending acks a subscription holds
        with ``deadline_ms`` (an acknowledgement-only transaction that registers with its decision):
        once its deadline plus ``max_clock_skew_ms`` has passed, log ABORTED for it, conditional on
        the log still not holding it, exactly like an admin abort of an unregistered id. Its owner's
        decision is a compare-and-set on the same entry, so at most one of the two lands; a fence
        that loses returns the owner's entry. The fence is never trimmed (``FENCE_PROPERTY``).

        Returns the transaction's entry (the fence, or what the log holds), or None while the
        transaction may still be open (its deadline has not passed, or it lives in this process)
        or the id was never issued. The id may lie at or below the trim mark: a transaction that
        finished having acknowledged here listed this subscription in its first entry, and its
        participant call ended these pending acks before its final entry, so pending acks with a
        deadline never belong to a finished transaction."""
        now = now_ms() if now is None else now
        least = txn_id.least_bits
        if txn_id.most_bits != self.tc_id:
            raise TransactionNotFound(f"transaction {txn_id} does not belong to TC {self.tc_id}")
        with self._lock:
            if least in self._unwritten:
                return None  # begun in this process and alive: its owner ends it (or the sweep)
            self.txlog.refresh()
            held = self.txlog.get(least)
            if held is not None:
                return held
            if least > self.txlog.counter or now <= deadline_ms + self.config.max_clock_skew_ms:
                return None
        reason = (f"{REASON_TIMEOUT}: its pending acknowledgements outlived its deadline ({deadline_ms}) before it "
                  "registered anything")
        meta, fenced = self._log_fence(txn_id, reason, "pending-ack", "timeout")
        if not fenced:
            return meta  # its owner decided first (or another fence landed): follow it
        log.info("TC %d: %s held pending acks past its deadline and was not in the log; logged ABORTED to "
                 "fence its owner", self.tc_id, txn_id)
        return meta

    def _log_fence(self, txn_id: TxnID, reason: str | None, source: str, event: str) -> tuple[TxnMeta, bool]:
        """Log ABORTED for an id the log does not hold, conditional on its still not holding it,
        marked ``FENCE_PROPERTY`` (never trimmed: an owner that never wrote the id learns of the
        fence only from it). The owner's first write is a compare-and-set on the same entry, so at
        most one of the two lands. Returns the entry the log then holds, and whether it is the fence."""
        t = now_ms()
        fence = TxnMeta(txn_id, TxnStatus.ABORTED, 0, t, t, reason=reason, properties={FENCE_PROPERTY: source})

        def plan() -> Done | Write:
            self.txlog.refresh()
            held = self.txlog.get(txn_id.least_bits)
            if held is not None:
                return Done(held)
            return Write([(fence, MetadataOp.NEW, None)], fence, lambda: self._emit(event, fence))

        meta = self._group.run(txn_id, plan)
        return meta, meta is fence

    def get(self, txn_id: TxnID, refresh: bool = False) -> TxnMeta:
        with self._lock:
            if refresh:
                self.txlog.refresh()
            return self._require(txn_id)

    def check_usable(self, txn_id: TxnID) -> TxnMeta:
        """Fail fast when a transaction can no longer take sends or acks (fenced, timed out, ended).
        Usually answered without the TC's lock (:meth:`_latest`); else a request of the group
        commit that writes nothing: the checks of transactions in flight together share one
        re-read of the log (``before``)."""
        meta = self._latest(txn_id)
        if meta is not None:
            return _usable(meta)

        def plan() -> Done:
            return Done(_usable(self._require(txn_id)))

        return self._group.run(txn_id, plan, before=True)

    def _latest(self, txn_id: TxnID) -> TxnMeta | None:
        """The transaction as the log holds it now, read without the TC's lock (which a commit in
        flight holds for its round trip), or None when that cannot be told so: the rows in memory
        are the log as of version V, and the next version's absence, probed after reading them,
        makes V the latest then. One probe, the cost of the refresh it replaces."""
        if txn_id.most_bits != self.tc_id:
            return None
        log_ = self.txlog.log
        version = log_.version
        if not log_.settled():
            return None
        least = txn_id.least_bits
        meta = self.txlog.peek(least) or self._unwritten.get(least)
        nxt = log_.next_commit()
        if meta is None or nxt is None or nxt.version != version or not log_.settled():
            return None  # a commit landed meanwhile (ours or a read one): the locked path
        try:
            if nxt.arrived():
                return None
        except Exception:
            return None  # the locked path re-reads, and reports a storage error itself
        return meta

    def add_partitions(self, txn_id: TxnID, partitions: Iterable[str]) -> TxnMeta:
        parts = set(partitions)

        def prepare(meta: TxnMeta):
            _check_usable(meta)
            new = meta.with_partitions(parts, now_ms())  # only OPEN accepts it, even a repeat (PIP-31)
            if parts <= meta.partitions:
                return None  # set semantics: a repeat is a no-op
            return new, MetadataOp.ADD_PARTITION

        return self._cas(txn_id, prepare)

    def add_subscriptions(self, txn_id: TxnID, subscriptions: Iterable[Subscription]) -> TxnMeta:
        subs = set(subscriptions)

        def prepare(meta: TxnMeta):
            _check_usable(meta)
            new = meta.with_subscriptions(subs, now_ms())  # only OPEN accepts it, even a repeat (PIP-31)
            if subs <= meta.subscriptions:
                return None
            return new, MetadataOp.ADD_SUBSCRIPTION

        return self._cas(txn_id, prepare)

    def extend(self, txn_id: TxnID, timeout_ms: int) -> TxnMeta:
        """Move an OPEN transaction's deadline to ``timeout_ms`` from now: the keep-alive of a
        transaction whose owner is still working on it (a Spark driver's micro-batch or job),
        so its own timeout can stay short enough to free readers soon after the owner dies.

        A compare-and-set on the transaction's entry, like every status change: a concurrent
        decision (a commit, a reader aborting it as expired) wins or loses whole. An extension
        never resurrects anything: a transaction already past its deadline at the compare-and-set
        raises ExpiredTransactionError (whoever looks next aborts it), one no longer OPEN raises
        InvalidTxnStatusError. The deadline only moves forward.

        "Now" is :meth:`keep_alive_now`, not the wall clock alone: after this host's clock steps
        back, the wall clock would put the new deadline below the current one, and the extension
        would write nothing while its owner lives."""
        if timeout_ms < 1:
            raise ValueError(f"timeout_ms={timeout_ms}: must be >= 1")
        used: list[tuple[int, float]] = []

        def prepare(meta: TxnMeta):
            _check_usable(meta)  # fenced/timed out, or OPEN past its deadline: ExpiredTransactionError
            if meta.status is not TxnStatus.OPEN:
                raise InvalidTxnStatusError(f"cannot extend transaction {txn_id}: it is {meta.status.value}"
                                            + (f" ({meta.reason})" if meta.reason else "")
                                            + ", and only OPEN transactions can be kept alive")
            mono = monotonic_ms()
            t = self.keep_alive_now(txn_id, mono)
            if meta.expired(t):  # past it by the step-proof clock, whatever a stepped-back wall clock says
                raise _expired(meta, "it passed its timeout")
            used[:] = [(t, mono)]
            wanted = t + int(timeout_ms) - meta.start_ms
            if wanted <= meta.timeout_ms:
                return None  # the deadline is already that far: nothing to write
            return replace(meta, timeout_ms=wanted, last_modified_ms=t, seq=meta.seq + 1), MetadataOp.UPDATE

        out = self._cas(txn_id, prepare)
        if used:
            self._remember_clock(txn_id, *used[0])
        return out

    def keep_alive_now(self, txn_id: TxnID, mono: float | None = None) -> int:
        """This process's "now" for ``txn_id``'s deadline, proof against steps of its wall clock:
        the wall clock while it agrees with the time of the transaction's begin or last extension
        here plus the monotonic time since, else that count (the wall clock for a transaction this
        process has not begun or extended). The keep-alive judges whether an extension is due by
        it too, since the wall clock of a host that stepped back an hour finds nothing due for an
        hour."""
        wall = now_ms()
        base = self._clock_bases.get(txn_id.least_bits)
        if base is None or txn_id.most_bits != self.tc_id:
            return wall
        ms, then = base
        counted = ms + int((monotonic_ms() if mono is None else mono) - then)
        # Within CLOCK_STEP_MS the wall clock is taken as it is (rounding, slewing): only a step
        # is counted past.
        return wall if abs(wall - counted) <= CLOCK_STEP_MS else counted

    def _remember_clock(self, txn_id: TxnID, ms: int, mono: float) -> None:
        bases = self._clock_bases  # no lock: single dict operations
        bases.pop(txn_id.least_bits, None)  # re-inserted last: the oldest stays first
        bases[txn_id.least_bits] = (ms, mono)
        while len(bases) > CLOCK_BASES_KEPT:
            try:
                bases.pop(next(iter(bases)))
            except (StopIteration, KeyError, RuntimeError):  # another thread changed it meanwhile
                break

    def end_transaction(self, txn_id: TxnID, action: TxnAction, *, commit_entries=None, reason: str | None = None,
                        owner: str | None = None, admin: bool = False, properties: dict[str, str] | None = None,
                        before_participants: Callable[[TxnMeta], None] | None = None,
                        background: bool = False, subscriptions: Iterable[Subscription] = ()) -> TxnMeta:
        """Log COMMITTING/ABORTING (the decision), apply it on every participant in parallel, then
        log COMMITTED/ABORTED. Repeating the same action is safe; the opposite one is refused.
        ``properties`` are recorded in the deciding entry itself (e.g. a streaming batch id), so
        they are durable exactly when the outcome is.

        ``background``: return at the decision, leaving the participants and the final entry to
        the completer (the client's commit). Everyone already sees the outcome: a reader resolves a
        transaction without a marker through this log.

        ``subscriptions``: ones the transaction acknowledged on without registering them
        (:meth:`defer_subscriptions`), listed in the deciding entry if the log lacks them, so the
        participant calls end their pending acks. For a transaction the log does not hold yet, that
        entry is written with its NEW entry in one compare-and-set: one commit for all three."""
        deferred = frozenset(subscriptions)
        self._clock_bases.pop(txn_id.least_bits, None)  # a deciding transaction is kept alive no more
        if action is TxnAction.COMMIT and not admin:
            self._check_epoch(txn_id)
        if admin and action is TxnAction.ABORT:
            fenced = self._abort_unwritten(txn_id, reason)
            if fenced is not None:
                return fenced

        def decide(meta: TxnMeta):
            # As Pulsar's TC: a transaction with an owner ends only by that owner's hand, or by an
            # admin; an owner-less client (owner "") is not a wildcard. Owner-less transactions are
            # anyone's. owner=None is an in-process protocol step (recovery, Spark commit protocols)
            # acting on a transaction it created itself.
            if not admin and owner is not None and meta.owner and owner != meta.owner:
                abort = cli_command(self.root, "transactions", "abort", f"{txn_id.most_bits}:{txn_id.least_bits}")
                raise NotAllowedError(f"transaction {txn_id} belongs to owner {meta.owner!r}, not {owner!r}: "
                                      f"only its owner may end it (an admin may abort it: `{abort}` "
                                      "or admin.transactions.abort_transaction)")
            if meta.status is TxnStatus.OPEN and action is TxnAction.COMMIT and meta.expired(now_ms()):
                raise _expired(meta, "it passed its timeout")
            try:
                proceed = end_request(meta, action)
            except InvalidTxnStatusError:
                if meta.reason and (meta.reason.startswith(REASON_FENCED) or meta.reason.startswith(REASON_TIMEOUT)):
                    raise _expired(meta, meta.reason) from None
                raise
            if not proceed:
                return None
            changes = {}
            if not deferred <= meta.subscriptions:
                changes["subscriptions"] = meta.subscriptions | deferred
            if properties:
                changes["properties"] = {**meta.properties, **properties}
            if action is TxnAction.COMMIT and commit_entries is not None:
                changes["commit_entries"] = tuple((str(p), int(a), int(b)) for p, a, b in commit_entries)
            return meta.transition(action.ending_status, now_ms(), reason, **changes), MetadataOp.UPDATE

        if before_participants is None:
            # No participant at all: the decision and the completion are one atomic log write
            # (two entries, COMMITTING/ABORTING then COMMITTED/ABORTED), saving a round trip.
            final = self._cas(txn_id, lambda m: _decide_and_finish(m, decide))
            if final.status.is_final:
                self._emit(final.status.value.lower(), final)
                return final
            meta = final
        else:
            meta = self._cas(txn_id, decide)
        if meta.status.is_final:
            return meta
        if before_participants is not None:
            before_participants(meta)
        if background and self.completer is not None:
            self.completer.submit(self, meta)
            return meta
        return self._complete_or_adopt(meta)

    def _abort_unwritten(self, txn_id: TxnID, reason: str | None) -> TxnMeta | None:
        """An admin abort of an issued TxnID that is not in the log: either its owner began it in
        another process and has registered nothing yet, so only that process knows it, or it
        finished and its entry was trimmed. Only the first may be decided here: writing ABORTED
        for it fences the owner (its first registration is a compare-and-set on the same key and
        now fails). The log's trim mark tells them apart: an id above it cannot have been trimmed.
        One at or below it may have committed, and re-deciding it would hide committed data, so
        it is refused. The fence entry is never trimmed (``FENCE_PROPERTY``): its owner, which
        never wrote the id, learns of the fence only from it, however late it comes to register.
        Returns None when the log has the transaction (the ordinary path ends it)."""
        with self._lock:
            if txn_id.most_bits != self.tc_id or txn_id.least_bits in self._unwritten:
                return None
            self.txlog.refresh()
            if self.txlog.get(txn_id.least_bits) is not None or txn_id.least_bits > self.txlog.counter:
                return None
            if txn_id.least_bits <= self.txlog.trimmed_through:
                raise TransactionNotFound(
                    f"transaction {txn_id} is not in TC {self.tc_id}'s log and may have finished: TC {self.tc_id} "
                    f"has trimmed finished transactions up to id {self.txlog.trimmed_through} "
                    "(finished_retention_ms), so its outcome is no longer the TC's to report; refusing to abort "
                    "it. The commit or abort markers in the partitions it wrote hold its outcome")
        meta, fenced = self._log_fence(txn_id, reason, "admin", "aborted")
        if not fenced:
            return None  # its owner registered meanwhile: end it the ordinary way
        log.info("TC %d: %s was not in the log (it had registered nothing); logged ABORTED to fence its owner",
                 self.tc_id, txn_id)
        return meta

    def _check_epoch(self, txn_id: TxnID) -> None:
        """A keyed transaction commits only while its epoch is the key's current one (Kafka's
        producer epoch). A newer claim fences the transaction on this same TC entry, and the commit's
        decision is a compare-and-set on it, so at most one of the two wins; this check also refuses a
        commit whose fence has not run yet (the claimant died, or its fence failed)."""
        # A transaction's key never changes, so the row as last read tells a keyless one without
        # the TC's lock (which a commit in flight holds for its round trip).
        hint = self._unwritten.get(txn_id.least_bits) or self.txlog.peek(txn_id.least_bits)
        if hint is not None and hint.txn_id == txn_id and hint.transaction_key is None:
            return
        with self._lock:
            meta = self._require(txn_id)
        if meta.transaction_key is None or meta.epoch is None or meta.status is not TxnStatus.OPEN:
            return
        keys = self.keys if self._key_home is None else self._key_home(full_key(meta.owner, meta.transaction_key))
        current = keys.current_epoch(meta.owner, meta.transaction_key)
        if current == meta.epoch:
            return
        reason = f"{REASON_FENCED}: transaction key {meta.transaction_key!r} is at epoch {current}"
        self.fence(txn_id, reason)
        raise _expired(self.get(txn_id), reason)

    def _complete(self, meta: TxnMeta) -> TxnMeta:
        """Roll a decided transaction forward: participants, then the final status."""
        action = TxnAction.COMMIT if meta.status is TxnStatus.COMMITTING else TxnAction.ABORT
        failures = end_on_participants(self.root, meta, action)
        if failures:
            return meta  # stays decided; recovery retries (PIP-31's TransactionOpRetryTimer)

        written: list[TxnMeta] = []  # the final records this call asked for

        def finish(m: TxnMeta):
            if m.status.is_final:
                return None
            written.append(m.transition(action.final_status, now_ms()))
            return written[-1], MetadataOp.UPDATE

        try:
            final = self._cas(meta.txn_id, finish)
        except Exception as e:
            # The outcome was decided (durably) and applied everywhere; only the bookkeeping record
            # failed. Raising would report a decided transaction as failed (a Spark job would look
            # failed while its data commits, and a re-run would write it twice): recovery writes it.
            log.log(failure_level(), "TC %d: %s is %s on every participant, but its final record could not be "
                    "written (recovery writes it): %s", self.tc_id, meta.txn_id, meta.status.value, e)
            return meta
        if final in written:
            # Counted by the process whose final record this is: another one's completion (a
            # sweep, an adopted or repeated one) finding it final adds nothing (counts are summed).
            self._emit(final.status.value.lower(), final)
        return final

    # ---- expiration and recovery ---------------------------------------------------------------
    def sweep(self, now: int | None = None, grace_ms: int | None = None) -> SweepResult:
        """Abort expired OPEN transactions and finish COMMITTING/ABORTING ones (PIP-31
        "TC Transaction Expiration"). Safe to run from any number of processes at once."""
        now = now_ms() if now is None else now
        grace = self.config.recovery_grace_ms if grace_ms is None else grace_ms
        res = SweepResult()
        with self._lock:
            self.txlog.refresh()
            metas = self.txlog.all()
            # Begun here, never registered, past their timeout: nothing of them exists to abort,
            # unless they acknowledged (``defer_subscriptions``): those are aborted below, which
            # writes them with their subscriptions and returns their pending acks at once.
            dead_acks = []
            for least, m in list(self._unwritten.items()):
                if m.expired(now):
                    if m.subscriptions:
                        dead_acks.append(m)
                    else:
                        del self._unwritten[least]
        for m in dead_acks:
            try:
                self.abort_expired(m.txn_id, now)
                res.timed_out += 1
            except (InvalidTxnStatusError, TransactionNotFound):
                continue  # fenced meanwhile: the fence stands
            except Exception as e:
                res.failed += 1
                log.warning("TC %d sweep: %s failed: %s", self.tc_id, m.txn_id, e)
        for meta in metas:
            try:
                if meta.expired(now):
                    self.abort_expired(meta.txn_id, now)
                    res.timed_out += 1
                elif meta.status in (TxnStatus.COMMITTING, TxnStatus.ABORTING) and now - meta.last_modified_ms >= grace:
                    if not self._complete_or_adopt(self.get(meta.txn_id)).status.is_final:
                        res.failed += 1  # retried here a second later, not left to the next opener
                    else:
                        res.completed += 1
                elif meta.status in (TxnStatus.COMMITTING, TxnStatus.ABORTING):
                    # Within its grace its decider is normally writing the markers; a sweep that
                    # only runs once (a client opening the TC) must still finish it if it did not.
                    self.adopt(meta, grace_ms=grace)
            except (InvalidTxnStatusError, TransactionNotFound):
                continue  # someone else moved it on first
            except Exception as e:
                res.failed += 1
                log.warning("TC %d sweep: %s failed: %s", self.tc_id, meta.txn_id, e)
        return res

    def _complete_or_adopt(self, meta: TxnMeta) -> TxnMeta:
        """:meth:`_complete` where no completer queue holds the transaction (a Spark job's commit,
        a timeout or fencing abort): one that stays decided is retried by this process's completer
        while it lives, as a client's own is, not left until some other process sweeps its TC."""
        final = self._complete(meta)
        if not final.status.is_final:
            # A second from now, as after a completer's failed round: a short-lived process (the
            # CLI) exits first rather than wait at exit for a try against storage that just failed.
            self.adopt(final, grace_ms=now_ms() - final.last_modified_ms + 1_000)
        return final

    def adopt(self, meta: TxnMeta, grace_ms: int | None = None) -> None:
        """Have this process's completer finish ``meta`` (COMMITTING/ABORTING) once its decision
        is ``grace_ms`` old (default ``recovery_grace_ms``), unless it is final by then: how a
        process that met a decided transaction (a sweep, a reader) finishes one whose decider
        stopped trying, without a coordinator service sweeping."""
        if self.completer is None or meta.status not in (TxnStatus.COMMITTING, TxnStatus.ABORTING):
            return
        grace = self.config.recovery_grace_ms if grace_ms is None else grace_ms
        self.completer.adopt(self, meta, meta.last_modified_ms + grace)

    def abort_expired(self, txn_id: TxnID, now: int | None = None) -> TxnMeta:
        """Abort an OPEN transaction past its timeout at ``now`` (default: the clock), for the
        sweeper or reader-side resolution."""
        def decide(meta: TxnMeta):
            if meta.status is not TxnStatus.OPEN or not meta.expired(now_ms() if now is None else now):
                return None
            return meta.transition(TxnStatus.ABORTING, now_ms(), REASON_TIMEOUT), MetadataOp.UPDATE

        meta = self._cas(txn_id, decide)
        if meta.status is TxnStatus.ABORTING:
            if meta.reason == REASON_TIMEOUT:
                self._emit("timeout", meta)
            return self._complete_or_adopt(meta)
        return meta

    def fence(self, txn_id: TxnID, reason: str) -> TxnMeta:
        """Abort an OPEN transaction because its transaction key moved to a newer epoch."""
        def decide(meta: TxnMeta):
            if meta.status is not TxnStatus.OPEN:
                return None
            return meta.transition(TxnStatus.ABORTING, now_ms(), reason), MetadataOp.UPDATE

        meta = self._cas(txn_id, decide)
        return self._complete_or_adopt(meta) if meta.status is TxnStatus.ABORTING else meta

    def change_lease(self, change: Callable[[TcLease | None], TcLease | None]) -> tuple[TcLease | None, bool]:
        """Compare-and-set on this TC's lease row (:meth:`TransactionLog.change_lease`)."""
        with self._lock:
            return self.txlog.change_lease(change)

    def refresh(self) -> None:
        """Catch up with the log (one probe when nothing changed): decisions of other processes."""
        with self._lock:
            self.txlog.refresh()

    def transactions(self, refresh: bool = True) -> list[TxnMeta]:
        with self._lock:
            if refresh:
                self.txlog.refresh()
            return self.txlog.all()


def _decide_and_finish(meta: TxnMeta, decide):
    """``decide``'s transition, plus the final one when the transaction has no participants."""
    prepared = decide(meta)
    if prepared is None:
        return prepared
    decided, op = prepared
    if decided.partitions or decided.subscriptions:
        return prepared
    action = TxnAction.COMMIT if decided.status is TxnStatus.COMMITTING else TxnAction.ABORT
    return [(decided, op), (decided.transition(action.final_status, now_ms()), MetadataOp.UPDATE)], op


def _expired(meta: TxnMeta, why: str) -> ExpiredTransactionError:
    if why.startswith(REASON_FENCED):
        return TransactionFenced(f"transaction {meta.txn_id} was fenced ({why}) and aborted: a newer client or run "
                                 "holds its transaction key; this one may not commit")
    return ExpiredTransactionError(f"transaction {meta.txn_id} is expired: {why}; begin a new transaction")


def _usable(meta: TxnMeta) -> TxnMeta:
    """``meta`` when it can take sends and acks; raises why not."""
    _check_usable(meta)
    if meta.status is not TxnStatus.OPEN:
        raise InvalidTxnStatusError(f"transaction {meta.txn_id} is {meta.status.value}; only OPEN transactions "
                                    "accept sends and acks")
    return meta


def _check_usable(meta: TxnMeta) -> None:
    """Send/ack on a transaction: a fenced or timed-out one raises ExpiredTransactionError."""
    if meta.status is not TxnStatus.OPEN and meta.reason and (
            meta.reason.startswith(REASON_FENCED) or meta.reason.startswith(REASON_TIMEOUT)):
        raise _expired(meta, meta.reason)
    if meta.status is TxnStatus.OPEN and meta.expired(now_ms()):
        raise _expired(meta, "it passed its timeout")
