"""``pulsartx transactions``: after ``pulsar-admin transactions``, plus transaction keys and the
admin abort."""
from __future__ import annotations

import click

from pulsartx.cli.common import Duration, emit, get_client
from pulsartx.coordinator.state import TxnStatus

COORDINATOR_COLUMNS = ["coordinator_id", "state", "active_txns", "last_txn_id", "txn_ids_reserved", "lease_owner",
                       "lease_expires_ms", "log", "transaction_keys"]
META_COLUMNS = ["txn_id", "status", "open_duration_ms", "timeout_ms", "partitions", "subscriptions", "owner",
                "transaction_key", "epoch"]


@click.group()
def transactions() -> None:
    """Inspect transaction coordinators, buffers and pending acks; manage transaction keys; abort."""


@transactions.command("coordinator-stats")
@click.pass_context
def coordinator_stats(ctx: click.Context) -> None:
    """Per TC: open, committing and aborting transactions, the TxnID counter and the log size."""
    emit(ctx, get_client(ctx).admin.transactions.get_coordinator_stats())


@transactions.command("coordinators-list")
@click.pass_context
def coordinators_list(ctx: click.Context) -> None:
    """Every TC: its log and transaction-key tables, active transactions, the last TxnID."""
    emit(ctx, get_client(ctx).admin.transactions.list_coordinators(), COORDINATOR_COLUMNS)


@transactions.command("transaction-metadata")
@click.argument("txn_id")
@click.pass_context
def transaction_metadata(ctx: click.Context, txn_id: str) -> None:
    """Everything the TC log holds about TXN_ID (15:0, 15,0 or "(15,0)").

    open_duration_ms runs while the transaction is unfinished (OPEN, COMMITTING or ABORTING) and is
    fixed once it has ended: from its begin to its COMMITTED/ABORTED entry."""
    emit(ctx, get_client(ctx).admin.transactions.get_transaction_metadata(txn_id))


STATUSES = [s.value for s in TxnStatus]


@transactions.command("list")
@click.option("--status", "statuses", multiple=True, type=click.Choice(STATUSES, case_sensitive=False),
              help="Only transactions in this status (repeatable). Default: OPEN, COMMITTING and ABORTING.")
@click.option("--older-than", "older_than_ms", type=Duration(), default=0,
              help="Only transactions begun at least this long ago: milliseconds, or 500ms, 1s, 2m, 1h.")
@click.pass_context
def transactions_list(ctx: click.Context, statuses: tuple[str, ...], older_than_ms: int) -> None:
    """Every transaction not yet committed or aborted, on every TC: what is open now.

    COMMITTED and ABORTED ones show only when asked for with --status, and only while their TC log
    still holds them."""
    emit(ctx, get_client(ctx).admin.transactions.list_transactions(statuses or None, older_than_ms), META_COLUMNS)


@transactions.command("slow-transactions")
@click.option("--timeout-ms", "-t", required=True, type=Duration(),
              help="List transactions still unfinished after this long: milliseconds, or 500ms, 1s, 2m, 1h.")
@click.pass_context
def slow_transactions(ctx: click.Context, timeout_ms: int) -> None:
    """Transactions open (or still committing/aborting) for longer than --timeout-ms."""
    emit(ctx, get_client(ctx).admin.transactions.get_slow_transactions(timeout_ms), META_COLUMNS)


@transactions.command("buffer-stats")
@click.argument("topic")
@click.pass_context
def buffer_stats(ctx: click.Context, topic: str) -> None:
    """Per partition of TOPIC: maxReadPosition, ongoing and aborted transactions, last snapshot."""
    emit(ctx, get_client(ctx).admin.transactions.get_transaction_buffer_stats(topic))


@transactions.command("transaction-in-buffer-stats")
@click.argument("txn_id")
@click.argument("topic")
@click.pass_context
def transaction_in_buffer_stats(ctx: click.Context, txn_id: str, topic: str) -> None:
    """Where TXN_ID stands in each partition of TOPIC: ONGOING, COMMITTED, ABORTED or NONE."""
    emit(ctx, get_client(ctx).admin.transactions.get_transaction_in_buffer_stats(txn_id, topic))


PENDING_ACK_COLUMNS = ["partition", "subscription", "state", "markDeletePosition", "individuallyAckedRanges",
                       "pendingAckCount", "ongoingTxnCount", "transactions", "pendingCumulativeAck"]


@transactions.command("pending-ack-stats")
@click.argument("topic")
@click.argument("subscription")
@click.pass_context
def pending_ack_stats(ctx: click.Context, topic: str, subscription: str) -> None:
    """Per partition: SUBSCRIPTION's cursor and what is in PENDING_ACK, by transaction."""
    emit(ctx, get_client(ctx).admin.transactions.get_pending_ack_stats(topic, subscription), PENDING_ACK_COLUMNS)


@transactions.command("transaction-in-pending-ack-stats")
@click.argument("txn_id")
@click.argument("topic")
@click.argument("subscription")
@click.pass_context
def transaction_in_pending_ack_stats(ctx: click.Context, txn_id: str, topic: str, subscription: str) -> None:
    """Per partition: the offsets TXN_ID holds in PENDING_ACK on SUBSCRIPTION."""
    emit(ctx, get_client(ctx).admin.transactions.get_transaction_in_pending_ack_stats(txn_id, topic, subscription))


@transactions.command("list-transaction-keys")
@click.pass_context
def list_transaction_keys(ctx: click.Context) -> None:
    """Every transaction key: owner, epoch, its transactions, age."""
    emit(ctx, get_client(ctx).admin.transactions.list_transaction_keys(),
         ["coordinator_id", "owner", "transaction_key", "epoch", "txn_ids", "claimed_ms", "age_ms"])


@transactions.command("get-transaction-key")
@click.argument("key")
@click.option("--owner", default=None, help="The key's owner (none by default).")
@click.pass_context
def get_transaction_key(ctx: click.Context, key: str, owner: str | None) -> None:
    """One transaction key: epoch, transactions, age."""
    emit(ctx, get_client(ctx).admin.transactions.get_transaction_key(key, owner))


@transactions.command("delete-transaction-key")
@click.argument("key")
@click.option("--owner", default=None, help="The key's owner (none by default).")
@click.pass_context
def delete_transaction_key(ctx: click.Context, key: str, owner: str | None) -> None:
    """Delete a transaction key and abort its open transactions."""
    aborted = get_client(ctx).admin.transactions.delete_transaction_key(key, owner)
    emit(ctx, {"transaction_key": key, "owner": owner, "aborted": aborted})


@transactions.command("abort")
@click.argument("txn_id")
@click.pass_context
def abort(ctx: click.Context, txn_id: str) -> None:
    """Admin override: abort TXN_ID whatever its owner (logged with reason "admin abort")."""
    emit(ctx, get_client(ctx).admin.transactions.abort_transaction(txn_id))
