"""The set of TCs under a root: how many there are, which one a client uses, and opening them.

The TC count is fixed when the root is first used (default 16, as in Pulsar) and kept in
``coordinator/_coordinators.json``; TxnIDs carry their TC id, so the count can never shrink.
"""
from __future__ import annotations

import itertools
import json
import logging
import random
import threading
import zlib

from pulsartx.coordinator.completer import Completer
from pulsartx.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
from pulsartx.coordinator.keys import TransactionKeyStore
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import InvalidConfiguration, StorageError, TransactionCoordinatorNotFoundError
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)
DEFAULT_COORDINATORS = 16
META = ("coordinator", "_coordinators.json")
_SHARED: dict[tuple, Coordinators] = {}
_SHARED_LOCK = threading.Lock()


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

    @classmethod
    def shared(cls, root: StorageRoot, recover_on_open: bool = False) -> Coordinators:
        """One instance per root in this process, for code that has no client to hang TCs on: the
        Spark commit protocols and readers. pyspark reuses its Python workers across jobs and
        micro-batches (the planner and sink-runner processes stay the same), so a TC log or key
        table loaded for one batch only catches up on the new commits for the next, instead of
        being reloaded (tens of ms per table, growing with the log). Safe to share: every status
        change is a compare-and-set that re-reads on conflict, and lookups refresh when stale."""
        key = (root.url, tuple(sorted(root.storage_options.items())), recover_on_open)
        with _SHARED_LOCK:
            tcs = _SHARED.get(key)
            if tcs is None:
                tcs = _SHARED[key] = cls(root, recover_on_open=recover_on_open)
            return tcs

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

    def pick(self, key: str | None = None) -> int:
        """A client's TC: by hash of its transaction key when it has one, else round-robin."""
        if key is not None:
            return zlib.crc32(key.encode()) % self.count
        with self._lock:
            return next(self._rr)

    def tc(self, tc_id: int) -> TransactionCoordinator:
        if not 0 <= tc_id < self.count:
            raise TransactionCoordinatorNotFoundError(
                f"TC {tc_id} does not exist: {self.root.url} has TCs 0..{self.count - 1}")
        with self._lock:
            tc = self._tcs.get(tc_id)
            if tc is None:
                tc = self._tcs[tc_id] = TransactionCoordinator(self.root, tc_id, self.config, keys=self._key_store(tc_id),
                                                           completer=self.completer)
        return tc.open(recover=self.recover_on_open) if not tc._opened else tc

    def for_txn(self, txn_id: TxnID) -> TransactionCoordinator:
        return self.tc(txn_id.most_bits)

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
