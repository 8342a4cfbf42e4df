"""Operations: metrics endpoint, compaction under load, retention and the coordinator service."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

import pulsartx
from pulsartx import InitialPosition, MessageId, metrics
from pulsartx.log.partition import PartitionLog
from pulsartx.maintenance.compaction import compact_partition
from pulsartx.maintenance.retention import apply_retention, vacuum
from pulsartx.naming import TopicName

PULSARTX = str(Path(sys.executable).with_name("pulsartx"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_all(client, topic: str, level: str = "READ_COMMITTED") -> list[tuple[int, int, bytes]]:
    r = client.create_reader(topic, MessageId.earliest, isolation_level=level)
    return sorted((m.message_id().partition(), m.message_id().offset(), m.data()) for m in r)


def test_metrics_endpoint_serves_pulsar_names_with_values(tmp_path):
    metrics.reset()
    client = pulsartx.Client(str(tmp_path), num_coordinators=1)
    client.admin.create_topic("m", partitions=1)
    producer = client.create_producer("m")
    for _ in range(3):
        with client.new_transaction() as txn:
            producer.send(b"c", txn=txn)
    aborted = client.new_transaction()
    producer.send(b"a", txn=aborted)
    aborted.abort()
    client.flush()  # its marker (written in the background) before "o": the lag below counts from "o"
    open_txn = client.new_transaction()
    producer.send(b"o", txn=open_txn)
    pulsartx.Client(str(tmp_path), transaction_key="etl", owner="alice")
    client.flush()  # final entries follow the decisions in the background
    port = _free_port()
    server, _ = metrics.start_metrics_server(port, client, addr="127.0.0.1")
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
              if line and not line.startswith("#")}
    assert values['pulsar_txn_active_count{coordinator_id="0"}'] == 1
    assert values['pulsar_txn_created_count{coordinator_id="0"}'] == 5
    assert values['pulsar_txn_committed_count{coordinator_id="0"}'] == 3
    assert values['pulsar_txn_aborted_count{coordinator_id="0"}'] == 1
    assert values['pulsar_txn_timeout_count{coordinator_id="0"}'] == 0
    # NEW with ADD_PARTITION (one write), COMMITTING/ABORTING, COMMITTED/ABORTED for 4 ended txns; the open
    # one's NEW with ADD_PARTITION (begun lazily: no write at new_transaction)
    assert values['pulsar_txn_append_log_count{coordinator_id="0"}'] == 4 * 3 + 1
    assert sum(v for k, v in values.items() if k.startswith("pulsar_txn_execution_latency_le_")) == 4
    assert values['pulsar_txn_transaction_key_count{coordinator_id="0"}'] == 1
    assert values['pulsar_txn_transaction_key_epoch{coordinator_id="0",owner="alice",transaction_key="etl"}'] == 0
    assert 'pulsar_txn_transaction_key_age{coordinator_id="0",owner="alice",transaction_key="etl"}' in values
    assert values["pulsar_txn_tp_committed_count_total"] == 0
    assert "pulsar_txn_tp_aborted_count_total" in values
    topic = 'partition="0",topic="persistent://public/default/m"'
    assert values[f"pulsartx_partition_entries{{{topic}}}"] == 3 * 2 + 2 + 1
    assert values[f"pulsartx_partition_max_read_position_lag{{{topic}}}"] == 1
    assert values[f"pulsartx_partition_oldest_open_txn_age_ms{{{topic}}}"] > 0


def test_pending_ack_metrics_count_commits_and_aborts(tmp_path):
    metrics.reset()
    client = pulsartx.Client(str(tmp_path), num_coordinators=1)
    client.admin.create_topic("in", partitions=1)
    client.create_producer("in").send(b"1")
    consumer = client.subscribe("in", "s", initial_position=InitialPosition.Earliest)
    msg = consumer.receive(5000)
    txn = client.new_transaction()
    consumer.acknowledge(msg, txn=txn)
    txn.abort()
    msg = consumer.receive(5000)
    with client.new_transaction() as txn:
        consumer.acknowledge(msg, txn=txn)
    client.flush()  # pending acks are committed by the background completer
    text = metrics.generate_latest(client)
    assert "pulsar_txn_tp_committed_count_total 1.0" in text
    assert "pulsar_txn_tp_aborted_count_total 1.0" in text


def test_compaction_under_load_keeps_reads_identical_and_shrinks_disk(tmp_path):
    client = pulsartx.Client(str(tmp_path))
    client.admin.create_topic("c", partitions=1)
    producer = client.create_producer("c")
    for i in range(40):
        txn = client.new_transaction()
        producer.send(f"t{i}".encode() * 50, txn=txn)
        producer.send(f"p{i}".encode())
        (txn.commit if i % 2 else txn.abort)()
    before = _read_all(client, "c")
    part = TopicName.parse("c-partition-0")
    disk_before = PartitionLog(client.root, part).refresh().size_bytes()

    stop = threading.Event()
    written: list[bytes] = []

    def load() -> None:
        c2 = pulsartx.Client(str(tmp_path))
        p2 = c2.create_producer("c")
        i = 0
        while not stop.is_set():
            txn = c2.new_transaction()
            p2.send(f"late{i}".encode(), txn=txn)
            txn.commit()
            written.append(f"late{i}".encode())
            i += 1

    t = threading.Thread(target=load)
    t.start()
    try:
        res = compact_partition(client.root, part)
        time.sleep(0.5)
    finally:
        stop.set()
        t.join()
    assert res.skipped is None, res.skipped
    assert res.rows_dropped == 20  # the 20 aborted messages
    after = _read_all(client, "c")
    assert [x for x in after if x[1] <= before[-1][1]] == before  # same messages, same offsets
    assert sorted(x[2] for x in after if x[2].startswith(b"late")) == sorted(written)
    # The range compaction rewrote (the offsets that existed before it) takes less space; the load's
    # own appends after it are left out, as their number depends on how busy the machine is.
    last_before = PartitionLog(client.root, part).refresh()
    assert sum(f.size for f in last_before.files if f.min_offset <= before[-1][1]) < disk_before
    # raw data of aborted transactions is gone from the compacted range
    uncommitted = {x[2] for x in _read_all(client, "c", "READ_UNCOMMITTED")}
    assert not any(f"t{i}".encode() * 50 in uncommitted for i in range(0, 40, 2))


def test_retention_stops_at_the_slowest_subscription_unless_forced(tmp_path):
    client = pulsartx.Client(str(tmp_path))
    client.admin.create_topic("r", partitions=1)
    producer = client.create_producer("r")
    for i in range(10):
        producer.send(f"m{i}".encode())
    consumer = client.subscribe("r", "slow", initial_position=InitialPosition.Earliest,
                                acknowledgment_group_time_ms=0)
    for _ in range(3):
        consumer.acknowledge(consumer.receive(5000))
    part = TopicName.parse("r-partition-0")
    res = apply_retention(client.root, part, max_bytes=1)
    assert res.held_by_subscription == "slow"
    assert res.new_start_offset == 3  # files of offsets 0..2 only: the subscription still needs 3
    assert [m.data() for m in client.create_reader("r", MessageId.earliest)] == [f"m{i}".encode() for i in range(3, 10)]
    forced = apply_retention(client.root, part, max_bytes=1, force=True)
    assert forced.new_start_offset == 9  # the newest file always stays
    assert vacuum(client.root, part, 0) == 9


def _run_service(root: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([PULSARTX, "--service-url", root, "coordinator", "run", "--sweep-interval-ms", "200",
                             "--grace-ms", "0", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_started(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the service logs that it runs (its signal handlers are installed): a SIGTERM while it
    still imports and opens its TCs ends it with the default action, -15."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen.append(line)
        if b"coordinator service started" in line:
            return
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"service did not start: {b''.join(seen).decode()[-2000:]}")


def _wait_status(client, txn_id, status: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        meta = client.admin.transactions.get_transaction_metadata(txn_id)
        if meta["status"] == status or time.monotonic() > deadline:
            return meta
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_coordinator_service_sweeps_stops_on_sigterm_and_survives_sigkill(tmp_path):
    root = str(tmp_path)
    client = pulsartx.Client(root, num_coordinators=2)
    client.admin.create_topic("s", partitions=1)
    service = _run_service(root)
    try:
        _wait_started(service)
        txn = client.new_transaction(timeout_ms=500)
        client.create_producer("s").send(b"x", txn=txn)
        meta = _wait_status(client, txn.id, "ABORTED")
        assert meta["status"] == "ABORTED" and meta["reason"] == "timed out"
        service.send_signal(signal.SIGTERM)
        out, err = service.communicate(timeout=60)
        assert service.returncode == 0, err.decode()[-2000:]
        assert b"stopped" in err
    finally:
        if service.poll() is None:
            service.kill()
    # A SIGKILLed instance leaves nothing behind: a new one (two at once, even) keeps working.
    killed = _run_service(root)
    time.sleep(3)
    killed.send_signal(signal.SIGKILL)
    killed.wait(30)
    a, b = _run_service(root), _run_service(root)
    try:
        _wait_started(a)
        _wait_started(b)
        txn = client.new_transaction(timeout_ms=500)
        client.create_producer("s").send(b"y", txn=txn)
        assert _wait_status(client, txn.id, "ABORTED")["status"] == "ABORTED"
    finally:
        for s in (a, b):
            s.send_signal(signal.SIGTERM)
        for s in (a, b):
            s.communicate(timeout=60)
            assert s.returncode == 0


def test_retention_bounds_the_aborted_set_and_old_files_stay_hidden(tmp_path):
    from pulsartx.buffer.buffer import TransactionBuffer

    client = pulsartx.Client(str(tmp_path))
    client.admin.create_topic("a", partitions=1)
    producer = client.create_producer("a")
    for i in range(12):
        txn = client.new_transaction()
        producer.send(f"t{i}".encode(), txn=txn)
        (txn.commit if i % 2 else txn.abort)()
    client.flush()  # commit() and abort() return at the decision; the markers this test counts follow
    part = TopicName.parse("a-partition-0")
    plog = PartitionLog(client.root, part)
    old_files = plog.refresh().files
    before = TransactionBuffer(plog).state()
    assert len(before.aborted) == 6
    res = apply_retention(client.root, part, max_bytes=1, force=True)
    after = TransactionBuffer(PartitionLog(client.root, part)).state()  # from the new snapshot
    assert after.trimmed_below == res.new_start_offset > 0
    assert len(after.aborted) < len(before.aborted)
    # A reader that planned the old files but folded the new snapshot shows nothing below the horizon.
    from pulsartx.log.partition import read_files

    raw = read_files(client.root, plog.segments, old_files, 0, res.new_start_offset)
    assert after.filter().apply(raw).num_rows == 0
    assert [m.data() for m in client.create_reader("a", MessageId.earliest)] == [
        f"t{i}".encode() for i in range(12) if i % 2 and 2 * i >= res.new_start_offset]  # data at 2i, marker 2i+1


def test_a_metrics_scrape_goes_on_past_a_deleted_topic_and_an_unreadable_partition(tmp_path, monkeypatch):
    """The per-partition families read every topic at scrape time: a topic deleted between the
    listing and its partitions, or one partition whose log cannot be read, made the whole scrape
    fail (HTTP 500 for every metric). The other partitions are reported; the bad one is left out."""
    import glob

    root = str(tmp_path / "root")
    client = pulsartx.Client(root, num_coordinators=1)
    for name in ("a", "gone", "z"):
        client.admin.create_topic(name, partitions=2)
        client.create_producer(name).send(b"x")
    listed = client.admin.list_topics()
    client.admin.delete_topic("gone")
    monkeypatch.setattr(client.admin, "list_topics", lambda: listed)
    commits = sorted(glob.glob(os.path.join(root, "topics", "public", "default", "z", "partition-1", "_delta_log",
                                            "*.json")))
    assert commits, os.listdir(root)
    with open(commits[-1], "r+b") as f:
        f.truncate(os.path.getsize(commits[-1]) // 2)
    fresh = pulsartx.Client(root, num_coordinators=1)
    monkeypatch.setattr(fresh.admin, "list_topics", lambda: listed)
    text = metrics.generate_latest(fresh)
    reported = {line.split("{", 1)[1].split("}", 1)[0] for line in text.splitlines()
                if line.startswith("pulsartx_partition_entries{")}
    assert reported == {f'partition="{i}",topic="persistent://public/default/{t}"' for t, i in
                        (("a", 0), ("a", 1), ("z", 0))}, reported


def test_created_count_does_not_fall_when_finished_transactions_are_trimmed(tmp_path):
    """pulsar_txn_created_count was the highest TxnID the TC log still holds + 1, so it fell (to 0)
    once compaction trimmed the finished transactions: a count of created transactions going
    down. The highest id compaction trimmed (kept beside the log) counts too."""
    from pulsartx.coordinator.coordinator import CoordinatorConfig
    from pulsartx.coordinator.tclog import TransactionLog

    trim = CoordinatorConfig(finished_retention_ms=0, compact_every=2, recovery_grace_ms=0, lease_ms=0)
    client = pulsartx.Client(str(tmp_path), num_coordinators=1, coordinator_config=trim)
    client.admin.create_topic("t")
    producer = client.create_producer("t")
    for _ in range(5):
        with client.new_transaction() as txn:
            producer.send(b"x", txn=txn)
        assert client.flush()
    tl = TransactionLog(client.root, 0, compact_every=1, finished_retention_ms=0).open()
    tl.log.files_since_compaction = 1
    assert tl.maybe_compact(int(time.time() * 1000))
    fresh = pulsartx.Client(str(tmp_path), num_coordinators=1, coordinator_config=trim)
    assert fresh._coordinators().tc(0).transactions() == []  # all trimmed
    assert 'pulsar_txn_created_count{coordinator_id="0"} 5.0' in metrics.generate_latest(fresh)


def test_metrics_warn_again_about_a_partition_that_fails_again_after_recovering(tmp_path, monkeypatch, caplog):
    root = str(tmp_path / "root")
    client = pulsartx.Client(root, num_coordinators=1)
    client.admin.create_topic("t")
    real = metrics.TransactionBuffer
    broken = iter([True, True, False, True])

    def flaky(plog):
        if next(broken):
            raise OSError("disk read error")
        return real(plog)

    monkeypatch.setattr(metrics, "TransactionBuffer", flaky)
    reg = metrics.registry(client)
    from prometheus_client import generate_latest

    with caplog.at_level("WARNING", logger="pulsartx.metrics"):
        for _ in range(4):
            generate_latest(reg)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 2 and all("disk read error" in w for w in warned), warned
