"""``--txn`` for ``produce`` and ``consume``: the whole command in one transaction, committed when
it ends and aborted if it fails, so a half-done run leaves nothing visible or acknowledged."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from pulsartx.cli.common import Duration

DEFAULT_TXN_TIMEOUT_MS = 60_000


def txn_options(f: Any) -> Any:
    """The two options every command that can run in a transaction takes."""
    f = click.option("--txn-timeout", "txn_timeout_ms", type=Duration(), default=DEFAULT_TXN_TIMEOUT_MS,
                     show_default="1m", help="With --txn: abort the transaction if still open after this long.")(f)
    return click.option("--txn", "use_txn", is_flag=True,
                        help="Run in one transaction, committed at the end (aborted on an error).")(f)


@contextmanager
def transaction_scope(client: Any, use_txn: bool, timeout_ms: int) -> Iterator[Any]:
    """Yields the transaction (None without ``--txn``); commits on a normal exit, aborts otherwise."""
    if not use_txn:
        yield None
        return
    txn = client.new_transaction(timeout_ms=timeout_ms)
    try:
        yield txn
    except BaseException:
        txn.abort()
        raise
    txn.commit()


def txn_suffix(txn: Any) -> str:
    return "" if txn is None else f" in transaction {txn.id}, committed"
