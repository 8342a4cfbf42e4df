"""The storage root: one URL plus one ``storage_options`` mapping, translated for each library that
touches storage (delta-rs for tables, fsspec for plain files, pyarrow for fast parquet reads).

Keeping a single mapping matters because delta-rs cannot take an fsspec filesystem: if each layer
had its own options, a credential or endpoint fixed in one place would silently differ in another.
"""
from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import posixpath
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import urlparse

from pulsartx.exceptions import InvalidConfiguration, PulsarException, StorageError
from pulsartx.storage import faults
from pulsartx.storage.faults import Op
from pulsartx.storage.objstore import Bucket, ConditionalConflict, s3_endpoint
from pulsartx.storage.retry import describe, retrying, secrets_of
from pulsartx.storage.secrets import REDACTED, redact_options, scrub_logs_of  # noqa: F401  (re-exported)

ENV_SERVICE_URL = "PULSARTX_SERVICE_URL"
DEFAULT_SERVICE_URL = "./pulsartx-data"
# Names of the temporary files a local put-if-absent publishes from: unique per process (the pid
# tells forked children apart) without a uuid4 per commit, which costs a getrandom call.
_TMP_TAG = uuid.uuid4().hex[:12]
_TMP_SEQ = itertools.count()
# ... and how those names end (``<name>.tmp-<pid>-<tag>-<n>``, with a leading dot from write_bytes),
# which is how a later sweep tells a dead process's leftovers from real files.
_TMP_NAME = re.compile(r"\.tmp-\d+-[0-9a-f]{12}-\d+$")
UNSAFE_SKIP_CHECK_ENV = "PULSARTX_UNSAFE_SKIP_PUT_IF_ABSENT_CHECK"
LOCAL_FSYNC_ENV = "PULSARTX_LOCAL_FSYNC"


def local_fsync() -> bool:
    """Whether local writes are flushed to the disk before a commit is published (off unless
    ``PULSARTX_LOCAL_FSYNC=1``: it costs 2.7x per protocol step, docs/design/local-fsync.md). Off, a
    process crash loses nothing, but a machine or OS crash may lose the last commits, or leave a
    commit whose data file is empty."""
    return os.environ.get(LOCAL_FSYNC_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def fsync_dir(path: str) -> None:
    """Make a directory's new entries durable (a created or linked file is not, until then)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
# What link(2) answers on a filesystem without hard links (FAT, some FUSE and network mounts).
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})
# (root URL, endpoint) of the roots whose store was seen to honour put-if-absent: per store, as
# two stores (endpoints) may hold a bucket and prefix of the same name.
_PUT_IF_ABSENT_CHECKED: set[tuple[str, str]] = set()



def _upper(options: dict[str, str]) -> dict[str, str]:
    return {k.upper(): v for k, v in options.items()}


# S3 settings an s3:// root takes from the environment when its options do not give them, each
# group whole or not at all (an explicit key id never pairs with a secret from the environment).
# Written into the options, they reach every library alike, and Spark executors inside the pickled
# root: left to each library, delta-rs honours AWS_ENDPOINT_URL but pyarrow's S3 filesystem does
# not, so reads would go to AWS while writes go to the configured endpoint
# (docs/design/s3-settings-from-the-environment.md).
S3_ENV_GROUPS: tuple[tuple[str, ...], ...] = (
    ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    ("AWS_ENDPOINT_URL", "AWS_ENDPOINT"),
    ("AWS_REGION", "AWS_DEFAULT_REGION"),
    ("AWS_ALLOW_HTTP",),
)


def s3_options_from_env(options: dict[str, str]) -> dict[str, str]:
    """``options`` completed with the S3 settings of the environment that they leave out."""
    given = set(_upper(options))
    out = dict(options)
    for group in S3_ENV_GROUPS:
        if given.isdisjoint(group):
            found = {k: os.environ[k] for k in group if os.environ.get(k)}
            if "AWS_DEFAULT_REGION" in found:  # one region: object_store's name for it wins
                region = found.pop("AWS_DEFAULT_REGION")
                found.setdefault("AWS_REGION", region)
            out.update(found)
    return out


@dataclass(frozen=True)
class StorageRoot:
    """Where everything of one pulsartx installation lives.

    ``url`` is normalised: an absolute local path, or ``scheme://bucket/prefix`` without a trailing
    slash. Instances are picklable (Spark ships them to executors); the filesystems are rebuilt
    lazily on the other side.
    """

    url: str
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def resolve(cls, service_url: str | None = None, storage_options: dict[str, str] | None = None) -> StorageRoot:
        url = service_url or os.environ.get(ENV_SERVICE_URL) or DEFAULT_SERVICE_URL
        if not isinstance(url, str) or not url.strip():
            raise InvalidConfiguration(f"service_url {url!r} is empty: give a local path, file://, or s3://bucket/prefix")
        options = {str(k): str(v) for k, v in (storage_options or {}).items()}
        parsed = urlparse(url)
        if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
            path = parsed.path if parsed.scheme == "file" else url
            return cls(os.path.abspath(os.path.expanduser(path)), options)
        if parsed.scheme in ("s3", "s3a", "gs", "az", "abfs", "abfss", "memory"):
            if not parsed.netloc:
                raise InvalidConfiguration(f"service_url {url!r} has no bucket: use {parsed.scheme}://bucket/prefix")
            if "%" in parsed.path or parsed.query or parsed.fragment or url.rstrip().endswith(("?", "#")):
                # delta-rs decodes %XX in a root's path where pulsartx's own requests (obstore) keep
                # it: its commits and ours would land under two different prefixes.
                raise InvalidConfiguration(
                    f"service_url {url!r} holds '%', '?' or '#', which the storage libraries read differently "
                    f"(a percent-escape decoded by one and not by another, a query or fragment dropped): "
                    f"write the prefix's characters as they are, without those three")
            if any(part in ("", ".", "..") for part in parsed.path.rstrip("/").split("/")[1:]):
                # object_store (delta-rs, obstore) refuses such keys: every table would read as corrupt.
                raise InvalidConfiguration(
                    f"service_url {url!r} has an empty, '.' or '..' segment in its prefix, which object "
                    f"stores' keys cannot hold: use {parsed.scheme}://{parsed.netloc}/a/b")
            scheme = "s3" if parsed.scheme == "s3a" else parsed.scheme
            if scheme == "s3":
                options = s3_options_from_env(options)
            return cls(f"{scheme}://{parsed.netloc}{parsed.path.rstrip('/')}", options)
        raise InvalidConfiguration(
            f"service_url {url!r} has unsupported scheme {parsed.scheme!r}: use a local path, file:// or s3://")

    def __post_init__(self) -> None:
        scrub_logs_of(self.storage_options)

    def __getstate__(self) -> dict[str, Any]:
        # The obstore client is rebuilt where the root lands (its connections are this process's).
        return {k: v for k, v in self.__dict__.items() if k != "_obstore_bucket"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickled on a Spark executor: __post_init__ does not run there, but logging must be scrubbed too.
        self.__dict__.update(state)
        scrub_logs_of(self.storage_options)

    def __repr__(self) -> str:
        return f"StorageRoot(url={self.url!r}, storage_options={redact_options(self.storage_options)!r})"

    @property
    def is_local(self) -> bool:
        return "://" not in self.url

    @property
    def scheme(self) -> str:
        return "file" if self.is_local else self.url.split("://", 1)[0]

    def uri(self, *segments: str) -> str:
        """URI of a table or file below the root, as delta-rs wants it."""
        if self.is_local:
            return os.path.join(self.url, *segments)
        return posixpath.join(self.url, *segments)

    def fs_path(self, *segments: str) -> str:
        """The same location as a path for :attr:`fs` (fsspec drops the scheme for object stores)."""
        if self.is_local:
            return os.path.join(self.url, *segments)
        return posixpath.join(self.url.split("://", 1)[1], *segments)

    @property
    def delta_options(self) -> dict[str, str]:
        return dict(self.storage_options)

    @cached_property
    def fs(self) -> Any:
        """fsspec filesystem for non-table files (topic metadata, snapshots pointers, leases)."""
        import fsspec

        if self.is_local:
            return fsspec.filesystem("file", auto_mkdir=True)
        if self.scheme == "s3":
            return fsspec.filesystem("s3", **self.s3fs_kwargs())
        return fsspec.filesystem(self.scheme, **self.storage_options)

    def s3fs_kwargs(self) -> dict[str, Any]:
        o = _upper(self.storage_options)
        # Other processes (and delta-rs, which bypasses s3fs) change the store all the time: a
        # cached directory listing would hide new topics, subscriptions and snapshots.
        #
        # Retries are ours (delta.retrying, bounded by PULSARTX_STORAGE_RETRY_SECONDS): botocore's
        # default of 4 retries with exponential backoff spends ~10 s on one refused connection,
        # far past a short budget, so it gets one quick retry.
        kw: dict[str, Any] = {"use_listings_cache": False,
                              "config_kwargs": {"retries": {"total_max_attempts": 2, "mode": "standard"},
                                                "connect_timeout": 5}}
        if "AWS_ACCESS_KEY_ID" in o:
            kw["key"] = o["AWS_ACCESS_KEY_ID"]
        if "AWS_SECRET_ACCESS_KEY" in o:
            kw["secret"] = o["AWS_SECRET_ACCESS_KEY"]
        if "AWS_SESSION_TOKEN" in o:
            kw["token"] = o["AWS_SESSION_TOKEN"]
        client: dict[str, Any] = {}
        endpoint = s3_endpoint(o)
        if endpoint:
            client["endpoint_url"] = endpoint
        if "AWS_REGION" in o:
            client["region_name"] = o["AWS_REGION"]
        if client:
            kw["client_kwargs"] = client
        return kw

    @property
    def uses_obstore(self) -> bool:
        """Whether this root's own requests go through obstore (S3) rather than the OS or fsspec."""
        return self.scheme == "s3"

    def _s3(self, path: str) -> tuple[Bucket, str]:
        """The obstore client of this process for the root's bucket, and ``path``'s key in it.
        Built on first use and again in a forked child, whose parent's connections are not its own."""
        bucket, _, key = path.partition("/")
        cur = self.__dict__.get("_obstore_bucket")
        if cur is None or cur.pid != os.getpid() or cur.name != bucket:
            cur = Bucket(bucket, self.storage_options)
            if bucket == self.url.split("://", 1)[1].split("/", 1)[0]:
                self.__dict__["_obstore_bucket"] = cur
        return cur, key

    @cached_property
    def arrow_fs(self) -> Any:
        """pyarrow filesystem for parquet reads: native S3 is markedly faster than going through fsspec."""
        import pyarrow.fs as pafs

        if self.is_local:
            return pafs.LocalFileSystem()
        if self.scheme == "s3":
            o = _upper(self.storage_options)
            endpoint = s3_endpoint(o)
            kwargs: dict[str, Any] = {
                "access_key": o.get("AWS_ACCESS_KEY_ID"),
                "secret_key": o.get("AWS_SECRET_ACCESS_KEY"),
                "session_token": o.get("AWS_SESSION_TOKEN"),
                "region": o.get("AWS_REGION", "us-east-1"),
            }
            if endpoint:
                p = urlparse(endpoint)
                kwargs["endpoint_override"] = p.netloc or endpoint
                kwargs["scheme"] = p.scheme or "https"
            return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v is not None})
        return pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))

    def _guarded(self, what: str, path: str, fn: Any) -> Any:
        """Object-store metadata calls (s3fs) get the Delta I/O's retry budget and its errors: a
        transient fault is retried, anything else but "not found" becomes a StorageError naming
        the path (never the credentials), not a raw botocore exception."""
        if self.is_local:
            try:
                return fn()
            except (FileNotFoundError, FileExistsError, NotADirectoryError, PulsarException):
                raise
            except OSError as e:  # a disk's EIO is a storage error too, as callers expect
                raise StorageError(f"{what} {path} failed: {e}") from e
        try:
            return retrying(what, path, fn, root=self)
        except (FileNotFoundError, PulsarException):
            raise
        except Exception as e:
            raise StorageError(f"{what} {path} failed: {describe(e, secrets_of(self))}") from e

    def cat(self, path: str) -> bytes:
        """The bytes of the file at ``path`` (an :meth:`fs_path`); FileNotFoundError if missing.
        Unguarded: callers wrap it in their own retry policy.

        Local roots use ``open`` rather than fsspec: importing fsspec scans every installed
        distribution's entry points (0.15-0.5 s in a pyspark worker, whose path holds zip files),
        and a Spark job's driver-side calls (``writer()``, ``commit()``, each micro-batch's
        ``streamWriter()``) often run in a fresh worker, where that import was the largest part of
        the job's fixed cost."""
        faults.before(Op.READ, path)
        if self.is_local:
            with open(path, "rb") as f:
                data = f.read()
        elif self.uses_obstore:
            bucket, key = self._s3(path)
            data = bucket.get(key)
        else:
            data = self.fs.cat_file(path)
        faults.after(Op.READ, path)
        return data

    def put_bytes(self, path: str, data: bytes) -> None:
        """Write a whole object at ``path`` (an :meth:`fs_path`) on an object store: one PUT, last
        writer wins. No fail points and no retries: the caller (a data file's writer) has both."""
        if self.uses_obstore:
            bucket, key = self._s3(path)
            bucket.put(key, data)
        else:
            self.fs.pipe(path, data)

    # Small JSON documents (topic metadata). Object stores have no rename, so writes are whole-object puts.
    def read_text(self, *segments: str) -> str | None:
        path = self.fs_path(*segments)

        def read() -> str | None:
            try:
                return self.cat(path).decode("utf-8")
            except FileNotFoundError:
                return None

        return self._guarded("read", path, read)

    def write_text(self, text: str, *segments: str) -> None:
        self.write_bytes(text.encode("utf-8"), *segments)

    def write_bytes(self, data: bytes, *segments: str) -> None:
        """Replace the whole file at ``segments`` with ``data``; a concurrent reader sees the old
        file or the new one, never part of one. Locally a temporary file renamed over it, named
        with a leading dot so that a Delta reader listing ``_delta_log`` meanwhile does not take
        it for a log file (a checkpoint is written this way), flushed first when local writes are
        (:func:`local_fsync`); on an object store one PUT."""
        path = self.fs_path(*segments)
        if self.is_local:
            faults.before(Op.WRITE, path)
            folder, name = os.path.split(path)
            os.makedirs(folder, exist_ok=True)
            tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}-{_TMP_TAG}-{next(_TMP_SEQ)}")
            durable = local_fsync()
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    if durable:
                        os.fsync(f.fileno())
                os.replace(tmp, path)
                if durable:
                    fsync_dir(folder)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            faults.after(Op.WRITE, path)
        else:
            def write() -> None:
                faults.before(Op.WRITE, path)
                if self.uses_obstore:
                    bucket, key = self._s3(path)
                    bucket.put(key, data)
                else:
                    self.fs.pipe(path, data)
                faults.after(Op.WRITE, path)

            self._guarded("write", path, write)

    @property
    def has_put_if_absent(self) -> bool:
        """Whether :meth:`put_if_absent` works here: local disks (hard links) and S3 (``If-None-Match``)."""
        return self.is_local or self.scheme == "s3"

    def put_if_absent(self, body: bytes, *segments: str) -> bool:
        """Create an object only if nothing exists at that path (the Delta commit primitive).

        True when we created it, False when it already existed. Locally the bytes go to a temporary
        file first and a hard link publishes them, so a reader never sees a partial object and a
        concurrent creator gets EEXIST. On S3 it is one PUT with ``If-None-Match: *`` (a 412 becomes
        False); a retried PUT whose first response was lost also answers False, so callers compare
        what is there with what they wrote.
        """
        self.check_put_if_absent()
        return self._put_if_absent(body, self.fs_path(*segments))

    def check_put_if_absent(self) -> None:
        """Refuse a store that ignores put-if-absent, once per root and process: every compare-and-
        set of pulsartx (each Delta commit) relies on it, and a store that silently overwrites
        (some S3-compatible servers ignore ``If-None-Match``) would lose commits without an error.
        The second conditional put of a scratch key must fail."""
        store = self._store_key
        if not self.has_put_if_absent or store in _PUT_IF_ABSENT_CHECKED:
            return
        if os.environ.get(UNSAFE_SKIP_CHECK_ENV, "").strip().lower() in ("1", "true", "yes"):
            logging.getLogger(__name__).warning(
                "%s=%s: NOT checking that %s honours put-if-absent; if it does not, concurrent commits are lost "
                "silently", UNSAFE_SKIP_CHECK_ENV, os.environ[UNSAFE_SKIP_CHECK_ENV], self.url)
            _PUT_IF_ABSENT_CHECKED.add(store)
            return
        path = self.fs_path("_pulsartx", f"put-if-absent-probe-{uuid.uuid4().hex}")
        try:
            first = self._put_if_absent(b"1", path)
            if not first:
                # A retried put whose first answer was lost meets its own object: read back, not
                # guessed (the key is this probe's own, so "1" there is ours).
                with contextlib.suppress(FileNotFoundError):
                    first = self._guarded("read", path, lambda: self.cat(path)) == b"1"
            second = self._put_if_absent(b"2", path)
        finally:
            with contextlib.suppress(Exception):
                self.rm("_pulsartx", posixpath.basename(path))
        if not first or second:
            raise StorageError(
                f"{self.url} does not honour conditional writes (put-if-absent: a second create of one key "
                f"{'succeeded' if second else 'was refused although the key was new'}), which every pulsartx commit "
                "relies on: use a store that supports them (S3's If-None-Match: AWS S3, Ceph RGW, recent MinIO), "
                f"or, knowing that concurrent writers will then lose data, set {UNSAFE_SKIP_CHECK_ENV}=1")
        _PUT_IF_ABSENT_CHECKED.add(store)

    @cached_property
    def _store_key(self) -> tuple[str, str]:
        """The root's URL and endpoint: which store a put-if-absent check was made on."""
        return self.url, s3_endpoint(self.storage_options)

    def _put_if_absent(self, body: bytes, path: str) -> bool:
        if self.is_local:
            try:
                faults.before(Op.CREATE, path)
            except FileExistsError:
                return False
            if faults.blind(Op.CREATE, path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(body)
                return True
            tmp = f"{path}.tmp-{os.getpid()}-{_TMP_TAG}-{next(_TMP_SEQ)}"
            try:
                f = open(tmp, "wb")
            except FileNotFoundError:  # the first file of its folder (commits always have theirs)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                f = open(tmp, "wb")
            durable = local_fsync()
            with f:
                f.write(body)
                if durable:
                    os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in _NO_HARD_LINKS:
                    raise
                raise StorageError(
                    f"create {path}: this filesystem refuses hard links ({e.strerror}), which a local root needs "
                    "for its commits (create only if absent): put the root on a local filesystem (ext4, xfs, "
                    "btrfs, tmpfs...) or on S3") from e
            finally:
                os.unlink(tmp)
            if durable:
                fsync_dir(os.path.dirname(path))
            faults.after(Op.CREATE, path)
            return True
        if self.scheme != "s3":
            raise NotImplementedError(f"put-if-absent is not available for {self.scheme}:// roots")

        bucket, key = self._s3(path)

        def put() -> bool:
            for attempt in range(20):
                try:
                    faults.before(Op.CREATE, path)  # FileExistsError: an injected 412
                    if faults.blind(Op.CREATE, path):
                        bucket.put(key, body)
                    elif not bucket.create(key, body):  # a 412: the key was there
                        return False
                    faults.after(Op.CREATE, path)
                    return True
                except FileExistsError:
                    return False
                except ConditionalConflict:
                    # A 409 (AWS: a concurrent conditional write is in flight) means "ask again",
                    # and the retry gets the 412.
                    time.sleep(0.01 * (attempt + 1))
            raise StorageError(f"create {path}: conditional write kept conflicting (HTTP 409)")

        return self._guarded("create", path, put)

    def exists(self, *segments: str) -> bool:
        path = self.fs_path(*segments)

        def check() -> bool:
            faults.before(Op.LIST, path)
            if self.is_local:
                return os.path.exists(path)
            if self.uses_obstore:
                bucket, key = self._s3(path)
                return bucket.exists(key)
            return self.fs.exists(path)

        return self._guarded("check", path, check)

    def has_file(self, *segments: str) -> bool:
        """Whether a file exists, in one request: a stat locally, a HEAD on S3. :meth:`exists` takes
        two on S3 for a missing key (it then lists, in case a folder has that name), and an idle
        reader's probe for its next commit runs this many times a second. Errors reach the caller
        unretried: a probe that fails is simply not an answer."""
        path = self.fs_path(*segments)
        faults.before(Op.LIST, path)
        if self.is_local:
            return os.path.exists(path)
        if not self.uses_obstore:
            return bool(self.fs.exists(path))
        bucket, key = self._s3(path)
        return bucket.head(key)

    def listdir(self, *segments: str) -> list[str]:
        """Names of the direct children of a folder (empty when it does not exist)."""
        path = self.fs_path(*segments)
        def ls() -> list[str]:
            faults.before(Op.LIST, path)
            if self.is_local:
                return os.listdir(path)
            if self.uses_obstore:
                bucket, key = self._s3(path)
                return bucket.children(key)
            return [posixpath.basename(str(e).rstrip("/")) for e in self.fs.ls(path, detail=False)]

        try:
            names = self._guarded("list", path, ls)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return faults.listing(path, sorted(names))

    def remove_stale_temporaries(self, *segments: str, older_than_s: float) -> list[str]:
        """Delete the temporary files that :meth:`write_bytes` and :meth:`put_if_absent` left in the
        folder at ``segments`` when their process died between writing one and renaming or linking
        it (otherwise they stay forever), once older than ``older_than_s``: a live write holds its
        temporary for milliseconds, and one paused past that age only fails, as a failed write does.
        Returns the names deleted. Local folders only: on an object store both writes are one PUT."""
        if not self.is_local:
            return []
        folder = self.fs_path(*segments)
        cutoff = time.time() - older_than_s
        deleted = []
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return []
        for e in entries:
            if not _TMP_NAME.search(e.name):
                continue
            try:
                if e.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(e.path)
                    deleted.append(e.name)
            except FileNotFoundError:  # its write finished (or another sweep got it) meanwhile
                continue
        return sorted(deleted)

    def rm(self, *segments: str) -> None:
        """Delete a file or a whole folder; nothing if it does not exist."""
        path = self.fs_path(*segments)
        faults.before(Op.DELETE, path)
        if self.is_local:
            with contextlib.suppress(FileNotFoundError):
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
        elif self.exists(*segments):
            if self.uses_obstore:
                bucket, key = self._s3(path)
                self._guarded("delete", path, lambda: bucket.delete_tree(key))
            else:
                self._guarded("delete", path, lambda: self.fs.rm(path, recursive=True))
        faults.after(Op.DELETE, path)


def read_url_text(url: str) -> str:
    """The text of a file named by a URL outside the root (Spark checkpoint files): local paths
    and ``file:`` URLs with ``open`` (see :meth:`StorageRoot.cat`), anything else through fsspec.
    FileNotFoundError if it does not exist."""
    for prefix in ("file://", "file:"):
        if url.startswith(prefix):
            url = url[len(prefix):]
            break
    if "://" not in url:
        with open(url, encoding="utf-8") as f:
            return f.read()
    import fsspec

    if url.startswith("s3a://"):
        url = "s3://" + url[len("s3a://"):]
    with fsspec.open(url, "r") as f:  # credentials from the environment
        return f.read()

