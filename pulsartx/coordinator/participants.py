"""The TC's participants: where ending a transaction must be applied (PIP-31 CommandEndTxnOnPartition
and CommandEndTxnOnSubscription). Handlers are idempotent, so a TC may retry them at will, and
they run in parallel so a commit's latency is one marker write, not one per partition."""
from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pulsartx.buffer.markers import write_marker
from pulsartx.coordinator.state import Subscription, TxnAction, TxnMeta
from pulsartx.exceptions import TopicNotFound
from pulsartx.log.partition import partition_segments
from pulsartx.naming import TopicName
from pulsartx.storage import group_commit
from pulsartx.storage.delta import commit_file
from pulsartx.storage.pools import ProcessPool
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.pendingack import end_transaction_on_subscription

log = logging.getLogger(__name__)
MAX_PARALLEL = 64  # participants of many completions in flight; each mostly waits on storage
POOL_THREADS = "pulsartx-tc-end"
# Set within quietly(): participant failures logged at DEBUG.
_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("pulsartx_quiet_participants", default=False)


_POOL = ProcessPool(MAX_PARALLEL, POOL_THREADS)


def _pool() -> ThreadPoolExecutor:
    """One pool per process: starting threads for every commit cost 5-7 ms of a 60 ms streaming
    batch commit (four partitions). Jobs never wait on each other, so sharing it cannot deadlock."""
    return _POOL.get()


def end_on_partition(root: StorageRoot, meta: TxnMeta, partition: str, action: TxnAction) -> None:
    entries = None
    if meta.commit_entries is not None:
        entries = [(a, b) for p, a, b in meta.commit_entries if p == partition]
    try:
        write_marker(root, partition, meta.txn_id, action, entries)
    except TopicNotFound:
        # Its topic was deleted after the transaction wrote to it: its messages went with it and
        # nothing is left to mark. Retrying would keep the transaction unfinished for as long as
        # the topic is gone, then put its marker into a re-created topic of the same name.
        if _table_files_remain(root, partition):
            # Not found by a listing, yet its log is there (a store whose listings lag): a marker
            # taken for done here would make a committed transaction's messages invisible for good.
            raise
        log.info("%s: %s no longer exists, nothing to mark there", meta.txn_id, partition)


def _table_files_remain(root: StorageRoot, partition: str) -> bool:
    """Whether the partition's Delta log still has its first commit or a checkpoint hint (log
    cleanup removes early commits only once a checkpoint covers them), asked by name, not listed."""
    log_dir = (*partition_segments(TopicName.parse(partition)), "_delta_log")
    return root.exists(*log_dir, commit_file(0)) or root.exists(*log_dir, "_last_checkpoint")


def end_on_subscription(root: StorageRoot, meta: TxnMeta, sub: Subscription, action: TxnAction) -> None:
    end_transaction_on_subscription(root, sub.topic, sub.subscription, meta.txn_id, action)


def _as_caller(lingering: bool, fn: Any, *args: Any) -> None:
    with group_commit.background() if lingering else contextlib.nullcontext():
        fn(*args)


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """Participant failures within are logged at DEBUG: a retry whose caller warns only now and then."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


def failure_level() -> int:
    """The level a failure to complete a decided transaction is logged at here (:func:`quietly`)."""
    return logging.DEBUG if _QUIET.get() else logging.WARNING


def end_on_participants(root: StorageRoot, meta: TxnMeta, action: TxnAction) -> list[tuple[str, BaseException]]:
    """Apply the outcome everywhere; returns the participants that failed (to be retried later)."""
    jobs: list[tuple[str, Any, tuple]] = [(p, end_on_partition, (root, meta, p, action)) for p in sorted(meta.partitions)]
    jobs += [(str(s), end_on_subscription, (root, meta, s, action)) for s in sorted(meta.subscriptions, key=str)]
    failures: list[tuple[str, BaseException]] = []
    if not jobs:
        return failures
    # One participant, or called from a pool thread (which must not wait on the pool): inline.
    inline = len(jobs) == 1 or threading.current_thread().name.startswith(POOL_THREADS)
    lingering = group_commit.in_background()  # the pool threads write as the caller's thread would
    # The first job runs on the caller's thread (before it waits for the others), which would only wait.
    futures = [None if inline or i == 0 else _pool().submit(_as_caller, lingering, fn, *args)
               for i, (_, fn, args) in enumerate(jobs)]
    for (name, fn, args), fut in zip(jobs, futures, strict=True):
        try:
            if fut is None:
                fn(*args)
            else:
                fut.result()
        except Exception as e:
            failures.append((name, e))
    for name, e in failures:
        log.log(failure_level(), "ending %s on %s failed (will be retried by recovery): %s", meta.txn_id, name, e)
    return failures
