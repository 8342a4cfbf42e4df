"""KeyedLog: a Delta table of full-state records where the latest record per key wins.

This is Kafka's compacted ``__transaction_state`` topic, on Delta: each row restates its key's
whole state plus a per-key sequence number, so
  * replay is "highest seq per key", with no ordering across keys needed;
  * an update is a compare-and-set on the key: the commit carries the app-transaction id of the
    key's bucket, and any concurrent commit to the same bucket after our snapshot makes it fail,
    after which the caller re-reads and re-validates (the spurious conflicts between keys that
    share a bucket only cost a retry; bucketing bounds the number of app ids Delta keeps);
  * compaction (the snapshot) rewrites rows in one commit, so opening costs the live keys plus
    the entries since the last compaction, not the history. It is two-level, as an LSM tree's: a
    *minor* compaction rewrites only the files since the last compaction (the latest rows of the
    keys they touched) into one; a *full* one rewrites every live row into one file, dropping the
    rows ``keep`` rejects, once the minor files hold as many rows as the last full one left or
    number ``MAX_MINOR_FILES``. A log that keeps tens of thousands of live rows (a TC log retains
    finished transactions for minutes) so rewrites a few rows per commit, not all of them.

The TC log, the transaction-key table, subscription cursors and pending-ack stores are KeyedLogs.
"""
from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import pyarrow as pa

from pulsartx import forks
from pulsartx.exceptions import CorruptedLog, StorageError
from pulsartx.storage import delta
from pulsartx.storage.appender import DeltaAppender
from pulsartx.storage.root import StorageRoot

log = logging.getLogger(__name__)
BUCKETS = 256
SEQ = "seq"
MAX_CAS_ATTEMPTS = 500
MAX_MINOR_FILES = 32  # minor compactions between two full ones, at most
# How long a keyed log's checkpoints keep the tombstones (``remove`` actions) of its compactions:
# the table's delta.deletedFileRetentionDuration. Delta's default, 7 days, made a busy TC log's
# checkpoint ~90,000 tombstones after 10 minutes, and checkpoint cost grew with it. Nothing here
# reads them: pulsartx never vacuums a keyed log, and its readers hold a snapshot for seconds
# (docs/design/short-tombstone-retention-for-keyed-logs.md). Buffer snapshots and topic partitions
# take the same value (docs/design/short-tombstone-retention-for-partitions.md).
TOMBSTONE_RETENTION_S = 60
RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
# A compaction commit says in its commitInfo which it is: a reader that catches up over another
# writer's "minor" one knows no key left the log; over any other commit that removes files (a full
# compaction, a delta-rs overwrite, an earlier pulsartx's) it re-reads the live files, because rows
# that commit dropped would otherwise stay in its memory (docs/design/two-level-keyed-log-compaction.md).
COMPACTION_INFO = "pulsartx.compaction"
MINOR = "minor"
FULL = "full"
T = TypeVar("T")
# Table URIs whose failed retention upgrade this process has warned about: a failure that repeats
# at every compaction is one operator problem, said once per table.
_UPGRADE_WARNED: forks.ProcessCache[str, bool] = forks.ProcessCache()


def table_properties() -> dict[str, str]:
    """The properties of a keyed log's table: statistics on ``seq`` (where replay is cut) and
    the short tombstone retention."""
    return {**delta.stats_config([SEQ]), **short_tombstone_retention()}


def short_tombstone_retention() -> dict[str, str]:
    """The short tombstone retention as a table property; also set on buffer-snapshot tables,
    which are overwritten whole and read at their newest version only, and on topic partitions,
    whose merges remove files all along and whose vacuum lists their directory instead of reading
    tombstones (docs/design/short-tombstone-retention-for-keyed-logs.md,
    docs/design/short-tombstone-retention-for-partitions.md)."""
    return {RETENTION_PROPERTY: f"interval {TOMBSTONE_RETENTION_S} seconds"}


def missing_retention(configuration: Mapping[str, str]) -> dict[str, str]:
    """The retention property a table created before it still needs; a table that sets it, to any
    value, is left alone."""
    return {} if RETENTION_PROPERTY in configuration else short_tombstone_retention()


def _keeps_every_key(actions: list[dict[str, Any]]) -> bool:
    """Whether a commit that removes files keeps every key's latest row: only a minor compaction
    says so (it rewrites the latest row of each key of the files it removes)."""
    return any(a.get("commitInfo", {}).get(COMPACTION_INFO) == MINOR for a in actions)


def _live_files(table: Any) -> list[str]:
    """The data files of a DeltaTable handle's snapshot."""
    return [str(p) for p in delta.add_actions(table).column("path").to_pylist()]


def upgrade_with_deltalake(writer: DeltaAppender, upgrade: Mapping[str, str], name: str) -> None:
    """The retention upgrade as a delta-rs commit of its own, for a table the appender cannot
    commit to itself (a store without conditional put): a keyed log before its compaction, a
    topic partition after its compaction (``name``: what the table is, for the warning). It only
    shortens what checkpoints keep, so a failure does not cost the compaction, whose absence would
    grow every open of the table: the compaction goes on without it, the upgrade is tried again at
    the next one, and the operator is warned once per table and process (a refusal that repeats,
    such as a metadata write the store does not allow, is one problem). Whatever the failed commit
    did, the next catch-up of ``writer`` reads it."""
    try:
        writer.set_properties_with_deltalake(upgrade)
    except Exception as e:
        uri = writer.uri
        wanted = ", ".join(f"{k} = '{v}'" for k, v in upgrade.items())
        with _UPGRADE_WARNED.lock:
            first = uri not in _UPGRADE_WARNED
            _UPGRADE_WARNED[uri] = True
        if first:
            log.warning(
                "%s table %s: setting %s failed (%s); compacting without it, so its checkpoints keep every "
                "compaction's tombstones for Delta's default 7 days and grow with them. It is tried again "
                "at each compaction (this is said once per table and process); to fix it, let this process "
                "write the table's metadata, or set the property once by hand (deltalake: "
                "DeltaTable(uri).alter.set_table_properties, Spark: ALTER TABLE ... SET TBLPROPERTIES)",
                name, uri, wanted, delta.describe(e, delta.secrets_of(writer.root)))
        else:
            log.debug("%s table %s: setting %s failed again (%s)", name, uri, wanted, e)


def bucket_app_id(name: str, key: str) -> str:
    return f"pulsartx.{name}.{zlib.crc32(key.encode()) % BUCKETS}"


class KeyedLog:
    def __init__(self, root: StorageRoot, segments: tuple[str, ...], schema: pa.Schema,
                 key_of: Callable[[Mapping[str, Any]], str], name: str, compact_every: int = 200):
        if SEQ not in schema.names:
            raise ValueError(f"KeyedLog schema needs a {SEQ!r} column")
        self.root = root
        self.segments = segments
        self.schema = schema
        self.key_of = key_of
        self.name = name
        self.compact_every = compact_every
        self._rows: dict[str, dict[str, Any]] = {}
        self._appender: DeltaAppender | None = None
        self._pending: list[str] = []  # data files of others' commits, read in one scan by _flush
        self._rebuild = False  # another writer's commit may have dropped rows: _flush re-reads the live files
        self._active: set[str] | None = None  # the table's data files as of our version (None: unknown)
        self._reopen = False  # our writer lost track of the table (see _lost_track)
        self._moving = False  # a put or refresh is under way: the version may be ahead of the rows
        self.files_since_compaction = 0
        self.appended = 0
        # Two-level compaction: the files as of the last compaction (None: unknown, the next one is
        # full), the keys written since, and what the minor ones wrote since the last full one.
        self._base: set[str] | None = None
        self._touched: set[str] = set()
        self._minor_files = 0
        self._minor_rows = 0
        self._live_at_full = 0

    @property
    def version(self) -> int:
        return -1 if self._appender is None else self._appender.version

    # ---- loading -------------------------------------------------------------------------------
    def open(self) -> KeyedLog:
        """Load the live state: the active files of the table (last compaction + entries since)."""
        t = delta.open_table(self.root, *self.segments)
        if t is None:
            delta.create_table(self.root, self.schema, *self.segments, name=self.name,
                               configuration=table_properties())
            t = delta.open_table(self.root, *self.segments)
            if t is None:
                raise StorageError(f"cannot create {self.name} table at {self.root.uri(*self.segments)}")
        self._check_schema(t)
        files = _live_files(t)
        # Rows first: a reload that fails must leave the log marked for reloading, never a new file
        # list over missing rows (a compaction would then keep only the rows read since).
        self._reopen = True
        rows = self._read_files(files)
        self._rows = {}
        self._pending = []
        self._rebuild = False
        self._appender = DeltaAppender(self.root, self.segments, t, self.schema, on_commit=self._on_commit)
        self._appender.on_reload = self._lost_track
        self._active = set(files)
        self._apply(rows)
        self.files_since_compaction = len(files)
        self._base = None
        self._reopen = False
        return self

    def _check_schema(self, table: Any) -> None:
        """Refuse a table written in another layout (e.g. by an older pulsartx) rather than read
        its rows with columns missing, which would silently drop state."""
        names = [f.name for f in table.schema().fields]
        if names != self.schema.names:
            raise CorruptedLog(
                f"{self.name} table {self.root.uri(*self.segments)} has columns {names}, this pulsartx writes "
                f"{self.schema.names}: it was written by another pulsartx version; "
                "use that version, or delete the table to start this state over")

    def _read_files(self, files: Iterable[str]) -> list[dict[str, Any]]:
        paths = [self.root.fs_path(*self.segments, f) for f in files]
        if not paths:
            return []
        uri = self.root.uri(*self.segments)

        def read() -> list[dict[str, Any]]:
            return delta.read_parquet(self.root, paths, self.schema).to_pylist()

        try:
            # A network fault is retried, then StorageUnavailable; only unreadable content is corruption.
            return delta.retrying(f"read {self.name} data files of", uri, read, root=self.root)
        except StorageError:
            raise
        except (FileNotFoundError, ValueError) as e:  # ValueError: pa.ArrowInvalid, a file in another layout
            raise CorruptedLog(f"{self.name} table {uri}: cannot read data files: "
                               f"{delta.describe(e, delta.secrets_of(self.root))}") from e
        except OSError as e:
            raise StorageError(f"{self.name} table {uri}: cannot read data files: "
                               f"{delta.describe(e, delta.secrets_of(self.root))}") from e

    def _apply(self, rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        changed = []
        for r in rows:
            k = self.key_of(r)
            self._touched.add(k)
            cur = self._rows.get(k)
            if cur is None or r[SEQ] > cur[SEQ]:
                self._rows[k] = r
                changed.append(r)
        return changed

    @property
    def rows(self) -> dict[str, dict[str, Any]]:
        """The live row of every key, as of the writer's version. Settled first: commits our writer
        stepped over but whose rows are not read yet are read now, and after a write whose outcome
        was unknown the log reloads, so nothing is ever decided on rows that lag the log (one
        decision on stale rows wrote a second outcome for a decided transaction). Raises when that
        reading fails: no answer is better than a stale one."""
        if self._reopen:
            self.open()
        elif self._pending or self._rebuild:
            self._flush()
        return self._rows

    def _lost_track(self) -> None:
        """Our writer jumped to a fresh snapshot (its own was too old, or the table's metadata
        changed): the commits in between were never applied here, so rows and files must be
        reloaded before they are trusted again."""
        self._reopen = True
        self._active = None
        self._base = None

    def refresh(self) -> list[dict[str, Any]]:
        """Apply commits made since our snapshot (by anyone); returns the rows that changed."""
        self._moving = True
        try:
            if self._appender is None or self._reopen or not self._appender.catch_up():
                self.open()
                return list(self._rows.values())
            return self._flush()
        finally:
            self._moving = False

    def _writer(self) -> DeltaAppender:
        if self._appender is None:
            self.open()
        assert self._appender is not None
        return self._appender

    def _on_commit(self, version: int, actions: list[dict[str, Any]], ours: bool) -> None:
        adds = [a["add"]["path"] for a in actions if "add" in a]
        removes = [a["remove"]["path"] for a in actions if "remove" in a]
        if self._active is not None:
            self._active.difference_update(removes)
            self._active.update(adds)
        if ours:  # only through our own commit path: delta-rs's commits of ours never get here (see _put)
            return
        if removes:
            self.files_since_compaction = len(adds)
            self._base = None  # another writer's compaction: ours starts over with a full one
            if not _keeps_every_key(actions):
                # Rows it dropped live only in the files it removed: applying its new file on top of
                # what is held here would keep them, and a dropped key written again (seq 0) would
                # lose to its old row. The live files are re-read instead (_flush).
                self._rebuild = True
        else:
            self.files_since_compaction += len(adds)
        self._pending.extend(adds)

    def _flush(self) -> list[dict[str, Any]]:
        """Read the data files of the others' commits seen since the last flush, in one scan
        (replay order does not matter: the highest seq per key wins); after another writer's commit
        that may have dropped rows, every live file instead."""
        if self._rebuild:
            return self._reread_live_files()
        files, self._pending = self._pending, []
        if not files:
            return []
        try:
            rows = self._read_files(files)
        except Exception:
            self._pending[:0] = files  # still to be read: a failed read must not lose their rows
            raise
        return self._apply(rows)

    def _reread_live_files(self) -> list[dict[str, Any]]:
        """The rows as the table's live files hold them, replacing those held here: a key no live file
        holds is gone. Its cost is about what reading the other writer's full compaction file alone
        was (that file is most of the live rows). Returns the rows that are new or changed; a row
        the files hold as it is held here keeps its object (a TC log knows its parsed rows by identity)."""
        if self._active is None:  # a reload is due whenever the files are unknown; never answer stale rows
            self._lost_track()
            raise StorageError(f"{self.name}: its live files are unknown after another writer's compaction; "
                               "the table is re-read before the next decision")
        fresh: dict[str, dict[str, Any]] = {}
        for r in self._read_files(sorted(self._active)):  # a failure leaves the re-read due
            k = self.key_of(r)
            cur = fresh.get(k)
            if cur is None or r[SEQ] > cur[SEQ]:
                fresh[k] = r
        changed = []
        for k, r in fresh.items():
            held = self._rows.get(k)
            # Equal, not merely at the same seq: a key a full compaction dropped starts over at seq 0
            # when written again (a lease store reuses its keys), and may reach the seq held here.
            if held is not None and held == r:
                fresh[k] = held
            else:
                changed.append(r)
        self._touched.update(fresh)
        self._rows = fresh
        self._pending = []
        self._rebuild = False
        return changed

    def next_commit(self) -> delta.NextCommit | None:
        """The commit after the ones applied here (None before the log is opened)."""
        return None if self._appender is None else self._appender.next_commit()

    def replaced(self) -> bool:
        """Whether the table was deleted (and perhaps re-created) since this log loaded it."""
        return self._appender is not None and not self._appender.same_table()

    def get(self, key: str) -> dict[str, Any] | None:
        return self.rows.get(key)

    def settled(self) -> bool:
        """Whether the rows in memory are the log as of :attr:`version` (nothing stepped over is
        left unread, no reload is due, no write or refresh is between moving the version and
        applying its rows): then :meth:`peek` answers as of that version. Read without the
        owner's lock, so a caller checks it before and after its peeks, with the version."""
        return (self._appender is not None and not self._pending and not self._rebuild and not self._reopen
                and not self._moving)

    def peek(self, key: str) -> dict[str, Any] | None:
        """The key's row as last read, without reading what is pending: a hint that costs no I/O,
        never a basis for a decision (those go through :meth:`cas`). Between two :meth:`settled`
        checks at one :attr:`version`, it is the row as of that version (a read, still no decision)."""
        return self._rows.get(key)

    def _landed(self, rows: list[dict[str, Any]]) -> bool | None:
        """Whether ``rows`` (one commit) are in the reloaded log: True (each is its key's live row),
        False (a key's live row is older, or another writer's at the same seq), or None when a key
        has moved on past them, so the rows cannot tell."""
        written = pa.Table.from_pylist(rows, schema=self.schema).to_pylist()  # as they read back
        answers = set()
        for r in written:
            cur = self._rows.get(self.key_of(r))
            if cur is not None and cur[SEQ] > r[SEQ]:
                answers.add(None)
            else:
                answers.add(cur == r)
        return answers.pop() if len(answers) == 1 else None

    # ---- writing -------------------------------------------------------------------------------
    def put(self, rows: list[dict[str, Any]], extra_app_ids: Mapping[str, int] | None = None,
            metadata: Mapping[str, str] | None = None) -> None:
        """Append full-state rows with a CAS on each row's key. Raises ConcurrentCommit when another
        writer touched one of the keys' buckets since our snapshot; the caller refreshes and retries."""
        apps = {bucket_app_id(self.name, self.key_of(r)): int(r[SEQ]) for r in rows}
        apps.update(extra_app_ids or {})
        writer = self._writer()
        # No rows: a commit of app ids alone (fast path; an empty file through delta-rs otherwise).
        data = pa.Table.from_pylist(rows, schema=self.schema) if rows or not writer.fast else None
        self._moving = True  # the writer's version moves before the rows are applied (see settled)
        try:
            self._put(writer, rows, data, apps, metadata)
        finally:
            self._moving = False

    def _put(self, writer: DeltaAppender, rows: list[dict[str, Any]], data: pa.Table | None,
             apps: Mapping[str, int], metadata: Mapping[str, str] | None) -> None:
        try:
            writer.append(data, apps, metadata)
        except delta.ConcurrentCommit:
            raise  # not written; the commits up to the conflicting one are pending, read before any decision
        except Exception as e:
            # Written or not: unknown (the appender reads a slot back when it can; OutcomeUnknown when
            # it cannot). Reload, and report what the log says, never a guess.
            self._lost_track()
            try:
                self.open()
            except Exception as reload_error:
                raise delta.OutcomeUnknown(
                    f"{self.name}: a write failed ({e}) and the table could not be re-read to learn whether it "
                    f"landed ({reload_error}); it is re-read before the next decision") from e
            landed = self._landed(rows) if rows else None
            if landed is None:
                raise delta.OutcomeUnknown(
                    f"{self.name}: a write failed ({e}) and other writers have moved its keys on since, so whether "
                    "it landed first cannot be told from the rows; re-read before deciding on it") from e
            if not landed:
                raise
            log.info("%s: a write reported an error but landed (%s)", self.name, e)
            self.appended += 1
            return
        if not writer.fast:
            # delta-rs made the commit, so no on_commit saw its file: the live files are taken from the
            # handle, which stands at our version. Missing, our rows would be lost by the next re-read
            # of the live files (after another writer's overwrite), and a write on them would repeat a seq.
            self._active = set(_live_files(writer.table))
        # Durable: applied to memory now (write, then apply). Others' commits stepped over before
        # ours are pending; reading them may fail, and they are then read before the next decision.
        self._apply(rows)
        self.files_since_compaction += 1 if rows else 0
        self.appended += 1
        try:
            self._flush()
        except Exception as e:
            log.info("%s: reading other writers' commits failed (%s); retried before the next decision", self.name, e)

    def cas(self, key: str, change: Callable[[dict[str, Any] | None], tuple[dict[str, Any] | None, T]], *,
            what: str, optimistic: bool = False, keep: Callable[[dict[str, Any]], bool] | None = None,
            also: tuple[str, ...] = ()) -> T:
        """Read-modify-write one key: ``change(current row or None)`` returns ``(new row, result)``,
        and a new row of None writes nothing. The new row gets the key's next ``seq``; a lost race
        refreshes and runs ``change`` again on the winner's state, so ``change`` must be pure.

        ``also``: other keys whose rows ``change`` reads (through ``rows``): a write of one of them
        after our snapshot fails this write too, as a write of ``key`` would, so a decision that
        rests on another key's row is a compare-and-set on both.

        ``optimistic``: the first attempt uses the cached snapshot without refreshing (a refresh
        costs as much as the write). The per-key CAS refuses the write if the key changed since;
        a no-op or an exception computed from the cached state is re-checked on fresh state
        before it is returned or raised. ``keep``: when the log is due, compact it after the
        write, keeping the rows ``keep`` accepts."""
        [(ok, value)] = self.cas_many(key, [change], what=what, optimistic=optimistic, keep=keep, also=also)
        if not ok:
            raise value
        return value

    def cas_many(self, key: str, changes: list[Callable[[dict[str, Any] | None], tuple[dict[str, Any] | None, Any]]],
                 *, what: str, optimistic: bool = False,
                 keep: Callable[[dict[str, Any]], bool] | None = None,
                 also: tuple[str, ...] = ()) -> list[tuple[bool, Any]]:
        """Several read-modify-writes of one key in one commit (group commit): each change sees the
        row the previous ones left, and the last row is written once. Returns, per change,
        ``(True, result)`` or ``(False, exception)``: a change that raises changes nothing and
        fails alone. A lost race re-runs them all on the winner's state. ``also``: as for ``cas``."""
        if not optimistic or self._appender is None or self._reopen:
            self.refresh()
            optimistic = False
        for attempt in range(MAX_CAS_ATTEMPTS):
            row = self.rows.get(key)
            cur, outs, doubtful = row, [], False
            for change in changes:
                try:
                    new, out = change(cur)
                except Exception as e:
                    outs.append((False, e))
                    doubtful = True
                    continue
                outs.append((True, out))
                if new is None:
                    doubtful = True
                else:
                    cur = new
            if optimistic and doubtful:  # an answer computed from the cached state: confirm it on fresh state
                optimistic = False
                self.refresh()
                continue
            if cur is row:
                return outs
            assert cur is not None
            cur[SEQ] = (row[SEQ] + 1) if row is not None else 0
            own = bucket_app_id(self.name, key)
            read = {app: int(r[SEQ]) if (r := self.rows.get(k)) is not None else 0
                    for k in also if (app := bucket_app_id(self.name, k)) != own}
            try:
                self.put([cur], extra_app_ids=read)
            except delta.ConcurrentCommit:
                if not optimistic:
                    delta.backoff(attempt)
                optimistic = False
                self.refresh()
                continue
            if keep is not None and self.needs_compaction():
                try:
                    self.compact(keep)
                except Exception as e:  # an optimisation: the write above is durable either way
                    log.info("%s compaction skipped: %s", self.name, e)
            return outs
        raise StorageError(f"{what}: gave up after {MAX_CAS_ATTEMPTS} concurrent updates of {key!r}; retry later")

    def app_version(self, app_id: str) -> int | None:
        return self._writer().txn_version(app_id)

    def needs_compaction(self) -> bool:
        return self.files_since_compaction >= self.compact_every

    def compact(self, keep: Callable[[dict[str, Any]], bool],
                dropping: Callable[[list[dict[str, Any]]], Mapping[str, int]] | None = None) -> bool:
        """Rewrite rows as one file: the files since the last compaction (minor), or every live row
        ``keep`` accepts, replacing every active file (full). See the module for which.
        ``dropping``: given the rows a full compaction drops, the app-transaction versions its
        commit sets with it, so what was dropped is recorded in the same atomic commit.

        Correct under concurrency: the commit removes only the files of its own snapshot, so an
        entry committed concurrently survives; a concurrent compaction makes one of the two give up
        (ConcurrentCommit), and we skip this round. A minor compaction keeps every key's latest row
        whatever ``keep`` says: dropping it would bring back the key's older row in a base file.

        Written by our appender as one OPTIMIZE commit with the removes (a few ms). Through
        ``write_deltalake(mode="overwrite")`` it cost ~120 ms (bringing the handle over the ~100-200
        commits since the last compaction, then delta-rs's write), every 100-200 protocol steps:
        2-3 ms on average added to each transactional acknowledgement
        (docs/design/keyed-log-compaction-commit.md)."""
        try:
            if self._reopen or not self._writer().catch_up():
                self.open()
            writer = self._writer()
            fast = writer.fast and self._active is not None
            # A table created before the short tombstone retention gets it with its first
            # compaction by this version (the commits that make tombstones), not a separate step.
            upgrade = missing_retention(writer.configuration())
            if not fast:
                if upgrade:  # a commit of its own, before the rows are read
                    upgrade_with_deltalake(writer, upgrade, self.name)
                writer.sync_handle()  # delta-rs's overwrite removes the handle's files
            self._flush()
            full = (not fast or self._base is None or self._minor_files >= MAX_MINOR_FILES
                    or self._minor_rows >= max(self._live_at_full, self.compact_every))
            apps: Mapping[str, int] = {}
            if full:
                dropped = {k: r for k, r in self._rows.items() if not keep(r)}
                rows = [r for k, r in self._rows.items() if k not in dropped]
                removes = sorted(self._active or ())
                if dropping is not None and dropped:
                    apps = dropping(list(dropped.values()))
            else:
                assert self._active is not None and self._base is not None
                rows = [self._rows[k] for k in sorted(self._touched) if k in self._rows]
                removes = sorted(self._active - self._base)
            live = pa.Table.from_pylist(rows, schema=self.schema)
            if fast:
                # Superseded and trimmed rows are dropped: a data change in Delta's terms
                # (docs/design/compaction-commits.md).
                writer.rewrite([(live, True)], [(p, None, True) for p in removes], apps=apps, properties=upgrade,
                               metadata={COMPACTION_INFO: FULL if full else MINOR})
            else:
                writer.write_with_deltalake(live, mode="overwrite", apps=apps)
                self._active = set(_live_files(writer.table))
        except delta.ConcurrentCommit as e:
            # Our state stays exact (every commit seen was applied); the next due write retries.
            log.info("%s compaction skipped (concurrent compaction): %s", self.name, e)
            return False
        except Exception as e:
            # A compaction commit with an unknown outcome may have removed our active files: reload.
            self._lost_track()
            log.info("%s compaction skipped (storage fault; reloading before the next decision): %s", self.name, e)
            return False
        self._flush()
        if full:
            # A row another writer committed meanwhile is in a file this commit did not remove.
            self._rows = {k: v for k, v in self._rows.items() if dropped.get(k) is not v}
            self._minor_files, self._minor_rows, self._live_at_full = 0, 0, len(self._rows)
        else:
            self._minor_files += 1
            self._minor_rows += len(rows)
        self._base = set(self._active) if self._active is not None else None
        self._touched = set()
        self.files_since_compaction = 0 if self._active is not None else 1
        return True
