"""The ``pulsartx`` command (after ``pulsar-admin``). Every command takes ``--service-url`` and
``--storage-option KEY=VALUE``; output is a table, or JSON with ``--json``."""
from __future__ import annotations

import json
import sys
from typing import Any

import click

from pulsartx.exceptions import PulsarException


def _parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise click.BadParameter(f"{p!r}: use KEY=VALUE", param_hint="--storage-option")
        k, v = p.split("=", 1)
        out[k] = v
    return out


def _client(ctx: click.Context):
    from pulsartx import Client

    obj = ctx.find_root().obj
    return Client(obj["service_url"], obj["storage_options"])


def emit(ctx: click.Context, rows: list[dict[str, Any]] | dict[str, Any], columns: list[str] | None = None) -> None:
    """Print rows as a table, or as JSON with --json: one rendering path for every command."""
    if ctx.find_root().obj["json"]:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    if isinstance(rows, dict):
        rows = [{"key": k, "value": v} for k, v in rows.items()]
    if not rows:
        click.echo("(none)")
        return
    cols = columns or list(rows[0].keys())
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    click.echo("  ".join(c.upper().ljust(widths[c]) for c in cols))
    for r in rows:
        click.echo("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols))


@click.group()
@click.option("--service-url", envvar="PULSARTX_SERVICE_URL", default=None, help="Storage root (path, file://, s3://).")
@click.option("--storage-option", "storage_option", multiple=True, help="KEY=VALUE passed to deltalake and fsspec.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.pass_context
def cli(ctx: click.Context, service_url: str | None, storage_option: tuple[str, ...], as_json: bool) -> None:
    """pulsartx: transactional messaging on Delta tables."""
    ctx.obj = {"service_url": service_url, "storage_options": _parse_options(storage_option), "json": as_json}


@cli.group()
def topics() -> None:
    """Create, delete and list topics."""


@topics.command("create")
@click.argument("topic")
@click.option("--partitions", "-p", default=1, show_default=True, type=int)
@click.pass_context
def topics_create(ctx: click.Context, topic: str, partitions: int) -> None:
    t = _client(ctx).admin.create_topic(topic, partitions=partitions)
    emit(ctx, {"topic": str(t), "partitions": partitions})


@topics.command("delete")
@click.argument("topic")
@click.pass_context
def topics_delete(ctx: click.Context, topic: str) -> None:
    _client(ctx).admin.delete_topic(topic)
    emit(ctx, {"deleted": topic})


@topics.command("list")
@click.argument("namespace", required=False)
@click.pass_context
def topics_list(ctx: click.Context, namespace: str | None) -> None:
    admin = _client(ctx).admin
    emit(ctx, [{"topic": t, "partitions": admin.get_partitions(t)} for t in admin.list_topics(namespace)])


def main() -> None:
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except PulsarException as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
