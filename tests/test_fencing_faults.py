"""Transaction-key fencing under storage faults: a new epoch never begins while a transaction of
an older one can still commit, and a fenced commit raises ProducerFenced."""
from __future__ import annotations

import re

import pytest
from _reads import committed_values  # tests/ is on sys.path (conftest)
from reliability.final import config

import pulsartx
from pulsartx.coordinator.tclog import tc_segments
from pulsartx.exceptions import ExpiredTransactionError, ProducerFenced, StorageError
from pulsartx.storage import faults
from pulsartx.storage.faults import Fault, Op

KEY, OWNER = "etl", "alice"


pytestmark = pytest.mark.usefixtures("no_faults")  # the fixture is in conftest.py


def _connect(root: str) -> pulsartx.Client:
    return pulsartx.Client(root, transaction_key=KEY, owner=OWNER, coordinator_config=config())


def test_a_claim_whose_fence_fails_does_not_succeed_and_the_zombie_cannot_commit(tmp_path):
    """Fails before the fix: the fence-abort's storage error was swallowed (logged at debug), the
    claim succeeded, and the old epoch's producer then committed its transaction."""
    root = str(tmp_path / "root")
    zombie = _connect(root)
    zombie.admin.create_topic("out", partitions=2)
    txn = zombie.new_transaction()
    zombie.create_producer("out").send(b"zombie", txn=txn)
    tc_log = "/".join(tc_segments(txn.id.most_bits)) + "/_delta_log"
    faults.install([Fault(Op.CREATE, match=tc_log, times=1_000)])  # every TC-log write fails
    with pytest.raises(StorageError, match=re.escape(f"could not fence transaction {txn.id}")):
        _connect(root)
    faults.clear()
    with pytest.raises(ProducerFenced, match="fenced") as err:
        txn.commit()
    assert isinstance(err.value, ExpiredTransactionError)  # what fenced transactions raised before
    successor = _connect(root)  # the retried claim fences what the failed one could not
    assert successor.epoch == 2
    assert committed_values(successor, "out") == []
    info = successor.admin.transactions.get_transaction_key(KEY, owner=OWNER)
    assert info["txn_ids"] == []
    for c in (zombie, successor):
        c.close()


def test_a_transient_fence_failure_is_retried_and_the_claim_succeeds(tmp_path):
    root = str(tmp_path / "root")
    zombie = _connect(root)
    zombie.admin.create_topic("out", partitions=1)
    txn = zombie.new_transaction()
    zombie.create_producer("out").send(b"zombie", txn=txn)
    tc_log = "/".join(tc_segments(txn.id.most_bits)) + "/_delta_log"
    faults.install([Fault(Op.CREATE, match=tc_log, times=2)])
    successor = _connect(root)
    assert faults.plan()[0].fired == 2
    faults.clear()
    with pytest.raises(ProducerFenced):
        txn.commit()
    assert committed_values(successor, "out") == []
    zombie.close()
    successor.close()


def test_a_commit_after_the_key_moved_on_is_fenced_even_if_the_fence_never_ran(tmp_path):
    """The epoch is checked when a keyed transaction commits, as Kafka's producer epoch is: the
    claim's fence and the commit are both compare-and-sets on the transaction's TC entry, and the
    commit also refuses a transaction whose key is at a newer epoch. Fails before the fix."""
    from pulsartx.coordinator.registry import Coordinators
    from pulsartx.storage.root import StorageRoot

    root = str(tmp_path / "root")
    zombie = _connect(root)
    zombie.admin.create_topic("out", partitions=1)
    txn = zombie.new_transaction()
    zombie.create_producer("out").send(b"zombie", txn=txn)
    tcs = Coordinators(StorageRoot.resolve(root), config=config())
    tcs.keys(zombie._key_tc()).claim(OWNER, KEY)  # a claim that died before its fence
    with pytest.raises(ProducerFenced):
        txn.commit()
    assert committed_values(zombie, "out") == []
    zombie.close()
