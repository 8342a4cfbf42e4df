"""Clock skew between processes can delay ownership changes or let two consumers overlap, but never
duplicate output: leases are wall-clock expiries, while what a consumer's work commits is decided
by compare-and-sets on the subscription's cursor (an acknowledgement, individual or pending in a
transaction, of a message another transaction acknowledged is a conflict)."""
from __future__ import annotations

import subprocess
import sys

import pulsartx
from pulsartx import ConsumerType, InitialPosition, MessageId
from pulsartx.exceptions import PulsarException

AHEAD = """
import sys, time
real = time.time
time.time = lambda: real() + 600  # this process's clock runs 10 minutes ahead
import pulsartx
from pulsartx import ConsumerType, InitialPosition
c = pulsartx.Client(sys.argv[1])
cons = c.subscribe("in", "s", consumer_type=ConsumerType.Exclusive, initial_position=InitialPosition.Earliest)
msgs = []
while len(msgs) < 20:
    msgs += cons.batch_receive(20, timeout_millis=2000)
p = c.create_producer("out")
txn = c.new_transaction()
for m in msgs:
    p.send(b"ahead:" + m.data(), txn=txn)
cons.acknowledge(msgs, txn=txn)
txn.commit()
print("committed", len(msgs), flush=True)
c.close()
"""


def test_a_consumer_whose_clock_runs_ahead_takes_over_early_but_nothing_is_committed_twice(tmp_path):
    """A holds the Exclusive lease and 20 messages; B's clock runs 10 minutes ahead, so A's lease
    looks expired to it and B takes the subscription over while A still works. Both process the same
    messages in transactions: exactly one of the two commits, and the output holds each input once."""
    root = str(tmp_path / "root")
    a = pulsartx.Client(root)
    a.admin.create_topic("in", partitions=1)
    a.admin.create_topic("out", partitions=1)
    p = a.create_producer("in")
    for i in range(20):
        p.send(f"m{i}".encode())
    cons = a.subscribe("in", "s", consumer_type=ConsumerType.Exclusive, initial_position=InitialPosition.Earliest)
    held = []
    while len(held) < 20:
        held += cons.batch_receive(20, timeout_millis=2000)
    b = subprocess.run([sys.executable, "-c", AHEAD, root], capture_output=True, text=True, timeout=300)
    assert "committed 20" in b.stdout, b.stderr[-3000:]
    out = a.create_producer("out")
    txn = a.new_transaction()
    for m in held:
        out.send(b"behind:" + m.data(), txn=txn)
    try:
        cons.acknowledge(held, txn=txn)
        txn.commit()
        a_committed = True
    except PulsarException:
        a_committed = False
    r = a.create_reader("out", MessageId.earliest)
    values = []
    while r.has_message_available():
        values.append(r.read_next(timeout_millis=3000).data())
    assert not a_committed
    assert sorted(values) == sorted(f"ahead:m{i}".encode() for i in range(20))
    a.close()
