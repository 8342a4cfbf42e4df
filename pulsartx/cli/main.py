"""The ``pulsartx`` command (after ``pulsar-admin``). Every command takes ``--service-url`` and
``--storage-option KEY=VALUE``; output is a table, or JSON with ``--json``.

Command groups live in their own modules (``topics``, ``subscriptions``, ``transactions``, ``ops``
for the operational ones, ``produce`` and ``consume`` after ``pulsar-client``); shared helpers in
``common``.
"""
from __future__ import annotations

import sys

import click

from pulsartx.cli.common import RootGroup, emit, parse_options
from pulsartx.cli.consume import consume
from pulsartx.cli.ops import compact, coordinator, retention
from pulsartx.cli.produce import produce
from pulsartx.cli.subscriptions import subscriptions
from pulsartx.cli.topics import topics
from pulsartx.cli.transactions import transactions
from pulsartx.exceptions import PulsarException
from pulsartx.version import installed_version

__all__ = ["cli", "emit", "main"]


@click.group(cls=RootGroup)
@click.version_option(installed_version(), "--version", prog_name="pulsartx", message="%(prog)s %(version)s",
                      help="Print the installed pulsartx version and exit.")
@click.option("--service-url", envvar="PULSARTX_SERVICE_URL", default=None,
              help="Storage root (path, file://, s3://bucket/prefix); else $PULSARTX_SERVICE_URL, else ./pulsartx-data.")
@click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
              help="Storage option passed to deltalake, fsspec and pyarrow (repeatable), e.g. AWS_ENDPOINT_URL=...")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.pass_context
def cli(ctx: click.Context, service_url: str | None, storage_option: tuple[str, ...], as_json: bool) -> None:
    """pulsartx: transactional messaging on Delta tables."""
    ctx.obj = {"service_url": service_url, "storage_options": parse_options(storage_option), "json": as_json}


cli.add_command(topics)
cli.add_command(subscriptions)
cli.add_command(transactions)
cli.add_command(coordinator)
cli.add_command(compact)
cli.add_command(retention)
cli.add_command(produce)
cli.add_command(consume)


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
