"""Random interleavings of plain and transactional sends, commits and aborts, over 2-3 partitions
and 2 producers, checked against a model of what each isolation level must return.

The model, per partition, from the order of appends (sends are synchronous, so append order is send
order):
  * READ_UNCOMMITTED: every message;
  * READ_COMMITTED: the messages before the first message of a transaction still open (its
    maxReadPosition), minus those of aborted transactions.
Also: every ended transaction has exactly one marker, of its outcome, in each partition it wrote to.
"""
from __future__ import annotations

from collections import Counter

import pytest
from _keys import keys_for  # tests/ is on sys.path (conftest)
from _procs import count_markers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pulsartx
from pulsartx import MessageId

SLOTS = 3  # at most this many transactions open at once

send_op = st.tuples(st.just("send"), st.integers(0, 1), st.integers(0, 2), st.sampled_from([None, None, 0, 1, 2]))
end_op = st.tuples(st.just("end"), st.integers(0, SLOTS - 1), st.booleans())
scenarios = st.tuples(
    st.integers(2, 3),  # partitions
    st.lists(st.one_of(send_op, send_op, end_op), min_size=1, max_size=12),
    st.one_of(st.none(), st.booleans()),  # at the end: leave open (None), or end the rest (commit?)
)




KEYS = {n: keys_for(n) for n in (2, 3)}


def model(entries: dict[int, list[tuple[bytes, int | None]]], status: dict[int, str]):
    rc, ru = {}, {}
    for part, es in entries.items():
        ru[part] = [v for v, _ in es]
        limit = next((i for i, (_, t) in enumerate(es) if t is not None and status[t] == "open"), len(es))
        rc[part] = [v for v, t in es[:limit] if t is None or status[t] == "committed"]
    return ({p: vs for p, vs in rc.items() if vs}, {p: vs for p, vs in ru.items() if vs})


def read_parts(client, level: str) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    with client.create_reader("prop", MessageId.earliest, isolation_level=level) as r:
        for m in r:
            out.setdefault(m.message_id().partition(), []).append(m.data())
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("prop")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_random_interleavings_match_the_model(base, scenario):
    nparts, ops, finish = scenario
    root = base / f"ex-{len(list(base.iterdir()))}"
    root.mkdir()
    client = pulsartx.Client(str(root), num_coordinators=2)
    try:
        client.admin.create_topic("prop", nparts)
        producers = [client.create_producer("prop"), client.create_producer("prop")]
        slots: dict[int, tuple[int, object]] = {}  # slot -> (model id, Transaction)
        txns: dict[int, object] = {}
        status: dict[int, str] = {}
        touched: dict[int, set[int]] = {}
        entries: dict[int, list[tuple[bytes, int | None]]] = {p: [] for p in range(nparts)}
        for n, op in enumerate(ops):
            if op[0] == "send":
                _, prod, part, slot = op
                part %= nparts
                tid = None
                txn = None
                if slot is not None:
                    if slot not in slots:
                        tid = len(txns)
                        txns[tid] = client.new_transaction()
                        status[tid] = "open"
                        slots[slot] = (tid, txns[tid])
                    tid, txn = slots[slot]
                    touched.setdefault(tid, set()).add(part)
                value = f"{n}:{'plain' if tid is None else f't{tid}'}".encode()
                mid = producers[prod].send(value, partition_key=KEYS[nparts][part], txn=txn)
                assert mid.partition() == part
                entries[part].append((value, tid))
            else:
                _, slot, commit = op
                if slot in slots:
                    tid, txn = slots.pop(slot)
                    txn.commit() if commit else txn.abort()
                    status[tid] = "committed" if commit else "aborted"
        if finish is not None:
            for tid, txn in list(slots.values()):
                txn.commit() if finish else txn.abort()
                status[tid] = "committed" if finish else "aborted"
        rc, ru = model(entries, status)
        assert read_parts(client, "READ_UNCOMMITTED") == ru
        assert read_parts(client, "READ_COMMITTED") == rc
        expected_markers = Counter()
        for tid, st_ in status.items():
            if st_ != "open":
                for part in touched.get(tid, ()):
                    expected_markers[(part, "TXN_COMMIT" if st_ == "committed" else "TXN_ABORT",
                                      txns[tid].id.as_tuple())] += 1
        client.flush()  # markers follow a decision in the background
        assert count_markers(str(root), "prop", nparts) == expected_markers
    finally:
        client.close()
