"""The stream source plans a micro-batch up to the read limit it saw (``latestOffset``), then builds
the batch's visibility filter again when it plans the batch's input partitions (``partitions``),
also in a restarted query replaying the batch. A transaction decided at the first instant, with
no marker written yet, is decided only through its TC: if the TC cannot be read at the second,
the filter takes the transaction for an open one and cannot tell its data's fate."""
from __future__ import annotations

import pytest
from _reads import offset_numbers
from pulsartx.datasource.options import parse_stream_options
from pulsartx.datasource.stream_reader import PulsarTxStreamReader

import pulsartx
from pulsartx.coordinator.coordinator import TransactionCoordinator
from pulsartx.coordinator.state import TxnAction
from pulsartx.exceptions import StorageError


class _Stop(Exception):
    pass


def _decide_without_markers(client: pulsartx.Client, txn, action: TxnAction) -> None:
    """The TC logs the decision; no marker is written (as when the deciding process dies there)."""

    def stop(meta) -> None:
        raise _Stop()

    with pytest.raises(_Stop):
        client._coordinators().for_txn(txn.id).end_transaction(txn.id, action, before_participants=stop)


def test_a_batch_planned_past_what_the_tcs_can_decide_now_fails_instead_of_showing_aborted_data(root, monkeypatch):
    """Fails before the fix: the batch returned the aborted transaction's message."""
    with pulsartx.Client(root) as client:
        client.admin.create_topic("t")
        p = client.create_producer("t")
        p.send(b"before")
        txn = client.new_transaction()
        p.send(b"aborted", txn=txn)
        p.send(b"after")
        _decide_without_markers(client, txn, TxnAction.ABORT)
        reader = PulsarTxStreamReader(parse_stream_options({"service.url": root, "topic": "t",
                                                            "startingOffsets": "earliest"}))
        start = reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        assert offset_numbers(end) == {"public/default/t": {"0": 3}}  # the abort is decided: nothing holds the partition

        def unreadable(self) -> None:
            raise StorageError("TC log unreadable (injected)")

        monkeypatch.setattr(TransactionCoordinator, "refresh", unreadable)
        with pytest.raises(StorageError, match="retry"):
            rows = [v for part in reader.partitions(start, end) for b in reader.read(part)
                    for v in b.column("value").to_pylist()]
            assert b"aborted" not in rows
        monkeypatch.undo()
        rows = [v for part in reader.partitions(start, end) for b in reader.read(part)
                for v in b.column("value").to_pylist()]
        assert rows == [b"before", b"after"]
