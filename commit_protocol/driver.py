"""The Spark driver as one TC client, whichever Python worker speaks for it.

pyspark runs ``writer()``, ``streamWriter()`` and the streaming sink's commit in several Python
workers under the one driver JVM (planner workers, daemon-forked sink runners, workers it replaces
when they idle out). A lease owned per Python process would give one driver several TC leases, and
a worker that exits would leave its lease to expire while the next worker takes another. The
driver's identity is therefore the JVM's (host, pid, start time): every worker under it holds the
same lease, and the driver's jobs and micro-batches all begin on that one TC log.
"""
from __future__ import annotations

import os
import socket

from pulsartx.coordinator.registry import Coordinators
from pulsartx.storage.root import StorageRoot

_FOUND: dict[int, tuple[int, str]] = {}  # this process's pid -> its driver JVM, once found


def driver_jvm() -> tuple[int, str]:
    """(pid, start time) of the JVM that started this Python worker: the nearest ``java`` ancestor.
    ``streamWriter()`` runs in different workers (planner workers, daemon-forked sink runners) from
    batch to batch, but always under the one driver JVM of the query run.

    A process's JVM ancestor never changes, so it is looked up once per process (keyed by pid: a
    forked child looks again): the walk reads one ``/proc`` file per ancestor, and a streaming
    batch's commit asked four times (0.7 ms each). Without a JVM ancestor nothing is kept: the
    fallback, the parent's pid, can change."""
    me = os.getpid()
    found = _FOUND.get(me)
    if found is not None:
        return found
    pid = me
    for _ in range(16):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            break
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        if comm == "java":
            found = _FOUND[me] = (pid, fields[19])
            return found
        pid = int(fields[1])
        if pid <= 1:
            break
    return os.getppid(), "?"


def driver_lease_owner() -> str:
    """The owner name of the driver's TC lease (``host:pid:...`` like any lease owner)."""
    pid, start = driver_jvm()
    return f"{socket.gethostname()}:{pid}:spark-driver-{start}"


def driver_coordinators(root: StorageRoot, recover_on_open: bool = False) -> Coordinators:
    """This worker's TCs, leasing under the driver's identity."""
    tcs = Coordinators.shared(root, recover_on_open=recover_on_open)
    tcs.use_lease_owner(driver_lease_owner())
    return tcs
