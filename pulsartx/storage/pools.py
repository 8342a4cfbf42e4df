"""Thread pools, started on first use and again in a forked child.

Several mechanisms keep one pool per process (the participants' marker writes, the transaction
helpers, buffer snapshots written in the background, small-file merges, Delta checkpoints) or per
client (the background completer). Each is started lazily, so importing pulsartx starts no thread.
A forked child has none of its parent's threads: work submitted to the parent's pool there would
wait forever, so the child starts its own pool on first use, behind a new lock (the parent's may
have been held by another thread at the fork).
"""
from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

from pulsartx import forks


class ProcessPool:
    def __init__(self, workers: int, thread_name_prefix: str):
        self.workers = workers
        self.thread_name_prefix = thread_name_prefix
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        forks.reset_in_child(self)

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix=self.thread_name_prefix)
            return self._pool

    def started(self) -> ThreadPoolExecutor | None:
        """The pool if this process started it, else None (waiting on it needs no new threads)."""
        return self._pool

    def drain(self) -> None:
        """Block until the work submitted so far has run, where the pool has one worker: a
        marker task queued behind it. Starts no thread when the pool never ran anything, and
        returns at once while the interpreter shuts down (nothing more will run)."""
        assert self.workers == 1, "drain() waits for queued work in order: one worker only"
        pool = self._pool
        if pool is not None:
            with contextlib.suppress(RuntimeError):
                pool.submit(lambda: None).result()

    def _after_fork(self) -> None:
        self._pool = None
        self._lock = threading.Lock()
