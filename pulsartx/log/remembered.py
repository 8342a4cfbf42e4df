"""The rows of the small files this process's partition writers committed, kept so that merging
them needs no read back (pulsartx/maintenance/merging.py), within one memory budget for the whole
process: a process writing to many partitions holds no more than one writing to one, and the rows
of a partition it stopped writing to go before those of the partitions it writes to.

Within the budget a partition's rows are kept by file path, oldest first; across partitions the
least recently written one loses its oldest rows first (docs/design/small-file-merging.md)."""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import pyarrow as pa

from pulsartx import forks


class RememberedRows:
    """Rows by owner (a partition writer's key) and file path, with their sizes. One lock, taken
    for dict operations only and never while another is held: callers hold their append locks.

    An owner that is garbage-collected releases its rows through :meth:`release`, which takes no
    lock: the cyclic collector runs wherever an allocation triggers it, also inside a method here
    with the lock held (non-reentrant: a release waiting for it would hang its thread, and with it
    that thread's append lock). Released owners are dropped by the next method that takes the lock."""

    def __init__(self) -> None:
        self._reset()
        forks.reset_in_child(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        # owner -> path -> (rows, bytes); owners least recently written first, paths oldest first
        self._held: dict[int, dict[str, tuple[pa.Table, int]]] = {}
        self._bytes: dict[int, int] = {}
        self._total = 0
        self._released: deque[int] = deque()  # owners collected since: appended lock-free, dropped under the lock

    def _after_fork(self) -> None:  # the parent's rows are the parent's writers'
        self._reset()

    @property
    def total_bytes(self) -> int:
        with self._lock:
            self._drain()
            return self._total

    def release(self, owner: int) -> None:
        """Forget every row of ``owner``, soon: safe to call from a finalizer (see the class)."""
        self._released.append(owner)

    def _drain(self) -> None:
        while self._released:
            owner = self._released.popleft()
            if self._held.pop(owner, None) is not None:
                self._total -= self._bytes.pop(owner)

    def remember(self, owner: int, path: str, rows: pa.Table, size: int, budget: int) -> None:
        """Keep ``rows`` (``size`` bytes) as the file ``path`` of ``owner``, now the most recently
        written owner; then forget the least recently written owners' oldest rows while the process
        holds more than ``budget`` bytes."""
        with self._lock:
            self._drain()
            self._drop(owner, path)  # remembered again: replaced
            held = self._held.pop(owner, None) or {}
            self._held[owner] = held  # (re-)inserted last: the most recently written
            held[path] = (rows, size)
            self._bytes[owner] = self._bytes.get(owner, 0) + size
            self._total += size
            self._drain()  # a log collected meanwhile (above): its rows go before a live one's
            while self._total > budget and self._held:
                victim = next(iter(self._held))
                self._drop(victim, next(iter(self._held[victim])))

    def _drop(self, owner: int, path: str) -> None:
        held = self._held.get(owner)
        if held is None:
            return
        gone = held.pop(path, None)
        if gone is not None:
            self._bytes[owner] -= gone[1]
            self._total -= gone[1]
        if not held:
            del self._held[owner]
            self._bytes.pop(owner, None)

    def forget(self, owner: int, path: str) -> None:
        with self._lock:
            self._drain()
            self._drop(owner, path)

    def forget_all(self, owner: int) -> None:
        with self._lock:
            self._released.append(owner)
            self._drain()

    def bytes_of(self, owner: int) -> int:
        with self._lock:
            self._drain()
            return self._bytes.get(owner, 0)

    def paths(self, owner: int) -> list[str]:
        with self._lock:
            self._drain()
            return list(self._held.get(owner, ()))

    def rows(self, owner: int, paths: Sequence[str]) -> list[pa.Table] | None:
        """The rows of every one of ``paths``, or None unless all are held."""
        with self._lock:
            self._drain()
            held = self._held.get(owner)
            if held is None or not paths:
                return None
            got = [held.get(p) for p in paths]
        if any(g is None for g in got):
            return None
        return [g[0] for g in got]  # type: ignore[index]


# The process's remembered rows (one budget: partition.REMEMBER_MAX_BYTES).
REMEMBERED = RememberedRows()
