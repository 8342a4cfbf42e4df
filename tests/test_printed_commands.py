"""Every ``pulsartx`` command a message prints names the storage root it is about with
``--service-url``, quoted for a shell: without it, the command acts on whatever root the reader's
shell resolves (``./pulsartx-data`` in their working directory), which may be another root with a
transaction or topic of the same name. (The held-back warning is in test_held_back_warning.py,
with a run of its command from another directory.)"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from pulsartx.datasource.options import parse_selection, parse_write_options
from pulsartx.datasource.topics import selected_topics
from pulsartx.datasource.writer import resolve_targets
from pyspark.sql.types import BinaryType, StructField, StructType

import pulsartx
from pulsartx import MessageId
from pulsartx.admin import SubscriptionNotFound
from pulsartx.cli.main import cli
from pulsartx.client.transaction import Transaction
from pulsartx.exceptions import NotAllowedError, PulsarException, TopicNotFound
from pulsartx.storage.root import StorageRoot

REPO = Path(__file__).resolve().parents[1]
T = "persistent://public/default/orders"


@pytest.fixture
def root(tmp_path: Path) -> str:
    """A root whose path needs quoting in a shell."""
    path = tmp_path / "my root"
    path.mkdir()
    return str(path)


def printed(text: str) -> str:
    """The one ``pulsartx ...`` command in a message (commands are printed between backticks)."""
    commands = re.findall(r"`(pulsartx [^`]*)`", text)
    assert len(commands) == 1, text
    return commands[0]


def error_of(fn) -> str:
    with pytest.raises(PulsarException) as info:
        fn()
    return str(info.value)


def test_a_missing_topic(root: str) -> None:
    c = pulsartx.Client(root, num_coordinators=1)
    with pytest.raises(TopicNotFound) as info:
        c.create_producer("missing-partition-0")  # a partition name is never auto-created
    assert printed(str(info.value)) == f"pulsartx --service-url '{root}' topics create public/default/missing"
    c.close()


def test_a_deleted_partition(root: str) -> None:
    c = pulsartx.Client(root, num_coordinators=1)
    c.admin.create_topic("gone")
    producer = c.create_producer("gone")
    c.admin.delete_topic("gone")
    with pytest.raises(TopicNotFound) as info:
        producer.send(b"x")
    assert printed(str(info.value)) == f"pulsartx --service-url '{root}' topics create public/default/gone"
    c.close()


def test_another_owners_transaction(root: str) -> None:
    alice, bob = pulsartx.Client(root, owner="alice"), pulsartx.Client(root, owner="bob")
    alice.admin.create_topic("t")
    txn = alice.new_transaction()
    alice.create_producer("t").send(b"a", txn=txn)
    stolen = Transaction(bob, bob._coordinators().for_txn(txn.id).get(txn.id, refresh=True))
    with pytest.raises(NotAllowedError) as info:
        stolen.abort()
    assert printed(str(info.value)) == (f"pulsartx --service-url '{root}' transactions abort "
                                        f"{txn.id.most_bits}:{txn.id.least_bits}")
    txn.abort()
    alice.close()
    bob.close()


def test_subscriptions(root: str) -> None:
    c = pulsartx.Client(root, num_coordinators=1)
    c.admin.create_topic("orders", partitions=2)
    with pytest.raises(SubscriptionNotFound) as info:
        c.admin.reset_subscription("orders", "ghost", message_id=MessageId.earliest)
    assert printed(str(info.value)) == f"pulsartx --service-url '{root}' subscriptions list {T}"
    consumer = c.subscribe("orders", "billing")
    with pytest.raises(NotAllowedError) as info:
        c.admin.delete_subscription("orders", "billing")
    assert printed(str(info.value)) == f"pulsartx --service-url '{root}' subscriptions delete {T} billing --force"
    consumer.close()
    c.close()


def test_the_cli_on_a_missing_root(tmp_path: Path) -> None:
    missing = tmp_path / "no such root"
    r = CliRunner().invoke(cli, ["--service-url", str(missing), "topics", "list"])
    assert r.exit_code == 2
    assert printed(r.stderr) == f"pulsartx --service-url '{missing}' topics create TOPIC"


def test_spark_reads(root: str, tmp_path: Path) -> None:
    selection = parse_selection({"topic": "missing"})
    msg = error_of(lambda: selected_topics(StorageRoot.resolve(root), selection))
    assert printed(msg) == f"pulsartx --service-url '{root}' topics create public/default/missing"
    absent = tmp_path / "absent root"
    msg = error_of(lambda: selected_topics(StorageRoot.resolve(str(absent)), selection))
    assert printed(msg) == f"pulsartx --service-url '{absent}' topics create public/default/missing"


def test_spark_writes(root: str) -> None:
    schema = StructType([StructField("value", BinaryType())])
    opts = parse_write_options({"service.url": root, "topic": "missing"})
    msg = error_of(lambda: resolve_targets(opts, schema, overwrite=False))
    assert printed(msg) == f"pulsartx --service-url '{root}' topics create public/default/missing"
    msg = error_of(lambda: resolve_targets(opts, schema, overwrite=True))
    assert printed(msg) == f"pulsartx --service-url '{root}' topics delete public/default/missing"


def test_the_formatter_quotes_the_root_and_prints_no_credential() -> None:
    from pulsartx.storage.cli_command import cli_command

    secret = "wJalrXUtnFEMIfakeSecret"
    assert cli_command(StorageRoot("/data/my root"), "transactions", "abort", "4:2") == (
        "pulsartx --service-url '/data/my root' transactions abort 4:2")
    with_options = StorageRoot("s3://bucket/prefix", {"AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "eu-west-1"})
    assert cli_command(with_options, "topics", "list") == "pulsartx --service-url s3://bucket/prefix topics list"
    in_url = StorageRoot(f"s3://AKIAFAKE:{secret}@bucket/prefix")
    assert cli_command(in_url, "topics", "list") == "pulsartx --service-url 's3://AKIAFAKE:***@bucket/prefix' topics list"
    repeated = StorageRoot(f"s3://bucket/{secret}", {"AWS_SESSION_TOKEN": secret})
    assert cli_command(repeated, "topics", "list") == "pulsartx --service-url 's3://bucket/***' topics list"
    azure = StorageRoot("abfss://container@account.dfs.core.windows.net/prefix")  # a container, not a user
    assert cli_command(azure, "subscriptions", "list", "t x") == (
        "pulsartx --service-url abfss://container@account.dfs.core.windows.net/prefix subscriptions list 't x'")


def _cli_paths(group: click.Group, prefix: str = "") -> list[str]:
    out = []
    for name, cmd in group.commands.items():
        path = f"{prefix}{name}"
        out += _cli_paths(cmd, path + " ") if isinstance(cmd, click.Group) else [path]
    return out


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of the string literals, an f-string as written; docstrings are left out (they
    describe commands, they do not print them)."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr)}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            out.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            out.append((n.lineno, n.value))
    return out


def test_no_message_spells_a_command_itself() -> None:
    """Printed commands all come from one formatter, which adds the root: a literal
    ``pulsartx topics create`` in a message would print a command without it."""
    spelled = re.compile(r"\bpulsartx (?:--\S+ \S+ )*(?:" + "|".join(map(re.escape, _cli_paths(cli))) + r")\b")
    hits = [f"{path.relative_to(REPO)}:{line}: {text}"
            for pkg in ("pulsartx", "datasource", "commit_protocol") for path in sorted((REPO / pkg).rglob("*.py"))
            for line, text in _strings(ast.parse(path.read_text())) if spelled.search(text)]
    assert hits == []
