"""``pulsartx transactions coordinators-list``: every TC of the root, where its tables are and
what it holds; a TC nobody used is listed as Unused and not created by looking."""
from __future__ import annotations

import json
import os

from click.testing import CliRunner

import pulsartx
from pulsartx.cli.main import cli


def test_coordinators_list(tmp_path) -> None:
    root = str(tmp_path / "root")
    with pulsartx.Client(root, num_coordinators=3) as c, pulsartx.Client(root) as c2:
        c.admin.create_topic("t")
        p = c.create_producer("t")
        committed = c.new_transaction()
        p.send(b"c", txn=committed)
        committed.commit()
        opened = c2.new_transaction(timeout_ms=600_000)
        c2.create_producer("t").send(b"o", txn=opened)
        c.flush()
        ids = {committed.id.most_bits: committed.id, opened.id.most_bits: opened.id}
        holders = {committed.id.most_bits: c._coordinators().leased[1], opened.id.most_bits: c2._coordinators().leased[1]}
        assert len(ids) == 2  # each client leases its own TC: two TCs used, one not
        r = CliRunner().invoke(cli, ["--service-url", root, "--json", "transactions", "coordinators-list"])
        assert r.exit_code == 0, r.stderr
        rows = json.loads(r.stdout)
    expected = []
    for tc in range(3):
        log, keys = f"{root}/coordinator/tc-{tc}/log", f"{root}/coordinator/tc-{tc}/transaction-keys"
        if tc in ids:
            holder = holders[tc]
            expected.append({"coordinator_id": tc, "state": "Ready", "log": log, "transaction_keys": keys,
                             "active_txns": 1 if ids[tc] == opened.id else 0, "last_txn_id": str(ids[tc]),
                             "txn_ids_reserved": rows[tc]["txn_ids_reserved"], "lease_owner": holder.owner,
                             "lease_expires_ms": holder.expires_ms})
            assert rows[tc]["txn_ids_reserved"] > ids[tc].least_bits
        else:
            expected.append({"coordinator_id": tc, "state": "Unused", "log": log, "transaction_keys": keys,
                             "active_txns": 0, "last_txn_id": None, "txn_ids_reserved": 0, "lease_owner": None,
                             "lease_expires_ms": None})
            assert not os.path.exists(log)
    assert rows == expected
    table = CliRunner().invoke(cli, ["--service-url", root, "transactions", "coordinators-list"]).stdout.splitlines()
    assert table[0].split() == ["COORDINATOR_ID", "STATE", "ACTIVE_TXNS", "LAST_TXN_ID", "TXN_IDS_RESERVED",
                                "LEASE_OWNER", "LEASE_EXPIRES_MS", "LOG", "TRANSACTION_KEYS"]
    assert [r.split()[:2] for r in table[1:]] == [[str(e["coordinator_id"]), e["state"]] for e in expected]


def test_coordinator_stats_listings_and_metrics_create_no_tc_tables(tmp_path):
    """Looking is not using: coordinator stats, the transaction listings and a metrics scrape
    opened every TC, which creates its log table (sixteen Delta tables on a new root, each a few
    requests on an object store). A TC no client has used is reported as such and left alone."""
    from pulsartx import metrics

    root = str(tmp_path / "root")
    client = pulsartx.Client(root, num_coordinators=3)
    client.admin.create_topic("t")
    with client.new_transaction() as txn:  # TC logs exist only where a transaction registered something
        client.create_producer("t").send(b"x", txn=txn)
    client.close()
    used = sorted(os.listdir(os.path.join(root, "coordinator")))
    admin = pulsartx.Client(root)
    stats = admin.admin.transactions.get_coordinator_stats()
    assert sum(s["state"] == "Ready" for s in stats) == sum(d.startswith("tc-") for d in used)
    assert {s["state"] for s in stats} == {"Ready", "Unused"}
    unused = next(s for s in stats if s["state"] == "Unused")
    assert (unused["ongoing_txn_size"], unused["recently_committed"], unused["low_water_mark"]) == (0, 0, -1)
    assert [m["status"] for m in admin.admin.transactions.list_transactions(["COMMITTED"])] == ["COMMITTED"]
    assert admin.admin.transactions.get_slow_transactions(0) == []
    text = metrics.generate_latest(admin)
    assert sum(line.startswith("pulsar_txn_active_count{") for line in text.splitlines()) == 3
    assert sorted(os.listdir(os.path.join(root, "coordinator"))) == used


def test_transaction_metadata_on_an_unused_tc_creates_nothing(tmp_path):
    """transaction-metadata of an id on a TC no client has used opened it, creating its log and
    key tables, only to say the id was never issued."""
    import pytest

    from pulsartx.exceptions import TransactionNotFound

    root = str(tmp_path / "root")
    with pulsartx.Client(root, num_coordinators=4) as c:
        c.admin.create_topic("t")
        with c.new_transaction() as txn:
            c.create_producer("t").send(b"x", txn=txn)
    before = sorted(os.listdir(os.path.join(root, "coordinator")))
    unused = min({0, 1, 2, 3} - {int(d[3:]) for d in before if d.startswith("tc-")})
    with pytest.raises(TransactionNotFound, match=rf"transaction \({unused},7\) was never issued by TC {unused}"):
        pulsartx.Client(root).admin.transactions.get_transaction_metadata(f"{unused}:7")
    assert sorted(os.listdir(os.path.join(root, "coordinator"))) == before
