"""A commit file's PUT that lands on S3 while its answer is lost (a 500, or the connection dropped).

Below pulsartx, object_store retries such a PUT; its ``If-None-Match: *`` then meets the commit it
just made (412), which it reports as "already exists". delta-rs took that for another writer's
commit: a write setting app ids conflicted with itself (our read-back of ``pulsartxCommitId``
settled that), but a blind append was rebased and committed a second time at the next version,
the same data file added by two commits. Python-level fail points cannot reach there, so these
tests go through ``tests/_s3_proxy.py``, which forwards the PUT to moto and loses its answer.
"""
from __future__ import annotations

from collections.abc import Iterator

import boto3
import deltalake as dl
import pyarrow as pa
import pytest
from _s3_proxy import FaultyProxy  # tests/ is on sys.path (conftest)

import pulsartx
from pulsartx import MessageId
from pulsartx.log.partition import partition_segments
from pulsartx.naming import TopicName
from pulsartx.storage import appender, delta
from pulsartx.storage.root import StorageRoot

COMMIT_PUT = r"_delta_log/\d{20}\.json$"
SCHEMA = pa.schema([("seq", pa.int64())])
HOW = pytest.mark.parametrize("how", ["500", "drop"])

pytestmark = pytest.mark.usefixtures("no_faults")


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[FaultyProxy]:
    p = FaultyProxy(s3_endpoint)
    yield p
    p.close()


@pytest.fixture
def s3(proxy: FaultyProxy, s3_endpoint: str, request, monkeypatch) -> tuple[str, dict[str, str]]:
    """A fresh bucket, reached through the proxy; a short retry budget."""
    monkeypatch.setenv(delta.RETRY_ENV, "5")
    bucket = f"lost-{request.node.name.replace('_', '-').replace('[', '-').strip(']')[-40:].lower().strip('-')}"
    boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="testing", aws_secret_access_key="secret",
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    options = {"AWS_ENDPOINT_URL": proxy.url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "secret",
               "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    return f"s3://{bucket}/root", options


def _carrying(tail: delta.LogTail, commit_id: str) -> list[int]:
    """The versions whose commitInfo carries ``commit_id``."""
    return [v for v, actions in tail.commits_after(-1)
            if any(a.get("commitInfo", {}).get(delta.COMMIT_ID) == commit_id for a in actions)]


def _added_rows(tail: delta.LogTail) -> int:
    """Rows added over the whole log, commit by commit, as an incremental reader counts them."""
    return sum(delta.parse_stats(a["add"].get("stats")).get("numRecords", 0)
               for _, actions in tail.commits_after(-1) for a in actions if "add" in a)


def _assert_lost_then_refused(proxy: FaultyProxy, how: str) -> None:
    """The fault happened as intended: a commit PUT landed with its answer lost (a 500, or no
    answer at all), and the next PUT, object_store's retry of it, was refused as existing (412)."""
    assert not proxy.armed()
    puts = proxy.requests("PUT", COMMIT_PUT)
    lost = [i for i, e in enumerate(puts) if e.told != e.status]
    assert len(lost) == 1 and puts[lost[0]].status == 200, puts
    assert puts[lost[0]].told == (500 if how == "500" else None)
    assert puts[lost[0] + 1].path == puts[lost[0]].path and puts[lost[0] + 1].status == 412, puts


@HOW
@pytest.mark.parametrize("kind", ["blind-append", "app-ids", "overwrite-empty", "overwrite"])
def test_delta_write_whose_commit_answer_was_lost_lands_once(s3, proxy, monkeypatch, how, kind):
    """Failed before the fix for the writes that neither set app ids nor remove files (a blind
    append, an overwrite of an empty table): delta-rs's retry committed the same add again at the
    next version, and the caller got that second version. The others conflicted with their own
    commit, which the read-back found."""
    url, options = s3
    root = StorageRoot.resolve(url, options)
    delta.create_table(root, SCHEMA, "t")
    table = delta.open_table(root, "t")
    tail = delta.LogTail(root, ("t",))
    before = [] if kind == "overwrite-empty" else [0]
    if before:
        delta.write(table, pa.table({"seq": before}, schema=SCHEMA), tail=tail)
    ids: list[str] = []
    real = dl.CommitProperties

    def props(**kw):
        ids.append(kw["custom_metadata"][delta.COMMIT_ID])
        return real(**kw)

    monkeypatch.setattr(dl, "CommitProperties", props)
    proxy.lose_answer(COMMIT_PUT, how=how)
    version = delta.write(table, pa.table({"seq": [1]}, schema=SCHEMA), tail=tail,
                          app_transactions={"writer": 1} if kind == "app-ids" else None,
                          mode="overwrite" if kind.startswith("overwrite") else "append")
    _assert_lost_then_refused(proxy, how)
    assert _carrying(tail, ids[-1]) == [version] == [table.version()]
    assert _added_rows(tail) == len(before) + 1
    fresh = dl.DeltaTable(root.uri("t"), storage_options=delta._delta_options(root))
    assert fresh.version() == version
    expected = [1] if kind.startswith("overwrite") else before + [1]
    assert sorted(fresh.to_pyarrow_table().column("seq").to_pylist()) == expected
    # The handle goes on from there: the next write is the next version.
    assert delta.write(table, pa.table({"seq": [2]}, schema=SCHEMA), tail=tail) == version + 1


@HOW
@pytest.mark.parametrize("path", ["own-commits", "delta-rs"])
def test_producer_send_whose_commit_answer_was_lost_is_appended_once(s3, proxy, monkeypatch, how, path):
    """A producer's append, through pulsartx's own commit (the appender reads its slot back) and
    through delta-rs (a table the appender cannot write: the append sets the partition's offset
    app id, so delta-rs's retry conflicts with itself and the read-back finds the commit)."""
    if path == "delta-rs":
        monkeypatch.setattr(appender, "_fast_capable", lambda table: False)
    url, options = s3
    client = pulsartx.Client(url, storage_options=options)
    try:
        client.admin.create_topic("t", partitions=1)
        producer = client.create_producer("t")
        producer.send(b"before")
        proxy.lose_answer(r"/partition-0/" + COMMIT_PUT, how=how)
        producer.send(b"lost")
        producer.flush()
        _assert_lost_then_refused(proxy, how)
        producer.send(b"after")
        got = [m.data() for m in client.create_reader("t", MessageId.earliest)]
        assert got == [b"before", b"lost", b"after"]
        root = StorageRoot.resolve(url, options)
        assert _added_rows(delta.LogTail(root, partition_segments(TopicName.parse("t-partition-0")))) == 3
    finally:
        client.close()


def test_blind_append_from_a_stale_handle_is_rebased(tmp_path):
    """Another writer's commits since the handle's snapshot: the blind append still lands, once,
    after them (delta-rs no longer rebases it itself, pulsartx does)."""
    root = StorageRoot.resolve(str(tmp_path))
    delta.create_table(root, SCHEMA, "t")
    tail = delta.LogTail(root, ("t",))
    stale = delta.open_table(root, "t")
    other = delta.open_table(root, "t")
    for s in (10, 11):
        delta.write(other, pa.table({"seq": [s]}, schema=SCHEMA), tail=tail)
    assert delta.write(stale, pa.table({"seq": [1]}, schema=SCHEMA), tail=tail) == 3 == stale.version()
    assert sorted(dl.DeltaTable(root.uri("t")).to_pyarrow_table().column("seq").to_pylist()) == [1, 10, 11]
    assert _added_rows(tail) == 3


def test_racing_blind_appends_all_land_once(tmp_path):
    """Writers racing with blind appends, each from its own handle: every append lands exactly
    once, whoever loses a version sends it again after the winner's commit."""
    import threading

    root = StorageRoot.resolve(str(tmp_path))
    delta.create_table(root, SCHEMA, "t")
    tail = delta.LogTail(root, ("t",))
    versions: list[int] = []
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        table = delta.open_table(root, "t")
        try:
            for i in range(8):
                versions.append(delta.write(table, pa.table({"seq": [w * 100 + i]}, schema=SCHEMA), tail=tail))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert sorted(versions) == list(range(1, 33))
    assert sorted(dl.DeltaTable(root.uri("t")).to_pyarrow_table().column("seq").to_pylist()) == \
        sorted(w * 100 + i for w in range(4) for i in range(8))
    assert _added_rows(tail) == 32


def test_overwrite_of_an_empty_table_from_a_stale_handle_is_a_conflict(tmp_path):
    """Sent again from the log's end it would replace the other writer's rows, which the writer
    never saw: the caller is told instead (a buffer snapshot is then skipped until the next)."""
    root = StorageRoot.resolve(str(tmp_path))
    delta.create_table(root, SCHEMA, "t")
    tail = delta.LogTail(root, ("t",))
    stale = delta.open_table(root, "t")
    delta.write(delta.open_table(root, "t"), pa.table({"seq": [10]}, schema=SCHEMA), tail=tail)
    with pytest.raises(delta.ConcurrentCommit):
        delta.write(stale, pa.table({"seq": [1]}, schema=SCHEMA), mode="overwrite", tail=tail)
    assert stale.version() == 0
    assert dl.DeltaTable(root.uri("t")).to_pyarrow_table().column("seq").to_pylist() == [10]
