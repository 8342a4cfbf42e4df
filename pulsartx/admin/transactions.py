"""``client.admin.transactions``: mirrors ``pulsar-admin transactions``."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from pulsartx.admin.host import AdminHost
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.state import key_txn, txn_key
from pulsartx.coordinator.coordinator import REASON_ADMIN_ABORT
from pulsartx.coordinator.keys import full_key, key_segments
from pulsartx.coordinator.state import TxnAction, TxnMeta, TxnStatus
from pulsartx.coordinator.tclog import FENCE_PROPERTY, tc_segments
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import InvalidConfiguration, PulsarException, TransactionNotFound
from pulsartx.log.partition import PartitionLog
from pulsartx.observe.failures import one_line, unreadable_row
from pulsartx.subscription.cursor import CursorState
from pulsartx.subscription.store import SubscriptionStore, end_transaction

log = logging.getLogger(__name__)
T = TypeVar("T")


def open_duration_ms(m: TxnMeta, now_ms: int) -> int:
    """How long the transaction has been unfinished: from its begin to its COMMITTED/ABORTED entry
    (that entry's modification time), else to ``now_ms``. An ended transaction's figure thus comes
    from its TC entry alone and stays the same however late it is asked for. A COMMITTING/ABORTING
    one still counts as unfinished, as in ``slow-transactions``: its markers or pending acks are
    not all written yet, and a stuck one should show its growing age."""
    end = m.last_modified_ms if m.status.is_final else now_ms
    return max(0, end - m.start_ms)


def meta_dict(m: TxnMeta, now_ms: int | None = None) -> dict[str, Any]:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return {
        "txn_id": str(m.txn_id), "coordinator_id": m.txn_id.most_bits, "status": m.status.value,
        "open_duration_ms": open_duration_ms(m, now_ms), "timeout_ms": m.timeout_ms, "start_time_ms": m.start_ms,
        "last_modification_time_ms": m.last_modified_ms, "partitions": sorted(m.partitions),
        "subscriptions": sorted(str(s) for s in m.subscriptions), "owner": m.owner,
        "transaction_key": m.transaction_key, "epoch": m.epoch, "reason": m.reason,
        "commit_entries": None if m.commit_entries is None else [list(e) for e in m.commit_entries],
        "properties": dict(m.properties),
    }


class TransactionsAdmin:
    def __init__(self, client: AdminHost):
        self.client = client

    def _tcs(self):
        return self.client._coordinators()

    def _each_tc(self, what: str, step: Callable[[Any], T],
                 ids: Iterable[int] | None = None) -> Iterator[tuple[int, T | None, str | None]]:
        """(TC id, ``step(tc)``, None) per TC, or (TC id, None, its error on one line) for a TC
        whose log cannot be read, logged at WARNING naming the TC and ``what`` shows it so: one
        damaged log must not hide every other TC from the views an operator needs then."""
        for tc_id, r in self._tcs().each(step, ids):
            if isinstance(r, Exception):
                error = one_line(r)
                log.warning("TC %d's log cannot be read; %s list it without figures: %s", tc_id, what, error)
                yield tc_id, None, error
            else:
                yield tc_id, r, None

    def get_coordinator_stats(self) -> list[dict[str, Any]]:
        """Per TC: open/committing/aborting counts, the TxnID counter and the log's size. A TC
        whose log cannot be read has state ``Unreadable``, its ``error`` and no figures; one no
        client has used yet is ``Unused``, with zero counts (its log is not created by looking)."""
        tcs = self._tcs()
        read = {tc_id: (row, error) for tc_id, row, error in self._each_tc("coordinator stats", _coordinator_stats,
                                                                           tcs.used())}
        out = []
        for tc_id in range(tcs.count):
            row, error = read.get(tc_id, (None, None))
            if error is not None:
                row = _unreadable_row(COORDINATOR_STATS_KEYS, tc_id, "state", error)
            elif row is None:  # no client has used it: nothing in it, and nothing created by looking
                row = {**dict.fromkeys(COORDINATOR_STATS_KEYS, 0), "coordinator_id": tc_id, "state": "Unused",
                       "low_water_mark": -1, "log_version": None, "log_entries_since_snapshot": None}
            out.append(row)
        return out

    def list_coordinators(self) -> list[dict[str, Any]]:
        """Every TC of the root (``pulsar-admin transactions coordinators-list``): where its log and
        transaction-key tables live, what it holds, and which process holds its lease (the one
        beginning its transactions there, as a broker owns a TC in Pulsar; the expiry is on that
        process's clock). A TC no client has used yet has no tables; it is listed as ``Unused`` and
        left so (nothing is created here). One whose log cannot be read is ``Unreadable``, with
        its ``error``."""
        tcs = self._tcs()
        read = {tc_id: (info, error) for tc_id, info, error in self._each_tc("coordinators-list", _coordinator_info,
                                                                               tcs.used())}
        out = []
        for tc_id in range(tcs.count):
            row: dict[str, Any] = {"coordinator_id": tc_id, "state": "Unused",
                                   "log": self.client.root.uri(*tc_segments(tc_id)),
                                   "transaction_keys": self.client.root.uri(*key_segments(tc_id)),
                                   "active_txns": 0, "last_txn_id": None, "txn_ids_reserved": 0,
                                   "lease_owner": None, "lease_expires_ms": None}
            info, error = read.get(tc_id, (None, None))
            if error is not None:
                row.update(state=UNREADABLE, active_txns=None, txn_ids_reserved=None, error=error)
            elif info is not None:
                row.update(info)
            out.append(row)
        return out

    def get_transaction_metadata(self, txn_id: TxnID | str) -> dict[str, Any]:
        """What the TC log holds about the transaction (``pulsar-admin transactions
        transaction-metadata``). ``open_duration_ms`` runs until the transaction has ended and is
        fixed from then on: begin to its COMMITTED/ABORTED entry (see :func:`open_duration_ms`)."""
        t = TxnID.parse(txn_id)
        tcs = self._tcs()
        if 0 <= t.most_bits < tcs.count and not tcs.is_used(t.most_bits):  # looking must not create its log
            raise TransactionNotFound(f"transaction {t} was never issued by TC {t.most_bits}")
        return meta_dict(tcs.for_txn(t).get(t, refresh=True))

    def get_slow_transactions(self, timeout_ms: int) -> list[dict[str, Any]]:
        """Transactions still unfinished after ``timeout_ms`` (Pulsar's ``slow-transactions``)."""
        if not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise InvalidConfiguration(f"timeout_ms={timeout_ms!r}: must be a non-negative integer")
        now = int(time.time() * 1000)
        return self._listing("slow-transactions", lambda m: not m.status.is_final and now - m.start_ms >= timeout_ms,
                             now)

    def list_transactions(self, statuses: Iterable[TxnStatus | str] | None = None,
                          older_than_ms: int = 0) -> list[dict[str, Any]]:
        """Transactions the TC logs hold, oldest TxnID first: by default the unfinished ones (OPEN,
        COMMITTING, ABORTING), the ones that can still hold a partition's maxReadPosition back or
        keep acknowledgements pending. ``statuses`` picks others; COMMITTED and ABORTED ones are
        listed only while their TC log still holds them. ``older_than_ms`` keeps those begun at
        least that long ago (their age, not ``open_duration_ms``, so an ended one qualifies too)."""
        wanted = _statuses(statuses)
        if not isinstance(older_than_ms, int) or isinstance(older_than_ms, bool) or older_than_ms < 0:
            raise InvalidConfiguration(f"older_than_ms={older_than_ms!r}: must be a non-negative integer")
        now = int(time.time() * 1000)
        return self._listing("transaction listings", lambda m: m.status in wanted and now - m.start_ms >= older_than_ms,
                             now)

    def _listing(self, what: str, keep: Callable[[TxnMeta], bool], now: int) -> list[dict[str, Any]]:
        """The transactions ``keep`` picks from every TC log, oldest TxnID first, after one row
        per TC whose log cannot be read (status ``UNREADABLE``, its ``error``): what it holds is
        unknown, so the listing says it is incomplete rather than leave that TC out silently."""
        metas: list[TxnMeta] = []
        unreadable = []
        tcs = self._tcs()
        for tc_id, held, error in self._each_tc(what, lambda tc: tc.transactions(), tcs.used()):
            if error is not None:
                unreadable.append(_unreadable_row(META_KEYS, tc_id, "status", error))
            else:
                metas.extend(m for m in held if keep(m))
        return unreadable + [meta_dict(m, now) for m in sorted(metas, key=lambda m: m.txn_id)]

    def abort_transaction(self, txn_id: TxnID | str) -> dict[str, Any]:
        """Admin override: abort whatever the owner, recorded in the TC log with reason 'admin abort'."""
        t = TxnID.parse(txn_id)
        meta = self._tcs().for_txn(t).end_transaction(t, TxnAction.ABORT, reason=REASON_ADMIN_ABORT, admin=True)
        if FENCE_PROPERTY in meta.properties and not meta.subscriptions:
            self._return_unregistered_acks(t)
        return meta_dict(meta)

    def _return_unregistered_acks(self, t: TxnID) -> None:
        """After fencing an id the log did not hold: return at once the pending acks it may have
        made as an acknowledgement-only transaction (they carry its deadline), as the participant
        calls do for a registered one. Its subscriptions are listed nowhere, so every
        subscription partition's cursor is read: an operator action, rare and bounded by the
        root's subscriptions. Whatever this misses (a failure) the next consumer's check returns."""
        k = txn_key(t.most_bits, t.least_bits)
        admin = self.client.admin
        for topic in admin.list_topics():
            for sub in admin.list_subscriptions(topic):
                for p in admin.partitions_of(topic):
                    try:
                        store = SubscriptionStore(self.client.root, p, sub)
                        c = store.cursor() if store.exists() else None
                        if c is not None and k in c.deadlines:
                            end_transaction(self.client.root, str(p), sub, t, TxnAction.ABORT)
                    except PulsarException as e:
                        log.warning("returning the pending acks of fenced %s on %s %r failed (the next consumer "
                                    "check returns them): %s", t, p, sub, e)

    def sweep(self, grace_ms: int | None = None) -> dict[str, int]:
        """Run one expiration/recovery pass over every TC (what ``coordinator run`` does periodically)."""
        total = {"timed_out": 0, "completed": 0, "failed": 0}
        error: Exception | None = None
        for _, r in self._tcs().each(lambda tc: tc.sweep(grace_ms=grace_ms)):
            if isinstance(r, Exception):  # the other TCs are swept all the same; the first failure is raised after
                error = error or r
                continue
            total["timed_out"] += r.timed_out
            total["completed"] += r.completed
            total["failed"] += r.failed
        if error is not None:
            raise error
        return total

    # ---- transaction buffer ------------------------------------------------------------------------
    def get_transaction_buffer_stats(self, topic: str) -> list[dict[str, Any]]:
        """Per partition: state, maxReadPosition, ongoing and aborted counts, last snapshot offset."""

        return [TransactionBuffer(PartitionLog(self.client.root, p)).stats()
                for p in self.client.admin.partitions_of(topic)]

    def get_transaction_in_buffer_stats(self, txn_id: TxnID | str, topic: str) -> list[dict[str, Any]]:
        """Where one transaction stands in each partition of ``topic``: ONGOING (with its first
        offset), COMMITTED/ABORTED (with the marker offset), or NONE."""

        t = TxnID.parse(txn_id)
        k = txn_key(t.most_bits, t.least_bits)
        out = []
        for p in self.client.admin.partitions_of(topic):
            s = TransactionBuffer(PartitionLog(self.client.root, p)).state()
            if k in s.ongoing:
                row = {"state": "ONGOING", "startPosition": s.ongoing[k], "markerPosition": None}
            elif k in s.ended:
                row = {"state": "ABORTED" if k in s.aborted else "COMMITTED", "startPosition": None,
                       "markerPosition": s.ended[k]}
            else:
                row = {"state": "NONE", "startPosition": None, "markerPosition": None}
            out.append({"partition": str(p), "txn_id": str(t), **row})
        return out

    # ---- pending acks ------------------------------------------------------------------------------
    def _cursors(self, topic: str, subscription: str) -> dict[str, CursorState]:
        """The live cursors of ``subscription`` by partition name; raises SubscriptionNotFound,
        naming the subscription, the topic and how to list its subscriptions, when there is none."""
        return {str(store.partition): c for store, c in self.client.admin._subscription_stores(topic, subscription)}

    def get_pending_ack_stats(self, topic: str, subscription: str) -> list[dict[str, Any]]:
        """Per partition: the cursor position and what is in PENDING_ACK, by transaction. A
        subscription that exists on no partition of ``topic`` raises :class:`SubscriptionNotFound`;
        a partition it has no cursor on (subscribed to other partitions only) has state "None"."""

        cursors = self._cursors(topic, subscription)
        out = []
        for p in self.client.admin.partitions_of(topic):
            c = cursors.get(str(p))
            if c is None:
                out.append({"partition": str(p), "subscription": subscription, "state": "None"})
                continue
            txns = {str(TxnID(*key_txn(k))): len(rs) for k, rs in c.pending.items()}
            if c.pending_cumulative is not None:
                txns.setdefault(str(TxnID(*key_txn(c.pending_cumulative[0]))), 0)
            out.append({"partition": str(p), "subscription": subscription, "state": "Ready",
                        "markDeletePosition": c.mark_delete, "individuallyAckedRanges": len(c.acked.ranges()),
                        "pendingAckCount": c.pending_count(), "ongoingTxnCount": len(txns), "transactions": txns,
                        "pendingCumulativeAck": None if c.pending_cumulative is None else
                        {"txn_id": str(TxnID(*key_txn(c.pending_cumulative[0]))),
                         "position": c.pending_cumulative[1]},
                        # Acknowledgement-only transactions their TC log does not list until their
                        # decision, with their deadline (ms): open until then, fenced after it.
                        "unregisteredTransactions": {str(TxnID(*key_txn(k))): d for k, d in c.deadlines.items()}})
        return out

    def get_transaction_in_pending_ack_stats(self, txn_id: TxnID | str, topic: str,
                                             subscription: str) -> list[dict[str, Any]]:
        """Per partition: the offsets ``txn_id`` holds in PENDING_ACK on ``subscription``
        (:class:`SubscriptionNotFound` when it exists on no partition of ``topic``)."""

        t = TxnID.parse(txn_id)
        k = txn_key(t.most_bits, t.least_bits)
        cursors = self._cursors(topic, subscription)
        out = []
        for p in self.client.admin.partitions_of(topic):
            c = cursors.get(str(p))
            rs = c.pending.get(k) if c else None
            cum = c.pending_cumulative[1] if c and c.pending_cumulative and c.pending_cumulative[0] == k else None
            out.append({"partition": str(p), "txn_id": str(t), "subscription": subscription,
                        "pendingAckRanges": [] if rs is None else [list(r) for r in rs.ranges()],
                        "pendingAckCount": 0 if rs is None else len(rs), "cumulativeAckPosition": cum})
        return out

    # ---- transaction keys ------------------------------------------------------------------------
    def list_transaction_keys(self) -> list[dict[str, Any]]:
        tcs = self._tcs()
        return [dict(i.as_dict(), coordinator_id=tc_id) for tc_id in range(tcs.count) for i in tcs.keys_if_any(tc_id)]

    def get_transaction_key(self, transaction_key: str, owner: str | None = None) -> dict[str, Any]:
        tcs = self._tcs()
        k = full_key(owner, transaction_key)
        tc_id = tcs.pick(k)
        for info in tcs.keys_if_any(tc_id):
            if info.transaction_key == transaction_key and (info.owner or None) == owner:
                return dict(info.as_dict(), coordinator_id=tc_id)
        raise InvalidConfiguration(f"transaction key {transaction_key!r} (owner {owner!r}) does not exist")

    def delete_transaction_key(self, transaction_key: str, owner: str | None = None) -> list[str]:
        """Remove the key and abort its transactions; returns the aborted TxnIDs."""
        tcs = self._tcs()
        txns = tcs.keys(tcs.pick(full_key(owner, transaction_key))).delete(owner, transaction_key)
        aborted = []
        for t in txns:
            tc = tcs.for_txn(t)
            try:
                if tc.get(t, refresh=True).status is not TxnStatus.OPEN:
                    continue  # already ended: not this call's doing
                m = tc.fence(t, f"fenced: transaction key {transaction_key!r} deleted")
            except TransactionNotFound:
                continue  # finished long ago and trimmed from the TC log: nothing to abort
            if m.status is TxnStatus.ABORTED:
                aborted.append(str(t))
        return aborted


UNFINISHED = frozenset(s for s in TxnStatus if not s.is_final)
# The state of a TC (coordinator stats, coordinators-list) and the status of its row in a
# transaction listing when its log cannot be read.
UNREADABLE = "Unreadable"
UNREADABLE_STATUS = "UNREADABLE"
COORDINATOR_STATS_KEYS = ("coordinator_id", "state", "ongoing_txn_size", "committing", "aborting",
                          "recently_committed", "recently_aborted", "low_water_mark", "txn_ids_reserved",
                          "log_version", "log_entries_since_snapshot")
META_KEYS = ("txn_id", "coordinator_id", "status", "open_duration_ms", "timeout_ms", "start_time_ms",
             "last_modification_time_ms", "partitions", "subscriptions", "owner", "transaction_key", "epoch",
             "reason", "commit_entries", "properties")


def _unreadable_row(keys: Iterable[str], tc_id: int, state_key: str, error: str) -> dict[str, Any]:
    """A row with the columns of the others, empty, for a TC whose log cannot be read."""
    return unreadable_row(keys, error, coordinator_id=tc_id,
                          **{state_key: UNREADABLE if state_key == "state" else UNREADABLE_STATUS})


def _coordinator_stats(tc: Any) -> dict[str, Any]:
    metas = tc.transactions()
    by = {s: sum(1 for m in metas if m.status is s) for s in TxnStatus}
    return {"coordinator_id": tc.tc_id, "state": "Ready", "ongoing_txn_size": by[TxnStatus.OPEN],
            "committing": by[TxnStatus.COMMITTING], "aborting": by[TxnStatus.ABORTING],
            "recently_committed": by[TxnStatus.COMMITTED], "recently_aborted": by[TxnStatus.ABORTED],
            "low_water_mark": _low_water_mark(metas), "txn_ids_reserved": tc.txlog.counter + 1,
            "log_version": tc.txlog.log.version, "log_entries_since_snapshot": tc.txlog.log.files_since_compaction}


def _coordinator_info(tc: Any) -> dict[str, Any]:
    """A used TC's part of its coordinators-list row."""
    metas = tc.transactions()
    last = max((m.txn_id for m in metas), default=None)
    info: dict[str, Any] = {"state": "Ready", "active_txns": sum(1 for m in metas if not m.status.is_final),
                            "last_txn_id": None if last is None else str(last), "txn_ids_reserved": tc.txlog.counter + 1}
    lease = tc.txlog.lease()  # the process beginning its transactions here, if any
    if lease is not None and not lease.released:
        info.update(lease_owner=lease.owner, lease_expires_ms=lease.expires_ms)
    return info


def _statuses(given: Iterable[TxnStatus | str] | None) -> frozenset[TxnStatus]:
    """``given`` as TxnStatus values (names in any case); None: the unfinished ones."""
    if given is None:
        return UNFINISHED
    out = set()
    for s in given:
        try:
            out.add(s if isinstance(s, TxnStatus) else TxnStatus(str(s).upper()))
        except ValueError:
            raise InvalidConfiguration(f"status {s!r}: use one of {', '.join(t.value for t in TxnStatus)}") from None
    return frozenset(out)


def _low_water_mark(metas: list[Any]) -> int:
    """Pulsar's lowWaterMark: the highest TxnID (least bits) at or below which every transaction
    the log knows has finished (-1 when none has). Ids are reserved in blocks, so the counter is
    not it."""
    unfinished = [m.txn_id.least_bits for m in metas if not m.status.is_final]
    if unfinished:
        return min(unfinished) - 1
    return max((m.txn_id.least_bits for m in metas), default=-1)
