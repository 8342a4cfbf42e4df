"""A local storage root that does not exist: every CLI command but ``topics create`` refuses it
with one line naming the path and the fix (a read answering "(none)" hid a mistyped
--service-url), and a Spark read says the root, not just the topic, is missing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from pulsartx.cli.main import cli

PULSARTX = Path(sys.executable).parent / "pulsartx"

# One invocation of every command that reads or changes an existing root (all but `topics create`).
COMMANDS = {
    "topics list": ["topics", "list"],
    "topics delete": ["topics", "delete", "orders"],
    "topics stats": ["topics", "stats", "orders"],
    "topics peek": ["topics", "peek", "orders"],
    "topics timeline": ["topics", "timeline", "orders", "--out", "t.svg"],
    "topics update-partitioned-topic": ["topics", "update-partitioned-topic", "orders", "-p", "2"],
    "subscriptions list": ["subscriptions", "list", "orders"],
    "subscriptions reset": ["subscriptions", "reset", "orders", "sub", "--message-id", "earliest"],
    "subscriptions skip": ["subscriptions", "skip", "orders", "sub", "-n", "1"],
    "subscriptions delete": ["subscriptions", "delete", "orders", "sub"],
    "transactions coordinator-stats": ["transactions", "coordinator-stats"],
    "transactions coordinators-list": ["transactions", "coordinators-list"],
    "transactions transaction-metadata": ["transactions", "transaction-metadata", "0:1"],
    "transactions slow-transactions": ["transactions", "slow-transactions", "-t", "0"],
    "transactions buffer-stats": ["transactions", "buffer-stats", "orders"],
    "transactions transaction-in-buffer-stats": ["transactions", "transaction-in-buffer-stats", "0:1", "orders"],
    "transactions pending-ack-stats": ["transactions", "pending-ack-stats", "orders", "sub"],
    "transactions transaction-in-pending-ack-stats": ["transactions", "transaction-in-pending-ack-stats", "0:1",
                                                      "orders", "sub"],
    "transactions list-transaction-keys": ["transactions", "list-transaction-keys"],
    "transactions get-transaction-key": ["transactions", "get-transaction-key", "k"],
    "transactions delete-transaction-key": ["transactions", "delete-transaction-key", "k"],
    "transactions abort": ["transactions", "abort", "0:1"],
    "transactions list": ["transactions", "list"],
    "consume": ["consume", "orders", "-s", "sub", "--idle-timeout", "1s"],
    "coordinator run": ["coordinator", "run"],
    "compact": ["compact"],
    "retention": ["retention", "--max-age-ms", "1"],
}
CREATING = {"topics create", "produce"}  # produce creates a missing topic, as a Pulsar client does


def leaf_commands(group: click.Group, prefix: str = "") -> set[str]:
    out = set()
    for name, cmd in group.commands.items():
        path = f"{prefix}{name}"
        out |= leaf_commands(cmd, path + " ") if isinstance(cmd, click.Group) else {path}
    return out


def missing_message(path: Path, given: str) -> str:
    return (f"error: storage root {path} does not exist ({given}): check --service-url, or create a topic there "
            f"first with `pulsartx --service-url {path} topics create TOPIC`\n")


def test_every_command_is_covered() -> None:
    assert leaf_commands(cli) == set(COMMANDS) | CREATING


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_refuses_a_missing_root(tmp_path: Path, name: str) -> None:
    missing = tmp_path / "no-such-root"
    r = CliRunner().invoke(cli, ["--service-url", str(missing), *COMMANDS[name]])
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", missing_message(missing, f"--service-url {missing}"))
    assert not missing.exists()  # nothing was created on the way


def test_root_from_the_environment_and_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "env-root"
    r = CliRunner().invoke(cli, ["topics", "list"], env={"PULSARTX_SERVICE_URL": str(missing)})
    assert (r.exit_code, r.stderr) == (2, missing_message(missing, f"$PULSARTX_SERVICE_URL={missing}"))
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["topics", "list"], env={"PULSARTX_SERVICE_URL": None})
    assert (r.exit_code, r.stderr) == (2, missing_message(
        tmp_path / "pulsartx-data", "the default root, as neither --service-url nor $PULSARTX_SERVICE_URL is set"))


def test_console_script_relative_root_then_create(tmp_path: Path) -> None:
    """The command as a user types it: a relative path, resolved against the working directory."""
    env = {"PATH": str(PULSARTX.parent), "PULSARTX_SERVICE_URL": ""}
    run = lambda *a: subprocess.run([str(PULSARTX), "--service-url", "./no-such-root", *a],  # noqa: E731
                                    capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    r = run("topics", "list")
    missing = tmp_path / "no-such-root"
    assert (r.returncode, r.stdout, r.stderr) == (2, "", missing_message(missing, "--service-url ./no-such-root"))
    created = run("topics", "create", "orders")
    assert created.returncode == 0, created.stderr
    listed = run("topics", "list")
    assert (listed.returncode, listed.stdout.splitlines()[1:]) == (0, ["persistent://public/default/orders  1"])


def test_an_existing_empty_root_is_fine(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["--service-url", str(tmp_path), "topics", "list"])
    assert (r.exit_code, r.stdout) == (0, "(none)\n")


def test_spark_read_names_the_missing_root(spark: Any, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-root"
    with pytest.raises(Exception) as info:
        spark.read.format("pulsartx").option("service.url", str(missing)).option("topic", "orders").load().collect()
    msg = str(info.value)
    assert (f"option topic: topic persistent://public/default/orders does not exist because the storage root "
            f"{missing} itself does not exist: check the service.url option, or create the topic first with "
            f"`pulsartx --service-url {missing} topics create public/default/orders`") in msg
    assert not missing.exists()
