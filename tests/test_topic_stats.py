"""``topics stats`` on a partition a transaction holds back: the blocking transaction named with
its owner, key, age and timeout; messages and markers apart; producers with their last sequence
ids and writes; a Shared subscription's consumers and unacknowledged messages; publish and
consume rates over their window."""
from __future__ import annotations

import re
import time
from typing import Any

import pytest
from click.testing import CliRunner

import pulsartx
from pulsartx import ConsumerType, InitialPosition
from pulsartx.cli.main import cli
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName
from pulsartx.observe.rates import RATE_WINDOW_S, consume_rate, publish_rate
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.store import SubscriptionStore

P = "persistent://public/default/st-partition-0"


@pytest.fixture
def held(tmp_path) -> Any:
    """st-partition-0:  a0 a1 a2 | c0 c1 COMMIT | x0 ABORT | o0 o1 (open, owner etl) | a3
    offsets            0  1  2    3  4  5        6  7       8  9                        10
    Subscription 'work' (Shared, consumer c1) received the five readable messages and acked two; it
    acknowledged the markers and the aborted entry (5, 6, 7) itself as it read past them."""
    root = str(tmp_path / "root")
    t0 = int(time.time() * 1000)
    client = pulsartx.Client(root, num_coordinators=1)
    client.admin.create_topic("st")
    p1 = client.create_producer("st", producer_name="p1")
    for v in (b"a0", b"a1", b"a2"):
        p1.send(v)
    with client.new_transaction() as t1:
        p1.send(b"c0", txn=t1)
        p1.send(b"c1", txn=t1)
    t2 = client.new_transaction()
    p1.send(b"x0", txn=t2)
    t2.abort()
    client.flush()
    etl = pulsartx.Client(root, transaction_key="job-1", owner="etl", num_coordinators=1)
    t3 = etl.new_transaction(timeout_ms=600_000)
    p2 = etl.create_producer("st", producer_name="p2")
    p2.send(b"o0", txn=t3)
    p2.send(b"o1", txn=t3)
    p1.send(b"a3")
    consumer = client.subscribe("st", "work", consumer_type=ConsumerType.Shared, consumer_name="c1",
                                initial_position=InitialPosition.Earliest, receiver_queue_size=10,
                                acknowledgment_group_time_ms=0)
    got = [consumer.receive(5000) for _ in range(5)]
    assert [m.data() for m in got] == [b"a0", b"a1", b"a2", b"c0", b"c1"]
    consumer.acknowledge(got[0])
    consumer.acknowledge(got[1])
    t1_ms = int(time.time() * 1000)
    yield {"root": root, "client": client, "t3": t3, "t0": t0, "t1": t1_ms, "consumer": consumer}
    consumer.close()
    etl.close()
    client.close()


def test_stats_name_the_blocking_transaction(held) -> None:
    (s,) = held["client"].admin.topic_stats("st")
    now = int(time.time() * 1000)
    blocking = s.pop("blockingTxn")
    age = blocking.pop("ageMs")
    assert 0 <= age <= now - held["t0"]
    assert blocking == {"txnId": str(held["t3"].id), "status": "OPEN", "owner": "etl", "transactionKey": "job-1",
                        "firstOffset": 8, "heldEntries": 3, "timeoutMs": 600_000}
    producers = s.pop("producers")
    assert [(p["producerName"], p["lastSequenceId"]) for p in producers] == [("p1", 6), ("p2", 1)]
    assert all(held["t0"] <= p["lastPublishTime"] <= held["t1"] for p in producers)
    work = s["subscriptions"]["work"]
    (consumer,) = work.pop("consumers")
    assert re.fullmatch(r"c1-\w+", consumer["name"]) and consumer["leaseExpiresMs"] > now
    assert s.pop("msgRateIn") == round(9 / RATE_WINDOW_S, 3)
    # Acknowledged offsets per second: 0 and 1 by the application, 5..7 passed over by the consumer.
    assert s.pop("msgRateOut") == work.pop("msgRateOut") == round(5 / RATE_WINDOW_S, 3)
    assert s.pop("bytes") > 0 and s.pop("fileCount") > 0
    assert s == {"partition": P, "entries": 11, "messages": 9, "markers": 2, "startOffset": 0, "endOffset": 11,
                 "maxReadPosition": 7, "ongoingTxnCount": 1, "abortedTxnCount": 1,
                 "subscriptions": {"work": {"markDeletePosition": 1, "individuallyAckedCount": 3,
                                            "pendingAckCount": 0, "backlog": 6, "type": "Shared",
                                            "unackedMessages": 3}}}


def test_cli_shows_the_blocking_transaction(held) -> None:
    r = CliRunner().invoke(cli, ["--service-url", held["root"], "topics", "stats", "st"])
    assert r.exit_code == 0, r.stderr
    out = r.stdout.splitlines()
    i = out.index("Transactions:")
    assert out[i + 1].split() == ["PARTITION", "ONGOING_TXN_COUNT", "ABORTED_TXN_COUNT", "BLOCKING_TXN", "STATUS",
                                  "OWNER", "AGE_MS", "TIMEOUT_MS", "HELD_ENTRIES"]
    row = out[i + 2].split()
    assert row[:6] == ["0", "1", "1", str(held["t3"].id), "OPEN", "etl"] and row[7:] == ["600000", "3"]
    assert int(row[6]) >= 0
    j = out.index("Subscriptions:")
    sub = out[j + 2].split()
    assert sub[:3] == ["0", "work", "Shared"] and re.fullmatch(r"c1-\w+", sub[3]) and sub[4:8] == ["1", "6", "3", "0"]


def test_rates_count_only_their_window(held) -> None:
    root = StorageRoot.resolve(held["root"])
    plog = PartitionLog(root, TopicName.parse(P))
    plog_segments, index = plog.segments, plog.refresh()
    after = held["t1"] + 1
    assert publish_rate(root, plog_segments, index, now_ms=after) == 9 / RATE_WINDOW_S
    assert publish_rate(root, plog_segments, index, window_s=3600, now_ms=after) == 9 / 3600
    assert publish_rate(root, plog_segments, index, now_ms=after + 61_000) == 0.0
    cursor = SubscriptionStore(root, TopicName.parse(P), "work").segments
    assert consume_rate(root, cursor, now_ms=after) == 5 / RATE_WINDOW_S
    # A minute later the history before the window holds every acknowledgement: nothing in it.
    assert consume_rate(root, cursor, now_ms=after + 61_000) == 0.0


def test_stats_create_nothing(tmp_path) -> None:
    """Reading stats never creates state: no TC set on a root without transactions, no lease table
    for a subscription nobody consumed through."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root) as c:
        c.admin.create_topic("quiet")
        c.create_producer("quiet").send(b"v")
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        (s,) = c.admin.topic_stats("quiet")
        assert (s["messages"], s["markers"], s["blockingTxn"], s["subscriptions"]) == (1, 0, None, {})
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_blocking_transaction_whose_tc_log_cannot_be_read_says_so(tmp_path) -> None:
    """The blocking transaction's TC could not be read (a damaged log): it was described as
    "unknown to its TC (finished and trimmed; its marker is on the way)", sending the operator to
    wait for a marker that may never come. The TC's error is shown instead."""
    import glob
    import os

    from pulsartx.buffer.buffer import TransactionBuffer
    from pulsartx.coordinator.coordinator import CoordinatorConfig
    from pulsartx.observe.holdback import holding_back

    root = str(tmp_path / "root")
    cfg = CoordinatorConfig(lease_ms=0, recovery_grace_ms=10**9)
    client = pulsartx.Client(root, num_coordinators=1, coordinator_config=cfg)
    client.admin.create_topic("st")
    txn = client.new_transaction(timeout_ms=600_000)
    client.create_producer("st").send(b"o", txn=txn)
    client.flush()
    commits = sorted(glob.glob(os.path.join(root, "coordinator", "tc-0", "log", "_delta_log", "*.json")))
    with open(commits[-1], "r+b") as f:
        f.truncate(os.path.getsize(commits[-1]) // 2)
    fresh = pulsartx.Client(root, coordinator_config=cfg)
    [s] = fresh.admin.topic_stats("st")
    assert s["blockingTxn"]["txnId"] == str(txn.id) and "tc-0" in s["blockingTxn"]["tcError"]
    state = TransactionBuffer(PartitionLog(fresh.root, TopicName.parse(P))).state()
    blocker = holding_back(fresh._coordinators(), P, state)
    text = blocker.describe()
    assert "trimmed" not in text and "cannot be read" in text and "tc-0" in text, text
    table = CliRunner().invoke(cli, ["--service-url", root, "topics", "stats", "st"]).stdout.splitlines()
    heads = next(line for line in table if line.startswith("PARTITION  ONGOING_TXN_COUNT"))
    assert heads.split()[-1] == "ERROR", table


def _damage(root: str, partition: int, how: str) -> str:
    """Damage partition ``partition`` of topic dm: its last ``_delta_log`` commit cut in half
    ("truncated") or removed ("missing"). Returns the damaged commit file's name."""
    import glob
    import os

    commits = sorted(glob.glob(os.path.join(root, "topics", "public", "default", "dm", f"partition-{partition}",
                                            "_delta_log", "*.json")))
    assert len(commits) > 1, commits
    if how == "truncated":
        with open(commits[-1], "r+b") as f:
            f.truncate(os.path.getsize(commits[-1]) // 2)
    else:
        os.remove(commits[-2])
    return os.path.basename(commits[-1] if how == "truncated" else commits[-2])


@pytest.fixture(params=["truncated", "missing"])
def damaged(request, tmp_path) -> Any:
    """Topic dm, 3 partitions with two messages each (a commit each), a subscription; partition 1's
    Delta log damaged, read by a client that never loaded it."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root, num_coordinators=1) as c:
        c.admin.create_topic("dm", 3)
        c.subscribe("dm", "audit", initial_position=InitialPosition.Earliest).close()
        for i in range(3):
            with c.create_producer(f"dm-partition-{i}") as p:
                p.send(b"first")
                p.send(b"second")
    _damage(root, 1, request.param)
    return root


def test_stats_of_a_topic_with_a_damaged_partition_show_the_others_and_name_it(damaged, caplog) -> None:
    """One partition whose Delta log cannot be read (a commit file cut short or gone) failed
    ``topic_stats`` as a whole, hiding the healthy partitions from the operator who needs them
    then. The others are returned as usual; the damaged one is a row with the same fields, empty,
    and an ``error`` naming it, and a warning names it."""
    with pulsartx.Client(damaged) as c, caplog.at_level("WARNING"):
        stats = c.admin.topic_stats("dm")
    assert [s["partition"] for s in stats] == [f"persistent://public/default/dm-partition-{i}" for i in range(3)]
    good, bad = [stats[0], stats[2]], stats[1]
    for s in good:
        assert (s["messages"], s["endOffset"], "error" in s) == (2, 2, False), s
        assert list(s["subscriptions"]) == ["audit"]
    assert set(bad) == set(good[0]) | {"error"}  # the same fields, so tables and JSON line up
    assert bad["messages"] is None and bad["endOffset"] is None and bad["subscriptions"] == {}
    assert "dm" in bad["error"] and "partition-1" in bad["error"], bad["error"]
    assert any("dm-partition-1" in r.getMessage() for r in caplog.records if r.levelname == "WARNING"), caplog.records


def test_cli_stats_with_a_damaged_partition_print_the_others_and_exit_non_zero(damaged) -> None:
    """The CLI prints every table with the healthy partitions and an ERROR column for the damaged
    one, then says on stderr which partition it could not read and exits with code 2, as before
    for a script that checks it; ``--json`` stays one JSON document."""
    import json

    r = CliRunner().invoke(cli, ["--service-url", damaged, "topics", "stats", "dm"])
    assert r.exit_code == 2, (r.stdout, r.stderr, r.exception)
    table = r.stdout.splitlines()
    assert table[0].split()[0] == "PARTITION" and table[0].split()[-1] == "ERROR", table
    rows = {line.split()[0]: line for line in table[1:4]}
    assert set(rows) == {"0", "1", "2"} and "partition-1" in rows["1"] and rows["0"].split()[1] == "2", table
    assert r.stderr.startswith("error: 1 of 3 partitions of dm cannot be read"), r.stderr
    assert "dm-partition-1" in r.stderr, r.stderr
    r = CliRunner().invoke(cli, ["--service-url", damaged, "--json", "topics", "stats", "dm"])
    assert r.exit_code == 2, (r.stdout, r.stderr, r.exception)
    assert [("error" in s) for s in json.loads(r.stdout)] == [False, True, False]


def test_stats_of_a_topic_deleted_while_they_are_read_raise_topic_not_found(tmp_path, monkeypatch) -> None:
    """A topic deleted between the listing of its partitions and their reading is gone, not
    damaged: TopicNotFound, as for a topic deleted a moment earlier, not rows of errors that
    the CLI reports as partitions that cannot be read."""
    from pulsartx.admin.topics import TopicsAdmin
    from pulsartx.exceptions import TopicNotFound

    with pulsartx.Client(str(tmp_path / "root")) as c:
        c.admin.create_topic("gone", partitions=2)
        listed = TopicsAdmin.partitions_of

        def listed_then_deleted(self: Any, topic: str) -> Any:
            parts = listed(self, topic)
            c.admin.delete_topic(topic)
            return parts

        monkeypatch.setattr(TopicsAdmin, "partitions_of", listed_then_deleted)
        with pytest.raises(TopicNotFound):
            c.admin.topic_stats("gone")
