"""The set of TCs under a root: how many there are, which one a client uses, and opening them.

The TC count is fixed when the root is first used (default 16, as in Pulsar) and kept in
``coordinator/_coordinators.json``; TxnIDs carry their TC id, so the count can never shrink.

A transaction with a transaction key goes to the TC its key hashes to (its epochs live there).
Any other begins on the TC this process holds the lease of (``lease.py``): the first such
transaction takes the lease of a free log, trying the logs from one its owner name hashes to on,
and later ones renew it after a third of ``lease_ms``. Processes that share an owner name (the
Python workers of one Spark driver) share its lease: whichever comes first takes it, the others
adopt it. With every log leased by live processes, a process picks
one log at random and shares it by compare-and-set, trying for a lease again a lease period later.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from pulsartx import forks
from pulsartx.coordinator.completer import Completer
from pulsartx.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator, now_ms
from pulsartx.coordinator.keys import TransactionKeyInfo, TransactionKeyStore, key_segments
from pulsartx.coordinator.lease import TcLease
from pulsartx.coordinator.tclog import tc_segments
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import InvalidConfiguration, StorageError, TransactionCoordinatorNotFoundError
from pulsartx.storage.retry import StorageUnavailable
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)
DEFAULT_COORDINATORS = 16
META = ("coordinator", "_coordinators.json")
# A forked child builds its own TC sets: the parent's hold its TxnID blocks and its lease.
_SHARED: forks.ProcessCache[tuple, Coordinators] = forks.ProcessCache()
T = TypeVar("T")


class Coordinators:
    def __init__(self, root: StorageRoot, count: int | None = None, config: CoordinatorConfig | None = None,
                 recover_on_open: bool = True):
        self.root = root
        self.config = config or CoordinatorConfig()
        self.count = self._resolve_count(count)
        self.recover_on_open = recover_on_open
        self._tcs: dict[int, TransactionCoordinator] = {}
        self.completer = Completer()  # background completions of this set's TCs (a client's flush waits)
        self._keys: dict[int, TransactionKeyStore] = {}
        self._lock = threading.Lock()
        self._rr = itertools.cycle(range(self.count))
        for _ in range(random.randrange(self.count)):
            next(self._rr)
        # This process's lease: who we are in lease rows, the TC and lease held, when to renew it
        # (monotonic), and, holding none, the TC shared meanwhile and when to try again.
        self.lease_owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._lease_lock = threading.Lock()
        self._lease: tuple[int, TcLease] | None = None
        self._renew_at = 0.0
        self._shared_tc = random.randrange(self.count)
        self._retry_at = 0.0
        self._made = forks.stamp()  # a forked child must not begin transactions on our blocks and lease

    def _check_process(self) -> None:
        forks.check(self._made, lambda: f"the transaction coordinators of {self.root.url} (lease owner "
                                        f"{self.lease_owner}, and its TxnID blocks)")

    @classmethod
    def shared(cls, root: StorageRoot, recover_on_open: bool = False) -> Coordinators:
        """One instance per root in this process, for code that has no client to hang TCs on: the
        Spark commit protocols and readers. pyspark reuses its Python workers across jobs and
        micro-batches (the planner and sink-runner processes stay the same), so a TC log or key
        table loaded for one batch only catches up on the new commits for the next, instead of
        being reloaded (tens of ms per table, growing with the log). Safe to share: every status
        change is a compare-and-set that re-reads on conflict, and lookups refresh when stale."""
        key = (root.url, tuple(sorted(root.storage_options.items())), recover_on_open)
        return _SHARED.get_or_make(key, lambda: cls(root, recover_on_open=recover_on_open))

    def _resolve_count(self, count: int | None) -> int:
        if count is not None and (not isinstance(count, int) or count < 1 or count > 4096):
            raise InvalidConfiguration(f"num_coordinators={count!r}: must be an integer from 1 to 4096")
        text = self.root.read_text(*META)
        if text is not None:
            stored = int(json.loads(text)["count"])
            if count is not None and count != stored:
                log.warning("num_coordinators=%d ignored: %s already has %d TCs", count, self.root.url, stored)
            return stored
        n = count or DEFAULT_COORDINATORS
        body = json.dumps({"count": n})
        if self.root.has_put_if_absent:
            # The first of several first users wins; everyone then uses its count (a plain write
            # let the last writer win after the others had already read back their own value).
            self.root.put_if_absent(body.encode(), *META)
        else:
            self.root.write_text(body, *META)
        text = self.root.read_text(*META)
        if text is None:
            raise StorageError(f"{self.root.uri(*META)} was written but cannot be read back")
        stored = int(json.loads(text)["count"])
        if count is not None and count != stored:
            log.warning("num_coordinators=%d ignored: %s already has %d TCs", count, self.root.url, stored)
        return stored

    def use_lease_owner(self, owner: str) -> None:
        """Lease under ``owner`` instead of this process's own name: several processes that act as
        one client (a Spark driver's Python workers) then hold one lease between them."""
        with self._lease_lock:
            if owner == self.lease_owner:
                return
            held = self._lease is not None
        if held:
            self.release()
        with self._lease_lock:
            self.lease_owner = owner
            self._retry_at = 0.0

    def pick(self, key: str | None = None) -> int:
        """A client's TC: by hash of its transaction key when it has one, else the leased one (or,
        with leases off, round-robin)."""
        self._check_process()
        if key is not None:
            return zlib.crc32(key.encode()) % self.count
        if self.config.lease_ms <= 0:
            with self._lock:
                return next(self._rr)
        with self._lease_lock:
            now = time.monotonic()
            if self._lease is not None and not _same(self.tc(self._lease[0]).txlog.lease(), self._lease[1]):
                self._lost()  # the log, as last read, shows another owner's lease
            if self._lease is not None and (now < self._renew_at or self._renew()):
                return self._lease[0]
            if now >= self._retry_at:
                tc_id = self._acquire()
                if tc_id is not None:
                    return tc_id
                self._retry_at = now + self.config.lease_ms / 1000.0
            return self._shared_tc

    @property
    def leased(self) -> tuple[int, TcLease] | None:
        """(TC id, lease) this process holds, as last written."""
        return self._lease

    def _new_lease(self, epoch: int) -> TcLease:
        return TcLease(self.lease_owner, epoch, now_ms() + self.config.lease_ms)

    def _held(self, tc_id: int, lease: TcLease) -> None:
        self._lease = (tc_id, lease)
        self._renew_at = time.monotonic() + self.config.lease_ms / 3000.0

    def _renew(self) -> bool:
        """Extend our lease; False when it was taken over (we no longer hold it). A storage error
        keeps it for now (it is still ours unless it expires) and retries the renewal soon."""
        assert self._lease is not None
        tc_id, mine = self._lease
        renewed = self._new_lease(mine.epoch)
        try:
            _, written = self.tc(tc_id).change_lease(lambda cur: renewed if _same(cur, mine) else None)
        except Exception as e:
            log.warning("renewing the lease on TC %d failed (%s); retrying in 1 s", tc_id, e)
            self._renew_at = time.monotonic() + 1.0
            return True
        if written:
            self._held(tc_id, renewed)
            return True
        self._lost()
        return False

    def _lost(self) -> None:
        assert self._lease is not None
        log.warning("the lease on TC %d was taken over (this process was paused, or its clock is behind); "
                    "it begins its transactions elsewhere", self._lease[0])
        self._lease = None

    def _acquire(self) -> int | None:
        """Take the lease of the first free TC log from the one our owner name hashes to on (random
        for a process's own name; the same log for every process of a shared name), or adopt the
        unexpired lease a process of our name holds. None when all are held by others."""
        start = zlib.crc32(self.lease_owner.encode()) % self.count
        for i in range(self.count):
            tc_id = (start + i) % self.count
            tc = self.tc(tc_id)
            previous: list[TcLease | None] = []

            def take(cur: TcLease | None, previous: list[TcLease | None] = previous) -> TcLease | None:
                previous[:] = [cur]
                if cur is not None and not cur.held_by(self.lease_owner) \
                        and not cur.free_for(now_ms(), self.config.max_clock_skew_ms):
                    return None
                if cur is not None and cur.live_for(self.lease_owner, now_ms()):
                    return None  # ours already (another process of our name): adopt it
                return self._new_lease(0 if cur is None else cur.epoch + 1)

            try:
                lease, written = tc.change_lease(take)
            except Exception as e:
                log.warning("taking the lease on TC %d failed (%s); trying the next TC", tc_id, e)
                continue
            if not written and lease is not None and lease.live_for(self.lease_owner, now_ms()):
                self._lease, self._renew_at = (tc_id, lease), 0.0  # another process of our name took it
                log.debug("sharing the lease on TC %d with another process of owner %s", tc_id, self.lease_owner)
                return tc_id
            if not written or lease is None:
                continue
            self._held(tc_id, lease)
            before = previous[0] if previous else None
            if before is not None and not before.released and before.owner != self.lease_owner:
                # Its owner died (or stalled): finish its decided transactions and abort its expired
                # ones now, as the TC's new owner, rather than at the next sweep.
                result = tc.sweep()
                log.info("took over the lease on TC %d from %s (expired); recovery: %s", tc_id, before.owner, result)
            else:
                log.debug("holding the lease on TC %d (epoch %d)", tc_id, lease.epoch)
            return tc_id
        log.info("every TC log of %s is leased by a live process; sharing TC %d by compare-and-set",
                 self.root.url, self._shared_tc)
        return None

    def release(self) -> None:
        """Give our lease up (a closing client), so the next process takes the log at once."""
        self._check_process()
        with self._lease_lock:
            if self._lease is None:
                return
            tc_id, mine = self._lease
            self._lease = None
            gone = TcLease(mine.owner, mine.epoch, now_ms(), released=True)
            try:
                self.tc(tc_id).change_lease(lambda cur: gone if _same(cur, mine) else None)
            except Exception as e:  # it expires by itself
                log.info("releasing the lease on TC %d failed (%s); it expires in %d ms", tc_id, e,
                         self.config.lease_ms)

    def tc(self, tc_id: int) -> TransactionCoordinator:
        self._check_process()
        if not 0 <= tc_id < self.count:
            raise TransactionCoordinatorNotFoundError(
                f"TC {tc_id} does not exist: {self.root.url} has TCs 0..{self.count - 1}")
        with self._lock:
            tc = self._tcs.get(tc_id)
            if tc is None:
                tc = self._tcs[tc_id] = TransactionCoordinator(self.root, tc_id, self.config, keys=self._key_store(tc_id),
                                                           completer=self.completer, key_home=self.key_store_of)
        return tc.open(recover=self.recover_on_open) if not tc._opened else tc

    def for_txn(self, txn_id: TxnID) -> TransactionCoordinator:
        return self.tc(txn_id.most_bits)

    def key_store_of(self, full: str) -> TransactionKeyStore:
        """The store of transaction key ``owner&key``: on the TC it hashes to, wherever its
        transactions begin."""
        return self.keys(self.pick(full))

    def keys(self, tc_id: int) -> TransactionKeyStore:
        with self._lock:
            return self._key_store(tc_id)

    def _key_store(self, tc_id: int) -> TransactionKeyStore:
        """One key store per TC in this process, shared with the TC's epoch check (callers hold the lock)."""
        ks = self._keys.get(tc_id)
        if ks is None:
            ks = self._keys[tc_id] = TransactionKeyStore(self.root, tc_id)
        return ks

    def all(self) -> list[TransactionCoordinator]:
        return [self.tc(i) for i in range(self.count)]

    def used(self) -> list[int]:
        """The TCs whose log exists. A TC no client has used has none, and opening it would create
        it: views (stats, listings, metrics) walk these only, so looking creates no table."""
        return [tc_id for tc_id in range(self.count) if self.is_used(tc_id)]

    def is_used(self, tc_id: int) -> bool:
        """Whether TC ``tc_id`` has a log: one this process opened has (no storage request then)."""
        return tc_id in self._tcs or self.root.exists(*tc_segments(tc_id), "_delta_log")

    def keys_if_any(self, tc_id: int) -> list[TransactionKeyInfo]:
        """The transaction keys of TC ``tc_id``, without creating its key table when no key was
        ever claimed there (views must not create tables by looking)."""
        if not self.root.exists(*key_segments(tc_id), "_delta_log"):
            return []
        return self.keys(tc_id).list()

    def each(self, step: Callable[[TransactionCoordinator], T],
             ids: Iterable[int] | None = None) -> Iterator[tuple[int, T | Exception]]:
        """(TC id, ``step(tc)``) for every TC in turn, or (TC id, the exception) for one whose log
        cannot be opened or read (a damaged commit file): the walks over every TC (sweeps, stats,
        listings, metrics) go on with the others instead of ending at the first bad log, and
        each says which one it left out. An unreachable store still raises, as every TC would
        fail alike. Lazy, so a caller may stop between TCs. ``ids``: these TCs only (default all)."""
        for tc_id in range(self.count) if ids is None else ids:
            try:
                result: T | Exception = step(self.tc(tc_id))
            except StorageUnavailable:
                raise
            except Exception as e:  # handed to the caller, which names the TC
                result = e
            yield tc_id, result


def _same(current: TcLease | None, mine: TcLease) -> bool:
    """Whether the log's lease is still the one we hold: same owner and epoch, not released. Its
    expiry may have moved on: another process of our owner name renewed it."""
    return current is not None and not current.released and (current.owner, current.epoch) == (mine.owner, mine.epoch)
