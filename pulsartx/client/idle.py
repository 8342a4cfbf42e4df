"""How an idle reader or consumer waits for its next message.

A reader or consumer that finds nothing to deliver has just run a *full check*: it caught up with
its partitions, folded their transaction buffers, read its cursors and asked the TCs about undecided
transactions. Until the next one it only *probes*: does the next commit of each log it watches exist
yet? That is one stat on a local disk, one HEAD on S3, per log, and no Python state to update: on a
local disk, 9-13 us of CPU for a consumer's probes against 27-60 us for a full check that finds
nothing new (more when something changed). When a probe finds a commit, the wait ends and a full
check runs at once. Probes start 1 ms apart and the interval doubles up to
``idle_poll_max_interval_ms``, so a commit is noticed at most that long after it lands.

The watched logs are the partitions, the subscription's cursor logs (other consumers' claims and
negative acks, a reset, a transaction's acks returned), and the TC log of every transaction that
still holds data back. ``commit()`` returns at the decision, before any marker is written, so the
TC log's commit is the first sign that such a transaction became visible.

A probe cannot see everything, so other mechanisms cover the rest:
  * the consumer's own events (a negative ack, redelivery after the unacked timeout, a seek from
    another thread) end the wait through an event;
  * a negative ack's redelivery delay bounds the wait;
  * a full check runs at least every :data:`FULL_CHECK_S` anyway (or every cap, if longer). That
    covers transaction timeouts, Shared claims that expire, a Failover lease set free, and a probe
    that failed.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from pulsartx.exceptions import InvalidConfiguration
from pulsartx.storage.delta import NextCommit
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)

IDLE_POLL_MIN_S = 0.001
# The cap when none is given. On a local disk, 10 ms costs an idle consumer about half a percent of
# a core more than the 200 ms poll did (docs/design/idle-wake-on-next-commit.md). On an object store
# each probe is a billed request (a HEAD per watched log), so the default there is 10 times longer.
DEFAULT_LOCAL_MS = 10
DEFAULT_OBJECT_STORE_MS = 100
MAX_IDLE_POLL_MAX_INTERVAL_MS = 10_000
# The longest an idle reader goes without a full check: what no probe sees (timers kept in storage)
# is noticed within this, as every idle poll noticed everything before probes existed.
FULL_CHECK_S = 0.2


def idle_poll_max_interval(value: Any, root: StorageRoot) -> int:
    """The ``idle_poll_max_interval_ms`` option, validated; None is the storage's default."""
    if value is None:
        return DEFAULT_LOCAL_MS if root.is_local else DEFAULT_OBJECT_STORE_MS
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_IDLE_POLL_MAX_INTERVAL_MS:
        raise InvalidConfiguration(
            f"idle_poll_max_interval_ms={value!r}: must be an integer from 1 to {MAX_IDLE_POLL_MAX_INTERVAL_MS} "
            "(the most milliseconds an idle reader or consumer waits between two checks for a new commit), "
            f"or None ({DEFAULT_LOCAL_MS} on a local disk, {DEFAULT_OBJECT_STORE_MS} on an object store)")
    return value


class IdleWait:
    """The waits of one reader or consumer (used by one thread at a time)."""

    def __init__(self, max_interval_ms: int | None, root: StorageRoot):
        self.max_interval_s = idle_poll_max_interval(max_interval_ms, root) / 1000.0
        self.full_check_s = max(FULL_CHECK_S, self.max_interval_s)
        # Per table: (the version its reader had applied, the last commit a probe found after it). A
        # full check that does not apply a commit a probe found (a consumer whose cursor is gone
        # skips its partition) must not make every later wait end at its first probe.
        self._found: dict[tuple[str, tuple[str, ...]], tuple[int, int]] = {}
        # Kept from one wait to the next: a wait that ended for its periodic full check, which found
        # nothing, resumes at the interval it had reached instead of probing every 1 ms again.
        self._interval = IDLE_POLL_MIN_S

    def _next_version(self, w: NextCommit) -> int:
        applied, found = self._found.get(w.table, (None, -1))
        if applied != w.version:
            self._found.pop(w.table, None)
            return w.version + 1
        return max(w.version, found) + 1

    def wait(self, watches: Iterable[NextCommit], until: float, event: threading.Event | None = None) -> None:
        """Return when a watched commit exists, ``event`` is set (it is then cleared), ``until``
        (``time.monotonic()``) comes, or the next full check is due, whichever is first."""
        end = min(until, time.monotonic() + self.full_check_s)
        probes = [(w, self._next_version(w)) for w in watches]
        interval = self._interval
        while True:
            self._interval = interval
            left = end - time.monotonic()
            nap = min(interval, left) if probes else left  # nothing to probe: wait for the full check
            if nap <= 0:
                return
            if event is None:
                time.sleep(nap)
            elif event.wait(nap):
                event.clear()
                self._interval = IDLE_POLL_MIN_S
                return
            if nap < interval or not probes:  # the full check (or the caller's deadline) is due
                return
            for w, version in probes:
                try:
                    arrived = w.arrived(version)
                except Exception as e:  # not an answer: the next full check will tell
                    log.debug("probe for commit %d of %s failed: %s", version, w.tail.root.uri(*w.tail.segments), e)
                    continue
                if arrived:
                    self._found[w.table] = (w.version, version)
                    self._interval = IDLE_POLL_MIN_S  # activity: more may follow soon
                    return
            interval = min(self.max_interval_s, interval * 2)
