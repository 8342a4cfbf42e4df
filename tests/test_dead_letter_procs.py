"""A consumer SIGKILLed around its dead-letter transaction: the message ends up exactly once, in
the dead-letter topic and acknowledged on the source, never both or neither.

The child (this file is its script) nacks the poison message until its consumer moves it, and stops
at one step of the move to be killed: with the transaction open (copy produced, original pending
ack), with COMMIT decided but nothing applied, or after the commit returned. A fresh consumer in
the parent, with the same policy, then finishes or redoes the move.
"""
from __future__ import annotations

import os
import time

import pytest
from _procs import Child, emit, hang, main

pytestmark = pytest.mark.timeout(180)
HERE = os.path.abspath(__file__)
DLQ = "persistent://public/default/src-sub-DLQ"


class Proc(Child):
    script = HERE


def poison_mover(root: str, stage: str) -> None:
    """Nack ``poison`` (acking the rest) until the dead-letter move reaches ``stage``; then hang."""
    import pulsartx
    from pulsartx.client import dead_letter, transaction
    from pulsartx.coordinator import coordinator as coordinator_mod

    dead_letter.TXN_TIMEOUT_MS = 1500  # so the parent sees the open transaction aborted soon
    if stage == "open":
        def stop_commit(self):
            emit("EVENT", "stage", {"txn": str(self.id)})
            hang()

        transaction.Transaction.commit = stop_commit
    elif stage == "decided":
        def stop_participants(root_, meta, action_):
            emit("EVENT", "stage", {"status": meta.status.value})
            hang()

        coordinator_mod.end_on_participants = stop_participants
    elif stage == "committed":
        orig = dead_letter.DeadLetters.move

        def then_stop(self, consumer, message):
            ok = orig(self, consumer, message)
            emit("EVENT", "stage", {"moved": ok})
            hang()

        dead_letter.DeadLetters.move = then_stop
    client = pulsartx.Client(root)
    c = client.subscribe("src", "sub", consumer_type=pulsartx.ConsumerType.Shared, lease_ms=1000,
                         initial_position=pulsartx.InitialPosition.Earliest, negative_ack_redelivery_delay_ms=0,
                         dead_letter_policy=pulsartx.ConsumerDeadLetterPolicy(1))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            m = c.receive(timeout_millis=200)
        except pulsartx.Timeout:
            continue
        if m.data() == b"poison":
            c.negative_acknowledge(m)
        else:
            c.acknowledge(m)
    raise AssertionError(f"stage {stage!r} was never reached")


COMMANDS = {"poison_mover": poison_mover}


@pytest.mark.parametrize("stage", ["open", "decided", "committed"])
def test_killed_around_the_dead_letter_transaction(tmp_path, stage):
    import pulsartx

    root = str(tmp_path)
    client = pulsartx.Client(root, num_coordinators=1)
    client.admin.create_topic("src")
    p = client.create_producer("src")
    for v in (b"a", b"poison", b"b"):
        p.send(v)
    p.close()
    child = Proc("poison_mover", root=root, stage=stage)
    try:
        child.wait_event("stage", timeout=90)
    finally:
        child.kill()
    # A fresh consumer with the same policy: whatever the child left, the poison is moved exactly
    # once and never delivered again.
    c = client.subscribe("src", "sub", consumer_type=pulsartx.ConsumerType.Shared,
                         dead_letter_policy=pulsartx.ConsumerDeadLetterPolicy(1))

    def dead_letters(isolation_level: str = "READ_COMMITTED") -> list[bytes]:
        r = client.create_reader(DLQ, pulsartx.MessageId.earliest, isolation_level=isolation_level)
        out = []
        while True:
            try:
                out.append(r.read_next(timeout_millis=200).data())
            except pulsartx.Timeout:
                r.close()
                return out

    deadline = time.monotonic() + 30
    settled_at = None  # when a dead letter was first seen: keep receiving a while, to see nothing more
    while settled_at is None or time.monotonic() < settled_at + 2:
        assert time.monotonic() < deadline, f"no dead letter after the child was killed at {stage!r}"
        try:
            m = c.receive(timeout_millis=200)
            assert m.data() != b"poison", f"poison delivered again at redelivery {m.redelivery_count()}"
            c.acknowledge(m)
        except pulsartx.Timeout:
            pass
        if settled_at is None and dead_letters():
            settled_at = time.monotonic()
    c.close()
    client.flush()
    assert dead_letters() == [b"poison"]  # exactly once, committed
    # Killed with the move open, its copy was aborted and the move redone; once decided, the
    # decision was carried out and nothing redone.
    assert dead_letters("READ_UNCOMMITTED") == [b"poison"] * (2 if stage == "open" else 1)
    check = client.subscribe("src", "sub")
    with pytest.raises(pulsartx.Timeout):  # and acknowledged on the source
        check.receive(timeout_millis=500)
    check.close()
    client.close()


if __name__ == "__main__":
    main(COMMANDS)
