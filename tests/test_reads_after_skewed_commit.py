"""A commit by a process whose clock runs 8 days behind, read by processes on true time and 8 days
ahead (the soak's ``clock-jumps`` fault class).

The soak reported ``stale_read`` there: batch reads missing transactions of the producer 8 days
behind. The reads were not stale: they began before those commits returned. The soak skews a
worker's clock by replacing its ``time.time``, and its history was stamped with that same clock, so
every commit of the producer 8 days behind looked to the checker as if it had returned 8 days
before any read began (and the service 8 days ahead, which stops at the soak's deadline on its own
clock, never ran a pass). The histories now use the observer's clock (``history.now``).

The product half checks what the checker meant to: once ``commit()`` has returned on a clock 8 days
behind, a batch read (the consistent cut) and a READ_COMMITTED reader begun afterwards on true time
show all of it, whether its TC entry is still there, trimmed by a compaction whose clock takes it
for 8 days old, or swept by a service 8 days ahead.
"""
from __future__ import annotations

import time

import pytest

import pulsartx
from pulsartx import MessageId
from pulsartx.coordinator.tclog import TransactionLog
from tests.reliability import history as history_mod
from tests.reliability import soak
from tests.reliability.final import batch_read

DAY = 86_400.0


def _skew(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """As ``soak.worker`` skews a process: every wall-clock read of the process is off."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


@pytest.mark.parametrize("skew", [-8 * DAY, 8 * DAY])
def test_a_skewed_worker_stamps_its_history_with_the_observers_clock(tmp_path, monkeypatch, skew):
    """The checker orders events of different processes by ``t`` (read-your-writes: a read begun
    after a commit returned must show it), so a worker's skewed clock must not reach its history."""
    true_before = time.time()
    _skew(monkeypatch, skew)
    h = history_mod.History(tmp_path / "p.jsonl", "p")
    h.ok("commit", txn=[0, 0])
    h.close()
    (ev,) = history_mod.read_events([tmp_path / "p.jsonl"])
    assert true_before - 1 <= ev["t"] <= true_before + 60, (ev["t"], true_before)
    assert abs(history_mod.now() - true_before) < 60


def test_a_worker_whose_clock_runs_ahead_runs_until_the_soaks_deadline(tmp_path, monkeypatch):
    """The deadline is the parent's (true) time: the service 8 days ahead used to stop at once."""
    deadline = time.time() + 30
    _skew(monkeypatch, 8 * DAY)
    assert not soak._stopping(str(tmp_path / "stop"), deadline)
    _skew(monkeypatch, -16 * DAY)  # now 8 days behind
    assert not soak._stopping(str(tmp_path / "stop"), deadline)
    (tmp_path / "stop").write_text("")
    assert soak._stopping(str(tmp_path / "stop"), deadline)


def _visible(c: pulsartx.Client, topic: str) -> list[str]:
    with c.create_reader(topic, MessageId.earliest) as r:
        return sorted(m.data().decode() for m in r)


@pytest.mark.parametrize("after", ["nothing", "trimmed", "swept-ahead"])
def test_a_commit_on_a_clock_8_days_behind_is_read_by_reads_begun_after_it(tmp_path, monkeypatch, after):
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as admin:
        admin.admin.create_topic("orders", partitions=3)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 8 * DAY)
    behind = pulsartx.Client(root)
    p = behind.create_producer("orders")
    sent = []
    for i in range(3):
        txn = behind.new_transaction(timeout_ms=5000)
        for j in range(3):
            v = f"t{i}:{j}"
            p.send(v.encode(), partition_key=f"k{i}{j}", txn=txn)
            sent.append(v)
        txn.commit()
        tc_id = txn.id.most_bits
    monkeypatch.setattr(time, "time", real)
    if after == "trimmed":
        behind.flush()  # its markers written and COMMITTED logged: trimmable
        tl = TransactionLog(behind.root, tc_id, compact_every=1, finished_retention_ms=2000).open()
        tl.log.files_since_compaction = 1
        assert tl.maybe_compact(int(time.time() * 1000))
        tl.refresh()
        assert tl.get(0) is None  # 8 days old on this clock: trimmed
    elif after == "swept-ahead":
        monkeypatch.setattr(time, "time", lambda: real() + 8 * DAY)
        with pulsartx.Client(root) as ahead:
            for tc in ahead._coordinators().all():
                tc.sweep()
        monkeypatch.setattr(time, "time", real)
    with pulsartx.Client(root) as reader:
        got = sorted(v for _t, _p, _o, v in batch_read(reader, ["orders"]))
        assert got == sorted(sent)
        assert _visible(reader, "orders") == sorted(sent)
    behind.close()
