"""The keyed logs (TC logs, cursors, transaction keys) under storage faults: a decision is never
made on rows that lag the log, and a write is applied to memory only once it is durable."""
from __future__ import annotations

import pyarrow as pa
import pytest

from pulsartx.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.coordinator.tclog import tc_segments
from pulsartx.exceptions import InvalidTxnStatusError
from pulsartx.storage import faults
from pulsartx.storage.faults import Fault, Mode, Op
from pulsartx.storage.keyed_log import KeyedLog
from pulsartx.storage.root import StorageRoot

CFG = CoordinatorConfig(recovery_grace_ms=0)
SCHEMA = pa.schema([("seq", pa.int64(), False), ("k", pa.string(), False), ("v", pa.int64())])


pytestmark = pytest.mark.usefixtures("no_faults")  # the fixture is in conftest.py


def tc(root: StorageRoot) -> TransactionCoordinator:
    return TransactionCoordinator(root, 0, CFG).open(recover=False)


def test_one_failed_read_after_a_durable_commit_decision_cannot_split_the_outcome(tmp_path):
    """Two coordinators of one TC log (two processes' worth of state). A's COMMITTING lands, then
    reading B's newer entry fails. Fails before the fix: A's put raised although its commit was
    durable, its rows stayed OPEN, and A's following abort was decided on them and written with
    the same seq as the COMMITTING: B then saw one outcome and A reported the other."""
    root = StorageRoot.resolve(str(tmp_path))
    a, b = tc(root), tc(root)
    t = a.new_transaction(60_000, partitions=["persistent://public/default/x-partition-0"]).txn_id
    b.get(t, refresh=True)
    b.new_transaction(60_000)  # an entry of B's that A has not read yet
    data_files = "/".join(tc_segments(0)) + "/part-"
    faults.install([Fault(Op.READ, match=data_files)])
    decided = a.end_transaction(t, TxnAction.COMMIT, before_participants=lambda m: None)
    assert faults.plan()[0].fired == 1
    assert decided.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED)
    faults.clear()
    with pytest.raises(InvalidTxnStatusError):
        a.end_transaction(t, TxnAction.ABORT)
    a_view = a.get(t, refresh=True).status
    b_view = b.get(t, refresh=True).status
    fresh = tc(root).get(t).status
    assert a_view == b_view == fresh
    assert fresh in (TxnStatus.COMMITTING, TxnStatus.COMMITTED)


def test_a_put_whose_own_commit_landed_is_applied_even_if_reading_others_fails(tmp_path):
    """Fails before the fix: the writer's version moved past its own commit but its rows did not
    (put raised), so the next compare-and-set of that key wrote the same seq again."""
    root = StorageRoot.resolve(str(tmp_path))
    mine = KeyedLog(root, ("kl",), SCHEMA, key_of=lambda r: r["k"], name="kl").open()
    theirs = KeyedLog(root, ("kl",), SCHEMA, key_of=lambda r: r["k"], name="kl").open()
    theirs.put([{"seq": 0, "k": "other", "v": 1}])
    faults.install([Fault(Op.READ, match="kl/part-")])
    mine.put([{"seq": 0, "k": "x", "v": 1}])
    assert faults.plan()[0].fired == 1
    faults.clear()
    assert mine.get("x") == {"seq": 0, "k": "x", "v": 1}
    assert mine.get("other") == {"seq": 0, "k": "other", "v": 1}
    assert mine.cas("x", lambda cur: ({"k": "x", "v": cur["v"] + 1}, cur["seq"]), what="x") == 0
    fresh = KeyedLog(root, ("kl",), SCHEMA, key_of=lambda r: r["k"], name="kl").open()
    assert fresh.get("x") == {"seq": 1, "k": "x", "v": 2}


def test_a_write_whose_answer_was_lost_is_reported_as_what_the_reloaded_log_shows(tmp_path):
    """The commit landed, the put answered with an error and reading the slot back failed: the log
    reloads and reports the write as done, because it is."""
    root = StorageRoot.resolve(str(tmp_path))
    log = KeyedLog(root, ("kl",), SCHEMA, key_of=lambda r: r["k"], name="kl").open()
    faults.install([Fault(Op.CREATE, Mode.LOST, match="kl/_delta_log"), Fault(Op.READ, match="kl/_delta_log")])
    log.put([{"seq": 0, "k": "x", "v": 1}])
    assert [f.fired for f in faults.plan()] == [1, 1]
    assert log.get("x") == {"seq": 0, "k": "x", "v": 1}


def test_a_write_whose_outcome_cannot_be_learned_is_outcome_unknown_and_reread_later(tmp_path, monkeypatch):
    """...and when the table cannot be re-read either, for the whole retry budget, the answer is
    OutcomeUnknown (never a guessed failure), and the log reloads before anything is decided on it."""
    from pulsartx.storage.delta import RETRY_ENV, OutcomeUnknown

    monkeypatch.setenv(RETRY_ENV, "0.5")
    root = StorageRoot.resolve(str(tmp_path))
    log = KeyedLog(root, ("kl",), SCHEMA, key_of=lambda r: r["k"], name="kl").open()
    faults.install([Fault(Op.CREATE, Mode.LOST, match="kl/_delta_log"),
                    Fault(Op.READ, match="kl/_delta_log", times=10_000), Fault(Op.DELTA, match="kl")])
    with pytest.raises(OutcomeUnknown):
        log.put([{"seq": 0, "k": "x", "v": 1}])
    faults.clear()
    assert log.get("x") == {"seq": 0, "k": "x", "v": 1}  # reloaded: the write did land
    assert log.cas("x", lambda cur: ({"k": "x", "v": 5}, None), what="x") is None
    assert KeyedLog(root, ("kl",), SCHEMA, key_of=lambda r: r["k"], name="kl").open().get("x")["seq"] == 1


def test_a_reload_that_fails_reading_the_rows_leaves_nothing_half_loaded_for_a_compaction(tmp_path):
    """Fails before the fix: open() installed the new snapshot's file list, then failed reading
    its rows, and left the log looking loaded with no rows; a compaction after one more write
    kept only that row and removed every file, dropping an ABORTING transaction from a TC log
    (its marker was then never written; found by the fault matrix)."""
    root = StorageRoot.resolve(str(tmp_path))

    def klog() -> KeyedLog:
        return KeyedLog(root, ("kl",), SCHEMA, key_of=lambda r: r["k"], name="kl").open()

    a = klog()
    for i, k in enumerate(["a", "b", "c"]):
        a.put([{"seq": 0, "k": k, "v": i}])
    b = klog()
    faults.install([Fault(Op.READ, match="/kl/part-")])
    with pytest.raises(Exception, match="injected"):
        b.open()
    faults.clear()
    b.put([{"seq": 0, "k": "d", "v": 3}])
    b.compact(lambda r: True)
    assert {k: r["v"] for k, r in klog().rows.items()} == {"a": 0, "b": 1, "c": 2, "d": 3}
