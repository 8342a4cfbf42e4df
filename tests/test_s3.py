"""The same code on an S3-compatible store: moto's standalone server (it enforces conditional
puts, which delta-rs relies on for concurrent commits). Credentials must never leak into reprs."""
from __future__ import annotations

import pytest

import pulsartx
from pulsartx import InitialPosition, MessageId


@pytest.fixture
def s3_root(s3_endpoint, request):
    import boto3

    bucket = f"pulsartx-{request.node.name.replace('_', '-')[:40].lower()}"
    boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="testing", aws_secret_access_key="secret-xyz",
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    options = {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "secret-xyz", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    return f"s3://{bucket}/root", options


def test_transactions_and_subscriptions_on_s3(s3_root):
    url, options = s3_root
    client = pulsartx.Client(url, storage_options=options, num_coordinators=2)
    assert "secret-xyz" not in repr(client) and "secret-xyz" not in repr(client.root)
    client.admin.create_topic("t", partitions=2)
    assert client.admin.list_topics() == ["persistent://public/default/t"]
    producer = client.create_producer("t")
    with client.new_transaction() as txn:
        for i in range(6):
            producer.send(f"c{i}".encode(), txn=txn)
    aborted = client.new_transaction()
    producer.send(b"gone", txn=aborted)
    aborted.abort()
    producer.send(b"plain")
    expected = sorted([f"c{i}".encode() for i in range(6)] + [b"plain"])
    assert sorted(m.data() for m in client.create_reader("t", MessageId.earliest)) == expected
    assert sorted(m.data() for m in client.create_reader("t", MessageId.earliest,
                                                          isolation_level="READ_UNCOMMITTED")) == sorted(expected + [b"gone"])
    consumer = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
    got = [consumer.receive(10_000) for _ in range(7)]
    assert sorted(m.data() for m in got) == expected
    with client.new_transaction() as txn:
        for m in got:
            consumer.acknowledge(m, txn=txn)
    # commit() returns at the decision; the background completer then applies the pending acks
    # (docs/design/commit-at-the-decision-point.md): read the stores once it has.
    client.flush()
    stats = client.admin.transactions.get_pending_ack_stats("t", "s")
    assert [s["pendingAckCount"] for s in stats] == [0, 0]
    with pytest.raises(pulsartx.Timeout):
        consumer.receive(500)


@pytest.mark.spark
def test_spark_read_and_write_on_s3(spark, s3_root):
    url, options = s3_root
    client = pulsartx.Client(url, storage_options=options)
    client.admin.create_topic("in", partitions=2)
    producer = client.create_producer("in")
    for i in range(20):
        producer.send_async(f"v{i}".encode(), None)
    producer.flush()
    storage = {f"pulsartx.storage.{k}": v for k, v in options.items()}
    df = spark.read.format("pulsartx").options(**storage).option("service.url", url).option("topic", "in").load()
    assert sorted(r.value.decode() for r in df.select("value").collect()) == sorted(f"v{i}" for i in range(20))
    (df.select("value").write.format("pulsartx").mode("append").options(**storage).option("service.url", url)
     .option("topic", "out").option("createTopic", "true").option("partitions", "2").save())
    out = spark.read.format("pulsartx").options(**storage).option("service.url", url).option("topic", "out").load()
    assert out.count() == 20
    assert "secret-xyz" not in out._jdf.queryExecution().toString()


def test_idle_probe_is_one_head(s3_root, monkeypatch):
    """An idle reader's probe for its next commit is one HEAD of the commit's key (exists() lists
    as well when the key is missing), and it sees the commit once it lands."""
    import obstore

    from pulsartx.storage import delta
    from pulsartx.storage.root import StorageRoot

    url, options = s3_root
    client = pulsartx.Client(url, storage_options=options)
    client.admin.create_topic("t", partitions=1)
    reader = client.create_reader("t", MessageId.latest)
    with pytest.raises(pulsartx.Timeout):
        reader.read_next(timeout_millis=50)
    [w] = reader._fetchers[0].visible.next_commits()
    assert not w.arrived()
    root = StorageRoot.resolve(url, options)
    calls: list[str] = []
    for name in ("head", "get", "list", "list_with_delimiter", "put"):
        real = getattr(obstore, name)
        monkeypatch.setattr(obstore, name, lambda *a, _n=name, _r=real, **kw: (calls.append(_n), _r(*a, **kw))[1])
    assert not delta.LogTail(root, w.tail.segments).has_commit(w.version + 1)
    assert calls == ["head"]
    client.create_producer("t").send(b"x")
    assert w.arrived()
    assert reader.read_next(timeout_millis=5000).data() == b"x"
    client.close()
