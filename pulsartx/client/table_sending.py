"""A producer's Arrow side: ``send_table``.

The rows of a table are appended through the producer's one append path (``Producer._write``):
routed by key as ``send`` routes a message, numbered with the producer's sequence ids under the
partition's append lock (so deduplication treats them as it treats sends), registered with the
transaction before any reaches a partition. What they skip is the Python object per message:
columns are checked and cast once, and each batch is a slice of the table.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import pyarrow as pa

from pulsartx.client.routing import RoundRobin, partitions_for_keys
from pulsartx.client.tables import as_table
from pulsartx.exceptions import InvalidConfiguration
from pulsartx.log.message_id import MessageId
from pulsartx.log.partition import AppendResult, PartitionLog, records_from_arrow
from pulsartx.log.rows import ROW_SCHEMA, message_ids
from pulsartx.log.schema import PROPERTIES, TIMESTAMP
from pulsartx.naming import TopicName

if TYPE_CHECKING:
    from pulsartx.client.client import Client

_STRINGS = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
_BINARIES = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view, pa.types.is_fixed_size_binary)


def _any(checks: tuple[Callable[[pa.DataType], bool], ...], t: pa.DataType) -> bool:
    return pa.types.is_null(t) or any(c(t) for c in checks)


def _string_map(t: pa.DataType) -> bool:
    return pa.types.is_null(t) or (pa.types.is_map(t) and _any(_STRINGS, t.key_type) and _any(_STRINGS, t.item_type))


# The columns a table sent may have: how each is recognised, what it must be, and how it is cast.
SEND_COLUMNS: dict[str, tuple[Callable[[pa.DataType], bool], str, pa.DataType]] = {
    "value": (lambda t: _any(_BINARIES + _STRINGS, t), "binary (a string is sent as its UTF-8 bytes)", pa.binary()),
    "__key": (lambda t: _any(_STRINGS, t), "string (keys are UTF-8 text: decode or base64 binary keys first)",
              pa.string()),
    "__eventTime": (lambda t: _any((pa.types.is_timestamp,), t), "timestamp (epoch milliseconds as integers: "
                    "cast them with .cast(pyarrow.timestamp('ms', tz='UTC')))", TIMESTAMP),
    "__messageProperties": (_string_map, "map<string, string>", PROPERTIES),
}
# Columns receive_table gives that the log sets itself: refused by name, with the way to drop them.
SET_BY_THE_LOG = tuple(n for n in ROW_SCHEMA.names if n not in SEND_COLUMNS)


def check_send_table(table: pa.Table) -> dict[str, pa.ChunkedArray]:
    """The table's columns, checked and cast to what is stored, before anything is sent: a bad
    column fails the whole call, naming the column and the fix, and nothing is written."""
    names = table.column_names
    if "value" not in names:
        raise InvalidConfiguration(
            f"send_table: the table has no 'value' column (it has {', '.join(names) or 'no columns'}): name the "
            "payload column value, e.g. table.rename_columns({'payload': 'value'})")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InvalidConfiguration(f"send_table: column {dupes[0]!r} appears {names.count(dupes[0])} times: keep one")
    out: dict[str, pa.ChunkedArray] = {}
    for name, col in zip(names, table.columns, strict=True):
        spec = SEND_COLUMNS.get(name)
        if spec is None:
            keep = [n for n in names if n in SEND_COLUMNS]
            why = ("is set by the log, not by a producer" if name in SET_BY_THE_LOG
                   else "is not a column pulsartx sends")
            raise InvalidConfiguration(
                f"send_table: column {name!r} {why}: drop it first, e.g. table.select({keep!r}); a table sent has "
                f"value and optionally {', '.join(c for c in SEND_COLUMNS if c != 'value')}")
        ok, shown, stored = spec
        if not ok(col.type):
            raise InvalidConfiguration(f"send_table: column {name!r} has type {col.type}: it must be {shown}; cast "
                                       "it first")
        _check_nulls(name, col)
        try:
            out[name] = col.cast(stored, safe=False) if col.type != stored else col
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidConfiguration(f"send_table: column {name!r} ({col.type}) cannot be stored as {stored}: "
                                       f"{e}") from None
    return out


def _check_nulls(name: str, col: pa.ChunkedArray) -> None:
    """Refuse what ``send`` refuses: a null payload (``send(None)``) or a null property value
    (``properties={"k": None}``); a null key, event time or properties map is a message without one."""
    if name == "value" and col.null_count:
        raise InvalidConfiguration(f"send_table: column 'value' has {col.null_count} null(s): every message has a "
                                   "payload, as send() requires bytes; fill them first, e.g. "
                                   "table.set_column(0, 'value', pyarrow.compute.fill_null(table['value'], b''))")
    if name == "__messageProperties" and pa.types.is_map(col.type):
        nulls = 0
        for chunk in col.chunks:  # the items in the chunk's (possibly sliced) range
            lo, hi = chunk.offsets[0].as_py(), chunk.offsets[-1].as_py()
            nulls += chunk.items.slice(lo, hi - lo).null_count
        if nulls:
            raise InvalidConfiguration(f"send_table: column '__messageProperties' has {nulls} null propert"
                                       f"{'y value' if nulls == 1 else 'y values'}: properties map str to str, as "
                                       "in send(); drop or fill them first")


class MessageIds(Sequence[MessageId]):
    """The MessageIds of a sent table's rows, in row order, as ``send`` returns one per message:
    offset -1 for a row deduplicated as sent before. Kept as two arrays; a MessageId is made
    only when asked for. ``to_arrow()`` gives them as a ``__messageId`` column."""

    __slots__ = ("partitions", "offsets")

    def __init__(self, partitions: np.ndarray, offsets: np.ndarray):
        self.partitions = partitions
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets)

    @overload
    def __getitem__(self, i: int) -> MessageId: ...

    @overload
    def __getitem__(self, i: slice) -> MessageIds: ...

    def __getitem__(self, i: int | slice) -> MessageId | MessageIds:
        if isinstance(i, slice):
            return MessageIds(self.partitions[i], self.offsets[i])
        return MessageId(int(self.partitions[i]), int(self.offsets[i]))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MessageIds):
            return bool(np.array_equal(self.partitions, other.partitions) and np.array_equal(self.offsets, other.offsets))
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable arrays: like a list, unhashable

    def __repr__(self) -> str:
        shown = ", ".join(str(m) for m in self[:3])
        return f"MessageIds([{shown}{', ...' if len(self) > 3 else ''}], {len(self)} rows)"

    def to_arrow(self) -> pa.Array:
        """The ids serialized, as receive_table's ``__messageId`` column (``MessageId.deserialize``)."""
        return message_ids(self.partitions, self.offsets)


class TableSending:
    """``send_table``, for :class:`~pulsartx.client.producer.Producer` (whose state it uses)."""

    _client: Client
    _name: str
    _partitions: list[TopicName]
    _logs: dict[int, PartitionLog]
    _lock: threading.Lock
    _append_locks: dict[int, threading.Lock]
    _router: RoundRobin
    _max_messages: int
    _last_seq: int

    _check_open: Callable[[], None]
    _flush_queue: Callable[..., None]
    _write: Callable[..., AppendResult]

    def send_table(self, table: Any, txn: Any = None) -> MessageIds:
        """Send every row of ``table`` (a ``pyarrow.Table``; a RecordBatch or a DataFrame exporting
        Arrow, such as a Polars one, will do) and wait until all are durable, as ``send`` does for
        one message. Returns their MessageIds in row order (:class:`MessageIds`, a sequence).

        Columns: ``value`` (binary, or string sent as UTF-8), and optionally ``__key`` (routes the
        row and is its key), ``__eventTime`` (timestamp) and ``__messageProperties``
        (map<string, string>); any other column, or a wrong type, raises InvalidConfiguration
        naming it before anything is sent. A row routes as ``send`` routes: by its key's hash,
        else round-robin, where a batch (``batching_max_messages`` rows) goes whole to one
        partition, as Pulsar's router does with batching. Each batch is one append, numbered with
        this producer's sequence ids, so deduplication and ``txn`` treat the rows as sends.

        Should it raise midway (storage), batches to other partitions may have landed: with
        ``txn``, abort it; without, what landed stays, as for ``send_async`` batches."""
        self._check_open()
        t = as_table(table, "send_table")
        cols = check_send_table(t)
        if txn is not None:
            txn._check_usable()
        n = t.num_rows
        pids = np.zeros(n, dtype=np.int32)
        offsets = np.full(n, -1, dtype=np.int64)
        if n == 0:
            return MessageIds(pids, offsets)
        batches = self._batches(n, cols.get("__key"))
        by_part: dict[int, list[np.ndarray | slice]] = {}
        for part, rows in batches:
            by_part.setdefault(part, []).append(rows)
        registered = False
        if txn is not None:
            txn._attach_producer(self)
            txn._register_partitions({str(self._logs[p].topic) for p in by_part})
            registered = True

        def send(part: int) -> None:
            self._flush_queue((part, txn))  # what send_async queued before goes first
            for rows in by_part[part]:
                res = self._append_rows(part, txn, registered, cols, rows)
                pids[rows] = part
                if res.duplicates == 0:
                    offsets[rows] = np.arange(res.first_offset, res.last_offset + 1, dtype=np.int64)
                else:
                    offsets[rows] = np.array([-1 if o is None else o for o in res.offsets], dtype=np.int64)

        if len(by_part) == 1:
            send(next(iter(by_part)))
        else:  # partitions in parallel, as a flush does (delta-rs releases the GIL while committing)
            with ThreadPoolExecutor(max_workers=min(8, len(by_part)), thread_name_prefix="pulsartx-send-table") as pool:
                for f in [pool.submit(send, p) for p in by_part]:
                    f.result()
        return MessageIds(pids, offsets)

    def _batches(self, n: int, keys: pa.ChunkedArray | None) -> list[tuple[int, np.ndarray | slice]]:
        """(partition, rows) for each append: keyed rows by their key's partition, the others in
        runs of ``batching_max_messages`` rows, each run to the router's next partition."""
        size = self._max_messages
        count = len(self._partitions)
        target = np.full(n, -1, dtype=np.int64)
        if count > 1 and keys is not None and keys.null_count < n:
            target = partitions_for_keys(keys, count)
        out: list[tuple[int, np.ndarray | slice]] = []
        unkeyed = np.flatnonzero(target < 0) if keys is not None and (target >= 0).any() else None
        free = n if unkeyed is None else len(unkeyed)
        for lo in range(0, free, size):
            with self._lock:
                idx = 0 if count == 1 else self._router.next()
            hi = min(free, lo + size)
            out.append((self._partitions[idx].partition, slice(lo, hi) if unkeyed is None else unkeyed[lo:hi]))
        if unkeyed is not None:
            # Keyed and unkeyed rows meet on a partition: appended in row order there, as send()
            # row by row would append them (a keyed row first, then an unkeyed one after it).
            merged: dict[int, list[np.ndarray]] = {}
            for part, rows in out:
                merged.setdefault(part, []).append(rows)  # type: ignore[arg-type]
            for idx in np.unique(target[target >= 0]).tolist():
                merged.setdefault(self._partitions[idx].partition, []).append(np.flatnonzero(target == idx))
            out = []
            for part, runs in merged.items():
                rows = np.sort(np.concatenate(runs))
                out += [(part, rows[lo:lo + size]) for lo in range(0, len(rows), size)]
        return out

    def _append_rows(self, part: int, txn: Any, registered: bool, cols: dict[str, pa.ChunkedArray],
                     rows: np.ndarray | slice) -> AppendResult:
        """One batch through the producer's append path, numbered as it goes (see ``Producer._append``)."""
        if isinstance(rows, slice):
            picked = {name: col.slice(rows.start, rows.stop - rows.start) for name, col in cols.items()}
        else:
            index = pa.array(rows)
            picked = {name: col.take(index) for name, col in cols.items()}
        first = 0

        def number() -> None:
            nonlocal first
            with self._lock:
                first = self._last_seq + 1
                self._last_seq += len(picked["value"])

        return self._write(part, txn, registered, lambda txn_bits: records_from_arrow(
            picked["value"], keys=picked.get("__key"), properties=picked.get("__messageProperties"),
            event_times=picked.get("__eventTime"), producer_name=self._name, first_sequence_id=first,
            txn=txn_bits), number)
