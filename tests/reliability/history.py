"""History recorder for the reliability suites, in the shape Jepsen uses for Kafka and Bufstream.

Every worker process appends one JSON object per line to its own history file: an ``invoke`` when
it starts an operation, then ``ok`` (it definitely happened), ``fail`` (it definitely did not) or
``info`` (unknown: an error that may have come after the effect, or the process was killed before
it could say). Each line is a single ``os.write`` on an ``O_APPEND`` descriptor, so a SIGKILL
loses at most the line being written, never an earlier one: the history of a killed process is
exactly what it had done up to the kill.

Operations (``f``) and the fields the checker reads:

* ``begin``  ok: ``txn`` (``[most, least]``)
* ``send``   invoke: ``topic``, ``value``, ``txn`` (None for a plain send); ok: ``partition``, ``offset``
* ``commit`` / ``abort``  invoke and ok/fail/info: ``txn``
* ``ack``    ok: ``txn``, ``topic``, ``sub``, ``msgs`` (``[[partition, offset, value], ...]``)
* ``poll``   ok: ``consumer``, ``epoch``, ``topic``, ``msgs``, ``sub`` (None for a reader); a consumer bumps ``epoch`` whenever
  redelivery may legitimately go back (a new consumer, an aborted transaction's acks)
* ``read``   ok: a batch read of several partitions at one moment: ``topics``, ``msgs``
  (``[[topic, partition, offset, value], ...]``)
* ``mrp``    ok: a maxReadPosition sample: ``topic``, ``partition``, ``blocked_at`` (first offset of
  the oldest transaction holding the partition back, or None) and ``t`` (wall clock, seconds)

Every event's ``t`` (and a read's ``started``, a sample's ``t``) is the observer's clock,
:func:`now`: the checker orders events of different processes by it (a read begun after a commit
returned must see it), so it must be one clock for all of them. A fault that skews a process's
clock (``soak.worker``'s ``skew_s`` replaces its ``time.time``) skews what the system under test
sees, never the history: stamped with the skewed clock, a producer 8 days behind had every commit
"return" before every read began, and concurrent reads were reported as stale.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
# Bound at import, before a worker skews its process's ``time.time`` (see the module doc).
_observer_time = time.time


def now() -> float:
    """The observer's wall clock (seconds), which no injected clock skew moves."""
    return _observer_time()


class History:
    """Append-only JSON-lines history of one process (safe across SIGKILL, see the module doc)."""

    def __init__(self, path: str | os.PathLike, process: str):
        self.path = str(path)
        self.process = process
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._seq = 0
        self._lock = threading.Lock()  # workers may record from several threads

    def _write(self, kind: str, f: str, fields: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._seq += 1
            ev = {"p": self.process, "i": self._seq, "t": now(), "type": kind, "f": f, **fields}
            os.write(self._fd, (json.dumps(ev, separators=(",", ":")) + "\n").encode())
        return ev

    def invoke(self, f: str, **fields: Any) -> dict[str, Any]:
        return self._write(INVOKE, f, fields)

    def ok(self, f: str, **fields: Any) -> dict[str, Any]:
        return self._write(OK, f, fields)

    def fail(self, f: str, error: BaseException | str, **fields: Any) -> dict[str, Any]:
        return self._write(FAIL, f, {"error": _err(error), **fields})

    def info(self, f: str, error: BaseException | str, **fields: Any) -> dict[str, Any]:
        return self._write(INFO, f, {"error": _err(error), **fields})

    def close(self) -> None:
        os.close(self._fd)


def _err(e: BaseException | str) -> str:
    return e if isinstance(e, str) else f"{type(e).__name__}: {e}"[:300]


def txn_list(txn: Any) -> list[int] | None:
    """A client Transaction (or TxnID) as the JSON ``[most, least]`` the histories use."""
    if txn is None:
        return None
    tid = getattr(txn, "id", txn)
    return [tid.most_bits, tid.least_bits]


def read_events(paths: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    """All events of the given history files; a torn last line (killed mid-write) is dropped."""
    out: list[dict[str, Any]] = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def history_files(directory: str | os.PathLike) -> Iterator[Path]:
    return iter(sorted(Path(directory).glob("*.jsonl")))
