"""Key_Shared consumers in real, separate processes, one SIGKILLed in the middle of its keys.

Each child consumes-transforms-produces exactly once: per message, one transaction produces it to an
output topic and acknowledges it. The one killed holds messages of its keys, some in an open
transaction (PENDING_ACK), some only received. Its keys must reach the survivor only after those
come back, so per key the output holds every message once, in order. This file is also the child's
script (``_procs``'s protocol: judged by what children print and by storage, never exit codes).
"""
from __future__ import annotations

import os
import time
from typing import Any

import pytest
from _procs import Child, emit, hang, main

from pulsartx.client.key_shared import RANGES_EVERY_S

pytestmark = pytest.mark.timeout(180)
HERE = os.path.abspath(__file__)
IN = "persistent://public/default/ks-in"
OUT = "persistent://public/default/ks-out"
KEYS, PER_KEY = 6, 10


class Proc(Child):
    script = HERE


def _seed(root: str) -> dict[str, list[str]]:
    import pulsartx

    c = pulsartx.Client(root)
    c.admin.create_topic(IN)
    c.admin.create_topic(OUT)
    p = c.create_producer(IN)
    want: dict[str, list[str]] = {}
    for i in range(PER_KEY):
        for k in range(KEYS):
            p.send_async(f"k{k}:{i}".encode(), None, partition_key=f"k{k}")
            want.setdefault(f"k{k}", []).append(f"k{k}:{i}")
    p.flush()
    c.close()
    return want


def _output(root: str) -> list[tuple[str, str]]:
    import pulsartx
    from pulsartx.log.message_id import MessageId

    c = pulsartx.Client(root)
    r = c.create_reader(OUT, MessageId.earliest)
    out = []
    while r.has_message_available():
        m = r.read_next(timeout_millis=2000)
        out.append((m.partition_key(), m.data().decode()))
    c.close()
    return out


def test_key_shared_consumer_killed_mid_key(root, tmp_path):
    want = _seed(root)
    go, stop = str(tmp_path / "go"), str(tmp_path / "stop")
    common = {"root": root, "go_file": go, "stop_file": stop}
    dying = Proc("transform", **common, die_after=4)
    dying.wait_event("subscribed")
    survivor = Proc("transform", **common)
    survivor.wait_event("subscribed")
    # The dying consumer's view of the hash ranges may be up to RANGES_EVERY_S old (by design: a
    # stale view costs balance, never order). Start once it cannot predate the survivor's join, so
    # that while both live, each key has one owner.
    time.sleep(RANGES_EVERY_S + 0.2)
    open(go, "w").close()
    holding = dying.wait_event("holding", timeout=60)
    dying.sigkill()
    killed_at = time.time()
    deadline = time.monotonic() + 90
    while len(_output(root)) < KEYS * PER_KEY and time.monotonic() < deadline:
        time.sleep(0.5)
    open(stop, "w").close()
    r = survivor.result()

    # While both lived, no key went to both.
    before = {k for k, _, t in r["done"] if t < killed_at}
    assert not before & set(holding["keys"])
    # Per key: every message once, in order; acknowledged once (nothing left, nothing pending).
    per_key: dict[str, list[str]] = {}
    for k, v in _output(root):
        per_key.setdefault(k, []).append(v)
    assert per_key == want
    # The killed consumer's unacknowledged messages came back to the survivor before later ones.
    for k, v in holding["held"]:
        later = [x for kk, x, _ in r["done"] if kk == k]
        assert later[0] == v, (k, v, later)
    import pulsartx

    c = pulsartx.Client(root)
    [st] = c.admin.transactions.get_pending_ack_stats(IN, "ks")
    c.close()
    assert st["markDeletePosition"] + 1 == KEYS * PER_KEY and st["pendingAckCount"] == 0
    assert st["individuallyAckedRanges"] == 0


# ================================ child side ======================================================


def transform(root: str, go_file: str, stop_file: str, die_after: int | None = None) -> dict[str, Any]:
    """Per message, one transaction: produce it to OUT, acknowledge it, commit. With ``die_after``:
    after that many, take one message of each of its keys into an open transaction or just hold it,
    report them, and wait to be killed."""
    import pulsartx
    from pulsartx import ConsumerType, InitialPosition

    client = pulsartx.Client(root)
    c = client.subscribe(IN, "ks", consumer_type=ConsumerType.KeyShared, initial_position=InitialPosition.Earliest,
                         lease_ms=4000, receiver_queue_size=5)
    p = client.create_producer(OUT)
    emit("EVENT", "subscribed", {})
    while not os.path.exists(go_file):
        time.sleep(0.005)
    done: list[tuple[str, str, float]] = []
    while True:
        if die_after is not None and len(done) == die_after:
            held, keys = [], set()
            for i in range(3):
                m = c.receive(timeout_millis=10_000)
                key, value = m.partition_key(), m.data().decode()
                keys.add(key)
                if key not in {k for k, _ in held}:
                    held.append((key, value))
                if i == 0:  # the first one in an open transaction: PENDING_ACK when killed
                    txn = client.new_transaction(timeout_ms=2000)
                    p.send(m.data(), partition_key=key, txn=txn)
                    c.acknowledge(m, txn=txn)
            emit("EVENT", "holding", {"held": held, "keys": sorted(keys | {k for k, _, _ in done})})
            hang()
        try:
            m = c.receive(timeout_millis=500)
        except pulsartx.Timeout:
            if os.path.exists(stop_file):
                break
            continue
        txn = client.new_transaction(timeout_ms=20_000)
        p.send(m.data(), partition_key=m.partition_key(), txn=txn)
        c.acknowledge(m, txn=txn)
        txn.commit()
        done.append((m.partition_key(), m.data().decode(), time.time()))
    c.close()
    client.close()
    return {"done": done}


COMMANDS = {"transform": transform}

if __name__ == "__main__":
    main(COMMANDS)
