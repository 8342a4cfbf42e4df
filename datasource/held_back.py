"""One WARN line when an open transaction holds a READ_COMMITTED read back.

Such a read returns only what lies before the transaction's first entry, plain messages after it
included, and nothing else says so: the query just looks short. Naming the transaction, its
owner and its age against its timeout tells the user whether to wait or abort it.
"""
from __future__ import annotations

import logging

from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.state import VisibilityFilter
from pulsartx.coordinator.registry import Coordinators
from pulsartx.observe.holdback import HoldBack, holding_back
from pulsartx.storage.cli_command import cli_command

log = logging.getLogger("pulsartx.datasource")


def held_back(tcs: Coordinators, buffers: dict[str, TransactionBuffer], filters: dict[str, VisibilityFilter]
              ) -> list[list[HoldBack]]:
    """The partitions a read planned with ``filters`` stops short on, grouped by the transaction
    holding them (oldest partition name first)."""
    by_txn: dict[str, list[HoldBack]] = {}
    for name in sorted(buffers):
        hb = holding_back(tcs, name, buffers[name].state(refresh=False), filters[name].read_limit)
        if hb is not None:
            by_txn.setdefault(str(hb.txn_id), []).append(hb)
    return list(by_txn.values())


def warn_held_back(tcs: Coordinators, buffers: dict[str, TransactionBuffer],
                   filters: dict[str, VisibilityFilter]) -> None:
    for group in held_back(tcs, buffers, filters):
        where = ", ".join(f"{h.partition} at {h.max_read_position} ({h.held_entries} entries after it)"
                          for h in group)
        first = group[0]
        abort = cli_command(tcs.root, "transactions", "abort", f"{first.txn_id.most_bits}:{first.txn_id.least_bits}")
        log.warning("READ_COMMITTED read held back by open %s: it holds maxReadPosition of %s; the read returns "
                    "only what is before it. Wait for it to commit, abort or time out, or abort it with `%s` if its "
                    "owner is gone", first.describe(), where, abort)
