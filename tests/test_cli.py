"""The ``pulsartx`` admin CLI against a real storage root: exact tables and JSON after a known
workload, errors (``error: ...`` on stderr, exit code 2), and the installed console script."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

import pulsartx
from pulsartx import InitialPosition, MessageId
from pulsartx.cli.common import parse_duration_ms
from pulsartx.cli.main import cli
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName

T = "persistent://public/default/orders"
P0, P1 = f"{T}-partition-0", f"{T}-partition-1"
PULSARTX = Path(sys.executable).parent / "pulsartx"


def send(client, partition: int, *values: str, txn=None, key: str | None = None) -> None:
    p = client.create_producer(f"orders-partition-{partition}")
    for v in values:
        p.send(v.encode(), txn=txn, partition_key=key)
    p.close()


def build(root: str) -> dict:
    """One TC, so TxnIDs are known: (0,0) committed, (0,1) aborted, (0,2) open with a pending ack,
    (0,1000) committed by the transaction key 'pipeline-1' of owner 'etl' (another client: the next
    block of TxnIDs).

    orders-partition-0: a0 a1 a2 | c0 COMMIT | x0 ABORT      orders-partition-1: b0 b1 | c1 COMMIT
    Subscription 'billing' received all seven visible messages, acked (0,0) and (0,1), and (1,0)
    is PENDING_ACK in (0,2). The consumer acked the markers and aborted data as it passed them."""
    client = pulsartx.Client(root, num_coordinators=1)
    client.admin.create_topic("orders", partitions=2)
    client.admin.create_topic("tenant1/ns1/events")
    send(client, 0, "a0", "a1", "a2", key="k")
    send(client, 1, "b0", "b1")
    with client.new_transaction() as t:
        send(client, 0, "c0", txn=t)
        send(client, 1, "c1", txn=t)
    t = client.new_transaction()
    send(client, 0, "x0", txn=t)
    t.abort()
    consumer = client.subscribe("orders", "billing", initial_position=InitialPosition.Earliest,
                                acknowledgment_group_time_ms=0)
    got = [consumer.receive(5000) for _ in range(7)]
    assert sorted(m.data() for m in got) == [b"a0", b"a1", b"a2", b"b0", b"b1", b"c0", b"c1"]
    consumer.acknowledge([MessageId(0, 0), MessageId(0, 1)])
    pending = client.new_transaction(timeout_ms=600_000)
    # Registered before it acknowledges, so the TC lists it while open (an acknowledgement-only
    # transaction is otherwise listed from its decision on: test_ack_only_transactions.py).
    client._coordinators().tc(0).persist(pending.id)
    consumer.acknowledge(MessageId(1, 0), txn=pending)
    consumer.close()
    keyed = pulsartx.Client(root, transaction_key="pipeline-1", owner="etl", num_coordinators=1)
    kt = keyed.new_transaction()
    kt.commit()
    keyed.close()
    assert (str(pending.id), str(kt.id)) == ("(0,2)", "(0,1000)")
    return {"client": client, "pending": pending}


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> tuple[str, dict]:
    """The workload, for commands that only read it."""
    root = str(tmp_path_factory.mktemp("cli-root"))
    w = build(root)
    yield root, w
    w["client"].close()


@pytest.fixture
def fresh(root: str) -> tuple[str, dict]:
    """The workload, for commands that change it."""
    w = build(root)
    yield root, w
    w["client"].close()


def run(root: str, *args: str, json_out: bool = False, code: int = 0):
    argv = ["--service-url", root, *(["--json"] if json_out else []), *args]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    if code == 0 and json_out:
        return json.loads(result.stdout)
    return result


def lines(result) -> list[str]:
    return result.stdout.splitlines()


def sizes(root: str) -> list[int]:
    from pulsartx.storage.root import StorageRoot

    return [PartitionLog(StorageRoot.resolve(root), TopicName.parse(f"orders-partition-{i}")).refresh().size_bytes()
            for i in range(2)]


# ---- topics ----------------------------------------------------------------------------------------
def test_topics_update_partitioned_topic(root: str) -> None:
    run(root, "topics", "create", "grow", "-p", "2")
    assert run(root, "topics", "update-partitioned-topic", "grow", "-p", "5", json_out=True) == {
        "topic": "persistent://public/default/grow", "partitions": 5}
    assert run(root, "topics", "list", json_out=True) == [{"topic": "persistent://public/default/grow", "partitions": 5}]
    same = run(root, "topics", "update-partitioned-topic", "grow", "--partitions", "5", code=2)
    assert "has 5 partition(s) and cannot go to 5" in same.stderr and "give more than 5" in same.stderr
    lower = run(root, "topics", "update-partitioned-topic", "grow", "-p", "3", code=2)
    assert "has 5 partition(s) and cannot go to 3" in lower.stderr
    missing = run(root, "topics", "update-partitioned-topic", "nope", "-p", "3", code=2)
    assert "topic persistent://public/default/nope does not exist" in missing.stderr
    assert "topics create" in missing.stderr
    no_count = CliRunner().invoke(cli, ["--service-url", root, "topics", "update-partitioned-topic", "grow"])
    assert no_count.exit_code == 2 and "--partitions" in no_count.stderr


def test_topics_list(shared) -> None:
    root, _ = shared
    assert lines(run(root, "topics", "list")) == [
        "TOPIC                               PARTITIONS",
        "persistent://public/default/orders  2",
        "persistent://tenant1/ns1/events     1",
    ]
    assert run(root, "topics", "list", json_out=True) == [
        {"topic": T, "partitions": 2}, {"topic": "persistent://tenant1/ns1/events", "partitions": 1}]
    assert run(root, "topics", "list", "tenant1/ns1", json_out=True) == [
        {"topic": "persistent://tenant1/ns1/events", "partitions": 1}]
    assert lines(run(root, "topics", "list", "tenant1/empty")) == ["(none)"]


def test_topics_list_leaves_out_a_topic_deleted_while_it_lists(root: str, monkeypatch) -> None:
    """The listing, then each topic's partition count: a topic another process deleted in between
    failed the whole command ("topic ... does not exist", exit code 2)."""
    from pulsartx.admin.topics import TopicsAdmin

    with pulsartx.Client(root) as c:
        for name in ("a", "gone", "z"):
            c.admin.create_topic(name)
        listed = c.admin.list_topics()
        c.admin.delete_topic("gone")
    monkeypatch.setattr(TopicsAdmin, "list_topics", lambda self, namespace=None: listed)
    assert [t["topic"] for t in run(root, "topics", "list", json_out=True)] == [
        "persistent://public/default/a", "persistent://public/default/z"]

def test_topics_create_and_delete(root: str) -> None:
    assert lines(run(root, "topics", "create", "events", "-p", "3")) == [
        "KEY         VALUE",
        "topic       persistent://public/default/events",
        "partitions  3",
    ]
    assert run(root, "topics", "create", "t2/ns/more", "--partitions", "2", json_out=True) == {
        "topic": "persistent://t2/ns/more", "partitions": 2}
    dup = run(root, "topics", "create", "events", code=2)
    assert dup.stderr == ("error: topic persistent://public/default/events already exists: delete it first or use "
                          "it as it is\n")
    assert dup.stdout == ""
    assert run(root, "topics", "delete", "events", json_out=True) == {"deleted": "events"}
    assert run(root, "topics", "list", json_out=True) == [{"topic": "persistent://t2/ns/more", "partitions": 2}]
    assert "does not exist" in run(root, "topics", "delete", "events", code=2).stderr


def index_figures(root: str) -> list[tuple[int, int]]:
    """(bytes, files) of each partition, as the file index states them."""
    from pulsartx.storage.root import StorageRoot

    out = []
    for i in range(2):
        index = PartitionLog(StorageRoot.resolve(root), TopicName.parse(f"orders-partition-{i}")).refresh()
        out.append((index.size_bytes(), len(index.files)))
    return out


def test_topics_stats(shared) -> None:
    """Messages and markers apart (ENTRIES, the offset span, counted markers as messages), with
    the transaction, producer and subscription tables. Rates depend on the clock: checked as
    numbers here, exactly in test_topic_stats.py."""
    root, _ = shared
    (b0, f0), (b1, f1) = index_figures(root)
    out = lines(run(root, "topics", "stats", "orders"))
    assert out[0] == ("PARTITION  MESSAGES  MARKERS  FILE_COUNT  " + "BYTES".ljust(max(5, len(str(b0)), len(str(b1))))
                      + "  START_OFFSET  END_OFFSET  MAX_READ_POSITION  MSG_RATE_IN  MSG_RATE_OUT")
    rows = [r.split() for r in out[1:3]]
    assert [r[:8] for r in rows] == [["0", "5", "2", str(f0), str(b0), "0", "7", "6"],
                                     ["1", "3", "1", str(f1), str(b1), "0", "4", "3"]]
    assert all(float(x) >= 0 for r in rows for x in r[8:]) and all(len(r) == 10 for r in rows)
    assert out[3:8] == [
        "",
        "Transactions:",
        "PARTITION  ONGOING_TXN_COUNT  ABORTED_TXN_COUNT  BLOCKING_TXN  STATUS  OWNER  AGE_MS  TIMEOUT_MS  HELD_ENTRIES",
        "0          0                  1",
        "1          0                  0",
    ]
    assert out[8:11] == ["", "Producers:", "PARTITION  PRODUCER_NAME          LAST_SEQUENCE_ID  LAST_PUBLISH_TIME"]
    # send() makes a producer per call: a0..a2 (sequence ids 0..2), c0, x0 on partition 0; b0 b1, c1 on 1.
    assert sorted((r.split()[0], r.split()[2]) for r in out[11:16]) == [("0", "0"), ("0", "0"), ("0", "2"),
                                                                        ("1", "0"), ("1", "1")]
    assert all(r.split()[1].startswith("pulsartx-") and r.split()[3].endswith("Z") for r in out[11:16])
    assert out[16:19] == ["", "Subscriptions:", "PARTITION  SUBSCRIPTION  TYPE       CONSUMERS  MARK_DELETE_POSITION  "
                                                "BACKLOG  UNACKED_MESSAGES  PENDING_ACK_COUNT  MSG_RATE_OUT"]
    assert [r.split()[:-1] for r in out[19:]] == [["0", "billing", "Exclusive", "1", "2", "0", "0"],
                                                  ["1", "billing", "Exclusive", "-1", "3", "0", "1"]]
    stats = run(root, "topics", "stats", "orders", json_out=True)
    for s, producers in zip(stats, (3, 2), strict=True):
        assert s.pop("msgRateOut") == s["subscriptions"]["billing"].pop("msgRateOut") >= 0
        assert s.pop("msgRateIn") >= 0
        assert [p["producerName"].startswith("pulsartx-") for p in s.pop("producers")] == [True] * producers
    billing = {"type": "Exclusive", "consumers": [], "unackedMessages": 0}
    assert stats == [
        {"partition": P0, "entries": 7, "messages": 5, "markers": 2, "fileCount": f0, "bytes": b0, "startOffset": 0,
         "endOffset": 7, "maxReadPosition": 6, "ongoingTxnCount": 0, "abortedTxnCount": 1, "blockingTxn": None,
         "subscriptions": {"billing": {"markDeletePosition": 1, "individuallyAckedCount": 3, "pendingAckCount": 0,
                                       "backlog": 2, **billing}}},
        {"partition": P1, "entries": 4, "messages": 3, "markers": 1, "fileCount": f1, "bytes": b1, "startOffset": 0,
         "endOffset": 4, "maxReadPosition": 3, "ongoingTxnCount": 0, "abortedTxnCount": 0, "blockingTxn": None,
         "subscriptions": {"billing": {"markDeletePosition": -1, "individuallyAckedCount": 1, "pendingAckCount": 1,
                                       "backlog": 3, **billing}}},
    ]
    assert lines(run(root, "topics", "stats", "tenant1/ns1/events"))[-3:] == ["", "Subscriptions:", "(none)"]


def test_topics_peek(shared) -> None:
    root, _ = shared
    out = run(root, "topics", "peek", "orders-partition-0", json_out=True)
    for m in out:
        assert isinstance(m.pop("publishTime"), int)
    base = {"partition": 0, "properties": {}, "eventTime": None, "size": 2, "encoding": "utf-8"}
    assert out == [
        {**base, "messageId": "(0,0)", "offset": 0, "key": "k", "txnId": None, "value": "a0"},
        {**base, "messageId": "(0,1)", "offset": 1, "key": "k", "txnId": None, "value": "a1"},
        {**base, "messageId": "(0,2)", "offset": 2, "key": "k", "txnId": None, "value": "a2"},
        {**base, "messageId": "(0,3)", "offset": 3, "key": None, "txnId": "(0,0)", "value": "c0"},
    ]
    table = lines(run(root, "topics", "peek", "orders-partition-0", "-n", "2"))
    assert table[0].split() == ["MESSAGE_ID", "KEY", "PUBLISH_TIME", "TXN_ID", "PROPERTIES", "VALUE"]
    assert [(r.split()[0], r.split()[1], r.split()[-1]) for r in table[1:]] == [("(0,0)", "k", "a0"),
                                                                              ("(0,1)", "k", "a1")]
    assert table[1].split()[2].endswith("Z")  # ISO-8601 UTC
    unc = run(root, "topics", "peek", "orders-partition-0", "--isolation-level", "read_uncommitted", json_out=True)
    assert [m["value"] for m in unc] == ["a0", "a1", "a2", "c0", "x0"]
    assert len(run(root, "topics", "peek", "orders", "-n", "100", json_out=True)) == 7
    bad = run(root, "topics", "peek", "orders", "--isolation-level", "dirty", code=2)
    assert "Invalid value for '--isolation-level'" in bad.stderr


def test_topics_peek_binary_values(root: str) -> None:
    with pulsartx.Client(root, num_coordinators=1) as c:
        c.admin.create_topic("bin")
        c.create_producer("bin").send(b"\xff\x00", properties={"k": "v"})
    (m,) = run(root, "topics", "peek", "bin", json_out=True)
    assert (m["value"], m["encoding"], m["size"], m["properties"]) == ("/wA=", "base64", 2, {"k": "v"})
    row = lines(run(root, "topics", "peek", "bin"))[1].split()
    assert (row[0], row[-2], row[-1]) == ("(0,0)", "k=v", "base64:/wA=")



def test_a_table_cell_with_a_line_break_stays_on_its_row(root: str) -> None:
    """A value holding a newline (or a tab, or a carriage return) printed as it is split its row in
    two, and the second line read as another message; the table shows it escaped, JSON as it is."""
    with pulsartx.Client(root, num_coordinators=1) as c:
        c.admin.create_topic("multi")
        p = c.create_producer("multi")
        p.send(b"first\nsecond", properties={"note": "a\tb"})
        p.send(b"plain")
    table = lines(run(root, "topics", "peek", "multi"))
    assert len(table) == 3, table
    assert table[1].split()[-2:] == ["note=a\\tb", "first\\nsecond"]
    assert [m["value"] for m in run(root, "topics", "peek", "multi", json_out=True)] == ["first\nsecond", "plain"]


# ---- subscriptions ---------------------------------------------------------------------------------------
def test_subscriptions_list(shared) -> None:
    root, _ = shared
    assert lines(run(root, "subscriptions", "list", "orders")) == ["SUBSCRIPTION", "billing"]
    assert run(root, "subscriptions", "list", "orders", json_out=True) == ["billing"]
    assert lines(run(root, "subscriptions", "list", "tenant1/ns1/events")) == ["(none)"]


def test_subscriptions_reset(fresh) -> None:
    root, _ = fresh
    assert lines(run(root, "subscriptions", "reset", "orders", "billing", "--message-id", "earliest")) == [
        "PARTITION                                       SUBSCRIPTION  POSITION  MARK_DELETE_POSITION",
        f"{P0}  billing       0         -1",
        f"{P1}  billing       0         -1",
    ]
    assert run(root, "subscriptions", "reset", "orders", "billing", "--message-id", "(1,2)", json_out=True) == [
        {"partition": P1, "subscription": "billing", "position": 2, "markDeletePosition": 1}]
    assert [r["position"] for r in run(root, "subscriptions", "reset", "orders", "billing", "--message-id",
                                       "latest", json_out=True)] == [7, 4]
    assert [r["position"] for r in run(root, "subscriptions", "reset", "orders", "billing", "--time",
                                       "1970-01-01T00:00:00Z", json_out=True)] == [0, 0]
    assert [r["position"] for r in run(root, "subscriptions", "reset", "orders", "billing", "--time",
                                       "4102444800000", json_out=True)] == [7, 4]  # 2100: past everything
    stats = run(root, "topics", "stats", "orders", json_out=True)
    assert [s["subscriptions"]["billing"]["backlog"] for s in stats] == [0, 0]


def test_subscriptions_reset_errors(shared) -> None:
    root, _ = shared
    r = run(root, "subscriptions", "reset", "orders", "billing", code=2)
    assert "give exactly one of --time and --message-id" in r.stderr
    r = run(root, "subscriptions", "reset", "orders", "billing", "--message-id", "0:5", code=2)
    assert "use earliest, latest or (partition,offset)" in r.stderr
    r = run(root, "subscriptions", "reset", "orders", "billing", "--time", "yesterday", code=2)
    assert "use epoch milliseconds" in r.stderr
    r = run(root, "subscriptions", "reset", "orders", "ghost", "--message-id", "earliest", code=2)
    assert r.stderr == (f"error: subscription 'ghost' does not exist on topic {T}: list the topic's subscriptions "
                        f"with `pulsartx --service-url {root} subscriptions list {T}`, or create it by subscribing "
                        f"(client.subscribe('{T}', 'ghost'))\n")
    r = run(root, "subscriptions", "reset", "orders", "billing", "--message-id", "(1,9)", code=2)
    assert r.stderr.startswith(f"error: cannot reset subscription 'billing' on {P1} to (1,9): the partition ends at "
                               "offset 3")


def test_subscriptions_skip_and_delete(fresh) -> None:
    root, w = fresh
    assert lines(run(root, "subscriptions", "skip", "orders", "billing", "-n", "1")) == [
        "PARTITION                                       SUBSCRIPTION  SKIPPED  MARK_DELETE_POSITION",
        f"{P0}  billing       1        2",
        f"{P1}  billing       1        -1",
    ]
    assert run(root, "subscriptions", "skip", "orders", "billing", "--count", "10", json_out=True) == [
        {"partition": P0, "subscription": "billing", "skipped": 1, "markDeletePosition": 6},
        {"partition": P1, "subscription": "billing", "skipped": 1, "markDeletePosition": -1},  # (1,0) pending
    ]
    assert "Missing option '--count'" in run(root, "subscriptions", "skip", "orders", "billing", code=2).stderr
    consumer = w["client"].subscribe("orders", "billing")
    r = run(root, "subscriptions", "delete", "orders", "billing", code=2)
    assert r.stderr.startswith("error: subscription 'billing' on persistent://public/default/orders has 1 live "
                               "consumer(s)")
    assert f"(`pulsartx --service-url {root} subscriptions delete {T} billing --force`, force=True)" in r.stderr
    assert lines(run(root, "subscriptions", "delete", "orders", "billing", "--force")) == [
        "KEY           VALUE",
        f"topic         {T}",
        "subscription  billing",
        "partitions    2",
    ]
    consumer.close()
    assert run(root, "subscriptions", "list", "orders", json_out=True) == []
    assert "'billing' does not exist" in run(root, "subscriptions", "delete", "orders", "billing", code=2).stderr


# ---- transactions ---------------------------------------------------------------------------------------
def test_transactions_coordinator_stats(shared) -> None:
    root, w = shared
    out = run(root, "transactions", "coordinator-stats", json_out=True)
    assert out == w["client"].admin.transactions.get_coordinator_stats()
    (tc,) = out
    assert {k: v for k, v in tc.items() if k not in ("log_version", "log_entries_since_snapshot")} == {
        "coordinator_id": 0, "state": "Ready", "ongoing_txn_size": 1, "committing": 0, "aborting": 0,
        "recently_committed": 2, "recently_aborted": 1, "low_water_mark": 1, "txn_ids_reserved": 2000}
    table = lines(run(root, "transactions", "coordinator-stats"))
    assert table[0].split() == ["COORDINATOR_ID", "STATE", "ONGOING_TXN_SIZE", "COMMITTING", "ABORTING",
                                "RECENTLY_COMMITTED", "RECENTLY_ABORTED", "LOW_WATER_MARK", "TXN_IDS_RESERVED", "LOG_VERSION",
                                "LOG_ENTRIES_SINCE_SNAPSHOT"]
    assert table[1].split() == [str(tc[k]) for k in tc]


def _timeless(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("open_duration_ms", "start_time_ms", "last_modification_time_ms",
                                                    "claimed_ms", "age_ms")}


def test_transactions_metadata_and_slow(shared) -> None:
    root, _ = shared
    meta = run(root, "transactions", "transaction-metadata", "(0,2)", json_out=True)
    assert _timeless(meta) == {
        "txn_id": "(0,2)", "coordinator_id": 0, "status": "OPEN", "timeout_ms": 600000, "partitions": [],
        "subscriptions": [f"{P1}:billing"], "owner": None, "transaction_key": None, "epoch": None, "reason": None,
        "commit_entries": None, "properties": {}}
    assert run(root, "transactions", "transaction-metadata", "0:2", json_out=True)["txn_id"] == "(0,2)"  # no quoting
    table = lines(run(root, "transactions", "transaction-metadata", "0,1"))
    assert table[0].split() == ["KEY", "VALUE"]
    assert [r.split() for r in table if r.split()[0] in ("txn_id", "status", "partitions")] == [
        ["txn_id", "(0,1)"], ["status", "ABORTED"], ["partitions", P0]]
    slow = run(root, "transactions", "slow-transactions", "--timeout-ms", "0", json_out=True)
    assert [_timeless(m) for m in slow] == [_timeless(meta)]
    assert run(root, "transactions", "slow-transactions", "-t", "3600000", json_out=True) == []
    table = lines(run(root, "transactions", "slow-transactions", "-t", "0"))
    assert table[0].split() == ["TXN_ID", "STATUS", "OPEN_DURATION_MS", "TIMEOUT_MS", "PARTITIONS", "SUBSCRIPTIONS",
                                "OWNER", "TRANSACTION_KEY", "EPOCH"]
    row = table[1].split()
    assert (row[0], row[1], row[3], row[4]) == ("(0,2)", "OPEN", "600000", f"{P1}:billing")
    assert "is not of the form 'most,least', 'most:least' or '(most,least)'" in run(root, "transactions", "transaction-metadata", "x",
                                                      code=2).stderr
    assert run(root, "transactions", "transaction-metadata", "(0,99)", code=2).stderr == (
        "error: transaction (0,99) is not in TC 0's log: it finished and its metadata was trimmed, or it never "
        "registered a partition or subscription (an acknowledgement-only transaction registers with its decision: "
        "until then the pending-ack stats of its subscriptions list it under unregisteredTransactions, with its "
        "deadline)\n")


def test_open_duration_stops_when_the_transaction_ends(root: str) -> None:
    """An ended transaction's open_duration_ms is fixed: begin to its COMMITTED/ABORTED entry, read
    from the TC log, however much later it is asked for. An unfinished one's keeps running."""
    client = pulsartx.Client(root, num_coordinators=1)
    client.admin.create_topic("t")
    producer = client.create_producer("t")
    begun = time.time()
    committed, aborted, unfinished = (client.new_transaction(timeout_ms=600_000) for _ in range(3))
    for txn in (committed, aborted, unfinished):
        producer.send(b"x", txn=txn)
    committed.commit()
    aborted.abort()
    client.flush()
    ended_within_ms = (time.time() - begun) * 1000
    meta = lambda txn: run(root, "transactions", "transaction-metadata", str(txn.id), json_out=True)  # noqa: E731
    first = {txn: meta(txn) for txn in (committed, aborted, unfinished)}
    time.sleep(0.3)
    later = {txn: meta(txn) for txn in (committed, aborted, unfinished)}
    for txn, status in ((committed, "COMMITTED"), (aborted, "ABORTED")):
        m = first[txn]
        assert m["status"] == status
        assert later[txn]["open_duration_ms"] == m["open_duration_ms"] == (m["last_modification_time_ms"]
                                                                           - m["start_time_ms"])
        assert 0 <= m["open_duration_ms"] <= ended_within_ms
        assert client.admin.transactions.get_transaction_metadata(txn.id)["open_duration_ms"] == m["open_duration_ms"]
    assert later[unfinished]["open_duration_ms"] >= first[unfinished]["open_duration_ms"] + 300
    unfinished.abort()
    client.close()


def test_transactions_buffer_and_pending_ack_stats(shared) -> None:
    root, _ = shared
    assert run(root, "transactions", "buffer-stats", "orders", json_out=True) == [
        {"partition": P0, "state": "Ready", "maxReadPosition": 6, "lastConfirmedEntry": 6, "ongoingTxnSize": 0,
         "abortedTxnSize": 1, "lastSnapshotOffset": -1, "endOffset": 7},
        {"partition": P1, "state": "Ready", "maxReadPosition": 3, "lastConfirmedEntry": 3, "ongoingTxnSize": 0,
         "abortedTxnSize": 0, "lastSnapshotOffset": -1, "endOffset": 4},
    ]
    assert lines(run(root, "transactions", "buffer-stats", "orders-partition-1")) == [
        "PARTITION                                       STATE  MAX_READ_POSITION  LAST_CONFIRMED_ENTRY  "
        "ONGOING_TXN_SIZE  ABORTED_TXN_SIZE  LAST_SNAPSHOT_OFFSET  END_OFFSET",
        f"{P1}  Ready  3                  3                     0                 0                 -1"
        "                    4",
    ]
    assert run(root, "transactions", "pending-ack-stats", "orders", "billing", json_out=True) == [
        {"partition": P0, "subscription": "billing", "state": "Ready", "markDeletePosition": 1,
         "individuallyAckedRanges": 1, "pendingAckCount": 0, "ongoingTxnCount": 0, "transactions": {},
         "pendingCumulativeAck": None, "unregisteredTransactions": {}},
        {"partition": P1, "subscription": "billing", "state": "Ready", "markDeletePosition": -1,
         "individuallyAckedRanges": 1, "pendingAckCount": 1, "ongoingTxnCount": 1, "transactions": {"(0,2)": 1},
         "pendingCumulativeAck": None, "unregisteredTransactions": {}},
    ]
    assert lines(run(root, "transactions", "pending-ack-stats", "orders", "billing")) == [
        "PARTITION                                       SUBSCRIPTION  STATE  MARK_DELETE_POSITION  "
        "INDIVIDUALLY_ACKED_RANGES  PENDING_ACK_COUNT  ONGOING_TXN_COUNT  TRANSACTIONS  PENDING_CUMULATIVE_ACK",
        f"{P0}  billing       Ready  1                     1                          0                  0",
        f"{P1}  billing       Ready  -1                    1                          1                  1"
        "                  (0,2)=1",
    ]
    assert run(root, "transactions", "transaction-in-buffer-stats", "(0,1)", "orders", json_out=True) == [
        {"partition": P0, "txn_id": "(0,1)", "state": "ABORTED", "startPosition": None, "markerPosition": 6},
        {"partition": P1, "txn_id": "(0,1)", "state": "NONE", "startPosition": None, "markerPosition": None},
    ]
    assert run(root, "transactions", "transaction-in-pending-ack-stats", "(0,2)", "orders-partition-1", "billing",
               json_out=True) == [
        {"partition": P1, "txn_id": "(0,2)", "subscription": "billing", "pendingAckRanges": [[0, 0]],
         "pendingAckCount": 1, "cumulativeAckPosition": None}]


def test_pending_ack_stats_of_a_missing_subscription_is_an_error(shared) -> None:
    """A subscription that exists on no partition of the topic is an error naming both, as in
    ``subscriptions reset``: not rows of state None and exit code 0, which read as "nothing pending"."""
    root, _ = shared
    for command in (["pending-ack-stats", "orders", "ghost"],
                    ["transaction-in-pending-ack-stats", "(0,2)", "orders", "ghost"]):
        r = run(root, "transactions", *command, code=2)
        assert r.stdout == ""
        assert r.stderr.startswith(f"error: subscription 'ghost' does not exist on topic {T}: "), r.stderr

def test_transaction_keys(shared) -> None:
    root, _ = shared
    keys = run(root, "transactions", "list-transaction-keys", json_out=True)
    assert [_timeless(k) for k in keys] == [
        {"owner": "etl", "transaction_key": "pipeline-1", "epoch": 0, "txn_ids": ["(0,1000)"], "coordinator_id": 0}]
    table = lines(run(root, "transactions", "list-transaction-keys"))
    assert table[0].split() == ["COORDINATOR_ID", "OWNER", "TRANSACTION_KEY", "EPOCH", "TXN_IDS", "CLAIMED_MS",
                                "AGE_MS"]
    assert table[1].split()[:5] == ["0", "etl", "pipeline-1", "0", "(0,1000)"]
    one = run(root, "transactions", "get-transaction-key", "pipeline-1", "--owner", "etl", json_out=True)
    assert _timeless(one) == _timeless(keys[0])
    r = run(root, "transactions", "get-transaction-key", "pipeline-1", code=2)
    assert r.stderr == "error: transaction key 'pipeline-1' (owner None) does not exist\n"


def test_delete_transaction_key_and_abort(fresh) -> None:
    root, w = fresh
    keyed = pulsartx.Client(root, transaction_key="job", num_coordinators=1)
    open_txn = keyed.new_transaction()
    assert str(open_txn.id) == "(0,2000)"  # the third client here: the third block of TxnIDs
    assert run(root, "transactions", "delete-transaction-key", "job", json_out=True) == {
        "transaction_key": "job", "owner": None, "aborted": ["(0,2000)"]}
    assert run(root, "transactions", "transaction-metadata", "(0,2000)", json_out=True)["status"] == "ABORTED"
    keyed.close()
    assert [k["transaction_key"] for k in run(root, "transactions", "list-transaction-keys", json_out=True)] == [
        "pipeline-1"]
    # admin abort of the open transaction that holds a pending ack: recorded with its reason, ack released
    table = lines(run(root, "transactions", "abort", "(0,2)"))
    rows = {r.split()[0]: r.split()[1:] for r in table[1:]}
    assert (rows["status"], rows["reason"]) == (["ABORTED"], ["admin", "abort"])
    meta = run(root, "transactions", "transaction-metadata", "(0,2)", json_out=True)
    assert (meta["status"], meta["reason"]) == ("ABORTED", "admin abort")
    stats = run(root, "transactions", "pending-ack-stats", "orders-partition-1", "billing", json_out=True)
    assert (stats[0]["pendingAckCount"], stats[0]["transactions"]) == (0, {})
    assert run(root, "transactions", "abort", "(0,2)", json_out=True)["status"] == "ABORTED"  # idempotent
    r = run(root, "transactions", "abort", "(0,0)", code=2)  # committed: the opposite outcome is refused
    assert r.stderr.startswith("error: ") and "(0,0)" in r.stderr


# ---- global options, errors, entry points ---------------------------------------------------------------
def test_storage_option_syntax(root: str) -> None:
    r = CliRunner().invoke(cli, ["--service-url", root, "--storage-option", "nokey", "topics", "list"])
    assert r.exit_code == 2
    assert "'nokey': use KEY=VALUE" in r.stderr
    r = CliRunner().invoke(cli, ["--service-url", root, "--storage-option", "allow_http=true", "topics", "list"])
    assert (r.exit_code, r.stdout) == (0, "(none)\n")


def test_service_url_from_environment(shared) -> None:
    root, _ = shared
    r = CliRunner().invoke(cli, ["--json", "subscriptions", "list", "orders"], env={"PULSARTX_SERVICE_URL": root})
    assert (r.exit_code, json.loads(r.stdout)) == (0, ["billing"])


def test_console_script(shared) -> None:
    root, _ = shared
    env = {**os.environ, "PULSARTX_SERVICE_URL": ""}
    version = subprocess.run([str(PULSARTX), "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert (version.returncode, version.stdout) == (0, f"pulsartx {metadata.version('pulsartx')}\n"), version.stderr
    ok = subprocess.run([str(PULSARTX), "--service-url", root, "--json", "topics", "list"], capture_output=True,
                        text=True, env=env, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == [{"topic": T, "partitions": 2},
                                     {"topic": "persistent://tenant1/ns1/events", "partitions": 1}]
    bad = subprocess.run([str(PULSARTX), "--service-url", root, "topics", "stats", "missing"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr == (f"error: topic persistent://public/default/missing does not exist under {root}: create it "
                          f"with client.admin.create_topic() or `pulsartx --service-url {root} topics create "
                          "public/default/missing`\n")


def test_slow_transactions_takes_pulsar_admin_durations(shared) -> None:
    """``-t 1s`` as pulsar-admin takes it; a bare number stays milliseconds."""
    root, _ = shared
    open_one = ["(0,2)"]
    for given in ("0", "0ms", "0s", "1ms"):
        assert [m["txn_id"] for m in run(root, "transactions", "slow-transactions", "-t", given, json_out=True)] == open_one
    for given in ("1h", "2m", "3600000"):
        assert run(root, "transactions", "slow-transactions", "-t", given, json_out=True) == []
    for bad in ("5x", "1.5s", "-1", "s", ""):
        r = run(root, "transactions", "slow-transactions", "-t", bad, code=2)
        assert r.stderr.splitlines()[-1] == (
            f"Error: Invalid value for '--timeout-ms' / '-t': {bad!r} is not a duration: use milliseconds (500), "
            "or a whole number with ms, s, m or h (500ms, 1s, 2m, 1h)")


def test_durations_parse_to_milliseconds() -> None:
    assert [parse_duration_ms(t) for t in ("500", "500ms", "1s", "2m", "1h", " 7s ")] == [
        500, 500, 1_000, 120_000, 3_600_000, 7_000]


def test_version_is_the_installed_one() -> None:
    r = CliRunner().invoke(cli, ["--version"])
    assert (r.exit_code, r.stdout) == (0, f"pulsartx {metadata.version('pulsartx')}\n")
    assert pulsartx.__version__ == metadata.version("pulsartx")


def test_version_falls_back_to_pyproject_when_not_installed(monkeypatch) -> None:
    from pulsartx import version

    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version.metadata, "version", not_installed)
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert version.installed_version() == project["version"]
    assert version.pyproject_version(Path("/nonexistent/pyproject.toml")) == version.UNKNOWN


def test_command_tree() -> None:
    for group, commands in {
        "topics": {"create", "delete", "list", "stats", "peek", "timeline", "update-partitioned-topic"},
        "subscriptions": {"list", "reset", "skip", "delete"},
        "transactions": {"list", "coordinator-stats", "coordinators-list", "transaction-metadata", "slow-transactions", "buffer-stats",
                         "pending-ack-stats", "list-transaction-keys", "get-transaction-key",
                         "delete-transaction-key", "abort", "transaction-in-buffer-stats",
                         "transaction-in-pending-ack-stats"},
    }.items():
        assert set(cli.commands[group].commands) == commands
    assert set(cli.commands["coordinator"].commands) == {"run"}
    assert set(cli.commands) == {"topics", "subscriptions", "transactions", "coordinator", "compact", "retention",
                                 "produce", "consume"}


def test_coordinator_run_on_a_metrics_port_in_use_names_the_port(shared) -> None:
    """An OSError from binding the metrics port was reported as a storage-root problem ("the
    storage root ... must be a directory this user can create and write")."""
    import socket

    root, _ = shared
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run(root, "coordinator", "run", "--metrics-port", str(port), code=2)
    assert r.stderr.startswith(f"error: cannot serve metrics on port {port}: "), r.stderr
    assert "storage root" not in r.stderr
    assert "not in the range" in run(root, "coordinator", "run", "--metrics-port", "70000", code=2).stderr


def test_an_output_file_that_cannot_be_written_is_not_blamed_on_the_storage_root(shared, tmp_path) -> None:
    """Every OSError was reported as the storage root's ("the storage root ... must be a directory
    this user can create and write ... check --service-url"), also one about the --out file."""
    pytest.importorskip("matplotlib")
    root, _ = shared
    out = tmp_path / "no-such-dir" / "t.svg"
    r = run(root, "topics", "timeline", "orders", "--out", str(out), code=2)
    assert r.stderr == f"error: No such file or directory: {out}\n", r.stderr


def test_compact_and_retention_of_every_topic_leave_out_one_deleted_while_they_list(root: str, monkeypatch) -> None:
    from pulsartx.admin.topics import TopicsAdmin

    with pulsartx.Client(root) as c:
        for name in ("a", "gone"):
            c.admin.create_topic(name)
        listed = c.admin.list_topics()
        c.admin.delete_topic("gone")
    monkeypatch.setattr(TopicsAdmin, "list_topics", lambda self, namespace=None: listed)
    assert [r["partition"] for r in run(root, "compact", json_out=True)] == ["persistent://public/default/a-partition-0"]
    assert [r["partition"] for r in run(root, "retention", "--max-age-ms", "1000000", json_out=True)] == [
        "persistent://public/default/a-partition-0"]
    assert "does not exist" in run(root, "compact", "gone", code=2).stderr  # named: still an error


@pytest.mark.parametrize("args", [["coordinator", "run", "--compact-every", "-1"],
                                  ["coordinator", "run", "--sweep-interval-ms", "-5"],
                                  ["coordinator", "run", "--grace-ms", "-1"],
                                  ["retention", "--max-age-ms", "-1"],
                                  ["retention", "--max-bytes", "-1"],
                                  ["retention", "--max-age-ms", "1", "--vacuum-retention-hours", "-1"]])
def test_negative_counts_and_durations_are_refused(shared, args, monkeypatch) -> None:
    """A negative --compact-every compacted on every pass (passes % -1 == 0), a negative sweep
    interval ran passes back to back, and a negative age or size limit deleted as 0 does: each is
    refused, naming the option, before anything runs."""
    from pulsartx.cli import ops
    from pulsartx.service import ServiceStats

    class Once:  # were the value taken, the service would run until stopped
        def __init__(self, *args, **kwargs) -> None:
            pass

        def run(self) -> ServiceStats:
            return ServiceStats()

    monkeypatch.setattr(ops, "CoordinatorService", Once)
    root, _ = shared
    r = run(root, *args, code=2)
    assert f"Invalid value for '{args[-2]}'" in r.stderr, r.stderr
