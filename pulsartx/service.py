"""``pulsartx coordinator run``: the long-running coordinator service.

Each pass, it sweeps every TC (aborts timed-out transactions, finishes COMMITTING/ABORTING ones a
dead process left behind), folds every partition's transaction buffer and settles it through the
TCs (which writes snapshots when due), and optionally compacts. Every action is a compare-and-set
on storage, so any number of instances may run at once, against the same root, with no leader
election. SIGTERM or SIGINT ends
the current pass and exits cleanly; a SIGKILLed instance leaves nothing to clean up.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.reads import settle
from pulsartx.log.partition import PartitionLog
from pulsartx.maintenance.compaction import compact_partition
from pulsartx.maintenance.merging import merge_small_files
from pulsartx.observe.failures import RepeatedFailures
from pulsartx.observe.listings import unless_deleted
from pulsartx.storage.delta import StorageUnavailable

log = logging.getLogger("pulsartx.service")


@dataclass
class ServiceStats:
    passes: int = 0
    timed_out: int = 0
    completed: int = 0
    failed: int = 0
    compacted_files: int = 0
    merged_files: int = 0
    errors: list[str] = field(default_factory=list)


class CoordinatorService:
    def __init__(self, client: Any, sweep_interval_s: float = 1.0, compact_every_passes: int = 0,
                 grace_ms: int | None = None):
        self.client = client
        self.sweep_interval_s = sweep_interval_s
        self.compact_every_passes = compact_every_passes
        self.grace_ms = grace_ms
        self.stats = ServiceStats()
        self._stop = threading.Event()
        self._reported = RepeatedFailures()  # "partition <name>", "TC <id>", "pass"

    def stop(self, *_: Any) -> None:
        if not self._stop.is_set():
            log.info("coordinator service stopping after the current pass")
        self._stop.set()

    def run_pass(self) -> None:
        if self._stop.is_set():
            return
        # One unreadable TC log must not leave the others' transactions unfinished.
        for tc_id, r in self.client._coordinators().each(lambda tc: tc.sweep(grace_ms=self.grace_ms)):
            if isinstance(r, Exception):
                self._failed(f"TC {tc_id}", r)
            else:
                self._reported.cleared(f"TC {tc_id}")  # the same error later is a new outage
                self.stats.timed_out += r.timed_out
                self.stats.completed += r.completed
                self.stats.failed += r.failed
            if self._stop.is_set():
                return
        compact = self.compact_every_passes and self.stats.passes % self.compact_every_passes == 0
        admin = self.client.admin
        for topic in admin.list_topics():
            try:
                parts = unless_deleted(admin, topic, partial(admin.partitions_of, topic))
                if parts is None:
                    continue  # deleted since it was listed: nothing of it is left to maintain
            except StorageUnavailable:
                raise
            except Exception as e:  # its metadata unreadable: the topics after it are still maintained
                self._partition_failed(topic, e)
                continue
            self._reported.cleared(f"partition {topic}")
            for p in parts:
                if self._stop.is_set():
                    return
                try:
                    buf = TransactionBuffer(PartitionLog(self.client.root, p))
                    settle(self.client._coordinators(), buf, eager=True)  # folds; snapshots when due
                    self.stats.merged_files += merge_small_files(self.client.root, p)
                    if compact:
                        res = compact_partition(self.client.root, p)
                        self.stats.compacted_files += max(0, res.files_before - res.files_after)
                    self._reported.cleared(f"partition {p}")  # the same error later is a new outage
                except StorageUnavailable:
                    raise  # the store itself is down: end this pass (retried next pass), not one wait per partition
                except Exception as e:  # one broken partition (e.g. a corrupt log) must not stall the others
                    self._partition_failed(p, e)

    def _partition_failed(self, partition: Any, e: Exception) -> None:
        """Log a partition's failure once at WARNING (then at DEBUG while it repeats) and move on."""
        self._failed(f"partition {partition}", e)

    def _failed(self, what: str, e: Exception) -> None:
        """Log a failure of ``what`` (a partition, a TC) once at WARNING, at DEBUG while it repeats."""
        msg = f"{what}: {e}"
        if self._note(what, msg, str(e)):
            log.warning("coordinator pass skipped %s (will retry next pass)", msg)
        else:
            log.debug("coordinator pass skipped %s again", msg)

    def _note(self, what: str, msg: str, error: str) -> bool:
        """Keep ``msg`` among the last 100 errors (a partition broken, or a store down, for days is
        one line per pass); True when ``what`` failed otherwise last time (worth a WARNING)."""
        self.stats.errors.append(msg)
        del self.stats.errors[:-100]
        return self._reported.is_news(what, error)

    def run(self, install_signals: bool = True) -> ServiceStats:
        if install_signals:
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        log.info("coordinator service started on %s (%d TCs, sweep every %.1f s)", self.client.root.url,
                 self.client._coordinators().count, self.sweep_interval_s)
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.run_pass()
            except Exception as e:  # a storage hiccup must not end the service
                if self._note("pass", str(e), str(e)):
                    log.warning("coordinator pass failed (retrying next pass): %s", e)
                else:
                    log.debug("coordinator pass failed again: %s", e)
            else:
                self._reported.cleared("pass")  # a later failure is news again
            self.stats.passes += 1
            if self.stats.passes % 60 == 1:
                log.info("pass %d: %d timed out, %d completed, %d failed so far", self.stats.passes,
                         self.stats.timed_out, self.stats.completed, self.stats.failed)
            self._stop.wait(max(0.0, self.sweep_interval_s - (time.monotonic() - t0)))
        log.info("coordinator service stopped after %d passes", self.stats.passes)
        return self.stats
