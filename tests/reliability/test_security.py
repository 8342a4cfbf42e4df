"""Suite 5, "Security".

1. No topic, namespace or subscription name reaches a path outside the storage root: hypothesis
   throws traversal tricks at every API that turns a name into a path (create, produce, subscribe,
   delete, list), and the filesystem outside the root is listed before and after.
2. A transaction is ended only by the owner who created it (or by an explicit admin abort), and
   transaction keys are scoped per owner.
3. Credentials in ``storage_options`` never show in logs, error messages, reprs, CLI output or
   Spark plans: a unique secret is used for real against an S3 server (moto), and every captured
   text is searched for it.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pulsartx.datasource import options as O

import pulsartx
from pulsartx import MessageId
from pulsartx.cli.main import cli
from pulsartx.client.transaction import Transaction
from pulsartx.exceptions import (
    InvalidTopicName,
    NotAllowedError,
    PulsarException,
    TopicAlreadyExists,
    TopicNotFound,
)
from pulsartx.storage.root import StorageRoot

# ---- 1. names stay inside the root -------------------------------------------------------------------
_ATOMS = st.sampled_from([
    "..", ".", "/", "\\", "\x00", "\n", "%2e%2e", "%2f", "%00", "..%2f", "%252e", "\u2024\u2024", "\uff0e\uff0e",
    "\u2215", "\u2044", "\uff0f", "\u202e", "\u200b", "~", "$HOME", "${HOME}", "/etc/passwd", "C:\\", "\\\\?\\",
    "file://", "persistent://", "non-persistent://", "-partition-", "-partition-0", "_delta_log", "_pulsartx",
    "a", "B", "7", "-", "_", "=", ":", " ", "*", "?", "\u00e9", "x" * 250,
])
_TRICKY = st.lists(st.one_of(_ATOMS, st.text(max_size=3)), min_size=1, max_size=8).map("".join)
# Names that pass validation, built from every allowed character ('.', ':' and '=' included), so
# accepted names really create tables and subscriptions whose paths are then checked.
_SEG = st.text(alphabet="aZ09_-=:.", min_size=1, max_size=10)
_VALIDISH = st.one_of(_SEG, st.tuples(_SEG, _SEG, _SEG).map("/".join), _SEG.map(lambda s: f"{s}-partition-0"))
_NAME = st.one_of(_TRICKY, _VALIDISH, _VALIDISH.map(lambda s: "persistent://" + s))
_LISTED = ("t", "x")  # names that exist, so only the tricky side varies


def _tree(path: Path) -> set[str]:
    """Every file and directory below ``path`` (relative), symlinks included."""
    out = set()
    for d, dirs, files in os.walk(path):
        for n in dirs + files:
            out.add(os.path.relpath(os.path.join(d, n), path))
    return out


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """``<sandbox>/root`` is the storage root; ``<sandbox>/outside`` holds a file a traversal could
    reach; the working directory is ``<sandbox>/cwd`` (relative paths land there)."""
    base = tmp_path_factory.mktemp("sandbox")
    (base / "outside").mkdir()
    (base / "outside" / "precious.txt").write_text("do not touch")
    (base / "cwd").mkdir()
    root = base / "root"
    root.mkdir()
    old = os.getcwd()
    os.chdir(base / "cwd")
    client = pulsartx.Client(str(root))
    client.admin.create_topic("t")
    try:
        yield base, root, client
    finally:
        client.close()
        os.chdir(old)


def _outside(base: Path, root: Path) -> set[str]:
    return {p for p in _tree(base) if not (p == "root" or p.startswith("root" + os.sep))}


NAME_EXAMPLES = {"tried": 0, "accepted": 0}


def _send_once(client, topic: str) -> None:
    producer = client.create_producer(topic)
    try:
        producer.send(b"x")
    finally:
        producer.close()


@settings(max_examples=max(1, int(30 * float(os.environ.get("PULSARTX_FUZZ_SCALE", "1")))), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_NAME, sub=_NAME, ns=_NAME)
def test_no_name_reaches_outside_the_root(sandbox, name, sub, ns):
    base, root, client = sandbox
    before = _outside(base, root)
    for op in (lambda: client.admin.create_topic(name),
               lambda: _send_once(client, name),
               lambda: client.subscribe("t", sub).close(),
               lambda: client.subscribe(name, "s").close(),
               lambda: client.admin.list_topics(ns),
               lambda: client.admin.list_subscriptions(name),
               lambda: client.admin.delete_topic(name)):
        NAME_EXAMPLES["tried"] += 1
        try:
            op()
            NAME_EXAMPLES["accepted"] += 1
        except (InvalidTopicName, TopicNotFound, pulsartx.exceptions.InvalidConfiguration, TopicAlreadyExists):
            pass  # refused by name, or a well-formed name that does not exist (or already does)
    assert _outside(base, root) == before
    if os.environ.get("PULSARTX_REPORT_COUNTS"):
        print("name operations", NAME_EXAMPLES)
    assert (base / "outside" / "precious.txt").read_text() == "do not touch"
    real_root = os.path.realpath(root) + os.sep
    for rel in _tree(root):
        p = os.path.join(root, rel)
        assert not os.path.islink(p), p
        assert os.path.realpath(p).startswith(real_root), p
        top = rel.split(os.sep)[0]
        assert top in ("topics", "subscriptions", "coordinators", "_pulsartx", "transactions") or top.startswith("tc"), rel


@pytest.mark.parametrize("option,value", [("topic", "../../outside"), ("topics", "t,../x"), ("subscription", ".."),
                                          ("startingOffsets", '{"../../x": {"0": 1}}')])
def test_spark_options_cannot_name_paths_outside(option, value):
    parse = O.parse_stream_options if option == "subscription" else O.parse_options
    opts = {"service.url": "/tmp/never-created", "topic": "t", option: value}
    if option == "topics":
        del opts["topic"]
    with pytest.raises(pulsartx.exceptions.InvalidConfiguration, match=f"option {option}"):
        parse(opts)


def test_cli_refuses_traversal(tmp_path):
    result = CliRunner().invoke(cli, ["--service-url", str(tmp_path / "root"), "topics", "create", "../../escape"])
    assert result.exit_code == 2 and "the tenant contains '..' (rule: no '..' in a name)" in result.stderr
    assert sorted(os.listdir(tmp_path)) in ([], ["root"])


# ---- 2. transaction ownership ---------------------------------------------------------------------------
def _visible(client, topic: str, level: str = "READ_COMMITTED") -> list[bytes]:
    return sorted(m.data() for m in client.create_reader(topic, MessageId.earliest, isolation_level=level))


def test_only_the_owner_ends_its_transaction(root):
    alice = pulsartx.Client(root, owner="alice")
    alice.admin.create_topic("t", 2)
    txn = alice.new_transaction()
    alice.create_producer("t").send(b"alice-1", txn=txn)
    status = lambda c, t: c._coordinators().for_txn(t.id).get(t.id, refresh=True).status.value  # noqa: E731

    intruders = {"bob": pulsartx.Client(root, owner="bob"), "no owner": pulsartx.Client(root),
                 "empty owner": pulsartx.Client(root, owner="")}
    refused = 0
    for who, other in intruders.items():
        for action in ("commit", "abort"):
            # Another process that learned the TxnID builds a handle on it and tries to end it.
            stolen = Transaction(other, other._coordinators().for_txn(txn.id).get(txn.id, refresh=True))
            with pytest.raises(NotAllowedError) as ei:
                getattr(stolen, action)()
            assert f"transaction {txn.id} belongs to owner 'alice'" in str(ei.value), who
            # says how an admin may end it, on this root
            assert (f"`pulsartx --service-url {root} transactions abort {txn.id.most_bits}:{txn.id.least_bits}`"
                    in str(ei.value))
            refused += 1
    assert refused == 6
    assert status(alice, txn) == "OPEN"
    assert _visible(alice, "t") == [] and _visible(alice, "t", "READ_UNCOMMITTED") == [b"alice-1"]
    txn.commit()
    alice.flush()  # the final entry follows the decision in the background
    assert status(alice, txn) == "COMMITTED" and _visible(intruders["bob"], "t") == [b"alice-1"]

    # The explicit admin overrides: the admin API and `pulsartx transactions abort`.
    t2, t3 = alice.new_transaction(), alice.new_transaction()
    alice.create_producer("t").send(b"alice-2", txn=t2)
    meta = intruders["bob"].admin.transactions.abort_transaction(str(t2.id))
    assert (meta["status"], meta["reason"], meta["owner"]) == ("ABORTED", "admin abort", "alice")
    result = CliRunner().invoke(cli, ["--service-url", root, "--json", "transactions", "abort", str(t3.id)])
    assert result.exit_code == 0, result.stderr
    assert status(alice, t3) == "ABORTED" and _visible(alice, "t") == [b"alice-1"]
    # t3 had registered nothing, so only alice's process knew it: the admin abort fenced it anyway.
    with pytest.raises(PulsarException, match="ABORTED"):
        alice.create_producer("t").send(b"too late", txn=t3)
    with pytest.raises(PulsarException, match="ABORTED"):
        t3.commit()

    # Owner-less transactions belong to nobody in particular (Pulsar's rule with auth disabled).
    free = intruders["no owner"].new_transaction()
    intruders["no owner"].create_producer("t").send(b"free", txn=free)  # other processes see it from here on
    Transaction(intruders["bob"], intruders["bob"]._coordinators().for_txn(free.id).get(free.id)).commit()
    intruders["bob"].flush()
    assert status(alice, free) == "COMMITTED"
    for c in (alice, *intruders.values()):
        c.close()


def test_transaction_keys_are_scoped_per_owner(root):
    setup = pulsartx.Client(root)
    setup.admin.create_topic("k")
    alice = pulsartx.Client(root, owner="alice", transaction_key="job")
    bob = pulsartx.Client(root, owner="bob", transaction_key="job")  # same key, other owner: not a newer epoch
    assert (alice.epoch, bob.epoch) == (0, 0)
    ta, tb = alice.new_transaction(), bob.new_transaction()
    alice.create_producer("k").send(b"a", txn=ta)
    bob.create_producer("k").send(b"b", txn=tb)
    # A new client of alice's key fences alice's open transaction, and only hers.
    alice2 = pulsartx.Client(root, owner="alice", transaction_key="job")
    assert alice2.epoch == 1
    with pytest.raises(pulsartx.exceptions.ExpiredTransactionError):
        ta.commit()
    tb.commit()
    assert _visible(setup, "k") == [b"b"]
    keys = sorted((k["owner"], k["transaction_key"], k["epoch"]) for k in setup.admin.transactions.list_transaction_keys())
    assert keys == [("alice", "job", 1), ("bob", "job", 0)]
    # A keyed transaction is owned as well: bob cannot end alice2's.
    ta2 = alice2.new_transaction()
    with pytest.raises(NotAllowedError):
        Transaction(bob, bob._coordinators().for_txn(ta2.id).get(ta2.id)).commit()
    ta2.commit()
    for c in (setup, alice, bob, alice2):
        c.close()


# ---- 3. credentials never leak -------------------------------------------------------------------------
SECRET = f"pulsartxSECRET{uuid.uuid4().hex}"
TOKEN = f"pulsartxTOKEN{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def moto():
    import boto3
    from _s3_proxy import moto_server

    with moto_server() as url:
        boto3.client("s3", endpoint_url=url, aws_access_key_id="AKIDPULSARTX", aws_secret_access_key=SECRET,
                     region_name="us-east-1").create_bucket(Bucket="sec")
        yield url


def _options(endpoint: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "AKIDPULSARTX", "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_SESSION_TOKEN": TOKEN, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def _assert_clean(what: str, text: str) -> None:
    for credential in (SECRET, TOKEN):
        at = text.find(credential)
        assert at < 0, f"credential leaked in {what}: ...{text[max(0, at - 600):at + 100]}"


def _error_text(fn) -> str:
    try:
        fn()
    except Exception as e:  # every error we can provoke, pulsartx's or a library's
        return "".join(traceback.format_exception(e)) + repr(e) + str(e)
    raise AssertionError("expected an error")


def test_credentials_never_in_logs_errors_or_reprs(moto, caplog):
    caplog.set_level(logging.DEBUG)  # every logger: ours, deltalake's, botocore's, s3fs's
    texts: dict[str, str] = {}
    client = pulsartx.Client("s3://sec/root", _options(moto), num_coordinators=2)
    client.admin.create_topic("t", 2)
    producer = client.create_producer("t")
    with client.new_transaction() as txn:
        producer.send(b"in-txn", txn=txn, properties={"k": "v"})
        texts["repr(Transaction)"] = repr(txn)
    producer.send(b"plain")
    consumer = client.subscribe("t", "s", initial_position=pulsartx.InitialPosition.Earliest)
    msgs = [consumer.receive(10_000) for _ in range(2)]
    consumer.acknowledge(msgs[0])
    reader = client.create_reader("t", MessageId.earliest)
    assert sorted(m.data() for m in [reader.read_next(10_000), reader.read_next(10_000)]) == [b"in-txn", b"plain"]
    for name, obj in {"Client": client, "StorageRoot": client.root, "Producer": producer, "Consumer": consumer,
                      "Reader": reader, "Message": msgs[0], "Admin": client.admin}.items():
        texts[f"repr({name})"] = repr(obj) + str(obj)
    texts["admin stats"] = repr(client.admin.topic_stats("t")) + repr(
        client.admin.transactions.get_coordinator_stats())

    # Option dataclasses, as Spark would build them.
    spark_opts = {"service.url": "s3://sec/root", "topic": "t", "subscription": "s",
                  **{f"pulsartx.storage.{k}": v for k, v in _options(moto).items()}}
    batch_opts = {k: v for k, v in spark_opts.items() if k != "subscription"}  # a streaming-read option
    texts["repr(PulsarTxOptions)"] = repr(O.parse_options(batch_opts))
    texts["repr(WriteOptions)"] = repr(O.parse_write_options(batch_opts))
    texts["repr(StreamOptions)"] = repr(O.parse_stream_options(spark_opts))
    # Other stores spell their secrets differently.
    texts["repr(azure/gcs root)"] = repr(StorageRoot.resolve("az://c/p", {
        "AZURE_STORAGE_ACCOUNT_KEY": SECRET, "azure_storage_sas_key": SECRET, "azure_client_secret": SECRET,
        "GOOGLE_SERVICE_ACCOUNT_KEY": SECRET, "bearer_token": TOKEN, "AZURE_STORAGE_ACCOUNT_NAME": "acct"}))
    assert "acct" in texts["repr(azure/gcs root)"]  # non-secrets stay readable

    # Errors: a missing bucket, an unknown topic, and an unreachable endpoint, all with the secret set.
    texts["missing bucket"] = _error_text(
        lambda: pulsartx.Client("s3://no-such-bucket/root", _options(moto)).admin.create_topic("x"))
    texts["unknown topic"] = _error_text(lambda: pulsartx.Client(
        "s3://sec/root", _options(moto), auto_create_topics=False).create_producer("nope"))
    texts["unreachable endpoint"] = _error_text(
        lambda: pulsartx.Client("s3://sec/root", _options("http://127.0.0.1:1")).admin.list_topics())
    for c in (consumer, reader, producer):
        c.close()
    client.close()

    texts["logs"] = caplog.text + "\n".join(repr(r.args) for r in caplog.records)
    # DEBUG logging really captured what the Python libraries say. pulsartx's own S3 requests go
    # through obstore (Rust), which logs nothing here, so the chatter is ours and s3fs/botocore's.
    assert logging.getLogger().getEffectiveLevel() == logging.DEBUG
    assert any(r.name.startswith("pulsartx") for r in caplog.records)
    for what, text in texts.items():
        _assert_clean(what, text)
    assert "***" in texts["repr(StorageRoot)"] and "***" in texts["repr(PulsarTxOptions)"]


def test_credentials_never_in_cli_output(moto):
    args = ["--service-url", "s3://sec/cli"]
    for k, v in _options(moto).items():
        args += ["--storage-option", f"{k}={v}"]
    setup = pulsartx.Client("s3://sec/cli", _options(moto))
    setup.admin.create_topic("c", 2)
    setup.create_producer("c").send(b"x")
    setup.close()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    pulsartx_cli = str(Path(sys.executable).with_name("pulsartx"))
    # The long-running service logs at INFO to stderr while it sweeps and folds the real bucket...
    service = subprocess.Popen([pulsartx_cli, *args, "coordinator", "run", "--sweep-interval-ms", "100"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # ...and an error path runs meanwhile: a missing bucket, with the same credentials.
        bad = [a.replace("s3://sec/cli", "s3://no-such-bucket/cli") for a in args]
        r = subprocess.run([pulsartx_cli, *bad, "topics", "create", "c"], capture_output=True, text=True, env=env,
                           timeout=120)
        time.sleep(1)
    finally:
        service.send_signal(signal.SIGTERM)
        out, err = service.communicate(timeout=60)
    assert r.returncode != 0 and "no-such-bucket" in r.stdout + r.stderr
    assert "coordinator service started" in err and service.returncode == 0, err[-2000:]
    assert "passes" in out
    _assert_clean("CLI error run", r.stdout + r.stderr)
    _assert_clean("CLI coordinator run", out + err)


@pytest.mark.spark
def test_credentials_never_in_spark_plans_or_errors(spark, moto):
    storage = {f"pulsartx.storage.{k}": v for k, v in _options(moto).items()}
    setup = pulsartx.Client("s3://sec/spark", _options(moto))
    setup.admin.create_topic("t")
    setup.create_producer("t").send(b"v")
    df = spark.read.format("pulsartx").options(**storage).option("service.url", "s3://sec/spark").option("topic", "t").load()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        df.explain(True)
        df.explain("formatted")
    plans = buf.getvalue() + df._jdf.queryExecution().toString()
    assert "BatchScan pulsartx" in plans
    assert [r.value for r in df.collect()] == [b"v"]
    _assert_clean("Spark plans", plans)
    err = _error_text(lambda: spark.read.format("pulsartx").options(**storage)
                      .option("service.url", "s3://sec/spark").option("topic", "missing").load())
    assert "persistent://public/default/missing does not exist" in err
    _assert_clean("Spark error", err)
    setup.close()


def test_redaction_covers_every_credential_key():
    # object_store's and fsspec's credential option names, in both cases.
    secret_keys = ["AWS_SECRET_ACCESS_KEY", "aws_session_token", "AWS_ACCESS_KEY_ID", "AZURE_STORAGE_ACCOUNT_KEY",
                   "azure_storage_access_key", "AZURE_STORAGE_SAS_KEY", "azure_storage_token", "AZURE_CLIENT_SECRET",
                   "GOOGLE_SERVICE_ACCOUNT_KEY", "google_application_credentials", "password", "bearer_token"]
    safe = {"AWS_ENDPOINT_URL": "http://e", "AWS_REGION": "eu-west-1", "AWS_ALLOW_HTTP": "true",
            "AZURE_STORAGE_ACCOUNT_NAME": "acct"}
    root = StorageRoot.resolve("s3://b/p", {**{k: SECRET for k in secret_keys}, **safe})
    text = repr(root)
    _assert_clean("repr(StorageRoot)", text)
    assert text.count("'***'") == len(secret_keys)
    for k, v in safe.items():
        assert f"'{k}': '{v}'" in text
    with pytest.raises(PulsarException) as ei:  # a resolve error shows the URL, never the options
        StorageRoot.resolve("ftp://b/p", {"AWS_SECRET_ACCESS_KEY": SECRET})
    _assert_clean("resolve error", str(ei.value))
