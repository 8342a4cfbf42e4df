"""A consumer's Arrow side: ``receive_table`` and ``acknowledge_table``.

A table is the messages ``batch_receive`` would hand out, as rows of the topic's read schema
(:mod:`pulsartx.log.rows`, the schema ``spark.read.format("pulsartx")`` returns). They go through
the same dispatch as ``receive`` (READ_COMMITTED, pending acks, claims, Key_Shared, dead letters,
redelivery), and are acknowledged through the same cursor changes as ``acknowledge``, so a table
means what its messages would. What a table saves is the Python work per message: its rows are
sliced out of the columns of the fetch that read them, and its acknowledgements are offset ranges.
"""
from __future__ import annotations

import itertools
import logging
import time
from operator import attrgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pulsartx.client.consumer_state import CLAIMING, ConsumerCore, PartitionState
from pulsartx.client.message import Message, Records
from pulsartx.exceptions import InvalidConfiguration, PulsarException
from pulsartx.log.rows import ROW_SCHEMA, parse_message_ids, rows_from_records
from pulsartx.naming import names_topic
from pulsartx.subscription.cursor import CursorState

log = logging.getLogger("pulsartx.client.consumer")
# The most rows one fetch of receive_table reads from a partition. Its rows go to the caller, not to
# the receiver queue, so it is sized by what the call takes: each fetch costs a cursor read and a
# transaction-buffer refresh besides its files, and a 10,000-row table read in one fetch took less
# than half the time of ten 1,000-row fetches (local disk, other processes busy).
TABLE_FETCH_MAX = 10_000
POSITION_COLUMNS = ("__partition", "__offset")


def as_table(table: Any, method: str) -> pa.Table:
    """``table`` as a pyarrow Table: a Table, a RecordBatch, or anything exporting an Arrow stream
    (``__arrow_c_stream__``: a Polars or pandas-on-Arrow DataFrame, a DuckDB relation)."""
    if isinstance(table, pa.Table):
        return table
    if isinstance(table, pa.RecordBatch):
        return pa.Table.from_batches([table])
    if hasattr(table, "__arrow_c_stream__"):
        return pa.table(table)
    raise InvalidConfiguration(f"{method} takes a pyarrow.Table (or a RecordBatch, or a DataFrame exporting Arrow, "
                               f"such as a Polars one), got {type(table).__name__}: convert it first, e.g. "
                               "pyarrow.table(data)")


class TableConsumer(ConsumerCore):
    def receive_table(self, max_messages: int = 1000, timeout_millis: int | None = 100) -> pa.Table:
        """The messages available within ``timeout_millis`` (at most ``max_messages``) as one
        ``pyarrow.Table`` of the topic's read schema: ``value``, ``__key``, ``__topic``,
        ``__partition``, ``__offset``, ``__messageId``, ``__publishTime``, ``__eventTime``,
        ``__messageProperties`` (as ``spark.read.format("pulsartx")`` returns them).

        Like ``batch_receive``, it returns as soon as it has messages and no more are at hand, and
        an empty table (0 rows, same schema) when none came in time, where ``receive`` raises
        Timeout; ``timeout_millis=None`` waits for the first message. Rows are grouped by
        partition, each partition's in offset order. The messages are held by this consumer until
        acknowledged (``acknowledge_table``), negatively acknowledged or redelivered, as received
        messages are. ``__topic`` is the topic's name without a partition suffix (``__partition``
        says which), as in Spark reads."""
        self._check_open()
        if not isinstance(max_messages, int) or isinstance(max_messages, bool) or max_messages < 1:
            raise InvalidConfiguration(f"max_messages={max_messages!r}: must be a positive integer")
        if timeout_millis is not None and (not isinstance(timeout_millis, int) or timeout_millis < 0):
            raise InvalidConfiguration(f"timeout_millis={timeout_millis!r}: must be an integer >= 0, or None to "
                                       "wait for the first message")
        deadline = float("inf") if timeout_millis is None else time.monotonic() + timeout_millis / 1000.0
        queued: list[Message] = []  # taken off the queues (fetched by an earlier call or receive())
        fetched: list[tuple[Records, list[int]]] = []  # rows taken straight from this call's fetches
        count = 0
        while count < max_messages:
            taken = self._take_queued(max_messages - count)
            if taken:
                queued += taken
                count += len(taken)
                continue
            try:
                got, passed = self._fetch_rows(max_messages - count)
            except PulsarException as e:
                if not count:
                    raise
                # What was taken is held for this caller: returned, not dropped (as batch_receive).
                log.info("receive_table on %s returns %d message(s); fetching more failed: %s", self._topic,
                         count, e)
                break
            if got:
                fetched += got
                count += sum(len(rows) for _, rows in got)
                continue
            if passed and time.monotonic() < deadline:
                # Offsets passed (aborted data, markers) are held locally as acks: the next fetch
                # starts after them. Waiting for a commit first would cost a wait per window, and
                # the window is what the call takes (one offset per wait at max_messages=1).
                continue
            with self._lock:
                if any(p.queue for p in self._parts):  # a fetch queued messages (Key_Shared, dead letters)
                    continue
            if count or time.monotonic() >= deadline:
                break
            self._wait_idle(deadline)
        return self._rows_of(queued, fetched)

    def acknowledge_table(self, table: Any, txn: Any = None) -> None:
        """Acknowledge every message of ``table``: rows of ``receive_table``, found by their
        ``__partition`` and ``__offset`` columns (or by ``__messageId``); other columns are not
        looked at, so a transformed table will do as long as it keeps those.

        Without ``txn``, as ``acknowledge`` on each message, grouped: a cumulative ack where the
        last cursor read shows the rows run unbroken from the mark-delete position (Exclusive,
        Failover), else acks persisted as ranges, which fold into it as they fill. With ``txn``, the
        acks are PENDING_ACK until the transaction ends, durable before this returns: on an
        Exclusive or Failover subscription, a partition's rows that with what is acknowledged
        already make a run from the mark-delete position are one pending cumulative ack
        (``acknowledge_cumulative(last, txn)``), otherwise (and always on Shared and Key_Shared)
        individual pending acks (``acknowledge(messages, txn)``), the choice made on the latest
        cursor so that both are the same change. Conflicts raise TransactionConflict, as the
        message-by-message calls do, and nothing of the table is acknowledged on that partition."""
        self._check_open()
        by_part = self._positions(as_table(table, "acknowledge_table"))
        if not by_part:
            return
        may_cumulate = self._type not in CLAIMING
        if txn is None:
            with self._lock:
                for part, offs in by_part.items():
                    held = part.held
                    for o in offs:
                        held.pop(o, None)
                    if may_cumulate and self._plain_covers(part, offs):
                        part.cumulative = max(offs[-1], -1 if part.cumulative is None else part.cumulative)
                    else:
                        part.acks.extend(offs)
            if self._group_s == 0:
                self._flush_acks()
            return
        cumulative: dict[PartitionState, int] = {}
        if may_cumulate and self._acks_below(by_part):
            # Offsets passed (markers, invisible data) are acknowledged as plain acks, grouped: land
            # them first, so that the cursor shows the run they are part of.
            self._flush_acks()

        def apply(c: CursorState, k: int, part: PartitionState, offs: list[int]) -> None:
            if may_cumulate and c.covers(offs):
                c.txn_ack_cumulative(k, offs[-1])
                cumulative[part] = offs[-1]
            else:
                cumulative.pop(part, None)
                c.txn_ack(k, offs)

        self._txn_ack(txn, by_part, apply, cumulative)

    # ---- internals ----------------------------------------------------------------------------------
    def _take_queued(self, limit: int) -> list[Message]:
        """Up to ``limit`` fetched messages off the queues, held from now (one lock, no per-message call)."""
        now = time.monotonic()
        out: list[Message] = []
        with self._lock:
            n = len(self._parts)
            for i in range(n):
                part = self._parts[(self._rr + i) % n]
                q = part.queue
                if not q or not self._may_deliver(part):
                    continue
                k = min(len(q), limit - len(out))
                if k == len(q):
                    msgs = list(q)
                    q.clear()
                else:
                    msgs = [q.popleft() for _ in range(k)]
                part.held.update(dict.fromkeys([m._offset for m in msgs], now))
                out += msgs
                if len(out) >= limit:
                    self._rr = (self._rr + i + 1) % n
                    break
        return out

    def _fetch_rows(self, limit: int) -> tuple[list[tuple[Records, list[int]]], bool]:
        """Fetch for the partitions (their queues are empty), in turns, and take up to ``limit``
        rows, held from now, without a Message each. A fetch is sized by what the call still takes
        (up to TABLE_FETCH_MAX), not by the receiver queue: its rows go to the caller, not to the
        queue, and a partition is fetched only while the call takes more. A fetch whose messages need looking at one by one (Key_Shared's; redelivered ones,
        when dead letters may take them) is queued as messages, as ``receive`` would. Also says
        whether a fetch passed offsets (markers, invisible data): a fetch after it goes further."""
        if not self._ensure_active():
            return [], False
        out: list[tuple[Records, list[int]]] = []
        passed = False
        room = limit
        n = len(self._parts)
        start = self._rr
        self._rr = (start + 1) % n  # the next call starts at the next partition: none starves
        failed: PulsarException | None = None
        for i in range(n):
            part = self._parts[(start + i) % n]
            if room <= 0:
                break
            with part.fetching:  # until what the fetch took is held or queued (threads: Receiving._fetch)
                try:
                    got = None if part.queue else self._fetch(part, min(room, TABLE_FETCH_MAX))
                except PulsarException as e:
                    # The rows taken so far are held for this caller: a later partition's failed fetch
                    # must not drop them (they would stay held, undelivered), nor starve the others.
                    failed = failed or e
                    continue
                if got is None:
                    continue
                passed = passed or bool(got.skipped)
                if got.records is None or (self._dead_letters is not None and got.cursor.redelivery):
                    self._enqueue(part, got.cursor, got.messages(), got.skipped)
                    continue
                take, rest = got.rows[:room], got.rows[room:]
                if rest:  # Key_Shared aside, a fetch takes no more than asked; kept for safety
                    self._enqueue(part, got.cursor, got.messages(rest), [])
                offsets = got.records.offsets
                now = time.monotonic()
                with self._lock:
                    if got.skipped:
                        part.acks.extend(got.skipped)  # markers and invisible data: acked as we pass them
                    part.held.update(dict.fromkeys([offsets[i] for i in take], now))
                if take:
                    out.append((got.records, take))
                    room -= len(take)
        if failed is not None:
            with self._lock:
                queued = any(p.queue for p in self._parts)
            if not out and not queued:
                raise failed
            log.info("receive_table on %s goes on with the other partitions; a fetch failed: %s", self._topic, failed)
        return out, passed

    def _rows_of(self, queued: list[Message], fetched: list[tuple[Records, list[int]]]) -> pa.Table:
        """The messages as rows, sliced (or taken) from their fetches' columns, grouped by partition
        in offset order."""
        runs = [(records, np.fromiter((m._i for m in run), dtype=np.int64))
                for records, run in itertools.groupby(queued, key=attrgetter("_rows"))]
        runs += [(records, np.asarray(rows, dtype=np.int64)) for records, rows in fetched]
        if not runs:
            return ROW_SCHEMA.empty_table()
        base = str(self._parts[0].topic.base)
        tables = [rows_from_records(records.select(rows), base, records.partition) for records, rows in runs]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        spans = [(records.partition, records.offsets[rows[0]], records.offsets[rows[-1]]) for records, rows in runs]
        if any((b[0], b[1]) <= (a[0], a[2]) for a, b in itertools.pairwise(spans)):  # redelivered, several fetches
            table = table.sort_by([("__partition", "ascending"), ("__offset", "ascending")])
        return table

    def _positions(self, table: pa.Table) -> dict[PartitionState, list[int]]:
        """Each partition's offsets in ``table``, sorted and distinct."""
        names = table.column_names
        if all(c in names for c in POSITION_COLUMNS):
            cols = []
            for c in POSITION_COLUMNS:
                col = table.column(c)
                if not pa.types.is_integer(col.type):
                    raise InvalidConfiguration(f"acknowledge_table: column {c!r} has type {col.type}, not an integer: "
                                               "keep receive_table's column as it is")
                if col.null_count:
                    raise InvalidConfiguration(f"acknowledge_table: column {c!r} has {col.null_count} null(s): every "
                                               "row must name a received message; filter those rows out first")
                cols.append(col.to_numpy())
            parts, offsets = cols
        elif "__messageId" in names:
            parsed = parse_message_ids(table.column("__messageId"))
            if parsed is None:
                raise InvalidConfiguration("acknowledge_table: column '__messageId' holds a value that is not a "
                                           "serialized MessageId (null, or other bytes): keep receive_table's "
                                           "column as it is")
            parts, offsets = parsed
        else:
            raise InvalidConfiguration(
                f"acknowledge_table needs the rows' positions, the columns __partition and __offset (or "
                f"__messageId) of receive_table, and the table has {', '.join(names) or 'no columns'}: keep them "
                "through the transform (e.g. select them along with the new columns)")
        if not len(offsets):
            return {}
        self._check_topic(table)
        indexes = {p.index: p for p in self._parts}
        out: dict[PartitionState, list[int]] = {}
        for p in np.unique(parts).tolist():
            # Exactly the partition named: a row is this topic's message only at its own index
            # (acknowledge()'s one-partition fallback would take another partition's rows here).
            part = indexes.get(int(p))
            if part is None:
                raise InvalidConfiguration(f"acknowledge_table: partition {p} is not part of {self._topic}: the "
                                           "table holds rows another consumer received")
            offs = offsets[parts == p]
            out[part] = np.unique(offs if part not in out else np.concatenate([out[part], offs])).tolist()
        return out

    def _check_topic(self, table: pa.Table) -> None:
        """Refuse rows of another topic, when the table says (``__topic``): their positions name
        other messages here, which would be acknowledged without ever being delivered."""
        if "__topic" not in table.column_names:
            return
        base = self._parts[0].topic.base
        col = table.column("__topic")
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            return
        others = [t for t in pc.unique(col).to_pylist() if t is not None and not names_topic(t, base)]
        if others:
            raise InvalidConfiguration(f"acknowledge_table: the table holds rows of {others[0]}, not of {base}: "
                                       "acknowledge them on a consumer of that topic")

    @staticmethod
    def _plain_covers(part: PartitionState, offs: list[int]) -> bool:
        """Whether a plain cumulative ack at the last of ``offs`` acknowledges exactly them, as far
        as the last cursor read and the cumulative acks not yet persisted show: what they show
        acknowledged stays so (a seek drops the cursor read)."""
        cursor = part.cursor
        if cursor is None:
            return False
        local = [c for c in (part.cumulative, part.inflight_cumulative) if c is not None]
        if local and max(local) > cursor.mark_delete:
            cursor = cursor.copy()
            cursor.mark_delete = max(local)
            cursor.acked.remove_below(cursor.mark_delete)
        return cursor.covers(offs)

    def _acks_below(self, by_part: dict[PartitionState, list[int]]) -> bool:
        """Whether plain acks not yet persisted lie below the rows of a partition (offsets passed)."""
        with self._lock:
            return any(o < offs[-1] for part, offs in by_part.items()
                       for o in itertools.chain(part.acks, part.inflight)) or \
                any(c is not None for part in by_part for c in (part.cumulative, part.inflight_cumulative))

