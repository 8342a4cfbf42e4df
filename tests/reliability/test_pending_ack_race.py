"""Found by the soak (suite 2): a transactional ack that lands after its transaction was aborted
elsewhere (here: timed out and aborted by another client's sweep) used to stay PENDING_ACK under the
ABORTED transaction forever, so the message was never delivered again on that subscription. The
consumer's pending-ack resolution now applies the decided abort (pulsartx/client/consumer.py)."""
from __future__ import annotations

import time

import pytest

import pulsartx
from pulsartx.client.consumer import ConsumerType, InitialPosition
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.exceptions import ExpiredTransactionError

CFG = CoordinatorConfig(recovery_grace_ms=0, max_clock_skew_ms=200)


@pytest.mark.parametrize("registered", [True, False])
def test_ack_after_its_transaction_was_aborted_is_returned(root, registered):
    """``registered``: the TC log holds the transaction before its first ack, so that ack registers
    the subscription. Else (an acknowledgement-only transaction, which registers with its decision)
    the other client's sweep does not know it; the second ack then finds it expired, and the first
    one's pending ack is fenced and returned once its deadline has passed."""
    c = pulsartx.Client(root, coordinator_config=CFG)
    c.admin.create_topic("t", 1)
    p = c.create_producer("t")
    for i in range(3):
        p.send(b"m%d" % i)
    cons = c.subscribe("t", "s", consumer_type=ConsumerType.Exclusive, initial_position=InitialPosition.Earliest)
    m0, m1 = cons.receive(5000), cons.receive(5000)
    txn = c.new_transaction(timeout_ms=300)
    if registered:
        c._coordinators().for_txn(txn.id).persist(txn.id)
    cons.acknowledge(m0, txn=txn)  # registers the subscription with the TC (or defers it)
    time.sleep(0.5)
    pulsartx.Client(root, coordinator_config=CFG).admin.transactions.sweep(grace_ms=0)  # aborts it (timeout)
    # Registered or not, the ack learns the transaction timed out and is taken back (the TC is asked
    # beside the pending-ack write); an ack racing the abort past that check still lands as
    # PENDING_ACK of an ABORTED transaction, which the consumer's resolution returns.
    with pytest.raises(ExpiredTransactionError):
        cons.acknowledge(m1, txn=txn)
    try:
        txn.commit()
        raise AssertionError("commit of a timed-out transaction succeeded")
    except ExpiredTransactionError:
        pass
    cons.close()
    again = pulsartx.Client(root, coordinator_config=CFG).subscribe(
        "t", "s", consumer_type=ConsumerType.Exclusive, initial_position=InitialPosition.Earliest)
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        got += [m.data() for m in again.batch_receive(10, timeout_millis=500)]
    assert sorted(got) == [b"m0", b"m1", b"m2"]  # m1 too: nothing stays pending under an aborted txn
    again.close()
