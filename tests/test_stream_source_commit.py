"""The streaming source's ``commit(end)`` after a pulsartx sink already acknowledged the batch's
input inside its transaction: nothing to write. The sink runs in another process, so this
process's cached subscription state is stale by then; the source must not attempt a cursor write
on it (each attempt wrote a data file and lost its commit race: four per micro-batch with four
input partitions)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from _reads import offset_numbers
from pulsartx.datasource.options import parse_stream_options
from pulsartx.datasource.stream_reader import PulsarTxStreamReader
from test_consumer import seed

import pulsartx
from pulsartx.naming import TopicName
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.store import SubscriptionStore, shared_store

_WATCH: dict[str, Any] = {"dir": None, "written": []}


def _audit(event: str, args: tuple) -> None:
    """Files opened for writing under the watched directory (Python-level opens: the Delta commit
    attempt; the data file goes through pyarrow and is deleted again when the commit loses)."""
    if event == "open" and _WATCH["dir"] and isinstance(args[0], str) and args[0].startswith(_WATCH["dir"]):
        mode, flags = args[1], args[2]
        if (mode and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR)):
            _WATCH["written"].append(args[0])


sys.addaudithook(_audit)


def test_source_commit_writes_nothing_when_the_sink_already_acknowledged(root: str, tmp_path: Path) -> None:
    with pulsartx.Client(root) as client:
        seed(client, "in", 6)
    reader = PulsarTxStreamReader(parse_stream_options({"service.url": root, "topic": "in", "subscription": "s",
                                                        "startingOffsets": "earliest"}))
    start = reader.initialOffset()
    assert offset_numbers(start) == {"public/default/in": {"0": 0}}
    reader.commit({"public/default/in": {"0": 3}})  # no sink acknowledged these: the source moves the cursor
    partition = TopicName.parse("in").with_partition(0)
    cached = shared_store(StorageRoot.resolve(root), partition, "s")
    assert cached.cursor().mark_delete == 2
    # The sink (another process: its own store) acknowledges up to 5 within its transaction.
    other = SubscriptionStore(StorageRoot.resolve(root), partition, "s")
    other.update(lambda c: c.ack_cumulative(5))
    _WATCH["dir"] = os.path.join(root, *cached.segments)
    try:
        reader.commit({"public/default/in": {"0": 6}})
    finally:
        _WATCH["dir"] = None
    assert _WATCH["written"] == []  # no commit attempted
    assert cached.cursor().mark_delete == 5


def test_source_commit_moves_every_partition_behind_and_leaves_the_others(root: str, tmp_path: Path) -> None:
    """The partitions are committed side by side: each one behind moves to exactly ``end - 1``, one
    the sink already moved past is left alone, one at offset 0 is skipped, and the hand-off record
    goes only after all of them."""
    from pulsartx.commit_protocol import handoff

    with pulsartx.Client(root) as client:
        seed(client, "many", 40, partitions=4, keyed=True)
    reader = PulsarTxStreamReader(parse_stream_options({"service.url": root, "topic": "many", "subscription": "s",
                                                        "startingOffsets": "earliest"}))
    start = reader.initialOffset()
    assert offset_numbers(start) == {"public/default/many": {str(i): 0 for i in range(4)}}
    r = StorageRoot.resolve(root)
    parts = [TopicName.parse("many").with_partition(i) for i in range(4)]
    SubscriptionStore(r, parts[1], "s").update(lambda c: c.ack_cumulative(6))  # the sink, past the end
    end = {"public/default/many": {"0": 3, "1": 2, "2": 0, "3": 5}}
    handoff.record(r, "s", start, end)
    reader.commit(end)
    assert [shared_store(r, p, "s").cursor().mark_delete for p in parts] == [2, 6, -1, 4]
    assert r.listdir("streaming", "handoff", handoff.offsets_key(end)) == []
