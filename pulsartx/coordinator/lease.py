"""TC leases: which process begins its transactions on which TC log.

Why: there is no broker to own a TC, so every process used to begin transactions on every TC log in
turn, and before each write a process had to read the other processes' commits to that log. Adding
processes made each of them slower. Kafka and Pulsar spread coordinators over brokers; here each
process takes a lease on one TC log and begins its transactions there, so while there are at least
as many logs as processes, no two processes write the same log.

The lease is a row of the TC log itself (key ``-1``, ``metadata_op`` LEASE): owner, epoch, expiry.
It moves only by compare-and-set on that row, so the log orders every acquisition, renewal and
release, and a renewal succeeds only if the row is still the one its owner wrote last. An owner
whose lease was taken over (it was paused, or its clock ran slow) has its next renewal refused and
moves elsewhere: two processes never both hold a log's lease.

Safety never rests on the lease: every TC-log entry is a compare-and-set on its TxnID, so processes
that share a log (more processes than logs, a sweeper, an admin abort, a zombie's in-flight
transaction) stay linearizable as before. The lease decides where transactions begin; the clock
only decides when a lease may be taken over (``free_for``), never whether two writes may both land.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

LEASE_KEY = -1  # the lease row's txnid_least_bits: no TxnID is negative
LEASE_OP = "LEASE"
HELD, RELEASED = "LEASED", "RELEASED"


@dataclass(frozen=True)
class TcLease:
    """One TC log's lease as its row says. ``expires_ms`` is on the owner's clock."""

    owner: str
    epoch: int
    expires_ms: int
    released: bool = False

    def held_by(self, owner: str) -> bool:
        return not self.released and self.owner == owner

    def live_for(self, owner: str, now_ms: int) -> bool:
        """Held by ``owner`` and unexpired at ``now_ms``: a process of that name may adopt it."""
        return self.held_by(owner) and now_ms < self.expires_ms

    def free_for(self, now_ms: int, max_clock_skew_ms: int) -> bool:
        """Whether another process may take it at ``now_ms`` on its own clock: released, or expired
        by more than the clocks may disagree. A taker's clock running ahead by more than
        ``max_clock_skew_ms`` takes it early; the owner's next renewal is then refused (the row
        changed), so it costs the owner its lease, never a second owner."""
        return self.released or now_ms >= self.expires_ms + max_clock_skew_ms


def is_lease_row(row: dict[str, Any]) -> bool:
    return row["txnid_least_bits"] == LEASE_KEY


def lease_row(tc_id: int, lease: TcLease) -> dict[str, Any]:
    """The row (its ``seq`` is set by the compare-and-set)."""
    return {
        "seq": 0, "metadata_op": LEASE_OP, "txnid_most_bits": tc_id, "txnid_least_bits": LEASE_KEY,
        "expected_status": None, "new_status": RELEASED if lease.released else HELD,
        "metadata": json.dumps({"owner": lease.owner, "epoch": lease.epoch, "expires_ms": lease.expires_ms},
                               separators=(",", ":")),
    }


def lease_from_row(row: dict[str, Any] | None) -> TcLease | None:
    if row is None:
        return None
    doc = json.loads(row["metadata"])
    return TcLease(doc["owner"], int(doc["epoch"]), int(doc["expires_ms"]), row["new_status"] == RELEASED)
