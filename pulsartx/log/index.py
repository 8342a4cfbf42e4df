"""Which data files hold which offsets: the partition's in-memory file index.

Built once from a Delta snapshot (which handles checkpoints), then kept current by tailing the
commit log, so catching up costs the new commits only. Range lookups are a bisect.
"""
from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pulsartx.storage.delta import add_actions, parse_stats


@dataclass(frozen=True, order=True)
class DataFile:
    min_offset: int
    max_offset: int
    path: str
    size: int
    num_records: int
    min_publish_us: int | None = None
    max_publish_us: int | None = None
    # txn_most_bits statistics (None where the table has none): a Spark read trusts a commit entry
    # to show a file whole only when every row of it carries that transaction's most bits.
    txn_most_min: int | None = None
    txn_most_max: int | None = None
    txn_most_nulls: int | None = None

    @property
    def txn_free(self) -> bool:
        """True only when the file's statistics prove it holds no transactional record (a table
        made before txn_most_bits had statistics says nothing, and its files are read as before)."""
        return self.txn_most_nulls is not None and self.num_records > 0 and self.txn_most_nulls == self.num_records


# Delta statistics keep timestamps at millisecond precision and delta-rs truncates, so the true
# maximum of a file can be up to 999 µs above its recorded maximum.
TS_STATS_SLACK_US = 999


def _iso_to_us(v: Any) -> int | None:
    if v is None:
        return None
    import datetime as dt

    return int(dt.datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp() * 1_000_000)


def _max_us(v: int | None) -> int | None:
    return None if v is None else v + TS_STATS_SLACK_US


def data_file_from_add(add: dict[str, Any]) -> DataFile | None:
    stats = parse_stats(add.get("stats"))
    lo, hi = stats.get("minValues", {}), stats.get("maxValues", {})
    if "offset" not in lo or "offset" not in hi:
        return None  # an empty file carries no offsets
    records = int(stats.get("numRecords", 0))
    return DataFile(int(lo["offset"]), int(hi["offset"]), add["path"], int(add.get("size", 0)), records,
                    _iso_to_us(lo.get("publish_time")), _max_us(_iso_to_us(hi.get("publish_time"))),
                    _int(lo.get("txn_most_bits")), _int(hi.get("txn_most_bits")),
                    _int(stats.get("nullCount", {}).get("txn_most_bits")))


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


class FileIndex:
    """The files of one partition table at :attr:`version`, shared by the threads of a process.

    A reader takes the index's one view, (files, their first offsets), in a single read and works on
    it; a commit that removes files publishes a new view instead of changing the one readers hold,
    so a reader sees the files before a merge or after it, never the run's files gone and the
    merged one not yet in. Commits are applied under a lock and each at most once: two threads that
    catch up at the same time both read the same new commits."""

    def __init__(self) -> None:
        self._view: tuple[list[DataFile], list[int]] = ([], [])
        self.version = -1
        self._lock = threading.Lock()

    def _publish(self, files: list[DataFile], version: int) -> None:
        self._view = (files, [f.min_offset for f in files])
        self.version = version

    def load_snapshot(self, table: Any) -> None:
        """Build from a DeltaTable snapshot: one call, whatever the number of commits."""
        acts = add_actions(table)
        n = acts.num_rows

        def col(name: str, micros: bool = False) -> list[Any]:
            if name not in acts.column_names:
                return [None] * n
            c = acts.column(name)
            if micros:  # timestamps as integer microseconds, converted in one pass
                c = c.cast(pa.timestamp("us", tz=c.type.tz)).cast(pa.int64())
            return c.to_pylist()

        paths, sizes, counts = col("path"), col("size_bytes"), col("num_records")
        los, his = col("min.offset"), col("max.offset")
        pmins, pmaxs = col("min.publish_time", True), col("max.publish_time", True)
        nulls = col("null_count.txn_most_bits")
        mosts, most_maxs = col("min.txn_most_bits"), col("max.txn_most_bits")
        files = []
        for path, size, count, lo, hi, pmin, pmax, null, mmin, mmax in zip(
                paths, sizes, counts, los, his, pmins, pmaxs, nulls, mosts, most_maxs, strict=True):
            if lo is None or hi is None:
                continue
            records = int(count or 0)
            files.append(DataFile(int(lo), int(hi), path, int(size), records, pmin, _max_us(pmax),
                                  _int(mmin), _int(mmax), _int(null)))
        with self._lock:
            self._publish(sorted(files), table.version())

    def load_adds(self, adds: Iterable[dict[str, Any]], version: int) -> None:
        """Build from add actions (a checkpoint's and the commits' after it)."""
        files = sorted(f for f in map(data_file_from_add, adds) if f is not None)
        with self._lock:
            self._publish(files, version)

    def apply_commit(self, version: int, actions: list[dict[str, Any]], next_only: bool = False) -> None:
        """One commit's adds and removes; a commit already applied is skipped, and with
        ``next_only`` so is one that does not follow the last applied (a writer passing on its
        commits: the ones in between are left for the next refresh to read). An append at the end
        (every ordinary commit) costs O(1), extending the current view in place (files first: a
        reader's bisect over the first offsets it sees then finds a prefix of the files); the
        offset list is rebuilt only when files are removed or land out of order, as a rebuild per
        commit made a busy partition's refresh grow with its file count."""
        removed = {a["remove"]["path"] for a in actions if "remove" in a}
        added = [f for a in actions if "add" in a and (f := data_file_from_add(a["add"])) is not None]
        with self._lock:
            if version <= self.version or (next_only and version != self.version + 1):
                return
            files, mins = self._view
            in_order = not removed
            last = mins[-1] if mins else None
            for f in added:
                in_order = in_order and (last is None or f.min_offset > last)
                last = f.min_offset
            if in_order:
                for f in added:
                    files.append(f)
                    mins.append(f.min_offset)
                self.version = version
                return
            kept = [f for f in files if f.path not in removed] if removed else list(files)
            for f in added:
                bisect.insort(kept, f)
            self._publish(kept, version)

    @property
    def end_offset(self) -> int:
        """The next offset to be written: one past the highest offset in any file."""
        files = self._view[0]
        return files[-1].max_offset + 1 if files else 0

    @property
    def start_offset(self) -> int:
        files = self._view[0]
        return files[0].min_offset if files else 0

    @property
    def files(self) -> list[DataFile]:
        return list(self._view[0])

    def files_for(self, start: int, end: int) -> list[DataFile]:
        """Files holding any offset in ``[start, end)``, in offset order."""
        files, mins = self._view
        if start >= end or not files:
            return []
        i = max(0, bisect.bisect_right(mins, start) - 1)
        out = []
        for f in files[i:]:
            if f.min_offset >= end:
                break
            if f.max_offset >= start:
                out.append(f)
        return out

    def size_bytes(self) -> int:
        return sum(f.size for f in self._view[0])
