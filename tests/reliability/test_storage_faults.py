"""Suite 3, storage faults: the object store goes away in the middle of a transactional
commit, storage is read-only, the bucket is missing.

The outage is a real one: the Ceph RGW *gateway* process is SIGKILLed after the commit markers of
some partitions were written and restarted on the same port 10 s later. The data lives in the OSD,
so it survives, as S3 data survives an S3 front-end outage (moto would lose everything on a restart;
it is used below only where losing the bucket is the point).

What must hold, checked on every partition with a fresh client after recovery:
  * operations retry with backoff through the outage and complete, or fail with a clear error
    (StorageUnavailable naming the table URI, never a credential);
  * no transaction is torn: all of a transaction's messages are visible, or none;
  * nothing is duplicated by the retries: exactly one marker per transaction and partition, and
    exactly the acknowledged values, once each.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections import Counter

import pytest
from _procs import BIG_RETENTION_MS  # tests/ is on sys.path (conftest)

import pulsartx
from pulsartx import MessageId
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.exceptions import PulsarException, StorageError
from pulsartx.storage import delta
from pulsartx.storage.appender import DeltaAppender

PARTITIONS = 4
OUTAGE_S = 10.0
CFG = CoordinatorConfig(finished_retention_ms=BIG_RETENTION_MS, recovery_grace_ms=0)
# `make test` injects one outage of each kind; PULSARTX_TEST_RGW_FULL=1 (`make reliability`) injects it
# after each possible number of written markers, and also as a hang (SIGSTOP) instead of a crash.
FULL = os.environ.get("PULSARTX_TEST_RGW_FULL", "").strip().lower() in ("1", "true", "yes")
OUTAGES = ([(mode, after) for mode in ("kill", "pause") for after in range(1, PARTITIONS + 1)] if FULL
           else [("kill", 2)])


class GatewayOutage:
    """Kills (``mode="kill"``: connections refused) or freezes (``"pause"``, SIGSTOP: requests hang)
    the RGW gateway right after the ``after``-th commit marker is written (by wrapping
    :meth:`DeltaAppender.append`, the one place every Delta append goes through) and brings it
    back ``down_for`` seconds later from a timer thread. Records when it happened."""

    def __init__(self, server, monkeypatch, after: int = 2, down_for: float = OUTAGE_S, mode: str = "kill"):
        self.server, self.after, self.down_for, self.mode = server, after, down_for, mode
        self.markers = 0
        self.killed_at: float | None = None
        self.restarted_at: float | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        original = DeltaAppender.append

        def append(appender, data, *args, **kw):
            version = original(appender, data, *args, **kw)
            if "type" in data.column_names and "TXN_COMMIT" in data.column("type").to_pylist():
                with self._lock:
                    self.markers += 1
                    if self.markers == self.after and self.killed_at is None:
                        if self.mode == "kill":
                            self.server.stop_gateway()
                        else:
                            self.server.pause_gateway()
                        self.killed_at = time.monotonic()
                        self._timer = threading.Timer(self.down_for, self._restart)
                        self._timer.start()
            return version

        monkeypatch.setattr(DeltaAppender, "append", append)

    def _restart(self) -> None:
        if self.mode == "kill":
            self.server.start_gateway()
        else:
            self.server.resume_gateway()
        self.restarted_at = time.monotonic()

    def wait_killed(self, timeout_s: float = 60.0) -> None:
        """The markers are written by the background completer after commit() returns: wait for
        the outage to begin before acting on it."""
        deadline = time.monotonic() + timeout_s
        while self.killed_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.killed_at is not None, "no outage was injected"

    def wait_restarted(self) -> None:
        if self._timer is not None:
            self._timer.join()
        assert self.restarted_at is not None, "the gateway was never restarted"


def visible(url: str, options: dict, topic: str) -> Counter:
    """Every READ_COMMITTED value of every partition, read by a fresh client: Counter(value)."""
    with pulsartx.Client(url, storage_options=options, coordinator_config=CFG) as c:
        return Counter(m.data() for m in c.create_reader(topic, MessageId.earliest))


def assert_untorn(seen: Counter, txns: dict[str, list[bytes]]) -> dict[str, str]:
    """Each transaction all-or-nothing (and each value at most once); returns txn -> all|none."""
    out = {}
    for name, values in txns.items():
        present = [v for v in values if seen[v]]
        assert all(seen[v] == 1 for v in present), f"{name}: duplicated values {[v for v in present if seen[v] > 1]}"
        assert len(present) in (0, len(values)), f"{name} is torn: {len(present)} of {len(values)} visible"
        out[name] = "all" if present else "none"
    return out


def one_marker_each(url: str, options: dict, topic: str, txn, kind: str = "TXN_COMMIT") -> None:
    """Exactly one ``kind`` marker of ``txn`` in every partition: retried commits wrote nothing twice."""
    from pulsartx.log.partition import PartitionLog
    from pulsartx.naming import TopicName
    from pulsartx.storage.root import StorageRoot

    root = StorageRoot.resolve(url, options)
    found: Counter = Counter()
    for i in range(PARTITIONS):
        plog = PartitionLog(root, TopicName.parse(f"{topic}-partition-{i}"))
        for r in plog.read(0, plog.end_offset(), columns=["type", "txn_most_bits", "txn_least_bits"]).to_pylist():
            if r["type"] != "DATA" and (r["txn_most_bits"], r["txn_least_bits"]) == txn.id.as_tuple():
                found[(i, r["type"])] += 1
    assert found == Counter({(i, kind): 1 for i in range(PARTITIONS)})


def produce_txn(client, producer, name: str, n: int = 2 * PARTITIONS):
    txn = client.new_transaction()
    values = [f"{name}-{i}".encode() for i in range(n)]
    for i, v in enumerate(values):
        producer.send(v, txn=txn, partition_key=f"k{i}")
    return txn, values


@pytest.fixture
def s3(rgw_server, request):
    url, options = rgw_server.new_root(request.node.name)
    return rgw_server, url, options


@pytest.mark.parametrize(("mode", "after"), OUTAGES)
def test_gateway_outage_mid_commit_retries_and_completes(s3, monkeypatch, caplog, mode, after):
    """10 s outage inside the default 30 s retry budget: the commit completes, once."""
    server, url, options = s3
    client = pulsartx.Client(url, storage_options=options, coordinator_config=CFG, num_coordinators=1)
    client.admin.create_topic("t", partitions=PARTITIONS)
    producer = client.create_producer("t")
    before, before_values = produce_txn(client, producer, "before")
    before.commit()
    aborted, aborted_values = produce_txn(client, producer, "aborted")
    aborted.abort()
    txn, values = produce_txn(client, producer, "during")
    outage = GatewayOutage(server, monkeypatch, after=after, mode=mode)
    t0 = time.monotonic()
    txn.commit()  # returns at the decision; the background completer writes the markers
    assert txn.state.name == "COMMITTED"
    assert client.flush(timeout_s=OUTAGE_S * 6)
    took = time.monotonic() - t0
    outage.wait_restarted()
    assert outage.killed_at is not None, "no outage was injected"
    # Markers (or, after the last one, the COMMITTED entry) were still to be written: the completion
    # waited the outage out.
    assert took >= OUTAGE_S * 0.9, f"completion took {took:.1f} s, inside a {OUTAGE_S:.0f} s outage"
    if mode == "kill":
        assert any("transient storage error" in r.getMessage() for r in caplog.records)
    producer.send(b"after")  # the client works normally afterwards
    client.close()

    seen = visible(url, options, "t")
    txns = {"before": before_values, "aborted": aborted_values, "during": values}
    assert assert_untorn(seen, txns) == {"before": "all", "aborted": "none", "during": "all"}
    assert seen == Counter(before_values + values + [b"after"])
    one_marker_each(url, options, "t", txn)


def test_outage_beyond_the_retry_budget_fails_clearly_and_recovery_finishes(s3, monkeypatch):
    """Budget 2 s, outage 10 s: operations fail with StorageUnavailable naming the table, never a
    secret; the decided commit is rolled forward by a sweep once the store is back; an undecided
    transaction is aborted. Neither is torn."""
    server, url, options = s3
    monkeypatch.setenv(delta.RETRY_ENV, "2")
    client = pulsartx.Client(url, storage_options=options, coordinator_config=CFG, num_coordinators=1)
    client.admin.create_topic("t", partitions=PARTITIONS)
    producer = client.create_producer("t")
    open_txn, open_values = produce_txn(client, producer, "open")
    producer.flush()
    txn, values = produce_txn(client, producer, "decided")
    outage = GatewayOutage(server, monkeypatch)
    txn.commit()  # returns once the decision (COMMITTING) is durable; the markers follow in the background
    assert txn.state.name == "COMMITTED"
    outage.wait_killed()
    # A new operation while the store is still down fails within the budget, with a clear error.
    t0 = time.monotonic()
    with pytest.raises(StorageError) as failed:
        producer.send(b"lost", txn=open_txn)
        producer.flush()
    assert time.monotonic() - t0 < 2 + 15, "the retry budget was not honoured"
    message = str(failed.value)
    assert url.split("//")[1].split("/")[0] in message, message  # names the bucket/table
    assert options["AWS_SECRET_ACCESS_KEY"] not in message and options["AWS_SECRET_ACCESS_KEY"] not in repr(failed.value)
    outage.wait_restarted()
    client.close()

    monkeypatch.undo()  # default budget again, and DeltaAppender.append unwrapped
    with pulsartx.Client(url, storage_options=options, coordinator_config=CFG) as admin:
        admin.admin.transactions.sweep(grace_ms=0)
        admin.admin.transactions.abort_transaction(str(open_txn.id))
        statuses = {str(t): admin.admin.transactions.get_transaction_metadata(t.id)["status"] for t in (txn, open_txn)}
    assert statuses == {str(txn): "COMMITTED", str(open_txn): "ABORTED"}
    seen = visible(url, options, "t")
    assert assert_untorn(seen, {"decided": values, "open": open_values}) == {"decided": "all", "open": "none"}
    assert seen == Counter(values)
    one_marker_each(url, options, "t", txn)


def test_read_only_s3_user_gets_a_clear_error_at_once(s3):
    """A user whose bucket policy allows only reads: reads work, writes fail fast (no retries)
    with an error naming the table and the denial."""
    import json

    server, url, options = s3
    bucket = url.split("//")[1].split("/")[0]
    with pulsartx.Client(url, storage_options=options) as c:
        c.admin.create_topic("t", partitions=1)
        c.create_producer("t").send(b"written")
    ro = server.create_user("reader", "reader-key", "reader-secret-xyz")
    policy = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"AWS": ["arn:aws:iam:::user/reader"]},
        "Action": ["s3:GetObject", "s3:ListBucket"],
        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]}
    server.s3_client().put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))
    with pulsartx.Client(url, storage_options=ro) as c:
        assert [m.data() for m in c.create_reader("t", MessageId.earliest)] == [b"written"]
        t0 = time.monotonic()
        with pytest.raises(PulsarException) as denied:
            c.create_producer("t").send(b"denied")
        assert time.monotonic() - t0 < 10, "a permission error must not be retried as a transient fault"
    assert isinstance(denied.value, StorageError), repr(denied.value)
    message = str(denied.value)
    assert bucket in message and ("denied" in message.lower() or "403" in message), message
    assert "reader-secret-xyz" not in message


def test_missing_bucket_is_a_clear_error(rgw_server):
    url = "s3://ptx-no-such-bucket-8f3a/root"
    with pulsartx.Client(url, storage_options=rgw_server.storage_options) as c:
        t0 = time.monotonic()
        with pytest.raises(PulsarException) as missing:
            c.admin.create_topic("t", partitions=1)
        assert time.monotonic() - t0 < 10, "a missing bucket must not be retried as a transient fault"
    assert isinstance(missing.value, StorageError), repr(missing.value)
    message = str(missing.value)
    assert "ptx-no-such-bucket-8f3a" in message, message
    assert rgw_server.secret_key not in message


def _moto(port: int) -> subprocess.Popen:
    from _s3_proxy import start_moto

    return start_moto(port)


def test_bucket_lost_under_a_live_client_is_a_clear_error():
    """moto keeps data in memory: restarting it is a store that lost the bucket. A live client then
    gets a clear error naming the bucket, not a hang, a retry storm or a silent empty topic."""
    import boto3

    from reliability.rgw import _free_port

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    options = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "moto-secret-xyz",
               "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    server = _moto(port)
    try:
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="x",
                     region_name="us-east-1").create_bucket(Bucket="vanishing")
        client = pulsartx.Client("s3://vanishing/root", storage_options=options)
        client.admin.create_topic("t", partitions=1)
        producer = client.create_producer("t")
        producer.send(b"one")
        server.kill()  # the store crashes and comes back empty
        server.wait(10)
        server = _moto(port)
        t0 = time.monotonic()
        with pytest.raises(PulsarException) as lost:
            producer.send(b"two")
        assert time.monotonic() - t0 < 20
        assert isinstance(lost.value, StorageError), repr(lost.value)
        assert "vanishing" in str(lost.value) and "moto-secret-xyz" not in str(lost.value), lost.value
    finally:
        server.terminate()
        server.wait(10)


def test_read_only_local_root_gives_a_clear_error(tmp_path):
    """As root, chmod does not stop writes; a read-only bind mount does (the real shape of a
    read-only volume). Skipped where mounting is not allowed (unprivileged containers)."""
    src, ro = tmp_path / "rw", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    with pulsartx.Client(str(src)) as c:
        c.admin.create_topic("t", partitions=1)
        c.create_producer("t").send(b"written")
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root and mount(8)")
    if subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True).returncode != 0:
        pytest.skip("mount --bind is not allowed here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], capture_output=True).returncode != 0:
            pytest.skip("remount read-only is not allowed here")
        with pulsartx.Client(str(ro)) as c:
            assert [m.data() for m in c.create_reader("t", MessageId.earliest)] == [b"written"]
            t0 = time.monotonic()
            with pytest.raises(PulsarException) as denied:
                c.create_producer("t").send(b"denied")
            assert time.monotonic() - t0 < 10
        assert isinstance(denied.value, StorageError), repr(denied.value)
        message = str(denied.value)
        assert str(ro) in message and "read-only" in message.lower(), message
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


# ---- the retry helper itself (fast; the texts are the ones the libraries produced above) ----------
REFUSED_DELTA = OSError("Kernel error -> Generic S3 error\n \x1b[31m\u21b3\x1b[0m Error performing GET http://127.0.0.1:1/b/"
                        "t/_delta_log/_last_checkpoint in 2s, after 10 retries - HTTP error\n \u21b3 error sending request\n"
                        " \u21b3 tcp connect error\n \u21b3 Connection refused (os error 111)")
REFUSED_ARROW = OSError("When reading information for key 't/x.parquet' in bucket 'b': AWS Error NETWORK_CONNECTION "
                        "during HeadObject operation: curlCode: 7, Could not connect to server")


@pytest.mark.parametrize(("error", "transient"), [
    (REFUSED_DELTA, True),
    (REFUSED_ARROW, True),
    (ConnectionResetError("reset by peer"), True),
    (OSError("Generic S3 error: 503 Service Unavailable: SlowDown"), True),
    (OSError("Generic S3 error: Client error with status 403 Forbidden: AccessDenied"), False),
    (OSError("<Error><Code>NoSuchBucket</Code></Error>"), False),
    (OSError("Error performing PUT http://h/b/k in 3ms, after 0 retries, max_retries: 4, retry_timeout: 10s - "
             "Client error with status 400 Bad Request: InvalidArgument"), False),
    (OSError("Generic S3 error: 412 Precondition Failed (timeout while waiting)"), False),
    (delta.ConcurrentCommit("Concurrent transaction failed"), False),
    (FileNotFoundError("no such file"), False),
    # Words and numbers in a path or a duration are not the store's answer: a topic named
    # request-timeouts or partition-500 made a permanent error look transient (retried for the
    # whole budget, then "storage unreachable"), one named forbidden-words a 503 look permanent.
    (OSError("Error performing PUT http://h/b/r/topics/public/default/request-timeouts/_delta_log/x.json in 3ms"
             " - Server returned non-2xx status code: 400 Bad Request: InvalidArgument"), False),
    (OSError("Could not open Parquet input source '/data/topics/public/default/slowdown-alerts/part-1.parquet': "
             "Parquet magic bytes not found in footer. Either the file is corrupted or this is not a parquet file."),
     False),
    (OSError("Error performing GET http://h/b/r/topics/t/t/orders/partition-500/x in 2ms - Server returned "
             "non-2xx status code: 400 Bad Request"), False),
    (OSError("Error performing GET http://h/b/k in 502.113ms - Server returned non-2xx status code: 400 Bad Request"),
     False),
    (OSError("Error performing PUT http://h/b/r/topics/public/default/forbidden-words/x in 3ms - Server returned "
             "non-2xx status code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>"), True),
    (ValueError("schema mismatch"), False),
])
def test_transient_classification(error, transient):
    assert delta.is_transient(error) is transient


def test_retrying_is_bounded_and_names_the_uri_not_the_secret():
    from pulsartx.storage.root import StorageRoot

    root = StorageRoot.resolve("s3://bkt/p", {"AWS_SECRET_ACCESS_KEY": "s3cr3t-value", "AWS_REGION": "us-east-1"})
    calls = []

    def fail():
        calls.append(time.monotonic())
        raise OSError("error sending request: Connection refused, key s3cr3t-value")

    t0 = time.monotonic()
    with pytest.raises(delta.StorageUnavailable) as e:
        delta.retrying("write to Delta table", "s3://bkt/p/t", fail, root=root,
                       policy=delta.RetryPolicy(deadline_s=0.5, base_s=0.01, cap_s=0.05))
    assert 0.5 <= time.monotonic() - t0 < 2.0 and len(calls) >= 3
    assert "s3://bkt/p/t" in str(e.value) and "s3cr3t-value" not in str(e.value) and "\x1b" not in str(e.value)


def test_retrying_recovers_and_never_retries_a_lost_cas():
    outcomes = [OSError("Connection refused"), OSError("timed out"), "done"]

    def flaky():
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    assert delta.retrying("op", "uri", flaky, policy=delta.RetryPolicy(5, 0.01, 0.02)) == "done"
    calls = []

    def cas():
        calls.append(1)
        raise delta.ConcurrentCommit("conflict")

    with pytest.raises(delta.ConcurrentCommit):
        delta.retrying("op", "uri", cas, policy=delta.RetryPolicy(5, 0.01, 0.02))
    assert calls == [1]
