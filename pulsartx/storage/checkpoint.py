"""Delta checkpoints written by pulsartx: the previous checkpoint plus the JSON commits since.

Why: delta-rs builds a checkpoint by replaying the log twice (the open at the version, then
``create_checkpoint``'s own snapshot), on its own threads, and that cost grew with the table: a
checkpoint of a 250-version partition cost ~150-200 ms of CPU, and in long runs the checkpoint
threads were what slowed a process down (docs/design/checkpoints-written-by-pulsartx.md). A
checkpoint is the reconciled state of the log, so the last one plus the commits after it is
enough: the previous checkpoint's rows are kept or dropped column-wise with pyarrow, and only the
commits since (fewer than the checkpoint interval) are parsed.

What is written is a plain classic (V1) single-file checkpoint, as delta-rs writes it: the same
arrow schema as the previous checkpoint (delta-rs's), one action per row with the other columns
null, reconciled as the Delta protocol's action reconciliation says (``add``/``remove`` keyed by
path, the latest wins; a ``remove`` kept while its ``deletionTimestamp`` is newer than
``delta.deletedFileRetentionDuration``, 7 days by default; ``txn`` the latest per app id, dropped
once its ``lastUpdated`` is older than ``delta.setTransactionRetentionDuration`` when set; the
latest ``metaData`` and ``protocol``; ``domainMetadata`` the latest per domain, removed ones
dropped; no ``commitInfo``), then ``_last_checkpoint`` with the fields delta-rs writes.

Anything else raises :class:`Unsupported`, and the caller has delta-rs write the checkpoint: no
previous checkpoint, a multi-part or V2 one, a checkpoint schema with columns this does not fill
(``stats_parsed``, ``checkpointMetadata``), deletion vectors, reader or writer table features,
stats written as structs or not as JSON, and retention properties in a form delta-rs would read
differently.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pulsartx.storage import delta
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)

DEFAULT_DELETED_FILE_RETENTION_MS = 7 * 86_400_000  # Delta's (and delta-rs's) default: 1 week
# The columns of a classic checkpoint as delta-rs writes it, and the fields of its file actions this
# module fills from a commit's JSON. A previous checkpoint with any other column or field (parsed
# statistics or partition values, V2's checkpointMetadata) is not one this continues.
CHECKPOINT_COLUMNS = frozenset({"add", "remove", "metaData", "protocol", "txn", "domainMetadata", "sidecar"})
REQUIRED_COLUMNS = ("add", "remove", "metaData", "protocol", "txn")
ADD_FIELDS = frozenset({"path", "partitionValues", "size", "modificationTime", "dataChange", "stats", "tags",
                        "deletionVector", "baseRowId", "defaultRowCommitVersion", "clusteringProvider"})
REMOVE_FIELDS = frozenset({"path", "deletionTimestamp", "dataChange", "extendedFileMetadata", "partitionValues",
                           "size", "stats", "tags", "deletionVector", "baseRowId", "defaultRowCommitVersion"})
# Actions of a commit that a checkpoint leaves out; any other unknown kind is refused.
SKIPPED_ACTIONS = frozenset({"commitInfo", "cdc"})

DELETED_FILE_RETENTION = "delta.deletedFileRetentionDuration"
TXN_RETENTION = "delta.setTransactionRetentionDuration"


class Unsupported(Exception):
    """The table's log is not in a form this writes a checkpoint from; delta-rs writes it."""


@dataclass(frozen=True)
class Written:
    """A checkpoint written, as its ``_last_checkpoint`` states it."""

    version: int
    size: int  # actions (rows)
    size_in_bytes: int
    num_of_add_files: int
    hint_written: bool  # False: a newer checkpoint was already the last one, its hint was kept


def parse_interval_ms(raw: str) -> float:
    """``raw`` (a table property such as ``interval 7 days``) in ms, as delta-rs reads it; raises
    Unsupported when delta-rs would not read it (a value it does not read is as if unset, so one
    in any other form is left to delta-rs rather than guessed)."""
    ms = delta.interval_ms(raw)
    if ms is None:
        raise Unsupported(f"duration {raw!r} is not in the form delta-rs reads")
    return ms


def checkpoint_file(version: int) -> str:
    return f"{version:020d}.checkpoint.parquet"


@dataclass
class _Tail:
    """What the commits after the previous checkpoint leave, reconciled (the latest of each wins)."""

    files: dict[str, tuple[str, dict[str, Any]]]  # path -> ("add" | "remove", action)
    txns: dict[str, dict[str, Any]]
    domains: dict[str, dict[str, Any]]
    meta: dict[str, Any] | None
    protocol: dict[str, Any] | None


def _reconcile(commits: Iterable[list[dict[str, Any]]]) -> _Tail:
    tail = _Tail({}, {}, {}, None, None)
    for actions in commits:
        for a in actions:
            if not a:
                continue
            kind, body = next(iter(a.items()))
            if kind in ("add", "remove"):
                if body.get("deletionVector") is not None:
                    raise Unsupported("a file action has a deletion vector")
                tail.files.pop(body["path"], None)  # re-inserted: the dict's order is the log's
                tail.files[body["path"]] = (kind, body)
            elif kind == "txn":
                tail.txns.pop(body["appId"], None)
                tail.txns[body["appId"]] = body
            elif kind == "metaData":
                tail.meta = body
            elif kind == "protocol":
                tail.protocol = body
            elif kind == "domainMetadata":
                tail.domains.pop(body["domain"], None)
                tail.domains[body["domain"]] = body
            elif kind not in SKIPPED_ACTIONS:
                raise Unsupported(f"a commit holds a {kind!r} action")
    return tail


def _check_layout(prev: pa.Table) -> None:
    names = set(prev.column_names)
    if not names <= CHECKPOINT_COLUMNS or any(c not in names for c in REQUIRED_COLUMNS):
        raise Unsupported(f"checkpoint columns {sorted(names)} are not a classic checkpoint's as delta-rs writes it")
    for column, known in (("add", ADD_FIELDS), ("remove", REMOVE_FIELDS)):
        fields = {f.name for f in prev.schema.field(column).type}
        if not fields <= known or "path" not in fields:
            raise Unsupported(f"checkpoint {column} fields {sorted(fields - known)} are not filled here")
        if "deletionVector" in fields and _child(prev, column, "deletionVector").null_count != prev.num_rows:
            raise Unsupported(f"a checkpoint {column} action has a deletion vector")
    if "sidecar" in names and prev.column("sidecar").null_count != prev.num_rows:
        raise Unsupported("the checkpoint refers to sidecar files")


def _child(table: pa.Table, column: str, field: str) -> pa.ChunkedArray:
    """A field of a struct column, null where the struct is."""
    import pyarrow.compute as pc

    return pc.struct_field(table.column(column), field)


def _only(table: pa.Table, column: str) -> dict[str, Any] | None:
    """The one action of kind ``column`` in a checkpoint, as a dict (maps as dicts)."""
    col = table.column(column)
    found = col.filter(col.is_valid()).to_pylist()
    if len(found) > 1:
        raise Unsupported(f"the checkpoint holds {len(found)} {column} actions")
    return _maps_as_dicts(found[0]) if found else None


def _maps_as_dicts(meta: dict[str, Any]) -> dict[str, Any]:
    out = dict(meta)
    for key in ("configuration",):
        if isinstance(out.get(key), list):
            out[key] = dict(out[key])
    return out


def _check_table(meta: dict[str, Any] | None, protocol: dict[str, Any] | None) -> dict[str, str]:
    """The table's configuration, once its protocol and properties are known to be ones whose
    checkpoint this writes as delta-rs would."""
    if meta is None or protocol is None:
        raise Unsupported("the log has no metaData or no protocol action")
    if (int(protocol["minReaderVersion"]) != 1 or protocol.get("readerFeatures")
            or protocol.get("writerFeatures")):
        raise Unsupported(f"protocol {protocol} has features this does not write checkpoints for")
    conf = dict(meta.get("configuration") or {})
    if conf.get("delta.checkpoint.writeStatsAsJson", "true").lower() != "true":
        raise Unsupported("statistics are not kept as JSON in checkpoints")
    if conf.get("delta.checkpoint.writeStatsAsStruct", "false").lower() != "false":
        raise Unsupported("statistics are kept as structs in checkpoints")
    if conf.get("delta.checkpointPolicy", "classic") != "classic":
        raise Unsupported("the table asks for V2 checkpoints")
    return conf


def _is_in(values: pa.ChunkedArray, keys: Iterable[str]) -> pa.ChunkedArray:
    import pyarrow.compute as pc

    key_set = pa.array(list(keys), pa.string())
    return pc.fill_null(pc.is_in(values, value_set=key_set), False)


def _kept_rows(prev: pa.Table, tail: _Tail, tombstones_after: int, txns_after: int | None) -> pa.Table:
    """The previous checkpoint's rows that the commits since did not replace and that have not
    expired, filtered column-wise (no row becomes a Python object)."""
    import pyarrow.compute as pc

    def valid(column: str) -> pa.ChunkedArray:
        return prev.column(column).is_valid()

    def both(*masks: pa.ChunkedArray) -> pa.ChunkedArray:
        out = masks[0]
        for m in masks[1:]:
            out = pc.and_(out, pc.fill_null(m, False))
        return out

    replaced = _is_in(_child(prev, "add", "path"), tail.files)
    keep = both(valid("add"), pc.invert(replaced))
    removed_path = _child(prev, "remove", "path")
    keep = pc.or_(keep, both(valid("remove"), pc.invert(_is_in(removed_path, tail.files)),
                             pc.greater(_child(prev, "remove", "deletionTimestamp"), tombstones_after)))
    txn = both(valid("txn"), pc.invert(_is_in(_child(prev, "txn", "appId"), tail.txns)))
    if txns_after is not None:
        updated = _child(prev, "txn", "lastUpdated")
        txn = both(txn, pc.or_(updated.is_null(), pc.fill_null(pc.greater(updated, txns_after), False)))
    keep = pc.or_(keep, txn)
    if tail.meta is None:
        keep = pc.or_(keep, valid("metaData"))
    if tail.protocol is None:
        keep = pc.or_(keep, valid("protocol"))
    if "domainMetadata" in prev.column_names:
        keep = pc.or_(keep, both(valid("domainMetadata"),
                                 pc.invert(_is_in(_child(prev, "domainMetadata", "domain"), tail.domains)),
                                 pc.invert(_child(prev, "domainMetadata", "removed"))))
    return prev.filter(keep)


def _rows(schema: pa.Schema, kind: str, actions: list[dict[str, Any]]) -> pa.Table | None:
    """``actions`` of one kind as checkpoint rows: that column filled, the others null."""
    if not actions:
        return None
    if kind not in schema.names:
        raise Unsupported(f"the checkpoint schema has no {kind} column")
    # Null structs built by pa.array, not pa.nulls: their non-nullable children then hold values
    # (as parquet needs), not nulls the writer refuses.
    known = {f.name for f in schema.field(kind).type}
    for action in actions:
        extra = set(action) - known
        if extra:  # pa.array would drop them without a word
            raise Unsupported(f"a {kind} action has fields {sorted(extra)} the checkpoint schema lacks")
    nulls = [None] * len(actions)
    arrays = [pa.array(actions if f.name == kind else nulls, type=f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _new_rows(schema: pa.Schema, tail: _Tail, tombstones_after: int, txns_after: int | None) -> list[pa.Table]:
    adds = [body for kind, body in tail.files.values() if kind == "add"]
    removes = [body for kind, body in tail.files.values()
               if kind == "remove" and (body.get("deletionTimestamp") or 0) > tombstones_after]
    txns = [t for t in tail.txns.values()
            if txns_after is None or t.get("lastUpdated") is None or t["lastUpdated"] > txns_after]
    domains = [d for d in tail.domains.values() if not d.get("removed")]
    parts = [_rows(schema, "protocol", [tail.protocol] if tail.protocol is not None else []),
             _rows(schema, "metaData", [tail.meta] if tail.meta is not None else []),
             _rows(schema, "txn", txns), _rows(schema, "domainMetadata", domains),
             _rows(schema, "add", adds), _rows(schema, "remove", removes)]
    return [p for p in parts if p is not None]


def _read_commits(root: StorageRoot, segments: tuple[str, ...], first: int, last: int) -> list[list[dict[str, Any]]]:
    """Commits ``first`` to ``last``, in order. On an object store several at once, as a data
    file's reads are (up to 800 commits one request each would take seconds); the parsing is the
    same either way."""
    log_tail = delta.LogTail(root, segments)
    versions = range(first, last + 1)
    commits = delta.read_each(root, log_tail.read_commit, versions, "pulsartx-checkpoint-read")
    missing = [v for v, c in zip(versions, commits, strict=True) if c is None]
    if missing:
        raise Unsupported(f"commit {missing[0]} is missing")
    return [c for c in commits if c is not None]


def write_checkpoint(root: StorageRoot, segments: tuple[str, ...], version: int,
                     now_ms: int | None = None) -> Written | None:
    """Write the checkpoint of the table at ``segments`` at ``version`` from its last checkpoint
    and the commits after it, then ``_last_checkpoint``. None when the last checkpoint is already
    at or past ``version`` (nothing to write). Raises :class:`Unsupported` when the log is not in
    a form this writes from (see the module), and storage errors as they come: the caller falls
    back on delta-rs either way. ``now_ms``: the time retention is counted from (tests)."""
    import pyarrow.parquet as pq

    try:
        info = delta.read_last_checkpoint(root, segments)
    except ValueError as e:
        raise Unsupported(str(e)) from e
    if info is None:
        raise Unsupported("the table has no checkpoint yet")
    if info.get("parts") or info.get("v2Checkpoint"):
        raise Unsupported("the last checkpoint is multi-part or V2")
    base = info["version"]
    if base >= version:
        return None
    prev = delta.checkpoint_columns(root, segments, base, None)
    if prev is None:
        raise Unsupported(f"checkpoint {base} is missing or unreadable")
    _check_layout(prev)
    tail = _reconcile(_read_commits(root, segments, base + 1, version))
    conf = _check_table(tail.meta if tail.meta is not None else _only(prev, "metaData"),
                        tail.protocol if tail.protocol is not None else _only(prev, "protocol"))
    now = int(time.time() * 1000) if now_ms is None else now_ms
    deleted_raw = conf.get(DELETED_FILE_RETENTION)
    tombstone_ms = DEFAULT_DELETED_FILE_RETENTION_MS if deleted_raw is None else parse_interval_ms(deleted_raw)
    txn_raw = conf.get(TXN_RETENTION)
    tombstones_after = int(now - tombstone_ms)
    txns_after = None if txn_raw is None else int(now - parse_interval_ms(txn_raw))

    table = pa.concat_tables([*_new_rows(prev.schema, tail, tombstones_after, txns_after),
                              _kept_rows(prev, tail, tombstones_after, txns_after)])
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, compression="none")
    body = buf.getvalue().to_pybytes()
    name = checkpoint_file(version)
    if root.has_put_if_absent:
        # As delta-rs: a checkpoint file that exists is left alone (a reader may be part-way
        # through it); another writer's checkpoint of this version stands for ours.
        if not root.put_if_absent(body, *segments, "_delta_log", name):
            log.debug("checkpoint %s of %s exists; left as it is", name, root.uri(*segments))
    else:
        root.write_bytes(body, *segments, "_delta_log", name)
    adds = table.num_rows - table.column("add").null_count
    written = Written(version, table.num_rows, len(body), adds, hint_written=False)
    # The checkpoint exists now: from here on, nothing falls back on delta-rs (which would find
    # the file and write no hint). A hint not moved is only slower opens until the next one.
    try:
        current = delta.read_last_checkpoint(root, segments)
        if current is not None and current["version"] > version:
            return written  # another writer's newer checkpoint is the last one
        hint = {"version": version, "size": written.size, "sizeInBytes": written.size_in_bytes,
                "numOfAddFiles": written.num_of_add_files}
        root.write_text(json.dumps(hint, separators=(",", ":")), *segments, "_delta_log", "_last_checkpoint")
    except Exception as e:
        log.info("checkpoint %s of %s written; its _last_checkpoint hint was not: %s", name,
                 root.uri(*segments), e)
        return written
    return Written(version, written.size, written.size_in_bytes, adds, hint_written=True)
