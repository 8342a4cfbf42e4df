"""Process-wide thread pools, started on first use.

Several mechanisms keep one pool per process (the participants' marker writes, the transaction
helpers, buffer snapshots written in the background, small-file merges). Each is started lazily,
so importing pulsartx starts no thread, and again in a forked child, whose parent's threads did not
survive the fork.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor


class ProcessPool:
    def __init__(self, workers: int, thread_name_prefix: str):
        self.workers = workers
        self.thread_name_prefix = thread_name_prefix
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix=self.thread_name_prefix)
                self._pid = os.getpid()
            return self._pool
