"""Group commit (PIP-160's batched log writes) by flat combining.

Threads of one process that update the same log each queue a request, then take the log's lock in
turn; whoever holds it writes every queued request in one Delta commit. Each request keeps its own
compare-and-set semantics because it is planned, under the lock, against the log state the commit
is based on: a lost race (ConcurrentCommit) re-reads the log and re-plans every request of the
group, so a request whose check no longer holds fails alone and the others are written in the
retried commit. Two requests on the same key never share a commit (the second is planned on the
first's result, in the next one). Only the leader takes the lock: the others wait on their own
request and return as soon as a commit has written it (docs/design/group-commit-across-transactions.md).

A request's plan returns :class:`Done` (nothing to write: the request's answer is already known) or
:class:`Write` (items for the commit, and the answer once they are durable).

Background requests (a decided transaction's markers, acknowledgement commits and final record,
written after ``commit()`` returned: :func:`background`) first wait up to ``LINGER_S`` for another
thread's group to take them, and only then lead one themselves. A client that runs transactions
back to back thereby writes the previous transaction's completion in the next one's commits (its
registration, its acknowledgement, its data) instead of in commits of their own: the next request
usually comes within a few milliseconds, and nobody waits on a completion that late.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pulsartx.exceptions import StorageError
from pulsartx.storage import delta

R = TypeVar("R")
MAX_GROUP = 64
LINGER_S = 0.01
# A waiting request re-checks this often whether it must lead: only a safety net, as a leader that
# is done hands the lead on at once (a leader that is not a waiter, e.g. a thread that held the
# log's lock already, hands nothing on).
WAKE_POLL_S = 0.05
_BACKGROUND = threading.local()
_LINGER = threading.Condition()  # lingering requests wait on it; urgent() and finished requests wake them
_urgent = 0  # threads waiting for background work right now
_lingering = 0  # background requests lingering right now (finishers skip the wake-up when none)


def _linger_in_child() -> None:
    """A forked child has none of the threads that were lingering or urgent, and their condition's
    lock may be held for good."""
    global _LINGER, _urgent, _lingering
    _LINGER = threading.Condition()
    _urgent = _lingering = 0


os.register_at_fork(after_in_child=_linger_in_child)


@contextlib.contextmanager
def urgent() -> Iterator[None]:
    """While someone waits for background work (a flush, an acknowledgement behind a completion),
    nothing lingers: every background request leads its own commit at once."""
    global _urgent
    with _LINGER:
        _urgent += 1
        _LINGER.notify_all()
    try:
        yield
    finally:
        with _LINGER:
            _urgent -= 1


def _linger(done: threading.Event) -> None:
    global _lingering
    deadline = time.monotonic() + LINGER_S
    with _LINGER:
        _lingering += 1  # before reading ``done``: a finisher that saw 0 had set it already
        try:
            while not done.is_set() and not _urgent:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                _LINGER.wait(left)
        finally:
            _lingering -= 1


def _wake_lingering() -> None:
    """After setting a request's ``done``: wake lingering threads, if any (every group's requests
    finish here, so the common case, nobody lingering, takes no lock)."""
    if _lingering:
        with _LINGER:
            _LINGER.notify_all()


@contextlib.contextmanager
def background() -> Iterator[None]:
    """Requests made inside wait up to ``LINGER_S`` to join another thread's commit (see the module)."""
    before = getattr(_BACKGROUND, "on", False)
    _BACKGROUND.on = True
    try:
        yield
    finally:
        _BACKGROUND.on = before


def in_background() -> bool:
    return getattr(_BACKGROUND, "on", False)


@dataclass
class Done(Generic[R]):
    result: R


@dataclass
class Write(Generic[R]):
    items: list[Any]  # what the commit writes for this request (e.g. log entries)
    result: R
    on_written: Callable[[], None] | None = None  # bookkeeping once durable (under the lock)


@dataclass
class _Request:
    key: Hashable
    plan: Callable[[], Done | Write]
    kind: Hashable = None  # requests of different kinds never share a commit (None: any kind)
    wants_before: bool = False  # the group runs ``before_group`` first
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    # Set when the request is done or its thread is handed the lead (GroupCommit.wait).
    wake: threading.Event = field(default_factory=threading.Event)
    waiting: bool = False  # its thread waits in GroupCommit.wait (it can take the lead)

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()
        self.wake.set()
        _wake_lingering()


class _Leadership:
    """Who writes the queued requests of a flat combiner: one thread leads at a time
    (``_leading``), under the log's lock; the others wait on their own request, not on the lock.
    When the leader's commit has written theirs they return at once, instead of each taking the
    lock in turn only to find its request done while the next group waits behind them (a convoy
    that cost a thread switch per finished request). A leader whose own request is written hands
    the lead to the oldest waiting request still queued."""

    _lock: Any
    _queue: list[Any]
    _queue_lock: threading.Lock
    _leading: bool

    def _wait_led(self, req: Any, lead: Callable[[], None]) -> None:
        """Return once ``req.done``; ``lead()`` writes groups until it is, under the lock."""
        with self._queue_lock:
            req.waiting = True
        while not req.done.is_set():
            req.wake.clear()
            with self._queue_lock:
                flagged = not self._leading
                if flagged:
                    self._leading = True
            if flagged:
                try:
                    with self._lock:
                        lead()
                finally:
                    self._hand_on(clear=True)
            elif self._lock.acquire(blocking=False):
                # The lock is free, or this thread holds it already (a caller inside the log's
                # lock): lead without the flag; the flagged leader waits for the lock meanwhile.
                try:
                    lead()
                finally:
                    self._lock.release()
                    self._hand_on(clear=False)
            elif not req.done.is_set():
                req.wake.wait(WAKE_POLL_S)

    def _hand_on(self, clear: bool) -> None:
        """Wake the oldest waiting request to lead next: after the flagged leader (``clear``), or
        after one that led without the flag while no one holds it (the flagged one may have
        finished meanwhile, handing the lead to a request this one then wrote)."""
        with self._queue_lock:
            if clear:
                self._leading = False
            elif self._leading:
                return  # the flagged leader hands on when it is done
            heir = next((r for r in self._queue if r.waiting), None)
        if heir is not None:
            heir.wake.set()


class GroupCommit(_Leadership):
    """``lock`` guards the log's state (the same lock its readers take); ``write`` makes the requests'
    items one atomic commit (raising ConcurrentCommit on a lost race); ``refresh`` re-reads the log."""

    def __init__(self, name: str, lock: threading.RLock, write: Callable[[list[Any]], None],
                 refresh: Callable[[], Any], max_attempts: int = 500, max_group: int = MAX_GROUP,
                 before_group: Callable[[], Any] | None = None, exhausted: str | None = None,
                 start_plan: Callable[[], Any] | None = None):
        self.name = name
        # Before each planning round of a group (each attempt): plans that depend on the ones
        # before them in the same commit (a producer's appends) reset what they carry over.
        self._start_plan = start_plan
        self._exhausted = exhausted or f"{name}: could not write after {max_attempts} concurrent conflicts"
        # Once per group that holds a request run with before=True, ahead of planning (e.g. catch up
        # on others' commits first).
        self._before_group = before_group
        self._lock = lock
        self._write = write
        self._refresh = refresh
        self._max_attempts = max_attempts
        self._max_group = max_group
        self._queue: list[_Request] = []
        self._queue_lock = threading.Lock()
        self._leading = False  # a thread leads (or is about to take the lock to lead); see wait()
        self.commits = 0  # commits written (a group's retries count once each)
        self.requests = 0  # requests that wrote rows

    def run(self, key: Hashable, plan: Callable[[], Done | Write], kind: Hashable = None,
            before: bool = False) -> Any:
        return self.wait(self.submit(key, plan, kind, before))

    def submit(self, key: Hashable, plan: Callable[[], Done | Write], kind: Hashable = None,
               before: bool = False) -> _Request:
        """Queue a request without waiting (pipelining): requests a caller submits in order are
        planned in that order, in one commit or in commits one after the other, so a caller may
        release its own lock before the round trip and let the next request queue behind it."""
        req = _Request(key, plan, kind, before)
        with self._queue_lock:
            self._queue.append(req)
        return req

    def wait(self, req: _Request) -> Any:
        """The answer to a submitted request, leading commits until it is written (see _Leadership)."""
        if in_background():
            _linger(req.done)
        self._wait_led(req, lambda: self._lead(req))
        if req.error is not None:
            raise req.error
        return req.result

    def _lead(self, req: _Request) -> None:
        while not req.done.is_set():
            self._commit_group(self._take())

    def _take(self) -> list[_Request]:
        """The queued requests of distinct keys and one kind, oldest first (the others wait)."""
        with self._queue_lock:
            group, keys, rest, kind = [], set(), [], None
            for r in self._queue:
                if r.key in keys or len(group) >= self._max_group or (
                        r.kind is not None and kind is not None and r.kind != kind):
                    rest.append(r)
                else:
                    keys.add(r.key)
                    group.append(r)
                    kind = kind if r.kind is None else r.kind
            self._queue = rest
        return group

    def _commit_group(self, group: list[_Request]) -> None:
        if self._before_group is not None and any(r.wants_before for r in group):
            try:
                self._before_group()
            except BaseException as e:
                for r in group:
                    r.finish(error=e)
                return
        for attempt in range(self._max_attempts):
            writes: list[tuple[_Request, Write]] = []
            if self._start_plan is not None:
                self._start_plan()
            for r in group:
                if r.done.is_set():
                    continue
                try:
                    planned = r.plan()
                except BaseException as e:  # this request's own check failed: it alone fails
                    r.finish(error=e)
                    continue
                if isinstance(planned, Done):
                    r.finish(planned.result)
                else:
                    writes.append((r, planned))
            if not writes:
                return
            try:
                self._write([item for _, w in writes for item in w.items])
            except delta.ConcurrentCommit:
                delta.backoff(attempt)
                try:
                    self._refresh()
                except BaseException as e:
                    for r, _ in writes:
                        r.finish(error=e)
                    return
                continue
            except BaseException as e:  # one commit: the same (possibly unknown) outcome for all
                for r, _ in writes:
                    r.finish(error=e)
                return
            self.commits += 1
            self.requests += len(writes)
            for r, w in writes:
                if w.on_written is not None:
                    w.on_written()
                r.finish(w.result)
            return
        error = StorageError(self._exhausted)
        for r in group:
            if not r.done.is_set():
                r.finish(error=error)


@dataclass
class _Change:
    change: Any
    done: threading.Event = field(default_factory=threading.Event)
    outcome: tuple[bool, Any] | None = None
    wake: threading.Event = field(default_factory=threading.Event)  # done, or handed the lead
    waiting: bool = False


class Combiner(_Leadership):
    """Group commit for read-modify-writes of one key (a subscription's cursor, which holds its
    pending acks): whoever holds ``lock`` hands every queued change to ``apply_all`` at once, which
    runs them in order on one state, writes once, and returns ``(ok, result or exception)`` per
    change, so a change that fails its own check fails alone."""

    def __init__(self, lock: threading.RLock, apply_all: Callable[[list[Any]], list[tuple[bool, Any]]],
                 max_group: int = MAX_GROUP):
        self._lock = lock
        self._apply_all = apply_all
        self._max_group = max_group
        self._queue: list[_Change] = []
        self._queue_lock = threading.Lock()
        self._leading = False
        self.commits = 0  # apply_all calls
        self.changes = 0

    def run(self, change: Any) -> Any:
        req = _Change(change)
        with self._queue_lock:
            self._queue.append(req)
        if in_background():
            _linger(req.done)
        self._wait_led(req, lambda: self._lead(req))
        assert req.outcome is not None
        ok, value = req.outcome
        if not ok:
            raise value
        return value

    def _lead(self, req: _Change) -> None:
        while not req.done.is_set():
            with self._queue_lock:
                group, self._queue = self._queue[:self._max_group], self._queue[self._max_group:]
            try:
                outcomes = self._apply_all([r.change for r in group])
            except BaseException as e:  # one commit: the same outcome for all
                outcomes = [(False, e)] * len(group)
            self.commits += 1
            self.changes += len(group)
            for r, o in zip(group, outcomes, strict=True):
                r.outcome = o
                r.done.set()
                r.wake.set()
            _wake_lingering()
