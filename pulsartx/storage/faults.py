"""Fail points at the storage boundary: the last Python call before the disk or the object store.

Why this exists: a protocol that is correct under process kills can still be wrong under storage
faults (a read that fails after a durable write, a response lost after the write happened, a listing
that misses an entry another process is creating). Those faults cannot be produced on demand by a
real disk, so every storage primitive of :class:`~pulsartx.storage.root.StorageRoot` and the parquet
reads and writes of :mod:`pulsartx.storage.delta` pass through :func:`before` / :func:`after`, as
etcd's gofail and FreeBSD's fail(9) points do. Nothing of ours sits below them: whatever they inject,
all of pulsartx above sees as the filesystem's own answer. (delta-rs talks to storage from Rust; on
an object store, tests put a fault-injecting HTTP proxy in front of it instead.)

Off unless a plan is installed, and then one global lookup per call. A plan is installed in-process
with :func:`install`, or for a whole process tree through the ``PULSARTX_FAULTS`` environment
variable (JSON, read at the first storage call of each process), so spawned and SIGKILLed children
get it too. Each fired fault is appended to ``PULSARTX_FAULTS_LOG`` when set, so a test can assert
that its fault really happened.
"""
from __future__ import annotations

import errno
import json
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum

ENV = "PULSARTX_FAULTS"
LOG_ENV = "PULSARTX_FAULTS_LOG"


class Op(StrEnum):
    """What kind of storage call a fault applies to."""

    READ = "read"      # reading a file: a commit, a data file, a small JSON document
    LIST = "list"      # listing a folder, or checking whether a path exists
    WRITE = "write"    # writing a whole file (data files, documents): last writer wins
    CREATE = "create"  # put-if-absent: the Delta commit primitive
    DELETE = "delete"
    DELTA = "delta"    # a call into delta-rs (table open, create, refresh, write, file swap, checkpoint)


class Mode(StrEnum):
    ERROR = "error"      # fails before the call: nothing happened, the caller sees an I/O error
    LOST = "lost"        # the call happened, then the caller sees an error (a lost response)
    HTTP500 = "http500"  # an HTTP 500 answer; with ``after`` the write happened (ceph/ceph#71588)
    DELAY = "delay"      # the call is delayed by ``delay_s`` (a slow store, a paused process)
    HIDE = "hide"        # a listing misses the entries matching ``hide`` (a racing creator)
    EXISTS = "exists"    # a put-if-absent answers "already exists" (412) though nothing was written
    OVERWRITE = "overwrite"  # a put-if-absent ignores its condition: a blind write (a store without it)
    LATENCY = "latency"  # every matching call waits a request latency drawn around ``delay_s`` (a remote store)


@dataclass
class Fault:
    """Fire on the ``nth`` call (1-based) of kind ``op`` whose path contains ``match``, and on the
    ``times - 1`` matching calls after it; with ``every``, on one matching call in ``every`` instead,
    at random (a steady fault rate for soak runs). ``transient``: the error looks like a network
    fault (retried by our retry policy) rather than a permanent I/O error. ``LATENCY`` fires on
    every matching call: a log-normal wait with median ``delay_s`` and 99th percentile ``p99_s``."""

    op: Op
    mode: Mode = Mode.ERROR
    nth: int = 1
    times: int = 1
    match: str = ""
    transient: bool = False
    after: bool = False
    delay_s: float = 0.0
    hide: str = ""
    every: int = 0
    p99_s: float = 0.0
    seen: int = field(default=0, compare=False)
    fired: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        self.op, self.mode = Op(self.op), Mode(self.mode)
        if self.mode is Mode.LOST:
            self.after = True

    def matches(self, op: Op, path: str) -> bool:
        return op is self.op and self.match in path

    def due(self) -> bool:
        """Count this matching call; whether the fault fires on it."""
        self.seen += 1
        if self.mode is Mode.LATENCY:
            self.fired += 1
            return True
        if self.every > 0:
            # Random at that rate, seeded per process: a fixed period would resonate with calls
            # that come in groups (a read of 25 files retried, with every=25, failed every time).
            rng = self.__dict__.get("_rng")
            if rng is None:
                rng = self.__dict__["_rng"] = random.Random(os.getpid() * 1_000_003 + self.every)
            if rng.random() * self.every < 1:
                self.fired += 1
                return True
            return False
        if self.seen >= self.nth and self.fired < self.times:
            self.fired += 1
            return True
        return False


    def latency(self) -> float:
        """One request's latency: log-normal, as object-store request latencies are (a long right
        tail), with the given median and 99th percentile."""
        sigma = math.log(self.p99_s / self.delay_s) / 2.326 if self.p99_s > self.delay_s > 0 else 0.0
        return self.delay_s * math.exp(random.gauss(0.0, sigma)) if sigma else self.delay_s


STORE_OPS = (Op.READ, Op.LIST, Op.WRITE, Op.CREATE, Op.DELETE, Op.DELTA)


def store_latency(median_ms: float, p99_ms: float | None = None) -> list[Fault]:
    """A plan that makes every storage call wait like a request to a remote object store: S3
    Standard's small requests take tens of milliseconds with a p99 several times the median. A call
    into delta-rs waits once, though it may make more than one request."""
    p99 = median_ms if p99_ms is None else p99_ms
    if median_ms <= 0 or p99 < median_ms:
        raise ValueError(f"store latency {median_ms}:{p99_ms} ms: the median must be > 0 and the p99 >= the median")
    return [Fault(op, Mode.LATENCY, delay_s=median_ms / 1000, p99_s=p99 / 1000) for op in STORE_OPS]


class InjectedFault(OSError):
    """A permanent injected I/O error (EIO): retrying does not make it go away."""


class InjectedNetworkFault(ConnectionResetError):
    """A transient injected fault: the connection dropped; a retry may succeed."""


_plan: list[Fault] | None = None
_loaded = False
_lock = threading.Lock()


def _lock_in_child() -> None:
    """A forked child keeps its parent's plan, behind a lock no parent thread holds."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_lock_in_child)


def install(faults: Iterable[Fault]) -> None:
    """Make ``faults`` this process's plan (replacing any other)."""
    global _plan, _loaded
    with _lock:
        _plan = list(faults) or None
        _loaded = True


def clear() -> None:
    install(())


def env_value(faults: Iterable[Fault]) -> str:
    """The ``PULSARTX_FAULTS`` value that installs ``faults`` in a child process."""
    return json.dumps([{k: v for k, v in asdict(f).items() if k not in ("seen", "fired")} for f in faults])


def plan() -> list[Fault]:
    _load()
    return list(_plan or ())


def _load() -> None:
    global _plan, _loaded
    if _loaded:
        return
    with _lock:
        if not _loaded:
            raw = os.environ.get(ENV)
            _plan = [Fault(**f) for f in json.loads(raw)] if raw else None
            _loaded = True


def _fire(op: Op, path: str, after: bool) -> Fault | None:
    if not _loaded:
        _load()
    if _plan is None:
        return None
    with _lock:
        for f in _plan:
            if f.after == after and f.mode is not Mode.HIDE and f.matches(op, path) and f.due():
                _record(f, op, path)
                return f
    return None


def _record(f: Fault, op: Op, path: str) -> None:
    target = os.environ.get(LOG_ENV)
    if target:
        with open(target, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), "op": op.value, "mode": f.mode.value, "after": f.after,
                                  "path": path, "t": time.time()}) + "\n")


def _raise(f: Fault, op: Op, path: str) -> None:
    if f.mode is Mode.OVERWRITE:
        return  # applied by the call itself (see blind)
    if f.mode is Mode.DELAY:
        time.sleep(f.delay_s)
        return
    if f.mode is Mode.LATENCY:
        time.sleep(f.latency())
        return
    when = "after the call took effect" if f.after else "before the call"
    if f.mode is Mode.EXISTS:
        raise FileExistsError(errno.EEXIST, f"injected: {path} answered 'already exists' ({when})")
    if f.mode is Mode.HTTP500:
        raise InjectedNetworkFault(f"injected HTTP 500 Internal Server Error on {op.value} {path} ({when})")
    if f.transient:
        raise InjectedNetworkFault(f"injected connection reset on {op.value} {path} ({when})")
    raise InjectedFault(errno.EIO, f"injected I/O error on {op.value} {path} ({when})")


def before(op: Op, path: str) -> None:
    """Called before a storage call: may raise, or delay it."""
    if _plan is None and _loaded:
        return
    _point(op, path, after=False)


def _special(mode: Mode, op: Op, path: str, applies: Callable[[Fault], bool] = lambda f: True) -> Fault | None:
    """The fault of ``mode`` (one the caller applies itself) that fires on this call, if any."""
    if not _loaded:
        _load()
    if _plan is None:
        return None
    with _lock:
        for f in _plan:
            if f.mode is mode and f.matches(op, path) and applies(f) and f.due():
                _record(f, op, path)
                return f
    return None


def blind(op: Op, path: str) -> bool:
    """Whether this conditional write must ignore its condition (an OVERWRITE fault fires)."""
    if _plan is None and _loaded:
        return False
    return _special(Mode.OVERWRITE, op, path) is not None


def after(op: Op, path: str) -> None:
    """Called once a storage call took effect: may raise as if its response was lost."""
    if _plan is None and _loaded:
        return
    _point(op, path, after=True)


def _point(op: Op, path: str, after: bool) -> None:
    f = _fire(op, path, after)
    if f is not None:
        _raise(f, op, path)


def listing(path: str, names: list[str]) -> list[str]:
    """A folder listing as a racing creator's would look: entries a HIDE fault names are missing."""
    if _plan is None and _loaded:
        return names
    f = _special(Mode.HIDE, Op.LIST, path, lambda f: any(f.hide in n for n in names))
    return names if f is None else [n for n in names if f.hide not in n]
