"""Naming what is broken when a partition's Delta table cannot be read.

delta-rs reports a corrupt log as e.g. "Json error: Truncated record whilst reading number": it
names neither the table nor the file, and with RUST_BACKTRACE set it appends a native stack trace.
An operator facing one bad partition among thousands needs the partition's topic name and the
file to restore. This runs only on the error path, so scanning the log folder is affordable.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pulsartx.exceptions import CorruptedLog, short_cause
from pulsartx.storage.root import StorageRoot

MAX_SCANNED_COMMITS = 10_000


def unreadable_commits(root: StorageRoot, segments: tuple[str, ...]) -> list[str]:
    """Paths of ``_delta_log/*.json`` commits that are not valid newline-delimited JSON (newest last)."""
    try:
        names = [n for n in root.listdir(*segments, "_delta_log") if n.endswith(".json") and n[:1].isdigit()]
    except Exception:  # the listing itself failing is reported by the original error
        return []
    bad = []
    for name in names[-MAX_SCANNED_COMMITS:]:
        path = root.fs_path(*segments, "_delta_log", name)
        try:
            raw = root.cat(path)
            for line in raw.decode("utf-8").splitlines():
                if line.strip():
                    json.loads(line)
        except (ValueError, UnicodeDecodeError):
            bad.append(path)
        except Exception:  # unreadable for another reason (vanished, permissions): not ours to judge
            continue
    return bad


def corrupted_partition(root: StorageRoot, segments: tuple[str, ...], topic: Any, cause: BaseException) -> CorruptedLog:
    """A CorruptedLog naming the partition (``persistent://t/n/topic-partition-N``), its table and,
    when it can be found, the broken commit file, with the cause's message minus any backtrace."""
    bad = unreadable_commits(root, segments)
    where = f"; unreadable commit file(s): {', '.join(bad)}" if bad else ""
    uri = root.uri(*segments)
    why = short_cause(cause).removeprefix(f"Delta table {uri} is unreadable: ")
    err = CorruptedLog(
        f"partition {topic} is unreadable (Delta table {uri}): {why}{where}. "
        "Other partitions are not affected; restore the named file(s) from a backup, or delete and re-create "
        "the topic")
    err.partition = str(topic)  # type: ignore[attr-defined]
    return err


@contextmanager
def naming_partition(root: StorageRoot, segments: tuple[str, ...], topic: Any) -> Iterator[None]:
    """Re-raise a CorruptedLog from the block with the partition and the bad file named (once)."""
    try:
        yield
    except CorruptedLog as e:
        if getattr(e, "partition", None) is not None:
            raise
        raise corrupted_partition(root, segments, topic, e) from e
