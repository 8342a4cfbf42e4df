"""A completer whose clock runs more than an hour behind writes marker guards that are already
expired (a guard's ``lastUpdated`` is the writer's clock less the table's app-id retention, plus
an hour), so the next process completing the same transaction writes its marker again. That is
harmless because every reader decides a transaction by its first marker in a partition: the
transaction buffer's fold (a decided transaction stays in its memory while its TC has not
finished it, and a repeated marker of a remembered one changes nothing), the client readers and
the Spark cut built on it, compaction (which keeps markers as they are and drops what the first
marker makes a straggler), retention (which keeps the first marker while data after it remains)
and the interop SQL of docs/interop.md (``nth = 1``)."""
from __future__ import annotations

import os
import subprocess
import sys

from _procs import count_markers
from _reads import committed_values
from pulsartx.datasource.visibility import plan_visibility
from test_interop import recipe_reads

import pulsartx
import pulsartx.buffer.state as state_mod
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.markers import marker_app_id
from pulsartx.buffer.reads import VisibilityReader
from pulsartx.buffer.state import txn_key
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.coordinator.state import TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.log.partition import PartitionLog, build_records, partition_segments
from pulsartx.maintenance.compaction import compact_partition
from pulsartx.maintenance.retention import apply_retention
from pulsartx.naming import TopicName
from pulsartx.storage import faults
from pulsartx.storage.faults import Fault, Op

P0 = TopicName.parse("g-partition-0")
P1 = TopicName.parse("g-partition-1")
BEHIND = """
import sys, time
real = time.time
time.time = lambda: real() - 2 * 3600  # this process's clock runs two hours behind
import pulsartx
c = pulsartx.Client(sys.argv[1], coordinator_config=pulsartx.coordinator.coordinator.CoordinatorConfig(
    recovery_grace_ms=10**9))
txn = c.new_transaction()
c.create_producer("g-partition-0").send(b"t0", txn=txn)
c.create_producer("g-partition-1").send(b"t1", txn=txn)
txn.commit()
c.flush(1)  # partition 0's marker is written; partition 1's keeps failing (close() leaves it to recovery)
print("txn", txn.id.most_bits, txn.id.least_bits, flush=True)
c.close()
"""


def _commit_behind(root: str) -> TxnID:
    """A transaction committed on both partitions by a process whose clock runs two hours behind,
    left COMMITTING with its marker written on partition 0 only."""
    # In the child, partition 1 takes its data (its first commit), then no marker (every commit after).
    marker_fault = Fault(Op.CREATE, match="/".join(partition_segments(P1)) + "/_delta_log", nth=2, times=10**6)
    env = {**os.environ, faults.ENV: faults.env_value([marker_fault])}
    run = subprocess.run([sys.executable, "-c", BEHIND, root], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("txn ")]
    return TxnID(*map(int, line.split()[1:]))


def test_a_marker_repeated_after_a_completer_with_a_slow_clock_changes_nothing_anyone_reads(tmp_path):
    """Safe on the code as it was (the fold, readers, compaction, retention, the SQL); the fold's
    part needs the decided transaction to be remembered, which the buffer now guarantees while its
    TC has not finished it (tests/test_forgotten_transactions.py)."""
    root = str(tmp_path / "root")
    c = pulsartx.Client(root, coordinator_config=CoordinatorConfig(recovery_grace_ms=10**9))  # recovers when told
    c.admin.create_topic("g", partitions=2)
    p0 = c.create_producer("g-partition-0")
    p0.send(b"before")
    p0.flush()
    txn_id = _commit_behind(root)
    tc = c._coordinators().tc(txn_id.most_bits)
    assert tc.get(txn_id, refresh=True).status is TxnStatus.COMMITTING
    plog = PartitionLog(c.root, P0)
    plog.refresh()
    assert plog._appender().txn_version(marker_app_id(txn_id)) is None  # its guard: expired as written
    # A zombie of the transaction appends after its marker, and the partition goes on.
    PartitionLog(c.root, P0).append(build_records([b"straggler"], txn=txn_id.as_tuple()))  # offset 3
    p0.send(b"middle")
    p0.flush()
    # Recovery (any process sweeping the TC log, with a correct clock) completes the transaction:
    # the guard it checks is gone, so partition 0 gets the marker a second time.
    assert tc.sweep(grace_ms=0).completed == 1
    assert tc.get(txn_id, refresh=True).status is TxnStatus.COMMITTED
    p0.send(b"after")
    p0.flush()
    key = (txn_id.most_bits, txn_id.least_bits)
    assert count_markers(root, "g", 2) == {(0, "TXN_COMMIT", key): 2, (1, "TXN_COMMIT", key): 1}
    rows = PartitionLog(c.root, P0).read(0, 7, ["offset", "type", "value"]).to_pylist()
    assert [(r["offset"], r["type"], r["value"]) for r in rows] == [
        (0, "DATA", b"before"), (1, "DATA", b"t0"), (2, "TXN_COMMIT", b""), (3, "DATA", b"straggler"),
        (4, "DATA", b"middle"), (5, "TXN_COMMIT", b""), (6, "DATA", b"after")]
    expected = [(0, b"before"), (1, b"t0"), (4, b"middle"), (6, b"after")]

    def everyone_reads(log_from: int = 0) -> None:
        want = [(o, v) for o, v in expected if o >= log_from]
        fresh = TransactionBuffer(PartitionLog(c.root, P0)).state()
        assert (fresh.ongoing, fresh.read_limit) == ({}, 7)
        if log_from <= 2:
            assert fresh.ended[txn_key(*key)] == 2  # the first marker decides
        with pulsartx.Client(root) as reader:
            assert committed_values(reader, "g-partition-0") == [v for _, v in want]
        f = plan_visibility(c.root, {"p0": PartitionLog(c.root, P0)}, "READ_COMMITTED")["p0"].filter
        assert [(r["offset"], r["value"]) for r in f.apply(PartitionLog(c.root, P0).read(0, 7)).to_pylist()] == want
        assert recipe_reads(root, "g", 0) == {"duckdb": want, "polars": want}

    everyone_reads()
    # Retention asked to keep only the straggler's file on keeps the first marker too.
    files = PartitionLog(c.root, P0).refresh().files
    assert [(f.min_offset, f.max_offset) for f in files] == [(o, o) for o in range(7)]
    res = apply_retention(c.root, P0, max_bytes=sum(f.size for f in files[3:]), force=True)
    assert res.new_start_offset == 2
    everyone_reads(log_from=2)
    # Compaction drops the straggler and keeps both markers where they were.
    res = compact_partition(c.root, P0)
    assert (res.skipped, res.rows_dropped) == (None, 1)
    assert [r["offset"] for r in PartitionLog(c.root, P0).read(0, 7, ["offset"]).to_pylist()] == [2, 4, 5, 6]
    everyone_reads(log_from=2)
    # With no straggler left, the first marker may go: the second is then the first in the log.
    res = apply_retention(c.root, P0, max_bytes=1, force=True)
    assert res.new_start_offset == PartitionLog(c.root, P0).refresh().files[-1].min_offset > 2
    everyone_reads(log_from=res.new_start_offset)
    assert committed_values(c, "g-partition-1") == [b"t1"]
    c.close()


def test_a_repeated_marker_does_not_end_a_straggler_of_a_decided_transaction_the_buffer_forgot(tmp_path, monkeypatch):
    """The same repeated marker, after partition 0 went on with more plain commits than the buffer
    remembers while the transaction was still COMMITTING. Fails before the fix: a reader's buffer
    had forgotten the first marker, so the straggler looked like the start of a transaction that
    the repeated marker then committed, and every pulsartx reader returned it (the SQL did not)."""
    monkeypatch.setattr(state_mod, "MAX_ENDED", 2)
    root = str(tmp_path / "root")
    c = pulsartx.Client(root, coordinator_config=CoordinatorConfig(recovery_grace_ms=10**9))
    c.admin.create_topic("g", partitions=2)
    p0 = c.create_producer("g-partition-0")
    p0.send(b"before")
    p0.flush()
    txn_id = _commit_behind(root)  # t0 at 1, its first marker at 2
    for i in range(3):  # 3..8
        t = c.new_transaction()
        p0.send(f"n{i}".encode(), txn=t)
        t.commit()
        assert c.flush()  # its marker, written in the background, lands before the next data
    vis = VisibilityReader(c, PartitionLog(c.root, P0), "READ_COMMITTED")  # a reader catches up, and
    assert vis.end_position() == 9
    assert vis.buffer.take_snapshot()  # its buffer is snapshotted: later readers fold on from there
    PartitionLog(c.root, P0).append(build_records([b"straggler"], txn=txn_id.as_tuple()))  # 9
    tc = c._coordinators().tc(txn_id.most_bits)
    assert tc.sweep(grace_ms=0).completed == 1  # the repeated marker at 10
    p0.send(b"after")  # 11
    p0.flush()
    key = (txn_id.most_bits, txn_id.least_bits)
    assert count_markers(root, "g", 2)[(0, "TXN_COMMIT", key)] == 2
    want = [(0, b"before"), (1, b"t0"), (3, b"n0"), (5, b"n1"), (7, b"n2"), (11, b"after")]
    with pulsartx.Client(root) as reader:
        assert committed_values(reader, "g-partition-0") == [v for _, v in want]
    f = plan_visibility(c.root, {"p0": PartitionLog(c.root, P0)}, "READ_COMMITTED")["p0"].filter
    assert [(r["offset"], r["value"]) for r in f.apply(PartitionLog(c.root, P0).read(0, 12)).to_pylist()] == want
    assert recipe_reads(root, "g", 0) == {"duckdb": want, "polars": want}
    c.close()
