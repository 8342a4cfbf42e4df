"""``pulsartx consume``: after ``pulsar-client consume``. Every message printed is acknowledged,
so a second run continues where the first stopped."""
from __future__ import annotations

from typing import Any

import click

from pulsartx.cli.common import Duration, emit, get_client, json_mode
from pulsartx.cli.topics import message_dict
from pulsartx.cli.txn_scope import transaction_scope, txn_options, txn_suffix
from pulsartx.client.consumer_state import ConsumerType, InitialPosition
from pulsartx.exceptions import Timeout

# pulsar-client spells it Key_Shared; the Python client's enum KeyShared: both are taken.
CONSUMER_TYPES = {"exclusive": ConsumerType.Exclusive, "shared": ConsumerType.Shared,
                  "failover": ConsumerType.Failover, "key_shared": ConsumerType.KeyShared,
                  "keyshared": ConsumerType.KeyShared}
SEPARATOR = "----- got message -----"


def describe(m: Any) -> str:
    """One message as pulsar-client prints it: ``key:[k], properties:[a=b], content:...``."""
    d = message_dict(m)
    props = f"properties:[{','.join(f'{k}={v}' for k, v in d['properties'].items())}], " if d["properties"] else ""
    content = d["value"] if d["encoding"] == "utf-8" else "base64:" + d["value"]
    return f"key:[{'null' if d['key'] is None else d['key']}], {props}content:{content}"


@click.command("consume")
@click.argument("topic")
@click.option("--subscription-name", "-s", "subscription", required=True, help="The subscription to consume on.")
@click.option("--num-messages", "-n", default=1, show_default=True, type=click.IntRange(min=0),
              help="How many messages to consume; 0: until interrupted (or --idle-timeout).")
@click.option("--subscription-type", "-t", "subscription_type", default="Exclusive", show_default=True,
              type=click.Choice(["Exclusive", "Shared", "Failover", "Key_Shared", "KeyShared"], case_sensitive=False))
@click.option("--subscription-position", "-p", "position", default="Latest", show_default=True,
              type=click.Choice(["Latest", "Earliest"], case_sensitive=False),
              help="Where a new subscription starts.")
@click.option("--idle-timeout", "idle_timeout_ms", type=Duration(), default=None,
              help="Stop once no message has arrived for this long (500ms, 1s, 2m); default: keep waiting.")
@txn_options
@click.pass_context
def consume(ctx: click.Context, topic: str, subscription: str, num_messages: int, subscription_type: str,
            position: str, idle_timeout_ms: int | None, use_txn: bool, txn_timeout_ms: int) -> None:
    """Receive messages from TOPIC on a subscription, print and acknowledge them."""
    as_json = json_mode(ctx)
    got: list[Any] = []
    # Closing the client writes the acknowledgements (and the commit's) before the run ends.
    with get_client(ctx) as client, transaction_scope(client, use_txn, txn_timeout_ms) as txn:
        consumer = client.subscribe(topic, subscription, consumer_type=CONSUMER_TYPES[subscription_type.lower()],
                                    initial_position=InitialPosition[position.capitalize()])
        try:
            while num_messages == 0 or len(got) < num_messages:
                try:
                    m = consumer.receive(idle_timeout_ms)
                except (Timeout, KeyboardInterrupt):  # idle long enough, or Ctrl-C: a normal end
                    break
                got.append(m)
                if not as_json:
                    click.echo(SEPARATOR)
                    click.echo(describe(m))
                    consumer.acknowledge(m, txn=txn)
            if as_json:
                emit(ctx, [message_dict(m) for m in got])
                if got:
                    consumer.acknowledge(got, txn=txn)
        finally:
            consumer.close()
    if not as_json:
        click.echo(f"{len(got)} messages successfully consumed{txn_suffix(txn)}", err=True)
