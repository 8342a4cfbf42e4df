"""``pulsartx produce``: after ``pulsar-client produce``, to try a topic from the shell."""
from __future__ import annotations

from typing import Any

import click

from pulsartx.cli.common import emit, get_client, json_mode, parse_pairs
from pulsartx.cli.txn_scope import transaction_scope, txn_options, txn_suffix


def split_messages(messages: tuple[str, ...], separator: str) -> list[str]:
    """Each ``-m`` split on the separator, as pulsar-client does (``-m a,b`` sends two messages)."""
    return [part for m in messages for part in (m.split(separator) if separator else [m])]




def send_all(producer: Any, bodies: list[str], properties: dict[str, str], key: str | None, txn: Any) -> list[Any]:
    """Send asynchronously, in batches, and wait for all: one commit per batch rather than per
    message, as pulsar-client batches. ``flush`` raises the first failure."""
    ids: list[Any] = [None] * len(bodies)

    def done(i: int) -> Any:
        return lambda _result, message_id: ids.__setitem__(i, message_id)

    for i, b in enumerate(bodies):
        producer.send_async(b.encode(), done(i), properties=properties or None, partition_key=key, txn=txn)
    producer.flush()
    return ids


@click.command("produce")
@click.argument("topic")
@click.option("--messages", "-m", multiple=True, required=True,
              help="Messages to send (repeatable; each is split on the separator).")
@click.option("--num-produce", "-n", default=1, show_default=True, type=click.IntRange(min=1),
              help="How many times to send the messages.")
@click.option("--key", "-k", default=None, help="Partitioning key of every message.")
@click.option("--properties", "-p", multiple=True, metavar="KEY=VALUE", help="Message property (repeatable).")
@click.option("--separator", "-s", default=",", show_default=True,
              help="Splits each -m into several messages; '' sends each -m whole.")
@txn_options
@click.pass_context
def produce(ctx: click.Context, topic: str, messages: tuple[str, ...], num_produce: int, key: str | None,
            properties: tuple[str, ...], separator: str, use_txn: bool, txn_timeout_ms: int) -> None:
    """Send messages to TOPIC (created if it does not exist, as a producer does)."""
    props = parse_pairs(properties, "--properties")
    bodies = split_messages(messages, separator) * num_produce
    ids: list[Any] = []
    # Closing the client waits for the commit's markers: the run ends with its messages readable.
    with get_client(ctx, creates=True) as client, transaction_scope(client, use_txn, txn_timeout_ms) as txn:
        producer = client.create_producer(topic)
        try:
            ids = send_all(producer, bodies, props, key, txn)
        finally:
            producer.close()
    if json_mode(ctx):
        emit(ctx, {"topic": topic, "produced": len(ids), "messageIds": [str(i) for i in ids],
                   "txnId": None if txn is None else str(txn.id)})
        return
    click.echo(f"{len(ids)} messages successfully produced{txn_suffix(txn)}")
