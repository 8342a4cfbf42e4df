"""Once a transaction's decision (COMMITTING/ABORTING) is durable, the caller is told that
decision, whatever fails after it: the markers, the pending-ack commits and the final record are
completed by recovery. Reporting a failure there would make a Spark job look failed while its
data commits, and a re-run would write it twice."""
from __future__ import annotations

import pytest
from _reads import committed_values  # tests/ is on sys.path (conftest)
from reliability.final import config

import pulsartx
from pulsartx.coordinator.state import TxnStatus
from pulsartx.coordinator.tclog import tc_segments
from pulsartx.storage import faults
from pulsartx.storage.faults import Fault, Op

pytestmark = pytest.mark.usefixtures("no_faults")  # the fixture is in conftest.py


@pytest.mark.parametrize("action", ["commit", "abort"])
def test_a_failed_final_record_after_a_durable_decision_reports_the_decision(tmp_path, action):
    """Fails before the fix: the final COMMITTED/ABORTED write's error escaped end_transaction, so
    commit() raised (and the client marked the transaction ERROR) although it was committed. Now the
    final record is the background completer's, which tries again."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root, coordinator_config=config()) as c:
        c.admin.create_topic("t", partitions=2)
        p = c.create_producer("t")
        txn = c.new_transaction()
        for i in range(4):
            p.send(f"m{i}".encode(), txn=txn)
        p.flush()
        log = "/".join(tc_segments(txn.id.most_bits)) + "/_delta_log"
        # The decision is the 1st commit of the TC log from here; the final record the 2nd.
        faults.install([Fault(Op.CREATE, nth=2, match=log)])
        getattr(txn, action)()
        assert txn.state.name == ("COMMITTED" if action == "commit" else "ABORTED")  # decided
        assert c.flush(30)  # the background completer met the fault, and tried again
        assert faults.plan()[0].fired == 1
        faults.clear()
        expected = [b"m0", b"m1", b"m2", b"m3"] if action == "commit" else []
        assert sorted(committed_values(c, "t")) == expected
        tc = c._coordinators().for_txn(txn.id)
        final = TxnStatus.COMMITTED if action == "commit" else TxnStatus.ABORTED
        assert tc.get(txn.id, refresh=True).status is final
    with pulsartx.Client(root) as fresh:
        assert sorted(committed_values(fresh, "t")) == expected
