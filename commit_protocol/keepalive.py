"""Keep a Spark driver's transactions alive while the driver lives (docs/design/transaction-keep-alive.md).

A micro-batch's or write job's transaction carries a short timeout (option ``transactionTimeoutMs``,
30 s by default) and the driver's identity (:data:`DRIVER_PROPERTY`). While the driver JVM lives, a
keeper extends every OPEN transaction of that identity (:meth:`TransactionCoordinator.extend`) a
third of the timeout at a time, so a batch or job that runs for an hour is never aborted; once the
driver dies (SIGKILL, lost node) nobody extends it, and the first READ_COMMITTED reader or sweeper
to look after the timeout aborts it.

Where the keeper runs: pyspark starts the code that begins a transaction (``writer()``,
``streamWriter()``) in a planner worker that goes back to an idle pool afterwards and is killed
after a minute idle; the user's Python process may not exist at all (Spark Connect, a Scala
driver); the driver JVM runs no code of ours. So the process that begins a transaction makes sure
one small *keeper process* exists per (driver JVM, storage root): it is started detached, holds an
``flock`` on a file named after both (so there is exactly one), polls the JVM's pid and start time,
and exits when the JVM is gone. It finds the transactions to extend in the TC logs themselves (by
:data:`DRIVER_PROPERTY`), so nothing has to be handed to it. Until it is up (about a second), a
thread in the beginning process extends the transactions that process began.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pulsartx.commit_protocol.driver import driver_jvm

from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.state import TxnMeta, TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.exceptions import PulsarException
from pulsartx.storage.root import StorageRoot

log = logging.getLogger("pulsartx.commit_protocol.keepalive")
DRIVER_PROPERTY = "pulsartx.keepAlive.driver"  # "<host>:<jvm pid>:<jvm start>" of the driver keeping it alive
TIMEOUT_PROPERTY = "pulsartx.keepAlive.timeoutMs"  # how far each extension moves the deadline
MIN_TICK_S = 0.05  # the shortest sleep between two looks (timeouts of a fraction of a second)
LIVENESS_S = 0.5  # how often the keeper process looks for its driver
IDLE_EXIT_S = 60.0  # a keeper with nothing to keep this long leaves (the next transaction starts one)
# The longest sleep between two looks at the TC logs, whatever the timeouts seen so far: a third of
# the default transactionTimeoutMs. Sleeping a third of a long timeout (20 min after a job with an
# hour's) left a later transaction of a shorter timeout unextended until it expired.
MAX_SCAN_S = 10.0


@dataclass(frozen=True)
class Driver:
    """The driver JVM a transaction is kept alive by: alive while that pid has that start time."""

    host: str
    pid: int
    start: str  # /proc start time in clock ticks; "?" where unknown (then the pid alone is checked)

    @classmethod
    def current(cls) -> Driver:
        pid, start = driver_jvm()
        return cls(socket.gethostname(), pid, start)

    @property
    def identity(self) -> str:
        return f"{self.host}:{self.pid}:{self.start}"

    def alive(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            return False
        except OSError:
            return _pid_exists(self.pid)
        if self.start == "?":
            return True
        fields = stat.rsplit(")", 1)[1].split()
        return fields[19] == self.start and fields[0] != "Z"


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def properties(timeout_ms: int, driver: Driver | None = None) -> dict[str, str]:
    """The TC-entry properties that put a transaction under its driver's keep-alive."""
    return {DRIVER_PROPERTY: (driver or Driver.current()).identity, TIMEOUT_PROPERTY: str(int(timeout_ms))}


def kept_by(meta: TxnMeta, driver: Driver) -> int | None:
    """The keep-alive timeout of an OPEN transaction ``driver`` keeps alive, else None."""
    if meta.status is not TxnStatus.OPEN or meta.properties.get(DRIVER_PROPERTY) != driver.identity:
        return None
    try:
        return int(meta.properties[TIMEOUT_PROPERTY])
    except (KeyError, ValueError):
        return None


def due(meta: TxnMeta, timeout_ms: int, now: int) -> bool:
    """Extend once less than two thirds of the timeout is left: two more tries before it passes."""
    return meta.start_ms + meta.timeout_ms - now < timeout_ms * 2 // 3


def extend_due(tcs: Coordinators, metas: Iterable[TxnMeta], driver: Driver) -> tuple[int, list[TxnID]]:
    """Extend those of ``metas`` that ``driver`` keeps alive and that are due. Returns (the
    shortest keep-alive timeout among them, or 0, and the ones that can no longer be extended)."""
    shortest, gone = 0, []
    for meta in metas:
        timeout = kept_by(meta, driver)
        if timeout is None:
            gone.append(meta.txn_id)
            continue
        shortest = timeout if not shortest else min(shortest, timeout)
        tc = tcs.for_txn(meta.txn_id)
        if not due(meta, timeout, tc.keep_alive_now(meta.txn_id)):  # not the wall clock: it may have stepped back
            continue
        try:
            tc.extend(meta.txn_id, timeout)
        except PulsarException as e:  # decided, expired or fenced meanwhile: nothing left to keep
            log.debug("keep-alive of %s ends: %s", meta.txn_id, e)
            gone.append(meta.txn_id)
        except Exception as e:  # storage trouble: try again at the next tick, well before the deadline
            log.warning("keep-alive of transaction %s failed (retrying): %s", meta.txn_id, e)
    return shortest, gone


# ---- in the process that begins a transaction ------------------------------------------------------
class _LocalKeeper:
    """A daemon thread extending the transactions this process began, until the keeper process
    (which may take a second to start) has them, and for as long as this process lives."""

    def __init__(self, root: StorageRoot, driver: Driver):
        self.root, self.driver = root, driver
        self.txns: dict[TxnID, int] = {}
        self.cond = threading.Condition()
        threading.Thread(target=self._run, name="pulsartx-keepalive", daemon=True).start()

    def add(self, txn_id: TxnID, timeout_ms: int) -> None:
        with self.cond:
            self.txns[txn_id] = timeout_ms
            self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.txns:
                    self.cond.wait()
                txns = list(self.txns)
            try:
                self._look(txns)
            except Exception as e:  # the thread must survive anything: the next look may succeed
                log.warning("keep-alive of %s failed (retrying): %s", [str(t) for t in txns], e)
            with self.cond:
                # Woken by add(): a new transaction may have a shorter timeout than any kept so far.
                tick = min(self.txns.values(), default=MAX_SCAN_S * 1000) / 3000.0
                self.cond.wait(min(MAX_SCAN_S, max(MIN_TICK_S, tick)))

    def _look(self, txns: list[TxnID]) -> None:
        if not self.driver.alive():
            with self.cond:
                self.txns.clear()
            return
        tcs = Coordinators.shared(self.root)
        metas = []
        for t in txns:
            try:
                metas.append(tcs.for_txn(t).get(t, refresh=True))
            except PulsarException:
                with self.cond:
                    self.txns.pop(t, None)
            except Exception as e:
                log.warning("keep-alive of transaction %s: cannot read it (retrying): %s", t, e)
        _, gone = extend_due(tcs, metas, self.driver)
        with self.cond:
            for t in gone:
                self.txns.pop(t, None)


_local: dict[tuple[str, str], _LocalKeeper] = {}
_local_lock = threading.Lock()


def keep_alive(root: StorageRoot, txn_id: TxnID, timeout_ms: int, driver: Driver | None = None) -> None:
    """Keep ``txn_id`` (begun with :func:`properties`) alive while its driver lives: a thread here
    at once, and the driver's keeper process (started if there is none)."""
    driver = driver or Driver.current()
    with _local_lock:
        k = (root.url, driver.identity)
        local = _local.get(k)
        if local is None:
            local = _local[k] = _LocalKeeper(root, driver)
    local.add(txn_id, timeout_ms)
    try:
        ensure_keeper(root, driver, timeout_ms)
    except Exception as e:  # the thread here still keeps it alive while this process lives
        log.warning("could not start the keep-alive process for %s: %s", root.url, e)


def lock_path(root: StorageRoot, driver: Driver) -> str:
    folder = os.path.join(tempfile.gettempdir(), f"pulsartx-keepalive-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    digest = hashlib.sha1(f"{driver.identity}|{root.url}".encode()).hexdigest()[:20]
    return os.path.join(folder, f"{driver.pid}-{digest}.lock")


def ensure_keeper(root: StorageRoot, driver: Driver, timeout_ms: int) -> int | None:
    """Start the keeper process of (driver, root) unless one runs. Returns the new keeper's pid, or
    None when one was already running. The lock is taken here and handed to the child, so two
    processes beginning transactions at once cannot start two keepers."""
    fd = os.open(lock_path(root, driver), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # a keeper holds it
        proc = subprocess.Popen([sys.executable, "-m", "pulsartx.commit_protocol.keepalive", str(fd)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, pass_fds=(fd,),
                                start_new_session=True, close_fds=True)
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps((root, driver, int(timeout_ms))))
        proc.stdin.close()
        # Reap it when it exits (it outlives this process in general; then init reaps it).
        threading.Thread(target=proc.wait, name="pulsartx-keepalive-reaper", daemon=True).start()
        return proc.pid
    finally:
        os.close(fd)  # the child holds the lock through its inherited descriptor


# ---- the keeper process -----------------------------------------------------------------------------
def keeper_loop(root: StorageRoot, driver: Driver, timeout_ms: int, lock_fd: int | None = None,
                stop: Callable[[], bool] = lambda: False) -> None:
    """Extend every OPEN transaction of ``driver`` on ``root`` while the driver lives: each TC log
    is read (one probe when nothing changed) every third of the shortest timeout seen, and the
    driver is looked for every LIVENESS_S, so the keeper does not linger once it is gone. It also
    leaves after IDLE_EXIT_S without a transaction to keep (see :func:`_leave_idle`), and at once
    when a local root has been deleted."""
    tcs = Coordinators.shared(root)
    next_scan, idle_since = 0.0, time.monotonic()
    while not stop():
        if not driver.alive():
            log.info("driver %s is gone: the keep-alive of its transactions ends", driver.identity)
            return
        if root.is_local and not os.path.isdir(root.url):
            return
        if time.monotonic() >= next_scan:
            seen = _scan(tcs, root, driver)
            if seen != 0:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_EXIT_S and _leave_idle(tcs, root, driver, lock_fd):
                return
            shortest = min(timeout_ms, seen) if seen > 0 else timeout_ms
            next_scan = time.monotonic() + min(MAX_SCAN_S, max(MIN_TICK_S, shortest / 3000.0))
        time.sleep(max(MIN_TICK_S, min(LIVENESS_S, next_scan - time.monotonic())))


def _scan(tcs: Coordinators, root: StorageRoot, driver: Driver) -> int:
    """One look at every TC log, extending what is due. Returns the shortest keep-alive timeout of
    the driver's OPEN transactions, 0 when it has none, -1 when a log could not be read."""
    seen = 0
    for tc_id in range(tcs.count):
        try:
            metas = [m for m in tcs.tc(tc_id).transactions(refresh=True) if m.status is TxnStatus.OPEN]
        except Exception as e:
            log.warning("keep-alive: TC %d of %s cannot be read now (retrying): %s", tc_id, root.url, e)
            seen = seen or -1
            continue
        t, _ = extend_due(tcs, metas, driver)
        if t:
            seen = t if seen <= 0 else min(seen, t)
    return seen


def _leave_idle(tcs: Coordinators, root: StorageRoot, driver: Driver, lock_fd: int | None) -> bool:
    """Release the keeper's lock, then look once more: a transaction begun before a starter found
    the lock held is in the TC log by then (it is written before its starter looks at the lock), so
    it is seen here, and the keeper takes the lock back and stays, unless a new keeper has taken
    it meanwhile (then that one keeps it). True: leave."""
    if lock_fd is None:
        return True
    fcntl.flock(lock_fd, fcntl.LOCK_UN)
    if _scan(tcs, root, driver) == 0:
        return True
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True  # a new keeper runs
    return False


def main() -> None:
    lock_fd = int(sys.argv[1])
    root, driver, timeout_ms = pickle.loads(sys.stdin.buffer.read())
    logging.basicConfig(level=logging.WARNING, format="pulsartx keep-alive %(levelname)s %(message)s")
    try:
        keeper_loop(root, driver, timeout_ms, lock_fd)
    finally:
        os.close(lock_fd)
    os._exit(0)  # deltalake may abort at interpreter exit (docs/design/deltalake-in-processes.md)


if __name__ == "__main__":
    main()
