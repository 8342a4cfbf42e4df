"""``pulsartx topics``: create, grow, delete, list, stats, peek (after ``pulsar-admin topics``)."""
from __future__ import annotations

import base64
import datetime as dt
from functools import partial
from pathlib import Path
from typing import Any

import click

from pulsartx.cli.common import PulsarTxError, emit, emit_tables, get_client
from pulsartx.naming import TopicName
from pulsartx.observe.listings import unless_deleted
from pulsartx.observe.render import FORMATS, write
from pulsartx.observe.timeline import DEFAULT_LAST, partition_timeline


@click.group()
def topics() -> None:
    """Create, delete, list, inspect and peek at topics."""


@topics.command("create")
@click.argument("topic")
@click.option("--partitions", "-p", default=1, show_default=True, type=int, help="Number of partitions.")
@click.pass_context
def topics_create(ctx: click.Context, topic: str, partitions: int) -> None:
    """Create TOPIC with its partitions."""
    t = get_client(ctx, creates=True).admin.create_topic(topic, partitions=partitions)
    emit(ctx, {"topic": str(t), "partitions": partitions})


@topics.command("update-partitioned-topic")
@click.argument("topic")
@click.option("--partitions", "-p", required=True, type=int, help="The new number of partitions (more than now).")
@click.pass_context
def topics_update_partitioned_topic(ctx: click.Context, topic: str, partitions: int) -> None:
    """Grow TOPIC to PARTITIONS partitions; the count only increases. Keys route to other
    partitions afterwards (hash modulo the new count)."""
    n = get_client(ctx).admin.update_partitioned_topic(topic, partitions)
    emit(ctx, {"topic": str(TopicName.parse(topic)), "partitions": n})


@topics.command("delete")
@click.argument("topic")
@click.pass_context
def topics_delete(ctx: click.Context, topic: str) -> None:
    """Delete TOPIC, all its partitions' data and its subscriptions."""
    get_client(ctx).admin.delete_topic(topic)
    emit(ctx, {"deleted": topic})


@topics.command("list")
@click.argument("namespace", required=False)
@click.pass_context
def topics_list(ctx: click.Context, namespace: str | None) -> None:
    """List topics, optionally of one NAMESPACE (tenant/namespace)."""
    admin = get_client(ctx).admin
    rows = []
    for t in admin.list_topics(namespace):
        n = unless_deleted(admin, t, partial(admin.get_partitions, t))
        if n is not None:  # else deleted by another process since it was listed
            rows.append({"topic": t, "partitions": n})
    emit(ctx, rows, ["topic", "partitions"])


PARTITION_COLUMNS = ["partition", "messages", "markers", "fileCount", "bytes", "startOffset", "endOffset",
                     "maxReadPosition", "msgRateIn", "msgRateOut"]
TRANSACTION_COLUMNS = ["partition", "ongoingTxnCount", "abortedTxnCount", "blockingTxn", "status", "owner", "ageMs",
                       "timeoutMs", "heldEntries"]
PRODUCER_COLUMNS = ["partition", "producerName", "lastSequenceId", "lastPublishTime"]
SUBSCRIPTION_COLUMNS = ["partition", "subscription", "type", "consumers", "markDeletePosition", "backlog",
                        "unackedMessages", "pendingAckCount", "msgRateOut"]


def _index(partition: str) -> int:
    return int(partition.rsplit("-partition-", 1)[1])


@topics.command("stats")
@click.argument("topic")
@click.pass_context
def topics_stats(ctx: click.Context, topic: str) -> None:
    """Per partition: messages and markers, files, offsets, maxReadPosition and the transaction
    holding it back, producers, rates (last 60 s), subscriptions.

    A partition that cannot be read is a row with an ERROR column; the others are printed as
    usual, then the command fails naming it (exit code 2), so a script sees the damage."""
    stats = get_client(ctx).admin.topic_stats(topic)
    parts = [{**{k: s[k] for k in PARTITION_COLUMNS}, "partition": _index(s["partition"]),
              **({"error": s["error"]} if "error" in s else {})} for s in stats]  # a partition not read
    txns = [{"partition": _index(s["partition"]), "ongoingTxnCount": s["ongoingTxnCount"],
             "abortedTxnCount": s["abortedTxnCount"],
             **({} if s["blockingTxn"] is None else {**s["blockingTxn"], "blockingTxn": s["blockingTxn"]["txnId"]}),
             # its TC could not be asked: shown in the table's error column
             **({} if s["blockingTxn"] is None or "tcError" not in s["blockingTxn"] else
                {"error": s["blockingTxn"]["tcError"]})}
            for s in stats]
    producers = [{**pr, "partition": _index(s["partition"]),
                  "lastPublishTime": None if pr["lastPublishTime"] is None else iso_ms(pr["lastPublishTime"])}
                 for s in stats for pr in s["producers"]]
    subs = [{"partition": _index(s["partition"]), "subscription": name, **sub,
             "consumers": [c["name"] for c in sub["consumers"]]}
            for s in stats for name, sub in s["subscriptions"].items()]
    emit_tables(ctx, stats, [(None, parts, PARTITION_COLUMNS), ("Transactions:", txns, TRANSACTION_COLUMNS),
                             ("Producers:", producers, PRODUCER_COLUMNS), ("Subscriptions:", subs, SUBSCRIPTION_COLUMNS)])
    bad = [s for s in stats if "error" in s]
    if bad:
        raise PulsarTxError(f"{len(bad)} of {len(stats)} partitions of {topic} cannot be read (the others' stats are "
                            "above): " + "; ".join(f"{s['partition']}: {s['error']}" for s in bad))


@topics.command("timeline")
@click.argument("topic")
@click.option("--partition", "-p", type=click.IntRange(min=0), default=None,
              help="Partition index (default: the one TOPIC names, else 0).")
@click.option("--last", "-k", "last", type=click.IntRange(min=1), default=DEFAULT_LAST, show_default=True,
              help="How many of the partition's last entries to draw.")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False),
              help="File to write: FILE.svg, or FILE.html (the picture and a table of its transactions).")
@click.pass_context
def topics_timeline(ctx: click.Context, topic: str, partition: int | None, last: int, out: str) -> None:
    """Draw a partition's recent history: entries, each transaction's span coloured by outcome,
    markers, maxReadPosition, the end, and the open transaction holding maxReadPosition back."""
    if Path(out).suffix.lower() not in FORMATS:
        raise click.BadParameter(f"{out!r}: use a file name ending in .svg or .html", param_hint="--out")
    client = get_client(ctx)
    t = TopicName.parse(topic)
    if partition is not None:
        if t.partition is not None and t.partition != partition:
            raise click.BadParameter(f"{partition} but TOPIC names partition {t.partition}: give one of them",
                                     param_hint="--partition")
        t = t.base.with_partition(partition)
    elif t.partition is None:
        t = t.with_partition(0)
    client.admin.get_partitions(str(t))  # TopicNotFound names the topic, or the partitions it has
    timeline = partition_timeline(client.root, t, client._coordinators, last=last)
    written = write(timeline, out)
    emit(ctx, {"out": str(written), **timeline.as_dict()})


def message_dict(m: Any) -> dict[str, Any]:
    """A Message as JSON-able data: the value as UTF-8 text when it is, else base64 (``encoding``)."""
    data = m.data()
    try:
        value, encoding = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        value, encoding = base64.b64encode(data).decode("ascii"), "base64"
    mid = m.message_id()
    return {"messageId": str(mid), "partition": mid.partition(), "offset": mid.offset(), "key": m.partition_key(),
            "properties": m.properties(), "publishTime": m.publish_timestamp(),
            "eventTime": m.event_timestamp() or None,
            "txnId": None if m.txn_id is None else "({},{})".format(*m.txn_id),
            "size": len(data), "value": value, "encoding": encoding}


def iso_ms(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@topics.command("peek")
@click.argument("topic")
@click.option("--count", "-n", default=10, show_default=True, type=click.IntRange(min=0),
              help="How many messages to show.")
@click.option("--isolation-level", default="READ_COMMITTED", show_default=True,
              type=click.Choice(["READ_COMMITTED", "READ_UNCOMMITTED"], case_sensitive=False))
@click.pass_context
def topics_peek(ctx: click.Context, topic: str, count: int, isolation_level: str) -> None:
    """Show the first messages of TOPIC a reader sees from the earliest position (no subscription)."""
    msgs = [message_dict(m) for m in get_client(ctx).admin.peek(topic, count, isolation_level.upper())]
    if ctx.find_root().obj["json"]:
        emit(ctx, msgs)
        return
    emit(ctx, [{**m, "publishTime": iso_ms(m["publishTime"]),
                "value": m["value"] if m["encoding"] == "utf-8" else "base64:" + m["value"]} for m in msgs],
         ["messageId", "key", "publishTime", "txnId", "properties", "value"])
