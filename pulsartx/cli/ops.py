"""Operational commands: ``coordinator run``, ``compact`` and ``retention``."""
from __future__ import annotations

import logging
from functools import partial

import click

from pulsartx.cli.common import PulsarTxError, emit, get_client
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.maintenance.compaction import compact_partition
from pulsartx.maintenance.retention import apply_retention, vacuum
from pulsartx.metrics import start_metrics_server
from pulsartx.observe.listings import unless_deleted
from pulsartx.service import CoordinatorService


def _partitions(client, topic: str | None):
    """TOPIC's partitions, or every topic's: one deleted by another process since it was listed is
    left out (a TOPIC named that does not exist is still an error)."""
    if topic:
        return client.admin.partitions_of(topic)
    out = []
    admin = client.admin
    for t in admin.list_topics():
        out.extend(unless_deleted(admin, t, partial(admin.partitions_of, t)) or ())
    return out


@click.group()
def coordinator() -> None:
    """The transaction coordinator service."""

@coordinator.command("run")
@click.option("--sweep-interval-ms", default=1000, show_default=True, type=click.IntRange(min=0))
@click.option("--metrics-port", default=None, type=click.IntRange(0, 65535), help="Serve Prometheus metrics on this port.")
@click.option("--compact-every", default=0, show_default=True, type=click.IntRange(min=0),
              help="Compact every N passes (0: never).")
@click.option("--grace-ms", default=None, type=click.IntRange(min=0), help=f"Finish COMMITTING/ABORTING left this long (default: {CoordinatorConfig.recovery_grace_ms} ms).")
@click.pass_context
def coordinator_run(ctx: click.Context, sweep_interval_ms: int, metrics_port: int | None, compact_every: int,
                    grace_ms: int | None) -> None:
    """Sweep timeouts, finish abandoned transactions, snapshot buffers; stops cleanly on SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    client = get_client(ctx)
    if metrics_port is not None:
        try:
            start_metrics_server(metrics_port, client)
        except OSError as e:  # not the storage root's fault, which is what the CLI says of other OSErrors
            raise PulsarTxError(f"cannot serve metrics on port {metrics_port}: {e.strerror or e}; pick a free "
                                "port with --metrics-port") from e
        click.echo(f"metrics on :{metrics_port}/metrics", err=True)
    stats = CoordinatorService(client, sweep_interval_ms / 1000.0, compact_every, grace_ms).run()
    emit(ctx, {"passes": stats.passes, "timed_out": stats.timed_out, "completed": stats.completed,
               "failed": stats.failed})


@click.command()
@click.argument("topic", required=False)
@click.pass_context
def compact(ctx: click.Context, topic: str | None) -> None:
    """Drop aborted and excluded messages from old files (offsets kept); all topics by default."""
    client = get_client(ctx)
    parts = _partitions(client, topic)
    rows = []
    with click.progressbar(parts, label="compacting", file=click.get_text_stream("stderr")) as bar:
        for p in bar:
            rows.append(compact_partition(client.root, p).as_dict())
    emit(ctx, rows, ["partition", "files_before", "files_after", "rows_dropped", "bytes_before", "skipped"])


@click.command()
@click.argument("topic", required=False)
@click.option("--max-age-ms", type=click.IntRange(min=0), default=None)
@click.option("--max-bytes", type=click.IntRange(min=0), default=None)
@click.option("--force", is_flag=True, help="Delete past the slowest subscription too.")
@click.option("--vacuum-retention-hours", type=click.FloatRange(min=0), default=1.0, show_default=True)
@click.pass_context
def retention(ctx: click.Context, topic: str | None, max_age_ms: int | None, max_bytes: int | None, force: bool,
              vacuum_retention_hours: float) -> None:
    """Delete old files by age or size (never past the slowest subscription unless --force), then vacuum."""
    if max_age_ms is None and max_bytes is None:
        raise click.UsageError("give --max-age-ms and/or --max-bytes")
    client = get_client(ctx)
    rows = []
    with click.progressbar(_partitions(client, topic), label="retention", file=click.get_text_stream("stderr")) as bar:
        for p in bar:
            r = apply_retention(client.root, p, max_age_ms, max_bytes, force).as_dict()
            r["vacuumed"] = vacuum(client.root, p, vacuum_retention_hours)
            rows.append(r)
    emit(ctx, rows, ["partition", "files_deleted", "bytes_deleted", "new_start_offset", "held_by_subscription",
                     "vacuumed"])
