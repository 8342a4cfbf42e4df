"""``pulsartx produce`` / ``consume`` (after pulsar-client) and ``transactions list``: exact output,
acknowledgements, ``--txn`` committed at the end or aborted on an error, and the console script."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import pulsartx
from pulsartx.cli.main import cli

PULSARTX = Path(sys.executable).parent / "pulsartx"
TOPIC = "persistent://public/default/orders"


def run(root: str, *args: str, code: int = 0):
    r = CliRunner().invoke(cli, ["--service-url", root, *args])
    assert r.exit_code == code, (r.stdout, r.stderr, r.exception)
    return r


def consume(root: str, *args: str, json_out: bool = False):
    """Everything readable on subscription 'sub' (from the earliest), stopping once idle."""
    return run(root, *(["--json"] if json_out else []), "consume", "orders", "-s", "sub", "-p", "Earliest",
               "-n", "0", "--idle-timeout", "300ms", *args)


def status_of(root: str, txn_id: str) -> str:
    return json.loads(run(root, "--json", "transactions", "transaction-metadata", txn_id).stdout)["status"]


def test_produce_then_consume_prints_and_acknowledges(root: str) -> None:
    r = run(root, "produce", "orders", "-m", "a,b", "-m", "c", "-n", "2", "-k", "k1", "-p", "x=1")
    assert (r.stdout, r.stderr) == ("6 messages successfully produced\n", "")
    r = run(root, "consume", "orders", "-s", "sub", "-p", "Earliest", "-n", "4")
    assert r.stdout == "".join(f"----- got message -----\nkey:[k1], properties:[x=1], content:{v}\n"
                               for v in ("a", "b", "c", "a"))
    assert r.stderr == "4 messages successfully consumed\n"
    # What was printed was acknowledged: the next run goes on from there, and stops once idle.
    r = consume(root)
    assert r.stdout == ("----- got message -----\nkey:[k1], properties:[x=1], content:b\n"
                        "----- got message -----\nkey:[k1], properties:[x=1], content:c\n")
    assert r.stderr == "2 messages successfully consumed\n"
    assert (consume(root).stdout, consume(root).stderr) == ("", "0 messages successfully consumed\n")


def test_json_output(root: str) -> None:
    produced = json.loads(run(root, "--json", "produce", "orders", "-m", "x|y", "-s", "|").stdout)
    assert produced == {"topic": "orders", "produced": 2, "messageIds": ["(0,0)", "(0,1)"], "txnId": None}
    run(root, "produce", "orders", "-m", "whole,one", "-s", "")
    got = json.loads(consume(root, json_out=True).stdout)
    for m in got:
        assert m.pop("publishTime") > 0
    assert got == [{"messageId": f"(0,{i})", "partition": 0, "offset": i, "key": None, "properties": {},
                    "eventTime": None, "txnId": None, "size": len(v), "value": v, "encoding": "utf-8"}
                   for i, v in enumerate(["x", "y", "whole,one"])]
    assert json.loads(consume(root, json_out=True).stdout) == []  # acknowledged


def test_txn_commits_at_the_end(root: str) -> None:
    produced = json.loads(run(root, "--json", "produce", "orders", "-m", "t0,t1", "--txn").stdout)
    assert (produced["produced"], produced["messageIds"]) == (2, ["(0,0)", "(0,1)"])
    assert status_of(root, produced["txnId"]) == "COMMITTED"
    r = run(root, "produce", "orders", "-m", "t2", "--txn")
    assert r.stdout.startswith("1 messages successfully produced in transaction (")
    assert r.stdout.endswith("), committed\n")
    r = run(root, "consume", "orders", "-s", "sub", "-p", "Earliest", "-n", "3", "-t", "Shared", "--txn")
    assert [line for line in r.stdout.splitlines() if "content" in line] == [
        f"key:[null], content:t{i}" for i in range(3)]
    txn_id = re.search(r"in transaction (\(\d+,\d+\))", r.stderr).group(1)
    assert r.stderr == f"3 messages successfully consumed in transaction {txn_id}, committed\n"
    assert status_of(root, txn_id) == "COMMITTED"
    assert consume(root, "-t", "Shared").stdout == ""  # its acknowledgements were committed


def test_txn_aborted_when_the_command_fails(root: str) -> None:
    run(root, "produce", "orders", "-m", "m0")
    with pulsartx.Client(root) as client:
        holder = client.subscribe("orders", "sub")  # Exclusive: a second consumer is refused
        r = run(root, "consume", "orders", "-s", "sub", "--txn", code=2)
        assert r.stderr.startswith("error: ")
        aborted = json.loads(run(root, "--json", "transactions", "list", "--status", "ABORTED").stdout)
        assert [m["status"] for m in aborted] == ["ABORTED"]
        assert json.loads(run(root, "--json", "transactions", "list").stdout) == []
        holder.close()


def test_consume_needs_an_existing_root(tmp_path) -> None:
    r = run(str(tmp_path / "none"), "consume", "orders", "-s", "sub", code=2)
    assert r.stderr.startswith(f"error: storage root {tmp_path / 'none'} does not exist")
    assert not (tmp_path / "none").exists()


def timeless(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in ("open_duration_ms", "last_modification_time_ms")}


def test_transactions_list(root: str) -> None:
    client = pulsartx.Client(root, num_coordinators=1)
    try:
        client.admin.create_topic("orders")
        producer = client.create_producer("orders")
        with client.new_transaction() as done:
            producer.send(b"c", txn=done)
        client.flush()  # its marker written: COMMITTED, not COMMITTING
        open1 = client.new_transaction(timeout_ms=600_000)
        producer.send(b"o", txn=open1)
        open2 = client.new_transaction(timeout_ms=600_000)
        producer.send(b"p", txn=open2)
        client.new_transaction()  # nothing sent or acknowledged: not in its TC's log, so not listed
        listed = json.loads(run(root, "--json", "transactions", "list").stdout)
        assert [(m["txn_id"], m["status"], m["partitions"]) for m in listed] == [
            (str(open1.id), "OPEN", [f"{TOPIC}-partition-0"]), (str(open2.id), "OPEN", [f"{TOPIC}-partition-0"])]
        assert [timeless(m) for m in listed] == [timeless(m) for m in client.admin.transactions.list_transactions()]
        table = run(root, "transactions", "list").stdout.splitlines()
        assert table[0].split() == ["TXN_ID", "STATUS", "OPEN_DURATION_MS", "TIMEOUT_MS", "PARTITIONS",
                                    "SUBSCRIPTIONS", "OWNER", "TRANSACTION_KEY", "EPOCH"]
        assert [row.split()[:2] for row in table[1:]] == [[str(open1.id), "OPEN"], [str(open2.id), "OPEN"]]
        both = json.loads(run(root, "--json", "transactions", "list", "--status", "open", "--status",
                              "COMMITTED").stdout)
        assert [(m["txn_id"], m["status"]) for m in both] == [
            (str(done.id), "COMMITTED"), (str(open1.id), "OPEN"), (str(open2.id), "OPEN")]
        assert run(root, "transactions", "list", "--older-than", "1h").stdout == "(none)\n"
        assert len(json.loads(run(root, "--json", "transactions", "list", "--older-than", "0s").stdout)) == 2
        bad = run(root, "transactions", "list", "--older-than", "soon", code=2)
        assert "'soon' is not a duration" in bad.stderr
        assert "'DONE' is not one of" in run(root, "transactions", "list", "--status", "DONE", code=2).stderr
        with pytest.raises(pulsartx.exceptions.InvalidConfiguration, match="status 'DONE'"):
            client.admin.transactions.list_transactions(["DONE"])
        open1.abort()
        open2.commit()
        client.flush()  # their markers written: COMMITTED and ABORTED, no longer listed
        assert run(root, "transactions", "list").stdout == "(none)\n"
    finally:
        client.close()


def test_console_script_produce_and_consume(root: str) -> None:
    env = {**os.environ, "PULSARTX_SERVICE_URL": root}

    def pulsartx_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(PULSARTX), *args], capture_output=True, text=True, env=env, timeout=120)

    p = pulsartx_cli("produce", "orders", "-m", "hello", "-n", "2", "--txn")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("2 messages successfully produced in transaction (")
    c = pulsartx_cli("consume", "orders", "-s", "sub", "-p", "Earliest", "-n", "2")
    assert (c.returncode, c.stdout) == (0, "----- got message -----\nkey:[null], content:hello\n" * 2), c.stderr
    assert c.stderr == "2 messages successfully consumed\n"


def test_an_object_store_refusal_says_which_settings_to_check(tmp_path) -> None:
    """Without credentials an s3:// root failed with only the object store's own words, "Error
    performing PUT http://169.254.169.254/latest/api/token ... 403 Forbidden" (its credentials
    lookup), naming neither the root nor an option to set."""
    env = {k: "" for k in os.environ if k.startswith("AWS_")}
    res = CliRunner().invoke(cli, ["--service-url", "s3://no-such-bucket/x", "topics", "list"], env=env)
    assert res.exit_code == 2, res.output
    assert "storage root s3://no-such-bucket/x: check the bucket name in --service-url" in res.output, res.output
    assert "AWS_ACCESS_KEY_ID" in res.output, res.output


def test_deleting_a_partition_name_is_refused_and_deletes_nothing(tmp_path) -> None:
    """``topics delete t-partition-0`` answered "deleted t-partition-0" and deleted topic t, every
    partition of it."""
    root = str(tmp_path / "root")
    runner = CliRunner()
    assert runner.invoke(cli, ["--service-url", root, "topics", "create", "t", "-p", "2"]).exit_code == 0
    res = runner.invoke(cli, ["--service-url", root, "topics", "delete", "t-partition-0"])
    assert res.exit_code == 2, res.output
    assert "names one partition, and a partition cannot be deleted alone: give the topic name without " \
           "'-partition-0'" in res.output, res.output
    listed = runner.invoke(cli, ["--service-url", root, "--json", "topics", "list"])
    assert json.loads(listed.output) == [{"topic": "persistent://public/default/t", "partitions": 2}], listed.output


@pytest.mark.parametrize("where", ["a-file", "a-file/below"])
def test_a_root_that_cannot_be_a_directory_is_an_error_not_a_traceback(tmp_path, where: str) -> None:
    """``topics create`` on a root that is a file (or lies below one) ended in a NotADirectoryError
    or FileNotFoundError traceback, exit code 1."""
    (tmp_path / "a-file").write_text("x")
    root = str(tmp_path / where)
    res = CliRunner().invoke(cli, ["--service-url", root, "topics", "create", "x"])
    assert res.exit_code == 2, (res.output, res.exception)
    assert f"the storage root {root} must be a directory this user can create and write" in res.output, res.output
