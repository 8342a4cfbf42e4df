"""``pulsartx subscriptions``: list, reset, skip, delete (after ``pulsar-admin topics subscriptions``,
``reset-cursor``, ``skip`` and ``unsubscribe``)."""
from __future__ import annotations

import datetime as dt
import re

import click

from pulsartx.cli.common import emit, get_client
from pulsartx.log.message_id import MessageId

_MESSAGE_ID = re.compile(r"^\(?\s*(\d+)\s*,\s*(\d+)\s*\)?$")


def parse_message_id(text: str) -> MessageId:
    """``earliest``, ``latest``, or ``(partition,offset)`` (parentheses optional)."""
    low = text.strip().lower()
    if low == "earliest":
        return MessageId.earliest
    if low == "latest":
        return MessageId.latest
    m = _MESSAGE_ID.match(text.strip())
    if not m:
        raise click.BadParameter(f"{text!r}: use earliest, latest or (partition,offset), e.g. \"(0,42)\"",
                                 param_hint="--message-id")
    return MessageId(int(m.group(1)), int(m.group(2)))


def parse_time(text: str) -> int:
    """Epoch milliseconds, or an ISO-8601 date/time (UTC when it names no zone) → epoch milliseconds."""
    s = text.strip()
    if re.fullmatch(r"\d+", s):
        return int(s)
    try:
        t = dt.datetime.fromisoformat(s)
    except ValueError:
        raise click.BadParameter(f"{text!r}: use epoch milliseconds (1735689600000) or ISO-8601 "
                                 "(2025-01-01T00:00:00Z)", param_hint="--time") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)


@click.group()
def subscriptions() -> None:
    """List, reset, skip and delete durable subscriptions."""


@subscriptions.command("list")
@click.argument("topic")
@click.pass_context
def subscriptions_list(ctx: click.Context, topic: str) -> None:
    """List the subscriptions of TOPIC."""
    names = get_client(ctx).admin.list_subscriptions(topic)
    if ctx.find_root().obj["json"]:
        emit(ctx, names)
    else:
        emit(ctx, [{"subscription": n} for n in names], ["subscription"])


@subscriptions.command("reset")
@click.argument("topic")
@click.argument("subscription")
@click.option("--time", "time_", metavar="TIME",
              help="First message published at/after TIME (epoch ms, or ISO-8601; UTC if no zone).")
@click.option("--message-id", metavar="ID", help="earliest, latest, or \"(partition,offset)\": the next message delivered.")
@click.pass_context
def subscriptions_reset(ctx: click.Context, topic: str, subscription: str, time_: str | None,
                        message_id: str | None) -> None:
    """Reset SUBSCRIPTION on TOPIC to a time or a message id (acknowledgements after it are dropped)."""
    if (time_ is None) == (message_id is None):
        raise click.UsageError("give exactly one of --time and --message-id")
    mid = parse_message_id(message_id) if message_id is not None else None
    ts = parse_time(time_) if time_ is not None else None
    rows = get_client(ctx).admin.reset_subscription(topic, subscription, message_id=mid, timestamp_ms=ts)
    emit(ctx, rows, ["partition", "subscription", "position", "markDeletePosition"])


@subscriptions.command("skip")
@click.argument("topic")
@click.argument("subscription")
@click.option("--count", "-n", required=True, type=click.IntRange(min=1),
              help="Messages to skip on every partition.")
@click.pass_context
def subscriptions_skip(ctx: click.Context, topic: str, subscription: str, count: int) -> None:
    """Skip (acknowledge) the next COUNT deliverable messages of SUBSCRIPTION on every partition."""
    rows = get_client(ctx).admin.skip_messages(topic, subscription, count)
    emit(ctx, rows, ["partition", "subscription", "skipped", "markDeletePosition"])


@subscriptions.command("delete")
@click.argument("topic")
@click.argument("subscription")
@click.option("--force", "-f", is_flag=True, help="Delete even while consumers hold live leases.")
@click.pass_context
def subscriptions_delete(ctx: click.Context, topic: str, subscription: str, force: bool) -> None:
    """Delete SUBSCRIPTION from TOPIC (cursor, acknowledgements and pending acks)."""
    emit(ctx, get_client(ctx).admin.delete_subscription(topic, subscription, force=force))
